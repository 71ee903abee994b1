"""The host cost of a decode step in `python -m benchmarks.gpu_check`: steps through every
layer of a deep cache with device inputs and no model (declare_step, prepare_step, then
write + attend per layer), timed three ways: the host's wall clock until the last launch
returns, CUDA events over the step, and the wall clock to a synchronize."""

import time

import numpy as np

from benchmarks.gpu_check.fill import prefilled_cache
from benchmarks.gpu_check.run import Run


def part_decode_step(run: Run) -> None:
    """Decode steps after a warm-up, nothing moving in the cache while timed; medians over
    the timed steps."""
    s, cuda = run.shapes, run.device.cuda
    n_kv_heads, n_heads, head_dim = s.decode_heads
    batch, n_layers = s.decode_batch, s.decode_layers
    print(f"  {n_layers} layers, batch {batch}, {n_heads} heads / {n_kv_heads} KV heads x "
          f"{head_dim}, float16, {s.decode_history} positions each; gathered attention; "
          f"{s.decode_steps} timed steps after {s.decode_warmup}")  # fmt: skip
    cache, seqs, kv, _ = prefilled_cache(
        run, n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, batch=batch,
        max_seq_len=s.decode_history + s.decode_warmup + s.decode_steps,
        history=s.decode_history, seed=1,
    )  # fmt: skip
    rng = np.random.default_rng(2)
    k, v = (cuda.to_device(kv.k_h[:batch]), cuda.to_device(kv.v_h[:batch]))
    q = cuda.to_device(rng.standard_normal((batch, n_heads, head_dim), dtype=np.float32))
    out = cuda.device_array(q.shape, np.float32)
    stream, start, end = cuda.stream(), cuda.event(), cuda.event()
    host, device, wall = [], [], []
    for i in range(s.decode_warmup + s.decode_steps):
        if i == s.decode_warmup:
            bindings = cache.bindings()
        start.record(stream)
        began = time.perf_counter()
        cache.declare_step(seqs)
        cache.prepare_step(stream=stream)
        for layer in range(n_layers):
            cache.write(layer, k, v)
            cache.attend(layer, q, out=out)
        launched = time.perf_counter()
        end.record(stream)
        end.synchronize()
        done = time.perf_counter()
        if i >= s.decode_warmup:
            host.append(launched - began)
            wall.append(done - began)
            device.append(run.device.elapsed(start, end, done - began))
    cache.check_bindings(bindings)  # nothing moved while timing: no growth, no new buffer
    rows = [
        (f"host, {n_layers} layers, to the last launch", host),
        ("host per layer", [x / n_layers for x in host]),
        ("device, CUDA events" if not run.is_sim else "device (sim: wall clock)", device),
        ("wall, to a synchronize", wall),
    ]
    for what, times in rows:
        run.add("decode step", f"{what}, batch {batch}", us=f"{np.median(times) * 1e6:.1f}")
