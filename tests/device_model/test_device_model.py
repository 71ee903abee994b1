"""`numbakv.DeviceModel` against `numbakv.serve.model.Model`: the same logits
(within 1e-5 of each row's largest |logit|) over steps with padding, clones and rewinds, for
global and sliding windows and GQA ratios 1, 2 and 4; the same refusals; its config checks.

The NumPy model runs on the reference cache and the device model on the device cache, both
driven by the same verbs, so the comparison also crosses the two caches' attention.
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from numbakv import CellCache, DeviceModel
from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError, StepError
from numbakv.device_model.weights import rotary_table
from numbakv.reference import CellCache as RefCache
from numbakv.serve.model import Model, ModelConfig

VOCAB = 48
CACHE = dict(capacity=32, max_width=8, max_seqs=3, initial_cells=8)


def small_model(n_heads=4, n_kv_heads=2, windows=(0, 4), seed=0) -> Model:
    """d_model 16, head_dim 4, d_ff 32, vocabulary 48: small enough for the simulator."""
    config = ModelConfig(
        d_model=16, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=4, d_ff=32,
        windows=windows, vocab_size=VOCAB,
    )  # fmt: skip
    return Model.from_seed(config, seed)


class Pair:
    """The NumPy model on a reference cache and a DeviceModel on a device cache of one
    config, driven by the same verbs."""

    def __init__(self, model: Model, **fields):
        config = model.config.cache_config(**(CACHE | fields))
        self.model, self.ref, self.dev = model, RefCache(config), CellCache(config)
        self.dm = DeviceModel(model, config)

    def verb(self, name: str, *args):
        """The verb on both caches; both must answer the same."""
        answers = [getattr(cache, name)(*args) for cache in (self.ref, self.dev)]
        assert answers[0] == answers[1], (name, answers)
        return answers[0]

    def forward(self, seq_ids, tokens, logits_at, width=None) -> np.ndarray:
        """Both models' logits of one step, compared; returns the device model's."""
        steps = []
        for cache in (self.ref, self.dev):
            cache.declare_step(seq_ids)
            steps.append(cache.prepare_step(width))
        expect = self.model.forward(self.ref, steps[0], tokens, logits_at)
        got = self.dm.forward(self.dev, steps[1], tokens, logits_at)
        assert got.shape == expect.shape == (len(logits_at), VOCAB) and got.dtype == np.float32
        scale = np.abs(expect).max(axis=1, keepdims=True)
        assert (np.abs(got - expect) <= 1e-5 * scale).all(), np.abs(got - expect).max()
        assert (scale > 1).all()  # logits with something to compare
        return got


@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "windows"),
    [(4, 2, (0, 4)), (2, 2, (3,)), (4, 1, (0,))],
    ids=["gqa2-global-and-window4", "gqa1-window3", "gqa4-global"],
)
def test_logits_match_the_numpy_model_step_after_step(n_heads, n_kv_heads, windows):
    pair = Pair(small_model(n_heads, n_kv_heads, windows))
    rng = np.random.default_rng(1)
    a, b = pair.verb("seq_new"), pair.verb("seq_new")
    # a prefill of two sequences, then decode steps with padding, a clone and a rewind:
    # positions up to 7 go past both windows
    pair.forward([a] * 5 + [b] * 3, rng.integers(0, VOCAB, 8), [4, 7])
    pair.forward([a, b], rng.integers(0, VOCAB, 4), [0, 1], width=4)
    c = pair.verb("seq_clone", a, 3)
    pair.forward([c, a, b, c], rng.integers(0, VOCAB, 5), [3, 1, 2], width=5)
    pair.verb("rewind", b, 2)
    pair.forward([b, b, c, a], rng.integers(0, VOCAB, 6), [1, 0, 0, 3], width=6)


GEOMETRIES = [(4, 2, (0, 3)), (2, 2, (2,)), (4, 1, (0,)), (8, 1, (4, 0))]


@settings(max_examples=6)
@given(geometry=st.sampled_from(GEOMETRIES), seed=st.integers(0, 2**16))
@example(geometry=(4, 2, (0, 3)), seed=167)  # every id live and full before a step
def test_logits_match_the_numpy_model_on_random_steps(geometry, seed):
    """Random workloads: sequences made, cloned at a random position, rewound and removed;
    steps of random sequences with random padding and random logits_at."""
    n_heads, n_kv_heads, windows = geometry
    model = small_model(n_heads, n_kv_heads, windows, seed=seed % 3)
    pair = Pair(model, capacity=3 * 12, max_seq_len=12)  # every sequence may fill up
    rng = np.random.default_rng(seed)
    for _ in range(5):
        live = pair.ref.live_seqs
        roll = rng.random()
        if not live or (roll < 0.3 and len(live) < CACHE["max_seqs"]):
            live.append(pair.verb("seq_new"))
        elif roll < 0.45 and len(live) < CACHE["max_seqs"]:
            src = int(rng.choice(live))
            live.append(pair.verb("seq_clone", src, int(rng.integers(0, pair.ref.pos(src) + 1))))
        elif roll < 0.6:
            seq = int(rng.choice(live))
            pair.verb("rewind", seq, int(rng.integers(0, pair.ref.pos(seq) + 1)))
        elif roll < 0.7 and len(live) > 1:
            pair.verb("seq_rm", live.pop(int(rng.integers(len(live)))))
        room = {s: 12 - pair.ref.pos(s) for s in live}
        seqs = [s for s in live if room[s] > 0]
        if not seqs:  # every live sequence is full: a new one, an old one removed if need be
            if len(live) == CACHE["max_seqs"]:
                pair.verb("seq_rm", live.pop(0))
            seqs = [pair.verb("seq_new")]
        n = int(rng.integers(1, CACHE["max_width"] + 1))
        ids = [int(s) for s in rng.choice(seqs, n)]
        ids = [s for i, s in enumerate(ids) if ids[: i + 1].count(s) <= room.get(s, 12)] or seqs[:1]
        width = int(rng.integers(len(ids), CACHE["max_width"] + 1))
        logits_at = rng.integers(0, width, int(rng.integers(0, width + 1)))
        pair.forward(ids, rng.integers(0, VOCAB, width), logits_at, width=width)


def test_logits_at_may_be_empty_repeated_or_padding():
    pair = Pair(small_model(windows=(2,)))
    seq = pair.verb("seq_new")
    assert pair.forward([seq] * 3, [1, 2, 3, 0], [], width=4).shape == (0, VOCAB)
    got = pair.forward([seq], [5, 0, 0], [0, 2, 0], width=3)  # token 2 is padding
    np.testing.assert_array_equal(got[0], got[2])


def test_the_rotary_table_is_the_numpy_models():
    model = small_model()
    table = rotary_table(model.config, 40)
    cos, sin = model._rotary(np.arange(40))
    np.testing.assert_array_equal(table, np.stack([cos[:, 0], sin[:, 0]]))


def test_attributes():
    model = small_model()
    dm = DeviceModel(model, model.config.cache_config(**CACHE))
    assert dm.model is model and dm.config is model.config and dm.device_resident is True


def test_logits_before_any_step_is_refused():
    model = small_model()
    dm = DeviceModel(model, model.config.cache_config(**CACHE))
    with pytest.raises(StepError, match="before any step"):
        dm.logits(1)


BAD_INPUTS = [
    ([1, 2, VOCAB, 3], [0], r"tokens\[2\] = 48"),
    ([1, 2, -1, 3], [0], r"tokens\[2\] = -1"),
    ([1, 2, 3], [0], r"tokens must be \[4\]"),
    ([1.0, 2, 3, 4], [0], r"tokens\[0\]"),
    ("abcd", [0], "tokens must be"),
    ([1, 2, 3, 4], [4], r"logits_at \[4\]"),
    ([1, 2, 3, 4], [0, -1], r"logits_at \[0, -1\]"),
    ([1, 2, 3, 4], [[0]], "logits_at must be a list"),
    ([1, 2, 3, 4], [0.5], "logits_at must be a list"),
]


@pytest.mark.parametrize(("tokens", "logits_at", "match"), BAD_INPUTS)
def test_refusals_are_the_numpy_models(tokens, logits_at, match):
    pair = Pair(small_model(windows=(0,)))
    seq = pair.verb("seq_new")
    steps = []
    for cache in (pair.ref, pair.dev):
        cache.declare_step([seq] * 3)
        steps.append(cache.prepare_step(4))
    with pytest.raises(StepError, match=match) as expected:
        pair.model.forward(pair.ref, steps[0], tokens, logits_at)
    with pytest.raises(StepError, match=match) as got:
        pair.dm.forward(pair.dev, steps[1], tokens, logits_at)
    assert str(got.value) == str(expected.value)


def test_more_logits_than_max_width_are_refused():
    pair = Pair(small_model(windows=(0,)), max_width=4)
    pair.dev.declare_step([pair.dev.seq_new()] * 2)
    step = pair.dev.prepare_step()
    with pytest.raises(StepError, match=r"logits_at asks for 5 logits; .* at most max_width=4"):
        pair.dm.stage(pair.dev, step, [1, 2], [0, 1, 0, 1, 0])


def test_run_of_an_unstaged_step_and_logits_past_the_staged_ones_are_refused():
    pair = Pair(small_model(windows=(0,)))
    seq = pair.dev.seq_new()
    pair.dev.declare_step([seq] * 2)
    first = pair.dev.prepare_step()
    pair.dm.stage(pair.dev, first, [1, 2], [1])
    pair.dm.run(pair.dev, first)
    with pytest.raises(StepError, match=r"n=2 must lie in \[0, 1\], the tokens of logits_at"):
        pair.dm.logits(2)
    pair.dev.declare_step([seq])
    second = pair.dev.prepare_step()
    with pytest.raises(StepError, match="not staged"):
        pair.dm.run(pair.dev, second)


def test_a_stale_step_is_refused():
    pair = Pair(small_model(windows=(0,)))
    seq = pair.dev.seq_new()
    pair.dev.declare_step([seq])
    step = pair.dev.prepare_step()
    pair.dev.rewind(seq, 0)
    with pytest.raises(StepError, match="stale"):
        pair.dm.forward(pair.dev, step, [1], [0])


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_layers", 1), ("n_kv_heads", 1), ("head_dim", 8), ("windows", (0, 2))],
)
def test_a_cache_config_of_another_geometry_is_refused(field, value):
    model = small_model()
    fields = dict(n_layers=2, n_kv_heads=2, head_dim=4, windows=(0, 4)) | {field: value}
    if field == "n_layers":
        fields["windows"] = (0,)
    config = CacheConfig(**(CACHE | fields))
    with pytest.raises(ConfigError, match=f"model's {field}=.* cache config's {field}="):
        DeviceModel(model, config)


def test_a_cache_it_cannot_serve_is_refused():
    model = small_model(windows=(0,))
    dm = DeviceModel(model, model.config.cache_config(**CACHE))
    wider = CellCache(model.config.cache_config(**(CACHE | dict(max_width=16))))
    wider.declare_step([wider.seq_new()])
    with pytest.raises(ConfigError, match="max_width=16 exceeds this DeviceModel's max_width=8"):
        dm.forward(wider, wider.prepare_step(), [1], [0])
    ref = RefCache(model.config.cache_config(**CACHE))
    ref.declare_step([ref.seq_new()])
    with pytest.raises(ConfigError, match="device cache"):
        dm.forward(ref, ref.prepare_step(), [1], [0])
    other = CellCache(small_model(n_kv_heads=1, windows=(0,)).config.cache_config(**CACHE))
    other.declare_step([other.seq_new()])
    with pytest.raises(ConfigError, match="n_kv_heads"):
        dm.forward(other, other.prepare_step(), [1], [0])


def test_arguments_that_are_not_a_model_and_a_cache_config_are_refused():
    model = small_model()
    with pytest.raises(ConfigError, match="Model"):
        DeviceModel(model.weights, model.config.cache_config(**CACHE))
    with pytest.raises(ConfigError, match="CacheConfig"):
        DeviceModel(model, CACHE)


def test_logits_match_over_quantized_caches():
    """K q8_0 / V q4_0 in the global layer, fp8 in the sliding one: the device model reads
    the same dequantized K/V as the NumPy model on the reference, so the same logits."""
    config = ModelConfig(d_model=16, n_heads=2, n_kv_heads=1, head_dim=32, d_ff=32,
                         windows=(0, 3), vocab_size=VOCAB)  # fmt: skip
    pair = Pair(Model.from_seed(config, 2), layer_dtypes=(("q8_0", "q4_0"), "fp8_e4m3"),
                fp8_scales=0.25)  # fmt: skip
    rng = np.random.default_rng(3)
    a = pair.verb("seq_new")
    pair.forward([a] * 5, rng.integers(0, VOCAB, 5), [4])
    b = pair.verb("seq_clone", a, 4)
    pair.forward([a, b], rng.integers(0, VOCAB, 2), [0, 1])
