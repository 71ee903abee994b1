"""KV events: what a prefix cache holds, published as vLLM publishes it, so that the routers
that read vLLM's stream (llm-d's, NVIDIA Dynamo's) route by numbakv's prefixes too
(docs/contract.md §15.1).

The unit is a whole block of `block_size` tokens of a cached path: its hash chains its
parent's (the block before it on the path; the first block's parent is the cache salt),
and a `BlockRemoved` carries the hash its `BlockStored` did. A block is stored when the
tree first holds it and removed when no copy of it is left (two requests that computed
the same tokens apart hold two copies); a partial block is never published. An `Engine`
with `kv_events=` publishes, after each step, one batch of what changed since the last.

The wire format is vLLM's `KVEventBatch`, msgpack-encoded as tagged arrays:

    [ts, [event, ...], data_parallel_rank]      (the rank left out when None)
    ["BlockStored", [hash], parent_hash or None, [token ids], block_size, None, medium]
    ["BlockRemoved", [hash], medium]

published on a ZMQ PUB socket as three frames (topic, the batch's sequence number as 8
bytes big-endian, payload), the last `buffer_steps` batches replayed on a ROUTER socket to
a client that sends the first sequence number it wants (8 bytes big-endian): a frame pair
(seq, payload) each, then (-1, b""). pyzmq and msgspec come with the `distributed` extra.
"""

import hashlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from numbakv.core.errors import ConfigError
from numbakv.core.values import int_at_least

MEDIUM = "GPU"  # where the blocks are, as vLLM names a device's pool
_END = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class KVEventsConfig:
    """Where and how `KVEvents` publishes.

    endpoint        : the PUB socket: bound when it has "*" or "::" or is ipc:// or
                      inproc://, connected otherwise (vLLM's rule: `tcp://*:5557` binds)
    replay_endpoint : None, or the ROUTER socket (always bound) that replays past batches
    topic           : the first frame of every message
    block_size      : tokens a block (16, vLLM's default)
    buffer_steps    : batches kept for replay
    hwm             : the PUB socket's high-water mark, messages
    data_parallel_rank : None, or the rank each batch names
    """

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    block_size: int = 16
    buffer_steps: int = 10_000
    hwm: int = 100_000
    data_parallel_rank: int | None = None

    def __post_init__(self):
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if (value is not None or name == "endpoint") and not (
                isinstance(value, str) and value.startswith(("tcp://", "ipc://", "inproc://"))
            ):
                raise ConfigError(f"{name}={value!r}: expected tcp://, ipc:// or inproc:// ...")
        if not isinstance(self.topic, str):
            raise ConfigError(f"topic={self.topic!r}: expected a str")
        int_at_least("block_size", self.block_size, 1)
        int_at_least("buffer_steps", self.buffer_steps, 1)
        int_at_least("hwm", self.hwm, 0)
        if self.data_parallel_rank is not None:
            int_at_least("data_parallel_rank", self.data_parallel_rank, 0)


def block_hashes(tokens: np.ndarray, block_size: int, salt: str | None = None) -> list[int]:
    """The chained hash (an unsigned 64-bit int) of each whole block of `tokens` ([n] ints):
    the first 8 bytes, big-endian, of SHA-256 over the parent's hash (8 bytes big-endian;
    the salt's for the first block) and the block's ids as int64 little-endian."""
    parent = salt_hash(salt)
    hashes = []
    ids = np.asarray(tokens, dtype="<i8")
    for start in range(0, len(ids) - block_size + 1, block_size):
        data = parent.to_bytes(8, "big") + ids[start : start + block_size].tobytes()
        parent = int.from_bytes(hashlib.sha256(data).digest()[:8], "big")
        hashes.append(parent)
    return hashes


def salt_hash(salt: str | None) -> int:
    """The hash a path's first block chains to: one per cache salt (None apart from "")."""
    data = b"\0" if salt is None else b"\1" + salt.encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


