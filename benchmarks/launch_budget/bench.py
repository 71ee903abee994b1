"""The small device cache the launch budget is measured on, and one step of it measured
under a counter (`Bench.measure`).

The cache: 2 KV heads and 4 query heads of 16, capacity 256 allocated at the first step (no
growth later), max_width 16, the first half of the layers global and the rest of window 8
(two masks), 4 sequences with a history. Decode steps: one token of each sequence (width
4); prefill steps: 6 tokens of each of two sequences (width 12). `prepare_step(stream=)` and
`attend(out=)` are passed only when the cache's signatures take them.
"""

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from benchmarks.launch_budget.rules import Case, Measurement
from numbakv.cache.cuda import cuda
from numbakv.core.config import CacheConfig
from numbakv.testing.launches import DeviceCalls, count_device_calls

N_KV_HEADS, N_HEADS, HEAD_DIM = 2, 4, 16
CAPACITY, MAX_WIDTH, MAX_SEQS = 256, 16, 8
WINDOW = 8  # the sliding window of the second half of the layers; the first half is global
HISTORY = (5, 9, 13, 7)  # positions each sequence holds before the measured steps
PREFILL_CHUNK = 6  # tokens per sequence in a prefill step (two sequences: width 12)


def accepts(method: Callable, name: str) -> bool:
    """True when `method`'s signature has a parameter `name`."""
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


