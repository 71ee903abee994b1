"""`Plans`: the device cache's attention plans and decode workspaces, each made once.

A plan depends on the config and the step's width only (`attention.plan_attention`), so a
cache keeps one per (mode, width, n_heads, window, storage kinds, q and out kinds) and every
layer of every later step of that shape just launches it; the decode kernels' split scratch
is one per n_heads.
"""

from numbakv.cache.kernels import attention
from numbakv.cache.pool import ALLOCATION_ERRORS
from numbakv.core.config import CacheConfig
from numbakv.core.errors import AllocationError, StepError


class Plans:
    """Attention plans by (mode, width, n_heads, window, kinds, io), and workspaces by n_heads."""

    def __init__(self, config: CacheConfig, kinds: list[tuple[str, str]]):
        self.config = config
        self.kinds = kinds  # per layer the pools' (K kind, V kind): which kernels run
        self._plans: dict[tuple, attention.AttentionPlan] = {}
        self._workspaces: dict[int, tuple] = {}

    def plan(self, mode: str, width: int, n_heads: int, layer: int,
             io: tuple[str, str] = ("float", "float"),
             is_wide: bool = True) -> attention.AttentionPlan:  # fmt: skip
        """The plan of `layer` in steps of this shape, for q and out of `io` (kinds of
        `storage.IO_KINDS`) over pools that take the decode kernel's wide loads or not
        (`attention.pools_are_wide`); a token reads at most capacity cells (masked) or its
        window's or max_seq_len's (gathered)."""
        window, kinds = self.config.windows[layer], self.kinds[layer]
        key = (mode, width, n_heads, window if mode == "gathered" else 0, kinds, io, is_wide)
        if key not in self._plans:
            cfg = self.config
            if mode == "masked":
                max_len = cfg.capacity
            else:
                max_len = attention.gathered_max_len(window, cfg.max_seq_len)
            self._plans[key] = attention.plan_attention(
                mode,
                kinds,
                width,
                n_heads,
                cfg.n_kv_heads,
                cfg.head_dim,
                max_len,
                io=io,
                is_wide=is_wide,
            )
        return self._plans[key]

    def workspaces(self) -> list[tuple[int, tuple]]:
        """(n_heads, workspace) of every workspace made so far; they never move."""
        return sorted(self._workspaces.items())

    def workspace(self, n_heads: int, stream, capturing: bool = False) -> tuple:
        """The decode kernels' split scratch for `n_heads` query heads, for the widest step
        that runs them (`attention.decode_width_limit`); made on first use, never while a
        step is captured."""
        if n_heads not in self._workspaces and capturing:
            raise StepError(
                f"decode attention with n_heads={n_heads} would allocate its workspace inside "
                f"a capture; call cache.reserve({n_heads}) before capture()"
            )
        if n_heads not in self._workspaces:
            cfg = self.config
            widest = attention.decode_width_limit(cfg.max_width, n_heads, cfg.n_kv_heads)
            try:
                self._workspaces[n_heads] = attention.split_workspace(
                    widest, n_heads, cfg.head_dim, stream=stream
                )
            except (*ALLOCATION_ERRORS, ValueError, OverflowError) as error:  # NumPy's size
                n_bytes = widest * n_heads * attention.MAX_SPLITS * (cfg.head_dim + 2) * 4
                raise AllocationError(
                    f"could not allocate the decode workspace of n_heads={n_heads} ({n_bytes:,} "
                    "bytes) on the device; lower n_heads or max_width"
                ) from error
        return self._workspaces[n_heads]