class BlockLedger:
    """The whole blocks a prefix cache holds, counted by copy, and the events not yet
    published: a `PrefixCache` listener (`PrefixCache.listen`)."""

    def __init__(self, block_size: int):
        self.block_size = int_at_least("block_size", block_size, 1)
        self.copies: dict[int, int] = {}  # block hash -> copies the tree holds
        self.events: list[list] = []  # tagged arrays, in order

    def __call__(self, salt, path: np.ndarray, start: int, end: int, delta: int) -> None:
        """Positions [start, end) of `path` came (+1) or went (-1): the blocks ending there,
        stored parent first, removed child first."""
        size = self.block_size
        first, last = start // size, end // size  # the blocks whose last token is in the run
        if first == last:
            return
        hashes = block_hashes(path[: last * size], size, salt)
        for k in range(first, last) if delta > 0 else range(last - 1, first - 1, -1):
            h, n = hashes[k], self.copies.get(hashes[k], 0)
            if delta > 0 and n == 0:
                parent = hashes[k - 1] if k else None
                ids = path[k * size : (k + 1) * size].tolist()
                self.events.append(["BlockStored", [h], parent, ids, size, None, MEDIUM])
            elif delta < 0 and n == 1:
                self.events.append(["BlockRemoved", [h], MEDIUM])
            if n + delta:
                self.copies[h] = n + delta
            else:
                del self.copies[h]

    def take(self) -> list[list]:
        """The events since the last `take`, in order."""
        events, self.events = self.events, []
        return events


def publisher(prefix_cache, config: KVEventsConfig | None) -> "KVEvents | None":
    """None without `config`, else a `KVEvents` of `prefix_cache` (ConfigError when None)."""
    if config is None:
        return None
    if prefix_cache is None:
        raise ConfigError("kv_events publishes a prefix cache's blocks; give a prefix_cache")
    return KVEvents(prefix_cache, config)


class KVEvents:
    """Publishes a `PrefixCache`'s whole blocks (`KVEventsConfig`): `publish()` sends one
    batch of the events since the last (an `Engine` calls it after each step); `close()`
    stops it. Sockets are served by one thread of its own (replays, while the caller is
    busy). Refused with ConfigError when pyzmq or msgspec is missing or a socket cannot
    be bound or connected."""

    def __init__(self, prefix_cache, config: KVEventsConfig):
        if not isinstance(config, KVEventsConfig):
            raise ConfigError(f"kv_events must be a KVEventsConfig, got {config!r}")
        try:
            import msgspec
            import zmq
        except ImportError as error:
            raise ConfigError(f"KV events need pyzmq and msgspec: {error}; "
                              "pip install 'numbakv[distributed]'") from None  # fmt: skip
        self.config = config
        self._encode = msgspec.msgpack.Encoder().encode
        context = zmq.Context.instance()
        self._pub, self._replay = context.socket(zmq.PUB), None
        self._pub.set_hwm(config.hwm)
        try:
            endpoint = config.endpoint
            binds = "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc", "inproc"))
            (self._pub.bind if binds else self._pub.connect)(endpoint)
            if config.replay_endpoint is not None:
                self._replay = context.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as error:
            self._close_sockets()
            raise ConfigError(f"kv_events: {error} ({config})") from None
        self.ledger = BlockLedger(config.block_size)
        self.n_batches = 0
        self._queue: queue.Queue = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._prefix_cache = prefix_cache
        prefix_cache.listen(self.ledger)  # the blocks held now are the first batch's
        self._thread = threading.Thread(target=self._serve, name="numbakv-kv-events", daemon=True)
        self._thread.start()

    def publish(self) -> int | None:
        """Sends the events since the last batch as one batch; returns its sequence number,
        or None when there were none."""
        events = self.ledger.take()
        if not events:
            return None
        batch = [time.time(), events]
        if self.config.data_parallel_rank is not None:
            batch.append(self.config.data_parallel_rank)
        seq, self.n_batches = self.n_batches, self.n_batches + 1
        self._queue.put((seq, self._encode(batch)))
        return seq

    def close(self) -> None:
        """Sends what was published, stops listening and closes the sockets."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
            self._prefix_cache.listen(None)
            self._close_sockets()

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=1000)

    def _serve(self) -> None:
        """The sockets' thread: sends queued batches in order and answers replays."""
        topic = self.config.topic.encode()
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._answer(self._replay.recv_multipart())
            try:
                item = self._queue.get(timeout=0.02)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, payload = item
            self._pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append(item)

    def _answer(self, frames: list[bytes]) -> None:
        """Replays the kept batches from the sequence number a client asked for."""
        if len(frames) != 3 or len(frames[2]) != 8:
            return  # not a replay request: [identity, b"", first seq]
        client, _, first = frames
        start = int.from_bytes(first, "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", _END, b""))
