"""Warp-level primitives for numba's CUDA simulator (numba-cuda 0.30), which has none, so
that one kernel source runs on a GPU and on the simulator: the shuffles, votes and matches,
`syncwarp`, `activemask` and `lanemask_lt`, called and typed as numba-cuda's own
(`numba/cuda/intrinsics.py`, `cudadecl.py`). `numbakv.cache.simulator.install` sets
`PATCHES` on numba's `FakeCUDAModule` (the `cuda` a simulated kernel sees) and makes its
block runner keep one `Warps` per block, where the primitives meet; `uninstall` takes them
off. The simulator's own `laneid` and `warpsize` stay.

A warp is 32 consecutive linear thread ids of a block (x + y*bx + z*bx*by) and a lane is the
id modulo 32. A primitive is a meeting: each lane its mask names calls it, brings its value
and waits; once all have come, each takes its result. Where a GPU hangs or leaves the result
undefined, the choices are these:

- Lanes past the end of the block (lanes 16-31 of a 16-thread block) are absent: a mask
  names only the lanes present, as a full mask does on a GPU.
- Meetings are per mask: lanes calling with different masks meet apart (two half warps,
  each with its own mask, at once); one mask's lanes must call the same primitive.
- A shuffle reads lane `src_lane`, `lane - delta`, `lane + delta` or `lane ^ lane_mask`,
  with the operand's low 5 bits (PTX's `b[4:0]`: src_lane 33 is lane 1, delta 32 is 0).
  When that lane is outside the warp (up, down), absent or not in the mask, the caller
  gets its own value back: what a GPU gives outside the warp, and here the one defined
  result where a GPU's is undefined (a source lane absent or not in the mask).
- RuntimeError, never a hang: a caller its mask does not name; one mask's lanes at
  different primitives; a lane of the mask that returned from the kernel (before or while
  the others wait); and, raised in the launching thread by the block runner, every live
  thread of the block waiting while a meeting still lacks a lane (one in `syncthreads`, or
  at a meeting of another mask). A thread's exception aborts the block's meetings too.
- `activemask()` returns the lanes that call it at the same place (code and instruction)
  once every other lane of the warp present has returned or waits (in `syncthreads` or at
  a meeting): converged code gets every lane still running, each branch of a divergent
  `if` its own lanes.
- Results have the GPU's types: a shuffle keeps the caller's value type; `ballot_sync` and
  `match_any_sync` give int32 (lane 31 is the sign bit: `ballot >> 31 & 1`, not `ballot &
  (1 << 31)`, which NumPy refuses for an int32), `all_sync`, `any_sync` and `eq_sync` bool,
  `activemask` and `lanemask_lt` uint32, `match_all_sync` (int32, bool). Any number
  shuffles here; numba-cuda's GPU shuffles only int32, int64, float32 and float64.
- `popc`: numba's counts the '1's of `bin(val)`, so -1 (a ballot of a full warp) counts 1;
  this one counts the two's complement bits at the value's width (a Python int is an
  int64, as on a GPU).
"""

import sys
import threading

import numpy as np

WARP = 32
FULL = 0xFFFFFFFF  # every lane of a warp


