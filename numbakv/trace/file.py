"""The `.npz` trace file: its arrays, writing one, and reading one without trusting it
(numba-free).

A trace file is a zip of `.npy` members: `header.npy` (a JSON string: the format and the
cache's config), one member per entry of ARRAYS and, from format 2 on, `annotations.npy`
(a JSON string: the list of annotations, each `{"frame": int, "kind": str, "data": {...}}`,
in recording order). Format 3 stores one owner code per change and, for a change to a
shared cell, the owner bits it gains or loses; format 2 (a whole owner bitset per change) and
format 1 (format 2 without annotations) still load, converted to format 3
(`numbakv.trace.upgrade`).
`read_trace_file` refuses, before it allocates anything, what `Trace.save` never writes:
another file type, an encrypted member or a compression method other than stored/deflate,
a member that would expand past deflate's limit, an `.npy` header whose shape needs more
(or fewer) bytes than the member holds, a dtype other than the expected one (object
dtypes, i.e. pickles, included), text that is not UTF-32 or not strict JSON (those checks
are `numbakv.core.npz`'s), a format other than FORMATS.
`numbakv.trace.checks` then holds the arrays to the cell table's invariants and the
annotations to theirs.
"""

import dataclasses
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from numbakv.core import npz
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CacheError, TraceError
from numbakv.core.observe import EVENTS
from numbakv.core.values import short_repr
from numbakv.trace import upgrade
from numbakv.trace.zip_stream import Deflated, deflated, write_zip

FORMAT = "numbakv-trace/3"  # what `Trace.save` writes
FORMATS = ("numbakv-trace/1", "numbakv-trace/2", FORMAT)  # what `read_trace_file` reads
OWNER_BITSETS = FORMATS[:2]  # the formats that store a whole owner bitset per change
FRAME_EVENTS = ("start", *EVENTS)
STEP_EVENT = FRAME_EVENTS.index("prepare_step")

# name -> (dtype, dimensions after the first); every array of a trace, as saved
FRAMES = {
    "events": (np.uint8, 0),  # [n_frames] index into FRAME_EVENTS
    "read_len": (np.int32, 0),  # [n_frames]
    "rows": (np.int32, 0),  # [n_frames]
    "live": (np.bool_, 1),  # [n_frames, max_seqs]
    "delta_offsets": (np.int64, 0),  # [n_frames + 1] frame f's changes: [offsets[f], offsets[f+1])
    "delta_cells": (np.int32, 0),  # [n_changes] cell index
    "delta_pos": (np.int32, 0),  # [n_changes] its new position
}
STEPS = {
    "step_offsets": (np.int64, 0),  # [n_frames + 1] frame f's step rows (empty unless a step)
    "step_cells": (np.int32, 0),  # [n_rows]
    "step_positions": (np.int32, 0),  # [n_rows]
    "step_seq_ids": (np.int32, 0),  # [n_rows]
}
ARRAYS = {
    **FRAMES,
    "delta_codes": (np.int32, 0),  # [n_changes] its new owner code: an id, FREE or SHARED
    # a change to a shared cell lists the owner bits it flips, ids ascending; any other
    # change sets its cell's owners to its code's (one id, or none):
    "toggle_counts": (np.int32, 0),  # [n_changes] how many bits it flips (0 unless SHARED)
    "toggle_seqs": (np.int32, 0),  # [n_toggles] by change; s: it gains owner s, ~s loses s
    **STEPS,
}
# formats 1 and 2: a whole owner bitset per change instead of codes and toggles
BITSET_ARRAYS = {**FRAMES, "delta_owners": (np.uint64, 1), **STEPS}
MEMBERS = ("header", *ARRAYS)  # a format 3 file's
ADVICE = "record it again (Recorder.save or `numbakv demo --trace`)"
KIND = npz.Kind("trace", f"{len(MEMBERS)} arrays", TraceError, ADVICE)


