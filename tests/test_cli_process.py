"""The `numbakv` command keeps the memory its process frees and has numpy's arrays on small
pages (`numbakv.cli.process`); a program calling `numbakv.cli.main` keeps its own
allocator's and numpy's settings."""

import os
import platform
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import numbakv
import numbakv.cli
from numbakv.cli import process

GLIBC = platform.libc_ver()[0] == "glibc"

# page faults of 8 arrays of 64 MiB, each written whole and freed, before and after
# keep_freed_memory: numbers a count can hold (a fault is a page of 4 KiB or 2 MiB)
CYCLES = """
import resource, sys
import numpy as np
from numbakv.cli.process import keep_freed_memory

def faults():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        np.ones(8 << 20)  # 64 MiB: past the 32 MiB from which malloc maps a block by default
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

before = faults()
kept = keep_freed_memory()
faults()  # the heap grows to hold one such array
print(before, kept, faults())
"""


@pytest.mark.skipif(not GLIBC, reason="keep_freed_memory sets glibc's malloc")
def test_freed_arrays_are_reused_instead_of_faulted_in_again():
    done = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, kept, after = done.stdout.split()
    assert kept == "True"
    # each array faulted in whole before (at least 32 huge pages of 2 MiB); none after
    assert int(before) >= 8 * 32 and int(after) * 8 < int(before), done.stdout


def test_without_glibc_nothing_is_set(monkeypatch):
    def no_glibc(name):
        raise ValueError(f"unrecognized configuration name {name!r}")

    def no_library(*args):
        raise AssertionError("the C library was opened")

    monkeypatch.setattr(process.os, "confstr", no_glibc)
    monkeypatch.setattr(process.ctypes, "CDLL", no_library)
    assert process.keep_freed_memory() is False


class Libc:
    """A C library whose mallopt answers `answer` to every call, and records them."""

    def __init__(self, answer: int):
        self.calls, self.answer = [], answer

    @property
    def mallopt(self):
        def mallopt(param: int, value: int) -> int:
            self.calls.append((param, value))
            return self.answer

        return mallopt


@pytest.mark.parametrize("answer", [0, 1])
def test_glibc_is_asked_to_map_no_block_and_to_trim_past_2_gib(monkeypatch, answer):
    libc = Libc(answer)
    monkeypatch.setattr(process.os, "confstr", lambda name: "glibc 2.31")
    monkeypatch.setattr(process.ctypes, "CDLL", lambda name: libc)
    assert process.keep_freed_memory() is bool(answer)  # a glibc that refuses: False
    asked = [(process.M_MMAP_MAX, 0), (process.M_TRIM_THRESHOLD, 2**31 - 1)]
    assert libc.calls == asked[: 1 + answer]


def test_a_c_library_that_cannot_be_opened_sets_nothing(monkeypatch):
    def unopened(name):
        raise OSError("no such library")

    monkeypatch.setattr(process.os, "confstr", lambda name: "glibc 2.36")
    monkeypatch.setattr(process.ctypes, "CDLL", unopened)
    assert process.keep_freed_memory() is False


SMALL_PAGES = """
import numpy as np
from numbakv.cli.process import small_pages

switch = np._core.multiarray._set_madvise_hugepage  # gives the setting before the call
switch(True)
print(small_pages(), switch(True))
"""


def test_numpy_is_told_to_ask_for_no_huge_pages():
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    done = subprocess.run([sys.executable, "-c", SMALL_PAGES], capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"], done.stdout  # huge pages were off


@pytest.mark.parametrize("chosen", ["0", "1"])
def test_the_users_numpy_madvise_hugepage_stands(monkeypatch, chosen):
    calls = []
    monkeypatch.setattr(process.np._core.multiarray, "_set_madvise_hugepage", calls.append)
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", chosen)
    assert process.small_pages() is False and calls == []
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE")
    assert process.small_pages() is True and calls == [False]


def test_a_numpy_without_the_switch_is_left_alone(monkeypatch):
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    monkeypatch.delattr(process.np._core.multiarray, "_set_madvise_hugepage")
    assert process.small_pages() is False


def test_set_up_keeps_freed_memory_and_small_pages(monkeypatch):
    calls = []
    monkeypatch.setattr(process, "keep_freed_memory", lambda: calls.append("kept"))
    monkeypatch.setattr(process, "small_pages", lambda: calls.append("small"))
    process.set_up()
    assert calls == ["kept", "small"]


def test_the_executable_sets_it_up_and_main_does_not(monkeypatch):
    calls = []
    monkeypatch.setattr(numbakv.cli, "set_up", lambda: calls.append("set up"))
    with pytest.raises(SystemExit) as shown:
        numbakv.cli.main(["--version"])
    assert shown.value.code == 0 and calls == []
    monkeypatch.setattr(sys, "argv", ["numbakv", "--version"])
    with pytest.raises(SystemExit):
        numbakv.cli.command()
    assert calls == ["set up"]


def test_the_console_script_and_python_dash_m_run_the_command(tmp_path):
    (script,) = entry_points(group="console_scripts", name="numbakv")
    assert script.value == "numbakv.cli:command"
    patched = (
        "import runpy, sys; import numbakv.cli as cli; "
        "cli.set_up = lambda: print('set up'); sys.argv = ['numbakv', '--version']; "
        "runpy.run_module('numbakv', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", patched], capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["set up", f"numbakv {numbakv.__version__}"]
