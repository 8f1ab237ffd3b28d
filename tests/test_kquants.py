"""The llama.cpp quantization types added for issue 7: Q4_1, Q5_0, Q5_1 (+ the Q8_1 activation type)
and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (+ the Q8_K activation type, and Q8_KM, Q8_K with a step
multiplier per 32 elements, which the core uses for Q4_K and Q5_K).

Every check is against numpy code written in this file from the block layouts (spec section 8,
core/src/quants_k.h), not against gguf's dequantizers:
  - dequantization of arbitrary block bytes, bit-exact (the numpy code does the same f32 operations);
  - the activation quantizers (Q8_K, Q8_KM, Q8_1), bit-exact;
  - the weight quantizers: a round trip within each format's error bound;
  - dot products (mul_mat) against float64 sums of the dequantized operands, within a bound
    derived from the f32 roundings (below);
  - the SIMD build against the portable scalar build (-DPI_NATIVE=OFF): K-quant and Q5_0 dot
    products are bit-identical (the SIMD code computes only the exact integer sums), the other
    32-element types agree within twice the dot bound;
  - the sparse FFN op with these weights against numpy.

Run: PYTHONPATH=bindings python -m pytest tests/test_kquants.py -q
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from powerinfer._ffi import check, ffi, lib
from test_ops import np_q8_act_blocks
from test_ops import np_quantize_q8_0 as np_quantize_q8_0_ops

REPO = Path(__file__).resolve().parents[1]
F32, Q8_0 = 0, 8
Q4_1, Q5_0, Q5_1, Q8_1 = 3, 6, 7, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
NAME = {Q4_1: "q4_1", Q5_0: "q5_0", Q5_1: "q5_1", Q8_1: "q8_1", Q2_K: "q2_K", Q3_K: "q3_K", Q4_K: "q4_K",
        Q5_K: "q5_K", Q6_K: "q6_K", Q8_K: "q8_K"}
IQ4_NL, IQ4_XS = 20, 23   # read-only types (no quantizer in the core): tests/test_iq_types.py
IQ3_XXS, IQ3_S = 18, 21
IQ2_XXS, IQ2_XS, IQ2_S = 16, 17, 22
IQ1_S, IQ1_M = 19, 29
MXFP4 = 39                # IQ4_NL's sibling (tests/test_iq_types.py, tests/test_mxfp4.py), with a quantizer
BLOCK = {Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_1: (32, 40), Q2_K: (256, 84), Q3_K: (256, 110),
         Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), Q8_K: (256, 292), Q8_0: (32, 34),
         IQ4_NL: (32, 18), IQ4_XS: (256, 136), IQ3_XXS: (256, 98), IQ3_S: (256, 110), IQ2_XXS: (256, 66),
         IQ2_XS: (256, 74), IQ2_S: (256, 82), IQ1_S: (256, 50), IQ1_M: (256, 56), MXFP4: (32, 17)}
WEIGHTS = [Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K]
KQUANTS = [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K]
# activation types (Q5_0: the core's Q8_0S, which holds the Q8_0 quants plus their sum)
# Q4_K/Q5_K: the core's Q8_KM (Q8_K with an integer step multiplier per 32, core/src/quants_k.h)
Q8_KM = lib.PI_TYPE_COUNT + 4        # core-internal type id (after Q8_0S, Q4_0X8, Q4_0R, Q8_0P)
Q8_KM_M = 32
ACT_BLOCK = {Q8_KM: (256, 308)}      # activation-only types: no GGUF id, not in BLOCK
ACT_TYPE = {Q4_1: Q8_1, Q5_0: Q8_0, Q5_1: Q8_1, Q2_K: Q8_K, Q3_K: Q8_K, Q4_K: Q8_KM, Q5_K: Q8_KM, Q6_K: Q8_K,
            IQ4_NL: Q8_0, IQ4_XS: Q8_K, IQ3_XXS: Q8_K, IQ3_S: Q8_K, IQ2_XXS: Q8_K, IQ2_XS: Q8_K, IQ2_S: Q8_K,
            IQ1_S: Q8_K, IQ1_M: Q8_K, MXFP4: Q8_0}
# the grid of the IQ4 types: quant q stands for IQ4_VALUES[q] (llama.cpp's kvalues_iq4nl)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)
# MXFP4's nibbles: E2M1 numbers (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) doubled (llama.cpp's kvalues_mxfp4)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int32)

U32 = 2.0 ** -24
U16 = 2.0 ** -11

# ---------------------------------------------------------------------------------------------
# Tolerances
# ---------------------------------------------------------------------------------------------
# Dot products. Within a block the dot product is an exact integer sum; the block then costs a
# few f32 roundings (scale products, the int -> float conversion of sums up to 2^25, the
# subtraction of the min term) relative to the magnitudes of its two terms, |sum_i x_i s_i| and
# |sum_i x_i m_i| (value_i = s_i + m_i: scale part and min part): BLOCK_ULPS * U32 each. Summing
# nb block results in f32 adds errors relative to the running sums, which behave like independent
# variables (Higham & Mary 2019): DOT_LAMBDA * sqrt(nb) U32 of the summed magnitudes with
# overwhelming probability. The errors seen are below 1/40 of this bound, and a single quant off by
# one step exceeds it 16x (q5_1, whose min terms are large) to 1700x (checked in
# test_dot_tolerance_is_tight).
BLOCK_ULPS = 8
DOT_LAMBDA = 5.0
SIMD_VS_SCALAR_FACTOR = 2.0   # both results lie within the bound of the same exact value

# Round trips of the weight quantizers: relative RMS error on standard normal rows. The bound is
# the value measured for these quantizers (in parentheses) + 20%; the same algorithm as llama.cpp's
# reference quantizers, so the same numbers as llama.cpp's `quantize` without an importance matrix.
ROUND_TRIP_REL_RMS = {Q4_1: 0.094,   # (0.078)
                      Q5_0: 0.052,   # (0.043)
                      Q5_1: 0.046,   # (0.038)
                      Q2_K: 0.36,    # (0.297)
                      Q3_K: 0.18,    # (0.151)
                      Q4_K: 0.086,   # (0.071)
                      Q5_K: 0.044,   # (0.036)
                      Q6_K: 0.022}   # (0.018)


# ---------------------------------------------------------------------------------------------
# numpy dequantizers, written from the block layouts
# ---------------------------------------------------------------------------------------------
def f16(raw: np.ndarray, off: int, f=np.float32) -> np.ndarray:
    """(nb, bytes) uint8 -> (nb,) values of the fp16 at byte offset off (as f32, or float64)."""
    return raw[:, off:off + 2].copy().view(np.float16).astype(f).ravel()


def e8m0_half(e: np.ndarray, f=np.float32) -> np.ndarray:
    """E8M0 bytes e -> 2^(e - 128), half the scale 2^(e - 127) they stand for (MXFP4's values are doubled): exact in
    f32 too (e = 0, 1: the subnormals 2^-128, 2^-127)."""
    return np.ldexp(f(1), e.astype(np.int32).ravel() - 128).astype(f)


def f32_at(raw: np.ndarray, off: int, f=np.float32) -> np.ndarray:
    return raw[:, off:off + 4].copy().view(np.float32).astype(f).ravel()


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(nb, 16) packed -> (nb, 32): low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def high_bits_32(qh: np.ndarray) -> np.ndarray:
    """(nb, 4) little-endian u32 -> (nb, 32) bit j of the u32 for element j."""
    u = qh.copy().view(np.uint32).ravel()
    return ((u[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)


def k4_scales_mins(s: np.ndarray):
    """(nb, 12) packed Q4_K/Q5_K scales -> two (nb, 8) int arrays of 6-bit scales and mins."""
    s = s.astype(np.int32)
    sc = np.empty((s.shape[0], 8), np.int32)
    mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[:, j] = s[:, j] & 63
            mn[:, j] = s[:, j + 4] & 63
        else:
            sc[:, j] = (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4)
            mn[:, j] = (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)
    return sc, mn


def k3_scales(s: np.ndarray) -> np.ndarray:
    """(nb, 12) packed Q3_K scales -> (nb, 16) signed scales: low 4 bits in the nibbles of bytes 0..7
    (sub-blocks 0..7 low nibbles, 8..15 high nibbles), high 2 bits in bytes 8..11."""
    s = s.astype(np.int32)
    out = np.empty((s.shape[0], 16), np.int32)
    for j in range(16):
        lo = s[:, j] & 0xF if j < 8 else s[:, j - 8] >> 4
        hi = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        out[:, j] = (lo | (hi << 4)) - 32
    return out


def two_bit_planes(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K low bits: (nb, 64) -> (nb, 256); element e = 128h + 32g + l sits in qs[32h + l] >> 2g."""
    q = qs.astype(np.int32)
    out = np.empty((qs.shape[0], 256), np.int32)
    for h in range(2):
        for g in range(4):
            out[:, 128 * h + 32 * g:128 * h + 32 * g + 32] = (q[:, 32 * h:32 * h + 32] >> (2 * g)) & 3
    return out


def iq_grid(t: int) -> np.ndarray:
    """The IQ3 / IQ2 / IQ1 type's grid as (points, 4 or 8) uint8 (IQ1: int8, values -1, 0, 1): the format's data,
    taken from gguf-py (its quants.py)."""
    import gguf
    cls = {IQ3_XXS: gguf.quants.IQ3_XXS, IQ3_S: gguf.quants.IQ3_S, IQ2_XXS: gguf.quants.IQ2_XXS,
           IQ2_XS: gguf.quants.IQ2_XS, IQ2_S: gguf.quants.IQ2_S, IQ1_S: gguf.quants.IQ1_S, IQ1_M: gguf.quants.IQ1_S}[t]
    cls.init_grid()
    return np.asarray(cls.grid, np.float32).reshape(cls.grid_shape).astype(np.int8 if t in (IQ1_S, IQ1_M) else np.uint8)


def np_dequant(raw: np.ndarray, t: int, with_parts: bool = False):
    """Flat uint8 blocks of type t -> f32 values, computed with the f32 operations of the C code.

    with_parts: the exact values instead (float64 arithmetic, no rounding), as (value, s, m) with
    value = s + m: the scale part s and the min part m, which the dot-product tolerance is relative to."""
    bs, bb = BLOCK[t]
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, bb)
    nb = b.shape[0]
    f = np.float64 if with_parts else np.float32
    m_part = np.zeros((nb, bs), f)
    if t == Q4_1:
        d, m = f16(b, 0, f), f16(b, 2, f)
        q = nibbles(b[:, 4:20]).astype(f)
        v = q * d[:, None] + m[:, None]
        s_part, m_part = q * d[:, None], np.broadcast_to(m[:, None], q.shape)
    elif t in (Q5_0, Q5_1):
        off = 2 if t == Q5_0 else 4
        d = f16(b, 0, f)
        q = (nibbles(b[:, off + 4:off + 20]) | (high_bits_32(b[:, off:off + 4]) << 4))
        if t == Q5_0:
            v = (q - 16).astype(f) * d[:, None]
            s_part = v
        else:
            m = f16(b, 2, f)
            v = q.astype(f) * d[:, None] + m[:, None]
            s_part, m_part = q.astype(f) * d[:, None], np.broadcast_to(m[:, None], q.shape)
    elif t == Q8_1:
        v = b[:, 8:40].view(np.int8).astype(f) * f32_at(b, 0, f)[:, None]
        s_part = v
    elif t == Q8_K:
        v = f32_at(b, 0, f)[:, None] * b[:, 4:260].view(np.int8).astype(f)
        s_part = v
    elif t == Q2_K:   # scales[16] | qs[64] | d | dmin
        sc = b[:, 0:16].astype(np.int32)
        d, dmin = f16(b, 80, f), f16(b, 82, f)
        q = two_bit_planes(b[:, 16:80]).astype(f)
        dl = np.repeat(d[:, None] * (sc & 0xF).astype(f), 16, axis=1)      # exact: 11 x 4 bits
        ml = np.repeat(dmin[:, None] * (sc >> 4).astype(f), 16, axis=1)
        v = dl * q - ml
        s_part, m_part = dl * q, -ml
    elif t == Q3_K:   # hmask[32] | qs[64] | scales[12] | d
        d = f16(b, 108, f)
        sc = k3_scales(b[:, 96:108])
        hm = b[:, 0:32].astype(np.int32)
        hi = np.concatenate([(hm >> k) & 1 for k in range(8)], axis=1)     # element e: bit e/32 of hmask[e%32]
        q = (two_bit_planes(b[:, 32:96]) + 4 * hi - 4).astype(f)
        v = np.repeat(d[:, None] * sc.astype(f), 16, axis=1) * q
        s_part = v
    elif t in (Q4_K, Q5_K):   # d | dmin | scales[12] | (qh[32]) | qs[128]
        d, dmin = f16(b, 0, f), f16(b, 2, f)
        sc, mn = k4_scales_mins(b[:, 4:16])
        qs = b[:, 16:144] if t == Q4_K else b[:, 48:176]
        q = np.empty((nb, 256), np.int32)
        for j in range(4):   # 64 elements: low nibbles of qs[32j..32j+31], then the high nibbles
            q[:, 64 * j:64 * j + 32] = qs[:, 32 * j:32 * j + 32] & 0xF
            q[:, 64 * j + 32:64 * j + 64] = qs[:, 32 * j:32 * j + 32] >> 4
        if t == Q5_K:
            qh = b[:, 16:48].astype(np.int32)
            for j in range(8):    # sub-block j (32 elements) takes bit j of qh[l]
                q[:, 32 * j:32 * j + 32] |= ((qh >> j) & 1) << 4
        dl = np.repeat(d[:, None] * sc.astype(f), 32, axis=1)
        ml = np.repeat(dmin[:, None] * mn.astype(f), 32, axis=1)
        v = dl * q.astype(f) - ml
        s_part, m_part = dl * q.astype(f), -ml
    elif t == Q6_K:   # ql[128] | qh[64] | scales[16] int8 | d
        d = f16(b, 208, f)
        sc = b[:, 192:208].view(np.int8).astype(f)
        ql, qh = b[:, 0:128].astype(np.int32), b[:, 128:192].astype(np.int32)
        q = np.empty((nb, 256), np.int32)
        for h in range(2):
            L, H = ql[:, 64 * h:64 * h + 64], qh[:, 32 * h:32 * h + 32]
            o = 128 * h
            q[:, o + 0:o + 32] = (L[:, :32] & 0xF) | ((H & 3) << 4)
            q[:, o + 32:o + 64] = (L[:, 32:] & 0xF) | (((H >> 2) & 3) << 4)
            q[:, o + 64:o + 96] = (L[:, :32] >> 4) | (((H >> 4) & 3) << 4)
            q[:, o + 96:o + 128] = (L[:, 32:] >> 4) | (((H >> 6) & 3) << 4)
        v = np.repeat(d[:, None] * sc, 16, axis=1) * (q - 32).astype(f)
        s_part = v
    elif t == IQ4_NL:   # d | qs[16]: value d * grid[q]
        v = f16(b, 0, f)[:, None] * IQ4_VALUES[nibbles(b[:, 2:18])].astype(f)
        s_part = v
    elif t == MXFP4:    # e | qs[16]: value 2^(e - 128) * MXFP4_VALUES[q]
        v = e8m0_half(b[:, 0], f)[:, None] * MXFP4_VALUES[nibbles(b[:, 1:17])].astype(f)
        s_part = v
    elif t == IQ4_XS:   # d | scales_h (u16) | scales_l[4] | qs[128]: value (d (ls_j - 32)) * grid[q]
        d = f16(b, 0, f)
        sh = b[:, 2:4].copy().view(np.uint16).astype(np.int32).ravel()
        v = np.empty((nb, 256), f)
        for j in range(8):
            ls = ((b[:, 4 + j // 2].astype(np.int32) >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
            dl = d * (ls - 32).astype(f)
            v[:, 32 * j:32 * j + 32] = dl[:, None] * IQ4_VALUES[nibbles(b[:, 8 + 16 * j:24 + 16 * j])].astype(f)
        s_part = v
    elif t in (IQ3_XXS, IQ3_S):   # value (d ls_j-step) * grid value * sign, 8 grid points of 4 values a sub-block
        d = f16(b, 0, f)
        grid = iq_grid(t)
        if t == IQ3_XXS:   # d | qs[64] grid indices | 8 x u32: 4 x 7-bit sign index (+ parity bit), s_j in bits 28..31
            idx = b[:, 2:66].astype(np.int64)
            aux = b[:, 66:98].copy().view("<u4").astype(np.int64)                      # (nb, 8)
            step = (d[:, None] * (f(0.5) + (aux >> 28).astype(f)) * f(0.5)).astype(f)
            i7 = (aux[:, :, None] >> (7 * np.arange(4))) & 127                         # (nb, 8, 4)
            parity = np.array([bin(i).count("1") & 1 for i in range(128)], np.int64)
            sbyte = i7 | parity[i7] << 7
            neg = (sbyte[..., None] >> np.arange(8)) & 1                               # (nb, 8, 4, 8)
        else:              # d | qs[64] | qh[8] (index bit 8) | signs[32] (a bit each) | scales[4] (nibble s_j)
            idx = b[:, 2:66].astype(np.int64) | (((b[:, 66:74, None] >> np.arange(8)) & 1).reshape(nb, 64) << 8)
            sc = (b[:, 106:110, None].astype(np.int64) >> np.array([0, 4])) & 15        # (nb, 4, 2)
            step = (d[:, None] * (1 + 2 * sc.reshape(nb, 8)).astype(f)).astype(f)
            neg = (b[:, 74:106, None] >> np.arange(8)) & 1                             # (nb, 32, 8)
        g = grid[idx].reshape(nb, 8, 32).astype(f)
        sign = np.where(neg.reshape(nb, 8, 32) == 1, f(-1), f(1))
        v = ((step[:, :, None] * g).astype(f) * sign).astype(f).reshape(nb, 256)
        s_part = v
    elif t in (IQ2_XXS, IQ2_XS, IQ2_S):   # value (d (0.5 + s) 0.25) * grid value * sign, 4 points of 8 a sub-block
        d = f16(b, 0, f)
        grid = iq_grid(t)
        parity = np.array([bin(i).count("1") & 1 for i in range(128)], np.int64)
        if t == IQ2_XXS:   # d | per sub-block u32 (4 index bytes), u32 (4 x 7-bit sign index, s in bits 28..31)
            aux = b[:, 2:66].copy().view("<u4").astype(np.int64).reshape(nb, 8, 2)
            idx = (aux[:, :, 0:1] >> (8 * np.arange(4))) & 255                          # (nb, 8, 4)
            i7 = (aux[:, :, 1:2] >> (7 * np.arange(4))) & 127
            sbyte = i7 | parity[i7] << 7
            sc = np.repeat(aux[:, :, 1] >> 28, 2, axis=1)                               # (nb, 16) per 16
        elif t == IQ2_XS:  # d | 32 x u16 (9-bit index, 7-bit sign index) | scales[8] (nibble per 16)
            q = b[:, 2:66].copy().view("<u2").astype(np.int64).reshape(nb, 8, 4)
            idx, i7 = q & 511, q >> 9
            sbyte = i7 | parity[i7] << 7
            sc = ((b[:, 66:74, None].astype(np.int64) >> np.array([0, 4])) & 15).reshape(nb, 16)
        else:              # d | qs[32] | signs[32] | qh[8] (2 bits per index) | scales[8]
            qh = (b[:, 66:74, None].astype(np.int64) >> (2 * np.arange(4))) & 3            # (nb, 8, 4)
            idx = b[:, 2:34].astype(np.int64).reshape(nb, 8, 4) | qh << 8
            sbyte = b[:, 34:66].astype(np.int64).reshape(nb, 8, 4)
            sc = ((b[:, 74:82, None].astype(np.int64) >> np.array([0, 4])) & 15).reshape(nb, 16)
        neg = (sbyte[..., None] >> np.arange(8)) & 1                                       # (nb, 8, 4, 8)
        step = (d[:, None] * (f(0.5) + sc.astype(f)) * f(0.25)).astype(f)                   # (nb, 16)
        g = grid[idx].reshape(nb, 16, 16).astype(f)
        sign = np.where(neg.reshape(nb, 16, 16) == 1, f(-1), f(1))
        v = ((step[:, :, None] * g).astype(f) * sign).astype(f).reshape(nb, 256)
        s_part = v
    elif t in (IQ1_S, IQ1_M):   # value (d ls) * (g + delta), g in {-1, 0, 1}, delta +-1/8: (g + delta) = (8 g +- 1) / 8
        grid = iq_grid(t).astype(np.int64)
        if t == IQ1_S:   # d | qs[32] (index bits 0..7) | qh[8] u16 (3 index bits per point, s in 12..14, delta sign 15)
            d = f16(b, 0, f)
            qs = b[:, 2:34].astype(np.int64).reshape(nb, 8, 4)
            qh = b[:, 34:50].copy().view("<u2").astype(np.int64)                          # (nb, 8)
            idx = qs | ((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8
            delta = np.repeat(np.where(qh >> 15 & 1, -1, 1)[:, :, None], 4, axis=2)      # (nb, 8, 4)
            ls = np.repeat(2 * (qh >> 12 & 7) + 1, 2, axis=1)                            # (nb, 16) per 16
        else:            # qs[32] | qh[16] (a nibble per point: 3 index bits, delta sign) | scales[8] (4 u16)
            sc = b[:, 48:56].copy().view("<u2").astype(np.int64)                           # (nb, 4)
            dbits = (sc[:, 0] >> 12) | (sc[:, 1] >> 8 & 0xf0) | (sc[:, 2] >> 4 & 0xf00) | (sc[:, 3] & 0xf000)
            d = dbits.astype(np.uint16).view(np.float16).astype(f)
            qs = b[:, 0:32].astype(np.int64).reshape(nb, 8, 4)
            nib = ((b[:, 32:48, None].astype(np.int64) >> np.array([0, 4])) & 15).reshape(nb, 8, 4)
            idx = qs | (nib & 7) << 8
            delta = np.where(nib & 8, -1, 1)
            s = (sc[:, :, None] >> np.array([0, 6])).reshape(nb, 8)                       # sub-block j's 6 bits
            ls = ((s[:, :, None] >> np.array([0, 3])) & 7).reshape(nb, 16) * 2 + 1
        vq = 8 * grid[idx] + delta[..., None]                                             # (nb, 8, 4, 8)
        step = (d[:, None] * ls.astype(f)).astype(f)                                      # (nb, 16)
        v = (step[:, :, None] * (vq.reshape(nb, 16, 16).astype(f) * f(0.125))).astype(f).reshape(nb, 256)
        s_part = v
    else:
        raise ValueError(t)
    if not with_parts:
        return np.asarray(v, np.float32).reshape(-1)
    s_part, m_part = np.asarray(s_part, np.float64).reshape(-1), np.asarray(m_part, np.float64).reshape(-1)
    return s_part + m_part, s_part, m_part


# ---------------------------------------------------------------------------------------------
# numpy activation quantizers (bit-exact models of the C ones)
# ---------------------------------------------------------------------------------------------
def np_quantize_q8_K(x: np.ndarray) -> np.ndarray:
    """d = max / -127 (max: the element of largest magnitude, the first of ties),
    q = round-half-even(x * (-127 / max))."""
    x = np.asarray(x, np.float32).reshape(-1, 256)
    nb = x.shape[0]
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(nb), idx]
    out = np.zeros((nb, 292), np.uint8)
    ok = mx != 0
    with np.errstate(divide="ignore"):
        iscale = np.where(ok, np.float32(-127.0) / np.where(ok, mx, 1), 0).astype(np.float32)
    q = np.clip(np.rint((iscale[:, None] * x).astype(np.float32)), -127, 127).astype(np.int8)
    q[~ok] = 0
    d = np.where(ok, np.float32(1.0) / np.where(ok, iscale, 1), 0).astype(np.float32)
    out[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    out[:, 4:260] = q.view(np.uint8)
    out[:, 260:292] = q.reshape(nb, 16, 16).astype(np.int16).sum(axis=2).astype(np.int16).view(np.uint8).reshape(nb, 32)
    return out.reshape(-1)


def np_quantize_q8_Km(x: np.ndarray) -> np.ndarray:
    """Q8_KM: amax and amax_j (the block's and each sub-block of 32's largest |x|), d = amax / (127 M),
    m_j = clip(ceil(M amax_j / amax), 1, M), q = round-half-even(clip(x * (1 / (d m_j)), -127, 127)), f32
    operations in that order; bsums per 16 as Q8_K; zero blocks all zero with m_j = 1."""
    f = np.float32
    x = np.asarray(x, f).reshape(-1, 256)
    nb = x.shape[0]
    sub = np.abs(x).reshape(nb, 8, 32).max(axis=2)
    amax = sub.max(axis=1)
    ok = amax != 0
    a = np.where(ok, amax, f(1)).astype(f)
    d = (a / f(127 * Q8_KM_M)).astype(f)
    m = np.clip(np.ceil((f(Q8_KM_M) * sub).astype(f) / a[:, None]), 1, Q8_KM_M).astype(np.int32)
    m[~ok] = 1
    iscale = (f(1) / (d[:, None] * m.astype(f)).astype(f)).astype(f)
    v = np.clip((np.repeat(iscale, 32, axis=1) * x).astype(f), -127, 127)
    q = np.rint(v).astype(np.int8)
    q[~ok] = 0
    d[~ok] = 0
    out = np.zeros((nb, 308), np.uint8)
    out[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    out[:, 4:260] = q.view(np.uint8)
    out[:, 260:292] = q.reshape(nb, 16, 16).astype(np.int16).sum(axis=2).astype(np.int16).view(np.uint8).reshape(nb, 32)
    out[:, 292:308] = m.astype(np.int16).view(np.uint8).reshape(nb, 16)
    return out.reshape(-1)


def np_quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """Q8_1: the activation blocks (np_q8_act_blocks) with f32 d and s = sum(q) * d."""
    d, q = np_q8_act_blocks(x)
    nb = d.size
    s = (q.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float32)
    out = np.zeros((nb, 40), np.uint8)
    out[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    out[:, 4:8] = s.view(np.uint8).reshape(nb, 4)
    out[:, 8:40] = q.view(np.uint8)
    return out.reshape(-1)


def np_quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 activations (Q8_0S's d and quants), flat bytes."""
    return np_quantize_q8_0_ops(x, activations=True).reshape(-1)


def np_dequant_act(raw, t):
    """Exact (float64) values of quantized activations."""
    if t == Q8_0:
        b = raw.reshape(-1, 34)
        return (b[:, 2:].view(np.int8).astype(np.float64) * f16(b, 0, np.float64)[:, None]).reshape(-1)
    if t == Q8_KM:   # d * m_j * q, exact in float64
        b = raw.reshape(-1, 308)
        m = np.repeat(b[:, 292:308].copy().view(np.int16).astype(np.float64), 32, axis=1)
        return (f32_at(b, 0, np.float64)[:, None] * m * b[:, 4:260].view(np.int8).astype(np.float64)).reshape(-1)
    return np_dequant(raw, t, with_parts=True)[0]


NP_ACT_QUANT = {Q8_K: np_quantize_q8_K, Q8_KM: np_quantize_q8_Km, Q8_1: np_quantize_q8_1, Q8_0: np_quantize_q8_0}


# ---------------------------------------------------------------------------------------------
# C helpers
# ---------------------------------------------------------------------------------------------
def c_quantize(t, x, L=lib) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32).ravel()
    bs, bb = BLOCK[t] if t in BLOCK else ACT_BLOCK[t]
    dst = np.zeros(x.size // bs * bb, np.uint8)
    check(L.pi_quantize_row(t, ffi.from_buffer("float[]", x), ffi.from_buffer(dst), x.size))
    return dst


def c_dequantize(t, raw, L=lib) -> np.ndarray:
    raw = np.ascontiguousarray(raw).view(np.uint8).ravel()
    bs, bb = BLOCK[t] if t in BLOCK else ACT_BLOCK[t]
    n = raw.size // bb * bs
    out = np.zeros(n, np.float32)
    check(L.pi_dequantize_row(t, ffi.from_buffer(raw), ffi.from_buffer("float[]", out), n))
    return out


def tensor(arr: np.ndarray, t: int, ne0: int, ne1: int):
    """2-d pi_tensor [ne0, ne1] over a contiguous numpy buffer (rows of type t)."""
    bs, bb = BLOCK.get(t, (1, 4))
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t, 2
    p.ne[0], p.ne[1], p.ne[2], p.ne[3] = ne0, ne1, 1, 1
    p.nb[0] = bb
    p.nb[1] = ne0 // bs * bb
    p.nb[2] = p.nb[3] = p.nb[1] * ne1
    p.data = ffi.cast("void *", arr.ctypes.data)
    return p


def c_mul_mat(t, raw, x, L=lib, pool=ffi.NULL) -> np.ndarray:
    """y (T, N) = x (T, K) . W^T with W the N x K rows of type t in raw."""
    T, K = x.shape
    N = raw.size // (K // BLOCK[t][0] * BLOCK[t][1])
    x = np.ascontiguousarray(x, np.float32)
    y = np.zeros((T, N), np.float32)
    check(L.pi_op_mul_mat(pool, tensor(raw, t, K, N), tensor(x, F32, K, T), tensor(y, F32, N, T)))
    return y


def random_blocks(rng, t, nb) -> np.ndarray:
    """nb blocks of type t with random bytes and finite, moderate fp16/f32 scales."""
    bs, bb = BLOCK[t]
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)

    def put16(off, lo=1e-3, hi=1.0, signed=False):
        v = rng.uniform(lo, hi, nb) * (rng.choice([-1, 1], nb) if signed else 1)
        b[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(nb, 2)

    def put32(off, lo=1e-3, hi=1.0):
        b[:, off:off + 4] = rng.uniform(lo, hi, nb).astype(np.float32).view(np.uint8).reshape(nb, 4)

    if t in (Q4_1, Q5_1):
        put16(0), put16(2, signed=True)
    elif t == Q5_0:
        put16(0, signed=True)
    elif t == Q8_1:
        put32(0), put32(4)
    elif t == Q8_K:
        put32(0)
        b[:, 4:260] = np.clip(b[:, 4:260].view(np.int8), -127, 127).view(np.uint8)
        b[:, 260:292] = b[:, 4:260].view(np.int8).reshape(nb, 16, 16).astype(np.int16).sum(axis=2).astype(
            np.int16).view(np.uint8)
    elif t == Q2_K:
        put16(80), put16(82)
    elif t == Q3_K:
        put16(108, signed=True)
    elif t in (Q4_K, Q5_K):
        put16(0), put16(2)
    elif t == Q6_K:
        put16(208, signed=True)
    elif t in (IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S):
        put16(0, signed=True)
    elif t == MXFP4:   # E8M0 scales 2^-16 .. 2^7 (2^(e - 128), e 112..135)
        b[:, 0] = rng.integers(112, 136, nb)
    elif t == IQ1_M:   # d's 16 bits in the top nibbles of the four scale words
        dbits = (rng.uniform(1e-3, 1.0, nb) * rng.choice([-1, 1], nb)).astype(np.float16).view(np.uint16).astype(np.int64)
        sc = b[:, 48:56].copy().view("<u2").astype(np.int64)
        sc = (sc & 0x0fff) | ((dbits[:, None] >> (4 * np.arange(4))) & 15) << 12
        b[:, 48:56] = sc.astype("<u2").view(np.uint8)
    return b.reshape(-1)


def assert_within(got, ref, tol, what=""):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    err = np.abs(got - ref)
    bad = err > tol
    if bad.any():
        i = np.unravel_index(np.argmax(err - tol), err.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} out of tolerance; worst at {i}: got {got[i]!r} "
                             f"ref {ref[i]!r} err {err[i]:.3g} tol {np.broadcast_to(tol, err.shape)[i]:.3g}")


def bits_equal(a, b) -> bool:
    return np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


# =============================================================================================
# traits
# =============================================================================================
def test_type_traits():
    for t, (bs, bb) in BLOCK.items():
        assert lib.pi_type_supported(t) == 1
        assert lib.pi_type_block_size(t) == bs and lib.pi_type_block_bytes(t) == bb
        assert lib.pi_row_bytes(t, 4096) == 4096 // bs * bb
    for t in NAME:
        assert ffi.string(lib.pi_type_name(t)).decode() == NAME[t]
    for t in KQUANTS + [Q8_K]:
        assert lib.pi_row_bytes(t, 128) == -1 and lib.pi_row_bytes(t, 512) == 2 * BLOCK[t][1]
    assert lib.PI_TYPE_Q4_K == Q4_K and lib.PI_TYPE_Q8_K == Q8_K and lib.PI_TYPE_Q5_0 == Q5_0


# =============================================================================================
# dequantization: arbitrary block bytes, bit-exact against numpy
# =============================================================================================
@pytest.mark.parametrize("t", list(NAME), ids=NAME.get)
def test_dequantize_random_blocks(t):
    rng = np.random.default_rng(1000 + t)
    raw = random_blocks(rng, t, 64)
    got = c_dequantize(t, raw)
    ref = np_dequant(raw, t)
    assert bits_equal(got, ref), f"{NAME[t]}: {np.sum(got != ref)} values differ"


@pytest.mark.parametrize("t", WEIGHTS, ids=NAME.get)
def test_dequantize_matches_gguf_layout_of_real_quantizations(t):
    """The rows the C quantizer writes decode identically with the numpy layout code."""
    rng = np.random.default_rng(2000 + t)
    x = (rng.standard_normal(8 * 256) * np.repeat(10.0 ** rng.uniform(-3, 2, 8), 256)).astype(np.float32)
    raw = c_quantize(t, x)
    assert bits_equal(c_dequantize(t, raw), np_dequant(raw, t))


# =============================================================================================
# activation quantizers
# =============================================================================================
@pytest.mark.parametrize("t", [Q8_K, Q8_1], ids=NAME.get)
def test_activation_quantizer_bit_exact(t):
    rng = np.random.default_rng(3000 + t)
    x = (rng.standard_normal(16 * 256) * np.repeat(10.0 ** rng.uniform(-6, 4, 16 * 8), 32)).astype(np.float32)
    x[:256] = 0.0                              # an all-zero block: d = 0
    x[256:512] = np.linspace(-1, 1, 256)       # the max is the last element: ties of |x|
    x[512 + 7] = -1e3                          # a negative max
    x[768:800] = (np.arange(32) - 15.5) / 8    # 32-blocks: amax 15.875 (below), 127 / amax = 8, so every other
    x[768] = -15.875                           # product is a half: ties to even
    got = c_quantize(t, x)
    assert np.array_equal(got, NP_ACT_QUANT[t](x)), f"{NAME[t]} bytes differ"
    # the round trip is within half a step per element
    b = x.reshape(-1, BLOCK[t][0]).astype(np.float64)
    step = np.abs(b).max(axis=1, keepdims=True) / 127.0
    assert np.all(np.abs(np_dequant(got, t).reshape(b.shape) - b) <= step * (0.5 + 1e-5) + 1e-30)


def outlier_activations(rng, nb):
    """nb blocks of 256 like Gemma's: sub-blocks of 32 of scales 1e-2..1e1 and a few single outliers."""
    x = rng.standard_normal(nb * 256) * np.repeat(10.0 ** rng.uniform(-2, 1, nb * 8), 32)
    spikes = rng.choice(x.size, nb // 2 + 1, replace=False)
    x[spikes] = rng.choice([-1, 1], spikes.size) * rng.uniform(50, 500, spikes.size)
    return x.astype(np.float32)


def test_q8_Km_quantizer():
    """Q8_KM (the activations of Q4_K/Q5_K): the bytes are numpy's, and each sub-block of 32 gets a step
    d m_j of at most amax_j / 127 + amax / (127 M) (its own resolution, not the block's), every element within
    half a step; the sub-block holding the block's largest |x| has m_j = M, which makes it Q8_K's step."""
    rng = np.random.default_rng(3100)
    x = outlier_activations(rng, 32)
    x[:256] = 0.0                                     # a zero block
    x[256:512] = np.linspace(-1, 1, 256)               # ties of |x|
    x[512:768] = 1e-30 * rng.standard_normal(256)      # tiny values
    x[768 + 40] = -1e4                                 # one huge outlier in sub-block 1
    got = c_quantize(Q8_KM, x)
    assert np.array_equal(got, np_quantize_q8_Km(x)), "q8_Km bytes differ"
    b = got.reshape(-1, 308)
    d = b[:, 0:4].copy().view(np.float32).astype(np.float64).ravel()
    m = b[:, 292:308].copy().view(np.int16).astype(np.float64)
    assert np.all((m >= 1) & (m <= Q8_KM_M))
    xs = x.reshape(-1, 8, 32).astype(np.float64)
    amax_j = np.abs(xs).max(axis=2)
    amax = amax_j.max(axis=1, keepdims=True)
    step = d[:, None] * m
    assert np.all(step <= amax_j / 127 + amax / (127 * Q8_KM_M) * (1 + 1e-5))
    top = amax_j == amax
    assert np.all(m[top & (amax > 0)] == Q8_KM_M)
    err = np.abs(np_dequant_act(got, Q8_KM).reshape(xs.shape) - xs)
    assert np.all(err <= step[:, :, None] * (0.5 + 1e-5) + 1e-37)
    dm = (d.astype(np.float32)[:, None] * m.astype(np.float32)).astype(np.float32)           # to_f32: (d m_j) q in f32
    f32_vals = (np.repeat(dm, 32, axis=1) * b[:, 4:260].view(np.int8).astype(np.float32)).astype(np.float32)
    assert bits_equal(c_dequantize(Q8_KM, got), f32_vals.ravel())
    # against one step per 256 (Q8_K), the squared error of such activations is far smaller
    q8k = np_dequant_act(c_quantize(Q8_K, x), Q8_K).reshape(xs.shape)
    assert np.sum(err ** 2) < 0.1 * np.sum((q8k - xs) ** 2)


@pytest.mark.parametrize("t", [Q4_K, Q5_K], ids=NAME.get)
def test_q8_Km_dot_int32_budget(t):
    """The largest integer sums a super-block can have: every quant at its maximum (15 / 31), every scale and
    min 63, every activation at -127 with m_j = M (all elements equal): the int32 sums must not wrap."""
    bs, bb = BLOCK[t]
    b = np.full((4, bb), 0xff, np.uint8)
    b[:, 0:2] = np.array([0.01], np.float16).view(np.uint8)
    b[:, 2:4] = np.array([0.001], np.float16).view(np.uint8)
    x = np.full((1, 4 * 256), -3.0, np.float32)
    ref, tol = dot_reference(t, b.reshape(-1), x)
    assert_within(c_mul_mat(t, b.reshape(-1), x), ref, tol, f"{NAME[t]} at the int32 budget")
    assert np.all(np_quantize_q8_Km(x).reshape(-1, 308)[:, 292:308].view(np.int16) == Q8_KM_M)


@pytest.mark.parametrize("t", [Q4_K, Q5_K], ids=NAME.get)
def test_q4_K_mul_mat_error_with_outliers(t):
    """What Q8_KM is for (issue 15): Q4_K/Q5_K mul_mat of activations with outliers, against the exact dot of
    the dequantized weights with the f32 activations. Its error must be well below what one step per 256
    (llama.cpp's Q8_K) gives on the same activations: measured 0.12x (q4_K) / 0.21x (q5_K) of Q8_K's squared
    error, bound 0.3x; and a relative RMS error under 2e-2 (measured 7.2e-3 / 1.0e-2)."""
    rng = np.random.default_rng(3200 + t)
    K, N, T = 2048, 64, 6
    raw = c_quantize(t, (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32))
    x = outlier_activations(rng, T * K // 256).reshape(T, K)
    w = np_dequant(raw, t).reshape(N, K).astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    err = c_mul_mat(t, raw, x) - exact
    xk = np.stack([np_dequant_act(np_quantize_q8_K(r), Q8_K) for r in x])
    err_q8k = xk @ w.T - exact
    ratio = np.sum(err ** 2) / np.sum(err_q8k ** 2)
    rel = math.sqrt(np.mean(err ** 2) / np.mean(exact ** 2))
    print(f"{NAME[t]}: squared error {ratio:.3f}x Q8_K's, relative RMS {rel:.2e}")
    assert ratio < 0.3 and rel < 2e-2, (ratio, rel)


# =============================================================================================
# weight quantizers: round trip
# =============================================================================================
@pytest.mark.parametrize("t", WEIGHTS, ids=NAME.get)
def test_quantize_round_trip(t):
    rng = np.random.default_rng(4000 + t)
    x = rng.standard_normal(64 * 256).astype(np.float32)
    raw = c_quantize(t, x)
    y = np_dequant(raw, t)
    rel = math.sqrt(np.mean((y.astype(np.float64) - x) ** 2) / np.mean(x.astype(np.float64) ** 2))
    assert rel < ROUND_TRIP_REL_RMS[t], f"{NAME[t]}: relative RMS error {rel:.4f}"
    # zeros stay zero; the error is relative at other scales (within fp16's range for the block
    # scales: rows of ~1e-6 underflow to zero block scales, in llama.cpp as here)
    z = c_dequantize(t, c_quantize(t, np.zeros(512, np.float32)))
    assert np.all(z == 0)
    for scale in (1e-2, 1e2):
        xs = (rng.standard_normal(512) * scale).astype(np.float32)
        ys = c_dequantize(t, c_quantize(t, xs))
        assert np.sqrt(np.mean((ys - xs) ** 2) / np.mean(xs ** 2)) < 1.5 * ROUND_TRIP_REL_RMS[t]


# =============================================================================================
# dot products
# =============================================================================================
def dot_reference(t, raw, x):
    """float64 sums of dequant(W) * dequant(quantize_act(x)) (T, N), and the tolerance of each."""
    K = x.shape[1]
    bs = BLOCK[t][0]
    nb = K // bs
    w, sp, mp = np_dequant(raw, t, with_parts=True)
    w = w.reshape(-1, K).astype(np.float64)
    at = ACT_TYPE[t]
    xq = np.stack([np_dequant_act(NP_ACT_QUANT[at](row), at) for row in x]).astype(np.float64)
    ref = xq @ w.T
    # per block: |sum x s| + |sum x m|, summed over the blocks -> (T, N)
    xb = xq.reshape(xq.shape[0], 1, nb, bs)
    mag = (np.abs((xb * sp.reshape(1, -1, nb, bs)).sum(-1)) + np.abs((xb * mp.reshape(1, -1, nb, bs)).sum(-1))).sum(-1)
    tol = (BLOCK_ULPS + DOT_LAMBDA * math.sqrt(nb + 2)) * U32 * mag
    return ref, tol


@pytest.mark.parametrize("t", WEIGHTS, ids=NAME.get)
@pytest.mark.parametrize("K", [256, 4096])
def test_mul_mat_against_numpy(t, K):
    rng = np.random.default_rng(5000 + t + K)
    N, T = 37, 3
    raw = c_quantize(t, rng.standard_normal((N, K)).astype(np.float32))
    scales = np.repeat(10.0 ** rng.uniform(-2, 2, (T, K // 32)), 32, axis=1)
    x = (rng.standard_normal((T, K)) * scales).astype(np.float32)
    y = c_mul_mat(t, raw, x)
    ref, tol = dot_reference(t, raw, x)
    assert_within(y, ref, tol, f"mul_mat {NAME[t]} K={K}")


@pytest.mark.parametrize("t", WEIGHTS, ids=NAME.get)
def test_mul_mat_random_blocks(t):
    """Arbitrary block bytes (every scale, min and high-bit pattern) dotted with random activations."""
    rng = np.random.default_rng(6000 + t)
    K, N = 1024, 16
    raw = random_blocks(rng, t, N * K // BLOCK[t][0])
    x = rng.standard_normal((2, K)).astype(np.float32)
    ref, tol = dot_reference(t, raw, x)
    assert_within(c_mul_mat(t, raw, x), ref, tol, f"mul_mat {NAME[t]} random blocks")


def assert_thread_counts_identical(t, raw, x, what):
    """mul_mat of type-t rows on 1, 2 and 3 threads: the same bits."""
    outs = []
    for n in (1, 2, 3):
        p = ffi.new("pi_threadpool **")
        check(lib.pi_threadpool_create(n, p))
        outs.append(c_mul_mat(t, raw, x, pool=p[0]))
        lib.pi_threadpool_free(p[0])
    assert bits_equal(outs[0], outs[1]) and bits_equal(outs[0], outs[2]), what


def test_mul_mat_thread_counts_identical():
    rng = np.random.default_rng(7)
    K, N, T = 512, 70, 4
    x = rng.standard_normal((T, K)).astype(np.float32)
    for t in WEIGHTS:
        assert_thread_counts_identical(t, c_quantize(t, rng.standard_normal((N, K)).astype(np.float32)), x, NAME[t])


# =============================================================================================
# SIMD (native build) vs the portable scalar build
# =============================================================================================
# scalar_lib: the session fixture of conftest.py (the library built once with -DPI_NATIVE=OFF)


def test_scalar_build_is_scalar(scalar_lib):
    assert "CPU_ISA = scalar (runs: scalar)" in ffi.string(scalar_lib.pi_system_info()).decode()


@pytest.mark.parametrize("t", list(NAME), ids=NAME.get)
def test_simd_vs_scalar_conversions(scalar_lib, t):
    rng = np.random.default_rng(8000 + t)
    x = (rng.standard_normal(16 * 256) * np.repeat(10.0 ** rng.uniform(-4, 3, 16), 256)).astype(np.float32)
    a, b = c_quantize(t, x, scalar_lib), c_quantize(t, x, lib)
    assert np.array_equal(a, b), f"quantize {NAME[t]}"
    assert bits_equal(c_dequantize(t, a, scalar_lib), c_dequantize(t, a, lib)), f"dequantize {NAME[t]}"


def test_simd_vs_scalar_q8_Km(scalar_lib):
    x = outlier_activations(np.random.default_rng(8100), 16)
    assert np.array_equal(c_quantize(Q8_KM, x, scalar_lib), c_quantize(Q8_KM, x, lib))


@pytest.mark.parametrize("t", WEIGHTS, ids=NAME.get)
def test_simd_vs_scalar_mul_mat(scalar_lib, t):
    rng = np.random.default_rng(9000 + t)
    for K, N, T in [(256, 19, 2), (4096, 23, 3)]:
        raw = c_quantize(t, rng.standard_normal((N, K)).astype(np.float32))
        raw_r = random_blocks(rng, t, N * K // BLOCK[t][0])
        x = rng.standard_normal((T, K)).astype(np.float32)
        for r in (raw, raw_r):
            y_simd, y_scalar = c_mul_mat(t, r, x, lib), c_mul_mat(t, r, x, scalar_lib)
            ref, tol = dot_reference(t, r, x)
            assert_within(y_scalar, ref, tol, f"scalar mul_mat {NAME[t]} K={K}")
            if t in KQUANTS + [Q5_0]:   # exact integer sums, then the same float steps
                assert bits_equal(y_simd, y_scalar), f"SIMD vs scalar {NAME[t]} K={K}"
            else:
                assert_within(y_simd, y_scalar, SIMD_VS_SCALAR_FACTOR * tol, f"SIMD vs scalar {NAME[t]} K={K}")


# =============================================================================================
# sparse FFN op with these weights
# =============================================================================================
def _gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("t", WEIGHTS, ids=NAME.get)
def test_sparse_ffn_op(t):
    """pi_op_sparse_ffn with gate/up/down_t of type t against numpy: h = act(gate.xq) * (up.xq) for
    the selected (neuron, token) pairs, out = sum_i h_i down_t[i]. The down rows (n_embd = 512 =
    two K-quant blocks) are split between threads on block boundaries."""
    rng = np.random.default_rng(10000 + t)
    E, F, T = 512, 96, 3
    act, gate_mode = lib.PI_ACT_SILU, lib.PI_FFN_PAR
    W = {k: rng.standard_normal((F, E)).astype(np.float32) * 0.05 for k in ("gate", "up", "down_t")}
    raw = {k: c_quantize(t, v) for k, v in W.items()}
    deq = {k: np_dequant(v, t).reshape(F, E).astype(np.float64) for k, v in raw.items()}
    x = rng.standard_normal((T, E)).astype(np.float32)
    scores = rng.standard_normal((T, F)).astype(np.float32)
    thr = 0.3

    w = ffi.new("pi_sparse_ffn_weights *")
    w.gate, w.up, w.down_t = (tensor(raw[k], t, E, F)[0] for k in ("gate", "up", "down_t"))
    outs = []
    for n in (1, 3):
        p = ffi.new("pi_threadpool **")
        check(lib.pi_threadpool_create(n, p))
        out = np.full((T, E), -7.0, np.float32)
        n_active = ffi.new("int64_t *")
        check(lib.pi_op_sparse_ffn(p[0], w, act, gate_mode, tensor(x, F32, E, T), tensor(scores, F32, F, T), thr,
                                   tensor(out, F32, E, T), n_active))
        lib.pi_threadpool_free(p[0])
        assert n_active[0] == int((scores >= thr).sum())
        outs.append(out)
    assert bits_equal(outs[0], outs[1]), "thread counts"

    at = ACT_TYPE[t]
    xq = np.stack([np_dequant_act(NP_ACT_QUANT[at](row), at) for row in x]).astype(np.float64)
    g, u = xq @ deq["gate"].T, xq @ deq["up"].T
    h = np.where(scores >= thr, g / (1 + np.exp(-g)) * u, 0.0)          # (T, F) SiLU(gate) * up
    ref = h @ deq["down_t"]
    # gate/up dots are within a few 1e-6 relative (see dot_reference); h then carries that error
    # into every output, the f32 axpy sums add sqrt(F) U32; 1e-4 of the output scale covers both
    tol = 1e-4 * np.abs(h) @ np.abs(deq["down_t"]) + 1e-6
    assert_within(outs[0], ref, tol, f"sparse ffn {NAME[t]}")


QS_OFFSET = {Q4_1: 4, Q5_0: 6, Q5_1: 8, Q2_K: 16, Q3_K: 32, Q4_K: 16, Q5_K: 48, Q6_K: 0}   # first quant byte


def test_dot_tolerance_is_tight():
    """The dot bound is far above the errors actually seen, and far below the effect of a single
    quant off by one step (the low bit of one of the first 8 quant bytes of a block, flipped): the
    mul_mat tests would catch a wrong bit in any block."""
    rng = np.random.default_rng(11)
    K = 4096
    for t in WEIGHTS:
        raw = c_quantize(t, rng.standard_normal((1, K)).astype(np.float32))
        x = rng.standard_normal((1, K)).astype(np.float32)
        ref, tol = dot_reference(t, raw, x)
        err = np.abs(c_mul_mat(t, raw, x) - ref)
        assert np.all(err < 0.1 * tol), (NAME[t], float((err / tol).max()))
        effects = []
        for k in range(8):
            bad = raw.copy()
            bad[BLOCK[t][1] * 3 + QS_OFFSET[t] + k] ^= 1     # block 3
            effects.append(abs(float(dot_reference(t, bad, x)[0][0, 0] - ref[0, 0])))
        assert max(effects) > 10 * tol[0, 0], (NAME[t], max(effects) / tol[0, 0])   # measured: 16x (q5_1) .. 1700x
