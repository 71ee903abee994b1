"""Tensor-parallel serving: every rank holds its KV heads of the pool and its shard of the
model; rank 0 schedules and every other rank applies rank 0's calls (docs/contract.md
§15.2).

numbakv's verbs are deterministic, so ranks that apply the same calls in the same order
hold the same cell table: rank 0's `TensorParallel` broadcasts each call that changes
sessions (open, clone, rewind, close, execute, load) or reads their K/V (save) on the CPU
group before running it, and `serve` on every other rank runs the same call on its own
executor; a saved state is every rank's KV heads joined, a loaded one each rank's heads of
it. A forward meets the
other ranks' at two all-reduces a layer (the attention output and the MLP, row-parallel);
every rank samples the same token from the same summed logits. Every `digest_every`
batches the ranks compare a digest of their tables; a difference raises `DistributedError`
on every rank, naming the batch and the first differing cell.

    group = init()
    model = shard_model(Model.from_seed(config, 0), group)   # this rank's heads
    cache = CellCache(model.config.cache_config(capacity=group.agreed_min(c), ...))
    executor = Executor(model, cache, ...)
    if group.rank == 0:
        engine = Engine(TensorParallel(executor, group))   # ... then close()
    else:
        serve(executor, group)
"""

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from numbakv.core.errors import ConfigError, DistributedError, StateError
from numbakv.core.seq_state import Geometry, SeqState, load_plan
from numbakv.core.values import int_at_least
from numbakv.distributed.group import Group, first_difference, table_digest
from numbakv.serve.batch import Input, Output
from numbakv.serve.model import Model, ModelConfig
from numbakv.serve.sampling import GREEDY, Sampling

# broadcast by rank 0
CALLS = ("open_session", "clone", "rewind", "close_session", "execute", "save_session",
         "load_session")  # fmt: skip
STOP = "stop"
NOT_SERVED = {"sample": "it would draw from a session's generator on rank 0 alone"}


