"""`numbakv demo`: a mixed serving workload on the device path, checked step by step.

Six requests arrive over the first steps into an `Engine` over the device cache (the CUDA
simulator without a GPU): a long prompt chunked through prefill while others decode, a
request for n = 3 samples sharing its prompt's cells, a request cancelled mid-decode, and
one that waits for a free session. The model is device-resident (`DeviceModel`: hidden
state on the device, only the wanted logits come back) and each decode forward replays one
captured step (a CUDA graph on a GPU, recorded launches on the simulator), recaptured after
the pool grows. Every batch also runs through the NumPy model on the reference cache
(`Lockstep`): the tables must be equal, the sampled tokens the same and the logits close.
The trace keeps the engine's annotations (admit, fork, finish, cancel, growth). Prints the
occupancy map at the busiest forward, each request's cells in its letter (a, b, c … in
submission order, as the summary table letters them), the table and how the forwards ran.
"""

import argparse
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from numbakv.cli.args import CHECK, fail, integer, output_file
from numbakv.core.errors import ConfigError
from numbakv.core.paths import new_file
from numbakv.core.values import as_int, int_at_least
from numbakv.reference import CellCache as ReferenceCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.kv_events import KVEventsConfig
from numbakv.serve.lockstep import Lockstep, LockstepError
from numbakv.serve.model import Model, ModelConfig
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import GREEDY, Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler
from numbakv.trace.frames import Trace
from numbakv.trace.recorder import Recorder

MODEL = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, windows=(0, 8))
CACHE = dict(capacity=512, max_width=16, max_seqs=8, initial_cells=16, dtype="float16")
MAX_SESSIONS, MAX_SESSION_TOKENS = 7, 64  # 7 x 64 cells fit the capacity


@dataclass(frozen=True)
class Arrival:
    """A request of the workload, submitted before engine step `step`."""

    step: int
    name: str
    prompt: str
    max_new_tokens: int
    n: int = 1
    sampling: Sampling = GREEDY
    cancel_at: int | None = None  # the step at which the demo cancels it


SYSTEM = "You are a cell cache. "  # the system prompt "short" and "late" share

WORKLOAD = (
    Arrival(0, "greet", "Hello, cells!", 12),
    Arrival(0, "short", SYSTEM + "KV cache", 10),
    Arrival(1, "cancel", "Stop me early", 20, cancel_at=12),
    Arrival(2, "long", "A long prompt is chunked while the others decode", 8),
    Arrival(3, "n=3", "Three samples", 8, n=3, sampling=Sampling(0.8, top_p=0.95, seed=1)),
    Arrival(5, "late", SYSTEM + "Waits for a session", 6),
)


@dataclass
class Report:
    """What the demo measured: the engine (its requests' results), the differential check's
    figures, the request ids by name, the wall time and the device cache's trace (a frame
    per forward)."""

    engine: Engine
    lockstep: Lockstep
    ids: dict[str, int]
    seconds: float
    trace: Trace


