"""The first part of `python -m benchmarks.gpu_check`: the interpreter, numpy and numba
against the pins of pyproject.toml, torch, CuPy, and the device (its name, size and CUDA
versions)."""

import importlib.metadata
import platform
import re
import sys
from pathlib import Path

from benchmarks.gpu_check.run import Run
from benchmarks.gpu_check.torch_sdpa import find_torch, torch_note

PINS = {  # package: (lowest accepted, first refused), from pyproject.toml
    "numpy": ((2, 0), None),
    "numba": ((0, 60), None),
    "numba-cuda": ((0, 30), (0, 31)),
}


def part_versions(run: Run) -> None:
    """Prints the interpreter, the packages against their pins, torch, CuPy and the device;
    on a GPU, looks for torch (run.torch)."""
    import numbakv

    print(f"  python      {platform.python_version()} ({sys.executable})")
    print(f"  numbakv     {numbakv.__version__} ({Path(numbakv.__file__).parent})")
    for name, (lowest, refused) in PINS.items():
        print(f"  {name:<11} {_version_note(name, lowest, refused)}")
    print(f"  torch       {_distribution('torch') or 'not installed'}")
    cupy = [d for d in _distributions() if d.startswith("cupy")]
    print(f"  cupy        {', '.join(cupy) or 'not installed'}")
    if run.is_sim:
        run.torch = "skipped (sim)"
        print("  device      numba CUDA simulator (timings are the wall clock of Python threads)")
        return
    run.torch = find_torch()
    print(f"  torch CUDA  {run.torch if isinstance(run.torch, str) else torch_note(run.torch)}")
    for line in _device_lines(run.device.cuda):
        print(f"  {line}")


def _version_note(name: str, lowest: tuple, refused: tuple | None) -> str:
    found = _distribution(name)
    if found is None:
        if name == "numba-cuda":
            return "not installed: numba's own numba.cuda (deprecated) is what runs"
        return "not installed"
    have = tuple(int(x) for x in re.findall(r"\d+", found)[:2])
    pin = f">={'.'.join(map(str, lowest))}" + (
        f",<{'.'.join(map(str, refused))}" if refused else ""
    )
    inside = have >= lowest and (refused is None or have < refused)
    return f"{found} (pin {pin}{'' if inside else ': outside it, running anyway'})"


def _distribution(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _distributions() -> list[str]:
    """'name version' of every installed distribution."""
    dists = importlib.metadata.distributions()
    found = {(d.metadata["Name"] or "").lower(): d.version for d in dists}
    return [f"{name} {version}" for name, version in sorted(found.items()) if name]


def _device_lines(cuda) -> list[str]:
    """The GPU's name, size and CUDA versions; a figure numba cannot give says why."""
    device = cuda.get_current_device()

    def name():
        return device.name.decode() if isinstance(device.name, bytes) else device.name

    def memory():
        free, total = cuda.current_context().get_memory_info()
        return f"{total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"

    def nominal():
        rate = 2 * device.MEMORY_CLOCK_RATE * 1e3 * device.GLOBAL_MEMORY_BUS_WIDTH / 8
        return f"{rate / 1e12:.2f} TB/s (memory clock x bus width; often off for HBM)"

    return [
        f"device      {_ask(name)}, compute capability {_ask(lambda: device.compute_capability)}, "
        f"{_ask(lambda: device.MULTIPROCESSOR_COUNT)} SMs",
        f"memory      {_ask(memory)}; nominal {_ask(nominal)}",
        f"CUDA        driver {_ask(lambda: cuda.cudadrv.driver.driver.get_version())}, runtime "
        f"(NVRTC) {_ask(lambda: cuda.runtime.get_version())}",
    ]


def _ask(question) -> str:
    """str(question()), or what it raised."""
    try:
        return str(question())
    except Exception as error:
        return f"unknown ({type(error).__name__}: {error})"
