"""The NumPy model's weights on the device, uploaded once, and the rotary table.

The arrays are the `numbakv.serve.model.Model` weights unchanged, float32 and C-contiguous,
except wq | wk | wv, concatenated into one [d_model, (n_heads + 2 n_kv_heads) head_dim]
matrix so that one launch makes q, k and v. The rotary table holds cos and sin of every
position's angles, computed on the host in float64 exactly as `Model._rotary` does and
rounded to float32 once.
"""

from dataclasses import dataclass

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.serve.model import Model, ModelConfig


@dataclass(frozen=True)
class LayerWeights:
    """One layer's device arrays, float32.

    attn_norm, mlp_norm : [d_model]
    w_qkv               : [d_model, (n_heads + 2 n_kv_heads) head_dim], wq | wk | wv
    wo                  : [n_heads head_dim, d_model]
    w_gate, w_up        : [d_model, d_ff];  w_down: [d_ff, d_model]
    """

    attn_norm: object
    w_qkv: object
    wo: object
    mlp_norm: object
    w_gate: object
    w_up: object
    w_down: object


@dataclass(frozen=True)
class DeviceWeights:
    """The model's device arrays, float32: embed [vocab_size, d_model], final_norm
    [d_model], lm_head [d_model, vocab_size], rotary [2, max_seq_len, head_dim / 2] (cos,
    sin), and the layers."""

    embed: object
    final_norm: object
    lm_head: object
    rotary: object
    layers: tuple[LayerWeights, ...]


def rotary_table(config: ModelConfig, max_seq_len: int) -> np.ndarray:
    """[2, max_seq_len, head_dim / 2] float32: cos and sin of positions 0 .. max_seq_len - 1,
    the float64 angles of `Model._rotary` rounded to float32."""
    half = config.head_dim // 2
    inv_freq = config.rope_theta ** (-np.arange(half, dtype=np.float64) / half)
    angles = np.arange(max_seq_len, dtype=np.float64)[:, None] * inv_freq
    return np.stack([np.cos(angles), np.sin(angles)]).astype(np.float32)


def upload(model: Model, max_seq_len: int) -> DeviceWeights:
    """Every weight of `model` and its rotary table on the device (synchronous, once)."""
    w = model.weights

    def put(array: np.ndarray):
        return cuda.to_device(np.ascontiguousarray(array, dtype=np.float32))

    layers = []
    for i in range(model.config.n_layers):
        p = f"layers.{i}."
        qkv = np.concatenate([w[p + "wq"], w[p + "wk"], w[p + "wv"]], axis=1)
        layers.append(
            LayerWeights(
                attn_norm=put(w[p + "attn_norm"]),
                w_qkv=put(qkv),
                wo=put(w[p + "wo"]),
                mlp_norm=put(w[p + "mlp_norm"]),
                w_gate=put(w[p + "w_gate"]),
                w_up=put(w[p + "w_up"]),
                w_down=put(w[p + "w_down"]),
            )
        )
    return DeviceWeights(
        embed=put(w["embed"]),
        final_norm=put(w["final_norm"]),
        lm_head=put(w["lm_head"]),
        rotary=put(rotary_table(model.config, max_seq_len)),
        layers=tuple(layers),
    )
