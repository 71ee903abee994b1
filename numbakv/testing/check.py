"""`check_cache`: a cache under test held to the reference, op by op — first on every hazard
scenario (`hazards`), then on random swarm workloads (`workloads`) — and a failure shrunk to
a short op script that replays. NumPy only: the draws come from `numpy.random` seeded by
`seed`, so what a run finds depends on the seed alone, never on the calling program.
"""

import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.testing import hazards as hazard_scripts
from numbakv.testing.coverage import Coverage
from numbakv.testing.op import Op
from numbakv.testing.ops import COMPARES, OP_TIMEOUT, Check, Divergence, Runner, apply, run_script
from numbakv.testing.shrink import shrink
from numbakv.testing.workloads import ALL_KINDS, CODES, KINDS, Swarm, decode

DEFAULT_CONFIGS = (  # small, every refusal of docs/contract.md §6.1 within a few ops; one long:
    # room to fork two whole blocks of 32 and one position past them (hazards.cuts)
    CacheConfig(n_layers=1, n_kv_heads=2, head_dim=4, windows=(1,), capacity=6,
                max_width=6, max_seqs=2, max_seq_len=6, initial_cells=1),
    CacheConfig(n_layers=2, n_kv_heads=2, head_dim=8, windows=(0, 3), capacity=24,
                max_width=4, max_seqs=4, max_seq_len=10, initial_cells=4),
    CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, windows=(2,), capacity=16,
                max_width=5, max_seqs=3, max_seq_len=12, initial_cells=2, dtype="float16"),
    CacheConfig(n_layers=2, n_kv_heads=2, head_dim=4, windows=(4, 0), capacity=40,
                max_width=6, max_seqs=5, max_seq_len=8, initial_cells=8),
    CacheConfig(n_layers=2, n_kv_heads=2, head_dim=4, windows=(0, 5), capacity=72,
                max_width=16, max_seqs=3, max_seq_len=67, initial_cells=4),
)  # fmt: skip
# quantized storage (docs/contract.md §4.1): one format throughout, K and V apart, per layer
# (a sliding float16 layer beside a global quantized one), fp8 with per-head scales; GQA
# and growth. Not in the defaults (a cache may store floats only): pass configs=
QUANTIZED_CONFIGS = tuple(
    CacheConfig(n_kv_heads=2, head_dim=32, capacity=12, max_width=4, max_seqs=3,
                initial_cells=4, max_seq_len=10, **fields)
    for fields in (
        dict(n_layers=1, dtype="q8_0"),
        dict(n_layers=1, k_dtype="q4_0", v_dtype="q8_0", windows=(3,)),
        dict(n_layers=2, dtype="fp8_e4m3", fp8_scales=[[[0.5, 2.0], [1.5, 0.25]]] * 2,
             windows=(0, 2)),
        dict(n_layers=2, layer_dtypes=("float16", ("q8_0", "fp8_e4m3")), windows=(2, 0)),
    )
)  # fmt: skip
DEFAULT_SEED = 0  # the seed of seed=None: the same workloads every run


