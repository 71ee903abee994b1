"""Saved states in op scripts: each side of a `Runner` keeps the states its save ops made,
so that a load op of a save op's index loads, on each side, the state that side saved
(docs/contract.md §12, §13), and the reference's cells no step wrote stay known through a
save and a load (their K/V are undefined: attention over them is not compared)."""

from dataclasses import replace

import numpy as np


def by_position(snapshot, seq: int) -> dict[int, int]:
    """{position: cell} of the cells `seq` owns in `snapshot`."""
    held = np.flatnonzero((snapshot.owners[:, seq >> 6] >> np.uint64(seq & 63)) & np.uint64(1))
    return dict(zip(snapshot.pos[held].tolist(), held.tolist(), strict=True))


class SavedStates:
    """The states of the save ops run so far, per side, and their unwritten positions."""

    def __init__(self):
        self.saved: tuple[list, list] = ([], [])  # per side, per save op: a state or None
        self.holes: list = []  # per save op, per layer the saved positions no step wrote

    def side(self, op, side: int):
        """`op` as side 0 (the reference) or 1 runs it: a load of a save op's index loads
        the state that side saved there (the index as is, refused, when it saved none)."""
        if op.verb != "load" or type(op.args[0]) is not int:
            return op
        states = self.saved[side]
        state = states[op.args[0]] if op.args[0] < len(states) else None
        return op if state is None else replace(op, args=(state, *op.args[1:]))

    def keep(self, op, expected, got, reference, unwritten: list[set]) -> None:
        """After `op` ran with (result, error) `expected` on the reference and `got` on the
        cache: a save op's states and holes kept; a load's new cells of holes unwritten."""
        if op.verb == "save":
            for side, (result, error) in enumerate((expected, got)):
                self.saved[side].append(result if error is None else None)
            holes = None
            if expected[1] is None:
                seq, start = op.args
                cells = by_position(reference.snapshot(), seq)
                holes = [{p for p, c in cells.items() if c in layer and p >= start}
                         for layer in unwritten]  # fmt: skip
            self.holes.append(holes)
        source = op.args[0] if op.verb == "load" else None
        if type(source) is int and source < len(self.holes) and expected[1] is None:
            copy = by_position(reference.snapshot(), expected[0])
            for cells, holes in zip(unwritten, self.holes[source] or (), strict=False):
                cells |= {copy[p] for p in holes if p in copy}