class Warps:
    """The meetings of one block's warps. `numbakv.cache.simulator`'s block runner makes one
    per block before its threads start (`threads`: the block's BlockThreads), tells it of
    each thread that returns from the kernel (`returned`), asks it whether the block is
    stuck while its threads wait (`stuck`) and aborts it with the block (`abort`)."""

    def __init__(self, threads: list):
        self.threads = sorted(threads, key=lambda t: t.thread_id)  # index: linear id
        self.changed = threading.Condition()
        self.meetings: dict = {}  # (warp, mask) or (warp, place) of activemask -> _Meeting
        self.waiting: dict = {}  # thread id -> the open meeting it waits at
        self.gone: set = set()  # ids of the threads that returned from the kernel
        self.failure: str | None = None  # why the block aborted, once it has

    def present(self, warp: int) -> int:
        """The lanes of `warp` that exist in the block, as a mask."""
        return (1 << min(WARP, len(self.threads) - warp * WARP)) - 1

    def meet(self, thread, name: str, mask, value=None, operand=None, place=None):
        """Brings `value` and `operand` from `thread` to its meeting at primitive `name`
        and returns its result once every lane has come. `place`: activemask's call site,
        which keys its meetings instead of a mask."""
        warp, lane = divmod(thread.thread_id, WARP)
        if not int(mask) >> lane & 1:
            raise RuntimeError(
                f"{name}: lane {lane} of warp {warp} calls it with mask "
                f"{int(mask) & FULL:#010x}, which does not name it"
            )
        mask = int(mask) & self.present(warp)
        key = (warp, mask) if place is None else (warp, place)
        with self.changed:
            if self.failure is not None or thread.abort:
                raise RuntimeError(f"abort flag set on {name} call")
            meeting = self.meetings.setdefault(key, _Meeting(name, mask, warp, place))
            meeting.brought[lane] = name, value, operand
            self.waiting[thread.thread_id] = meeting
            if place is None and _returned(self, meeting):
                self._close(key, self._why(meeting))
            elif place is None and len(meeting.brought) == meeting.mask.bit_count():
                self._close(key)
            self._settle()
            self.changed.wait_for(lambda: meeting.done or self.failure is not None)
            if not meeting.done:
                raise RuntimeError(f"abort flag set on {name} wait")
            if meeting.error is not None:
                raise RuntimeError(meeting.error)
            return meeting.results[lane]

    def returned(self, thread) -> None:
        """`thread` returned from the kernel: a meeting of a mask naming it fails."""
        warp, lane = divmod(thread.thread_id, WARP)
        with self.changed:
            self.gone.add(thread.thread_id)
            for key, meeting in list(self.meetings.items()):
                if meeting.place is None and meeting.warp == warp and meeting.mask >> lane & 1:
                    self._close(key, self._why(meeting))
            self._settle()

    def stuck(self, live: list) -> str | None:
        """Why the block can never finish, or None: every thread of `live` (the block's
        threads still alive) has returned or waits, in syncthreads or at a meeting, while a
        meeting lacks a lane. The block runner asks while not all wait in syncthreads."""
        if not self.meetings:
            return None
        with self.changed:
            self._settle()
            if not self.meetings or not all(self._waits(t.thread_id) for t in live):
                return None
            meetings = sorted(self.meetings.values(), key=lambda m: (m.warp, m.mask))
            return "; ".join(self._why(meeting) for meeting in meetings)

    def abort(self, why: str) -> None:
        """Every lane waiting at a meeting raises RuntimeError, and so does any that comes."""
        with self.changed:
            self.failure = self.failure or why
            self.changed.notify_all()

    def _waits(self, thread_id: int) -> bool:
        """Whether the thread returned or waits: it cannot come to a meeting by itself."""
        thread = self.threads[thread_id]
        return thread_id in self.gone or thread_id in self.waiting or thread.syncthreads_blocked

    def _settle(self) -> None:
        """Closes each activemask meeting whose warp's other lanes all returned or wait."""
        for key, meeting in list(self.meetings.items()):
            if meeting.place is None:
                continue
            base = meeting.warp * WARP
            lanes = range(self.present(meeting.warp).bit_length())
            if all(lane in meeting.brought or self._waits(base + lane) for lane in lanes):
                self._close(key)

    def _close(self, key: tuple, error: str | None = None) -> None:
        """Ends the meeting at `key`: its lanes take their results, or raise `error`."""
        meeting = self.meetings.pop(key)
        for lane in meeting.brought:
            del self.waiting[meeting.warp * WARP + lane]
        calls: dict = {}  # primitive -> the mask of the lanes that called it
        for lane, (name, _, _) in meeting.brought.items():
            calls[name] = calls.get(name, 0) | 1 << lane
        if error is None and len(calls) > 1:
            error = (
                f"warp {meeting.warp}{self._block()}: lanes of mask {meeting.mask:#010x} "
                "call different primitives: "
                + ", ".join(f"{_lanes(lanes)} {name}" for name, lanes in sorted(calls.items()))
            )
        meeting.error = error
        if error is None:
            meeting.results = RESULTS[meeting.name](meeting)
        meeting.done = True
        self.changed.notify_all()

    def _why(self, meeting) -> str:
        """What `meeting` waits for, lane by lane."""
        base = meeting.warp * WARP
        states: dict = {}  # state -> the mask of its lanes
        for lane in range(WARP):
            if meeting.mask >> lane & 1 and lane not in meeting.brought:
                state = self._state(base + lane)
                states[state] = states.get(state, 0) | 1 << lane
        missing = " and ".join(f"{_lanes(lanes)} {state}" for state, lanes in states.items())
        return (
            f"{meeting.name}(mask={meeting.mask:#010x}) in warp {meeting.warp}{self._block()}: "
            f"{_lanes(_mask(meeting.brought))} {'wait' if len(meeting.brought) > 1 else 'waits'} "
            f"for {missing}"
        )

    def _state(self, thread_id: int) -> str:
        """Where a thread that has not come to a meeting is, in words."""
        if thread_id in self.gone:
            return "(returned from the kernel)"
        if thread_id in self.waiting:
            other = self.waiting[thread_id]
            return f"(waiting at {other.name}, mask {other.mask:#010x})"
        if self.threads[thread_id].syncthreads_blocked:
            return "(waiting in syncthreads)"
        return "(running)"

    def _block(self) -> str:
        return f" of block {self.threads[0].blockIdx}"


