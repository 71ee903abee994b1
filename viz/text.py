"""A text map of the pool for terminals: one character per cell."""

import string

from numbakv.snapshot import FREE, SHARED, Snapshot

SEQ_CHARS = string.ascii_lowercase + string.ascii_uppercase
CHARS = {FREE: ".", SHARED: "*"}
MANY, READ_LEN = "#", "|"


def cell_char(code: int) -> str:
    """`.` free, `*` shared, a letter per sequence id (a = 0 … Z = 51, `#` past that)."""
    if code in CHARS:
        return CHARS[code]
    return SEQ_CHARS[code] if code < len(SEQ_CHARS) else MANY


def render_text(snapshot: Snapshot, columns: int = 64) -> str:
    """The pool's allocated rows as lines of `columns` cells, `|` marking read_len.

    Each line starts with the index of its first cell:

        0 aaaab*bb..cc|....
    """
    codes = snapshot.codes.tolist()
    n_cells = max(snapshot.rows, snapshot.read_len)
    chars = [cell_char(code) for code in codes] + [CHARS[FREE]] * (n_cells - len(codes))
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
