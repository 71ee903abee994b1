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
            if value is not None or name == "endpoint":
                check_endpoint(name, value)
        if not isinstance(self.topic, str) or not _encodable(self.topic):
            raise ConfigError(f"topic={self.topic!r}: expected a str (UTF-8, no lone surrogates)")
        for name, least, most in (("block_size", 1, 1 << 20), ("buffer_steps", 1, 1 << 24),
                                  ("hwm", 0, (1 << 31) - 1)):  # fmt: skip
            value = int_at_least(name, getattr(self, name), least)
            if value > most:
                raise ConfigError(f"{name}={value} is above {most}")
            object.__setattr__(self, name, value)
        rank = self.data_parallel_rank
        if rank is not None:
            rank = int_at_least("data_parallel_rank", rank, 0)
            if rank >= 1 << 63:
                raise ConfigError(f"data_parallel_rank={rank} is not below 2**63")
            object.__setattr__(self, "data_parallel_rank", rank)


def check_endpoint(name: str, value) -> None:
    """ConfigError unless `value` is a tcp://HOST:PORT (PORT in [0, 65535], or *), ipc://
    or inproc:// address."""
    if not isinstance(value, str) or not _encodable(value):
        raise ConfigError(f"{name}={value!r}: expected a str such as tcp://*:5557")
    scheme, _, rest = value.partition("://")
    if scheme in ("ipc", "inproc") and rest:
        return
    host, _, port = rest.rpartition(":")
    if scheme == "tcp" and host and (port == "*" or (port.isdigit() and int(port) < 65536)):
        return
    raise ConfigError(
        f"{name}={value!r}: expected tcp://HOST:PORT (PORT 0 to 65535, or *), ipc://PATH or "
        "inproc://NAME"
    )


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def block_hashes(tokens: np.ndarray, block_size: int, salt: str | None = None) -> list[int]:
    """The chained hash (an unsigned 64-bit int) of each whole block of `tokens` ([n] ints):
    the first 8 bytes, big-endian, of SHA-256 over the parent's hash (8 bytes big-endian;
    the salt's for the first block) and the block's ids as int64 little-endian."""
    int_at_least("block_size", block_size, 1)
    parent = salt_hash(salt)
    hashes = []
    ids = np.asarray(tokens, dtype="<i8")
    for start in range(0, len(ids) - block_size + 1, block_size):
        data = parent.to_bytes(8, "big") + ids[start : start + block_size].tobytes()
        parent = int.from_bytes(hashlib.sha256(data).digest()[:8], "big")
        hashes.append(parent)
    return hashes


def salt_hash(salt: str | None) -> int:
    """The hash a path's first block chains to: one per cache salt (None apart from "";
    any str hashes, lone surrogates included)."""
    if salt is not None and not isinstance(salt, str):
        raise ConfigError(f"salt={salt!r}: expected None or a str")
    data = b"\0" if salt is None else b"\1" + salt.encode("utf-8", "surrogatepass")
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
        self.config, self.n_batches, self._closed = config, 0, False
        self.ledger = BlockLedger(config.block_size)
        self._encode = msgspec.msgpack.Encoder().encode
        self._topic = config.topic.encode()
        self._pub = self._replay = None
        self._prefix_cache = prefix_cache
        prefix_cache.listen(self.ledger)  # refused when taken; the blocks held now come first
        try:
            context = zmq.Context.instance()
            self._pub = context.socket(zmq.PUB)
            self._pub.set_hwm(config.hwm)
            endpoint = config.endpoint
            binds = "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc", "inproc"))
            (self._pub.bind if binds else self._pub.connect)(endpoint)
            if config.replay_endpoint is not None:
                self._replay = context.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as error:
            prefix_cache.listen(None)
            self._close_sockets()
            raise ConfigError(f"kv_events: {error} ({config})") from None
        self._queue: queue.Queue = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._thread = threading.Thread(target=self._serve, name="numbakv-kv-events", daemon=True)
        self._thread.start()

    def publish(self) -> int | None:
        """Sends the events since the last batch as one batch; returns its sequence number,
        or None when there were none (or it is closed)."""
        events = self.ledger.take()
        if not events or self._closed:
            return None
        batch = [time.time(), events]
        if self.config.data_parallel_rank is not None:
            batch.append(self.config.data_parallel_rank)
        payload = self._encode(batch)
        seq, self.n_batches = self.n_batches, self.n_batches + 1
        self._queue.put((seq, payload))
        return seq

    def close(self) -> None:
        """Publishes what changed since the last batch, sends every batch, stops listening
        and closes the sockets; a second close does nothing."""
        if self._closed:
            return
        self._prefix_cache.listen(None)
        self.publish()
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        self._close_sockets()

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=1000)

    def _serve(self) -> None:
        """The sockets' thread: sends queued batches in order and answers replays."""
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
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append(item)

    def _answer(self, frames: list[bytes]) -> None:
        """Replays the kept batches from the sequence number a client asked for ([identity,
        b"", 8 bytes]); anything else is answered with the end marker alone."""
        client = frames[0]
        if len(frames) == 3 and not frames[1] and len(frames[2]) == 8:
            start = int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", _END, b""))
