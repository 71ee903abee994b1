"""The kit on quantized storage: `QUANTIZED_CONFIGS` run by `check_cache(compare="table")`
pass the reference and catch a cache whose quantizer is subtly wrong — a float16 scale
rounded toward zero, q4_0 codes packed as adjacent pairs (the other common nibble order),
fp8 without its scale — each in bytes the reference would not store."""

import numpy as np
import pytest

from numbakv.core.formats import BLOCK
from numbakv.reference import CellCache
from numbakv.testing import QUANTIZED_CONFIGS, Divergence, check_cache


class Misquantizing(CellCache):
    """The reference with one quantizer bug, applied to the cells each write stored."""

    bug = ""

    def write(self, layer: int, k, v) -> None:
        super().write(layer, k, v)
        cells = self._step.cells[self._step.cells >= 0]
        for which, pool in enumerate((self._pool.k[layer], self._pool.v[layer])):
            fmt = self.config.formats[layer][which]
            rows = pool[cells]
            if self.bug == "scale_truncated" and fmt == "q8_0":
                rows[..., 0::34] &= np.uint8(0xFE)  # the scale's lowest bit
            elif self.bug == "nibbles_adjacent" and fmt == "q4_0":
                blocks = rows.reshape(*rows.shape[:2], -1, 18)
                codes = np.concatenate([blocks[..., 2:] & 15, blocks[..., 2:] >> 4], axis=-1)
                blocks[..., 2:] = codes[..., 0::2] | (codes[..., 1::2] << 4)
                rows = blocks.reshape(rows.shape)
            elif self.bug == "fp8_unscaled" and fmt == "fp8_e4m3":
                rows = self._unscaled(k if which == 0 else v)
            pool[cells] = rows

    def _unscaled(self, x) -> np.ndarray:
        from numbakv.reference.quant import e4m3_bits

        return e4m3_bits(np.asarray(x, np.float32)[self._step.cells >= 0])


def test_the_reference_passes_the_quantized_configs():
    report = check_cache(CellCache, compare="table", configs=QUANTIZED_CONFIGS, report=True)
    assert report.hazards and report.growths and QUANTIZED_CONFIGS[0].head_dim % BLOCK == 0


@pytest.mark.parametrize("bug", ["scale_truncated", "nibbles_adjacent", "fp8_unscaled"])
def test_a_subtly_wrong_quantizer_is_caught(bug):
    cache = type(f"Misquantizing_{bug}", (Misquantizing,), {"bug": bug})
    with pytest.raises(Divergence, match="differs from the reference"):
        check_cache(cache, compare="table", configs=QUANTIZED_CONFIGS)
