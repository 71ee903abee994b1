"""Damaged and hostile variants of recorded trace files, and what `load_trace` makes of each:
it must refuse it with a TraceError, or load a trace whose every accessor works.

Two small traces are recorded from the reference cache (`record`: every verb, padded steps,
clones, rewinds, removals, a clear; `Originals` holds them and their files). Kinds of
variant (`variant`), each made from the first trace's file:

    bits      one bit of the file flipped
    truncate  the file cut short
    splice    a head of one file joined to a tail of the other
    member    one bit flipped in one member's .npy bytes (header or data), the zip rebuilt
              with good checksums: reaches numpy's header parser and the array checks
    graft     one member taken from the other trace
    value     one element of one array nudged (±1, -1, 0, a bit flipped), saved again
    config    one field of the header's config changed, saved again

Outcomes (`outcome`): `refused: REASON` (a TraceError, digits and the path elided), `equal`
(loaded and equal to the original), `equal to the other trace` (a splice that rebuilt the
other file), `other trace` (loaded, different, every accessor works; only the kinds that
rebuild a well-formed file, REBUILT, may give it) and `ESCAPE ...` (any other exception, or
bits/truncate/splice loading a trace that is neither). Escapes must be 0.

tests/viz/test_trace_fuzz.py runs a few hundred variants of each kind; `python -m
benchmarks.trace_fuzz` runs many more.
"""

import collections
import dataclasses
import io
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Iterator

import numpy as np

from numbakv import CacheConfig, Recorder, Trace, load_trace
from numbakv.core.errors import TraceError
from numbakv.reference import CellCache

CONFIG = CacheConfig(
    n_layers=2, n_kv_heads=1, head_dim=4, windows=(0, 2), capacity=24, max_width=6,
    max_seqs=5, initial_cells=2,
)  # fmt: skip
KINDS = ("bits", "truncate", "splice", "member", "graft", "value", "config")
# (pattern, replacement) that turn a TraceError's message into a group name
ELIDE = ((r"(?<![A-Za-z])b?'[^']*'|\"[^\"]*\"", "Q"), (r"\w+\.npy", "M.npy"), (r"\d+", "N"))
REBUILT = ("member", "graft", "value", "config")  # well-formed files: may load as another trace


def record(seed: int) -> Trace:
    """A short workload of every verb on the reference cache, a frame per verb; a clear()
    two thirds through."""
    rng = np.random.default_rng(seed)
    cache = CellCache(CONFIG)
    recorder = Recorder(cache, every_verb=True)
    for i, op in enumerate(rng.integers(0, 7, size=48).tolist()):
        live = cache.live_seqs
        if i == 32:
            cache.clear()
        elif op == 0 or not live:
            if len(live) < CONFIG.max_seqs:
                cache.seq_new()
        elif op <= 3 and cache.free_cells:
            n = int(min(rng.integers(1, 4), cache.free_cells))
            cache.declare_step([live[int(rng.integers(len(live)))] for _ in range(n)])
            cache.prepare_step(int(rng.integers(n, CONFIG.max_width + 1)))  # padded
        elif op == 4 and len(live) < CONFIG.max_seqs:
            src = live[int(rng.integers(len(live)))]
            cache.seq_clone(src, upto=int(rng.integers(cache.pos(src) + 1)))
        elif op == 5:
            seq = live[int(rng.integers(len(live)))]
            cache.rewind(seq, int(rng.integers(cache.pos(seq) + 1)))
        elif op == 6:
            cache.seq_rm(live[int(rng.integers(len(live)))])
    return recorder.trace()


def to_bytes(trace: Trace) -> bytes:
    """The .npz file `trace.save` writes, as bytes."""
    out = io.BytesIO()
    trace.save(out)
    return out.getvalue()


class Originals:
    """Two traces, their files and their members' bytes: the variants are made from the
    first, with parts of the second."""

    def __init__(self, trace: Trace, other: Trace):
        self.trace, self.other = trace, other
        self.data, self.other_data = to_bytes(trace), to_bytes(other)
        self.members = members_of(self.data)
        self.other_members = members_of(self.other_data)

    @classmethod
    def recorded(cls, seed: int = 0) -> "Originals":
        """The traces `record(seed)` and `record(seed + 1)`."""
        return cls(record(seed), record(seed + 1))


def members_of(data: bytes) -> dict[str, bytes]:
    """{name: bytes} of every member of a zip file."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def zipped(members: dict[str, bytes]) -> bytes:
    """A zip file of `members` ({name: bytes}), deflated, with good checksums."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


