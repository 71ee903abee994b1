"""Device attention through the cache, both modes, on random workloads (hypothesis):
equal to the reference's attend and to each sequence's solo attention."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import numbakv
from numbakv.reference import CellCache as RefCache
from numbakv.reference import solo_attention

from helpers import as_stored, assert_close, small_config


@settings(max_examples=10)
@given(
    group=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([16, 40, 64, 128]),
    window=st.sampled_from([0, 1, 2, 3, 5]),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    plan=st.lists(st.integers(0, 99), min_size=3, max_size=7),
    seed=st.integers(0, 2**16),
)
def test_both_modes_equal_reference_and_solo(group, head_dim, window, dtype, plan, seed):
    cfg = small_config(
        n_layers=2, n_kv_heads=1, head_dim=head_dim, windows=(0, window), dtype=dtype,
        capacity=40, max_width=9, max_seqs=4, initial_cells=3,
    )  # fmt: skip
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    rng = np.random.default_rng(seed)
    for cache in (device, reference):
        cache.seq_new(), cache.seq_new()
    # seq -> per layer, its K/V by position as stored: [length, 2, n_kv_heads, head_dim]
    history = {s: [np.zeros((0, 2, 1, head_dim), np.float32)] * 2 for s in (0, 1)}
    for op in plan:
        live = reference.live_seqs
        if op % 5 == 0 and len(live) < 4:  # a clone sharing a random prefix
            src = live[op % len(live)]
            upto = op % (reference.pos(src) + 1)
            seq = [c.seq_clone(src, upto) for c in (device, reference)][1]
            history[seq] = [h[:upto] for h in history[src]]
            continue
        if op % 7 == 1:  # a rewind
            seq = live[op % len(live)]
            position = reference.pos(seq) // 2
            for cache in (device, reference):
                cache.rewind(seq, position)
            history[seq] = [h[:position] for h in history[seq]]
            continue
        # a step: a prefill of one sequence mixed with decodes of the others, padded
        first = live[op % len(live)]
        seq_ids = [first] * (1 + op % 4) + [s for s in live if s != first]
        seq_ids = seq_ids[: min(cfg.max_width - 1, reference.free_cells)]
        width = len(seq_ids) + op % 2
        for cache in (device, reference):
            cache.declare_step(seq_ids)
            step = cache.prepare_step(width)
        positions = step.positions
        for layer in range(cfg.n_layers):
            k, v = rng.standard_normal((2, width, 1, head_dim)).astype(np.float32)
            q = rng.standard_normal((width, group, head_dim)).astype(np.float32)
            for cache in (device, reference):
                cache.write(layer, k, v)
            for t, seq in enumerate(seq_ids):
                stored = as_stored(np.stack([k[t], v[t]]), dtype)[None]
                history[seq][layer] = np.concatenate([history[seq][layer], stored])
            # reference
            expect = reference.attend(layer, q)
            for mode in ("masked", "gathered"):
                # device
                got = device.attend(layer, q, mode=mode).copy_to_host()
                # compare
                assert_close(got, expect, mode)
                assert not got[len(seq_ids) :].any()  # padding rows give 0
                for t, seq in enumerate(seq_ids):
                    hist = history[seq][layer]
                    solo = solo_attention(
                        q[t : t + 1], hist[:, 0], hist[:, 1], positions[t : t + 1],
                        cfg.windows[layer],
                    )  # fmt: skip
                    assert_close(got[t], solo[0])
