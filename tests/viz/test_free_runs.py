"""`FreeRuns` (the largest free run kept as cells change) against a scan of every cell, on
random and adversarial changes: few cells at a time (its Python climb) and many (numpy)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.trace.free_runs import FreeRuns


def longest_run(free: np.ndarray) -> int:
    best = run = 0
    for cell in free.tolist():
        run = run + 1 if cell else 0
        best = max(best, run)
    return best


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n_cells=st.integers(1, 300))
def test_the_largest_run_is_the_scanned_one(data, n_cells):
    runs, free = FreeRuns(n_cells), np.zeros(n_cells, dtype=bool)
    for _ in range(data.draw(st.integers(1, 12))):
        cells = data.draw(st.sets(st.integers(0, n_cells - 1), max_size=n_cells))
        cells = np.array(sorted(cells), dtype=np.int64)
        value = np.array(data.draw(st.lists(st.booleans(), min_size=len(cells),
                                            max_size=len(cells))), dtype=bool)  # fmt: skip
        runs.set(cells, value)
        free[cells] = value
        assert runs.largest == longest_run(free)


def test_runs_across_every_node_boundary():
    n = 1 << 10
    runs, free = FreeRuns(n), np.zeros(n, dtype=bool)
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 63, 64, 65, 511, 512, 513, 1024):
        for start in (0, 1, n // 2 - 1, n - size):
            cells = np.arange(start, min(start + size, n))
            for value in (True, False):
                runs.set(cells, np.full(len(cells), value))
                free[cells] = value
                assert runs.largest == longest_run(free)
        holes = np.unique(rng.integers(0, n, 40))
        runs.set(holes, np.zeros(len(holes), dtype=bool))
        free[holes] = False
        assert runs.largest == longest_run(free)
