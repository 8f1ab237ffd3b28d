"""Op-level tests of libpowerinfer (core/include/powerinfer.h) against numpy references.

Every public op and dtype function is checked against an independent numpy
implementation written from the spec (block layouts, formulas in the header),
with the tolerances below derived from the f32/f16 rounding each op performs.
Every op also runs with no pool and with pools of 1, 2 and 3 threads, and the
results must be bit-identical (work is split by rows, never inside a sum).
A second copy of the library built with -DPI_NATIVE=OFF (the portable scalar
kernels) is compared against the native (SIMD) build.

Run: PYTHONPATH=bindings python -m pytest tests/test_ops.py -q
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from powerinfer._ffi import PowerInferError, check, ffi, lib
from make_test_model import quantize_q5_0  # tools/ (conftest.py puts it on the path)

REPO = Path(__file__).resolve().parents[1]

F32, F16, BF16, Q8_0, Q4_0, Q5_0, I32 = 0, 1, 30, 8, 2, 6, 26
WEIGHT_TYPES = [F32, F16, BF16, Q8_0, Q4_0]
TYPE_NAME = {F32: "f32", F16: "f16", BF16: "bf16", Q8_0: "q8_0", Q4_0: "q4_0", Q5_0: "q5_0"}
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q4_0: (32, 18), Q5_0: (32, 22)}  # (elements, bytes)
QK = 32
THREADS = (0, 1, 2, 3)   # 0 = NULL pool: the calling thread only

# --------------------------------------------------------------------------------------
# Tolerances.  U* are unit roundoffs: one correctly rounded operation has relative error <= U.
# --------------------------------------------------------------------------------------
U32 = 2.0 ** -24    # float32 (24-bit significand)
U16 = 2.0 ** -11    # IEEE half (11-bit significand)
UBF16 = 2.0 ** -8   # bfloat16 (8-bit significand)

# f32 dot products of K terms (mul_mat rows, attention scores).  The worst-case bound is
# K*U32*sum|w_k x_k|, but the rounding errors of a sum behave like independent variables and
# grow like sqrt(K): |err| <= lambda*sqrt(K)*U32*sum|w_k x_k| with probability at least
# 1 - 2exp(-lambda^2/2) (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019).  lambda = 5 gives
# 7e-6 per entry (and the data are seeded, so the outcome is fixed).  A single wrong or missing
# term costs ~1/K of sum|w x|: 2.4e-4 at K = 4096, still 12x above this bound (2e-5).
DOT_LAMBDA = 5.0

# Q8_0 quantization of activations (mul_mat converts x to Q8_0 for Q4_0/Q8_0 weights):
# per 32-block d = amax/127, q = round(x/d) -> |x - q d| <= d/2 = amax/254.  d is stored as
# fp16 (relative error <= U16) and |q| <= 127, adding 127*U16*d = U16*amax.  x*(1/d) is an f32
# product of a rounded reciprocal (<= 2 U32 relative on |x/d| <= 127), which can move a value
# off a .5 tie: another 254*U32*d = 2*U32*amax.
#   => |x - dequant(q8_0(x))| <= Q8_0_ERR_PER_AMAX * amax(block)
Q8_0_ERR_PER_AMAX = 1.0 / 254.0 + U16 + 4 * U32

# Q4_0 quantization: d = max/-8 (max = signed element of largest |x|), q = min(15, trunc(x/d + 8.5)).
# Round-half-up gives |x - (q-8)d| <= |d|/2, except x/d in (7.5, 8] (the extreme of the sign
# opposite to max) which clamps to q = 15, error <= |d|.  fp16 storage of d adds |q-8|*U16*|d| <=
# 8*U16*|d|; f32 rounding of x*(1/d) + 8.5 adds a few U32 on |x/d| <= 8.
#   => |x - dequant(q4_0(x))| <= Q4_0_ERR_PER_D * |d|
Q4_0_ERR_PER_D = 1.0 + 8 * U16 + 64 * U32

# rms_norm: mean of squares and 1/sqrt in double, then three f32 roundings (the scale, x*scale,
# *weight): relative error <= 3*U32; one U32 of margin for the double part.
RMS_NORM_RTOL = 4 * U32

# rope: cos/sin rounded to f32 (U32 each), two products and one add: |err| <= 3*U32*(|x0|+|x1|),
# one U32 of margin.  theta = pos*freq_scale*base^(-2i/n_rot) is computed in double on both
# sides (two products and a pow, <= 1 ulp each, 4 ulps for both sides together): its absolute
# error ROPE_THETA_REL*|theta| moves cos/sin by as much -- only matters for huge positions.
ROPE_RTOL = 4 * U32
ROPE_THETA_REL = 8 * 2.0 ** -53

# softmax: expf (<= 1 ulp), the double sum rounded to f32 reciprocal, and y*inv: <= SOFTMAX_ULPS*U32
# relative.  The argument x - max is itself rounded to f32: an error U32*z in the exponent of a
# value e^-z, i.e. an absolute error z*e^-z*U32 <= U32/e per entry; through the normalising sum
# it becomes a relative error of up to n*U32/e for the whole row.
SOFTMAX_ULPS = 5

# silu x/(1+expf(-x)): expf <= 1 ulp, the add and the divide one rounding each: 3*U32, +1 margin.
SILU_RTOL = 4 * U32
# gelu 0.5x(1+tanhf(c(x+0.044715x^3))): near x << 0 the 1 + tanh cancels, so the error is absolute
# in (1+tanh): tanhf <= 2 ulps of |tanh| <= 1, its argument's ~5 roundings move tanh by
# sech^2(a)*5U32*|a| <= 0.45*5*U32, the add one more -> ~6.5*U32 of (1+tanh), times 0.5|x|;
# the outer products add 2*U32 of |y|.  => |err| <= GELU_ULPS*U32*(|x| + |y|)
GELU_ULPS = 4
# soft-capping (gemma2: pi_op_softcap, pi_op_attention_softcap): cap tanh(x / cap) from an exp-based tanh whose error
# is absolute, in units of U32 * cap (measured 2.6 over |x| <= 200 cap, activation.c)
SOFTCAP_ULPS = 4
# Results below the f32 normal range (silu(-100) = -3.7e-42) may flush to zero.
UNDERFLOW_ATOL = 2.0 ** -126

# add/mul: one correctly rounded f32 operation, as numpy's float32 add/mul: bit-exact.

# IN_PLACE_NOTE: results computed in place (out aliasing x) are checked against the reference
# tolerance, not for bit-equality with the out-of-place call: GCC 12 compiles with
# -ffp-contract=fast even under -std=c11, and its alias-versioned loops fuse a*b - c into an FMA
# in one version and not the other (rope differs by 1 ulp in place vs out of place).

# attention: a first-order error analysis (see attention_tolerance) bounds the error of every
# output row; this factor covers the second-order terms (e^d - 1 - d for small d).
ATTN_SAFETY = 2.0


# --------------------------------------------------------------------------------------
# numpy reference conversions (written from the block layouts)
# --------------------------------------------------------------------------------------
def np_f16_bits(x) -> np.ndarray:
    """f32 -> IEEE half bits, round to nearest even (numpy's conversion)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)


def np_bf16_bits(x) -> np.ndarray:
    """f32 -> bf16 bits: top 16 bits, round to nearest even; NaN kept quiet (| 0x40)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = np.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, r)
    return r.astype(np.uint16)


def np_q8_act_blocks(x) -> tuple[np.ndarray, np.ndarray]:
    """The 8-bit activation blocks of 32 (Q8_0S, Q8_1): f32 d = amax / 127 and int8 q = rint(x * (127 / amax))
    (halves to even), one row per block."""
    b = np.asarray(x, np.float32).reshape(-1, QK)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 0).astype(np.float32)
    return d, np.rint((b * inv[:, None]).astype(np.float32)).astype(np.int8)


def np_quantize_q8_0(x, activations: bool = False) -> np.ndarray:
    """(..., n) f32 -> (..., n/32*34) uint8, d = amax/127. As stored (weights, a q8_0 KV cache):
    q = roundf(x*(1/d)), halves away from zero; activations=True (Q8_0S, what mul_mat multiplies):
    np_q8_act_blocks."""
    x = np.asarray(x, np.float32)
    if activations:
        d, q = np_q8_act_blocks(x)
    else:
        b = x.reshape(-1, QK)
        d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        v = (b * inv[:, None]).astype(np.float32).astype(np.float64)
        q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)   # roundf, exact in f64
    out = np.empty((d.size, 34), np.uint8)
    out[:, :2] = np_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(*x.shape[:-1], -1)


def np_quantize_q4_0(x) -> np.ndarray:
    """(..., n) f32 -> (..., n/32*18) uint8: d = max/-8, q = min(15, trunc(x*(1/d) + 8.5))."""
    x = np.asarray(x, np.float32)
    b = x.reshape(-1, QK)
    imax = np.abs(b).argmax(axis=1)[:, None]               # first of equal magnitudes, like the C loop
    mx = np.take_along_axis(b, imax, axis=1)
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = ((b * inv).astype(np.float32) + np.float32(8.5)).astype(np.float32)
    q = np.clip(np.trunc(v), 0, 15).astype(np.uint8)
    out = np.empty((b.shape[0], 18), np.uint8)
    out[:, :2] = np_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << np.uint8(4))
    return out.reshape(*x.shape[:-1], -1)


def np_encode(x, t) -> np.ndarray:
    """f32 rows (..., n) -> the array a pi_tensor of type t points at (f32 / uint16 / uint8 blocks)."""
    x = np.ascontiguousarray(x, np.float32)
    if t == F32:
        return x.copy()
    if t == F16:
        return np_f16_bits(x)
    if t == BF16:
        return np_bf16_bits(x)
    if t == Q8_0:
        return np_quantize_q8_0(x)
    if t == Q4_0:
        return np_quantize_q4_0(x)
    if t == Q5_0:   # ggml's reference quantizer, as the test models' writer has it
        return quantize_q5_0(x)
    raise ValueError(t)


def np_decode(raw, t) -> np.ndarray:
    """Inverse of np_encode: -> f32 rows (..., n).  Exact (every product fits in f32)."""
    raw = np.ascontiguousarray(raw)
    if t == F32:
        return raw.astype(np.float32)
    if t == F16:
        return raw.view(np.float16).astype(np.float32)
    if t == BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    lead = raw.shape[:-1]
    if t == Q8_0:
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        v = b[:, 2:].view(np.int8).astype(np.float32) * d
    elif t == Q4_0:
        b = raw.reshape(-1, 18)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        qs = b[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8
        v = q * d
    elif t == Q5_0:
        b = raw.reshape(-1, 22)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        qh = b[:, 2:6].copy().view("<u4")                               # [blocks, 1]: bit j = 5th bit of element j
        hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        q = np.concatenate([b[:, 6:] & 0x0F, b[:, 6:] >> 4], axis=1) | hi
        v = (q.astype(np.float32) - 16) * d
    else:
        raise ValueError(t)
    return v.reshape(*lead, -1)


def block_scales(raw, t) -> np.ndarray:
    """The fp16 d of every block of a Q8_0/Q4_0 buffer, as f32."""
    bb = BLOCK[t][1]
    return np.ascontiguousarray(raw).reshape(-1, bb)[:, :2].copy().view(np.float16).astype(np.float32).ravel()


# --------------------------------------------------------------------------------------
# pi_tensor views of numpy arrays
# --------------------------------------------------------------------------------------
def tensor(arr: np.ndarray, t: int | None = None, n_dims: int | None = None):
    """pi_tensor over numpy `arr` (which the caller keeps alive).

    GGUF order: ne[0] is the last numpy axis, nb = byte strides reversed.  f32 arrays default
    to F32; F16/BF16 tensors are uint16 arrays; Q8_0/Q4_0 tensors are uint8 arrays whose last
    axis holds the row's blocks.  Views with strides in numpy axes other than the last are fine.
    """
    if t is None:
        t = {np.dtype(np.float32): F32, np.dtype(np.float16): F16}[arr.dtype]
    bs, bb = BLOCK[t]
    nd = arr.ndim if n_dims is None else n_dims
    assert 1 <= arr.ndim <= nd <= 4
    ne = list(arr.shape[::-1])
    nb = list(arr.strides[::-1])
    if bs > 1:
        assert arr.dtype == np.uint8 and arr.shape[-1] % bb == 0
        ne[0] = arr.shape[-1] // bb * bs
        nb[0] = bb if arr.strides[-1] == 1 else arr.strides[-1] * bb
    else:
        assert arr.itemsize == bb, (arr.dtype, t)
    for i in range(len(ne), 4):
        ne.append(1)
        nb.append(nb[-1] * ne[-2])
    p = ffi.new("pi_tensor *")
    p.type = t
    p.n_dims = nd
    for i in range(4):
        p.ne[i] = ne[i]
        p.nb[i] = nb[i]
    p.data = ffi.cast("void *", arr.__array_interface__["data"][0])
    return p


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.itemsize])


def assert_bit_equal(a, b, what=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, what
    if not np.array_equal(bits(a), bits(b)):
        bad = np.flatnonzero(bits(a).ravel() != bits(b).ravel())
        raise AssertionError(f"{what}: {bad.size} elements differ, first at flat index {bad[0]}: "
                             f"{a.ravel()[bad[0]]!r} vs {b.ravel()[bad[0]]!r}")


def assert_within(got, ref, tol, what=""):
    """|got - ref| <= tol elementwise (tol broadcast); -inf/+inf/0 must match exactly where ref is."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    tol = np.broadcast_to(np.asarray(tol, np.float64), ref.shape)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.all(np.isfinite(got) == np.isfinite(ref)), f"{what}: non-finite values differ"
    fin = np.isfinite(ref)
    err = np.where(fin, np.abs(got - ref), 0.0)
    bad = err > tol
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err / np.maximum(tol, 1e-300), 0)), ref.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} out of tolerance; worst at {i}: "
                             f"got {got[i]!r} ref {ref[i]!r} |err| {err[i]:.3g} tol {tol[i]:.3g}")
    assert np.array_equal(got[~fin], ref[~fin]), f"{what}: infinities differ"


