"""The reference's random workloads: the configs they draw, and `NaiveCache`, the whole
contract (docs/contract.md §2-§6) as plain Python, a complete `numbakv.testing.CacheUnderTest`
the reference is held to: dicts, lists and sets, nothing shared with `reference/` and none
of `numbakv.core.calls`.

- The table: each live sequence's cells in position order, each occupied cell's position
  and owners; placement, ids, clone/rm/rewind/clear, growth and the mask rule follow
  §2-§4 word for word, and so do the refusals of §6, in the order of §6.1.
- K/V: each sequence's history by position, per layer, as the values the pool stores
  (rounded through ml_dtypes, `helpers.as_storage`); a clone copies its prefix, a rewind
  cuts it. `pool_kv` lays the histories out in their cells.
- Attention: the solo oracle (`solo_attention`) over each sequence's own history, cast
  back to float32; padded rows are 0.
"""

import numpy as np
from hypothesis import strategies as st

from numbakv.core.config import TOLERANCE, CacheConfig
from numbakv.core.errors import CapacityError, SequenceError, StepError
from numbakv.core.snapshot import Snapshot
from numbakv.reference import solo_attention
from numbakv.testing.refusals import index

from helpers import as_storage, pool_values

# global, 1, 2, odd, even, and wider than any history (capacity <= 64)
WINDOWS = (0, 1, 2, 3, 4, 5, 8, 100)
TOL = dict(rtol=TOLERANCE["float32"], atol=TOLERANCE["float32"])  # float32 arithmetic


@st.composite
def configs(draw, max_seqs: int) -> tuple[CacheConfig, int]:
    """(config, n_heads): a small cache that grows often."""
    n_layers = draw(st.integers(1, 3))
    windows = tuple(draw(st.lists(st.sampled_from(WINDOWS), min_size=n_layers, max_size=n_layers)))
    n_kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from((1, 2, 4)))
    config = CacheConfig(
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        head_dim=draw(st.sampled_from((12, 16, 20))),
        capacity=draw(st.one_of(st.integers(24, 32), st.integers(24, 64))),  # often nearly full
        max_width=draw(st.integers(1, 12)),
        max_seqs=max_seqs,
        windows=windows,
        initial_cells=draw(st.integers(1, 8)),
        dtype=draw(st.sampled_from(("float32", "float16", "bfloat16"))),
    )
    return config, group * n_kv_heads


# the same ranges as a list, for `check_cache`: (n_layers, windows, n_kv_heads, head_dim,
# capacity, max_width, initial_cells, dtype, max_seq_len or None for the capacity)
SHAPES = (
    (1, (0,), 1, 12, 24, 4, 1, "float32", None),
    (2, (1, 100), 2, 16, 32, 12, 2, "float16", None),
    (3, (2, 3, 0), 1, 20, 64, 8, 8, "bfloat16", None),
    (2, (4, 5), 2, 12, 28, 6, 3, "bfloat16", 20),
    (1, (8,), 1, 16, 40, 1, 1, "float32", None),
    (3, (0, 5, 2), 2, 20, 24, 10, 4, "float16", 16),
    (2, (3, 8), 1, 20, 56, 5, 6, "float32", None),
    (1, (100,), 2, 12, 30, 3, 2, "float16", 12),
    (3, (1, 4, 0), 1, 16, 26, 7, 5, "bfloat16", None),
    (2, (0, 2), 2, 16, 64, 12, 7, "float32", 24),
)


def config_list(max_seqs: int) -> list[CacheConfig]:
    """Every shape of `SHAPES` with `max_seqs` ids: every window, 1 to 3 layers, 1 or 2 KV
    heads, head_dim 12/16/20, the three storage dtypes, tiny first allocations, capacities
    the workloads fill."""
    return [
        CacheConfig(n_layers=n, windows=w, n_kv_heads=kv, head_dim=d, capacity=c,
                    max_width=mw, max_seqs=max_seqs, initial_cells=i, dtype=dtype,
                    max_seq_len=length or c)
        for n, w, kv, d, c, mw, i, dtype, length in SHAPES
    ]  # fmt: skip