def shard_heads(n_heads: int, n_kv_heads: int, rank: int, world: int) -> tuple[range, range]:
    """(query heads, KV heads) of `rank`: n_heads / world query heads in order, and the KV
    heads they read; with world > n_kv_heads a KV head is replicated on world / n_kv_heads
    ranks (vLLM's rule). ConfigError unless n_heads % world == 0 and n_kv_heads and world
    divide one another, and 0 <= rank < world."""
    n_heads = int_at_least("n_heads", n_heads, 1)
    n_kv_heads = int_at_least("n_kv_heads", n_kv_heads, 1)
    world = int_at_least("world", world, 1)
    rank = int_at_least("rank", rank, 0)
    if rank >= world:
        raise ConfigError(f"rank={rank} is not below world={world}")
    if n_heads % world or (n_kv_heads % world and world % n_kv_heads):
        raise ConfigError(
            f"{world} ranks cannot split n_heads={n_heads}, n_kv_heads={n_kv_heads}: give a "
            "world that divides n_heads and divides, or is a multiple of, n_kv_heads"
        )
    per, group = n_heads // world, n_heads // n_kv_heads
    queries = range(rank * per, (rank + 1) * per)
    return queries, range(queries.start // group, (queries.stop - 1) // group + 1)


def shard_model(model: Model, group: Group) -> Model:
    """This rank's shard of `model`: its query heads' and KV heads' columns of wq, wk, wv
    and rows of wo (`shard_heads`), d_ff / world of the MLP (columns of w_gate and w_up,
    rows of w_down), the rest whole; its `reduce` sums a layer's partial outputs over the
    group. Its config is a `ModelConfig` of the shard (n_heads, n_kv_heads, d_ff)."""
    cfg, rank, world = model.config, group.rank, group.world
    queries, kvs = shard_heads(cfg.n_heads, cfg.n_kv_heads, rank, world)
    if cfg.d_ff % world:
        raise ConfigError(f"{world} ranks cannot split d_ff={cfg.d_ff}")
    hd, ff = cfg.head_dim, cfg.d_ff // world
    q, kv = slice(queries.start * hd, queries.stop * hd), slice(kvs.start * hd, kvs.stop * hd)
    mlp = slice(rank * ff, (rank + 1) * ff)
    cuts = {"wq": (slice(None), q), "wk": (slice(None), kv), "wv": (slice(None), kv),
            "wo": (q,), "w_gate": (slice(None), mlp), "w_up": (slice(None), mlp),
            "w_down": (mlp,)}  # fmt: skip
    weights = {}
    for name, w in model.weights.items():
        cut = cuts.get(name.rsplit(".", 1)[-1])
        weights[name] = w if cut is None else w[cut]
    fields = {f: getattr(cfg, f) for f in ModelConfig.__dataclass_fields__}
    config = ModelConfig(**fields | dict(n_heads=len(queries), n_kv_heads=len(kvs), d_ff=ff))
    shard = Model(config, weights)
    shard.reduce = group.all_reduce_sum
    shard.kv_heads, shard.whole_kv_heads = kvs, cfg.n_kv_heads  # this rank's, and all
    return shard


class Digests:
    """Compares the ranks' cell tables every `every` batches (a collective: every rank
    calls `after_batch` once per batch)."""

    def __init__(self, group: Group, every: int):
        self.group, self.every = group, int_at_least("digest_every", every, 1)
        self.n_batches = 0

    def after_batch(self, cache, force: bool = False) -> None:
        """After a batch (every `every`-th compared) or, `force`, after another call."""
        self.n_batches += not force
        if self.n_batches % self.every and not force:
            return
        digests = self.group.gathered(table_digest(cache))
        if len(set(digests)) > 1:
            snapshots = self.group.gathered(cache.snapshot())
            bad = next(r for r, d in enumerate(digests) if d != digests[0])
            where = first_difference(snapshots[bad], snapshots[0], f"rank {bad}", "rank 0")
            raise DistributedError(
                f"after batch {self.n_batches - 1}, rank {bad}'s cell table is not rank 0's "
                f"(raised on rank {self.group.rank}): {where}"
            )


class TensorParallel:
    """Rank 0's tensor-parallel executor: a `SessionExecutor` that runs each call on
    `executor` (this rank's: an `Executor` or `Lockstep` over its shard) after
    broadcasting it to the ranks that `serve`. Everything it reads (vocab_size, max_width,
    sessions, lengths, free cells, cache, model) is rank 0's executor's, the same on every
    rank. `close()` ends the other ranks' `serve`."""

    def __init__(self, executor, group: Group, digest_every: int = 1):
        check_parts(executor, group)
        if group.rank != 0:
            raise ConfigError(f"TensorParallel runs on rank 0; rank {group.rank} runs serve()")
        self.executor, self.group = executor, group
        self._digests = Digests(group, digest_every)

    def __getattr__(self, name: str):
        if name in NOT_SERVED:
            raise AttributeError(
                f"{name} is not served under tensor parallelism: {NOT_SERVED[name]}"
            )
        if "executor" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["executor"], name)

    def open_session(self, sampling: Sampling = GREEDY, drawn: int = 0) -> int:
        return self._call("open_session", sampling, drawn)

    def clone(self, session: int, upto=None, sampling=None, drawn: int = 0) -> int:
        return self._call("clone", session, upto, sampling, drawn)

    def rewind(self, session: int, position: int) -> None:
        self._call("rewind", session, position)

    def close_session(self, session: int) -> None:
        self._call("close_session", session)

    def execute(self, inputs: Sequence[Input]) -> list[Output]:
        return self._call("execute", list(inputs))

    def save_session(self, session: int, start: int = 0) -> SeqState:
        """The session's state with every KV head of the model (each rank saves its heads,
        rank 0 joins them): a state any number of ranks, or one process, loads."""
        return self._call("save_session", session, start)

    def load_session(self, state: SeqState, onto=None, sampling=GREEDY, drawn: int = 0) -> int:
        """A new session holding `state` (of every KV head of the model): each rank loads
        its heads of it. Its geometry is checked here first (`check_state`)."""
        self.check_state(state)
        return self._call("load_session", state, onto, sampling, drawn)

    def check_state(self, state: SeqState) -> None:
        """ConfigError (StateError for no state) unless `state` holds every KV head of the
        model and rank 0's heads of it fit rank 0's cache (`Engine.load` asks first)."""
        if not isinstance(state, SeqState):
            raise StateError(f"expected a SeqState, got {type(state).__name__}")
        heads, whole = kv_heads(self.executor, 0)
        if state.geometry.n_kv_heads != whole:
            raise ConfigError(
                f"the state has n_kv_heads={state.geometry.n_kv_heads}; this model has {whole} "
                "(every rank's heads together)"
            )
        load_plan(heads_of(state, heads), self.executor.cache.config, False)

    def whole_geometry(self) -> dict:
        """The geometry of a state of every KV head, as `Geometry.as_dict()` gives it, but
        for the fp8 scales (None: each rank knows its heads')."""
        _, whole = kv_heads(self.executor, 0)
        return Geometry.of(self.executor.cache.config).as_dict() | {
            "n_kv_heads": whole, "fp8_scales": None}  # fmt: skip

    def close(self) -> None:
        """Ends `serve` on every other rank."""
        self.group.broadcast((STOP, ()))

    def _call(self, name: str, *args):
        self.group.broadcast((name, args))
        return _apply(self.executor, name, args, self._digests)