def dot_tol(k: int, abs_sum) -> np.ndarray:
    """Bound for an f32 sum of k products whose magnitudes add up to abs_sum (see DOT_LAMBDA)."""
    return DOT_LAMBDA * math.sqrt(k + 2) * U32 * np.asarray(abs_sum, np.float64)


def sentinel_buffer(shape, value=np.float32(-12345.5)) -> np.ndarray:
    return np.full(shape, value, np.float32)


# --------------------------------------------------------------------------------------
# thread pools
# --------------------------------------------------------------------------------------
def make_pool(L, n):
    p = ffi.new("pi_threadpool **")
    st = L.pi_threadpool_create(n, p)
    assert st == 0, st
    return p[0]


@pytest.fixture(scope="module")
def pools():
    made = {n: make_pool(lib, n) for n in THREADS if n > 0}
    yield {0: ffi.NULL, **made}
    for p in made.values():
        lib.pi_threadpool_free(p)


def run_all(pools, fn, what=""):
    """fn(pool) -> ndarray, for every pool; the results must be bit-identical.  Returns one."""
    outs = {n: fn(p) for n, p in pools.items()}
    first = outs[0]
    for n, o in outs.items():
        assert_bit_equal(o, first, f"{what}: {n} threads vs NULL pool")
    return first


def expect_error(status, code):
    assert status == code, (status, code)
    assert ffi.string(lib.pi_last_error()).decode() != ""


# ======================================================================================
# dtypes
# ======================================================================================
def test_type_traits():
    for t, (bs, bb) in BLOCK.items():
        assert lib.pi_type_supported(t) == 1
        assert ffi.string(lib.pi_type_name(t)).decode() == TYPE_NAME[t]
        assert lib.pi_type_block_size(t) == bs
        assert lib.pi_type_block_bytes(t) == bb
        assert lib.pi_row_bytes(t, 4096) == 4096 // bs * bb
        assert lib.pi_row_bytes(t, 0) == 0
    assert lib.pi_row_bytes(Q4_0, 33) == -1 and lib.pi_row_bytes(Q8_0, 16) == -1
    assert lib.pi_row_bytes(F32, -1) == -1
    # i32 is a known layout (block 1, 4 bytes) but not a compute type
    assert ffi.string(lib.pi_type_name(I32)).decode() == "i32"
    assert lib.pi_type_supported(I32) == 0
    assert lib.pi_type_block_size(I32) == 1 and lib.pi_type_block_bytes(I32) == 4
    # ids from PI_TYPE_COUNT on are the core's internal layouts (activations, repacked weights): named
    # for messages, never accepted from a file
    internal = {lib.PI_TYPE_COUNT: "q8_0s", lib.PI_TYPE_COUNT + 1: "q4_0x8", lib.PI_TYPE_COUNT + 2: "q4_0r",
                lib.PI_TYPE_COUNT + 3: "q8_0p", lib.PI_TYPE_COUNT + 4: "q8_Km",
                lib.PI_TYPE_COUNT + 5: "q8_0x16", lib.PI_TYPE_COUNT + 6: "q4_Kx16",
                lib.PI_TYPE_COUNT + 7: "q5_Kx16", lib.PI_TYPE_COUNT + 8: "f16x8", lib.PI_TYPE_COUNT + 9: "bf16x8",
                lib.PI_TYPE_COUNT + 10: "q6_Kx16", lib.PI_TYPE_COUNT + 11: "q5_0x16",
                lib.PI_TYPE_COUNT + 12: "q4_0c", lib.PI_TYPE_COUNT + 13: "q4_kc",
                lib.PI_TYPE_COUNT + 14: "q6_kc", lib.PI_TYPE_COUNT + 15: "q4_1x16", lib.PI_TYPE_COUNT + 16: "q5_1x16",
                lib.PI_TYPE_COUNT + 17: "iq4_nlx8", lib.PI_TYPE_COUNT + 18: "iq4_xsx16", lib.PI_TYPE_COUNT + 19: "q8_kw",
                lib.PI_TYPE_COUNT + 20: "q8_kwx16", lib.PI_TYPE_COUNT + 21: "q2_Kx16",
                lib.PI_TYPE_COUNT + 22: "bf16s", lib.PI_TYPE_COUNT + 23: "mxfp4x8"}
    for t, name in internal.items():
        assert lib.pi_type_supported(t) == 0
        assert ffi.string(lib.pi_type_name(t)).decode() == name
    for t in (-1, 4, 5, 34, 35, lib.PI_TYPE_COUNT + len(internal), 1000):   # tq1_0, tq2_0
        assert lib.pi_type_supported(t) == 0
        assert ffi.string(lib.pi_type_name(t)).decode() == "unknown"
        assert lib.pi_type_block_size(t) == 0 and lib.pi_type_block_bytes(t) == 0
        assert lib.pi_row_bytes(t, 32) == -1


def c_quantize(t, x, L=lib) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    n = x.size
    dst = np.zeros(n // BLOCK[t][0] * BLOCK[t][1], np.uint8)
    check(L.pi_quantize_row(t, ffi.from_buffer("float[]", x), ffi.from_buffer(dst), n))
    return dst


def c_dequantize(t, raw, n, L=lib) -> np.ndarray:
    raw = np.ascontiguousarray(raw).view(np.uint8).ravel()
    out = np.zeros(n, np.float32)
    check(L.pi_dequantize_row(t, ffi.from_buffer(raw), ffi.from_buffer("float[]", out), n))
    return out


def conversion_input(rng, t) -> np.ndarray:
    """A row of 64 blocks covering the interesting cases of dtype t."""
    if t in (F16, BF16, F32):
        # random f32 bit patterns (every exponent, ties), NaN excluded from the random part
        u = rng.integers(0, 2 ** 32, size=1600, dtype=np.uint64).astype(np.uint32)
        x = u.view(np.float32)
        x = x[~np.isnan(x)][:1500]
        special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan,
                            65504.0, 65519.99, 65520.0, -65520.0, 1e5, 3e38,
                            6.103515625e-05, 6.0e-05, 5.9604645e-08, 2.9802322e-08, 2.99e-08, 1e-9, 1e-45,
                            1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,
                            -(1.0 + 2 ** -8), 2.0 ** -130, 0.1, 1 / 3], np.float32)
        small = (rng.standard_normal(500) * 10.0 ** rng.uniform(-9, 5, 500)).astype(np.float32)
        x = np.concatenate([special, x, small])
        return x[: x.size // QK * QK]
    blocks = []
    for b in range(64):
        scale = 10.0 ** rng.uniform(-3, 3)
        blocks.append(rng.standard_normal(QK) * scale)
    blocks[0][:] = 0.0                                    # all zero: d = 0
    blocks[1] = -np.abs(blocks[1]); blocks[1][5] *= 3     # largest magnitude negative
    blocks[2] = rng.uniform(-1, 1, QK)                    # +-max tie: first wins, the other clamps
    blocks[2][3], blocks[2][20] = 4.0, -4.0
    blocks[3] = np.full(QK, 2.5)                          # constant block
    blocks[4] = (np.arange(QK) - 16) * 0.5                # exact multiples of d, x/d on .5 ties
    blocks[5] = rng.standard_normal(QK) * 1e-7            # d underflows to an fp16 subnormal / 0
    blocks[6][0] = 1e-3; blocks[6][1:] = 1e-4             # tiny values next to the max
    return np.concatenate(blocks).astype(np.float32)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=TYPE_NAME.get)
