"""KV events (docs/contract.md §15.1): a subscriber that reads vLLM's stream as a router
does, with the schema declared here from the published format (not numbakv's code),
rebuilds after every step exactly the whole blocks the prefix cache holds; a missed batch
comes back through the replay socket; hashes chain and are salted; refusals."""

import itertools

import numpy as np
import pytest

msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

from numbakv.cli.demo import SYSTEM, WORKLOAD
from numbakv.core.errors import ConfigError
from numbakv.reference import CellCache
from numbakv.serve import radix
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.kv_events import BlockLedger, KVEvents, KVEventsConfig, block_hashes
from numbakv.serve.prefix import PrefixCache

from helpers import tiny_model


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODE = msgspec.msgpack.Decoder(type=KVEventBatch).decode
MODEL = tiny_model(seed=5)
PORTS = itertools.count()


class Router:
    """What a router keeps of one engine: its blocks by hash, from the stream."""

    def __init__(self, endpoint: str, replay: str | None = None, topic: str = ""):
        context = zmq.Context.instance()
        self.sub = context.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay, self.replay_endpoint = None, replay
        if replay is not None:
            self.replay = context.socket(zmq.DEALER)
            self.replay.connect(replay)
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.last = self.seen = -1  # the last batch applied, the last received
        self.n_replayed, self.topics, self.ranks = 0, set(), set()

    def receive(self, upto: int, drop: set[int] = frozenset()) -> bool:
        """Reads batches until batch `upto` is applied: True; False when `upto` is lost
        (`drop`: the seqs to lose, replayed once a later one shows the gap)."""
        while self.seen < upto:
            assert self.sub.poll(5000), f"batch {self.seen + 1} never came"
            topic, seq, payload = self.sub.recv_multipart()
            self.topics.add(topic)
            seq = self.seen = int.from_bytes(seq, "big")
            if seq in drop:
                continue
            if seq > self.last + 1:
                self.ask_replay(self.last + 1, seq)
            self.apply(DECODE(payload))
            self.last = seq
        return self.last == upto

    def ask_replay(self, first: int, end: int) -> None:
        self.replay.send_multipart([b"", first.to_bytes(8, "big")])
        while True:
            assert self.replay.poll(5000), "the replay never ended"
            _, seq, payload = self.replay.recv_multipart()
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == -1:
                return
            if first <= seq < end:
                self.apply(DECODE(payload))
                self.n_replayed += 1

    def apply(self, batch: KVEventBatch) -> None:
        self.ranks.add(batch.data_parallel_rank)
        for event in batch.events:
            if isinstance(event, BlockStored):
                [h] = event.block_hashes
                assert h not in self.blocks, "stored twice"
                assert event.parent_block_hash is None or event.parent_block_hash in self.blocks
                self.blocks[h] = (event.parent_block_hash, tuple(event.token_ids))
            elif isinstance(event, BlockRemoved):
                [h] = event.block_hashes
                assert not any(p == h for p, _ in self.blocks.values()), "a parent went first"
                del self.blocks[h]

    def prefixes(self) -> set[tuple[int, ...]]:
        """Every block as the whole prefix it ends, rebuilt through its parents."""
        out = set()
        for h in self.blocks:
            runs = []
            while h is not None:
                parent, ids = self.blocks[h]
                runs.append(ids)
                h = parent
            out.add(sum(reversed(runs), ()))
        return out


def held_prefixes(prefix: PrefixCache, size: int) -> set[tuple[int, ...]]:
    """The oracle: every prefix of a whole number of blocks of a path the tree holds."""
    return {tokens for _, tokens in held_blocks(prefix, size)}


def held_blocks(prefix: PrefixCache, size: int) -> set[tuple[str | None, tuple[int, ...]]]:
    """(salt, prefix) of every whole block of a path the tree holds, under each salt."""
    out = set()
    for salt, root in prefix._roots.items():
        stack = list(root.child_list())
        while stack:
            node = stack.pop()
            path = radix.path_tokens(node).tolist()
            out |= {(salt, tuple(path[:end])) for end in range(size, node.depth + 1, size)}
            stack.extend(node.child_list())
    return out


def held_hashes(prefix: PrefixCache, size: int) -> set[int]:
    """The hashes of `held_blocks`, each chained over its prefix and salt."""
    return {block_hashes(np.array(p), size, salt)[-1] for salt, p in held_blocks(prefix, size)}


