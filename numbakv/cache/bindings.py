"""`Bindings` (docs/contract.md §4): what a recorded launch or a captured step depends on,
and the check that says what moved since."""

from dataclasses import dataclass

from numbakv.core.errors import BindingError


@dataclass(frozen=True)
class Bindings:
    """The storage a cache's launches read and write, as of one moment.

    generation : the pool's generation (changes exactly when K/V storage moves)
    rows       : cells the pool had allocated
    pool       : device addresses of every layer's K and V, (k0, v0, k1, v1, ...); 0 before
                 the first allocation
    fixed      : (name, device address) of every fixed buffer; they never move
    workspaces : (n_heads, device address) of each decode workspace made so far; once made,
                 they never move (a later one adds to them, invalidating nothing)
    """

    generation: int
    rows: int
    pool: tuple[int, ...]
    fixed: tuple[tuple[str, int], ...]
    workspaces: tuple[tuple[int, int], ...] = ()


def check_bindings(recorded, now: Bindings) -> None:
    """Raises BindingError naming what moved between `recorded` and `now`."""
    if not isinstance(recorded, Bindings):
        raise BindingError(
            f"expected the Bindings of cache.bindings(), got {type(recorded).__name__}"
        )
    if recorded.fixed != now.fixed:
        pairs = zip(recorded.fixed, now.fixed, strict=False)
        moved = [name for (name, a), (_, b) in pairs if a != b]
        raise BindingError(
            f"the fixed buffers {moved or 'layout'} differ: these bindings are of another cache"
        )
    if recorded.generation != now.generation:
        raise BindingError(
            f"pool grew from {recorded.rows} to {now.rows} rows at generation {now.generation} "
            f"(recorded at generation {recorded.generation}); re-record the step"
        )
    if recorded.pool != now.pool:
        raise BindingError("the pool's K/V arrays moved without a new generation")
    missing = set(recorded.workspaces) - set(now.workspaces)
    if missing:
        raise BindingError(f"the decode workspaces {sorted(missing)} are not this cache's")