def test_quantize_dequantize_row(t):
    rng = np.random.default_rng(100 + t)
    x = conversion_input(rng, t)
    n = x.size
    raw = c_quantize(t, x)
    ref_raw = np_encode(x, t).view(np.uint8).ravel()
    # The quantizers are specified identically (same f32 operation order) -> bit-exact bytes.
    assert_bit_equal(raw, ref_raw, f"pi_quantize_row({TYPE_NAME[t]}) bytes")
    y = c_dequantize(t, raw, n)
    ref_y = np_decode(np_encode(x, t), t).ravel()
    nan = np.isnan(ref_y)
    assert np.array_equal(np.isnan(y), nan)
    assert_bit_equal(y[~nan], ref_y[~nan], f"pi_dequantize_row({TYPE_NAME[t]})")

    # sanity: the round-trip error is within the format's quantization step
    fin = np.isfinite(x)
    if t == F32:
        assert_bit_equal(y, x)
    elif t == F16:
        m = fin & (np.abs(x) < 65504)
        normal = m & (np.abs(x) >= 2.0 ** -14)
        assert_within(y[normal], x[normal], U16 * np.abs(x[normal]), "f16 normal range")
        sub = m & ~normal
        assert_within(y[sub], x[sub], 2.0 ** -25, "f16 subnormal range")   # half of the 2^-24 step
        assert np.all(np.isinf(y[fin & (np.abs(x) >= 65520)]))
    elif t == BF16:
        m = fin & (np.abs(x) >= 2.0 ** -126) & (np.abs(x) < 3.38e38)
        assert_within(y[m], x[m], UBF16 * np.abs(x[m]), "bf16")
        assert np.all(np.isnan(y[np.isnan(x)]))
    else:
        xb, yb = x.reshape(-1, QK).astype(np.float64), y.reshape(-1, QK).astype(np.float64)
        d16 = block_scales(raw, t).astype(np.float64)
        ok = np.abs(d16) >= 2.0 ** -14            # fp16 relative error bound holds for normal d
        amax = np.abs(xb).max(axis=1)
        if t == Q8_0:
            tol = Q8_0_ERR_PER_AMAX * amax
        else:
            tol = Q4_0_ERR_PER_D * amax / 8.0   # |d| = amax/8
        assert_within(yb[ok], xb[ok], tol[ok, None], f"{TYPE_NAME[t]} round trip")
        assert np.all(y.reshape(-1, QK)[0] == 0)            # zero block
        if t == Q4_0:   # the positive twin of the -max tie clamps to q = 15: 7|d|, error exactly |d|
            blk = y.reshape(-1, QK)[2]
            assert blk[3] == 4.0 and blk[20] == -3.5


def test_f16_all_bit_patterns_dequantize():
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    y = c_dequantize(F16, h, h.size)
    ref = h.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(y), nan)
    assert_bit_equal(y[~nan], ref[~nan], "f16 -> f32, all 65536 values")
    # NaN -> NaN of the same sign.  (Payload bits are not compared: the F16C instruction of the
    # native build quiets signalling NaNs, the scalar build keeps the payload as it is.)
    assert np.array_equal(bits(y[nan]) >> 31, h[nan] >> 15)


def test_conversion_errors():
    x = np.zeros(64, np.float32)
    dst = np.zeros(64 * 4, np.uint8)
    xp, dp = ffi.from_buffer("float[]", x), ffi.from_buffer(dst)
    expect_error(lib.pi_quantize_row(Q4_0, xp, dp, 48), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_quantize_row(Q8_0, xp, dp, 1), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_quantize_row(F16, xp, dp, -1), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_quantize_row(F32, ffi.NULL, dp, 4), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_dequantize_row(F32, dp, ffi.NULL, 4), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_quantize_row(I32, xp, dp, 4), lib.PI_ERR_UNSUPPORTED)
    expect_error(lib.pi_dequantize_row(35, dp, xp, 32), lib.PI_ERR_UNSUPPORTED)   # tq2_0
    expect_error(lib.pi_quantize_row(23, xp, dp, 256), lib.PI_ERR_UNSUPPORTED)    # iq4_xs: read, not written
    assert "no quantizer" in ffi.string(lib.pi_last_error()).decode()
    assert lib.pi_dequantize_row(20, dp, xp, 32) == lib.PI_OK
    assert lib.pi_quantize_row(F32, xp, dp, 0) == lib.PI_OK
    with pytest.raises(PowerInferError) as e:
        check(lib.pi_quantize_row(Q4_0, xp, dp, 48))
    assert e.value.status == lib.PI_ERR_INVALID_ARG and "48" in str(e.value)


# ======================================================================================
# thread pool
# ======================================================================================
def test_threadpool():
    for n in (1, 2, 3, 7):
        p = make_pool(lib, n)
        assert lib.pi_threadpool_size(p) == n
        lib.pi_threadpool_free(p)
    p = make_pool(lib, 0)                      # physical cores
    assert lib.pi_threadpool_size(p) >= 1
    lib.pi_threadpool_free(p)
    assert lib.pi_threadpool_size(ffi.NULL) == 1
    lib.pi_threadpool_free(ffi.NULL)
    out = ffi.new("pi_threadpool **")
    expect_error(lib.pi_threadpool_create(100000, out), lib.PI_ERR_INVALID_ARG)
    assert out[0] == ffi.NULL
    expect_error(lib.pi_threadpool_create(2, ffi.NULL), lib.PI_ERR_INVALID_ARG)


# ======================================================================================
# get_rows
# ======================================================================================
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=TYPE_NAME.get)
def test_get_rows(pools, t, strided):
    rng = np.random.default_rng(7 + t)
    D, R = 96, 37
    table_f = rng.standard_normal((R, D)).astype(np.float32)
    raw = np_encode(table_f, t)
    if strided:   # every other row of a bigger table
        big = np.zeros((2 * R,) + raw.shape[1:], raw.dtype)
        big[::2] = raw
        table = big[::2]
    else:
        table = raw
    ids = np.array([0, 36, 5, 5, 17, 0, 36, 1, 2], np.int32)
    n = ids.size
    ref = np_decode(raw, t)[ids]

    def run(pool):
        base = sentinel_buffer((n, D + 8)) if strided else np.zeros((n, D), np.float32)
        out = base[:, 3:3 + D] if strided else base
        check(lib.pi_op_get_rows(pool, tensor(table, t), ffi.from_buffer("int32_t[]", ids), n, tensor(out)))
        return base

    base = run_all(pools, run, "get_rows")
    got = base[:, 3:3 + D] if strided else base
    assert_bit_equal(got, ref, f"get_rows {TYPE_NAME[t]}")   # dequantization is exact
    if strided:
        assert np.all(base[:, :3] == -12345.5) and np.all(base[:, 3 + D:] == -12345.5)


def test_get_rows_errors():
    table = np.zeros((4, 32), np.float32)
    out = np.zeros((2, 32), np.float32)
    ids = np.array([0, 4], np.int32)
    ip = ffi.from_buffer("int32_t[]", ids)
    expect_error(lib.pi_op_get_rows(ffi.NULL, tensor(table), ip, 2, tensor(out)), lib.PI_ERR_INVALID_ARG)
    ids[1] = -1
    expect_error(lib.pi_op_get_rows(ffi.NULL, tensor(table), ip, 2, tensor(out)), lib.PI_ERR_INVALID_ARG)
    ids[1] = 3
    expect_error(lib.pi_op_get_rows(ffi.NULL, tensor(table), ip, 3, tensor(out)), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_op_get_rows(ffi.NULL, tensor(table), ffi.NULL, 2, tensor(out)), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_op_get_rows(ffi.NULL, tensor(table), ip, 2, tensor(out[:, :16])), lib.PI_ERR_INVALID_ARG)
    check(lib.pi_op_get_rows(ffi.NULL, tensor(table), ip, 2, tensor(out)))


# ======================================================================================
# mul_mat
# ======================================================================================
def mul_mat_case(t, K, N, T, seed):
    rng = np.random.default_rng(seed)
    w_f = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, :QK] *= 20.0                       # blocks of different scale
    if T > 1:
        x[1, QK:2 * QK] = 0.0               # an all-zero activation block (d = 0)
    raw = np_encode(w_f, t)
    return raw, np_decode(raw, t).astype(np.float64), x


def mul_mat_reference_and_tol(t, wd, x):
    """Exact-ish reference (float64 over the dequantized weights) and the tolerance per entry.

    Returns (ref vs the original activations, tol for it, ref vs the activations the kernel actually multiplies
    (Q8_0-rounded; bf16 weights: bf16-rounded, arch/bf16_dot.c), tol for that one)."""
    K = wd.shape[1]
    x64 = x.astype(np.float64)
    ref = x64 @ wd.T
    aw = np.abs(wd)
    if t in (Q8_0, Q4_0, Q5_0):   # Q8_0 (Q8_0S) activations
        xq = np_decode(np_quantize_q8_0(x, activations=True), Q8_0).astype(np.float64)
        ref_q = xq @ wd.T
        tol_q = dot_tol(K, np.abs(xq) @ aw.T)
        amax = np.repeat(np.abs(x64).reshape(x.shape[0], -1, QK).max(axis=2), QK, axis=1)
        tol = Q8_0_ERR_PER_AMAX * (amax @ aw.T) + tol_q
        return ref, tol, ref_q, tol_q
    if t == BF16 and lib.pi_bf16_dot():   # bf16 activations (vdpbf16ps's arithmetic): within UBF16 relative of x
        xb = np_bf16_bits(x).astype(np.uint32) << 16
        xb = xb.view(np.float32).astype(np.float64)
        ref_q = xb @ wd.T
        tol_q = dot_tol(K, np.abs(xb) @ aw.T)
        return ref, UBF16 * (np.abs(x64) @ aw.T) + tol_q, ref_q, tol_q
    tol = dot_tol(K, np.abs(x64) @ aw.T)
    return ref, tol, ref, tol


MUL_MAT_SHAPES = [  # (K, N, T): K multiple of 32; N not a multiple of the 16-row chunk
    (32, 37, 1), (32, 37, 7), (64, 5, 3), (64, 37, 1), (256, 301, 2), (4096, 37, 1), (4096, 53, 7),
]


