"""numbakv.trace: a cache's cell table recorded over a workload, and the `.npz` file that
keeps it (numba-free). `Recorder`, `Trace` and `load_trace` are `numbakv`'s names.

    recorder  `Recorder`: a frame per step (or verb) through the cache's observer hook, and
              the caller's annotations between frames
    frames    `Trace`: the frames replayed as `Snapshot`s, the steps, the figures plots
              draw; `load_trace`
    file      the file format: its arrays, writing, and reading without trusting the file
    checks    the invariants a trace's arrays and annotations hold
    sweep     the table swept once over every change: what each change found before it,
              and the table's rules read off all the changes at once (for checks)
    free_runs the largest run of free cells after each frame
    scan      figures computed from the recorded changes, never a table per frame
"""

from numbakv.trace.frames import Annotation, TraceStep

__all__ = ["Annotation", "TraceStep"]  # Recorder, Trace and load_trace: `numbakv`'s
