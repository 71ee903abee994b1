"""`CacheUnderTest`: what a KV cache must answer to be compared with `numbakv.reference`.

Both numbakv caches satisfy it. A cache of another layout (paged, block, ring) satisfies it
through an adapter; what such an adapter needs to know:

- **Which `Step` fields carry meaning in any layout** (`SEMANTIC_FIELDS`): each token's
  position and sequence, the width and the count of declared tokens. These must equal the
  reference's after every step. The others (`LAYOUT_FIELDS`: each token's cell, read_len,
  the mask's column indexing) say where a layout put things; only a cell-layout cache can
  be compared on them.
- **The order of refusals**: docs/contract.md §6.1 (a too-wide declaration on a full
  cache is a `StepError`; a bad `upto` is a `SequenceError` even when every id is live),
  with the error classes of docs/contract.md §6. A refused call changes nothing the
  protocol shows (live ids, pos, cells used and free; the snapshot of a cell layout).
- **How capacity is counted**: in cells, a cell shared by clones once; a declaration needs
  one free cell per declared token. A paged cache that copies a partial block on a fork
  still refuses where the reference does when it reports the reference's count.
- **What the kit uses when a cache has it**: `check_invariants()` (raises AssertionError
  naming a broken invariant), called after every op; under compare="table", `snapshot()`
  (a `numbakv.core.snapshot.Snapshot`) and `pool_kv(layer)` (K and V, [rows, n_kv_heads,
  head_dim] of the storage dtype: its occupied cells' bytes must be the reference's).
"""

from typing import Any, Protocol, runtime_checkable

SEMANTIC_FIELDS = ("positions", "seq_ids", "width", "n_tokens")
LAYOUT_FIELDS = ("cells", "read_len", "mask")


@runtime_checkable
class StepLike(Protocol):
    """A prepared step: [width] int32 positions and seq_ids (-1 for padding), the width and
    the declared count; `is_stale` after a later verb but `seq_new` (docs/contract.md §3),
    when every other field raises StepError."""

    @property
    def positions(self) -> Any: ...

    @property
    def seq_ids(self) -> Any: ...

    @property
    def width(self) -> int: ...

    @property
    def n_tokens(self) -> int: ...

    @property
    def is_stale(self) -> bool: ...


@runtime_checkable
class CacheUnderTest(Protocol):
    """The verbs, the step protocol and attention of docs/contract.md §2-§5, with the
    contract's errors (§6).

    seq_new() -> int                    the lowest free id, live and empty
    seq_clone(src, upto=None) -> int    a new id sharing src's positions [0, upto)
    seq_rm(seq), rewind(seq, position)  release; drop positions >= position
    clear()                             every id and cell free
    declare_step(seq_ids)               one live id per token, in order
    prepare_step(width=None) -> step    places the tokens; width > declared pads
    write(layer, k, v)                  k, v: [width, n_kv_heads, head_dim]
    attend(layer, q, scale=None, mode="gathered") -> [width, n_heads, head_dim] float32;
                                        n_heads any positive multiple of n_kv_heads
    pos(seq) -> int                     positions seq holds
    live_seqs, used_cells, free_cells   the ids live, the cells held and free
    """

    config: Any

    def seq_new(self) -> int: ...

    def seq_clone(self, src: int, upto: int | None = None) -> int: ...

    def seq_rm(self, seq: int) -> None: ...

    def rewind(self, seq: int, position: int) -> None: ...

    def clear(self) -> None: ...

    def declare_step(self, seq_ids) -> None: ...

    def prepare_step(self, width: int | None = None) -> StepLike: ...

    def write(self, layer: int, k, v) -> None: ...

    def attend(self, layer: int, q, scale: float | None = None, mode: str = "gathered"): ...

    def pos(self, seq: int) -> int: ...

    @property
    def live_seqs(self) -> list[int]: ...

    @property
    def used_cells(self) -> int: ...

    @property
    def free_cells(self) -> int: ...