@pytest.mark.parametrize("K,N,T", MUL_MAT_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=TYPE_NAME.get)
def test_mul_mat(pools, t, K, N, T):
    raw, wd, x = mul_mat_case(t, K, N, T, seed=K * 1000 + N * 10 + T + t)

    def run(pool):
        y = np.zeros((T, N), np.float32)
        check(lib.pi_op_mul_mat(pool, tensor(raw, t), tensor(x), tensor(y)))
        return y

    y = run_all(pools, run, f"mul_mat {TYPE_NAME[t]}")
    ref, tol, ref_q, tol_q = mul_mat_reference_and_tol(t, wd, x)
    assert_within(y, ref_q, tol_q, f"mul_mat {TYPE_NAME[t]} vs the kernel's own operands")
    assert_within(y, ref, tol, f"mul_mat {TYPE_NAME[t]} vs float64 W_deq x")


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=TYPE_NAME.get)
def test_mul_mat_strided(pools, t):
    K, N, T = 128, 21, 4
    raw, wd, x = mul_mat_case(t, K, N, T, seed=55 + t)
    rb = raw.shape[1]
    wbig = np.zeros((2 * N, rb + 2 * BLOCK[t][1] // raw.itemsize), raw.dtype)
    wbig[::2, :rb] = raw
    w = wbig[::2, :rb]                                  # rows every other row of a wider buffer
    xbig = sentinel_buffer((T, K + 64))
    xbig[:, 32:32 + K] = x
    xv = xbig[:, 32:32 + K]

    def run(pool):
        ybig = sentinel_buffer((T, N + 5))
        check(lib.pi_op_mul_mat(pool, tensor(w, t), tensor(xv), tensor(ybig[:, 2:2 + N])))
        return ybig

    ybig = run_all(pools, run, f"mul_mat strided {TYPE_NAME[t]}")
    ref, tol, _, _ = mul_mat_reference_and_tol(t, wd, x)
    assert_within(ybig[:, 2:2 + N], ref, tol, f"mul_mat strided {TYPE_NAME[t]}")
    assert np.all(ybig[:, :2] == -12345.5) and np.all(ybig[:, 2 + N:] == -12345.5)
    # same numbers as the contiguous call
    y = np.zeros((T, N), np.float32)
    check(lib.pi_op_mul_mat(ffi.NULL, tensor(raw, t), tensor(x), tensor(y)))
    assert_bit_equal(ybig[:, 2:2 + N], y)


def test_mul_mat_errors():
    w = np.zeros((8, 64), np.float32)
    x = np.zeros((3, 64), np.float32)
    y = np.zeros((3, 8), np.float32)
    E = lib.PI_ERR_INVALID_ARG
    expect_error(lib.pi_op_mul_mat(ffi.NULL, tensor(w), tensor(x[:, :32]), tensor(y)), E)
    expect_error(lib.pi_op_mul_mat(ffi.NULL, tensor(w), tensor(x), tensor(y[:, :4])), E)
    expect_error(lib.pi_op_mul_mat(ffi.NULL, tensor(w), tensor(x), tensor(y[:2])), E)
    xw = np.zeros((3, 128), np.float32)
    expect_error(lib.pi_op_mul_mat(ffi.NULL, tensor(w), tensor(xw[:, ::2]), tensor(y)), E)   # x rows not contiguous
    expect_error(lib.pi_op_mul_mat(ffi.NULL, tensor(w, F32), tensor(x.astype(np.float16)), tensor(y)), E)
    wq = np.zeros((8, 27), np.uint8)                   # 27 bytes is not a whole number of Q4_0 blocks
    with pytest.raises(AssertionError):
        tensor(wq, Q4_0)
    wi = tensor(w)
    wi.type = 35                                        # a ggml id the core cannot compute with (tq2_0)
    expect_error(lib.pi_op_mul_mat(ffi.NULL, wi, tensor(x), tensor(y)), lib.PI_ERR_UNSUPPORTED)
    check(lib.pi_op_mul_mat(ffi.NULL, tensor(w), tensor(x), tensor(y)))


@pytest.mark.parametrize("t", [F32, F16, BF16], ids=TYPE_NAME.get)
@pytest.mark.parametrize("op", ["mul_mat", "get_rows"])
def test_float_weights_with_strided_rows_are_rejected_or_honoured(op, t):
    """A float weight/table whose ne[0] elements are not adjacent (nb[0] > element size) must be
    refused with INVALID_ARG or computed correctly -- never read as if it were contiguous."""
    rng = np.random.default_rng(3)
    big = np_encode(rng.standard_normal((8, 128)).astype(np.float32), t)
    w = big[:, ::2]                                     # ne[0] = 64 elements, 2 elements apart
    wd = np_decode(np.ascontiguousarray(w), t).astype(np.float64)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    if op == "mul_mat":
        y = np.zeros((2, 8), np.float32)
        st = lib.pi_op_mul_mat(ffi.NULL, tensor(w, t), tensor(x), tensor(y))
        ref, tol = x.astype(np.float64) @ wd.T, dot_tol(64, np.abs(x) @ np.abs(wd).T)
    else:
        ids = np.array([1, 6], np.int32)
        y = np.zeros((2, 64), np.float32)
        st = lib.pi_op_get_rows(ffi.NULL, tensor(w, t), ffi.from_buffer("int32_t[]", ids), 2, tensor(y))
        ref, tol = wd[ids], 0.0
    if st != lib.PI_OK:
        expect_error(st, lib.PI_ERR_INVALID_ARG)
    else:
        assert_within(y, ref, tol, op)


# ======================================================================================
# rms_norm
# ======================================================================================
def np_rms_norm(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float64(np.float32(eps)))
    return y * w.astype(np.float64) if w is not None else y


@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no_weight"])
@pytest.mark.parametrize("D", [96, 4096])
def test_rms_norm(pools, D, with_weight):
    rng = np.random.default_rng(D + with_weight)
    T = 5
    x = (rng.standard_normal((T, D)) * np.array([1.0, 1e-3, 100.0, 1.0, 1.0])[:, None]).astype(np.float32)
    x[3] = 0.0                                          # zero row: y = 0 (eps keeps it finite)
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32) if with_weight else None
    eps = 1e-5

    def run(pool):
        y = np.zeros_like(x)
        check(lib.pi_op_rms_norm(pool, tensor(x), tensor(w) if w is not None else ffi.NULL, eps, tensor(y)))
        return y

    y = run_all(pools, run, "rms_norm")
    ref = np_rms_norm(x, w, eps)
    assert_within(y, ref, RMS_NORM_RTOL * np.abs(ref), "rms_norm")
    assert np.all(y[3] == 0)
    # in place (out aliases x): same bits
    xi = x.copy()
    check(lib.pi_op_rms_norm(pools[2], tensor(xi), tensor(w) if w is not None else ffi.NULL, eps, tensor(xi)))
    assert_within(xi, ref, RMS_NORM_RTOL * np.abs(ref), "rms_norm in place")


def test_rms_norm_strided_4d(pools):
    rng = np.random.default_rng(11)
    D = 64
    big = sentinel_buffer((2, 2, 5, D + 16))            # ne = [D, 3, 2, 2] inside a padded buffer
    big[:, :, 1:4, 4:4 + D] = rng.standard_normal((2, 2, 3, D))
    x = big[:, :, 1:4, 4:4 + D]
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    eps = 1e-6

    def run(pool):
        obig = sentinel_buffer((2, 2, 3, D + 3))
        check(lib.pi_op_rms_norm(pool, tensor(x), tensor(w), eps, tensor(obig[..., :D])))
        return obig

    obig = run_all(pools, run, "rms_norm strided")
    ref = np_rms_norm(x, w, eps)
    assert_within(obig[..., :D], ref, RMS_NORM_RTOL * np.abs(ref), "rms_norm strided")
    assert np.all(obig[..., D:] == -12345.5)


def test_rms_norm_errors():
    x = np.ones((2, 32), np.float32)
    y = np.zeros_like(x)
    E = lib.PI_ERR_INVALID_ARG
    expect_error(lib.pi_op_rms_norm(ffi.NULL, tensor(x), ffi.NULL, -1.0, tensor(y)), E)
    expect_error(lib.pi_op_rms_norm(ffi.NULL, tensor(x), ffi.NULL, float("nan"), tensor(y)), E)
    expect_error(lib.pi_op_rms_norm(ffi.NULL, tensor(x), tensor(np.ones(16, np.float32)), 1e-5, tensor(y)), E)
    expect_error(lib.pi_op_rms_norm(ffi.NULL, tensor(x), tensor(x), 1e-5, tensor(y)), E)   # weight 2-d
    expect_error(lib.pi_op_rms_norm(ffi.NULL, tensor(x), ffi.NULL, 1e-5, tensor(y[:1])), E)
    expect_error(lib.pi_op_rms_norm(ffi.NULL, tensor(x), ffi.NULL, 1e-5, tensor(y.astype(np.float16))), E)
    expect_error(lib.pi_op_rms_norm(ffi.NULL, ffi.NULL, ffi.NULL, 1e-5, tensor(y)), E)


# ======================================================================================
# rope
# ======================================================================================
ROPE_NORMAL, ROPE_NEOX = 0, 2   # PI_ROPE_*


def rope_pairs(n_rot, mode):
    """Index arrays (first, second) of the rotating pairs: (2i, 2i+1) normal, (i, i + n_rot/2) NEOX."""
    i = np.arange(n_rot // 2)
    return (i, i + n_rot // 2) if mode == ROPE_NEOX else (2 * i, 2 * i + 1)


def np_rope(x, pos, n_rot, base, scale, mode=ROPE_NORMAL):
    """x (T, H, hd) -> float64, and the |theta| of every pair (T, n_rot/2) for the tolerance."""
    base = float(np.float32(base))            # the op takes float parameters
    scale = float(np.float32(scale))
    i = np.arange(n_rot // 2, dtype=np.float64)
    freq = np.power(base, -2.0 * i / n_rot)
    theta = pos.astype(np.float64)[:, None] * scale * freq[None, :]       # (T, n_rot/2)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    y = x.astype(np.float64).copy()
    a, b = rope_pairs(n_rot, mode)
    x0, x1 = y[..., a].copy(), y[..., b].copy()
    y[..., a] = x0 * c - x1 * s
    y[..., b] = x0 * s + x1 * c
    return y, np.abs(theta)


def rope_tol(x, n_rot, abs_theta, mode=ROPE_NORMAL):
    x = x.astype(np.float64)
    a, b = rope_pairs(n_rot, mode)
    pair = np.abs(x[..., a]) + np.abs(x[..., b])                           # (T, H, n_rot/2)
    t = (ROPE_RTOL + ROPE_THETA_REL * abs_theta[:, None, :]) * pair
    tol = np.zeros(x.shape)
    tol[..., a] = t
    tol[..., b] = t
    return tol                                                             # 0 past n_rot: exact copy


ROPE_POS = np.array([0, 1, 2, 17, 511, 4095, 32767, 131071, 1_000_000, 2**24 + 1, 2**31 - 1], np.int32)


@pytest.mark.parametrize("mode", [ROPE_NORMAL, ROPE_NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("hd,n_rot,base,scale", [
    (64, 64, 10000.0, 1.0),
    (64, 32, 10000.0, 1.0),          # partial rotary: dims 32..63 pass through
    (128, 128, 500000.0, 0.25),      # linear scaling
    (80, 26, 10000.0, 1.0 / 3.0),    # scale not exactly representable; n_rot not a power of two
])
def test_rope(pools, hd, n_rot, base, scale, mode):
    rng = np.random.default_rng(hd + n_rot)
    T, H = ROPE_POS.size, 4
    x = rng.standard_normal((T, H, hd)).astype(np.float32)
    pos = ROPE_POS.copy()
    pp = ffi.from_buffer("int32_t[]", pos)

    def run(pool):
        y = sentinel_buffer(x.shape)
        check(lib.pi_op_rope(pool, tensor(x), pp, n_rot, mode, base, scale, tensor(y)))
        return y

    y = run_all(pools, run, "rope")
    ref, th = np_rope(x, pos, n_rot, base, scale, mode)
    assert_within(y, ref, rope_tol(x, n_rot, th, mode), "rope")
    assert_bit_equal(y[..., n_rot:], x[..., n_rot:], "rope pass-through dims")
    assert_bit_equal(y[0], x[0], "rope at pos 0 is the identity")
    # in place
    xi = x.copy()
    check(lib.pi_op_rope(pools[3], tensor(xi), pp, n_rot, mode, base, scale, tensor(xi)))
    assert_within(xi, ref, rope_tol(x, n_rot, th, mode), "rope in place")   # not bit-equal: see IN_PLACE_NOTE
    assert_bit_equal(xi[..., n_rot:], x[..., n_rot:], "rope in place pass-through dims")


def test_rope_strided(pools):
    """q/k heads as a view into a fused qkv buffer, output into a padded buffer."""
    rng = np.random.default_rng(5)
    T, H, hd, n_rot = 6, 3, 64, 48
    qkv = rng.standard_normal((T, 3 * H, hd)).astype(np.float32)
    k = qkv[:, H:2 * H]                                  # nb[2] = 3*H*hd*4
    pos = np.array([3, 0, 7, 100, 5000, 9], np.int32)
    pp = ffi.from_buffer("int32_t[]", pos)

    def run(pool):
        obig = sentinel_buffer((T, H + 1, hd + 4))
        check(lib.pi_op_rope(pool, tensor(k), pp, n_rot, ROPE_NORMAL, 10000.0, 1.0, tensor(obig[:, :H, :hd])))
        return obig

    obig = run_all(pools, run, "rope strided")
    ref, th = np_rope(k, pos, n_rot, 10000.0, 1.0)
    assert_within(obig[:, :H, :hd], ref, rope_tol(k, n_rot, th), "rope strided")
    assert np.all(obig[:, H] == -12345.5) and np.all(obig[:, :, hd:] == -12345.5)
    # in place on the strided view: rotates in the fused buffer, leaves q and v alone
    before = qkv.copy()
    check(lib.pi_op_rope(pools[2], tensor(k), pp, n_rot, ROPE_NORMAL, 10000.0, 1.0, tensor(k)))
    assert_within(k, ref, rope_tol(before[:, H:2 * H], n_rot, th), "rope in place, strided")
    assert_bit_equal(qkv[:, :H], before[:, :H])
    assert_bit_equal(qkv[:, 2 * H:], before[:, 2 * H:])


def test_rope_errors():
    x = np.zeros((2, 2, 64), np.float32)
    y = np.zeros_like(x)
    pos = np.zeros(2, np.int32)
    pp = ffi.from_buffer("int32_t[]", pos)
    E = lib.PI_ERR_INVALID_ARG
    for n_rot in (0, -2, 31, 66):
        expect_error(lib.pi_op_rope(ffi.NULL, tensor(x), pp, n_rot, ROPE_NORMAL, 10000.0, 1.0, tensor(y)), E)
    expect_error(lib.pi_op_rope(ffi.NULL, tensor(x), pp, 64, ROPE_NORMAL, 0.0, 1.0, tensor(y)), E)
    expect_error(lib.pi_op_rope(ffi.NULL, tensor(x), pp, 64, ROPE_NORMAL, 10000.0, -1.0, tensor(y)), E)
    expect_error(lib.pi_op_rope(ffi.NULL, tensor(x), ffi.NULL, 64, ROPE_NORMAL, 10000.0, 1.0, tensor(y)), E)
    expect_error(lib.pi_op_rope(ffi.NULL, tensor(x), pp, 64, ROPE_NORMAL, 10000.0, 1.0, tensor(y[:1])), E)
    for mode in (1, 3, -1):          # only PI_ROPE_NORMAL (0) and PI_ROPE_NEOX (2)
        expect_error(lib.pi_op_rope(ffi.NULL, tensor(x), pp, 64, mode, 10000.0, 1.0, tensor(y)), E)
    check(lib.pi_op_rope(ffi.NULL, tensor(x), pp, 64, ROPE_NORMAL, 10000.0, 1.0, tensor(y)))
    check(lib.pi_op_rope(ffi.NULL, tensor(x), pp, 64, ROPE_NEOX, 10000.0, 1.0, tensor(y)))


# ======================================================================================
# softmax
# ======================================================================================
def np_softmax(x):
    x = x.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(x), 0.0, np.exp(x - np.where(np.isneginf(m), 0.0, m)))
    s = e.sum(axis=-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def softmax_tol(ref):
    n = ref.shape[-1]
    return (SOFTMAX_ULPS + n / math.e) * U32 * ref + U32 / math.e


def softmax_input(rng, D):
    x = (rng.standard_normal((8, D)) * 5).astype(np.float32)
    x[1, ::3] = -np.inf                                 # some masked entries
    x[2, :] = -np.inf                                   # fully masked row -> zeros
    x[3, :] = -np.inf; x[3, 7] = 2.5                    # one visible entry -> exactly 1
    x[4] += 1000.0                                      # large values (no overflow after -max)
    x[5] = 0.75                                         # uniform row
    x[6] = np.linspace(-100, 10, D)                     # tail far below the max
    return x


def test_softmax(pools):
    rng = np.random.default_rng(17)
    D = 37
    x = softmax_input(rng, D)

    def run(pool):
        y = sentinel_buffer(x.shape)
        check(lib.pi_op_softmax(pool, tensor(x), tensor(y)))
        return y

    y = run_all(pools, run, "softmax")
    ref = np_softmax(x)
    assert_within(y, ref, softmax_tol(ref), "softmax")
    assert np.all(y[np.isneginf(x)] == 0.0)
    assert np.all(y[2] == 0.0)
    assert y[3, 7] == 1.0 and np.all(np.delete(y[3], 7) == 0.0)
    assert np.all(np.abs(y.sum(axis=1)[[0, 1, 3, 4, 5, 6, 7]] - 1) <= 8 * D * U32)
    xi = x.copy()
    check(lib.pi_op_softmax(pools[3], tensor(xi), tensor(xi)))
    assert_within(xi, ref, softmax_tol(ref), "softmax in place")


def test_softmax_strided_3d(pools):
    rng = np.random.default_rng(19)
    D = 50
    big = sentinel_buffer((2, 8 * 2, D + 6))
    big[0, ::2, :D] = softmax_input(rng, D)
    big[1, ::2, :D] = softmax_input(rng, D)
    x = big[:, ::2, :D]                                 # ne = [D, 8, 2], rows 2 apart

    def run(pool):
        obig = sentinel_buffer((2, 8, D + 1))
        check(lib.pi_op_softmax(pool, tensor(x), tensor(obig[..., :D])))
        return obig

    obig = run_all(pools, run, "softmax strided")
    ref = np_softmax(x)
    assert_within(obig[..., :D], ref, softmax_tol(ref), "softmax strided")
    assert np.all(obig[..., D] == -12345.5)


# ======================================================================================
# unary
# ======================================================================================
UNARY_OPS = {"silu": 0, "relu": 1, "gelu": 2}


def np_unary(name, x):
    x = x.astype(np.float64)
    if name == "silu":
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-x))
    if name == "relu":
        return np.maximum(x, 0.0)
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))


def unary_tol(name, x, ref):
    x, ref = np.abs(x.astype(np.float64)), np.abs(ref)
    if name == "silu":
        return SILU_RTOL * ref + UNDERFLOW_ATOL
    if name == "relu":
        return np.zeros_like(ref)
    return GELU_ULPS * U32 * (x + ref) + UNDERFLOW_ATOL


def unary_input(rng):
    x = np.concatenate([
        np.linspace(-30, 30, 601), rng.standard_normal(400) * 3,
        [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 80.0, -80.0, 100.0, -100.0, 1e4, -1e4, 88.7, -88.7],
    ]).astype(np.float32)
    return np.resize(x, (4, 3, 86))


@pytest.mark.parametrize("name", list(UNARY_OPS))
def test_unary(pools, name):
    rng = np.random.default_rng(23)
    x = unary_input(rng)
    op = UNARY_OPS[name]

    def run(pool):
        y = sentinel_buffer(x.shape)
        check(lib.pi_op_unary(pool, op, tensor(x), tensor(y)))
        return y

    y = run_all(pools, run, name)
    ref = np_unary(name, x)
    assert_within(y, ref, unary_tol(name, x, ref), name)
    if name == "relu":
        assert_bit_equal(y, np.where(x > 0, x, np.float32(0)), "relu exact")
    # in place, and a strided view (every other row of a padded buffer)
    xi = x.copy()
    check(lib.pi_op_unary(pools[2], op, tensor(xi), tensor(xi)))
    assert_within(xi, ref, unary_tol(name, x, ref), f"{name} in place")
    big = sentinel_buffer((4, 6, 90))
    big[:, ::2, 1:87] = x
    check(lib.pi_op_unary(pools[3], op, tensor(big[:, ::2, 1:87]), tensor(big[:, ::2, 1:87])))
    assert_within(big[:, ::2, 1:87], ref, unary_tol(name, x, ref), f"{name} strided in place")
    assert np.all(big[:, 1::2] == -12345.5) and np.all(big[..., 0] == -12345.5) and np.all(big[..., 87:] == -12345.5)


def np_softcap(x, cap):
    return cap * np.tanh(x.astype(np.float64) / cap)


@pytest.mark.parametrize("cap", [3.0, 30.0, 50.0])
def test_softcap(pools, cap):
    """pi_op_softcap (gemma2's final logits): cap tanh(x / cap) within SOFTCAP_ULPS * U32 * cap; +-inf give +-cap, a
    NaN stays NaN; in place and over a strided view too."""
    rng = np.random.default_rng(29)
    x = unary_input(rng) * np.float32(cap / 10)
    x.flat[:4] = [np.inf, -np.inf, 3e38, -3e38]

    def run(pool):
        y = sentinel_buffer(x.shape)
        check(lib.pi_op_softcap(pool, tensor(x), cap, tensor(y)))
        return y

    y = run_all(pools, run, "softcap")
    ref = np_softcap(x, cap)
    assert_within(y, ref, np.full(x.shape, SOFTCAP_ULPS * U32 * cap), "softcap")
    assert list(y.flat[:4]) == [cap, -cap, cap, -cap] and np.all(np.abs(y) <= cap)
    xi = x.copy()
    xi[0, 0, 5] = np.nan
    check(lib.pi_op_softcap(pools[2], tensor(xi), cap, tensor(xi)))
    assert np.isnan(xi[0, 0, 5])
    xi[0, 0, 5] = y[0, 0, 5]
    assert_bit_equal(xi, y, "softcap in place")
    big = sentinel_buffer((4, 6, 90))
    big[:, ::2, 1:87] = x
    check(lib.pi_op_softcap(pools[3], tensor(big[:, ::2, 1:87]), cap, tensor(big[:, ::2, 1:87])))
    assert_bit_equal(big[:, ::2, 1:87], y, "softcap strided in place")
    assert np.all(big[:, 1::2] == -12345.5) and np.all(big[..., 0] == -12345.5) and np.all(big[..., 87:] == -12345.5)


def test_softcap_errors():
    x = np.zeros((2, 8), np.float32)
    E = lib.PI_ERR_INVALID_ARG
    for cap in (0.0, -1.0, float("inf"), float("nan")):
        expect_error(lib.pi_op_softcap(ffi.NULL, tensor(x), cap, tensor(x)), E)
    expect_error(lib.pi_op_softcap(ffi.NULL, tensor(x), 1.0, tensor(np.zeros((2, 9), np.float32))), E)
    expect_error(lib.pi_op_softcap(ffi.NULL, tensor(x.astype(np.float16)), 1.0, tensor(x)), E)
    check(lib.pi_op_softcap(ffi.NULL, tensor(x), 1.0, tensor(x)))


def test_unary_errors():
    x = np.zeros((2, 8), np.float32)
    E = lib.PI_ERR_INVALID_ARG
    expect_error(lib.pi_op_unary(ffi.NULL, 3, tensor(x), tensor(x)), E)
    expect_error(lib.pi_op_unary(ffi.NULL, -1, tensor(x), tensor(x)), E)
    expect_error(lib.pi_op_unary(ffi.NULL, 0, tensor(x), tensor(x[:1])), E)
    expect_error(lib.pi_op_unary(ffi.NULL, 0, tensor(x.astype(np.float16)), tensor(x)), E)


# ======================================================================================
# binary
# ======================================================================================
BINARY_OPS = {"add": (0, np.add), "mul": (1, np.multiply)}
# numpy shapes (R2, R1, D) of b for a of shape (3, 5, 40): every dim either full or broadcast (1)
B_SHAPES = [(3, 5, 40), (1, 1, 40), (1, 5, 40), (3, 1, 40), (3, 5, 1), (1, 5, 1), (1, 1, 1), (3, 1, 1)]


@pytest.mark.parametrize("bshape", B_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(BINARY_OPS))
def test_binary(pools, name, bshape):
    rng = np.random.default_rng(29)
    op, npop = BINARY_OPS[name]
    a = (rng.standard_normal((3, 5, 40)) * 10).astype(np.float32)
    b = (rng.standard_normal(bshape) * 3).astype(np.float32)
    ref = npop(a, b)                                    # one correctly rounded f32 op: exact reference

    def run(pool):
        y = sentinel_buffer(a.shape)
        check(lib.pi_op_binary(pool, op, tensor(a), tensor(b, n_dims=3), tensor(y)))
        return y

    y = run_all(pools, run, name)
    assert_bit_equal(y, ref, f"{name} b{bshape}")
    # b given with fewer dims (trailing ne == 1), a/out strided, out aliasing a
    big = sentinel_buffer((3, 10, 43))
    big[:, ::2, 2:42] = a
    av = big[:, ::2, 2:42]
    bt = tensor(b[0, 0] if bshape[:2] == (1, 1) else b)
    check(lib.pi_op_binary(pools[3], op, tensor(av), bt, tensor(av)))
    assert_bit_equal(av, ref, f"{name} b{bshape} strided in place")
    assert np.all(big[:, 1::2] == -12345.5) and np.all(big[..., :2] == -12345.5) and np.all(big[..., 42:] == -12345.5)


def test_binary_errors():
    a = np.ones((3, 5, 40), np.float32)
    y = np.zeros_like(a)
    E = lib.PI_ERR_INVALID_ARG
    for bs in [(2, 5, 40), (3, 5, 20), (3, 4, 40), (1, 1, 2)]:
        b = np.ones(bs, np.float32)
        expect_error(lib.pi_op_binary(ffi.NULL, 0, tensor(a), tensor(b), tensor(y)), E)
    b = np.ones((1, 1, 40), np.float32)
    expect_error(lib.pi_op_binary(ffi.NULL, 2, tensor(a), tensor(b), tensor(y)), E)
    expect_error(lib.pi_op_binary(ffi.NULL, 0, tensor(a), tensor(b), tensor(y[:1])), E)
    expect_error(lib.pi_op_binary(ffi.NULL, 1, tensor(a), tensor(b.astype(np.float16)), tensor(y)), E)


# ======================================================================================
# attention
# ======================================================================================
def np_attention(q, k, v, mask, scale, softcap=0.0, sinks=None):
    """q (T, H, hd), k/v (n_kv, Hkv, hd), mask (T, n_kv) or None -> out (T, H, hd) float64 and the
    per-row tolerance terms.  Query head h reads kv head h // (H // Hkv).  softcap > 0: each score
    s = q.k scale becomes softcap tanh(s / softcap) before the mask is added (gemma2).  sinks (H,): head h's logit
    joins its softmax as one more column without a value (gpt-oss; a row that sees nothing stays zero)."""
    T, H, hd = q.shape
    n_kv, Hkv, _ = k.shape
    g = H // Hkv
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    m = np.zeros((T, n_kv)) if mask is None else mask.astype(np.float64)
    out = np.zeros((T, H, hd))
    for t in range(T):
        vis = ~np.isneginf(m[t])
        for h in range(H):
            if not vis.any():
                continue
            kk, vv = k[vis, h // g], v[vis, h // g]
            s = kk @ q[t, h] * scale
            s = (softcap * np.tanh(s / softcap) if softcap else s) + m[t, vis]
            top = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            total = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
            out[t, h] = (p / total) @ vv
    return out


def attention_tolerance(q, k, v, mask, scale, k_used=None, v_used=None, softcap=0.0):
    """First-order error bound of every output element (broadcast over head_dim).

    A perturbation |ds_c| <= delta of the scores changes each softmax weight p_c by at most
    2*delta*p_c, hence the output by 2*delta*max|v|.  delta: the f32 dot of hd terms (dot_tol) on
    |q||k|*scale, the scaling / mask add / x-max roundings (3*U32*|s - max| + U32*|s|), and, if the
    kernel sees rounded k (k_used, e.g. f16), scale*|q|.|k_used - k|.  The weights themselves carry
    SOFTMAX_ULPS*U32 (expf, the normalisation), the f32 axpy over n_kv rows (n_kv + 2)*U32 of
    sum p|v|, and a rounded v adds max|v_used - v|.  A soft cap passes the score errors on (its slope is at most 1)
    and adds its own SOFTCAP_ULPS*U32*softcap."""
    T, H, hd = q.shape
    n_kv, Hkv, _ = k.shape
    g = H // Hkv
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    dk = np.zeros_like(k) if k_used is None else np.abs(k_used.astype(np.float64) - k)
    dv = np.zeros_like(v) if v_used is None else np.abs(v_used.astype(np.float64) - v)
    m = np.zeros((T, n_kv)) if mask is None else mask.astype(np.float64)
    tol = np.zeros((T, H, 1))
    for t in range(T):
        vis = ~np.isneginf(m[t])
        for h in range(H):
            if not vis.any():
                continue
            kk, hk = k[vis, h // g], h // g
            s = kk @ q[t, h] * scale + m[t, vis]
            qk = np.abs(kk) @ np.abs(q[t, h])
            delta = (dot_tol(hd, qk.max()) * scale + 3 * U32 * np.abs(s - s.max()).max() + U32 * np.abs(s).max()
                     + scale * (dk[vis, hk] @ np.abs(q[t, h])).max() + SOFTCAP_ULPS * U32 * softcap)
            vmax = np.abs(v[vis, hk]).max()
            tol[t, h, 0] = ATTN_SAFETY * (vmax * (2 * delta + (SOFTMAX_ULPS + n_kv + 2) * U32)
                                          + dv[vis, hk].max())
    return tol


def attention_case(seed, T=4, H=8, Hkv=2, hd=64, n_kv=11):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32)
    # causal mask with an additive finite bias, the last query row fully masked
    mask = np.full((T, n_kv), -np.inf, np.float32)
    for t in range(T - 1):
        vis = n_kv - T + 1 + t
        mask[t, :vis] = -0.1 * np.arange(vis)[::-1]
    return q, k, v, mask


KV_TYPES = [(F32, F32), (F16, F16), (F32, F16), (F16, F32)]


@pytest.mark.parametrize("kt,vt", KV_TYPES, ids=lambda t: TYPE_NAME[t])
@pytest.mark.parametrize("use_mask", [True, False], ids=["mask", "no_mask"])
def test_attention(pools, kt, vt, use_mask):
    q, k, v, mask = attention_case(31 + kt + 2 * vt + use_mask)
    T, H, hd = q.shape
    scale = 1.0 / math.sqrt(hd)
    ke, ve = np_encode(k, kt), np_encode(v, vt)
    k_used, v_used = np_decode(ke, kt), np_decode(ve, vt)      # the values the kernel sees
    m = mask if use_mask else None

    def run(pool):
        out = sentinel_buffer(q.shape)
        check(lib.pi_op_attention(pool, tensor(q), tensor(ke, kt), tensor(ve, vt),
                                  tensor(m) if m is not None else ffi.NULL, scale, tensor(out)))
        return out

    out = run_all(pools, run, "attention")
    # vs the values the kernel multiplies (f16-rounded k/v): only f32 arithmetic error
    ref = np_attention(q, k_used, v_used, m, scale)
    assert_within(out, ref, attention_tolerance(q, k_used, v_used, m, scale), "attention")
    # vs the unrounded f32 k/v: the tolerance also carries the f16 rounding of k and v
    if (kt, vt) != (F32, F32):
        ref32 = np_attention(q, k, v, m, scale)
        assert_within(out, ref32, attention_tolerance(q, k, v, m, scale, k_used, v_used),
                      "attention vs unrounded k/v")
    if use_mask:
        assert np.all(out[T - 1] == 0.0), "fully masked query row must give zeros"


def prompt_equals_query_by_query(pools, q, k, v, mask, scale, what, softcap=0.0):
    """The prompt's attention (every pool: the same bits), each query's output checked against that query alone
    (the one-token path); k and v are (encoded array, type); softcap: pi_op_attention_softcap's. Returns the prompt's
    output [T, H, hd]."""
    T, H, hd = q.shape

    def run(pool):
        out = sentinel_buffer(q.shape)
        check(lib.pi_op_attention_softcap(pool, tensor(q), tensor(*k), tensor(*v), tensor(mask), scale, softcap,
                                          tensor(out)))
        return out

    out = run_all(pools, run, what)
    for t in range(T):
        one = sentinel_buffer((1, H, hd))
        check(lib.pi_op_attention_softcap(pools[0], tensor(q[t:t + 1]), tensor(*k), tensor(*v), tensor(mask[t:t + 1]),
                                          scale, softcap, tensor(one)))
        assert np.array_equal(out[t], one[0]), f"{what}: query {t}"
    return out


@pytest.mark.parametrize("hd", [64, 68])
@pytest.mark.parametrize("kt,vt", KV_TYPES, ids=lambda t: TYPE_NAME[t])
def test_attention_prompt_equals_query_by_query(pools, kt, vt, hd):
    """A prompt's queries go through attention in blocks of up to 32 tokens (ops.c ATT_QUERIES; keys dotted with
    sub-blocks of 8 queries, cells hidden from some of them computed and dropped; the V rows of cells only some
    queries see queued per query); every query's output is the bits of that query alone (the one-token path).
    75 queries: two full blocks and a tail; 99 cells: groups of 8 and a tail; causal, a sliding window (cells
    some queries see at both ends of a block's range), a hole and a fully masked query. Head size 64, and 68 (a
    partial vector of elements, and vec_dot's unfused tail of 4)."""
    rng = np.random.default_rng(77)
    T, H, Hkv, n_kv = 75, 4, 2, 99
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    ke = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), kt)
    ve = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), vt)
    mask = np.full((T, n_kv), -np.inf, np.float32)
    for t in range(T):
        last = n_kv - T + t                       # causal
        mask[t, max(0, last - 39):last + 1] = -0.01 * t   # a window of 40 cells
    mask[5, 3:17] = -np.inf
    mask[12] = -np.inf
    mask[40, 30:50] = -np.inf
    out = prompt_equals_query_by_query(pools, q, (ke, kt), (ve, vt), mask, 0.125, "attention prompt")
    assert np.all(out[12] == 0.0)