def check_cache(
    factory: Callable[[CacheConfig], object],
    *,
    compare: str = "semantic",
    configs: Sequence[CacheConfig] | None = None,
    max_examples: int = 100,
    max_ops: int = 30,
    seed: int | None = None,
    tolerance: float | None = None,
    prefix: Sequence[Op] | Callable[[CacheConfig], Sequence[Op]] = (),
    check: Check | None = None,
    hazards: bool | Iterable[str] = True,
    kinds: Iterable[str] = KINDS,
    op_timeout: float | None = OP_TIMEOUT,
    report: bool = False,
    strict: bool = False,
    block_size: int | None = None,
) -> Coverage | None:
    """Holds `factory(config)` (a `CacheUnderTest`) to the reference, op by op.

    factory      : makes an empty cache of a `CacheConfig` (a class such as
                   `numbakv.CellCache`, or your adapter)
    compare      : "semantic" for any layout, "table" for a cell layout (see `run_script`)
    configs      : the configs to run (default DEFAULT_CONFIGS: GQA, windows at and
                   around the history, float32 and float16, growth, full caches, one of
                   sequences up to 67 positions); give your own for your head
                   counts, longer sequences, a block size past 32 or a larger pool;
                   QUANTIZED_CONFIGS for q8_0, q4_0 and fp8_e4m3 storage (compare="table"
                   holds their bytes)
    hazards      : first run every hazard scenario (`HAZARDS`, and `OPTIONAL_HAZARDS`
                   of the kinds asked for) on every config; or the names of those to run
                   (False: none)
    kinds        : the kinds of op run (`workloads.KINDS`, default all): hazard scripts
                   with another kind are skipped, workloads draw no other (for a hook
                   that holds every placed cell's K/V written: the verbs and "step");
                   add "reload" for a cache with saved sequences (docs/contract.md §13)
    max_examples : random workloads to run, each of 1 to `max_ops` ops (uniformly) in its
                   own mix (`Swarm.draw`) on a config drawn from `configs` (`decode`)
    seed         : the seed of the workloads (None: DEFAULT_SEED, the same every run)
    tolerance    : of attention outputs (see `run_script`); default by the storage dtype
    prefix       : ops run before every script and again after each `clear`, so that the
                   state they make holds throughout (ids parked so that the ids under test
                   are past 63, sequences open); or a function of the config giving them.
                   Each op's outcome is compared, the rest after its last (`Runner.setup`);
                   a hazard's ids become the ids the prefix leaves free, in order
    check        : a hook called after every op (see `run_script`), for a layout's own state
    op_timeout   : seconds an op of the cache may take before it is a hang (a divergence)
    report       : return the `Coverage` of the run (what it exercised, and the rules of
                   numbakv's etiquette the cache did not follow)
    strict       : also hold the cache to numbakv's argument etiquette
                   (`etiquette.ETIQUETTE`: K/V that are not floats refused, a stale step's
                   fields raising StepError, the class of the first of several faults,
                   StepError for a malformed argument); by default a cache is held to
                   behaviour alone (the etiquette it breaks is reported): every
                   placement, position, stored K/V byte (compare="table"), attention output
                   and refusal a runtime sees (capacity, dead or reused ids, positions,
                   windows, the step protocol's state)
    block_size   : your layout's block (page) size N: the fork, rewind and reload hazards
                   cut at 0, 1, N-1, N, N+1, 2N-1, 2N and 2N+1 positions (default 16 and
                   32; every position up to 17 always: `hazards.cuts`) where a config has
                   room; ValueError when no config holds 2N+1 positions and two more

    Returns None (or the Coverage) when every script agreed; otherwise raises `Divergence`
    (an AssertionError) whose message names the hazard (`hazard 'fork-partial-then-append'
    at offset 3 of 24: ...`) or the workload, and holds the shrunk op script (the
    prefix included), the config and the first difference.
    """
    if compare not in COMPARES:
        raise ValueError(f"compare={compare!r}: give one of {COMPARES}")
    configs, started = list(configs or DEFAULT_CONFIGS), time.perf_counter()
    _check_block_size(block_size, configs, hazards)
    coverage = Coverage(compare)

    def run(config: CacheConfig, ops: Sequence[Op], what: str, draw=None) -> None:
        start = list(prefix(config) if callable(prefix) else prefix)
        runner = Runner(factory, config, compare, tolerance=tolerance, check=check,
                        op_timeout=op_timeout, watch=coverage.watch(config),
                        strict=strict)  # fmt: skip
        try:
            runner.setup(start)
            for op in ops if draw is None else draw(runner):
                runner.run(op)
                if op.verb == "clear":
                    runner.setup(start)
        except Divergence as error:
            shrunk = _shrunk(error, what, factory, dict(compare=compare, tolerance=tolerance,
                             check=check, op_timeout=op_timeout, strict=strict))  # fmt: skip
            coverage.seconds, shrunk.coverage = time.perf_counter() - started, coverage
            raise shrunk from None

    names = hazard_scripts.ALL_HAZARDS if hazards is True else hazards or ()
    kinds = _kinds(kinds)
    for config in configs if names else ():
        free = _free_ids(config, prefix)
        for name, label, ops in hazard_scripts.scripts(config, compare, names, block_size):
            if any(op.verb not in kinds for op in ops):
                continue
            coverage.hazards[name] += 1
            run(config, [_renamed(op, free) for op in ops], f"hazard {name!r} {label}")
    rng = np.random.default_rng([DEFAULT_SEED if seed is None else seed, 0x6E6B76])
    for example in range(max_examples):
        config, swarm = configs[int(rng.integers(len(configs)))], Swarm.draw(rng, kinds)
        n_ops = int(rng.integers(1, max_ops + 1))

        def draw(runner, config=config, swarm=swarm, n_ops=n_ops):
            for _ in range(n_ops):
                width = runner.protocol.width
                yield decode(int(rng.integers(CODES, dtype=np.uint64)), runner.reference,
                             config, swarm, width, compare)  # fmt: skip

        coverage.workloads += 1
        run(config, (), f"random workload {example} of seed {seed} (mix: {swarm})", draw)
    coverage.seconds = time.perf_counter() - started
    return coverage if report else None


