"""A trace file's members, read and rewritten: the annotation and format tests' tools."""

import io
import json
import zipfile
from pathlib import Path

import numpy as np

from numbakv import load_trace
from numbakv.trace.scan import TableReplay

from helpers import npy


def members_of(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def write_zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def with_members(path, tmp_path, **members) -> Path:
    """A copy of the file at `path` with members replaced (bytes) or dropped (None)."""
    found = members_of(path)
    for name, data in members.items():
        if data is None:
            del found[f"{name}.npy"]
        else:
            found[f"{name}.npy"] = data
    return write_zip(tmp_path / "changed.npz", found)


def header_of(format_: str, path) -> bytes:
    header = json.loads(str(np.load(io.BytesIO(members_of(path)["header.npy"]))))
    return npy(np.array(json.dumps(header | {"format": format_})))


def bitsets(path) -> dict[str, bytes | None]:
    """The members that turn the format 3 file at `path` into a format 1 or 2 one: each
    change's whole owner bitset (`delta_owners`) instead of its code and toggles."""
    trace = load_trace(path)
    replay = TableReplay(trace.arrays, trace.config.capacity, trace.config.n_owner_words)
    owners = [replay.owners[replay.apply(f)] for f in range(trace.n_frames)]
    return {"delta_owners": npy(np.concatenate(owners)), "delta_codes": None,
            "toggle_counts": None, "toggle_seqs": None}  # fmt: skip