# (K, V, head size): heads past attn_qk's largest (256) take scores_by_rows, f16 by vec_dot8, other types converted
BLOCK_CASES = [(F16, F16, 64), (F16, F16, 136), (F16, F16, 260), (F32, F16, 64), (F32, F16, 136), (F32, F16, 260),
               (Q8_0, Q8_0, 64), (Q4_0, Q4_0, 64), (Q5_0, F16, 288), (F16, Q8_0, 64), (BF16, BF16, 136)]


@pytest.mark.parametrize("depth", [40, 300, 600])   # blocks of 32, 64 and 128 queries (ops.c attention_block)
@pytest.mark.parametrize("kt,vt,hd", BLOCK_CASES, ids=lambda x: TYPE_NAME.get(x, str(x)) if x < 64 else str(x))
def test_attention_prompt_blocks_at_depth(pools, kt, vt, hd, depth):
    """A prompt of 160 queries at depth takes blocks of up to 128 queries (more cells before the prompt, larger
    blocks: each block reads the cache once); at any size each query's output is the bits of that query alone.
    Causal, with a hole, a query that sees only the prompt and one that sees nothing; head sizes with a partial
    vector of elements (136: 8 past the last 16, 260: 4 past, and V blocks of fewer cells); caches of every kind
    (quantized rows converted to f32 once per block in the kernels, 4 and 8 at a time for one token)."""
    rng = np.random.default_rng(depth + hd)
    T, H, Hkv = 160, 8, 2
    n_kv = depth + T
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    ke = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), kt)
    ve = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), vt)
    mask = np.full((T, n_kv), -np.inf, np.float32)
    for t in range(T):
        mask[t, :depth + t + 1] = 0.0
    mask[7, 10:30] = -np.inf
    mask[70, :depth] = -np.inf
    mask[150] = -np.inf
    out = prompt_equals_query_by_query(pools, q, (ke, kt), (ve, vt), mask, 1.0 / np.sqrt(hd), "attention at depth")
    assert np.all(out[150] == 0.0)