class _Meeting:
    """One meeting of a warp's lanes at a primitive: what each lane brought (lane ->
    (primitive, value, operand)), then their results (lane -> result) or an error."""

    def __init__(self, name: str, mask: int, warp: int, place):
        self.name, self.mask, self.warp, self.place = name, mask, warp, place
        self.brought: dict = {}
        self.results: dict | None = None
        self.error: str | None = None
        self.done = False


def _returned(warps: Warps, meeting: _Meeting) -> bool:
    """Whether a lane of the meeting's mask already returned from the kernel."""
    base = meeting.warp * WARP
    return any(meeting.mask >> lane & 1 and base + lane in warps.gone for lane in range(WARP))


def _mask(lanes) -> int:
    return sum(1 << lane for lane in lanes)


def _lanes(mask: int) -> str:
    """'lane 3', 'lanes 0-30' or 'lanes 0, 2, 4-7': the lanes of a mask, in words."""
    runs, lane = [], 0
    while lane < WARP:
        if mask >> lane & 1:
            end = lane
            while end + 1 < WARP and mask >> end + 1 & 1:
                end += 1
            runs.append(str(lane) if end == lane else f"{lane}-{end}")
            lane = end
        lane += 1
    return ("lane " if mask.bit_count() == 1 else "lanes ") + ", ".join(runs)


# -- results: what each lane of a full meeting takes (lane -> result) ----------------------


def _shuffled(meeting: _Meeting) -> dict:
    """Each lane's source lane's value in the caller's type, or its own (see the module)."""
    results = {}
    for lane, (name, own, operand) in meeting.brought.items():
        b = int(operand) & (WARP - 1)
        source = {
            "shfl_sync": b,
            "shfl_up_sync": lane - b,
            "shfl_down_sync": lane + b,
            "shfl_xor_sync": lane ^ b,
        }[name]
        found = meeting.brought.get(source)  # None outside the warp, absent or not in mask
        results[lane] = own if found is None else _like(own, found[1])
    return results


def _like(own, value):
    """`value` in the type of `own`."""
    return own.dtype.type(value) if isinstance(own, np.generic) else type(own)(value)


def _int32(bits: int) -> np.int32:
    return np.uint32(bits).view(np.int32)


def _votes(meeting: _Meeting) -> list[bool]:
    return [bool(predicate) for _, predicate, _ in meeting.brought.values()]


def _voted(meeting: _Meeting) -> list[int]:
    """The lanes whose predicate is true."""
    return [lane for lane, (_, predicate, _) in meeting.brought.items() if predicate]


def _bits(value) -> bytes:
    return np.asarray(value).tobytes()


def _matches(meeting: _Meeting) -> dict:
    """Each lane's mask of the lanes whose value has its value's bits."""
    values = {lane: value for lane, (_, value, _) in meeting.brought.items()}
    same = lambda own, value: _bits(_like(own, value)) == _bits(own)  # noqa: E731
    return {
        lane: _mask(other for other, value in values.items() if same(own, value))
        for lane, own in values.items()
    }