def variant(kind: str, o: Originals, rng: np.random.Generator) -> bytes:
    """One random variant of the first trace's file, of `kind`."""
    if kind == "bits":
        return _flip(o.data, int(rng.integers(8 * len(o.data))))
    if kind == "truncate":
        return o.data[: int(rng.integers(len(o.data)))]
    if kind == "splice":
        cut, rest = int(rng.integers(len(o.data))), int(rng.integers(len(o.other_data)))
        return o.data[:cut] + o.other_data[rest:]
    if kind == "member":
        name = _pick(rng, sorted(o.members))
        bit = int(rng.integers(8 * len(o.members[name])))
        return zipped(o.members | {name: _flip(o.members[name], bit)})
    if kind == "graft":
        name = _pick(rng, sorted(o.members))
        return zipped(o.members | {name: o.other_members[name]})
    arrays = {name: array.copy() for name, array in o.trace.arrays.items()}
    header = {"format": "numbakv-trace/1", "config": dataclasses.asdict(o.trace.config)}
    if kind == "value":
        name = _pick(rng, [n for n, a in arrays.items() if a.size])
        flat = arrays[name].reshape(-1)
        i = int(rng.integers(flat.size))
        if flat.dtype == np.bool_:
            flat[i] = not flat[i]
        elif flat.dtype == np.uint64:
            flat[i] ^= np.uint64(1) << np.uint64(rng.integers(64))
        else:
            old, bit = int(flat[i]), int(rng.integers(8 * flat.itemsize - 1))
            new = _pick(rng, [old + 1, old - 1, -1, 0, old ^ (1 << bit)])
            flat[i] = np.array(new, dtype=np.int64).astype(flat.dtype)  # wraps like C
    elif kind == "config":
        field = _pick(rng, sorted(header["config"]))
        values = [None, -1, 0, 1, 2**40, "x", 1.5, [0], True]
        if isinstance(header["config"][field], int):
            values += [header["config"][field] + d for d in (-2, -1, 1, 2)]
        header["config"][field] = _pick(rng, values)
    out = io.BytesIO()
    np.savez_compressed(out, header=np.array(json.dumps(header)), **arrays)
    return out.getvalue()


def variants(kind: str, o: Originals, rng: np.random.Generator, n: int) -> Iterator[bytes]:
    """`n` random variants of `kind`, made as they are consumed."""
    for _ in range(n):
        yield variant(kind, o, rng)


def every_bit(o: Originals) -> Iterator[bytes]:
    """The first trace's file with each of its bits flipped in turn."""
    for bit in range(8 * len(o.data)):
        yield _flip(o.data, bit)


def exercise(trace: Trace) -> None:
    """Calls every accessor of `trace`; raises whatever they raise (AssertionError for a
    result of the wrong shape)."""
    snapshots = list(trace.snapshots())
    for snapshot in snapshots:
        assert len(snapshot.codes) == len(snapshot.n_owners) == snapshot.read_len
        assert snapshot.live_seqs.max(initial=0) < trace.config.max_seqs
    assert trace.snapshot(-1) == snapshots[-1] and trace.snapshot(0) == snapshots[0]
    assert len(trace.events) == len(trace.widths) == len(snapshots) == trace.n_frames
    for frame in trace.step_frames:
        step = trace.step(frame)
        for window in trace.config.distinct_windows:
            assert step.mask(window).shape == (step.width, step.read_len)
    assert all(len(m) == trace.n_frames for m in trace.metrics().values())
    assert trace.timeline().shape[0] == trace.n_steps


def same_trace(a: Trace, b: Trace) -> bool:
    """Same config and the same arrays (names, dtypes, shapes, values)."""
    return (
        a.config == b.config
        and a.arrays.keys() == b.arrays.keys()
        and all(
            a.arrays[n].dtype == b.arrays[n].dtype and np.array_equal(a.arrays[n], b.arrays[n])
            for n in a.arrays
        )
    )


def outcome(path: str, original: Trace, others: tuple[Trace, ...] | None) -> str:
    """What `load_trace(path)` gives: `refused: reason`; `equal` (to `original`); `equal to
    the other trace` (one of `others`: a splice can rebuild the other file whole); `other
    trace` (anything that works, when `others` is None); else `ESCAPE ...`."""
    try:
        trace = load_trace(path)
    except TraceError as error:
        return "refused: " + reason(str(error), path)
    except Exception as error:  # an escape: reported, not raised
        return f"ESCAPE load_trace {type(error).__name__}: {error}"[:160]
    try:
        exercise(trace)
    except Exception as error:  # an escape: reported, not raised
        return f"ESCAPE accessor {type(error).__name__}: {error}"[:160]
    if same_trace(trace, original):
        return "equal"
    if others is None:
        return "other trace"
    if any(same_trace(trace, other) for other in others):
        return "equal to the other trace"
    return "ESCAPE loaded a different trace"


def reason(message: str, path: str) -> str:
    """A TraceError's message as a group name: the path, the advice, quoted text, member
    names and digits elided."""
    message = message.replace(path, "FILE").split("); record it again")[0]
    for pattern, by in ELIDE:
        message = re.sub(pattern, by, message)
    return message[:90]


def run(kinds: dict[str, Iterator[bytes]], o: Originals) -> dict[str, collections.Counter]:
    """{kind: Counter of outcomes} over every variant of each kind."""
    counts = {kind: collections.Counter() for kind in kinds}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "variant.npz")
        for kind, datas in kinds.items():
            others = None if kind in REBUILT else (o.other,) if kind == "splice" else ()
            for data in datas:
                with open(path, "wb") as file:
                    file.write(data)
                counts[kind][outcome(path, o.trace, others)] += 1
    return counts