def run(
    seed: int = 0,
    columns: int = 64,
    trace_path: str | None = None,
    print_fn: Callable[[str], None] = print,
    kv_events: KVEventsConfig | None = None,
    tp: int = 1,
) -> Report | None:
    """Runs the workload and prints the map and the summary; returns the measurements.

    seed       : seeds the model's weights, an integer >= 0
    columns    : cells per line of the printed map, an integer >= 1
    trace_path : where to save the device cache's trace, a frame per forward (`.npz`)
    kv_events  : None, or where the engine publishes its prefix cache's blocks (`Engine`)
    tp         : ranks of tensor parallelism (torchrun starts them; each holds its KV
                 heads; rank 0 schedules, prints and returns the report, the others None)
    Raises `LockstepError` at the first disagreement with the reference; TypeError or
    ValueError, before any work, for a bad argument (`check_arguments`).
    """
    check_arguments(seed, columns, trace_path, tp)
    from numbakv.cache.cellcache import CellCache
    from numbakv.cache.cuda import device_info, use_device
    from numbakv.device_model.model import DeviceModel

    model, group = Model.from_seed(MODEL, seed), None
    if tp > 1:
        model, group = _shard(model, tp)
        use_device(int(os.environ.get("LOCAL_RANK", group.rank)))  # a GPU a rank
    capacity = CACHE["capacity"] if group is None else group.agreed_min(CACHE["capacity"])
    config = model.config.cache_config(**CACHE | dict(capacity=capacity))
    cache = CellCache(config)
    device = Executor(DeviceModel(model, config), cache, MAX_SESSIONS, MAX_SESSION_TOKENS)
    reference = Executor(model, ReferenceCache(config), MAX_SESSIONS, MAX_SESSION_TOKENS)
    lockstep = front = Lockstep(device, reference)
    if group is not None:
        from numbakv.distributed.tensor_parallel import TensorParallel, serve

        if group.rank:
            serve(lockstep, group)
            return None
        front = TensorParallel(lockstep, group)
    recorder = Recorder(cache)
    try:  # the other ranks' serve() ends however this one does
        engine = Engine(
            front, DecodeFirstScheduler(16, 8, 8), annotate=recorder.annotate,
            prefix_cache=PrefixCache(front), kv_events=kv_events,
        )  # fmt: skip
        ranks = "" if group is None else f", tensor parallel over {tp} ranks (gloo)"
        print_fn(f"numbakv demo on {device_info()['name']}{ranks}: {len(WORKLOAD)} requests, "
                 f"checked against the reference cache at every step")  # fmt: skip
        ids, seconds = _serve(engine)
    finally:
        if group is not None:
            front.close()
    if engine.kv_events is not None:
        engine.kv_events.close()
        print_fn(f"KV events: {engine.kv_events.n_batches} batches to {kv_events.endpoint}")
    report = Report(engine, lockstep, ids, seconds, recorder.trace())
    _print(report, cache, columns, print_fn)
    if trace_path:
        recorder.save(trace_path)  # its members deflated while the demo ran
        print_fn(f"trace saved to {trace_path}; draw it with `numbakv viz {trace_path}`")
    return report


def _serve(engine: Engine) -> tuple[dict[str, int], float]:
    """Runs the workload's arrivals and cancellations: (request ids by name, seconds)."""
    ids: dict[str, int] = {}
    start = time.perf_counter()
    for tick in itertools.count():
        for arrival in WORKLOAD:
            if arrival.step == tick:
                ids[arrival.name] = engine.submit(
                    arrival.prompt, arrival.max_new_tokens, arrival.sampling, n=arrival.n
                )
            if arrival.cancel_at == tick:
                engine.cancel(ids[arrival.name])
        if not engine.is_busy and len(ids) == len(WORKLOAD):
            break
        engine.step()
    return ids, time.perf_counter() - start


def _shard(model: Model, tp: int) -> tuple[Model, object]:
    """(this rank's shard of `model`, the `Group`) of torchrun's group of `tp` ranks."""
    from numbakv.distributed.group import init
    from numbakv.distributed.tensor_parallel import shard_model

    group = init()
    if group.world != tp:
        raise ConfigError(f"--tp {tp} needs {tp} ranks (torchrun --nproc_per_node={tp}); "
                         f"this group has {group.world}")  # fmt: skip
    return shard_model(model, group), group


def check_arguments(seed: int, columns: int, trace_path: str | None, tp: int = 1) -> None:
    """Raises TypeError or ValueError naming the first argument of `run` that is wrong: a
    seed below 0, columns or tp below 1, a trace path not ending in .npz or in a missing
    folder."""
    for name, value, least in (("seed", seed, 0), ("columns", columns, 1), ("tp", tp, 1)):
        int_at_least(name, as_int(name, value, TypeError), least, ValueError)
    if trace_path is not None:
        new_file(trace_path, ".npz", ValueError)


def add_command(commands) -> None:
    """Adds the `demo` command to the `numbakv` subcommands."""
    demo = commands.add_parser(
        "demo", help="serve a mixed workload on the device, checked against the reference"
    )
    demo.add_argument("--seed", type=integer("--seed", 0), default=0, help="weights' seed (0)")
    demo.add_argument("--columns", type=integer("--columns", 1), default=64,
                      help="cells per map line")  # fmt: skip
    demo.add_argument("--trace", type=output_file(".npz"), metavar="FILE.npz",
                      help="save the table per forward")  # fmt: skip
    demo.add_argument("--tp", type=integer("--tp", 1), default=1,
                      help="tensor-parallel ranks, under torchrun (1)")  # fmt: skip
    demo.add_argument("--kv-events", type=endpoint, metavar="ENDPOINT",
                      help="publish prefix blocks as vLLM does (tcp://*:5557)")  # fmt: skip
    demo.set_defaults(run=run_command, parser=demo)


