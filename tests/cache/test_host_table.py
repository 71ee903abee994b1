"""`numbakv.cache.table.HostTable` held to the reference `CellTable`, verb by verb.

Random workloads from the conformance kit's generator (`numbakv.testing.check.decode`, read
against the reference table's state) run on both tables through `table_pair.TablePair`:
new, clone at any `upto`, rm, rewind, clear, steps (the declaration, `find_cells`, the
claim) and their refusals (ids not live, negative, past max_seqs or not integers;
positions past the end, negative or not integers; too many tokens, no room, no free id).
After every op the snapshots, each live sequence's length and cells in position order,
read_len / used / free, both tables' invariants and `find_cells` (equal, pure) are
compared, and so are the cells each verb returned: those the reference snapshot taken
before it names. Every workload ends with a clear. Ids the generator does not draw (NumPy
integers) have a test of their own.

Then the worked cases; the edges of the bit trees and the arena are in
`test_host_table_edges.py`.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numbakv.cache.table import HostTable
from numbakv.core.errors import CapacityError, SequenceError
from numbakv.testing import Op
from numbakv.testing.workloads import ALL_KINDS, CLASSIC, CODES, Swarm, decode

from table_pair import MAX_SEQS, TablePair, config, step

# -- random workloads ------------------------------------------------------------------

TABLE_MIX = Swarm(tuple(w if k in ("step", "seq_new", "seq_clone", "rewind", "seq_rm", "clear")
                        else 0 for k, w in zip(ALL_KINDS, CLASSIC, strict=True)))  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    max_seqs=st.sampled_from(MAX_SEQS),
    capacity=st.integers(8, 80),
    max_width=st.integers(1, 12),
    data=st.data(),
)
def test_the_host_table_holds_to_the_reference_table(max_seqs, capacity, max_width, data):
    pair = TablePair(config(capacity, max_seqs, max_width))
    n_live = data.draw(st.sampled_from(sorted({0, 1, max_seqs // 2, max_seqs})), label="live")
    pair.open(n_live)  # many ids live at once: ids past 63 and 127 get tokens
    for _ in range(data.draw(st.integers(1, 100), label="ops")):
        pair.run(decode(data.draw(st.integers(0, CODES - 1)), pair, pair.cfg, TABLE_MIX))
    pair.run(Op("clear"))  # at any fill: the generator clears only half-full tables


def test_numpy_integer_ids_and_positions_are_taken_alike():
    """np.int64 ids and positions (their repr does not replay in a script): each verb and a
    step take them as the ints they hold, on both tables."""
    pair = TablePair(config(16, 65))
    pair.open(65)
    for op in (
        Op("step", ((np.int64(64), np.int64(64), np.int32(3)),)),
        Op("seq_clone", (np.int64(64), np.int64(1))),
        Op("seq_rm", (np.int64(0),)),
        Op("seq_clone", (np.int64(64), None)),
        Op("rewind", (np.int64(64), np.int64(1))),
        Op("seq_rm", (np.int64(70),)),
        Op("rewind", (np.int64(3), np.int64(2))),
    ):
        pair.run(op)
    assert pair.ref.length(64) == 1 and pair.ref.length(0) == 2


# -- worked cases ------------------------------------------------------------------


@pytest.fixture
def host() -> HostTable:
    return HostTable(config(16, 4))


def test_worked_prefill_then_decode(host):
    a, b = host.seq_new(), host.seq_new()
    cells, positions = step(host, [a, a, a, b, b])
    assert cells.tolist() == [0, 1, 2, 3, 4] and positions.tolist() == [0, 1, 2, 0, 1]
    cells, positions = step(host, [b, a])
    assert cells.tolist() == [5, 6] and positions.tolist() == [2, 3]
    assert host.cells_of(a).tolist() == [0, 1, 2, 6] and host.cells_of(b).tolist() == [3, 4, 5]
    assert (host.read_len, host.used_cells, host.free_cells) == (7, 7, 9)


def test_worked_hole_refills_before_read_len_grows(host):
    a, b = host.seq_new(), host.seq_new()
    step(host, [a, a, a, b])
    assert host.seq_rm(a).tolist() == [0, 1, 2]
    assert host.read_len == 4  # b still holds cell 3
    cells, positions = step(host, [b])
    assert cells.tolist() == [0] and positions.tolist() == [1]
    assert host.read_len == 4 and host.cells_of(b).tolist() == [3, 0]


def test_rm_of_last_cells_trims_read_len(host):
    a, b, c = host.seq_new(), host.seq_new(), host.seq_new()
    step(host, [a, b, b, c, c, c])
    assert host.read_len == 6
    host.seq_rm(b)  # a hole at 1..2: read_len stays
    assert host.read_len == 6
    host.seq_rm(c)  # the last cells: trims past the hole down to a's cell 0
    assert (host.read_len, host.used_cells) == (1, 1)
    host.rewind(a, 0)
    assert (host.read_len, host.used_cells) == (0, 0)
    assert host.snapshot(rows=0).pos.shape == (0,)


def test_clone_shares_until_last_owner_leaves(host):
    a = host.seq_new()
    step(host, [a] * 5)
    c, shared = host.seq_clone(a, upto=3)
    assert c == 1 and shared.tolist() == [0, 1, 2] and host.used_cells == 5
    assert host.seq_rm(a).tolist() == [0, 1, 2, 3, 4]
    assert (host.used_cells, host.read_len) == (3, 3)
    assert host.snapshot(rows=0).pos.tolist() == [0, 1, 2]
    host.seq_rm(c)
    assert (host.used_cells, host.read_len) == (0, 0)


def test_find_cells_is_pure(host):
    a = host.seq_new()
    step(host, [a] * 6)
    host.rewind(a, 2)
    host.seq_new()
    before = host.snapshot(rows=0)
    first = host.find_cells(5)
    assert first.tolist() == [2, 3, 4, 5, 6] and first.dtype == np.int32
    assert host.find_cells(5).tolist() == first.tolist()
    assert host.snapshot(rows=0) == before and host.used_cells == 2


def test_refusals_change_nothing(host):
    a = host.seq_new()
    step(host, [a] * 3)
    before = host.snapshot(rows=0)
    for call in (
        lambda: host.check_live(1),
        lambda: host.check_live("a"),
        lambda: host.check_live(-1),
        lambda: host.seq_rm(4),
        lambda: host.seq_clone(a, upto=4),
        lambda: host.seq_clone(a, upto=-1),
        lambda: host.seq_clone(2),
        lambda: host.rewind(a, 4),
        lambda: host.rewind(a, 1.0),
    ):
        with pytest.raises(SequenceError):
            call()
        assert host.snapshot(rows=0) == before
    for _ in range(3):
        host.seq_new()
    before = host.snapshot(rows=0)
    with pytest.raises(CapacityError):
        host.seq_new()
    with pytest.raises(CapacityError):
        host.seq_clone(a)
    with pytest.raises(SequenceError):  # src is checked before the free id
        host.seq_clone(7)
    assert host.snapshot(rows=0) == before
