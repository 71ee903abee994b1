"""`ServedModel`: the executor takes any model that answers it, and names what a model that
does not is missing (docs/contract.md §14.1). A model of one's own, here a NumPy one that
keeps numbakv's `Model` at arm's length, is served exactly as numbakv's own."""

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

import numbakv
from numbakv.core.errors import ConfigError, StepError
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.models import CapturedModel, ModelShape, ServedModel

from helpers import solo_generate, tiny_model

MODEL = tiny_model(seed=3)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [4, 4, 4, 4]]


class OwnModel:
    """A model of one's own: a plain geometry and a forward, counted."""

    def __init__(self, inner):
        c = inner.config
        self.config = ModelShape(c.n_layers, c.n_kv_heads, c.head_dim, c.windows, c.vocab_size)
        self.inner, self.forwards = inner, 0

    def forward(self, cache, step, tokens, logits_at):
        self.forwards += 1
        return self.inner.forward(cache, step, tokens, logits_at)


def executor(model, cache_class=CellCache) -> Executor:
    config = model.config.cache_config(capacity=64, max_width=4, max_seqs=4)
    return Executor(model, cache_class(config), 4, 16)


def test_numbakv_models_answer_the_protocol():
    assert isinstance(MODEL, ServedModel) and not isinstance(MODEL, CapturedModel)
    assert isinstance(OwnModel(MODEL), ServedModel)
    from numbakv import DeviceModel

    config = MODEL.config.cache_config(capacity=8, max_width=2, max_seqs=1)
    assert isinstance(DeviceModel(MODEL, config), CapturedModel)


def test_a_model_of_ones_own_is_served_as_numbakvs_own():
    own = OwnModel(MODEL)
    done = Engine(executor(own)).generate(PROMPTS, max_new_tokens=6)
    assert [d.tokens[0] for d in done] == [solo_generate(MODEL, p, 6)[0] for p in PROMPTS]
    assert own.forwards > len(PROMPTS)  # chunked prefill and decodes all went through it


def test_lockstep_holds_under_a_model_of_ones_own():
    own = OwnModel(MODEL)
    pair = [executor(own, c) for c in (numbakv.CellCache, CellCache)]
    [done] = Engine(Lockstep(*pair)).generate([PROMPTS[0]], max_new_tokens=3, n=2)
    assert done.tokens == [solo_generate(MODEL, PROMPTS[0], 3)[0]] * 2


@dataclass
class Half:
    """A model that answers part of the protocol."""

    config: object = None
    forward: object = None
    device_resident: bool = False


GEOMETRY = ModelShape(2, 2, 4, (0, 4), 256)


def shape(**fields) -> SimpleNamespace:
    """A config of GEOMETRY's fields but `fields`, unchecked (ModelShape checks its own)."""
    return SimpleNamespace(**vars(GEOMETRY) | fields)


@pytest.mark.parametrize(
    "model, match",
    [
        (Half(), "has no config; a served model needs config.{n_layers, n_kv_heads"),
        (Half(config=MODEL.config.cache_config(capacity=8, max_width=2, max_seqs=1)),
         "config has no vocab_size"),
        (Half(config=GEOMETRY), r"has no forward\(cache, step, tokens, logits_at\)"),
        (Half(config=shape(vocab_size=0), forward=print),
         "model.config.vocab_size=0 is below 1"),
        (Half(config=shape(windows=[0, 4]), forward=print),
         r"config.windows=\[0, 4\]: give a tuple of ints >= 0"),
        (Half(config=shape(windows=(0.0, 4)), forward=print), r"config.windows=\(0.0, 4\)"),
        (Half(config=shape(windows=(-1, 4)), forward=print), r"\(-1, 4\)"),
        (Half(config=GEOMETRY, forward=print, device_resident=True),
         r"says device_resident=True but has no stage\(\)"),
    ],
)  # fmt: skip
def test_a_model_that_answers_half_the_protocol_is_refused_naming_what_is_missing(model, match):
    cache = CellCache(GEOMETRY.cache_config(capacity=8, max_width=2, max_seqs=1))
    with pytest.raises(ConfigError, match=match):
        Executor(model, cache, 1, 8)
    assert cache.live_seqs == [] and cache.used_cells == 0


def test_geometry_makes_the_cache_that_fits():
    config = GEOMETRY.cache_config(capacity=8, max_width=2, max_seqs=1, dtype="float16")
    assert (config.n_layers, config.n_kv_heads, config.head_dim) == (2, 2, 4)
    assert config.windows == (0, 4) and config.formats[0] == ("float16", "float16")


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(n_layers=0), "n_layers=0 is below 1"),
        (dict(windows="ab"), "windows must be a tuple of ints"),
        (dict(windows=(0, -1)), "window=-1 is below 0"),
        (dict(windows=(0,)), "has 1 entries, n_layers=2"),
    ],
)
def test_a_model_shape_checks_its_fields(fields, match):
    with pytest.raises(ConfigError, match=match):
        ModelShape(**vars(GEOMETRY) | fields)
    assert ModelShape(2, 2, 4, [0, 4], 256).windows == (0, 4)


def test_logits_of_the_wrong_shape_are_refused_and_the_batch_rewound():
    class Short(OwnModel):
        def forward(self, cache, step, tokens, logits_at):
            return super().forward(cache, step, tokens, logits_at)[:, :-1]

    ex = executor(Short(MODEL))
    session = ex.open_session()
    with pytest.raises(StepError, match=r"Short.forward returned logits of shape \(1, 255\)"):
        ex.execute([Input(session, 0, [1, 2, 3])])
    assert ex.length(session) == 0 and ex.cache.used_cells == 0