def served(size: int, max_cells: int | None, **config) -> tuple[Engine, Router]:
    n = next(PORTS)
    endpoint, replay = f"inproc://kv-{n}", f"inproc://kv-replay-{n}"
    cache = CellCache(MODEL.config.cache_config(capacity=512, max_width=16, max_seqs=8))
    executor = Executor(MODEL, cache, 6, 80)
    events = KVEventsConfig(endpoint, replay, block_size=size, **config)
    engine = Engine(executor, prefix_cache=PrefixCache(executor, max_cells), kv_events=events)
    return engine, Router(endpoint, replay, config.get("topic", ""))


@pytest.mark.parametrize(("size", "max_cells"), [(4, 40), (16, None), (3, 0)])
def test_the_router_holds_the_prefix_caches_blocks_after_every_step(size, max_cells):
    """The demo's workload, and more prompts that share and outgrow prefixes, with
    evictions (max_cells) and one batch lost on the way (replayed)."""
    engine, router = served(size, max_cells)
    prompts = [a.prompt for a in WORKLOAD] + [
        WORKLOAD[1].prompt + " again and " * k for k in (1, 2)
    ]
    for i, prompt in enumerate(prompts):
        engine.submit(prompt, max_new_tokens=5 + i % 4, n=1 + (i == 4))
    for salt in ("tenant", "t\ud800"):  # the same tokens under two salts: other blocks
        engine.submit(prompts[1], max_new_tokens=3, cache_salt=salt)
    n_steps = n_checked = 0
    while engine.is_busy:
        engine.step()
        n_steps += 1
        if router.receive(engine.kv_events.n_batches - 1, drop={2}):
            assert router.prefixes() == held_prefixes(engine.prefix_cache, size), n_steps
            assert set(router.blocks) == held_hashes(engine.prefix_cache, size), n_steps
            n_checked += 1
    assert router.n_replayed == 1 and engine.kv_events.n_batches > 3
    assert n_checked >= n_steps - 3 > 10  # unchecked: the steps while batch 2 is lost
    engine.drop_prefix_cache()  # published by close(), which sends every batch
    engine.kv_events.close()
    router.receive(engine.kv_events.n_batches - 1)
    assert router.blocks == {} and held_prefixes(engine.prefix_cache, size) == set()
    engine.kv_events.close()  # again: nothing
    assert engine.kv_events.publish() is None


def test_topic_rank_and_a_publisher_attached_to_a_full_cache():
    """Batches carry the topic and rank; a ledger attached late is told every block the
    tree holds, the ones the router rebuilt."""
    engine, router = served(4, None, topic="kv", data_parallel_rank=3)
    engine.generate(["a shared stem, then one", "a shared stem, then two"], max_new_tokens=3)
    router.receive(engine.kv_events.n_batches - 1)
    assert router.topics == {b"kv"} and router.ranks == {3}
    engine.kv_events.close()
    late = BlockLedger(4)
    engine.prefix_cache.listen(late)
    stored = {e[1][0] for e in late.take() if e[0] == "BlockStored"}
    assert stored == set(router.blocks) and len(stored) > 5


def test_hashes_check_their_arguments():
    with pytest.raises(ConfigError, match="block_size"):
        block_hashes(np.arange(4), 0)
    with pytest.raises(ConfigError, match="salt=5"):
        block_hashes(np.arange(4), 2, 5)
    assert block_hashes(np.arange(4), 2, "\ud800") != block_hashes(np.arange(4), 2)


def test_hashes_chain_over_blocks_and_salt():
    tokens = np.arange(40)
    plain, salted = block_hashes(tokens, 16), block_hashes(tokens, 16, "tenant")
    assert len(plain) == 2 and plain[0] != salted[0] and plain[1] != salted[1]
    assert block_hashes(tokens[:32], 16) == plain  # a block depends on what precedes it
    other = tokens.copy()
    other[0] = 99
    assert block_hashes(other, 16)[1] != plain[1]
    assert block_hashes(tokens, 16, "") != plain  # no salt and the empty salt differ
    assert all(0 <= h < 2**64 for h in plain)


