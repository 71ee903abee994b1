"""Random workloads against the reference CellCache, held to an independent model by the
conformance kit's one generator (`numbakv.testing.check_cache`, `decode`).

`NaiveCache` (workload_model.py) is the whole contract as plain Python: the table in dicts,
lists and sets, pool growth, the mask rule, the refusals in their order, and attention by
the solo oracle over each sequence's own K/V history as stored (rounded through ml_dtypes).
`check_cache(NaiveCache, compare="table", ...)` runs the same ops on the reference and on
the model and, after every op, holds the reference to it:

- the outcome (the exact error class of a refusal) and every returned id; the live ids,
  each one's pos, used and free cells, the snapshot (cells, owners, live ids, read_len,
  rows: the pool's growth, kept by `clear`);
- a step's cells, positions, seq_ids, width, n_tokens, read_len, and every distinct
  window's mask (uint8 [width, read_len]); attention float32, padded rows exactly 0;
- a refusal leaves the model as it was (the snapshot included), and so the reference,
  which must equal it, and leaves the last step valid; a verb that changes the table makes
  it stale on both, and its fields then raise;
- the model's `check_invariants()`; every occupied cell's K/V bytes equal the model's (each
  live sequence's history lands in its cells, a padded row's K/V nowhere);
- and, through the hook, the reference's `check_invariants()`, every attention output
  within rtol = atol = 1e-5 of the model's solo attention element by element, and
  `read_len`, `rows` equal to the model's.

The configs cover windows 0, 1, 2, odd, even and wider than any history; GQA 1, 2, 4, 8
(drawn per step); head_dim 12, 16, 20; float32, float16 and bfloat16; 1 to 3 layers;
small capacities with a tiny first allocation, so the pool grows often and fills; max_seqs
3, and 65 (two owner words) with 64 ids opened first, so that ids past 63 carry tokens.
"""

import numpy as np
import pytest

from numbakv.core.config import TOLERANCE
from numbakv.core.errors import StepError
from numbakv.reference import CellCache
from numbakv.testing import Op, check_cache

from workload_model import TOL, NaiveCache, config_list


def same_as_the_model(reference, model, op, expected, got) -> None:
    """The reference's own invariants; attention within rtol = atol = 1e-5 of the model's
    solo attention, element by element; read_len and rows the model's."""
    reference.check_invariants()
    assert reference.read_len == model.read_len == reference.snapshot().read_len
    assert reference.rows == model.rows
    if op.verb == "step" and expected[1] is None:
        (step, outs), (_, solo) = expected[0], got[0]
        assert step.read_len == reference.read_len
        for layer, (out, want) in enumerate(zip(outs, solo, strict=True)):
            np.testing.assert_allclose(out, want, **TOL, err_msg=f"layer {layer}")


# the naive model keeps the whole steps it is written to (its hook compares every output)
WHOLE_STEPS = ("step", "seq_new", "seq_clone", "rewind", "seq_rm", "clear")


def run(max_seqs: int, prefix=()) -> None:
    check_cache(NaiveCache, compare="table", configs=config_list(max_seqs), prefix=prefix,
                tolerance=TOLERANCE["float32"], check=same_as_the_model, kinds=WHOLE_STEPS,
                hazards=False, max_examples=80, max_ops=100)  # fmt: skip


def test_workload_three_seqs():
    run(3)


def test_workload_sixty_five_seqs():
    """Two owner words, 64 ids open from the start (again after every clear): ids past 63
    carry tokens."""
    run(65, prefix=[Op("seq_new")] * 64)


def test_prepare_step_needs_a_declaration_and_a_refused_one_keeps_it():
    """What op scripts cannot say: prepare_step with nothing declared (none yet, consumed,
    dropped by a verb) is a StepError, and a refused prepare_step keeps the declaration;
    neither changes the table."""
    cache = CellCache(config_list(3)[0])
    a = cache.seq_new()
    for declare_then in ((), ("prepare_step",), ("rewind", a, 0)):
        if declare_then:
            cache.declare_step([a])
            getattr(cache, declare_then[0])(*declare_then[1:])
        before = cache.snapshot()
        with pytest.raises(StepError, match="nothing declared"):
            cache.prepare_step()
        assert cache.snapshot() == before
    cache.declare_step([a, a])
    before = cache.snapshot()
    with pytest.raises(StepError):  # too wide
        cache.prepare_step(cache.config.max_width + 1)
    assert cache.snapshot() == before
    assert cache.prepare_step().positions.tolist() == [0, 1]
