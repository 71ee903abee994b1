"""`python -m benchmarks.reference {steps,attend} [options]`: see the package's docstring."""

import sys

from benchmarks.common import run_command
from benchmarks.reference import attend, steps

COMMANDS = {
    name: (module.__doc__.splitlines()[0], module.add_arguments, module.run)
    for name, module in (("steps", steps), ("attend", attend))
}

if __name__ == "__main__":
    sys.exit(
        run_command("python -m benchmarks.reference", "The NumPy reference's speed.", COMMANDS)
    )