def _kinds(kinds: Iterable[str]) -> frozenset[str]:
    kinds = frozenset(kinds)
    if not kinds or not kinds <= set(ALL_KINDS) or "step" not in kinds:
        raise ValueError(f"kinds={sorted(kinds)}: give kinds of {ALL_KINDS}, 'step' among them")
    return kinds


def _free_ids(config: CacheConfig, prefix) -> list[int]:
    """The ids `seq_new` hands out, in order, after the prefix (all of them without one)."""
    from numbakv.reference import CellCache

    start = list(prefix(config) if callable(prefix) else prefix)
    if not start:
        return list(range(config.max_seqs))
    cache = CellCache(config)
    for op in start:
        try:
            apply(cache, op, config)
        except Exception:  # a prefix op the reference refuses: refused by both, nothing made
            continue
    live = set(cache.live_seqs)
    return [seq for seq in range(config.max_seqs) if seq not in live]


def _renamed(op: Op, free: list[int]) -> Op:
    """A hazard's op with its ids (0, 1, ...: the first, second, ... opened) the prefix's
    free ids; ids past them, and hostile ones, as they are."""
    if len(free) and free[0] == 0 and free == list(range(len(free))):
        return op

    def name(seq):
        return free[seq] if type(seq) is int and 0 <= seq < len(free) else seq

    if op.verb in ("step", "declare") and isinstance(op.args[0], tuple):
        return Op(op.verb, (tuple(name(s) for s in op.args[0]), *op.args[1:]))
    if op.verb in ("seq_clone", "seq_rm", "rewind"):
        return Op(op.verb, (name(op.args[0]), *op.args[1:]))
    return op


def _check_block_size(block_size, configs: list[CacheConfig], hazards) -> None:
    """ValueError for a block size that is not a positive int, or (the fork hazards run)
    whose 2N+1 positions no config has room for."""
    if block_size is None:
        return
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size={block_size!r}: give a positive int, or None")
    wanted = 2 * block_size + 1
    if hazards and max(map(hazard_scripts.room, configs)) < wanted:
        raise ValueError(
            f"block_size={block_size}: no config has room for the {wanted} positions the "
            f"fork hazards cut at (2N+1) and two more per side: pass configs= with one of "
            f"max_seq_len >= {wanted + 2} and capacity >= {wanted + 4}"
        )


def _shrunk(error: Divergence, what: str, factory, keywords: dict) -> Divergence:
    """The Divergence of the shortest script `shrink` finds, its message naming `what`;
    `keywords` those of `run_script` the run used."""
    if not error.ops:  # the factory failed: nothing to shrink
        return Divergence(f"{what}: {error}", error.ops, error.index, error.config)

    def fails(ops) -> bool:
        try:
            run_script(factory, error.config, ops, **keywords)
        except Divergence:
            return True
        return False

    minimal = shrink(error.ops, fails)
    try:
        run_script(factory, error.config, minimal, **keywords)
    except Divergence as shrunk:
        return Divergence(f"{what}: {len(error.ops)} ops shrunk to {len(minimal)}: {shrunk}",
                          shrunk.ops, shrunk.index, error.config)  # fmt: skip
    return Divergence(f"{what} (the shrunk script did not diverge again: a flaky cache?): "
                      f"{error}", error.ops, error.index, error.config)  # fmt: skip
