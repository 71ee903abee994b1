"""Progress of long drawing on stderr: one line, updated in place, for work past a second."""

import sys
import time


class Progress:
    """`progress(done, total)` callback writing "LABEL: done/total UNIT" on one stderr line,
    rewritten at most five times a second (and at the end) once `after` seconds have
    passed; `close()` ends the line (if one was written). Quiet work stays quiet."""

    def __init__(self, label: str, unit: str = "steps", after: float = 1.0, stream=None):
        self.label, self.unit, self.after = label, unit, after
        self.stream = stream or sys.stderr
        self.started = self.shown = time.monotonic()
        self.written = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.started < self.after or (done < total and now - self.shown < 0.2):
            return  # the last update is always shown, once past `after`
        self.shown, self.written = now, True
        self.stream.write(f"\r{self.label}: {done}/{total} {self.unit}")
        self.stream.flush()

    def close(self) -> None:
        if self.written:
            self.stream.write("\n")
            self.stream.flush()
