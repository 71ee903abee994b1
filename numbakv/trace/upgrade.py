"""Format 1 and 2 traces (a whole owner bitset per change) as format 3's arrays: one owner
code per change, and the owner bits a change to a shared cell flips (numba-free).

The conversion trusts nothing but the bitsets' shape: whatever else is wrong with the file
`numbakv.trace.checks` finds in the converted arrays, as it would in the original ones.
"""

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import SHARED, owner_codes
from numbakv.trace.scan import bit_pairs, previous_changes, toggle_ids


def codes_and_toggles(config: CacheConfig, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Format 3's arrays from a format 1 or 2 file's (`numbakv.trace.file.BITSET_ARRAYS`):
    `delta_owners` [n_changes, n_owner_words] uint64 gives `delta_codes`, and, for each
    change to a shared cell, `toggle_counts` and `toggle_seqs` (the bits it gains, s, and
    loses, ~s, ids ascending). TraceError when the bitsets do
    not fit the changes or the config."""
    owners, cells = arrays["delta_owners"], arrays["delta_cells"]
    if owners.shape != (len(cells), config.n_owner_words):
        raise TraceError(
            f"trace owners have shape {owners.shape}; {len(cells)} changes of a cache with "
            f"max_seqs={config.max_seqs} need ({len(cells)}, {config.n_owner_words})"
        )
    codes = owner_codes(owners)
    shared = codes == SHARED
    previous = previous_changes({"delta_cells": cells})[shared]  # the same cell's change before
    before = np.zeros((len(previous), owners.shape[1]), dtype=np.uint64)
    before[previous >= 0] = owners[previous[previous >= 0]]
    counts, seqs = shared_toggles(codes, before, owners[shared])
    converted = {name: array for name, array in arrays.items() if name != "delta_owners"}
    converted["delta_codes"] = codes
    converted["toggle_counts"] = counts
    converted["toggle_seqs"] = seqs
    return converted


def shared_toggles(
    codes: np.ndarray, before: np.ndarray, after: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Format 3's `toggle_counts` ([n] int32) and `toggle_seqs` of changes with owner codes
    `codes` ([n] int32), given the owners before and after each change to SHARED ([k,
    words] uint64 each, those changes in order)."""
    rows, seqs = flips(before, after)
    counts = np.zeros(len(codes), dtype=np.int32)
    counts[codes == SHARED] = np.bincount(rows, minlength=len(before))
    return counts, seqs


def flips(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row int64, seq int32) of every owner bit that differs between `old` and `new` ([n,
    words] uint64 bitsets), rows ascending and ids ascending within a row: seq s where row
    gains owner s, ~s (-s - 1) where it loses s."""
    rows, seqs = [], []
    for word in range(old.shape[1]):
        for bits, gained in (
            (new[:, word] & ~old[:, word], True),
            (old[:, word] & ~new[:, word], False),
        ):
            row, bit = bit_pairs(bits)
            rows.append(row)
            seqs.append(64 * word + bit if gained else ~(64 * word + bit))
    rows = np.concatenate([np.zeros(0, np.int64), *rows])
    seqs = np.concatenate([np.zeros(0, np.int64), *seqs])
    order = np.lexsort((toggle_ids(seqs)[0], rows))
    return rows[order], seqs[order].astype(np.int32)
