"""examples/count_device_calls.py: a user's own numba step counted on the simulator by
`numbakv.testing.launches` — two launches and one copy per step, all on the user's stream,
no allocation or synchronization — and a step that breaks its budget is seen to."""

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "count_device_calls.py"

OVER_BUDGET = """
import importlib.util, numpy as np
from numba import cuda
spec = importlib.util.spec_from_file_location("count_example", {path!r})
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

class Careless(example.ToyStep):  # uploads from a fresh array on the default stream
    def run(self, positions, rows, q):
        self.positions = cuda.to_device(np.asarray(positions, np.int32))
        super().run(positions, rows, q)

example.ToyStep = Careless
calls = example.one_step()
print(calls.counts["allocations"], calls.counts["copies"], len(calls.on_default_stream()))
"""


def run(*args: str) -> list[str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_toy_step_is_counted_exactly():
    counts, log, default = run(str(EXAMPLE))
    assert counts == ("{'launches': 2, 'copies': 1, 'allocations': 0, 'synchronizations': 0, "
                      "'streams': 0, 'events': 0}")  # fmt: skip
    assert log == ("[('copies', 'copy_to_device'), ('launches', 'append_kv'), "
                   "('launches', 'scale_by_history')]")  # fmt: skip
    assert default == "on the legacy default stream: []"


def test_a_step_over_its_budget_shows_in_the_counts():
    allocations, copies, on_default = run("-c", OVER_BUDGET.format(path=str(EXAMPLE))).pop().split()
    assert int(allocations) >= 1 and int(copies) == 2 and int(on_default) >= 1