class NaiveStep:
    """A prepared step: [width] int32 cells, positions and seq_ids (-1 padding), its width,
    declared count, read_len and windows; masks made from the table when first read. Every
    field but `is_stale` raises StepError once a later verb has run."""

    def __init__(self, cache, cells: list[int], positions: list[int], seq_ids: list[int],
                 width: int, read_len: int):  # fmt: skip
        pad = [-1] * (width - len(cells))
        self._cache, self._masks, self.is_stale = cache, {}, False
        self._fields = {
            "cells": np.array(cells + pad, np.int32),
            "positions": np.array(positions + pad, np.int32),
            "seq_ids": np.array(seq_ids + pad, np.int32),
            "width": width,
            "n_tokens": len(cells),
            "read_len": read_len,
            "windows": tuple(sorted(set(cache.config.windows))),
        }

    def _get(self, name: str):
        if self.is_stale:
            raise StepError(f"step.{name} of a stale step")
        value = self._fields[name]
        return value.copy() if isinstance(value, np.ndarray) else value

    cells = property(lambda self: self._get("cells"))
    positions = property(lambda self: self._get("positions"))
    seq_ids = property(lambda self: self._get("seq_ids"))
    width = property(lambda self: self._get("width"))
    n_tokens = property(lambda self: self._get("n_tokens"))
    read_len = property(lambda self: self._get("read_len"))
    windows = property(lambda self: self._get("windows"))

    def mask(self, window: int) -> np.ndarray:
        """uint8 [width, read_len]: token t (sequence s, position p) sees cell c when s owns
        c, pos[c] <= p and, for a window W > 0, pos[c] > p - W."""
        if window not in self.windows:
            raise StepError(f"no mask of window {window!r}")
        if window not in self._masks:
            table = self._cache
            rows = []
            for t in range(self.width):
                row = [0] * self.read_len
                if t < self.n_tokens:
                    seq, p = int(self._fields["seq_ids"][t]), int(self._fields["positions"][t])
                    for cell, held in table.cell_pos.items():
                        seen = held <= p and (window == 0 or held > p - window)
                        if seq in table.cell_owners[cell] and seen:
                            row[cell] = 1
                rows.append(row)
            self._masks[window] = np.array(rows, np.uint8).reshape(self.width, self.read_len)
        return self._masks[window].copy()


