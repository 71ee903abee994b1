"""`numbakv.serve.model`: the decoder through a cell cache equals the same decoder without
one, at any vocabulary size; save and load."""

import numpy as np
import pytest

from numbakv.core.errors import ConfigError, StepError
from numbakv.reference import CellCache
from numbakv.serve.model import Model, ModelConfig, rotate, weight_shapes
from numbakv.serve.tokenizer import encode

from helpers import dense_logits, step_with, tiny_model


def new_cache(model, **fields):
    fields = dict(capacity=64, max_width=16, max_seqs=4, initial_cells=4) | fields
    return CellCache(model.config.cache_config(**fields))


@pytest.mark.parametrize("windows", [(0, 4), (3, 0, 1)])
@pytest.mark.parametrize("chunks", [[11], [5, 1, 1, 4], [1] * 11])
def test_forward_through_cells_equals_the_dense_model(windows, chunks):
    model = tiny_model(windows=windows)
    tokens = encode("cells, again")[:11]
    # reference: the whole sequence without a cache
    expect = dense_logits(model, tokens)
    # cache: the same tokens in chunks, every row asked for
    cache = new_cache(model)
    seq, start, rows = cache.seq_new(), 0, []
    for n in chunks:
        step = step_with(cache, [seq] * n)
        rows.append(model.forward(cache, step, tokens[start : start + n], np.arange(n)))
        start += n
    got = np.concatenate(rows)
    # compare
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-4)
    assert np.abs(expect).max() > 1  # logits with something to compare


def test_batched_sequences_equal_each_alone():
    model = tiny_model()
    prompts = [encode("first prompt"), encode("two"), encode("x")]
    cache = new_cache(model, max_width=32)
    seqs = [cache.seq_new() for _ in prompts]
    step = step_with(cache, [s for s, p in zip(seqs, prompts, strict=True) for _ in p])
    ends = np.cumsum([len(p) for p in prompts]) - 1
    got = model.forward(cache, step, [t for p in prompts for t in p], ends)
    for row, prompt in zip(got, prompts, strict=True):
        np.testing.assert_allclose(row, dense_logits(model, prompt)[-1], rtol=1e-5, atol=1e-4)


def test_rows_select_and_padding_is_ignored():
    model = tiny_model()
    tokens = encode("abcd")
    cache = new_cache(model)
    seq = cache.seq_new()
    cache.declare_step([seq] * 4)
    step = cache.prepare_step(width=7)  # 3 padded rows, fed token 0
    got = model.forward(cache, step, [*tokens, 0, 0, 0], [3, 0])
    expect = dense_logits(model, tokens)[[3, 0]]
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-4)


def test_another_vocabulary_sizes_the_weights_and_the_logits():
    model = tiny_model(vocab_size=40)
    assert model.weights["embed"].shape == (40, 16) and model.weights["lm_head"].shape == (16, 40)
    tokens = [39, 0, 12, 7, 39]
    cache = new_cache(model)
    step = step_with(cache, [cache.seq_new()] * len(tokens))
    got = model.forward(cache, step, tokens, np.arange(len(tokens)))
    assert got.shape == (5, 40)
    np.testing.assert_allclose(got, dense_logits(model, tokens), rtol=1e-5, atol=1e-4)
    with pytest.raises(StepError, match=r"\[0, 40\)"):
        model.forward(cache, step, [1, 2, 3, 4, 40], [0])


def test_the_default_vocabulary_is_the_bytes():
    assert ModelConfig().vocab_size == 256
    assert weight_shapes(ModelConfig())["embed"] == (256, 32)


def test_forward_refuses_wrong_tokens():
    model = tiny_model()
    cache = new_cache(model)
    step = step_with(cache, [cache.seq_new()] * 2)
    for tokens in ([1], [1, 256], [-1, 3]):
        with pytest.raises(StepError, match="tokens"):
            model.forward(cache, step, tokens, [0])


def test_rotary_scores_depend_only_on_distance():
    model = tiny_model(head_dim=8)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, 8), dtype=np.float32)

    def score(p_q, p_k):
        rq = rotate(q, *model._rotary(np.array([p_q])))
        rk = rotate(k, *model._rotary(np.array([p_k])))
        return float((rq * rk).sum())

    assert score(7, 3) == pytest.approx(score(107, 103), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), rel=1e-3)
    x = rng.standard_normal((5, 2, 8), dtype=np.float32)
    rotated = rotate(x, *model._rotary(np.arange(5) * 13))
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), 1e-5)
    np.testing.assert_array_equal(rotate(x, *model._rotary(np.zeros(5, int))), x)


@pytest.mark.parametrize("vocab_size", [256, 50])
def test_save_and_load_round_trip(tmp_path, vocab_size):
    model = tiny_model(seed=3, windows=(0, 2, 5), vocab_size=vocab_size)
    model.save(tmp_path / "m.npz")
    loaded = Model.load(tmp_path / "m.npz")
    assert loaded.config == model.config and loaded.config.vocab_size == vocab_size
    assert loaded.weights.keys() == model.weights.keys()
    for name, w in model.weights.items():
        np.testing.assert_array_equal(loaded.weights[name], w)
    tokens = [t % vocab_size for t in encode("round trip")]
    np.testing.assert_array_equal(dense_logits(loaded, tokens), dense_logits(model, tokens))


def test_a_file_saved_before_vocab_size_loads_with_256(tmp_path):
    model = tiny_model(seed=4)
    model.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as data:
        old = {name: data[name] for name in data.files if name != "config.vocab_size"}
    assert "config.d_model" in old  # the file is as numbakv 0.2 wrote it, less the field
    np.savez(tmp_path / "old.npz", **old)
    loaded = Model.load(tmp_path / "old.npz")
    assert loaded.config == model.config and loaded.config.vocab_size == 256
    tokens = encode("old file")
    np.testing.assert_array_equal(dense_logits(loaded, tokens), dense_logits(model, tokens))


def test_seeds_give_different_weights():
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    assert not np.array_equal(a.weights["layers.0.wq"], b.weights["layers.0.wq"])
    np.testing.assert_array_equal(a.weights["embed"], tiny_model(seed=0).weights["embed"])


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(n_heads=3, n_kv_heads=2), "multiple"),
        (dict(head_dim=5), "even"),
        (dict(windows=()), "one entry per layer"),
        (dict(windows=(0, -1)), "window"),
        (dict(rope_theta=1.0), "rope_theta"),
        (dict(d_ff=0), "d_ff"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(vocab_size=2.5), "vocab_size"),
    ],
)
def test_model_config_refusals(fields, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**fields)


def test_weights_must_match_the_config():
    model = tiny_model()
    weights = dict(model.weights)
    with pytest.raises(ConfigError, match="missing"):
        Model(model.config, {k: v for k, v in weights.items() if k != "lm_head"})
    weights["embed"] = weights["embed"][:, :3]
    with pytest.raises(ConfigError, match="embed"):
        Model(model.config, weights)


def test_cache_config_carries_the_geometry():
    config = ModelConfig(n_kv_heads=1, head_dim=6, windows=(0, 0, 9)).cache_config(
        capacity=32, max_width=8, max_seqs=2
    )
    assert (config.n_layers, config.n_kv_heads, config.head_dim, config.windows) == (
        3,
        1,
        6,
        (0, 0, 9),
    )