def test_copies_are_counted_and_removed_once_the_last_goes():
    ledger = BlockLedger(2)
    path = np.array([1, 2, 3, 4, 5])
    ledger(None, path, 0, 5, +1)
    ledger(None, path, 0, 5, +1)  # a second copy: nothing new
    ledger(None, path, 3, 5, -1)  # one copy of block [2, 4) goes: one is left
    assert [e[0] for e in ledger.take()] == ["BlockStored", "BlockStored"]
    ledger(None, path, 3, 5, -1)
    assert [e[0] for e in ledger.take()] == ["BlockRemoved"]
    ledger(None, path, 0, 1, +1)  # no whole block
    assert ledger.take() == []


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"endpoint": "http://x"}, "endpoint='http://x'"), ({"block_size": 0}, "block_size"),
     ({"replay_endpoint": 5}, "replay_endpoint=5"), ({"buffer_steps": 0}, "buffer_steps"),
     ({"data_parallel_rank": -1}, "data_parallel_rank"), ({"topic": b"kv"}, "topic"),
     ({"endpoint": "tcp://*:99999"}, "PORT 0 to 65535"), ({"endpoint": "tcp://"}, "tcp://"),
     ({"topic": "k\ud800"}, "lone surrogates"), ({"buffer_steps": 2**63}, "above"),
     ({"hwm": 2**31}, "hwm=2147483648 is above"), ({"block_size": True}, "block_size"),
     ({"data_parallel_rank": 2**70}, "not below 2\\*\\*63"), ({"endpoint": "inproc://"}, "inproc")],
)  # fmt: skip
def test_bad_configs_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        KVEventsConfig(**kw)


def test_numpy_integers_are_stored_as_ints():
    config = KVEventsConfig(hwm=np.int64(5), data_parallel_rank=np.int32(3))
    assert (type(config.hwm), type(config.data_parallel_rank)) == (int, int)


def test_one_publisher_a_prefix_cache_and_a_malformed_replay_request_is_answered():
    engine, router = served(4, None)
    with pytest.raises(ConfigError, match="already has a listener"):
        KVEvents(engine.prefix_cache, KVEventsConfig("inproc://kv-second"))
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(router.replay_endpoint)
    dealer.send_multipart([b"", b"short"])
    assert (
        dealer.poll(5000) and int.from_bytes(dealer.recv_multipart()[1], "big", signed=True) == -1
    )
    engine.generate(["after the refusal"], max_new_tokens=2)  # the first publisher goes on
    router.receive(engine.kv_events.n_batches - 1)
    assert router.prefixes() == held_prefixes(engine.prefix_cache, 4) != set()
    engine.kv_events.close()
    dealer.close()


def test_kv_events_need_a_prefix_cache_and_a_free_endpoint():
    cache = CellCache(MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=4))
    executor = Executor(MODEL, cache, 2, 16)
    with pytest.raises(ConfigError, match="prefix_cache"):
        Engine(executor, kv_events=KVEventsConfig("inproc://kv-none"))
    taken = zmq.Context.instance().socket(zmq.PUB)
    taken.bind("inproc://kv-taken")
    prefix = PrefixCache(executor)
    with pytest.raises(ConfigError, match="inproc://kv-taken"):
        Engine(executor, prefix_cache=prefix, kv_events=KVEventsConfig("inproc://kv-taken"))
    assert prefix._listener is None
    taken.close()


def test_the_demo_publishes_its_prefix_caches_blocks(demo_run):
    """`numbakv demo --kv-events tcp://127.0.0.1:PORT`: every batch arrives in order and
    decodes; the system prompt the demo's requests share was stored as whole blocks."""
    done, _, messages = demo_run
    assert done.returncode == 0, done.stderr
    assert f"KV events: {len(messages)} batches to tcp://127.0.0.1:" in done.stdout
    assert [int.from_bytes(seq, "big") for _, seq, _ in messages] == list(range(len(messages)))
    stored = set()
    router = Router.__new__(Router)
    router.blocks, router.ranks = {}, set()
    for _, _, payload in messages:
        batch = DECODE(payload)
        stored |= {tuple(e.token_ids) for e in batch.events if isinstance(e, BlockStored)}
        router.apply(batch)
    system = [int(b) for b in SYSTEM.encode()]
    assert tuple(system[:16]) in stored and len(messages) > 3


def test_a_step_that_raises_publishes_what_it_changed(monkeypatch):
    engine, router = served(4, None)
    engine.generate(["a finished prompt the prefix cache keeps"], max_new_tokens=2)
    router.receive(engine.kv_events.n_batches - 1)
    held = router.prefixes()

    def failing_step():
        engine.prefix_cache.drop()  # what a step changed before it failed
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(engine, "_run_step", failing_step)
    with pytest.raises(RuntimeError, match="fell over"):
        engine.step()
    router.receive(engine.kv_events.n_batches - 1)
    assert held and router.prefixes() == held_prefixes(engine.prefix_cache, 4) == set()
    engine.kv_events.close()
