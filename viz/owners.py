"""Who the pictures colour cells by: requests (when a trace's annotations bind sequences to
requests) or sequences, and colours that never collide silently.

A palette has a handful of colours one can tell apart; a workload has hundreds of owners.
The largest owners (by cell-steps held over the whole trace) get the palette's colours,
every other owner one "other" colour, and the figures say so ("128 sequences; the 9
largest shown"). Colours are fixed per trace, so every panel of a figure agrees. Cells only
the prefix cache's holders hold are no one's: CACHED, one colour (`numbakv.viz.holders`).
"""

from dataclasses import dataclass

import numpy as np
from matplotlib.colors import to_rgb

from numbakv.core.snapshot import Snapshot
from numbakv.trace.frames import Trace
from numbakv.trace.scan import request_table

from .holders import CACHED, cell_changes, change_index, holder_table

# Okabe & Ito's colour-blind-safe palette without its black (shared cells) and vermillion
# (too near read_len's red), then Paul Tol's wine, olive and indigo
PALETTE = (
    "#E69F00",
    "#56B4E9",
    "#009E73",
    "#F0E442",
    "#0072B2",
    "#CC79A7",
    "#882255",
    "#999933",
    "#332288",
)
FREE_COLOUR, SHARED_COLOUR = "#FFFFFF", "#000000"
MIXED_COLOUR = "#6A7F9A"  # slate: not a grey, which partly shared (black) pixels are
CACHED_COLOUR = "#B4C8E0"  # light grey-blue: cells held only by the prefix cache
OTHER_COLOUR, UNALLOCATED_COLOUR = "#D8C8A8", "#E4E4E4"
READ_LEN_COLOUR = "#D00000"  # read_len, in every panel
MARK_COLOUR = "#000000"  # the step a figure is about (dashed)
MIXED = -3  # a pixel no owner holds the majority of


@dataclass(frozen=True)
class Owners:
    """The owners of a trace's cells, grouped `by` "request" or "seq".

    labels        : group index -> "request 7" or "seq 3"
    seq_groups    : [n_frames, max_seqs] int32, each sequence id's group at each frame
                    ([1, max_seqs] for one table's picture)
    holders       : [n_frames, max_seqs] bool, the prefix cache's holders at each frame
                    (`numbakv.viz.holders.holder_table`; [1, max_seqs] for one table)
    totals        : [n_groups] int64, cell-steps each group holds alone over the trace
                    (cells holders alone hold count for no group)
    shown         : the groups with their own colour, largest first (at most len(PALETTE))
    colours       : [n_groups, 3] float64 RGB: PALETTE for `shown`, OTHER_COLOUR otherwise
    """

    by: str
    labels: tuple[str, ...]
    seq_groups: np.ndarray
    holders: np.ndarray
    totals: np.ndarray
    shown: tuple[int, ...]
    colours: np.ndarray

    @property
    def counts(self) -> tuple[int, int]:
        """(requests, sequences) holding a cell alone at some step: a sequence counts as
        its own owner for the steps it was bound to no request."""
        held = np.flatnonzero(self.totals)
        requests = sum(self.labels[g].startswith("request") for g in held.tolist())
        return requests, len(held) - requests

    @property
    def noun(self) -> str:
        """What the owners are: "requests", "sequences" or "owners" (both)."""
        requests, seqs = self.counts
        return "owners" if requests and seqs else "requests" if requests else "sequences"

    @property
    def title(self) -> str:
        """The legend's title: what colours stand for, and how many are not shown."""
        requests, seqs = self.counts
        kinds = [(n, noun) for n, noun in ((requests, "request"), (seqs, "sequence")) if n]
        if requests + seqs <= len(self.shown):
            return "by " + (" and ".join(noun for _, noun in kinds) or "sequence")
        counted = " and ".join(f"{n} {noun}{'s' * (n > 1)}" for n, noun in kinds)
        return f"{counted}; the {len(self.shown)} largest shown"

    @property
    def note(self) -> str | None:
        """What the figure must say when not every owner has its own colour, else None."""
        return None if sum(self.counts) <= len(self.shown) else self.title

    def rgb(self, labels: np.ndarray) -> np.ndarray:
        """[..., 3] float64 colours of pixel labels (group index, FREE, SHARED, MIXED or
        CACHED)."""
        special = (CACHED_COLOUR, MIXED_COLOUR, SHARED_COLOUR, FREE_COLOUR)  # -4 .. -1
        table = np.vstack([self.colours, [to_rgb(c) for c in special]])
        return table[np.where(labels >= 0, labels, len(self.colours) - CACHED + labels)]


