"""Quantizers for the GGUF block types `gguf`'s own `quants.quantize` does not write (the K-quants
and the IQ4 ones): plain, one-pass scale choices (the maximum of each sub-block, scales rounded
to their stored widths), not llama.cpp's error-minimising searches, but valid blocks of each
layout that `gguf.quants.dequantize` (ggml's reference decoding) reads back. The tests make
their quantized GGUF files with them (`scripts/hf-to-gguf.py --outtype q4_k ...`) and check
strata's decoding against that reference; a real model should be quantized by llama.cpp.

`quantize(array, qtype)` takes an f32 array whose last axis is a multiple of the block size and
returns its blocks as uint8 rows, as `gguf.quants.quantize` does (which it calls for the other
types), a chunk of rows at a time.
"""

import numpy as np

import gguf

Q = gguf.GGMLQuantizationType
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def f16(values):
    """The values as F16: (their bytes (..., 2), the rounded values as f32)."""
    h = np.asarray(values, dtype=np.float32).astype(np.float16)
    return h.view(np.uint8).reshape(*h.shape, 2), h.astype(np.float32)


def ratio(a, b):
    """a / b, 0 where b is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0, a / np.where(b == 0, 1, b)).astype(np.float32)


def pack_nibbles(low, high):
    return (low.astype(np.uint8) & 0xF) | (high.astype(np.uint8) << 4)


def min_scale_blocks(x, levels, scale_levels):
    """Sub-blocks x (nb, subs, n) as d * sc * q - dmin * m with q in [0, levels]: the F16 d and
    dmin, the integer sc and m (0..scale_levels) and codes q."""
    mn = np.minimum(x.min(-1), 0)
    scale = (x.max(-1) - mn) / levels
    d_bytes, d = f16(scale.max(-1) / scale_levels)
    dmin_bytes, dmin = f16((-mn).max(-1) / scale_levels)
    sc = np.clip(np.round(ratio(scale, d[:, None])), 0, scale_levels)
    m = np.clip(np.round(ratio(-mn, dmin[:, None])), 0, scale_levels)
    dl, ml = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.round(ratio(x + ml[..., None], dl[..., None])), 0, levels)
    return d_bytes, dmin_bytes, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def pack_k4_scales(sc, m):
    """Q4_K's and Q5_K's 12 bytes of 6-bit scales and mins of 8 sub-blocks."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def two_bit_codes(q):
    """Codes 0..3 of 256 weights (nb, 256) as 64 bytes: weight 128 h + 32 s + e in bits 2s of
    byte 32 h + e."""
    q = q.reshape(-1, 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def q4_k(blocks):
    x = blocks.reshape(-1, 8, 32)
    d, dmin, sc, m, q = min_scale_blocks(x, 15, 63)
    qs = pack_nibbles(q[:, 0::2], q[:, 1::2]).reshape(-1, 128)
    return np.concatenate([d, dmin, pack_k4_scales(sc, m), qs], axis=-1)


def q5_k(blocks):
    x = blocks.reshape(-1, 8, 32)
    d, dmin, sc, m, q = min_scale_blocks(x, 31, 63)
    qh = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for s in range(8):
        qh |= ((q[:, s] >> 4) & 1) << s
    qs = pack_nibbles(q[:, 0::2], q[:, 1::2]).reshape(-1, 128)
    return np.concatenate([d, dmin, pack_k4_scales(sc, m), qh, qs], axis=-1)


def q2_k(blocks):
    x = blocks.reshape(-1, 16, 16)
    d, dmin, sc, m, q = min_scale_blocks(x, 3, 15)
    return np.concatenate([sc | (m << 4), two_bit_codes(q.reshape(-1, 256)), d, dmin], axis=-1)


def q6_k(blocks):
    x = blocks.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d_bytes, d = f16(scale.max(-1) / 127)
    sc = np.clip(np.round(ratio(scale, d[:, None])), -128, 127)
    dl = d[:, None] * sc
    q = (np.clip(np.round(ratio(x, dl[..., None])), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    low, high = q & 0xF, q >> 4
    ql = pack_nibbles(low[:, :, :64], low[:, :, 64:]).reshape(-1, 128)
    qh = (high[:, :, 0:32] | (high[:, :, 32:64] << 2) | (high[:, :, 64:96] << 4) | (high[:, :, 96:] << 6)).reshape(-1, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d_bytes], axis=-1)


def q3_k(blocks):
    x = blocks.reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 4
    d_bytes, d = f16(scale.max(-1) / 31)
    sc = np.clip(np.round(ratio(scale, d[:, None])), 0, 31)
    dl = d[:, None] * sc
    u = (np.clip(np.round(ratio(x, dl[..., None])), -4, 3) + 4).astype(np.uint8).reshape(-1, 256)
    hbits = (u >> 2).reshape(-1, 8, 32)
    hmask = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for s in range(8):
        hmask |= hbits[:, s] << s
    v = (sc + 32).astype(np.uint8)  # stored 6-bit scales: sc - 32 is the scale
    scales = np.zeros((x.shape[0], 12), dtype=np.uint8)
    scales[:, 0:8] = (v[:, 0:8] & 0xF) | ((v[:, 8:16] & 0xF) << 4)
    for s in range(16):
        scales[:, 8 + s % 4] |= (v[:, s] >> 4) << (2 * (s // 4))
    return np.concatenate([hmask, two_bit_codes(u & 3), scales, d_bytes], axis=-1)


def nearest_iq4(scaled):
    return np.abs(scaled[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def extreme(x):
    """The signed value of largest magnitude along the last axis."""
    return np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]


def iq4_nl(blocks):
    x = blocks.reshape(-1, 32)
    d_bytes, d = f16(extreme(x) / -127)
    idx = nearest_iq4(ratio(x, d[:, None]))
    return np.concatenate([d_bytes, pack_nibbles(idx[:, :16], idx[:, 16:])], axis=-1)


def iq4_xs(blocks):
    x = blocks.reshape(-1, 8, 32)
    sub = extreme(x) / -127
    d_bytes, d = f16(-extreme(sub) / 32)
    sc = np.clip(np.round(ratio(sub, d[:, None])), -32, 31)
    idx = nearest_iq4(ratio(x, (d[:, None] * sc)[..., None]))
    v = (sc + 32).astype(np.uint16)
    scales_h = np.zeros(x.shape[0], dtype=np.uint16)
    for s in range(8):
        scales_h |= (v[:, s] >> 4) << (2 * s)
    v8 = v.astype(np.uint8)
    scales_l = (v8[:, 0::2] & 0xF) | ((v8[:, 1::2] & 0xF) << 4)
    qs = pack_nibbles(idx[..., :16], idx[..., 16:]).reshape(-1, 128)
    return np.concatenate([d_bytes, scales_h.view(np.uint8).reshape(-1, 2), scales_l, qs], axis=-1)


QUANTIZERS = {Q.Q2_K: q2_k, Q.Q3_K: q3_k, Q.Q4_K: q4_k, Q.Q5_K: q5_k, Q.Q6_K: q6_k, Q.IQ4_NL: iq4_nl, Q.IQ4_XS: iq4_xs}


# Rows quantized per call: bounds the temporaries of a large tensor (a layer's stacked experts).
CHUNK_ROWS = 1 << 14


def quantize(array, qtype, to_f32=lambda a: a):
    """`array` (its rows passed through `to_f32`, a chunk at a time) as `qtype`'s blocks."""
    rows = array.reshape(-1, array.shape[-1])
    parts = [quantize_rows(to_f32(rows[i : i + CHUNK_ROWS]), qtype) for i in range(0, rows.shape[0], CHUNK_ROWS)]
    out = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return out.reshape(*array.shape[:-1], out.shape[-1])


def quantize_rows(rows, qtype):
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if qtype not in QUANTIZERS:
        return gguf.quants.quantize(rows, qtype)
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    out = QUANTIZERS[qtype](rows.reshape(-1, block))
    assert out.shape[-1] == block_bytes, (qtype, out.shape)
    return out.reshape(rows.shape[0], rows.shape[1] // block * block_bytes)
