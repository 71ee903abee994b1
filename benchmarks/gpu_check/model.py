"""Decode steps of the device-resident model in `python -m benchmarks.gpu_check`, eager
against replayed: a deep `DeviceModel` over the device cache, `batch` sequences with a
short history, then per timed step the same tokens twice at the same positions, once
launched kernel by kernel and once as the replay of one captured step (a CUDA graph on a
GPU, recorded launches on the simulator). The wall clock of each covers declare_step +
prepare_step + stage + the launches + the logits copied back; the two logits must be
equal bit for bit."""

import time

import numpy as np

from benchmarks.gpu_check.run import Run


def build(run: Run, batch: int) -> tuple:
    """(device model, cache, its `batch` sequences) after a prefill of `model_history` tokens
    each (eager forwards)."""
    from numbakv import DeviceModel
    from numbakv.serve.model import Model, ModelConfig

    s = run.shapes
    d_model, n_heads, n_kv_heads, head_dim, d_ff = s.model_dims
    config = ModelConfig(
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, d_ff=d_ff,
        windows=(0,) * s.model_layers,
    )  # fmt: skip
    n_steps = s.decode_warmup + s.decode_steps
    max_seq_len = s.model_history + n_steps + 1
    cache = run.device.CellCache(config.cache_config(
        capacity=batch * max_seq_len, max_width=max(batch, s.model_history), max_seqs=batch,
        max_seq_len=max_seq_len, initial_cells=batch * max_seq_len, dtype="float16",
    ))  # fmt: skip
    model = DeviceModel(Model.from_seed(config, seed=0), cache.config)
    seqs = [cache.seq_new() for _ in range(batch)]
    rng = np.random.default_rng(3)
    for seq in seqs:
        cache.declare_step([seq] * s.model_history)
        step = cache.prepare_step()
        tokens = rng.integers(0, config.vocab_size, s.model_history)
        model.forward(cache, step, tokens, [s.model_history - 1])
    return model, cache, seqs


def decode_step(model: object, cache: object, seqs: list[int], tokens: np.ndarray) -> object:
    """Declares and prepares one token per sequence and stages its tokens: the step."""
    cache.declare_step(seqs)
    step = cache.prepare_step()
    model.stage(cache, step, tokens, np.arange(len(seqs)))
    return step


def part_model_graphs(run: Run) -> None:
    """Per batch: µs per decode step eager and replayed (medians), and their ratio."""
    s = run.shapes
    d_model, n_heads, n_kv_heads, head_dim, d_ff = s.model_dims
    print(f"  {s.model_layers} layers, d_model {d_model}, {n_heads} heads / {n_kv_heads} KV "
          f"heads x {head_dim}, d_ff {d_ff}, float16 K/V, {s.model_history} positions of "
          f"history; {s.decode_steps} timed steps after {s.decode_warmup}")  # fmt: skip
    for batch in s.model_batches:
        model, cache, seqs = build(run, batch)
        rng = np.random.default_rng(batch)
        graph, eager, replayed = None, [], []
        for i in range(s.decode_warmup + s.decode_steps):
            tokens = rng.integers(0, model.config.vocab_size, batch)
            began = time.perf_counter()
            step = decode_step(model, cache, seqs, tokens)
            model.run(cache, step)
            by_kernel = model.logits(batch)
            eager_s = time.perf_counter() - began
            for seq in seqs:  # the same tokens again, at the same positions, from the graph
                cache.rewind(seq, cache.pos(seq) - 1)
            began = time.perf_counter()
            step = decode_step(model, cache, seqs, tokens)
            if graph is None:
                graph = cache.capture(lambda: model.run(cache, step))  # noqa: B023
            else:
                graph.replay()
            from_graph = model.logits(batch)
            replayed_s = time.perf_counter() - began
            if not np.array_equal(by_kernel, from_graph):
                raise AssertionError(f"batch {batch}, step {i}: replayed logits differ")
            if i >= s.decode_warmup:
                eager.append(eager_s)
                replayed.append(replayed_s)
        e, r = np.median(eager) * 1e6, np.median(replayed) * 1e6
        case = f"batch {batch}, {s.model_layers} layers"
        run.add("model graphs", f"{case}, eager", us=f"{e:.1f}")
        run.add("model graphs", f"{case}, replayed ({graph.kind})", us=f"{r:.1f}")
        run.add("model graphs", f"{case}, eager / replayed", result=f"ok: {e / r:.2f}x")
