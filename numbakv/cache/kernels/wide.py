"""Wide loads of K/V rows: the GPU-only instructions of the attention kernels behind small
primitives, each with a simulator definition (docs/contract.md §5: one kernel source on both
targets).

numba has no vector loads; on a GPU each primitive is one inline-PTX block
(`cuda.asm_loader`) that loads a lane's part of a row with the widest aligned
`ld.global.nc` its format allows (the pools are never written while attention runs, so the
read-only path is safe) and widens it in registers. In the simulator the same primitive
reads the elements one by one. Every load takes (array, row, offset, ok): the elements
from flat index `offset` of row `row` on, read only where ok is true (else zeros, with no
branch on a GPU: the loads are predicated) (a pool's row is a cell: [n_kv_heads, row_width],
offset = head * its head stride + index), addressed in 32-bit arithmetic; the caller
guarantees the alignment each one states.

    item      one element (no alignment, no ok), e.g. seq_cells[s, j] as item(seq_cells, s, j)
    put       put(array, row, offset, value) stores one element, addressed as `item` reads
    div       a // b of non-negative int32s, a 32-bit division (numba's is 64-bit)
    row       8 elements of a row: of float16 or bfloat16 patterns (uint16) as 4 words (an
              int32 each, element 2i in the low half; 16 bytes, offset a multiple of 8), of
              float32 as 8 float32 (32 bytes, offset a multiple of 4)
    u16x4     8 bytes of a uint8 row as 4 little-endian uint16 (an int32 each); offset even
    u32x2     8 bytes of a uint8 row as 2 little-endian words; offset a multiple of 8
    half      2 bytes of a uint8 row as the float32 value of a float16 (a ggml block scale);
              offset even
    half_lo, half_hi
              the float32 value of the float16 in the low or high half of a word
    s8        s8(word, shift): the float32 value of the signed byte at bits [shift, shift + 8)
              of an int32 word (shift 0, 8, 16 or 24, a constant where it is called): one
              `I2F.S8` that reads the byte in place
    select    select(mask, a, b): the bits of int32 a where mask has ones, of b elsewhere
              (one `LOP3`; written out, the compiler folds b's own mask into it and splits it)
    prmt      prmt(a, b, selector): PTX `prmt.b32`, byte k of the result the byte of (b:a)
              (bytes 0..3 of a, 4..7 of b) that nibble k of the selector names, its sign
              bit copied through the byte where the nibble's bit 3 is set (one `PRMT`)

Two arithmetic primitives beside them, where the exact libdevice functions cost tens of
instructions and an attention softmax needs none of their exactness (docs/contract.md §5):

    exp2      2^x of x <= 0 (NaN stays NaN), one `ex2.approx.ftz` (relative error 2^-22,
              results below 2^-126 flushed to 0); the simulator clamps x > 0 to 0, where
              the GPU would give a value the caller discards
    rcp       1 / x of a normal x, one `rcp.approx.ftz` (within 1 ulp)

and one warp primitive, a reduction the simulator runs in one warp exchange per step of
the butterfly instead of one per value:

    lane_sum4 (a, b, c, d) summed over each aligned group of `lanes` lanes (a power of two):
              xor shuffles, every lane of the group gets the sums
    xor_swap10
              ten values of lane (own lane ^ offset): a softmax state (m, l and 8 sums)

A row is kept packed in registers as loaded and widened element by element where it is
used: 16 bytes of float16 hold 8 elements in 4 registers.
"""

import ctypes
import weakref

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import device_function

VEC = 8  # elements a lane loads per row: 16 bytes of float16
FULL = np.uint32(0xFFFFFFFF)  # every lane of a warp


_FLAT_VIEWS: dict = {}  # id of a host array -> (a weak reference to it, flat view, row stride)