class NaiveCache:
    """The contract's cell cache, plainly (see the module docstring)."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.rows = 0  # the pool's rows: it grows at a step and never shrinks
        self.seqs: dict[int, list[int]] = {}  # live id -> its cells, index = position
        self.cell_pos: dict[int, int] = {}  # occupied cell -> position
        self.cell_owners: dict[int, set[int]] = {}  # occupied cell -> owning ids
        self.history: dict[int, list[list[tuple]]] = {}  # id -> per layer, per position (k, v)
        self._declared: list[int] | None = None
        self._step: NaiveStep | None = None
        self._written: set[int] = set()

    # -- state -----------------------------------------------------------------

    @property
    def read_len(self) -> int:
        return max(self.cell_pos) + 1 if self.cell_pos else 0

    @property
    def used_cells(self) -> int:
        return len(self.cell_pos)

    @property
    def free_cells(self) -> int:
        return self.config.capacity - len(self.cell_pos)

    @property
    def live_seqs(self) -> list[int]:
        return sorted(self.seqs)

    def pos(self, seq) -> int:
        return len(self.seqs[self._live(seq)])

    def snapshot(self) -> Snapshot:
        """Cells [0, read_len): positions, owner bitsets; the live ids, capacity and rows."""
        cfg, n = self.config, self.read_len
        words = [[0] * cfg.n_owner_words for _ in range(n)]
        for cell, owners in self.cell_owners.items():
            for seq in owners:
                words[cell][seq // 64] |= 1 << (seq % 64)
        return Snapshot(
            pos=np.array([self.cell_pos.get(c, -1) for c in range(n)], np.int32),
            owners=np.array(words, np.uint64).reshape(n, cfg.n_owner_words),
            live=np.array([s in self.seqs for s in range(cfg.max_seqs)]),
            read_len=n,
            capacity=cfg.capacity,
            rows=self.rows,
        )

    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V [rows, n_kv_heads, head_dim] of the storage dtype: each occupied cell holds
        the history entry of its position (the same in every owner), other rows 0."""
        cfg = self.config
        k, v = np.zeros((2, self.rows, cfg.n_kv_heads, cfg.head_dim), cfg.storage_dtype)
        for cell, p in self.cell_pos.items():
            k[cell], v[cell] = self.history[min(self.cell_owners[cell])][layer][p]
        return k, v

    def check_invariants(self) -> None:
        """Each live sequence holds positions 0 .. pos-1, in cells it owns, and a history of
        pos entries per layer; each occupied cell's owners are live and hold it."""
        for seq, cells in self.seqs.items():
            assert [self.cell_pos[c] for c in cells] == list(range(len(cells))), seq
            assert all(seq in self.cell_owners[c] for c in cells), seq
            assert [len(layer) for layer in self.history[seq]] == [len(cells)] * len(
                self.history[seq]
            ), seq
        assert set(self.cell_pos) == set(self.cell_owners)
        for cell, owners in self.cell_owners.items():
            assert owners and all(cell in self.seqs.get(s, ()) for s in owners), cell

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        return self._open(self._free_id(), [], [[] for _ in range(self.config.n_layers)])

    def seq_clone(self, src, upto=None) -> int:
        src = self._live(src)
        upto = len(self.seqs[src]) if upto is None else self._position("upto", upto, src)
        seq = self._free_id()
        self._changed()
        for cell in self.seqs[src][:upto]:
            self.cell_owners[cell].add(seq)
        history = [layer[:upto] for layer in self.history[src]]
        return self._open(seq, self.seqs[src][:upto], history)

    def seq_rm(self, seq) -> None:
        seq = self._live(seq)
        self._changed()
        self._leave(seq, self.seqs.pop(seq))
        del self.history[seq]

    def rewind(self, seq, position) -> None:
        seq = self._live(seq)
        position = self._position("position", position, seq)
        self._changed()
        self._leave(seq, self.seqs[seq][position:])
        self.seqs[seq] = self.seqs[seq][:position]
        self.history[seq] = [layer[:position] for layer in self.history[seq]]

    def clear(self) -> None:
        self._changed()
        self.seqs, self.cell_pos, self.cell_owners, self.history = {}, {}, {}, {}

    # -- the step ----------------------------------------------------------------

    def declare_step(self, seq_ids) -> None:
        if not isinstance(seq_ids, list | tuple | range):
            raise StepError(f"declare a list of ids, not {seq_ids!r}")
        ids = [self._live(seq) for seq in seq_ids]
        if not 1 <= len(ids) <= self.config.max_width:
            raise StepError(f"{len(ids)} tokens declared; 1 to {self.config.max_width}")
        if len(ids) > self.free_cells:
            raise CapacityError(f"{len(ids)} tokens, {self.free_cells} free cells")
        for seq in set(ids):
            if len(self.seqs[seq]) + ids.count(seq) > self.config.max_seq_len:
                raise CapacityError(f"sequence {seq} would pass max_seq_len")
        self._expire()
        self._declared = ids

    def prepare_step(self, width=None) -> NaiveStep:
        if self._declared is None:
            raise StepError("nothing declared")
        ids, cfg = self._declared, self.config
        width = len(ids) if width is None else index(width)
        if width is None or not len(ids) <= width <= cfg.max_width:
            raise StepError(f"width {width!r} for {len(ids)} tokens, at most {cfg.max_width}")
        required = min(cfg.capacity, self.read_len + len(ids))  # the furthest cell placed
        if required > self.rows and self.rows == 0:
            self.rows = max(cfg.initial_cells, required)
        elif required > self.rows:
            self.rows = min(cfg.capacity, max(required, 2 * self.rows))
        cells, positions, cell = [], [], 0
        for seq in ids:  # the lowest free cells, in declaration order
            while cell in self.cell_pos:
                cell += 1
            cells.append(cell)
            positions.append(len(self.seqs[seq]))
            self.seqs[seq].append(cell)
            self.cell_pos[cell], self.cell_owners[cell] = positions[-1], {seq}
            for layer in self.history[seq]:
                layer.append(None)  # written by `write`
            cell += 1
        self._expire()
        self._declared = None
        self._step = NaiveStep(self, cells, positions, ids, width, self.read_len)
        return self._step

    def write(self, layer: int, k, v) -> None:
        step = self._current(layer)
        k, v = (as_storage(np.asarray(x, np.float32), self.config.dtype) for x in (k, v))
        for t, (seq, p) in enumerate(
            zip(step.seq_ids.tolist(), step.positions.tolist(), strict=True)
        ):
            if seq >= 0:
                self.history[seq][layer][p] = k[t], v[t]
        self._written.add(layer)

    def attend(self, layer: int, q, scale=None, mode: str = "gathered") -> np.ndarray:
        step = self._current(layer)
        if mode not in ("gathered", "masked") or layer not in self._written:
            raise StepError(f"attend({layer}, mode={mode!r}) before write or in no mode")
        q = np.asarray(q, np.float32)
        out = np.zeros(q.shape, np.float32)
        seq_ids, positions = step.seq_ids.tolist(), step.positions.tolist()
        for seq in set(seq_ids) - {-1}:
            rows = [t for t, s in enumerate(seq_ids) if s == seq]
            k, v = (np.stack([kv[i] for kv in self.history[seq][layer]]) for i in (0, 1))
            out[rows] = solo_attention(
                q[rows],
                pool_values(k, self.config.dtype),
                pool_values(v, self.config.dtype),
                np.array([positions[t] for t in rows]),
                self.config.windows[layer],
                scale,
            )
        return out

    # -- helpers ---------------------------------------------------------------

    def _live(self, seq) -> int:
        value = index(seq)
        if value not in self.seqs:
            raise SequenceError(f"{seq!r} is not a live id; live: {self.live_seqs}")
        return value

    def _position(self, name: str, value, seq: int) -> int:
        position = index(value)
        if position is None or not 0 <= position <= len(self.seqs[seq]):
            raise SequenceError(f"{name}={value!r} outside [0, {len(self.seqs[seq])}]")
        return position

    def _free_id(self) -> int:
        free = [s for s in range(self.config.max_seqs) if s not in self.seqs]
        if not free:
            raise CapacityError(f"all {self.config.max_seqs} ids are live")
        return free[0]

    def _open(self, seq: int, cells: list[int], history: list) -> int:
        self.seqs[seq], self.history[seq] = list(cells), history
        return seq

    def _leave(self, seq: int, cells: list[int]) -> None:
        for cell in cells:
            self.cell_owners[cell].discard(seq)
            if not self.cell_owners[cell]:
                del self.cell_owners[cell], self.cell_pos[cell]

    def _current(self, layer) -> NaiveStep:
        if self._step is None or index(layer) not in range(self.config.n_layers):
            raise StepError(f"no step, or no layer {layer!r}")
        return self._step

    def _changed(self) -> None:
        """A verb that changes the table: the declaration is dropped, the step goes stale."""
        self._declared = None
        self._expire()

    def _expire(self) -> None:
        if self._step is not None:
            self._step.is_stale = True
        self._step, self._written = None, set()
