"""Prefill on one engine, decode on another (docs/contract.md §15.3): the prompt's K/V, as
a saved conversation (`Engine.save`, a checksummed `SeqState` file), goes from the
prefill engine's rank to the decode engine's over torch.distributed point-to-point, and
the decode engine's next request hits all of it (nothing recomputed).

    # rank 0, the prefill engine
    [done] = prefill.generate([prompt], max_new_tokens=1)
    send_prompt(prefill, done.request_id, dst=1, group=group)
    # rank 1, the decode engine
    tokens, first = receive_prompt(decode, src=0, group=group)
    decode.submit([*tokens, first], max_new_tokens=n - 1)   # the prompt is cached

The receiver checks the geometry (layers, KV heads, head_dim, windows, formats) before any
K/V moves and loads only a whole, checksummed state; a refusal on either side is told to
the other, and both raise its error with nothing changed (`ConfigError` for another
geometry or no engine, what `Engine.load` raises otherwise: `CapacityError` for no room,
`StateError` for a damaged state); a peer that died or stalls is a `DistributedError`. A
decode engine over `TensorParallel` takes a state of every KV head.
"""

import tempfile
from pathlib import Path

from numbakv.core import errors
from numbakv.core.errors import CacheError, ConfigError
from numbakv.core.seq_state import Geometry, SeqState
from numbakv.distributed.group import Group

OK = "ok"


def send_prompt(engine, request: int, dst: int, group: Group) -> SeqState:
    """Sends request `request`'s conversation (finished: its prompt and every sampled token
    but the last, `Engine.save`) and its last sampled token to rank `dst`, which
    `receive_prompt`s it; returns the state sent. Raises what `Engine.save` raises, before
    anything is sent, and ConfigError when `dst` refused it."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompt.npz"
        state = engine.save(request, path)
        data = path.read_bytes()
    last = engine.result(request).tokens[0][-1]
    group.send({"geometry": state.geometry.as_dict(), "n_tokens": state.n_tokens,
                "nbytes": len(data), "next": int(last)}, dst)  # fmt: skip
    _agreed(group.receive(dst), dst, "before the K/V moved")
    group.send(data, dst)
    _agreed(group.receive(dst), dst, "after the K/V moved; nothing was loaded")
    return state


def receive_prompt(engine, src: int, group: Group) -> tuple[list[int], int]:
    """Receives what rank `src` `send_prompt`s into `engine`'s prefix cache (`Engine.load`):
    returns (the conversation's token ids, the token sampled after them), so that a
    request of both continues it. Refused (ConfigError, or what `Engine.load` raises), and
    the sender told, when the geometry is not this engine's cache's or there is no room."""
    header = group.receive(src)
    problem = _refusal(engine, header["geometry"])
    if problem is not None:
        group.send(f"ConfigError: {problem}", src)
        raise ConfigError(f"receive_prompt from rank {src}: {problem}")
    group.send(OK, src)
    data = group.receive(src)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompt.npz"
        path.write_bytes(data)
        try:
            state = SeqState.load(path)
            engine.load(state)
        except CacheError as error:
            group.send(f"{type(error).__name__}: {error}", src)
            raise
    group.send(OK, src)
    return state.tokens.tolist(), header["next"]


def _refusal(engine, geometry: dict) -> str | None:
    """Why `engine` cannot take a prompt of `geometry` (no engine with a prefix cache, or
    its cache of another geometry; a field it does not know, None, is not compared),
    before any K/V moves; None when it can."""
    if getattr(engine, "prefix_cache", None) is None or not callable(getattr(engine, "load", None)):
        return f"{type(engine).__name__} is not an Engine with a prefix cache to load it into"
    whole = getattr(engine.executor, "whole_geometry", None)  # TensorParallel: every head
    cache = getattr(engine.executor, "cache", None)
    if whole is not None:
        mine = whole()
    elif cache is not None:
        mine = Geometry.of(cache.config).as_dict()
    else:
        return None
    if any(v is not None and geometry.get(k) != v for k, v in mine.items()):
        return f"the prompt's geometry {geometry} is not this engine's {mine}"
    return None


def _agreed(verdict: str, peer: int, when: str) -> None:
    """Raises the peer's refusal as its own numbakv error (ConfigError when unknown)."""
    if verdict != OK:
        kind, _, _ = verdict.partition(":")
        error = getattr(errors, kind, None)
        cls = error if isinstance(error, type) and issubclass(error, CacheError) else ConfigError
        raise cls(f"rank {peer} refused the prompt {when}: {verdict}")