def _flat(array) -> tuple:
    """(a 1-D view of the memory `array` spans, its row stride in elements): what the GPU's
    row addressing reads, for a simulator array (its numpy array unwrapped, the view kept
    for the array's next access). The view is over the memory's address, not the array,
    and kept beside a weak reference: keeping a view does not keep an array alive (a lent
    array's block goes back to its pool when its caller drops it, `cache.lending`)."""
    host = array.__dict__.get("_item", array)  # a simulated kernel's argument wrapper
    host = getattr(host, "_ary", host)
    found = _FLAT_VIEWS.get(id(host))
    if found is None or found[0]() is not host:
        item = host.itemsize
        axes = zip(host.shape, host.strides, strict=True)
        span = 1 + sum((n - 1) * stride // item for n, stride in axes)
        memory = (ctypes.c_char * (span * item)).from_address(host.ctypes.data)
        flat = np.frombuffer(memory, dtype=host.dtype)
        if len(_FLAT_VIEWS) > 256:  # views of arrays no launch uses any more
            _FLAT_VIEWS.clear()
        found = _FLAT_VIEWS[id(host)] = weakref.ref(host), flat, host.strides[0] // item
    return found[1], found[2]


def _item_sim(array, row, offset):
    flat, stride = _flat(array)
    return flat[int(row) * stride + int(offset)]


def _put_sim(array, row, offset, value):
    flat, stride = _flat(array)
    flat[int(row) * stride + int(offset)] = value


def _row_sim(pool, c, d, ok):
    flat, stride = _flat(pool)
    start = int(c) * stride + int(d)
    if flat.dtype == np.float32:
        return tuple(flat[start : start + 8]) if ok else (np.float32(0),) * 8
    words = flat[start : start + 8].view(np.int32) if ok else np.zeros(4, np.int32)
    return tuple(words)


def _div_sim(a, b):
    return np.int32(int(a) // int(b))


def _exp2_sim(x):
    x = np.float32(x)
    return np.float32(np.exp2(x if x <= 0 or x != x else np.float32(0)))


def _rcp_sim(x):
    return np.float32(np.float32(1) / np.float32(x))


def _lane_sum4_sim(a, b, c, d, lanes):
    values = (np.float32(a), np.float32(b), np.float32(c), np.float32(d))
    offset = lanes >> 1
    while offset > 0:  # the GPU's butterfly, a tuple a step: its sums in its order
        other = cuda.shfl_xor_sync(FULL, values, offset)
        values = tuple(np.float32(x + y) for x, y in zip(values, other, strict=True))
        offset >>= 1
    return values


def _xor_swap10_sim(values, offset):
    return cuda.shfl_xor_sync(FULL, tuple(np.float32(x) for x in values), offset)


@device_function
def _xor_swap10(values, offset):
    a, b, c, d, e, f, g, h, i, j = values
    return (cuda.shfl_xor_sync(FULL, a, offset), cuda.shfl_xor_sync(FULL, b, offset),
            cuda.shfl_xor_sync(FULL, c, offset), cuda.shfl_xor_sync(FULL, d, offset),
            cuda.shfl_xor_sync(FULL, e, offset), cuda.shfl_xor_sync(FULL, f, offset),
            cuda.shfl_xor_sync(FULL, g, offset), cuda.shfl_xor_sync(FULL, h, offset),
            cuda.shfl_xor_sync(FULL, i, offset), cuda.shfl_xor_sync(FULL, j, offset))  # fmt: skip


@device_function
def _lane_sum4(a, b, c, d, lanes):
    offset = lanes >> np.int32(1)
    while offset > 0:
        a += cuda.shfl_xor_sync(FULL, a, offset)
        b += cuda.shfl_xor_sync(FULL, b, offset)
        c += cuda.shfl_xor_sync(FULL, c, offset)
        d += cuda.shfl_xor_sync(FULL, d, offset)
        offset >>= np.int32(1)
    return a, b, c, d


def _s8_sim(word, shift):
    byte = (int(word) >> int(shift)) & 0xFF
    return np.float32(byte - 256 if byte >= 128 else byte)


def _select_sim(mask, a, b):
    mask = np.int32(mask)
    return np.int32((np.int32(a) & mask) | (np.int32(b) & ~mask))


def _prmt_sim(a, b, selector):
    pool = (int(a) & 0xFFFFFFFF) | (int(b) & 0xFFFFFFFF) << 32
    out = 0
    for k in range(4):
        nibble = (int(selector) >> (4 * k)) & 0xF
        byte = (pool >> (8 * (nibble & 7))) & 0xFF
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return np.uint32(out).view(np.int32)


def _half_lo_sim(word):
    return np.float32(np.uint16(np.int32(word) & 0xFFFF).view(np.float16))


def _half_hi_sim(word):
    return np.float32(np.uint16((np.int32(word) >> 16) & 0xFFFF).view(np.float16))


def _bytes_sim(pool, c, d, n, ok):
    flat, stride = _flat(pool)
    start = int(c) * stride + int(d)
    return flat[start : start + n].copy() if ok else np.zeros(n, np.uint8)


def _u16x4_sim(pool, c, d, ok):
    return tuple(np.int32(w) for w in _bytes_sim(pool, c, d, 8, ok).view(np.uint16))


def _u32x2_sim(pool, c, d, ok):
    return tuple(_bytes_sim(pool, c, d, 8, ok).view(np.int32))


def _half_sim(pool, c, d, ok):
    return (np.float32(_bytes_sim(pool, c, d, 2, ok).view(np.float16)[0]),)


_WORDS4 = "@p ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$A];"
_F32X8 = (
    "@p ld.global.nc.v4.f32 {$0, $1, $2, $3}, [$A];\n"
    "@p ld.global.nc.v4.f32 {$4, $5, $6, $7}, [$A+16];"
)
_U16X4 = "\n".join(f"@p ld.global.nc.u16 ${i}, [$A+{2 * i}];" for i in range(4))  # zero-extended
_U32X2 = "@p ld.global.nc.v2.u32 {$0, $1}, [$A];"
_HALF = "{ .reg .b16 a;\nmov.b16 a, 0;\n@p ld.global.nc.u16 a, [$A];\ncvt.f32.f16 $0, a;\n}"
_HALF_LO = "{ .reg .b16 lo, hi;\nmov.b32 {lo, hi}, $1;\ncvt.f32.f16 $0, lo;\n}"
_HALF_HI = "{ .reg .b16 lo, hi;\nmov.b32 {lo, hi}, $1;\ncvt.f32.f16 $0, hi;\n}"
_S8 = "{ .reg .b32 b;\nbfe.s32 b, $1, $2, 8;\ncvt.rn.f32.s32 $0, b;\n}"  # ptxas: I2F.S8 R.Bn

if IS_SIMULATOR:
    item, put, row, exp2, rcp = _item_sim, _put_sim, _row_sim, _exp2_sim, _rcp_sim
    lane_sum4 = device_function(_lane_sum4_sim)  # a device function: it names `cuda`
    div = _div_sim
    u16x4, u32x2, half = _u16x4_sim, _u32x2_sim, _half_sim
    half_lo, half_hi, s8, select = _half_lo_sim, _half_hi_sim, _s8_sim, _select_sim
    prmt = _prmt_sim
    xor_swap10 = device_function(_xor_swap10_sim)
else:
    from numbakv.cache.cuda import asm_function, asm_loader, int32_quotient, row_item, row_store

    item, put = row_item(), row_store()
    lane_sum4, div, xor_swap10 = _lane_sum4, int32_quotient(), _xor_swap10
    words = (_WORDS4, 4, "int32")
    row = asm_loader({"float16": words, "uint16": words, "float32": (_F32X8, 8, "float32")})
    u16x4 = asm_loader({"uint8": (_U16X4, 4, "int32")})
    u32x2 = asm_loader({"uint8": (_U32X2, 2, "int32")})
    half = asm_loader({"uint8": (_HALF, 1, "float32")})
    exp2 = asm_function("ex2.approx.ftz.f32 $0, $1;", "=f,f", "float32", "float32")
    rcp = asm_function("rcp.approx.ftz.f32 $0, $1;", "=f,f", "float32", "float32")
    half_lo = asm_function(_HALF_LO, "=f,r", "float32", "int32")
    half_hi = asm_function(_HALF_HI, "=f,r", "float32", "int32")
    s8 = asm_function(_S8, "=f,r,r", "float32", ("int32", "int32"))
    select = asm_function("lop3.b32 $0, $2, $3, $1, 0xE4;", "=r,r,r,r", "int32", ("int32",) * 3)
    prmt = asm_function("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", "int32", ("int32",) * 3)