def write_trace_file(path, config: CacheConfig, arrays: dict[str, np.ndarray | Deflated],
                     annotations: list[dict]) -> None:  # fmt: skip
    """Writes one compressed `.npz` of FORMAT: the header (format and config), `arrays` (those
    of ARRAYS, each an array or its member already deflated: a recorder's
    `zip_stream.Stream`, finished) and `annotations` (`{"frame", "kind", "data"}` dicts,
    strict JSON). The members are `np.savez_compressed`'s, in its order, deflated at
    `zip_stream.LEVEL`; a path not ending in .npz gets it appended, as numpy's does."""
    header = json.dumps({"format": FORMAT, "config": dataclasses.asdict(config)})
    text = np.array(json.dumps(annotations, allow_nan=False))
    members = {"header": np.array(header), "annotations": text, **arrays}
    members = {
        f"{name}.npy": deflated(value) if isinstance(value, np.ndarray) else value
        for name, value in members.items()
    }
    if hasattr(path, "write"):
        write_zip(path, members)
        return
    path = os.fspath(path)
    with open(path if path.endswith(".npz") else f"{path}.npz", "wb") as file:
        write_zip(file, members)


def read_trace_file(path) -> tuple[CacheConfig, dict[str, np.ndarray], object]:
    """(config, arrays, annotations) of the trace file at `path`: arrays as ARRAYS names them
    (format 1 and 2 files converted, `numbakv.trace.upgrade`; not yet checked against each
    other: `check_arrays` does that), annotations as parsed from the JSON (not yet checked:
    `annotation_records` does that; [] for format 1); TraceError for anything else."""
    path = Path(path)
    header, arrays, annotations = npz.read(path, KIND, _read)
    try:
        config = CacheConfig(**header["config"])
    except (CacheError, TypeError, ValueError, KeyError, RecursionError) as error:
        reason = npz.reason(error)
        raise TraceError(f"{path} holds a bad cache config ({reason}); {ADVICE}") from None
    if "delta_owners" in arrays:
        arrays = upgrade.codes_and_toggles(config, arrays)
    return config, arrays, annotations


def _read(archive: zipfile.ZipFile, size: int) -> tuple[dict, dict[str, np.ndarray], object]:
    """(the parsed JSON header, the arrays, the parsed JSON annotations) of the trace's
    archive (a file of `size` bytes); the header's format is one of FORMATS and the members
    are that format's. Every member's header is checked before any array is read."""
    members = npz.members(archive, size, ("header",), (*ARRAYS, "delta_owners", "annotations"))
    header = npz.read_json(archive, members["header"], "header")
    if not isinstance(header, dict) or header.get("format") not in FORMATS:
        found = header.get("format") if isinstance(header, dict) else header
        formats = " or ".join(FORMATS)
        raise npz.Refused(f"its header names format {short_repr(found)}, not {formats}")
    has_annotations = header["format"] != FORMATS[0]
    if has_annotations != ("annotations" in members):
        raise npz.Refused(
            f"a {header['format']} file has "
            f"{'an' if has_annotations else 'no'} annotations.npy member; this one "
            f"{'lacks it' if has_annotations else 'has one'}"
        )
    names = BITSET_ARRAYS if header["format"] in OWNER_BITSETS else ARRAYS
    missing = [f"{name}.npy" for name in names if name not in members]
    if missing:
        raise npz.Refused(f"it has no {missing[0]} member, which a {header['format']} file has")
    for name, (dtype, n_dims) in names.items():
        npz.check_array(archive, members[name], dtype, (None,) * (n_dims + 1))
    arrays = {
        name: npz.read_array(archive, members[name], dtype, (None,) * (n_dims + 1))
        for name, (dtype, n_dims) in names.items()
    }
    annotations = []
    if has_annotations:
        annotations = npz.read_json(archive, members["annotations"], "annotations")
    return header, arrays, annotations