def serve(executor, group: Group, digest_every: int = 1) -> int:
    """Ranks other than 0: runs every call rank 0's `TensorParallel` broadcasts on
    `executor` (a refusal is rank 0's too, and is passed over), until its `close()`;
    returns the calls served. `DistributedError` when rank 0 died or stalled past the
    timeout, or the tables differ at a digest."""
    check_parts(executor, group)
    if group.rank == 0:
        raise ConfigError("rank 0 schedules (TensorParallel); serve() runs on the others")
    digests, n = Digests(group, digest_every), 0
    while True:
        name, args = group.broadcast()
        if name == STOP:
            return n
        if name not in CALLS:
            raise DistributedError(f"rank 0 sent {name!r}, not one of {CALLS}")
        try:
            _apply(executor, name, args, digests)
        except (DistributedError, AssertionError):  # the ranks disagree (a LockstepError too)
            raise
        except Exception:
            pass  # refused on rank 0 too, before anything changed: so it is here
        n += 1


def _apply(executor, name: str, args: tuple, digests: Digests):
    """`executor.name(*args)`; a batch (done or refused) is followed by a digest. A state
    loads as this rank's heads of it; a saved one is every rank's heads joined on rank 0
    (None elsewhere), or the refusal every rank met."""
    heads, _ = kv_heads(executor, digests.group.rank)
    if name == "load_session":
        args = (heads_of(args[0], heads), *args[1:])
    if name != "save_session":
        try:
            return getattr(executor, name)(*args)
        finally:
            if name in ("execute", "load_session"):  # a load any rank refused alone shows
                digests.after_batch(executor.cache, force=name == "load_session")
    try:
        saved: object = (heads, getattr(executor, name)(*args))
    except Exception as error:  # every rank joins the gather, refused or not
        saved = error
    parts = digests.group.gathered(saved)
    refused = [(r, p) for r, p in enumerate(parts) if isinstance(p, Exception)]
    if refused and refused[0][0] == 0:
        raise parts[0]  # rank 0's refusal, met by every rank
    if refused:
        rank, error = refused[0]
        raise DistributedError(f"save_session{args}: rank 0 saved it, rank {rank} refused: {error}")
    return joined(parts) if digests.group.rank == 0 else None


def check_parts(executor, group) -> None:
    """ConfigError unless `executor` runs batches (an `Executor`, a `Lockstep`) and
    `group` is a numbakv `Group`."""
    if not all(callable(getattr(executor, m, None)) for m in ("execute", "open_session")):
        raise ConfigError(f"expected an Executor or a Lockstep, got {executor!r}")
    if not isinstance(group, Group):
        raise ConfigError(f"expected a numbakv.distributed Group (init()), got {group!r}")


def kv_heads(executor, rank: int) -> tuple[range, int]:
    """(which of the model's KV heads `executor`'s pool holds, how many the model has):
    its shard's (`shard_model`, under a `DeviceModel` too), else n_kv_heads of them after
    the lower ranks' for a transformers model split over tp_size ranks (its plan's even
    split), else all of them."""
    model = executor.model
    inner = getattr(model, "model", model)
    if getattr(inner, "kv_heads", None) is not None:
        return inner.kv_heads, inner.whole_kv_heads
    n = model.config.n_kv_heads
    tp = getattr(getattr(model, "hf_model", None), "tp_size", None) or 1
    return (range(rank * n, (rank + 1) * n), n * tp) if tp > 1 else (range(n), n)


def heads_of(state: SeqState, heads: range) -> SeqState:
    """This rank's `heads` of a state of every KV head (geometry, K, V, fp8 scales)."""
    g = state.geometry
    cut = slice(heads.start, heads.stop)
    scales = tuple(tuple(tuple(s[cut]) for s in pair) for pair in g.fp8_scales)
    geometry = replace(g, n_kv_heads=len(heads), fp8_scales=scales)
    k, v = (tuple(x[:, cut] for x in side) for side in (state.k, state.v))
    return replace(state, geometry=geometry, k=k, v=v)


def joined(parts: list[tuple[range, SeqState]]) -> SeqState:
    """One state of every KV head from each rank's (heads, state); a replicated head is
    taken from the first rank that holds it."""
    n = max(heads.stop for heads, _ in parts)
    owner = [next((heads, s) for heads, s in parts if h in heads) for h in range(n)]
    first = parts[0][1]
    g = first.geometry

    def heads(side, layer: int, which: int):
        rows = [getattr(s, side)[layer][:, h - hs.start] for h, (hs, s) in enumerate(owner)]
        return np.stack(rows, axis=1)

    scales = tuple(
        tuple(tuple(s.geometry.fp8_scales[i][w][h - hs.start] for h, (hs, s) in enumerate(owner))
              for w in (0, 1))
        for i in range(g.n_layers)
    )  # fmt: skip
    k = tuple(heads("k", i, 0) for i in range(g.n_layers))
    v = tuple(heads("v", i, 1) for i in range(g.n_layers))
    return replace(first, geometry=replace(g, n_kv_heads=n, fp8_scales=scales), k=k, v=v)
