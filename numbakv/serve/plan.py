"""`plan_slices`: how a run of tokens is cut into forwards of at most `max_width` tokens.

A prefill forward takes 2 to `max_width` tokens; a decode forward takes one. The executor
runs the slices in order, each declaring its tokens to the cache.
"""

from dataclasses import dataclass
from typing import Literal

from numbakv.core.values import int_at_least


@dataclass(frozen=True)
class Slice:
    """Tokens [start, start + length) of a run, as one forward of `kind`."""

    start: int
    length: int
    kind: Literal["prefill", "decode"]


def plan_slices(total: int, max_width: int, min_prefill: int = 2) -> list[Slice]:
    """Ordered slices covering tokens [0, total), none longer than max_width.

    Each next piece of L = min(max_width, tokens left) tokens runs as one prefill forward
    when L >= min_prefill and L > 1, otherwise as L one-token decode forwards:

        plan_slices(9, 8)                 -> prefill 8, decode 1
        plan_slices(10, 8)                -> prefill 8, prefill 2
        plan_slices(11, 8, min_prefill=5) -> prefill 8, decode 1, decode 1, decode 1
    """
    total = int_at_least("total", total, 0)
    max_width = int_at_least("max_width", max_width, 1)
    min_prefill = int_at_least("min_prefill", min_prefill, 1)
    slices, start = [], 0
    while start < total:
        length = min(max_width, total - start)
        if length >= min_prefill and length > 1:
            slices.append(Slice(start, length, "prefill"))
        else:
            slices += [Slice(start + i, 1, "decode") for i in range(length)]
        start += length
    return slices
