"""The launch budget of a step (docs/contract.md §8.1): its numbers, the steps measured
(Case), what one of them did (Measurement), and each way it is past the budget
(`Measurement.breaches`).

A mask launch is one of a kernel whose name holds "mask" and does not start with "attend"
(`write_mask`; `attend_masked_*` are attention). It counts against the step, wherever it
happens (eagerly in prepare_step, or lazily at the first masked attend or mask()), and not
against a layer's launches.
"""

from dataclasses import dataclass, field

from numbakv.testing.launches import DeviceCalls, is_default_stream

PREPARE_LAUNCHES, PREPARE_COPIES = 1, 1  # declare_step + prepare_step, 0 allocations
STEP_MASK_LAUNCHES = 1  # in a step with a masked attend or a mask() read, else 0
LAYER_LAUNCHES = 3  # write + attend with device inputs: 0 copies, allocations, syncs
HOST_LAYER_COPIES = 3  # write + attend of NumPy K, V and q: their uploads, 0 allocations
MASK_READ_COPIES = 1  # mask() read on a step: the mask coming back, 0 allocations


def is_mask_launch(name: str) -> bool:
    """True for a kernel that writes masks (write_mask), not the masked attention kernels."""
    return "mask" in name and not name.startswith("attend")


def non_mask_launches(calls: DeviceCalls) -> int:
    """The launches of `calls` that are not mask launches."""
    return sum(1 for launch in calls.launches if not is_mask_launch(launch.name))


@dataclass(frozen=True)
class Case:
    """One measured step.

    shape     : "decode" (one token per sequence) or "prefill" (a chunk of two sequences)
    mode      : the attend mode, "gathered" or "masked"
    inputs    : "device" (K, V, q device arrays made beforehand, `out=` preallocated),
                "lent" (the same without `out=`: the cache lends it) or "host" (NumPy
                arrays, no `out=`: uploaded into lent arrays). Steps with lent arrays are
                measured in the steady state: the same step once before, uncounted, made
                the blocks the cache lends (`numbakv.cache.lending`)
    read_mask : step.mask(window) is read after the layers
    """

    shape: str
    mode: str
    inputs: str = "device"
    read_mask: bool = False

    @property
    def name(self) -> str:
        inputs = {"device": "device+out", "lent": "device"}.get(self.inputs, self.inputs)
        return f"{self.shape} {self.mode} {inputs}" + (" +mask()" if self.read_mask else "")

    @property
    def has_mask_work(self) -> bool:
        """The step needs a mask: a masked attend or a mask() read."""
        return self.mode == "masked" or self.read_mask


CASES = (
    Case("decode", "gathered"),
    Case("decode", "masked"),
    Case("prefill", "gathered"),
    Case("prefill", "masked"),
    Case("decode", "gathered", read_mask=True),
    Case("prefill", "gathered", read_mask=True),
    Case("decode", "gathered", "lent"),
    Case("prefill", "masked", "lent"),
    Case("decode", "gathered", "host"),
    Case("decode", "masked", "host"),
    Case("prefill", "gathered", "host"),
    Case("prefill", "masked", "host"),
)


@dataclass
class Measurement:
    """What one step did: the whole step's calls, and its parts.

    prepare   : declare_step + prepare_step
    layers    : write + attend of each layer
    mask_read : step.mask(window), None when not read
    """

    case: Case
    calls: DeviceCalls
    prepare: DeviceCalls
    layers: list[DeviceCalls]
    mask_read: DeviceCalls | None
    passed_stream: object = None  # the stream given to prepare_step, None for the cache's own
    own_streams: list = field(default_factory=list)  # the streams the cache made

    def __repr__(self) -> str:
        return f"Measurement({self.case.name}: {self.calls!r})"

    @property
    def mask_launches(self) -> int:
        return sum(1 for launch in self.calls.launches if is_mask_launch(launch.name))

    def stream_name(self, stream: object) -> str:
        """Whose `stream` is: "default", "given" (to prepare_step), "own" (made by the
        cache) or "other"."""
        if is_default_stream(stream):
            return "default"
        if self.passed_stream is not None and stream is self.passed_stream:
            return "given"
        return "own" if any(stream is s for s in self.own_streams) else "other"

    @property
    def replay_keys(self) -> list[tuple]:
        """Launch.replay_key of every launch of the step, in order."""
        return [launch.replay_key for launch in self.calls.launches]

    def breaches(self) -> list[str]:
        """Each way this step is past the budget, one line each; empty when within."""
        prepare, read = self.prepare, self.mask_read
        found = [
            f"declare_step+prepare_step: {got} {what} > {most}"
            for what, got, most in (
                ("launches besides masks", non_mask_launches(prepare), PREPARE_LAUNCHES),
                ("copies", prepare["copies"], PREPARE_COPIES),
                ("allocations", prepare["allocations"], 0),
            )
            if got > most
        ]
        most = STEP_MASK_LAUNCHES if self.case.has_mask_work else 0
        if self.mask_launches > most:
            why = "with" if self.case.has_mask_work else "without"
            found.append(
                f"mask launches: {self.mask_launches} > {most} in a step {why} a masked "
                "attend or mask()"
            )
        found += self._layer_breaches()
        if read is not None:
            found += [
                f"mask(): {got} {what} > {most}"
                for what, got, most in (
                    ("copies", read["copies"], MASK_READ_COPIES),
                    ("allocations", read["allocations"], 0),
                )
                if got > most
            ]
        on_default = self.calls.on_default_stream()
        if on_default:
            names = ", ".join(sorted({call.name for call in on_default}))
            found.append(
                f"stream: {len(on_default)} launches/copies on the default stream ({names})"
            )
        return found

    def _layer_breaches(self) -> list[str]:
        """One line per kind of call some layers make too many of, naming those layers."""
        found = []
        copies = HOST_LAYER_COPIES if self.case.inputs == "host" else 0
        for what, count, most in (
            ("launches besides masks", non_mask_launches, LAYER_LAUNCHES),
            ("copies", lambda calls: calls["copies"], copies),
            ("allocations", lambda calls: calls["allocations"], 0),
            ("synchronizations", lambda calls: calls["synchronizations"], 0),
        ):
            over = [(i, count(calls)) for i, calls in enumerate(self.layers)]
            where = ", ".join(f"layer {i}: {got}" for i, got in over if got > most)
            if where:
                found.append(f"{where} {what} > {most}")
        return found
