"""A text map of the pool for terminals: one character per cell."""

import string
from collections.abc import Callable, Mapping

from numbakv.core.snapshot import FREE, SHARED, Snapshot

SEQ_CHARS = string.ascii_lowercase + string.ascii_uppercase
CHARS = {FREE: ".", SHARED: "*"}
MANY, READ_LEN, UNLABELLED = "#", "|", "?"
RESERVED = (*CHARS.values(), MANY, READ_LEN, UNLABELLED)  # what no label may be


def cell_char(code: int) -> str:
    """`.` free, `*` shared, a letter per sequence id (a = 0 … Z = 51, `#` past that)."""
    if code in CHARS:
        return CHARS[code]
    return SEQ_CHARS[code] if code < len(SEQ_CHARS) else MANY


def render_text(
    snapshot: Snapshot, columns: int = 64, labels: Mapping[int, str] | None = None
) -> str:
    """The pool's allocated rows as lines of `columns` cells, `|` marking read_len.

    labels : None, a letter per sequence id (`cell_char`); or {sequence id: one character}
             to draw each sequence's cells with, e.g. its request's letter (a sequence it
             leaves out is drawn `?`); no label may be one of `. * # | ?`

    Each line starts with the index of its first cell:

        0 aaaab*bb..cc|....
    """
    chars_of = cell_char if labels is None else _labelled(labels)
    codes = snapshot.codes.tolist()
    n_cells = max(snapshot.rows, snapshot.read_len)
    chars = [chars_of(code) for code in codes] + [CHARS[FREE]] * (n_cells - len(codes))
    marker_line, cut = divmod(snapshot.read_len, columns)
    if cut == 0 and snapshot.read_len == n_cells > 0:  # the marker ends the last full line
        marker_line, cut = marker_line - 1, columns
    digits = len(str(max(n_cells - 1, 0)))
    lines = []
    for i, start in enumerate(range(0, max(n_cells, 1), columns)):
        line = "".join(chars[start : start + columns])
        if i == marker_line:
            line = line[:cut] + READ_LEN + line[cut:]
        lines.append(f"{start:>{digits}} {line}")
    return "\n".join(lines)


def _labelled(labels: Mapping[int, str]) -> Callable[[int], str]:
    """`cell_char` with `labels` for the sequence ids; TypeError or ValueError naming a bad
    entry."""
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of sequence id to one character, got {labels!r}")
    for seq, label in labels.items():
        if isinstance(seq, bool) or not isinstance(seq, int) or not isinstance(label, str):
            raise TypeError(f"labels maps sequence ids (ints) to str; got {seq!r}: {label!r}")
        if len(label) != 1 or label in RESERVED or not label.isprintable() or label.isspace():
            raise ValueError(
                f"label {label!r} of sequence {seq} must be one printable character, not a "
                f"space nor one of {' '.join(RESERVED)}"
            )
    return lambda code: CHARS[code] if code in CHARS else labels.get(code, UNLABELLED)