@dataclass
class Bench:
    """A small device cache with history, and the inputs of its steps. Device inputs are
    made once per width and reused, so that two identical steps pass the same device arrays
    (what a replay needs)."""

    cache: object
    seqs: list[int]
    construction: DeviceCalls = field(repr=False)  # what building the cache did
    seed: int = 0
    warmup: DeviceCalls | None = field(default=None, repr=False)  # the first decode attend
    _pair: int = field(default=0, repr=False)
    _device_inputs: dict = field(default_factory=dict, repr=False)

    @property
    def config(self) -> CacheConfig:
        return self.cache.config

    @property
    def own_streams(self) -> list:
        """The streams the cache made when it was built."""
        return [call.stream for call in self.construction.of("streams")]

    @property
    def takes_stream(self) -> bool:
        return accepts(self.cache.prepare_step, "stream")

    @property
    def takes_out(self) -> bool:
        return accepts(self.cache.attend, "out")

    def seq_ids(self, shape: str) -> list[int]:
        """A decode step's tokens (one per sequence), or the next prefill chunk (two
        sequences, PREFILL_CHUNK tokens each, the pairs taken in turn)."""
        if shape == "decode":
            return list(self.seqs)
        pairs = [self.seqs[i : i + 2] for i in range(0, len(self.seqs), 2)]
        pair = pairs[self._pair % len(pairs)]
        self._pair += 1
        return [s for s in pair for _ in range(PREFILL_CHUNK)]

    def host_inputs(self, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fresh (k, v, q) NumPy float32 arrays of a step of `width` tokens."""
        rng = np.random.default_rng([self.seed, width, self._pair])
        k, v = (
            rng.standard_normal((width, N_KV_HEADS, HEAD_DIM), dtype=np.float32) for _ in range(2)
        )
        q = rng.standard_normal((width, N_HEADS, HEAD_DIM), dtype=np.float32)
        return k, v, q

    def device_inputs(self, width: int) -> tuple:
        """(k, v, q, out) device arrays of a step of `width` tokens, made once per width."""
        if width not in self._device_inputs:
            k, v, q = (cuda.to_device(x) for x in self.host_inputs(width))
            out = cuda.device_array((width, N_HEADS, HEAD_DIM), np.float32)
            self._device_inputs[width] = (k, v, q, out)
        return self._device_inputs[width]

    def warm_up(self) -> DeviceCalls:
        """One decode step, its attend counted: the first decode-shaped attend for a query
        head count makes the split workspace (once); a runtime's steady state is after it."""
        cache = self.cache
        cache.declare_step(self.seq_ids("decode"))
        width = cache.prepare_step().width
        k, v, q, out = self.device_inputs(width)
        cache.write(0, k, v)
        with count_device_calls() as calls:
            cache.attend(0, q, out=out)
        for seq in self.seq_ids("decode"):
            cache.rewind(seq, cache.pos(seq) - 1)
        return calls

    def measure(
        self, case: Case, stream: object = None, seq_ids: list[int] | None = None
    ) -> Measurement:
        """Runs one step of `case` under a counter: declare and prepare (with `stream` when
        given and the cache takes one), write and attend every layer, mask() if asked. A
        case without `out=` runs its step once before, uncounted (the steady state)."""
        seq_ids = self.seq_ids(case.shape) if seq_ids is None else list(seq_ids)
        width = len(seq_ids)
        if case.inputs == "host":
            k, v, q = self.host_inputs(width)
        else:
            k, v, q, out = self.device_inputs(width)
        attend_options = {"out": out} if case.inputs == "device" and self.takes_out else {}
        prepare_options = {"stream": stream} if stream is not None and self.takes_stream else {}
        if case.inputs != "device":
            self._step(case, seq_ids, (k, v, q), attend_options, prepare_options)
        with count_device_calls() as calls:
            marks = self._step(case, seq_ids, (k, v, q), attend_options, prepare_options, calls)
        return Measurement(
            case=case,
            calls=calls,
            prepare=calls.since(0, marks[0]),
            layers=[calls.since(a, b) for a, b in itertools.pairwise(marks)],
            mask_read=calls.since(marks[-1]) if case.read_mask else None,
            passed_stream=stream,
            own_streams=self.own_streams,
        )

    def _step(self, case, seq_ids, kvq, attend_options, prepare_options, calls=None) -> list:
        """One step of `case`; the marks of `calls` after prepare and after each layer."""
        cache, (k, v, q) = self.cache, kvq
        cache.declare_step(seq_ids)
        step = cache.prepare_step(**prepare_options)
        marks = [calls.mark()] if calls is not None else []
        for layer in range(self.config.n_layers):
            cache.write(layer, k, v)
            cache.attend(layer, q, mode=case.mode, **attend_options)
            marks += [calls.mark()] if calls is not None else []
        if case.read_mask:
            step.mask(WINDOW)
        return marks


def windows_for(n_layers: int) -> tuple[int, ...]:
    """The first half of the layers global, the rest of window WINDOW: two masks."""
    if n_layers < 2:
        raise ValueError(f"n_layers={n_layers}: at least 2, so that there are two windows")
    return (0,) * (n_layers // 2) + (WINDOW,) * (n_layers - n_layers // 2)


def build(n_layers: int = 4, seed: int = 0) -> Bench:
    """The cache (built under a counter, so the streams it makes are known), 4 sequences and
    their HISTORY, prefilled one sequence a step with K/V written to every layer."""
    from numbakv import CellCache

    config = CacheConfig(
        n_layers=n_layers,
        n_kv_heads=N_KV_HEADS,
        head_dim=HEAD_DIM,
        capacity=CAPACITY,
        max_width=MAX_WIDTH,
        max_seqs=MAX_SEQS,
        windows=windows_for(n_layers),
        initial_cells=CAPACITY,  # all at the first step: no growth moves the pool later
    )
    with count_device_calls() as construction:
        cache = CellCache(config)
    rng = np.random.default_rng(seed)
    seqs = [cache.seq_new() for _ in HISTORY]
    for seq, n in zip(seqs, HISTORY, strict=True):
        cache.declare_step([seq] * n)
        cache.prepare_step()
        for layer in range(n_layers):
            k, v = (rng.standard_normal((n, N_KV_HEADS, HEAD_DIM), dtype=np.float32) for _ in "kv")
            cache.write(layer, k, v)
    bench = Bench(cache=cache, seqs=seqs, construction=construction, seed=seed)
    bench.warmup = bench.warm_up()
    return bench
