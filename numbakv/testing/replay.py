"""`replay`: run a recorded op log (`OpLog`) on a cache under test beside the reference; a
divergence is shrunk by delta debugging (`shrink_ops`) to a short op script that replays.

    from numbakv.testing import replay
    replay("oplog.json", numbakv.CellCache)      # None, or Divergence with the short script

What replays: a list of `Op`s; an op log, the JSON that `OpLog.save` writes ({"format":
"numbakv-oplog", "version": 1, "config": {...}, "ops": [[verb, [args]], ...]} with the ops
of `numbakv.testing.ops`: table verbs, whole steps, and declare / prepare / write / attend /
read where a call came between a declaration and its prepare), read and bounded by
`load_ops` (the format in full: `numbakv.testing.oplog`); or a `Trace` recorded with every
verb (`trace_ops`). Any exception of the cache under test is a divergence like any other.
"""

import os
from collections.abc import Callable, Sequence

from numbakv.core.config import CacheConfig
from numbakv.testing.from_trace import trace_ops
from numbakv.testing.op import Op
from numbakv.testing.oplog_file import load_ops
from numbakv.testing.ops import Divergence, run_script
from numbakv.testing.shrink import shrink_ops


def replay(
    ops_or_path: Sequence[Op] | str | os.PathLike,
    factory: Callable[[CacheConfig], object],
    *,
    config: CacheConfig | None = None,
    compare: str = "semantic",
    shrink: bool = True,
) -> None:
    """Runs the ops on `factory(config)` and on the reference, compared after every op
    (`run_script`); returns None when they agree.

    ops_or_path : a list of `Op`s, the path of an op log (`OpLog.save`), or a `Trace`
                  recorded with `Recorder(cache, every_verb=True)` (`trace_ops`)
    config      : the CacheConfig; default the log's (required for a list of ops)
    compare     : "semantic" or "table" (see `run_script`)
    shrink      : on a divergence, first reduce the ops to a 1-minimal list that still
                  diverges (`shrink_ops`)

    Raises `Divergence` (its message the script of the ops up to the one that differed,
    after shrinking, with the recorded and shrunk lengths; any exception of the cache under
    test, and of `factory`, is one); ValueError for a damaged or hostile log (`load_ops`)
    or a list of ops without a config.
    """
    if isinstance(ops_or_path, str | os.PathLike):
        logged, ops = load_ops(ops_or_path)
        config = logged if config is None else config
    elif hasattr(ops_or_path, "snapshots"):  # a Trace (numbakv.trace) of every verb
        ops = trace_ops(ops_or_path)
        config = ops_or_path.config if config is None else config
    elif config is None:
        raise ValueError("replay(ops, factory) needs config=CacheConfig(...) for a list of ops")
    else:
        ops = list(ops_or_path)
    try:
        run_script(factory, config, ops, compare)
    except Divergence as error:
        if not shrink or not error.ops:  # no ops: factory(config) itself failed
            raise
        first = error
    else:
        return
    runs: dict[tuple[Op, ...], bool] = {tuple(first.ops): True}

    def fails(candidate: Sequence[Op]) -> bool:
        key = tuple(candidate)
        if key not in runs:
            try:
                run_script(factory, config, candidate, compare)
                runs[key] = False
            except Divergence:
                runs[key] = True
        return runs[key]

    minimal = shrink_ops(first.ops, fails)  # the ops past the divergence never matter
    try:
        run_script(factory, config, minimal, compare)
    except Divergence as error:
        raise Divergence(
            f"{len(ops)} ops replayed, shrunk to {len(minimal)} that still diverge:\n{error}",
            error.ops, error.index, config,
        ) from None  # fmt: skip
    raise Divergence(
        f"{len(ops)} ops replayed; the shrunk script did not diverge again (a flaky cache?), "
        f"so here is the first divergence unshrunk:\n{first}",
        first.ops, first.index, config,
    ) from None  # fmt: skip