def owners_of(trace: Trace, by: str | None = None) -> Owners:
    """The owners of `trace`'s pictures; `by` "request" (default when the annotations bind
    sequences to requests) or "seq". A sequence never bound stays its own group."""
    bindings = trace.seq_bindings()
    by = by or ("request" if len(bindings) else "seq")
    if by not in ("request", "seq"):
        raise ValueError(f"by={by!r}: colour cells by 'request' or 'seq'")
    n_frames, max_seqs = trace.n_frames, trace.config.max_seqs
    seq_groups = np.broadcast_to(np.arange(max_seqs, dtype=np.int32), (n_frames, max_seqs)).copy()
    labels = [f"seq {s}" for s in range(max_seqs)]
    if by == "request" and len(bindings):
        requests = np.unique(bindings[:, 2])
        labels += [f"request {r}" for r in requests.tolist()]
        table = request_table(bindings, n_frames, max_seqs)
        bound = table >= 0
        seq_groups[bound] = max_seqs + np.searchsorted(requests, table[bound])
    holders = holder_table(trace)
    totals = _cell_steps(trace, cell_changes(trace, holders), seq_groups, len(labels))
    return _ranked(by, labels, seq_groups, holders, totals)


def snapshot_owners(snapshot: Snapshot) -> Owners:
    """The owners of one table's picture: its sequences, ranked by the cells each holds."""
    codes, max_seqs = snapshot.codes, len(snapshot.live)
    totals = np.bincount(codes[codes >= 0], minlength=max_seqs).astype(np.int64)
    seq_groups, holders = np.arange(max_seqs)[None], np.zeros((1, max_seqs), bool)  # one frame
    return _ranked("seq", [f"seq {s}" for s in range(max_seqs)], seq_groups, holders, totals)


def _ranked(
    by: str, labels: list[str], seq_groups: np.ndarray, holders: np.ndarray, totals: np.ndarray
) -> Owners:
    """Owners with PALETTE given to the largest groups, largest first."""
    ranked = [g for g in np.argsort(-totals, kind="stable").tolist() if totals[g] > 0]
    shown = tuple(ranked[: len(PALETTE)])
    colours = np.tile(to_rgb(OTHER_COLOUR), (len(labels), 1))
    for colour, group in zip(PALETTE, shown, strict=False):
        colours[group] = to_rgb(colour)
    return Owners(by, tuple(labels), seq_groups, holders, totals, shown, colours)


def _cell_steps(
    trace: Trace, changes: dict[str, np.ndarray], seq_groups: np.ndarray, n_groups: int
) -> np.ndarray:
    """[n_groups] int64: summed over the recorded steps, the cells each group holds alone
    (a sequence's cells counted for the group it has at that step); `changes` the trace's
    changes as visible codes (`numbakv.viz.holders.cell_changes`)."""
    index = change_index(trace, changes)
    codes, frames, previous = changes["codes"], index.frames, index.previous
    ids = np.unique(codes[codes >= 0])  # the sequences that ever hold a cell alone
    alone = np.zeros((trace.n_frames, len(ids)), dtype=np.int64)  # its change per frame
    gains, losses = codes >= 0, (previous >= 0) & (codes[np.maximum(previous, 0)] >= 0)
    np.add.at(alone, (frames[gains], np.searchsorted(ids, codes[gains])), 1)
    lost = codes[previous[losses]]
    np.add.at(alone, (frames[losses], np.searchsorted(ids, lost)), -1)
    steps = trace.step_frames
    held = np.cumsum(alone, axis=0)[steps]  # [n_steps, ids]
    return np.bincount(seq_groups[steps][:, ids].ravel(), held.ravel(), n_groups).astype(np.int64)