@pytest.mark.parametrize("kt,vt", KV_TYPES, ids=lambda t: TYPE_NAME[t])
@pytest.mark.parametrize("T", [1, 4])   # one token (attend) and a prompt (attend_block)
def test_attention_softcap(pools, kt, vt, T):
    """gemma2's soft-capped scores: scale 1 makes the scores a few units and the cap of 3 bends most of them; the
    result is the capped reference's within its tolerance and far from the uncapped one's."""
    q, k, v, mask = attention_case(41 + kt + 2 * vt, T=4)
    q, mask = q[:T], mask[:T] if T > 1 else np.where(mask[:1] == -np.inf, -np.inf, 0.0).astype(np.float32)
    scale, cap = 1.0, 3.0
    ke, ve = np_encode(k, kt), np_encode(v, vt)
    k_used, v_used = np_decode(ke, kt), np_decode(ve, vt)

    def run(pool):
        out = sentinel_buffer(q.shape)
        check(lib.pi_op_attention_softcap(pool, tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, cap,
                                          tensor(out)))
        return out

    out = run_all(pools, run, "attention softcap")
    tol = attention_tolerance(q, k_used, v_used, mask, scale, softcap=cap)
    assert_within(out, np_attention(q, k_used, v_used, mask, scale, softcap=cap), tol, "attention softcap")
    plain = np_attention(q, k_used, v_used, mask, scale)
    assert np.abs(out - plain).max() > 100 * tol.max(), "the cap changes the result"
    zero = sentinel_buffer(q.shape)      # softcap 0: pi_op_attention's bits
    check(lib.pi_op_attention_softcap(pools[2], tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, 0.0,
                                      tensor(zero)))
    ref = sentinel_buffer(q.shape)
    check(lib.pi_op_attention(pools[2], tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, tensor(ref)))
    assert_bit_equal(zero, ref, "softcap 0")


