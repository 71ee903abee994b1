"""DecodeFirstScheduler: each rule with exact batches, refusals, and random workloads."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv.core.errors import ConfigError
from numbakv.serve.scheduler import DecodeFirstScheduler, Task, Work

from helpers import stable_id


def D(session: int) -> Task:
    return Task(session, "decode", 1)


def P(session: int, n: int) -> Task:
    return Task(session, "prefill", n)


def batches(sched: DecodeFirstScheduler) -> list[list[tuple]]:
    """Every batch until the queues are empty, as (session, kind letter, n_tokens) tuples."""
    got = []
    while sched.pending():
        got.append([(w.session, w.kind[0], w.n_tokens) for w in sched.next_batch()])
        assert len(got) < 1000
    assert sched.next_batch() == []
    return got


def test_worked_example_of_the_docstring():
    sched = DecodeFirstScheduler(8, 2, 4)
    sched.submit([P(0, 6), D(1), P(2, 3)])
    assert sched.next_batch() == [
        Work(1, "decode", 1),
        Work(0, "prefill", 4),
        Work(2, "prefill", 3),
    ]
    assert sched.pending() == 2
    assert sched.next_batch() == [Work(0, "prefill", 2)]
    assert sched.next_batch() == []


def test_decodes_go_first_in_arrival_order_up_to_the_limit():
    sched = DecodeFirstScheduler(8, 3, 4)
    sched.submit([P(0, 4), D(3), D(1)])
    sched.submit([D(2), D(4)])
    expect = [[(3, "d", 1), (1, "d", 1), (2, "d", 1), (0, "p", 4)], [(4, "d", 1)]]
    assert batches(sched) == expect
    # arrival of the decode, not of the session: session 1's decode is older than session 0's
    sched = DecodeFirstScheduler(8, 1, 4)
    sched.submit([D(0), P(1, 4), D(1), D(0)])
    assert batches(sched) == [[(0, "d", 1), (1, "p", 4)], [(1, "d", 1)], [(0, "d", 1)]]


def test_at_most_one_decode_per_session_per_batch():
    sched = DecodeFirstScheduler(8, 4, 4)
    sched.submit([D(0), D(0), D(1), D(0)])
    assert batches(sched) == [[(0, "d", 1), (1, "d", 1)], [(0, "d", 1)], [(0, "d", 1)]]


def test_prefill_rotation_is_fair_across_calls():
    # one chunk fills a batch: the three sessions take turns
    sched = DecodeFirstScheduler(4, 1, 4)
    sched.submit([P(0, 8), P(1, 8), P(2, 8)])
    assert batches(sched) == [[(s, "p", 4)] for s in (0, 1, 2, 0, 1, 2)]
    # two chunks fit: the turn carries over from one batch to the next
    sched = DecodeFirstScheduler(8, 1, 4)
    sched.submit([P(0, 8), P(1, 8), P(2, 8)])
    expect = [[(0, "p", 4), (1, "p", 4)], [(2, "p", 4), (0, "p", 4)], [(1, "p", 4), (2, "p", 4)]]
    assert batches(sched) == expect


def test_passes_repeat_while_budget_remains():
    sched = DecodeFirstScheduler(8, 1, 2)
    sched.submit([P(0, 5), P(1, 1)])
    # pass 1: 0 x2, 1 x1; pass 2: 0 x2; pass 3: 0 x1 (its last token); pass 4 takes nothing
    assert batches(sched) == [[(0, "p", 2), (1, "p", 1), (0, "p", 2), (0, "p", 1)]]


def test_a_chunk_that_does_not_fit_is_deferred_and_offered_first_next_time():
    sched = DecodeFirstScheduler(6, 1, 4)
    sched.submit([P(0, 4), P(1, 4), P(2, 2), P(3, 1)])
    # 0 x4 leaves 2: session 1's chunk of 4 is deferred, not split; 2 x2 still fits
    expect = [[(0, "p", 4), (2, "p", 2)], [(1, "p", 4), (3, "p", 1)]]
    assert batches(sched) == expect


def test_decodes_can_defer_a_full_chunk():
    sched = DecodeFirstScheduler(8, 2, 8)
    sched.submit([D(0), P(1, 8), P(2, 3)])
    assert batches(sched) == [[(0, "d", 1), (2, "p", 3)], [(1, "p", 8)]]


def test_a_session_with_a_decode_in_the_batch_waits_for_prefill():
    sched = DecodeFirstScheduler(8, 2, 4)
    sched.submit([D(0), P(0, 4), P(1, 2)])
    assert batches(sched) == [[(0, "d", 1), (1, "p", 2)], [(0, "p", 4)]]


def test_a_decode_behind_a_prefill_waits_for_all_of_it():
    sched = DecodeFirstScheduler(8, 2, 4)
    sched.submit([P(0, 6), D(0), D(1)])
    assert batches(sched) == [[(1, "d", 1), (0, "p", 4), (0, "p", 2)], [(0, "d", 1)]]


def test_cancel_returns_what_is_left_and_leaves_others_untouched():
    sched = DecodeFirstScheduler(4, 1, 4)
    sched.submit([P(0, 6), D(0), P(1, 3)])
    assert sched.next_batch() == [Work(0, "prefill", 4)]
    assert sched.cancel(0) == [P(0, 2), D(0)]
    assert (sched.pending(0), sched.pending(1), sched.pending()) == (0, 3, 3)
    assert sched.cancel(0) == []
    assert sched.cancel(7) == []
    assert batches(sched) == [[(1, "p", 3)]]
    # a cancelled session can come back
    sched.submit([D(0)])
    assert batches(sched) == [[(0, "d", 1)]]


BAD_TASKS = [
    Task(0, "verify", 1),
    P(0, 0),
    P(0, -3),
    Task(0, "decode", 2),
    Task(1.5, "decode", 1),
    Task("a", "decode", 1),
    Task(-1, "decode", 1),
    Task(True, "decode", 1),
    P(0, 2.0),
    (0, "decode", 1),
]


@pytest.mark.parametrize("bad", BAD_TASKS, ids=stable_id)
def test_submit_is_atomic(bad):
    group = [P(0, 5), D(1), P(2, 3)]
    sched, twin = DecodeFirstScheduler(4, 2, 3), DecodeFirstScheduler(4, 2, 3)
    for s in (sched, twin):
        s.submit([D(2), P(1, 4)])
        s.next_batch()
    before = [sched.pending(s) for s in range(3)]
    with pytest.raises(ConfigError):
        sched.submit([*group[:2], bad, group[2]])
    assert [sched.pending(s) for s in range(3)] == before
    sched.submit(group)
    twin.submit(group)
    assert batches(sched) == batches(twin)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, 1, 1), "max_batch_tokens"),
        ((4, 0, 1), "max_decode_sequences"),
        ((4, 1, 0), "max_prefill_chunk"),
        ((4, 5, 1), "max_decode_sequences=5 is above its bound max_batch_tokens=4"),
        ((4, 1, 5), "max_prefill_chunk=5 is above its bound max_batch_tokens=4"),
        ((4.0, 1, 1), "max_batch_tokens"),
        ((4, True, 1), "max_decode_sequences"),
    ],
)
def test_limits_are_checked_at_construction(args, name):
    with pytest.raises(ConfigError, match=name):
        DecodeFirstScheduler(*args)


def test_limits_at_their_bounds_are_accepted():
    sched = DecodeFirstScheduler(1, 1, 1)
    sched.submit([P(0, 2), D(1)])
    assert batches(sched) == [[(1, "d", 1)], [(0, "p", 1)], [(0, "p", 1)]]


# random workloads: submits, cancels and batches against a per-session token log

SESSIONS = range(4)
task_st = st.one_of(
    st.builds(D, st.sampled_from(SESSIONS)),
    st.builds(P, st.sampled_from(SESSIONS), st.integers(1, 12)),
)
op_st = st.one_of(
    st.tuples(st.just("submit"), st.lists(task_st, max_size=4), st.booleans()),
    st.tuples(st.just("cancel"), st.sampled_from(SESSIONS)),
    st.tuples(st.just("batch")),
)


@st.composite
def limits_st(draw):
    max_batch_tokens = draw(st.integers(1, 10))
    return (
        max_batch_tokens,
        draw(st.integers(1, max_batch_tokens)),
        draw(st.integers(1, max_batch_tokens)),
    )


@given(limits_st(), st.lists(op_st, max_size=40))
def test_random_workloads_keep_the_invariants(limits, ops):
    max_batch_tokens, max_decode_sequences, max_prefill_chunk = limits
    sched = DecodeFirstScheduler(*limits)
    is_fair = max_decode_sequences + max_prefill_chunk <= max_batch_tokens
    submitted = {s: "" for s in SESSIONS}  # token kinds in submission order, "d" or "p"
    log = {s: "" for s in SESSIONS}  # token kinds served or returned by cancel, in order
    waited = dict.fromkeys(SESSIONS, 0)  # batches since last served while work is queued
    n_decodes = 0

    def step():
        batch = sched.next_batch()
        assert sum(w.n_tokens for w in batch) <= max_batch_tokens
        decode_ids = [w.session for w in batch if w.kind == "decode"]
        prefill_ids = {w.session for w in batch if w.kind == "prefill"}
        assert len(decode_ids) <= max_decode_sequences
        assert len(set(decode_ids)) == len(decode_ids)
        assert not set(decode_ids) & prefill_ids
        assert all(1 <= w.n_tokens <= max_prefill_chunk for w in batch)
        assert batch or sched.pending() == 0  # progress whenever anything is queued
        for w in batch:
            log[w.session] += w.kind[0] * w.n_tokens
        for s in SESSIONS:
            is_served = s in decode_ids or s in prefill_ids
            waited[s] = 0 if is_served or not sched.pending(s) else waited[s] + 1
            # a decode waits only behind older decodes, a prefill behind the other sessions
            bound = n_decodes // max_decode_sequences + len(SESSIONS) + 1
            if is_fair:
                assert waited[s] <= bound

    for op in ops:
        if op[0] == "submit":
            tasks, is_bad = op[1], op[2]
            if is_bad:
                with pytest.raises(ConfigError):
                    sched.submit([*tasks, Task(0, "decode", 3)])
                continue
            sched.submit(tasks)
            for t in tasks:
                submitted[t.session] += t.kind[0] * t.n_tokens
                n_decodes += t.kind == "decode"
        elif op[0] == "cancel":
            returned = sched.cancel(op[1])
            assert all(t.session == op[1] for t in returned)
            log[op[1]] += "".join(t.kind[0] * t.n_tokens for t in returned)
            assert sched.pending(op[1]) == 0
        else:
            step()
        assert sched.pending() == sum(len(submitted[s]) - len(log[s]) for s in SESSIONS)

    for _ in range(sched.pending()):
        step()
    assert sched.pending() == 0
    assert log == submitted  # every token served once or returned, in submission order
