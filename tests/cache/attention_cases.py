"""The workload the attention kernel tests share: a reference cache after new sequences,
prefills, a clone sharing a prefix, a removal whose holes refill and a rewind, with what it
wrote, its pool and masks poisoned wherever a kernel must not read, and its final step as
a step buffer with live-looking junk past the width."""

from dataclasses import dataclass

import numpy as np

from numbakv import CacheConfig
from numbakv.cache.cuda import cuda
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, SCALARS, SEQ_IDS, host_step
from numbakv.reference import CellCache

from helpers import as_stored

BFLOAT16_NAN = np.uint16(0x7FC0)  # a NaN's bit pattern in a bfloat16 pool
SENTINEL = np.float32(7.0)  # out rows past the width must keep it
MAX_WIDTH = 12
CAPACITY = 48
# the final step of each shape; "padding" rows follow the declared tokens
DECODE_STEP = dict(tokens=["a", "c", "e"], width=4)  # one token each of 3 sequences
PREFILL_STEP = dict(tokens=["c"] * 5 + ["d"] * 3 + ["e"] * 3, width=12)


SHAPES = ("decode", "prefill")


def to_d(x):
    return cuda.to_device(np.ascontiguousarray(x))


@dataclass
class Case:
    """A reference cache after a workload and a prepared final step, with what it wrote."""

    cache: CellCache
    step: object
    history: dict  # seq -> (k [length, n_kv_heads, head_dim], v) float32 of stored values
    q: np.ndarray  # [MAX_WIDTH, n_heads, head_dim] float32, junk rows past the width
    longest: int  # the longest history a token of the final step sees (its position + 1)


def build_case(n_heads, n_kv_heads, head_dim, dtype, final, windows=(0,), seed=0) -> Case:
    """The workload every test shares, then `final` (DECODE_STEP or PREFILL_STEP).

    a: 9 tokens; b: 5 with a: 2 more; c = clone(a, upto=6) then 4 tokens and b: 1;
    d: 6 tokens; rm(b) leaves holes; rewind(a, 8); a, d, c, a refill the holes;
    e = clone(d, upto=3).
    """
    rng = np.random.default_rng(seed)
    config = CacheConfig(
        n_layers=len(windows), n_kv_heads=n_kv_heads, head_dim=head_dim, windows=windows,
        capacity=CAPACITY, max_width=MAX_WIDTH, max_seqs=8, initial_cells=8, dtype=dtype,
    )  # fmt: skip
    cache = CellCache(config)
    history: dict[int, list] = {}
    ids: dict[str, int] = {}

    def new(name):
        ids[name] = cache.seq_new()
        history[ids[name]] = []

    def step(names, width=None):
        seqs = [ids[n] for n in names]
        cache.declare_step(seqs)
        prepared = cache.prepare_step(width)
        shape = (prepared.width, n_kv_heads, head_dim)
        k, v = rng.standard_normal((2, *shape)).astype(np.float32)
        for layer in range(config.n_layers):
            cache.write(layer, k, v)
        for t, seq in enumerate(seqs):  # what the pool holds: the storage dtype, widened
            stored = (as_stored(k[t], dtype), as_stored(v[t], dtype))
            history[seq].append(stored)
        return prepared

    def clone(name, src, upto):
        ids[name] = cache.seq_clone(ids[src], upto=upto)
        history[ids[name]] = history[ids[src]][:upto]

    new("a")
    step(["a"] * 9)
    new("b")
    step(["b"] * 5 + ["a"] * 2)
    clone("c", "a", 6)
    step(["c"] * 4 + ["b"])
    new("d")
    step(["d"] * 6)
    cache.seq_rm(ids["b"])
    del history[ids.pop("b")]
    cache.rewind(ids["a"], 8)
    history[ids["a"]] = history[ids["a"]][:8]
    step(["a", "d", "c", "a"])
    clone("e", "d", 3)
    last = step(final["tokens"], final["width"])
    q = rng.standard_normal((MAX_WIDTH, n_heads, head_dim)).astype(np.float32)
    stacked = {s: tuple(np.array(x) for x in zip(*h, strict=True)) for s, h in history.items()}
    longest = int(last.positions.max()) + 1
    return Case(cache, last, stacked, q, longest)


def poisoned_pool(case: Case, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """The layer's K/V with NaN in every free cell and every row past read_len (2 extra rows)."""
    snap = case.cache.snapshot()
    k, v = case.cache.pool_kv(layer)
    nan = BFLOAT16_NAN if k.dtype == np.uint16 else np.nan
    extra = np.full((2, *k.shape[1:]), nan, k.dtype)
    k, v = np.concatenate([k, extra]), np.concatenate([v, extra])
    for x in (k, v):
        x[snap.read_len :] = nan
        x[: snap.read_len][snap.pos < 0] = nan
    return k, v


def poisoned_mask(step, window: int) -> np.ndarray:
    """[MAX_WIDTH, CAPACITY] uint8: the step's mask, 1s (attend!) everywhere it is not written."""
    mask = np.ones((MAX_WIDTH, CAPACITY), np.uint8)
    mask[: step.width, : step.read_len] = step.mask(window)
    return mask


def step_buffer(step, junk_seq: int, junk_pos: int = 3, columns: int = MAX_WIDTH) -> np.ndarray:
    """[4, columns] int32: the prepared step's buffer (`host_step`: its width and read_len),
    and past the width junk that looks live: cell 0, sequence `junk_seq` at `junk_pos`, and
    a huge width and read_len in the SCALARS row past the two scalars."""
    buffer = host_step(step.cells, step.positions, step.seq_ids, step.read_len, columns)
    width = step.width
    buffer[CELLS, width:], buffer[POSITIONS, width:] = 0, junk_pos
    buffer[SEQ_IDS, width:] = junk_seq
    buffer[SCALARS, 2:] = 1 << 20
    return buffer