@pytest.mark.parametrize("kt,vt", KV_TYPES, ids=lambda t: TYPE_NAME[t])
@pytest.mark.parametrize("T", [1, 4])   # one token (attend) and a prompt (attend_block)
def test_attention_sinks(pools, kt, vt, T):
    """gpt-oss's attention sinks (pi_op_attention_sinks): one logit per head joins the softmax as a column without a
    value. Sinks of the scores' size (and one far above them: nearly all the mass, the output near zero) against the
    reference within its tolerance and far from the reference without them; NULL sinks are pi_op_attention_softcap's
    bits; a row that sees nothing stays zero."""
    q, k, v, mask = attention_case(43 + kt + 2 * vt, T=4)
    q, mask = q[:T], mask[:T] if T > 1 else np.where(mask[:1] == -np.inf, -np.inf, 0.0).astype(np.float32)
    H = q.shape[1]
    scale = 0.125
    sinks = np.array([0.5, -1.0, 2.0, 0.0, 1.5, -3.0, 12.0, 0.25], np.float32)[:H]
    ke, ve = np_encode(k, kt), np_encode(v, vt)
    k_used, v_used = np_decode(ke, kt), np_decode(ve, vt)

    def run(pool):
        out = sentinel_buffer(q.shape)
        check(lib.pi_op_attention_sinks(pool, tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, 0.0,
                                        tensor(sinks), tensor(out)))
        return out

    out = run_all(pools, run, "attention sinks")
    tol = attention_tolerance(q, k_used, v_used, mask, scale)
    assert_within(out, np_attention(q, k_used, v_used, mask, scale, sinks=sinks), tol, "attention sinks")
    plain = np_attention(q, k_used, v_used, mask, scale)
    assert np.abs(out - plain).max() > 100 * tol.max(), "the sinks change the result"
    assert np.abs(out[:, 6]).max() < 1e-3 * np.abs(plain[:, 6]).max() + 1e-30   # sink 12: the output nearly zero
    if T > 1:
        assert np.all(out[T - 1] == 0.0), "a row that sees nothing gives zeros"
    none = sentinel_buffer(q.shape)
    check(lib.pi_op_attention_sinks(pools[2], tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, 0.0,
                                    ffi.NULL, tensor(none)))
    ref = sentinel_buffer(q.shape)
    check(lib.pi_op_attention_softcap(pools[2], tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, 0.0,
                                      tensor(ref)))
    assert_bit_equal(none, ref, "sinks NULL")


@pytest.mark.parametrize("kt,vt,hd", [(F16, F16, 64), (F16, F16, 260), (Q8_0, Q8_0, 64), (F32, F16, 136)],
                         ids=lambda x: TYPE_NAME.get(x, str(x)) if x < 64 else str(x))
def test_attention_sinks_prompt_equals_query_by_query(pools, kt, vt, hd):
    """With sinks (and a soft cap), a prompt's blocks give each query the bits of that query alone (the one-token
    path), under a sliding window and a causal mask: every path adds the sink after the lanes' sum."""
    rng = np.random.default_rng(hd + kt + 5)
    T, H, Hkv, depth = 70, 8, 2, 30
    n_kv = depth + T
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    ke = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), kt)
    ve = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), vt)
    sinks = (2.0 * rng.standard_normal(H)).astype(np.float32)
    mask = np.full((T, n_kv), -np.inf, np.float32)
    for t in range(T):
        mask[t, max(0, depth + t - 9):depth + t + 1] = 0.0
    mask[20] = -np.inf

    def run(pool, qq=q, mm=mask):
        out = sentinel_buffer(qq.shape)
        check(lib.pi_op_attention_sinks(pool, tensor(qq), tensor(ke, kt), tensor(ve, vt), tensor(mm), 0.125, 2.0,
                                        tensor(sinks), tensor(out)))
        return out

    out = run_all(pools, run, "attention sinks prompt")
    for t in range(T):
        assert np.array_equal(out[t], run(pools[0], q[t:t + 1], mask[t:t + 1])[0]), f"query {t}"
    assert np.all(out[20] == 0.0)


def test_attention_sinks_errors():
    q, k, v, mask = attention_case(3, T=2)
    out = np.zeros_like(q)
    E = lib.PI_ERR_INVALID_ARG
    good = np.zeros(q.shape[1], np.float32)
    for bad in (np.zeros(q.shape[1] - 1, np.float32), np.zeros((2, q.shape[1]), np.float32),
                good.astype(np.float16), np.array([np.nan] + [0.0] * (q.shape[1] - 1), np.float32),
                np.array([np.inf] + [0.0] * (q.shape[1] - 1), np.float32)):
        expect_error(lib.pi_op_attention_sinks(ffi.NULL, tensor(q), tensor(k), tensor(v), tensor(mask), 0.125, 0.0,
                                               tensor(bad), tensor(out)), E)
    check(lib.pi_op_attention_sinks(ffi.NULL, tensor(q), tensor(k), tensor(v), tensor(mask), 0.125, 0.0, tensor(good),
                                    tensor(out)))


def np_swiglu_oai(g, u, alpha, limit):
    """ggml's swiglu_oai in float64."""
    a = np.minimum(g.astype(np.float64), limit)
    return a / (1.0 + np.exp(-alpha * a)) * (np.clip(u.astype(np.float64), -limit, limit) + 1.0)


def test_swiglu_oai(pools):
    """gpt-oss's experts' activation (pi_op_swiglu_oai): the reference within (8 + |alpha g'|) U32 relative (exp's
    argument rounded: U32 |alpha g'| of e^-alpha g'; exp, the adds, the divide and the product a few U32; where e^z
    overflows, a zero), values past the limit on both sides, a row with a tail past the vectors; in place in up, on
    every thread count."""
    rng = np.random.default_rng(29)
    g = np.concatenate([rng.standard_normal(3000) * 6, np.linspace(-60, 20, 1003), [7.0, -7.0, 0.0]])
    u = np.concatenate([rng.standard_normal(3000) * 6, np.linspace(20, -60, 1003), [7.5, -7.5, -1.0]])
    g, u = g.astype(np.float32).reshape(2, -1), u.astype(np.float32).reshape(2, -1)
    alpha, limit = 1.702, 7.0

    def run(pool):
        y = u.copy()
        check(lib.pi_op_swiglu_oai(pool, tensor(g), tensor(y), alpha, limit))
        return y

    y = run_all(pools, run, "swiglu_oai")
    ref = np_swiglu_oai(g, u, np.float32(alpha), limit)
    z = np.abs(np.float32(alpha) * np.minimum(g, limit))
    # e^z overflows f32 past z = 88.7 (expf as ggml's): x / inf = -0 where the value is below |x| e^-88
    tol = (8 + z) * U32 * np.abs(ref) + UNDERFLOW_ATOL + np.where(z > 88.0, np.abs(ref), 0.0)
    assert_within(y, ref, tol, "swiglu_oai")
    assert np.abs(y - np_swiglu_oai(g, u, np.float32(alpha), 1e9)).max() > 1.0, "the limit clamps"


def test_swiglu_oai_errors():
    g = np.zeros((2, 8), np.float32)
    E = lib.PI_ERR_INVALID_ARG
    expect_error(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g), tensor(np.zeros((2, 9), np.float32)), 1.7, 7.0), E)
    expect_error(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g.astype(np.float16)), tensor(g.copy()), 1.7, 7.0), E)
    expect_error(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g), tensor(g.copy()), float("nan"), 7.0), E)
    expect_error(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g), tensor(g.copy()), 1.7, -1.0), E)
    expect_error(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g), tensor(g.copy()), 1.7, float("inf")), E)
    big = np.zeros((4, 16), np.float32)
    expect_error(lib.pi_op_swiglu_oai(ffi.NULL, tensor(big[::2, :8]), tensor(big[1::2, :8]), 1.7, 7.0), E)
    check(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g), tensor(g.copy()), 1.7, 7.0))