def endpoint(value: str) -> KVEventsConfig:
    """`--kv-events`: a `KVEventsConfig` publishing at `value`."""
    try:
        return KVEventsConfig(value)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`numbakv demo`: `run` with the parsed arguments; exit 1 for a disagreement with the
    reference or a trace that cannot be written."""
    trace = None if args.trace is None else str(args.trace)
    try:
        run(seed=args.seed, columns=args.columns, trace_path=trace, kv_events=args.kv_events,
            tp=args.tp)  # fmt: skip
    except LockstepError as error:
        return fail(parser, f"the device path disagrees with the reference: {error}")
    except ConfigError as error:  # the endpoint cannot be bound, or pyzmq is missing
        return fail(parser, str(error))
    except OSError as error:
        if trace is None:
            raise
        return fail(parser, f"cannot write the trace {trace} ({error.strerror or error}); {CHECK}")
    return 0


def letter(request: int) -> str:
    """The letter the demo draws request `request` with: a, b, c … in submission order."""
    from numbakv.viz.text import SEQ_CHARS

    return SEQ_CHARS[request]


def map_labels(trace: Trace, frame: int) -> dict[int, str]:
    """{sequence id: its request's letter} at `frame`, from the engine's annotations."""
    return {seq: letter(request) for seq, request in trace.seq_requests(frame).items()}


def _print(report: Report, cache, columns: int, print_fn: Callable[[str], None]) -> None:
    from numbakv.viz import render_text  # matplotlib: imported to draw

    engine, trace = report.engine, report.trace
    metrics = trace.metrics()
    busiest = int(np.argmax(metrics["used"][trace.step_frames]))  # `numbakv viz --step` of it
    frame = int(trace.step_frames[busiest])
    snapshot = trace.snapshot(frame)
    print_fn(
        f"\nthe pool at forward {busiest}, the busiest ({int(np.count_nonzero(snapshot.n_owners))} "
        f"cells used; a letter per request, * shared, . free, | read_len):"
    )
    print_fn(render_text(snapshot, columns, map_labels(trace, frame)))
    print_fn(
        f"\n{'map':<3} {'request':<8} {'arrives':>7} {'prompt':>6} {'n':>2} {'tokens':>6} "
        f"{'steps':>5} {'ttft s':>7} {'tok/s':>6} {'cached':>6}  finished"
    )
    n_generated = 0
    for arrival in WORKLOAD:
        request = report.ids[arrival.name]
        done = engine.result(request)
        m = done.metrics
        n_generated += m.n_tokens
        print_fn(
            f"{letter(request):<3} {arrival.name:<8} {arrival.step:>7} {len(done.prompt):>6} "
            f"{arrival.n:>2} {m.n_tokens:>6} {m.n_steps:>5} {m.time_to_first_token or 0:>7.2f} "
            f"{m.tokens_per_second or 0:>6.1f} {m.n_cached_tokens:>6}  "
            f"{' '.join(done.finish_reasons)}"
        )
    lockstep = report.lockstep
    print_fn(
        f"\n{engine.n_steps} steps ({trace.n_steps} forwards), {n_generated} tokens "
        f"generated in {report.seconds:.1f} s ({n_generated / report.seconds:.1f} tokens/s)\n"
        f"peak {metrics['used'].max()} cells used, peak read_len {metrics['read_len'].max()}, "
        f"{cache.rows} rows allocated after {cache.growth_count} growths\n"
        f"every step checked against the reference: {lockstep.n_steps} batches, tables equal, "
        f"tokens equal, logits within {lockstep.max_logit_error:.1e} of the largest\n"
        "annotations: " + ", ".join(f"{n} {kind}" for kind, n in trace.annotation_counts().items())
    )
    counts = engine.metrics.forwards
    print_fn(
        f"decode graphs: {counts.captures} captures ({counts.recaptures} recaptures after the "
        f"pool grew), {counts.replays} replays, {counts.eager_forwards} eager forwards "
        f"(prefill, mixed, the first decode at each pool size)"
    )