def _match_all(meeting: _Meeting) -> dict:
    same = all(m == meeting.mask for m in _matches(meeting).values())
    result = (_int32(meeting.mask), True) if same else (np.int32(0), False)
    return dict.fromkeys(meeting.brought, result)


RESULTS = {
    **dict.fromkeys(("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync"), _shuffled),
    "ballot_sync": lambda m: dict.fromkeys(m.brought, _int32(_mask(_voted(m)))),
    "all_sync": lambda m: dict.fromkeys(m.brought, all(_votes(m))),
    "any_sync": lambda m: dict.fromkeys(m.brought, any(_votes(m))),
    "eq_sync": lambda m: dict.fromkeys(m.brought, len(set(_votes(m))) == 1),
    "match_any_sync": lambda m: {lane: _int32(bits) for lane, bits in _matches(m).items()},
    "match_all_sync": _match_all,
    "syncwarp": lambda m: dict.fromkeys(m.brought),
    "activemask": lambda m: dict.fromkeys(m.brought, np.uint32(_mask(m.brought))),
}  # fmt: skip


# -- the calls a kernel makes: `FakeCUDAModule`'s methods while installed ------------------


def _meet(name: str, mask, value=None, operand=None, place=None):
    thread = threading.current_thread()
    warps = getattr(getattr(thread, "_manager", None), "warps", None)
    if warps is None:
        raise RuntimeError(f"{name} needs numbakv's block runner (numbakv.cache.simulator.install)")
    return warps.meet(thread, name, mask, value, operand, place)


def shfl_sync(self, mask, value, src_lane):
    """`value` of lane `src_lane` % 32 of the warp."""
    return _meet("shfl_sync", mask, value, src_lane)


def shfl_up_sync(self, mask, value, delta):
    """`value` of lane `laneid - delta`; the caller's own below lane 0."""
    return _meet("shfl_up_sync", mask, value, delta)


def shfl_down_sync(self, mask, value, delta):
    """`value` of lane `laneid + delta`; the caller's own past lane 31."""
    return _meet("shfl_down_sync", mask, value, delta)


def shfl_xor_sync(self, mask, value, lane_mask):
    """`value` of lane `laneid ^ lane_mask`."""
    return _meet("shfl_xor_sync", mask, value, lane_mask)


def ballot_sync(self, mask, predicate):
    """int32: bit i set for each lane i of the mask whose predicate is true."""
    return _meet("ballot_sync", mask, predicate)


def all_sync(self, mask, predicate):
    """Whether every lane of the mask has a true predicate."""
    return _meet("all_sync", mask, predicate)


def any_sync(self, mask, predicate):
    """Whether a lane of the mask has a true predicate."""
    return _meet("any_sync", mask, predicate)


def eq_sync(self, mask, predicate):
    """Whether the lanes of the mask all have the same predicate."""
    return _meet("eq_sync", mask, predicate)


def match_any_sync(self, mask, value):
    """int32: the lanes of the mask whose `value` has the caller's value's bits."""
    return _meet("match_any_sync", mask, value)


def match_all_sync(self, mask, value):
    """(int32 mask, bool): (the mask, True) when its lanes' values all agree, else (0, False)."""
    return _meet("match_all_sync", mask, value)


def syncwarp(self, mask=FULL):
    """Waits for the lanes of the mask."""
    _meet("syncwarp", mask)


def activemask(self):
    """uint32: the lanes of the warp converged here (see the module)."""
    frame = sys._getframe(1)
    return _meet("activemask", FULL, place=(frame.f_code, frame.f_lasti))


def lanemask_lt(self):
    """uint32: the lanes below the caller's."""
    return np.uint32((1 << threading.current_thread().thread_id % WARP) - 1)


def popc(self, val):
    """The set bits of `val`'s two's complement at its width (a Python int's: 64)."""
    width = val.dtype.itemsize * 8 if isinstance(val, np.integer) else 64
    return (int(val) & ((1 << width) - 1)).bit_count()


# FakeCUDAModule attribute -> what install sets
PATCHES = {
    function.__name__: function
    for function in (
        shfl_sync, shfl_up_sync, shfl_down_sync, shfl_xor_sync, ballot_sync, all_sync,
        any_sync, eq_sync, match_any_sync, match_all_sync, syncwarp, activemask, lanemask_lt,
        popc,
    )
}  # fmt: skip