def test_xielu(pools):
    """Apertus's xIELU (pi_op_xielu) against its float64 formula over both branches (x > 0: a_p x^2 + beta x; else
    (expm1(min(x, eps)) - x) a_n + beta x) within 4 U32 relative, in place, on every thread count; errors."""
    x = np.concatenate([np.linspace(-30.0, 8.0, 3001), [0.0, -1e-7, 1e-7, -1e-6]]).astype(np.float32).reshape(1, -1)
    p = np.array([1.3, 0.9, 0.5, -1e-6], np.float32)     # a_n, a_p, beta, eps

    def run(pool):
        y = x.copy()
        check(lib.pi_op_xielu(pool, tensor(y), ffi.cast("float *", ffi.from_buffer(p))))
        return y

    y = run_all(pools, run, "xielu")
    xd = x.astype(np.float64)
    an, ap, b, e = (float(v) for v in p)
    ref = np.where(xd > 0, ap * xd * xd + b * xd, (np.expm1(np.minimum(xd, e)) - xd) * an + b * xd)
    assert_within(y, ref, 4 * U32 * np.abs(ref) + UNDERFLOW_ATOL + 4 * U32 * np.abs(xd) * (an + b), "xielu")
    big = np.zeros((4, 16), np.float32)
    expect_error(lib.pi_op_xielu(ffi.NULL, tensor(big[::2, :8]), ffi.cast("float *", ffi.from_buffer(p))),
                 lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_op_xielu(ffi.NULL, tensor(x.astype(np.float16)), ffi.cast("float *", ffi.from_buffer(p))),
                 lib.PI_ERR_INVALID_ARG)


@pytest.mark.parametrize("kt,vt,hd", [(F16, F16, 64), (F16, F16, 260), (Q8_0, Q8_0, 64), (F32, F16, 136)],
                         ids=lambda x: TYPE_NAME.get(x, str(x)) if x < 64 else str(x))
def test_attention_softcap_prompt_equals_query_by_query(pools, kt, vt, hd):
    """With a soft cap too, a prompt's blocks (attn_qk's scores, or scores_by_rows past a head of 256) give each
    query the bits of that query alone, under a sliding window (gemma2's local layers) and a causal mask."""
    rng = np.random.default_rng(hd + kt)
    T, H, Hkv, depth = 70, 8, 2, 30
    n_kv = depth + T
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    ke = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), kt)
    ve = np_encode(rng.standard_normal((n_kv, Hkv, hd)).astype(np.float32), vt)
    mask = np.full((T, n_kv), -np.inf, np.float32)
    for t in range(T):
        mask[t, max(0, depth + t - 16):depth + t + 1] = 0.0    # a window of 17
    mask[33] = -np.inf
    out = prompt_equals_query_by_query(pools, q, (ke, kt), (ve, vt), mask, 1.0 / np.sqrt(hd), "softcap prompt",
                                       softcap=2.0)
    assert np.all(out[33] == 0.0)


QUANT_KV = [(Q8_0, Q8_0), (Q4_0, Q4_0), (Q5_0, F16), (F16, Q8_0), (BF16, BF16), (Q8_0, F32)]


@pytest.mark.parametrize("kt,vt", QUANT_KV, ids=lambda t: TYPE_NAME[t])
@pytest.mark.parametrize("T", [1, 4])
def test_attention_quantized_cache(pools, kt, vt, T):
    """Caches of llama.cpp's other types (-ctk / -ctv), read as their values in f32 with f16's operations (q in f32,
    not quantized). Against numpy over the values the cache holds: the f32 arithmetic's tolerance alone; against the
    unrounded k and v, carrying the cache's rounding too."""
    q, k, v, mask = attention_case(53 + kt + 3 * vt + T, T=T, hd=96, n_kv=45)
    scale = 1.0 / math.sqrt(q.shape[2])
    ke, ve = np_encode(k, kt), np_encode(v, vt)
    k_used, v_used = np_decode(ke, kt), np_decode(ve, vt)

    def run(pool):
        out = sentinel_buffer(q.shape)
        check(lib.pi_op_attention(pool, tensor(q), tensor(ke, kt), tensor(ve, vt), tensor(mask), scale, tensor(out)))
        return out

    out = run_all(pools, run, "attention, quantized cache")
    assert_within(out, np_attention(q, k_used, v_used, mask, scale),
                  attention_tolerance(q, k_used, v_used, mask, scale), "attention over the cache's values")
    assert_within(out, np_attention(q, k, v, mask, scale),
                  attention_tolerance(q, k, v, mask, scale, k_used, v_used), "attention vs unrounded k/v")
    if T > 1:
        assert np.all(out[T - 1] == 0.0), "fully masked query row must give zeros"


def test_attention_no_gqa_and_strided(pools):
    """H == Hkv, and every operand a view with strides in dims >= 1 (fused qkv, padded cache)."""
    T, H, hd, n_kv = 3, 4, 32, 7
    rng = np.random.default_rng(41)
    qkv = rng.standard_normal((T, 3 * H, hd)).astype(np.float32)
    q = qkv[:, :H]
    kcache = np.zeros((n_kv + 4, H + 1, hd), np.uint16)        # f16 cache with a spare head slot
    vcache = np.zeros((n_kv + 4, H + 1, hd), np.float32)
    kf = rng.standard_normal((n_kv, H, hd)).astype(np.float32)
    vf = rng.standard_normal((n_kv, H, hd)).astype(np.float32)
    kcache[:n_kv, :H] = np_f16_bits(kf)
    vcache[:n_kv, :H] = vf
    k, v = kcache[:n_kv, :H], vcache[:n_kv, :H]
    mbig = np.full((T, n_kv + 5), np.nan, np.float32)
    mbig[:, :n_kv] = 0.0
    mbig[0, 5:n_kv] = -np.inf
    mask = mbig[:, :n_kv]
    scale = 0.3

    def run(pool):
        obig = sentinel_buffer((T, 2 * H, hd))
        check(lib.pi_op_attention(pool, tensor(q), tensor(k, F16), tensor(v), tensor(mask), scale,
                                  tensor(obig[:, H:])))
        return obig

    obig = run_all(pools, run, "attention strided")
    k_used = np_decode(np.ascontiguousarray(k), F16)
    ref = np_attention(q, k_used, v, mask, scale)
    assert_within(obig[:, H:], ref, attention_tolerance(q, k_used, v, mask, scale), "attention strided")
    assert np.all(obig[:, :H] == -12345.5)


def test_attention_errors():
    q = np.zeros((2, 8, 64), np.float32)
    k = np.zeros((5, 3, 64), np.float32)                       # 8 heads is not a multiple of 3
    out = np.zeros_like(q)
    E = lib.PI_ERR_INVALID_ARG
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(k), tensor(k), ffi.NULL, 1.0, tensor(out)), E)
    k = np.zeros((5, 2, 64), np.float32)
    k_i32 = tensor(k)   # a cache of a type with no dot product
    k_i32.type = I32
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), k_i32, tensor(k), ffi.NULL, 1.0, tensor(out)),
                 lib.PI_ERR_UNSUPPORTED)
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(k), tensor(k[:4]), ffi.NULL, 1.0, tensor(out)), E)
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(k[..., :32]), tensor(k[..., :32]), ffi.NULL, 1.0,
                                     tensor(out)), E)
    bad_mask = np.zeros((2, 4), np.float32)
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(k), tensor(k), tensor(bad_mask), 1.0,
                                     tensor(out)), E)
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(k), tensor(k), ffi.NULL, float("inf"),
                                     tensor(out)), E)
    kk = np.zeros((5, 2, 128), np.float32)
    expect_error(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(kk[..., ::2]), tensor(kk[..., ::2]), ffi.NULL,
                                     1.0, tensor(out)), E)                 # k rows not contiguous
    check(lib.pi_op_attention(ffi.NULL, tensor(q), tensor(k), tensor(k), ffi.NULL, 1.0, tensor(out)))
    for cap in (-1.0, float("inf"), float("nan")):
        expect_error(lib.pi_op_attention_softcap(ffi.NULL, tensor(q), tensor(k), tensor(k), ffi.NULL, 1.0, cap,
                                                 tensor(out)), E)
    check(lib.pi_op_attention_softcap(ffi.NULL, tensor(q), tensor(k), tensor(k), ffi.NULL, 1.0, 50.0, tensor(out)))


# ======================================================================================
# SIMD (native build) vs the portable scalar build
# ======================================================================================
# The integer block dots are exact in both builds and the activation quantizer is the same
# scalar code; only the f32 accumulation order differs (8-lane FMA accumulators vs a running
# sum).  Both results lie within dot_tol of the same exact value, so they differ by at most
# twice that.
SIMD_VS_SCALAR_FACTOR = 2.0


# scalar_lib: the session fixture of conftest.py (the library built once with -DPI_NATIVE=OFF)


def test_scalar_build_is_scalar(scalar_lib):
    info = ffi.string(scalar_lib.pi_system_info()).decode()
    assert "CPU_ISA = scalar (runs: scalar)" in info, info


def test_simd_vs_scalar_conversions(scalar_lib):
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)      # scalar vs F16C half -> float
    a, b = c_dequantize(F16, h, h.size, scalar_lib), c_dequantize(F16, h, h.size, lib)
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b))                         # NaN payloads may differ (sNaN quieting)
    assert_bit_equal(a[~nan], b[~nan], "f16 -> f32")
    rng = np.random.default_rng(61)
    for t in WEIGHT_TYPES:
        x = conversion_input(rng, t)
        a, b = c_quantize(t, x, scalar_lib), c_quantize(t, x, lib)
        assert_bit_equal(a, b, f"quantize {TYPE_NAME[t]}")
        ya, yb = c_dequantize(t, a, x.size, scalar_lib), c_dequantize(t, b, x.size, lib)
        assert_bit_equal(ya, yb, f"dequantize {TYPE_NAME[t]}")


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=TYPE_NAME.get)
def test_simd_vs_scalar_mul_mat(scalar_lib, pools, t):
    for K, N, T in [(32, 37, 2), (96, 19, 1), (4096, 37, 3)]:   # 96: an odd number of blocks (SIMD tail)
        raw, wd, x = mul_mat_case(t, K, N, T, seed=77 + K + t)
        y_simd = np.zeros((T, N), np.float32)
        y_scalar = np.zeros((T, N), np.float32)
        check(lib.pi_op_mul_mat(pools[3], tensor(raw, t), tensor(x), tensor(y_simd)))
        check(scalar_lib.pi_op_mul_mat(ffi.NULL, tensor(raw, t), tensor(x), tensor(y_scalar)))
        ref, tol, ref_q, tol_q = mul_mat_reference_and_tol(t, wd, x)
        assert_within(y_scalar, ref_q, tol_q, f"scalar mul_mat {TYPE_NAME[t]} K={K}")
        assert_within(y_simd, y_scalar, SIMD_VS_SCALAR_FACTOR * tol_q, f"SIMD vs scalar mul_mat {TYPE_NAME[t]} K={K}")


def test_simd_vs_scalar_attention(scalar_lib):
    q, k, v, mask = attention_case(91, hd=72)                   # 72: SIMD main loop + scalar tail
    scale = 1.0 / math.sqrt(72)
    ke, ve = np_f16_bits(k), np_f16_bits(v)
    outs = []
    for L in (lib, scalar_lib):
        out = np.zeros_like(q)
        check(L.pi_op_attention(ffi.NULL, tensor(q), tensor(ke, F16), tensor(ve, F16), tensor(mask), scale,
                                tensor(out)))
        outs.append(out)
    k_used, v_used = np_decode(ke, F16), np_decode(ve, F16)
    tol = attention_tolerance(q, k_used, v_used, mask, scale)
    assert_within(outs[0], outs[1], SIMD_VS_SCALAR_FACTOR * tol, "SIMD vs scalar attention")
