"""The arrays the device cache lends (`numbakv.cache.lending`): a block goes back only when
the array lent from it and every view of it are gone, and results held across layers and
steps keep their values (docs/contract.md §8.1)."""

import gc

import numpy as np
import pytest

import numbakv
from numbakv.cache.cuda import cuda, device_address
from numbakv.cache.lending import KEEP, Lender, rows_for
from numbakv.reference import CellCache as RefCache

from helpers import assert_close, small_config

SHAPE = (3, 2, 4)


@pytest.fixture
def lender():
    return Lender(max_rows=8)


def test_rows_are_a_power_of_two_up_to_max_rows():
    assert [rows_for(w, 8) for w in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert rows_for(6, 6) == 6 and rows_for(5, 6) == 6


def test_a_block_is_lent_again_only_once_every_view_is_gone(lender):
    stream = cuda.stream()
    a = lender.empty(SHAPE, np.float32, stream)
    b = lender.empty(SHAPE, np.float32, stream)  # a is held: a second block
    assert device_address(a) != device_address(b) and lender.blocks_made == 2
    where, part = device_address(a), a[1:]
    del a
    gc.collect()
    c = lender.empty(SHAPE, np.float32, stream)  # a's view still holds its block
    assert device_address(c) not in (where, device_address(b)) and lender.blocks_made == 3
    del part
    d = lender.empty((4, 2, 4), np.float32, stream)  # width 4: the same rows, the same kind
    assert device_address(d) == where and lender.blocks_made == 3
    assert (d.shape, c.shape) == ((4, 2, 4), SHAPE)


def test_kinds_differ_by_dtype_row_shape_and_rows(lender):
    stream = cuda.stream()
    for shape, dtype in ((SHAPE, np.float32), (SHAPE, np.float16), ((3, 4, 2), np.float32),
                         ((5, 2, 4), np.float32)):  # fmt: skip
        lender.empty(shape, dtype, stream)
    assert lender.blocks_made == 4 and lender.free_blocks() == 4


def test_at_most_keep_free_blocks_a_kind(lender):
    stream = cuda.stream()
    held = [lender.empty(SHAPE, np.float32, stream) for _ in range(KEEP + 2)]
    del held
    assert lender.free_blocks() == KEEP


def test_an_upload_holds_the_host_values(lender):
    host = np.arange(24, dtype=np.float32).reshape(SHAPE)
    device = lender.upload(host, cuda.stream())
    np.testing.assert_array_equal(device.copy_to_host(), host)


def test_results_held_across_layers_and_steps_keep_their_values():
    cfg = small_config(n_layers=3, n_kv_heads=1, head_dim=8, capacity=32, max_width=4,
                       max_seqs=2, windows=(0, 2, 0))  # fmt: skip
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    rng = np.random.default_rng(7)
    held, expected = [], []
    seq, _ = (cache.seq_new() for cache in (device, reference))
    for width in (3, 1, 1):  # a prefill of 3, then two decodes; every result kept
        for cache in (device, reference):
            cache.declare_step([seq] * width)
            cache.prepare_step()
        for layer in range(cfg.n_layers):
            k, v = rng.standard_normal((2, width, 1, 8)).astype(np.float32)
            q = rng.standard_normal((width, 2, 8)).astype(np.float32)
            for cache in (device, reference):
                cache.write(layer, k, v)
            held.append(device.attend(layer, q))
            expected.append(reference.attend(layer, q))
    for got, want in zip(held, expected, strict=True):
        assert_close(got.copy_to_host(), want)
    assert len({device_address(out) for out in held}) == len(held)
