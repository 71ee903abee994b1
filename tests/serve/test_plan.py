"""plan_slices: the worked cases and random totals."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv.core.errors import ConfigError
from numbakv.serve.plan import Slice, plan_slices


def kinds(slices: list[Slice]) -> list[tuple[str, int]]:
    return [(s.kind, s.length) for s in slices]


def test_worked_cases():
    assert kinds(plan_slices(9, 8)) == [("prefill", 8), ("decode", 1)]
    assert kinds(plan_slices(10, 8)) == [("prefill", 8), ("prefill", 2)]
    assert kinds(plan_slices(11, 8, min_prefill=5)) == [("prefill", 8)] + [("decode", 1)] * 3
    assert plan_slices(0, 8) == []
    assert kinds(plan_slices(1, 8)) == [("decode", 1)]
    assert kinds(plan_slices(3, 1)) == [("decode", 1)] * 3  # a width of 1 only decodes


@given(st.integers(0, 200), st.integers(1, 40), st.integers(1, 50))
def test_slices_cover_in_order_within_the_width(total, max_width, min_prefill):
    slices = plan_slices(total, max_width, min_prefill)
    assert [s.start for s in slices] == [
        sum(s.length for s in slices[:i]) for i in range(len(slices))
    ]
    assert sum(s.length for s in slices) == total
    for s in slices:
        assert 1 <= s.length <= max_width
        if s.kind == "prefill":
            assert s.length >= max(2, min_prefill)
        else:
            assert s.length == 1


@pytest.mark.parametrize(
    ("args", "name"),
    [((-1, 8), "total"), ((4, 0), "max_width"), ((4, 8, 0), "min_prefill"), ((4.5, 8), "total")],
)
def test_refuses_bad_arguments(args, name):
    with pytest.raises(ConfigError, match=name):
        plan_slices(*args)
