"""The CPU kernel levels (scalar, avx2, avx512, amx) against the scalar level: the numeric contract.

Every level must give the scalar level's bits, for every op and every weight type (docs/design.md,
"Numeric contract"): the integer dot products are exact, and every float sum keeps one order that
all levels share. Levels this CPU (or build) cannot run are skipped with the reason. The level is
switched in-process with pi_cpu_isa_set; the whole suite also runs under POWERINFER_ISA=<level>
(noxfile.py, session `isa`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import powerinfer as pi  # noqa: E402
from powerinfer._ffi import PowerInferError, check, ffi, lib  # noqa: E402
from test_ops import assert_bit_equal, tensor  # noqa: E402

LEVELS = pi.CPU_ISA_LEVELS
MISSING = {"avx2": "AVX2/FMA/F16C", "avx512": "AVX-512 F/BW/VL/DQ/CD/VNNI", "amx": "AMX tiles + AVX512-BF16"}

# every weight type the core computes with: GGUF id -> (name, elements per block, bytes per block)
TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 30: ("bf16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
         6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 10: ("q2_K", 256, 84),
         11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210),
         20: ("iq4_nl", 32, 18), 39: ("mxfp4", 32, 17)}


@pytest.fixture
def at_level():
    """at_level(name): switch the process to that level (skip if it cannot run here); restored after."""
    start = pi.cpu_isa()

    def switch(level: str) -> None:
        if not pi.cpu_isa_supported(level):
            pytest.skip(f"{level}: this CPU or build lacks {MISSING.get(level, level)} ({pi.system_info()})")
        pi.set_cpu_isa(level)

    yield switch
    pi.set_cpu_isa(start)


def quantize(t: int, w: np.ndarray) -> np.ndarray:
    """Rows of w (f32) in type t, as the core's own quantizer writes them."""
    name, bs, bb = TYPES[t]
    n, k = w.shape
    raw = np.zeros((n, k // bs * bb), np.uint8)
    for r in range(n):
        src = np.ascontiguousarray(w[r])
        check(lib.pi_quantize_row(t, ffi.cast("float *", src.ctypes.data), ffi.cast("void *", raw[r].ctypes.data), k))
    return raw


def wtensor(t: int, raw: np.ndarray):
    name, bs, bb = TYPES[t]
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t, 2
    ne = [raw.shape[1] // bb * bs, raw.shape[0], 1, 1]
    nb = [bb, raw.strides[0], raw.strides[0] * raw.shape[0], raw.strides[0] * raw.shape[0]]
    for i in range(4):
        p.ne[i], p.nb[i] = ne[i], nb[i]
    p.data = ffi.cast("void *", raw.ctypes.data)
    return p


def mul_mat(w, x: np.ndarray, n: int, pool) -> np.ndarray:
    y = np.zeros((x.shape[0], n), np.float32)
    check(lib.pi_op_mul_mat(pool, w, tensor(x), tensor(y)))
    return y


def test_levels_are_reported():
    assert pi.cpu_isa() in LEVELS
    assert pi.cpu_isa_supported("scalar")
    assert f"CPU_ISA = {pi.cpu_isa()}" in pi.system_info()
    with pytest.raises(PowerInferError, match="unknown ISA level"):
        pi.set_cpu_isa("sse9")
    for level in LEVELS:   # the best level that runs is the one chosen at start (unless POWERINFER_ISA)
        if pi.cpu_isa_supported(level) and LEVELS.index(level) > LEVELS.index(pi.cpu_isa()):
            import os
            assert os.environ.get("POWERINFER_ISA"), f"{level} runs here but {pi.cpu_isa()} was chosen"


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t", list(TYPES), ids=lambda t: TYPES[t][0])
def test_mul_mat_equals_scalar(at_level, pool2, level, t):
    rng = np.random.default_rng(t)
    K, N = 512, 40                       # N: five 8-row groups; K: two K-quant super-blocks
    w = (rng.standard_normal((N, K)) / 20).astype(np.float32)
    x = rng.standard_normal((17, K)).astype(np.float32)   # 17 tokens: 8 + 8 + 1 (every kernel tail)
    x[:, :32] *= 30.0
    x[3, 64:96] = 0.0
    raw = quantize(t, w)
    results = {}
    for lv in ("scalar", level):
        at_level(lv)
        wt = wtensor(t, raw)
        results[lv] = [mul_mat(wt, x[:T], N, pool2) for T in (1, 3, 6, 8, 17)]
        if t in (2, 39):   # Q4_0 and MXFP4 also through the interleaved copy
            nbytes = lib.pi_repack_bytes(wt)
            buf = np.zeros(nbytes, np.uint8)
            rt = ffi.new("pi_tensor *")
            check(lib.pi_repack(wt, ffi.cast("void *", buf.ctypes.data), nbytes, rt))
            results[lv] += [mul_mat(rt, x[:T], N, pool2) for T in (1, 3, 6, 8, 17)]
    for a, b in zip(results["scalar"], results[level]):
        assert_bit_equal(b, a, f"mul_mat {TYPES[t][0]} {level} vs scalar")


AMX_MIN_T = 16   # ops.c PI_TILES_MIN_T: from this batch on, an interleaved Q4_0 weight runs on AMX tiles


def repacked(wt):
    nbytes = lib.pi_repack_bytes(wt)
    buf = np.zeros(nbytes, np.uint8)
    rt = ffi.new("pi_tensor *")
    check(lib.pi_repack(wt, ffi.cast("void *", buf.ctypes.data), nbytes, rt))
    return rt, buf


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("N", [48, 40], ids=["rows16x3", "rows16+8"])
def test_prompt_batches_equal_scalar(at_level, pool2, level, N):
    """Q4_0 (plain and interleaved) at prompt batch sizes, K = 4096: on the amx level the interleaved
    weight's 16-row tiles take the batches of >= AMX_MIN_T tokens (16, 32: whole 16-token tiles; 100: six
    tiles and a 4-token tail for gemm8), the 8-row remainder of N = 40 goes to gemm8."""
    Ts = (16, 32, 100)
    assert min(Ts) >= AMX_MIN_T and all(T % 16 == 0 for T in Ts[:2]) and Ts[2] % 16   # the AMX path and its tails
    rng = np.random.default_rng(N)
    K = 4096
    w = (rng.standard_normal((N, K)) / 20).astype(np.float32)
    w[5, :64] *= 40.0                      # large scales next to small ones
    x = rng.standard_normal((max(Ts), K)).astype(np.float32)
    x[:, 32:64] *= 30.0
    x[7, 96:128] = 0.0                     # a zero activation block (d = 0)
    x[9, :] = np.abs(x[9, :])              # quant sums far from 0 (the -8 s term)
    raw = quantize(2, w)
    results = {}
    for lv in ("scalar", level):
        at_level(lv)
        wt = wtensor(2, raw)
        rt, keep = repacked(wt)
        results[lv] = [mul_mat(m, x[:T], N, pool2) for m in (rt, wt) for T in Ts]
    for i, (a, b) in enumerate(zip(results["scalar"], results[level])):
        assert_bit_equal(b, a, f"mul_mat q4_0 K={K} N={N} T={Ts[i % 3]} {'interleaved' if i < 3 else 'rows'} "
                               f"{level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t", [0, 1, 30, 2, 8, 3, 6, 12, 14, 39], ids=lambda t: TYPES[t][0])
def test_axpy_kernels_equal_scalar(at_level, pool2, level, t):
    """The sparse FFN's down step (axpy, axpy8) through pi_op_sparse_ffn with every neuron active."""
    rng = np.random.default_rng(100 + t)
    E, F = 256, 64
    up = quantize(t, (rng.standard_normal((F, E)) / 16).astype(np.float32))
    down_t = quantize(t, (rng.standard_normal((F, E)) / 8).astype(np.float32))
    assert_sparse_ffn_equals_scalar(at_level, pool2, level, lambda: (wtensor(t, up), wtensor(t, down_t)), rng,
                                    f"sparse ffn {TYPES[t][0]} {level} vs scalar")


def assert_sparse_ffn_equals_scalar(at_level, pool, level, weights, rng, what):
    """pi_op_sparse_ffn (gate mode seq, every neuron active) with the (up, down_t) tensors weights() makes, at the
    scalar level and at `level`: the same bits."""
    up, down_t = weights()
    E, F, T = up.ne[0], up.ne[1], 3
    x = rng.standard_normal((T, E)).astype(np.float32)
    scores = rng.standard_normal((T, F)).astype(np.float32)
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        w = ffi.new("pi_sparse_ffn_weights *")
        w.up, w.down_t = up[0], down_t[0]
        y = np.zeros((T, E), np.float32)
        check(lib.pi_op_sparse_ffn(pool, w, lib.PI_ACT_RELU, lib.PI_FFN_SEQ, tensor(x), tensor(scores), -1.0,
                                   tensor(y), ffi.NULL))
        out[lv] = y
    assert_bit_equal(out[level], out["scalar"], what)


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("op", ["relu", "silu", "gelu"])
def test_activations_equal_scalar(at_level, pool2, level, op):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(4000) * 4, np.linspace(-120, 100, 997),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 88.9, -103.9, 3.4e38]]).astype(np.float32)
    code = {"relu": lib.PI_UNARY_RELU, "silu": lib.PI_UNARY_SILU, "gelu": lib.PI_UNARY_GELU}[op]
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        y = np.zeros_like(x)
        check(lib.pi_op_unary(pool2, code, tensor(x), tensor(y)))
        out[lv] = y
    assert_bit_equal(out[level], out["scalar"], f"{op} {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
def test_q8_K_quantizer_equals_scalar(at_level, level):
    """Q8_K (the activations of Q2_K/Q3_K/Q6_K; each level has its own quantizer): the scalar level's bytes,
    with ties of |x|, a negative max, NaN and infinities."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(8 * 256) * np.repeat(10.0 ** rng.uniform(-6, 4, 8 * 8), 32)).astype(np.float32)
    x[:256] = 0.0                                   # all zero
    x[256:512] = np.linspace(-1, 1, 256)            # +-1 at both ends: the first one sets the sign
    x[512 + 100], x[512 + 200] = -7.0, 7.0
    x[768 + 5] = np.nan                             # NaN does not count for the max; it quantizes to -127
    x[1024 + 9] = np.inf                            # an infinite max: every product NaN or -0
    x[1280 + 3], x[1280 + 4] = -np.inf, np.nan

    def q8_K() -> np.ndarray:
        out = np.zeros(8 * 292, np.uint8)
        check(lib.pi_quantize_row(15, ffi.cast("float *", x.ctypes.data), ffi.cast("void *", out.ctypes.data), x.size))
        return out

    at_level("scalar")
    ref = q8_K()
    at_level(level)
    assert np.array_equal(q8_K(), ref)


@pytest.mark.parametrize("level", LEVELS[1:])
def test_f16_conversion_equals_scalar(at_level, level):
    """f32 -> f16 rows (the KV cache's stores; a SIMD body from the avx2 level on): the scalar level's bits, numpy's
    too, for ties, overflow, subnormals, zeros, infinities and NaNs with payloads (which become sign | 0x7e00)."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(1000) * 10.0 ** rng.uniform(-9, 6, 1000)).astype(np.float32)
    x[:8] = [65504.0, 65519.99, 65520.0, -1e9, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, -0.0]
    x[8:16] = [1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, np.inf, -np.inf, 1e-40, -6e-8, 0.0, 2049.0]   # ties to even
    x[16:24] = np.array([0x7FC00001, 0xFF800001, 0x7F800100, 0x7FFFFFFF, 0, 0, 0, 0], np.uint32).view(np.float32)
    x[997] = np.nan   # the scalar tail

    def f16() -> np.ndarray:
        out = np.zeros(x.size, np.uint16)
        check(lib.pi_quantize_row(1, ffi.cast("float *", x.ctypes.data), ffi.cast("void *", out.ctypes.data), x.size))
        return out

    at_level("scalar")
    ref = f16()
    finite = ~np.isnan(x)
    with np.errstate(over="ignore"):   # 1e9 and 65520 overflow to inf, as intended
        assert np.array_equal(ref[finite], x[finite].astype(np.float16).view(np.uint16))
    assert np.array_equal(ref[~finite], np.where(np.signbit(x[~finite]), 0xFE00, 0x7E00))
    at_level(level)
    assert np.array_equal(f16(), ref)


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("T", [1, 3, 11])   # one token (decode), prompts: one block and a block and a tail
def test_attention_f16_cache_equals_scalar(at_level, pool2, level, T):
    rng = np.random.default_rng(11)
    hd, nh, nkv, n_kv = 64, 4, 2, 37
    q = rng.standard_normal((T, nh, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, nkv, hd)).astype(np.float16)
    v = rng.standard_normal((n_kv, nkv, hd)).astype(np.float16)
    mask = np.zeros((T, n_kv), np.float32)
    mask[0, 30:] = -np.inf
    mask[min(1, T - 1), 5] = -np.inf
    mask[T - 1, 33:] = -0.5
    mask[T - 1, 16:32] = -np.inf   # a whole vector of hidden cells at every level's width
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        o = np.zeros((T, nh, hd), np.float32)
        check(lib.pi_op_attention(pool2, tensor(q), tensor(k), tensor(v), tensor(mask), 0.125, tensor(o)))
        out[lv] = o
    assert_bit_equal(out[level], out["scalar"], f"attention {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("T", [1, 3, 11])
def test_attention_softcap_equals_scalar(at_level, pool2, level, T):
    """gemma2's soft-capped scores (softmax_exp caps a row with softcap_row first): each level the scalar level's
    bits, one token and prompts, f16 and q8_0 caches."""
    rng = np.random.default_rng(17)
    hd, nh, nkv, n_kv = 64, 4, 2, 37
    q = rng.standard_normal((T, nh, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, nkv, hd)).astype(np.float16)
    v = rng.standard_normal((n_kv, nkv, hd)).astype(np.float16)
    k8 = quantize(8, rng.standard_normal((n_kv * nkv, hd)).astype(np.float32)).reshape(n_kv, nkv, -1)
    mask = np.zeros((T, n_kv), np.float32)
    mask[0, 30:] = -np.inf
    mask[T - 1, 16:32] = -np.inf
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        o = np.zeros((2, T, nh, hd), np.float32)
        check(lib.pi_op_attention_softcap(pool2, tensor(q), tensor(k), tensor(v), tensor(mask), 0.5, 2.0,
                                          tensor(o[0])))
        check(lib.pi_op_attention_softcap(pool2, tensor(q), cache_tensor(8, k8), tensor(v), tensor(mask), 0.5, 2.0,
                                          tensor(o[1])))
        out[lv] = o
    assert_bit_equal(out[level], out["scalar"], f"attention softcap {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("T", [1, 3, 11])
def test_attention_sinks_equals_scalar(at_level, pool2, level, T):
    """gpt-oss's attention sinks (softmax_exp's sink column: in the max, added after the lanes' tree): each level the
    scalar level's bits, one token and prompts, f16 and q8_0 caches, with and without a soft cap."""
    rng = np.random.default_rng(23)
    hd, nh, nkv, n_kv = 64, 4, 2, 37
    q = rng.standard_normal((T, nh, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, nkv, hd)).astype(np.float16)
    v = rng.standard_normal((n_kv, nkv, hd)).astype(np.float16)
    k8 = quantize(8, rng.standard_normal((n_kv * nkv, hd)).astype(np.float32)).reshape(n_kv, nkv, -1)
    sinks = np.array([0.5, -2.0, 3.0, 9.0], np.float32)
    mask = np.zeros((T, n_kv), np.float32)
    mask[0, 30:] = -np.inf
    mask[T - 1, 16:32] = -np.inf
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        o = np.zeros((3, T, nh, hd), np.float32)
        for i, (kk, cap) in enumerate(((tensor(k), 0.0), (cache_tensor(8, k8), 0.0), (tensor(k), 2.0))):
            check(lib.pi_op_attention_sinks(pool2, tensor(q), kk, tensor(v), tensor(mask), 0.25, cap, tensor(sinks),
                                            tensor(o[i])))
        out[lv] = o
    assert_bit_equal(out[level], out["scalar"], f"attention sinks {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
def test_swiglu_oai_equals_scalar(at_level, level):
    """pi_op_swiglu_oai (gpt-oss's experts): each level the scalar level's bits, values past the limit, NaN and
    infinities, a row with a tail past the vectors."""
    rng = np.random.default_rng(31)
    g = np.concatenate([rng.standard_normal(3000) * 8, np.linspace(-120, 30, 997),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 7.0, -7.0, 1e-40, 3e38]]).astype(np.float32)
    u = np.concatenate([rng.standard_normal(3000) * 8, np.linspace(30, -120, 997),
                        [np.nan, 1.0, -np.inf, np.inf, 0.5, 7.5, -7.5, -1.0, 0.0]]).astype(np.float32)
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        y = u.copy()
        check(lib.pi_op_swiglu_oai(ffi.NULL, tensor(g), tensor(y), 1.702, 7.0))
        out[lv] = y
    assert_bit_equal(out[level], out["scalar"], f"swiglu_oai {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
def test_softcap_equals_scalar(at_level, level):
    """pi_op_softcap (gemma2's logits): each level the scalar level's bits, rows with a tail past the vectors."""
    rng = np.random.default_rng(19)
    x = np.concatenate([rng.standard_normal(3000) * 20, np.linspace(-200, 200, 4001), rng.standard_normal(999) * 1e-4,
                        [0.0, -0.0, np.inf, -np.inf, 1e-30, 3e38]]).astype(np.float32).reshape(2, -1)
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        y = np.zeros_like(x)
        check(lib.pi_op_softcap(ffi.NULL, tensor(x), 30.0, tensor(y)))
        out[lv] = y
    assert_bit_equal(out[level], out["scalar"], f"softcap {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t", [2, 3, 6, 7, 8, 20, 30, 39],
                         ids=["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "bf16", "mxfp4"])
def test_dequantize_row_equals_scalar(at_level, level, t):
    """Rows as f32 (get_rows, a KV cache's values in the attention): each level's conversion the scalar level's bits
    (Q4_0 and Q8_0 have their own per level)."""
    rng = np.random.default_rng(t)
    raw = quantize(t, (rng.standard_normal((3, 256)) * 10.0 ** rng.uniform(-3, 3, (3, 1))).astype(np.float32))
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        o = np.zeros((3, 256), np.float32)
        for r in range(3):
            check(lib.pi_dequantize_row(t, ffi.cast("void *", raw[r].ctypes.data),
                                        ffi.cast("float *", o[r].ctypes.data), 256))
        out[lv] = o
    assert_bit_equal(out[level], out["scalar"], f"dequantize {TYPES[t][0]} {level} vs scalar")


def cache_tensor(t: int, raw: np.ndarray):
    """pi_tensor [hd, heads, cells] over raw rows (cells, heads, row bytes) of type t."""
    name, bs, bb = TYPES[t]
    n_kv, nh, rb = raw.shape
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t, 3
    ne = [rb // bb * bs, nh, n_kv, 1]
    nb = [bb, rb, rb * nh, rb * nh * n_kv]
    for i in range(4):
        p.ne[i], p.nb[i] = ne[i], nb[i]
    p.data = ffi.cast("void *", raw.ctypes.data)
    return p


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("T", [1, 11])
@pytest.mark.parametrize("kt,vt", [(8, 8), (3, 7), (30, 2), (6, 1)], ids=["q8_0", "q4_1-q5_1", "bf16-q4_0", "q5_0-f16"])
def test_attention_quantized_cache_equals_scalar(at_level, pool2, level, T, kt, vt):
    """Caches of -ctk / -ctv's other types: each level's attention the scalar level's bits (the integer dots and
    axpy's float steps every level keeps; q quantized by each level's own Q8_0 code)."""
    rng = np.random.default_rng(13)
    hd, nh, nkv, n_kv = 64, 4, 2, 37
    q = rng.standard_normal((T, nh, hd)).astype(np.float32)
    k = quantize(kt, rng.standard_normal((n_kv * nkv, hd)).astype(np.float32)).reshape(n_kv, nkv, -1)
    v = quantize(vt, rng.standard_normal((n_kv * nkv, hd)).astype(np.float32)).reshape(n_kv, nkv, -1)
    mask = np.zeros((T, n_kv), np.float32)
    mask[0, 30:] = -np.inf
    mask[T - 1, 16:32] = -np.inf
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        o = np.zeros((T, nh, hd), np.float32)
        check(lib.pi_op_attention(pool2, tensor(q), cache_tensor(kt, k), cache_tensor(vt, v), tensor(mask), 0.125,
                                  tensor(o)))
        out[lv] = o
    assert_bit_equal(out[level], out["scalar"], f"attention {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0", "q4_0", "q5_0"])
def test_model_logits_equal_scalar(at_level, tmp_path, level, dtype):
    """A whole forward pass (prompt, then token by token) of a test model, each level against scalar."""
    from make_test_model import write_model
    path = tmp_path / f"m-{dtype}.gguf"
    write_model(path, dtype=dtype, n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, seed=5)
    prompt = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64]
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        model = pi.Model(path)   # repacked at this level; the layout is the same at every level
        ctx = pi.Context(model, n_ctx=64)
        ctx.decode(prompt, logits="all")
        logits = [ctx.logits(i) for i in range(len(prompt))]
        for tok in (5, 9, 33):
            ctx.decode([tok])
            logits.append(ctx.logits())
        out[lv] = np.stack(logits)
    assert_bit_equal(out[level], out["scalar"], f"{dtype} model logits {level} vs scalar")


def test_ab_isa_model_modes(tmp_path):
    """bench/ab_isa.py's whole-model A/B (prompt, and --gen: tokens one at a time) runs and finds the levels' logits
    equal: the numeric contract seen through the benchmark tool."""
    import subprocess
    from make_test_model import write_model
    path = tmp_path / "m.gguf"
    write_model(path, dtype="q4_0", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=3)
    script = Path(__file__).resolve().parents[1] / "bench" / "ab_isa.py"
    for extra, test in (([], "pp4"), (["--gen", "3"], "tg3 after pp4")):
        p = subprocess.run([sys.executable, str(script), "--model", str(path), "-T", "4", "-r", "1", "-t", "1",
                            "--levels", ",".join(LEVELS)] + extra, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-500:]
        line = [ln for ln in p.stdout.splitlines() if ln.startswith(test)]
        assert line and line[0].endswith("logits equal"), p.stdout


@pytest.mark.parametrize("level", LEVELS[1:])
def test_bundled_sparse_model_equals_scalar(at_level, level):
    path = Path(__file__).resolve().parents[1] / "models" / "tinyrelu" / "tinyrelu.q4_0.powerinfer.gguf"
    prompt = list(range(1, 40, 3))
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        ctx = pi.Context(pi.Model(path), n_ctx=64)
        ctx.decode(prompt, logits="all")
        rows = [ctx.logits(i) for i in range(len(prompt))]
        ctx.decode([7])
        out[lv] = np.stack(rows + [ctx.logits()])
    assert_bit_equal(out[level], out["scalar"], f"sparse model {level} vs scalar")


def test_model_made_at_one_level_runs_at_another(at_level):
    """Repacked and packed weights have one layout for every level."""
    path = Path(__file__).resolve().parents[1] / "models" / "tinyrelu" / "tinyrelu.q4_0.powerinfer.gguf"
    best = pi.cpu_isa()
    model = pi.Model(path)
    ctx = pi.Context(model, n_ctx=32)
    ctx.decode([1, 2, 3])
    a = ctx.logits().copy()
    at_level("scalar")
    ctx2 = pi.Context(model, n_ctx=32)
    ctx2.decode([1, 2, 3])
    assert_bit_equal(ctx2.logits(), a, f"model repacked at {best}, run at scalar")


def test_powerinfer_isa_environment_variable(tmp_path):
    """POWERINFER_ISA picks the level at load; an unknown or unsupported one is a clear import error."""
    import os
    import subprocess
    probe = "import powerinfer as pi; print(pi.cpu_isa())"
    env = {k: v for k, v in os.environ.items() if k != "POWERINFER_ISA"}
    best = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    best = best.stdout.strip()
    for level in LEVELS[: LEVELS.index(best) + 1]:
        p = subprocess.run([sys.executable, "-c", probe], env={**env, "POWERINFER_ISA": level},
                           capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.strip() == level, (level, p.stderr[-300:])
    for bad, words in [("sse9", "unknown level"), ("AVX2", "unknown level")] + (
            [(LEVELS[LEVELS.index(best) + 1], "does not")] if best != LEVELS[-1] else []):
        p = subprocess.run([sys.executable, "-c", probe], env={**env, "POWERINFER_ISA": bad},
                           capture_output=True, text=True)
        assert p.returncode != 0 and f"POWERINFER_ISA={bad}" in p.stderr and words in p.stderr, p.stderr[-300:]


# ops.c PI_TILES_MIN_T: from this batch on, Q8_0/Q5_0/Q4_1/Q5_1/Q2_K..Q6_K rows run on AMX tiles (amx level)
AMX_ROWS_MIN_T = 16


ROWS_CASES = ([(t, K) for t in (8, 6, 10, 11, 12, 13, 14) for K in (4096, 2048)]
              + [(8, 640), (6, 640), (8, 1088), (6, 1088)]
              + [(t, K) for t in (3, 7) for K in (4096, 1088, 640)]   # Q4_1, Q5_1
              + [(t, 4096) for t in (1, 30)])   # f16, bf16: 16 KB of f32 activations per token, so T = 100 spans
                                                # several of mul_mat's token chunks (L2 / 4 of activations)


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t,K", ROWS_CASES, ids=[f"{TYPES[t][0]}-K{K}" for t, K in ROWS_CASES])
def test_prompt_batches_rows_equal_scalar(at_level, pool2, level, t, K):
    """Q8_0, Q5_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K at prompt batch sizes: on the amx level the row
    tile kernel (tiles_rows) takes 16-row groups x 16-token tiles of the batches of >= AMX_ROWS_MIN_T tokens (16, 32;
    100: six tiles and a 4-token tail for vec_dot8); N = 44 leaves an 8-row remainder (vec_dot8) and 4 single rows
    (vec_dot). K = 640 (Gemma 3 270M's rows: 20 blocks, residues of 8 with 2 or 3 blocks) and 1088 (34 blocks: a
    second K chunk of 2 blocks) for the 32-element types."""
    Ts = (16, 32, 100)
    assert min(Ts) >= AMX_ROWS_MIN_T and Ts[2] % 16
    N = 44
    rng = np.random.default_rng(t * 10 + K)
    w = (rng.standard_normal((N, K)) / 20).astype(np.float32)
    w[5, :256] *= 40.0                     # large scales next to small ones
    w[6, 256:512] = np.abs(w[6, 256:512])  # one-signed blocks (K-quant mins)
    w[8, :] = 0.0                          # a zero row (d = 0)
    x = rng.standard_normal((max(Ts), K)).astype(np.float32)
    x[:, 32:64] *= 30.0
    x[7, 256:512] = 0.0                    # a zero activation (super-)block (d = 0)
    x[9, :] = np.abs(x[9, :])              # quant sums far from 0
    x[11, :] = -127.0                      # extreme quants
    rows_equal_scalar(at_level, pool2, level, t, quantize(t, w), x, Ts)


@pytest.mark.parametrize("level", LEVELS[1:])
def test_q2_K_random_blocks_rows_equal_scalar(at_level, pool2, level):
    """Q2_K blocks of any bytes at prompt batch sizes (the amx level's tiles hold sc q in one byte, the mins' sum comes
    from VNNI word pairs) give the scalar level's bits; rows 0-3 have every scale, min and quant at its maximum."""
    from test_kquants import random_blocks
    rng = np.random.default_rng(22)
    N, K = 44, 1024
    raw = random_blocks(rng, 10, N * K // 256).reshape(N, -1)
    raw[:4, :80] = 0xff                                  # scale 15, min 15, quant 3 (d, dmin kept)
    raw[4, 80:82] = np.frombuffer(np.float16(0).tobytes(), np.uint8)   # d = 0
    x = rng.standard_normal((100, K)).astype(np.float32)
    x[3, :] = -127.0
    x[5, :] = np.abs(x[5, :])                            # bsums far from 0
    rows_equal_scalar(at_level, pool2, level, 10, np.ascontiguousarray(raw), x, (16, 32, 100))


@pytest.mark.parametrize("level", LEVELS[1:])
def test_q3_K_random_blocks_rows_equal_scalar(at_level, pool2, level):
    """Q3_K blocks of any bytes at prompt batch sizes (the amx level's tiles hold -sc q in one byte: its extreme,
    sc = -32 and q = -4, is the all-zero block, rows 0-3 here) give the scalar level's bits."""
    from test_kquants import random_blocks
    rng = np.random.default_rng(33)
    N, K = 44, 1024
    raw = random_blocks(rng, 11, N * K // 256).reshape(N, -1)
    raw[:4, :108] = 0                                    # every scale -32, every quant -4 (d kept)
    raw[4, 108:110] = np.frombuffer(np.float16(0).tobytes(), np.uint8)   # d = 0
    x = rng.standard_normal((100, K)).astype(np.float32)
    x[3, :] = -127.0
    rows_equal_scalar(at_level, pool2, level, 11, np.ascontiguousarray(raw), x, (16, 32, 100))


def rows_equal_scalar(at_level, pool2, level, t, raw, x, Ts, what=""):
    """mul_mat over raw (rows of type t, the file's layout) at `level` == at the scalar level, bit for bit, for the
    first T rows of x, T in Ts."""
    N, K = raw.shape[0], x.shape[1]
    results = {}
    for lv in ("scalar", level):
        at_level(lv)
        wt = wtensor(t, raw)
        results[lv] = [mul_mat(wt, x[:T], N, pool2) for T in Ts]
    for T, a, b in zip(Ts, results["scalar"], results[level]):
        assert_bit_equal(b, a, f"mul_mat {TYPES[t][0]} K={K} N={N} T={T} {level} vs scalar{what}")


def q8_0_cases(K):
    """Q8_0/Q5_0 weights [48, K] (three 16-row groups) and activations [100, K] with the edge cases of both types."""
    N = 48
    rng = np.random.default_rng(K)
    w = (rng.standard_normal((N, K)) / 20).astype(np.float32)
    w[5, :256] *= 40.0                     # large scales next to small ones
    w[8, :] = 0.0                          # a zero row (d = 0)
    w[9, :64] = -1.0                       # quants of -127 (Q5_0: u = 0, -16 as Q8_0)
    w[10, :64] = np.tile(np.linspace(-1.0, 1.0, 32, dtype=np.float32), 2)   # Q5_0: every u from 0 to 31
    x = rng.standard_normal((100, K)).astype(np.float32)
    x[:, 32:64] *= 30.0
    x[7, 256:512] = 0.0                    # a zero activation block (d = 0)
    x[9, :] = np.abs(x[9, :])              # quant sums far from 0 (the -128 s term of VNNI)
    x[11, :] = -127.0                      # extreme quants
    return w, x


Q8_0_TS = (1, 3, 8, 16, 32, 100)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("K", [640, 1088, 4096])
@pytest.mark.parametrize("t", [8, 6, 3, 7], ids=["q8_0", "q5_0", "q4_1", "q5_1"])
def test_q8_0_interleaved_equals_scalar(at_level, pool2, level, K, t):
    """Q8_0's interleaved copy (Q8_0X16: 16 rows a group, pi_repack), and Q5_0's, Q4_1's and Q5_1's (Q5_0X16,
    Q4_1X16, Q5_1X16: the same order at the file's bytes a row; at the amx level their prompt tiles unpack them), at
    every level give the bits of the file's layout at the scalar level: decode (1 token), the 2-token pairs and 1-token
    tail of the AVX-512 kernel (3, 8), and prompt batches whose whole 16-token tiles go to AMX (16, 32; 100: six tiles
    and a 4-token tail). K as in test_prompt_batches_rows_equal_scalar (residues of 8 blocks, a second AMX K chunk);
    N = 48: three groups."""
    w, x = q8_0_cases(K)
    name = {8: "q8_0x16", 6: "q5_0x16", 3: "q4_1x16", 7: "q5_1x16"}[t]
    interleaved_equals_scalar_rows(at_level, pool2, level, t, quantize(t, w), x, Q8_0_TS, name)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("K", [640, 4096])
def test_q5_0x16_runs_at_every_level(at_level, pool2, level, K):
    """A Q5_0X16 copy made at the best level below amx (the layout is level-independent) gives the file layout's
    scalar bits at every level, the amx level included."""
    w, x = q8_0_cases(K)
    made_at = [lv for lv in LEVELS if lv != "amx" and pi.cpu_isa_supported(lv)][-1]
    interleaved_equals_scalar_rows(at_level, pool2, level, 6, quantize(6, w), x, Q8_0_TS, "q5_0x16",
                                   repack_level=made_at)


@pytest.mark.parametrize("level", LEVELS)
def test_q6_K_copied_only_at_avx512_and_amx(at_level, level):
    """Which levels make Q6_K's interleaved copy at load: the AVX-512 ones (the avx2 regrouping decoded 1.1-2x slower
    on a Zen 3, so that level converts a prompt's rows instead, which test_prompt_batches_rows_equal_scalar and
    test_K_rows_extremes_equal_scalar cover; at the amx level the copy has tile kernels as the file's layout does, and
    decodes 1.09x faster), while Q4_K's copy is made at every level: the rule is the level's repack kernel for the
    type, not the type alone."""
    raw = quantize(14, np.random.default_rng(1).standard_normal((16, 256)).astype(np.float32))
    at_level(level)
    assert lib.pi_repack_bytes(wtensor(14, raw)) == (raw.nbytes if level in ("avx512", "amx") else 0)
    raw4 = quantize(12, np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32))
    assert lib.pi_repack_bytes(wtensor(12, raw4)) == raw4.nbytes


def interleaved_equals_scalar_rows(at_level, pool2, level, t, raw, x, Ts, name, repack_level=None):
    """mul_mat over raw (rows of type t) at the scalar level == over its interleaved copy (type `name`, made at
    repack_level, default `level`) at `level`, for the first T rows of x, T in Ts, with and without a pool."""
    N = raw.shape[0]
    at_level("scalar")
    expected = [mul_mat(wtensor(t, raw), x[:T], N, pool2) for T in Ts]
    at_level(repack_level or level)
    rt, keep = repacked(wtensor(t, raw))
    at_level(level)
    assert ffi.string(lib.pi_type_name(rt.type)).decode() == name
    for T, want in zip(Ts, expected):
        K = x.shape[1]
        assert_bit_equal(mul_mat(rt, x[:T], N, pool2), want, f"mul_mat {name} K={K} T={T} {level} vs scalar rows")
        assert_bit_equal(mul_mat(rt, x[:T], N, ffi.NULL), want, f"mul_mat {name} K={K} T={T} {level}, no pool")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("t,name", [(1, "f16x8"), (30, "bf16x8")], ids=["f16", "bf16"])
@pytest.mark.parametrize("K", [8, 200, 2048])
def test_16bit_interleaved_equals_scalar(at_level, pool2, level, t, name, K):
    """f16 and bf16 weights' interleaved copies (F16X8, BF16X8: 8 rows a group in two halves of 4, pi_repack) give the
    bits of the file's rows at the scalar level, at every level: decode (1 token: one half after the other), the
    short blocks (3, 4) and 8-token blocks of the prompt kernels with their tails (13; the AVX2 level's 3-token
    blocks and the 1 or 2 tokens left: 4, 8, 13), and, at K = 2048, a prompt of 100 tokens whose f32 activations
    (800 KB) go in several L2 token chunks (the AVX2 level's 24-token calls: 4 calls and a tail of 4). K: one chunk of 8, 25 chunks (no whole
    512-bit step pairs), 256 chunks. N = 40: five groups."""
    Ts = (1, 3, 4, 8, 13, 100)
    N = 40
    rng = np.random.default_rng(K + t)
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[3] *= 1e4                            # large and tiny weights next to each other
    w[6] *= 1e-4
    w[11] = 0.0                            # a zero row
    x = rng.standard_normal((max(Ts), K)).astype(np.float32)
    x[2] *= 1e3
    at_level(level)
    interleaved_equals_scalar_rows(at_level, pool2, level, t, quantize(t, w), x, Ts, name)


def q4_K_extreme_rows(rng, N: int, K: int, raw: np.ndarray) -> np.ndarray:
    """raw (Q4_K rows from the quantizer) with rows 0..3 replaced by random blocks over the whole format: every
    6-bit scale and min (63 included), every nibble, d and dmin of either sign up to 2^4, and a zero row (16, or
    the last)."""
    raw = raw.copy()
    blocks = raw.reshape(N, K // 256, 144)
    blocks[:4] = rng.integers(0, 256, blocks[:4].shape, dtype=np.uint8)
    blocks[:4, :, 0:4] = rng.uniform(-16, 16, (4, K // 256, 2)).astype(np.float16).view(np.uint8)
    blocks[3, :, 4:16] = 0xff                     # sc = mn = 63 in every sub-block
    blocks[3, :, 16:] = 0xff                      # q = 15
    blocks[min(16, N - 1)] = 0                    # a zero row (d = dmin = 0)
    return raw


def q5_K_extreme_rows(rng, N: int, K: int, raw: np.ndarray) -> np.ndarray:
    """raw (Q5_K rows from the quantizer) with rows 0..3 replaced by random blocks over the whole format: every
    6-bit scale and min, every quant bit, d and dmin of either sign up to 2^4; row 3 with sc = mn = 63 and every
    quant 31; a zero row (16, or the last)."""
    raw = raw.copy()
    blocks = raw.reshape(N, K // 256, 176)
    blocks[:4] = rng.integers(0, 256, blocks[:4].shape, dtype=np.uint8)
    blocks[:4, :, 0:4] = rng.uniform(-16, 16, (4, K // 256, 2)).astype(np.float16).view(np.uint8)
    blocks[3, :, 4:] = 0xff                       # scales, qh, qs
    blocks[min(16, N - 1)] = 0                    # a zero row (d = dmin = 0)
    return raw


def q6_K_extreme_rows(rng, N: int, K: int, raw: np.ndarray) -> np.ndarray:
    """raw (Q6_K rows from the quantizer) with rows 0..3 replaced by random blocks over the whole format: every quant
    bit, every int8 scale (-128 included), d of either sign up to 2^4; row 3 with every quant 63 and every scale
    -128 (the int32 budget's extreme); a zero row (16, or the last)."""
    raw = raw.copy()
    blocks = raw.reshape(N, K // 256, 210)
    blocks[:4] = rng.integers(0, 256, blocks[:4].shape, dtype=np.uint8)
    blocks[:4, :, 208:210] = rng.uniform(-16, 16, (4, K // 256, 1)).astype(np.float16).view(np.uint8)
    blocks[3, :, :192] = 0xff                     # u = 63
    blocks[3, :, 192:208] = 0x80                  # sc = -128
    blocks[min(16, N - 1)] = 0                    # a zero row (d = 0)
    return raw


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t,extreme", [(12, q4_K_extreme_rows), (13, q5_K_extreme_rows), (14, q6_K_extreme_rows)],
                         ids=["q4_K", "q5_K", "q6_K"])
@pytest.mark.parametrize("K", [1280, 4352])
def test_K_rows_extremes_equal_scalar(at_level, pool2, level, t, extreme, K):
    """The K-quants' row kernels (on the amx level the tile kernels, whose tiles sum whole super-blocks of the scales
    times the quants split in bytes, amx_k.c) over blocks that cover the whole format (every scale and min, the
    largest products) against activations with every Q8_KM step multiplier (1..32) and extreme quants, at prompt
    batch sizes, give the scalar level's bits. K: 5 and 17 super-blocks, so the last K chunk is a partial one."""
    Ts = (16, 32, 100)
    N = 44
    rng = np.random.default_rng(K + t)
    w = (rng.standard_normal((N, K)) / 20).astype(np.float32)
    raw = extreme(rng, N, K, quantize(t, w))
    x = rng.standard_normal((max(Ts), K)).astype(np.float32)
    x[:, ::32] *= 1000.0                   # an outlier per sub-block: m near 32 wherever the rest is small
    x[:, 64:96] *= 0.001                   # one sub-block far below its super-block's largest value (m = 1)
    x[5, :] = -1.0                         # every quant -127 (or -128), m = 32
    x[6, :] = np.where(np.arange(K) % 2, 1.0, -1.0)
    rows_equal_scalar(at_level, pool2, level, t, raw, x, Ts, " (extreme blocks)")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("t,name,extreme", [(12, "q4_Kx16", q4_K_extreme_rows), (13, "q5_Kx16", q5_K_extreme_rows),
                                            (14, "q6_Kx16", q6_K_extreme_rows)],
                         ids=["q4_K", "q5_K", "q6_K"])
@pytest.mark.parametrize("K", [256, 2048, 4352])
def test_K_interleaved_equals_scalar(at_level, pool2, level, t, name, extreme, K):
    """Q4_K's, Q5_K's and Q6_K's interleaved copies (Q4_KX16, Q5_KX16, Q6_KX16: 16 rows a group, pi_repack) at every
    level that makes them (scalar included: its own gemm16; the amx level makes all three, with tile kernels over the
    copies; Q6_K only at avx512 and amx, and the avx512 copy runs at the levels below) give
    the bits of the file's layout at the scalar level: decode (1 token), the 4-token blocks, 2-token pair and 1-token
    tail of the AVX-512 Q4_K kernel (3, 7, 8), calls of 8 tokens and their tails, and prompt batches whose whole
    16-token tiles go to AMX (16, 32; 100: six tiles and a 4-token tail). K: one super-block, two AMX K chunks (4
    super-blocks each), 17 super-blocks (a chunk of one). N = 48: three groups."""
    Ts = (1, 3, 7, 8, 16, 32, 100)
    N = 48
    rng = np.random.default_rng(K + t - 11)
    w = (rng.standard_normal((N, K)) / 20).astype(np.float32)
    w[5, :256] *= 40.0                     # large scales next to small ones
    w[9, :] = np.abs(w[9, :]) + 0.5        # mins far from 0
    x = rng.standard_normal((max(Ts), K)).astype(np.float32)
    x[:, 32:64] *= 30.0                    # step multipliers > 1 in the other sub-blocks
    x[7, :256] = 0.0                       # a zero activation super-block (d = 0)
    x[9, :] = np.abs(x[9, :]) * 50         # large activations, bsums far from 0
    x[11, :] = -127.0                      # extreme quants
    raw = extreme(rng, N, K, quantize(t, w))
    at_level(level)
    repack_level = None
    if t == 14 and level in ("scalar", "avx2"):   # no Q6_K copy made here: run the avx512 level's
        at_level("avx512")
        repack_level = "avx512"
    if lib.pi_repack_bytes(wtensor(t, raw)) == 0:
        assert t in (13, 14) and level == "amx", f"{name}: no interleaved copy at {level}"
        pytest.skip(f"{level}: {name[:4]} stays in the file's layout (its tile kernels read only that)")
    interleaved_equals_scalar_rows(at_level, pool2, level, t, raw, x, Ts, name, repack_level)


def bf16_edge_case(seed: int = 5, N: int = 48, K: int = 200, T: int = 9):
    """bf16 weight bits and f32 activations whose products (about 2^-140 .. 2^-112, mixed signs) and partial sums
    straddle FLT_MIN, where vdpbf16ps flushes by the exact value (arch/bf16_dot.c): rows of tiny weights against tiny
    activations, subnormal weights (exponent field 0) and f32 subnormal activations (bf16 subnormals: taken as zero),
    beside ordinary rows; K = 200: 25 chunks (an odd count) and no tail, so every path of the lane loops runs."""
    rng = np.random.default_rng(seed)
    mag = lambda shape: np.exp2(rng.uniform(-70, -56, shape))   # noqa: E731
    w = (rng.choice([-1.0, 1.0], (N, K)) * mag((N, K))).astype(np.float32)
    w[: N // 4] = rng.standard_normal((N // 4, K))          # ordinary rows
    raw = np.ascontiguousarray(w).view(np.uint32) >> 16        # truncated to bf16 bits
    raw = raw.astype(np.uint16)
    sub = rng.random((N, K)) < 0.1                             # subnormal weights: exponent field 0
    raw[sub] = (raw[sub] & 0x8000) | rng.integers(1, 0x80, sub.sum()).astype(np.uint16)
    x = (rng.choice([-1.0, 1.0], (T, K)) * mag((T, K))).astype(np.float32)
    x[0] = rng.standard_normal(K)                              # an ordinary token
    x[1, ::7] = np.float32(1e-40)                              # f32 subnormals
    # the last row, token 2: lane 0's steps FLT_MIN (2^-63 2^-63), then -2^-150 (-2^-75 2^-75): exact just below
    # FLT_MIN, rounded to it; flushed. Rows N - 2: +2^-150 (not flushed).
    for r, sign in ((N - 1, 0x8000), (N - 2, 0)):
        raw[r] = 0
        raw[r, 0], raw[r, 1] = sign | (52 << 7), 64 << 7
    x[2, 0], x[2, 1] = 2.0 ** -75, 2.0 ** -63
    return raw.view(np.uint8).reshape(N, 2 * K), x


def bf16_results(raw, x, pool, name):
    """mul_mat of bf16 rows over x for T = 1, 2, 9: the file's layout, and the BF16X8 copy where the level has one"""
    N = raw.shape[0]
    wt = wtensor(30, raw)
    out = {f"rows T={T}": mul_mat(wt, x[:T], N, pool) for T in (1, 2, 9)}
    if lib.pi_repack_bytes(wt) > 0:
        rt, buf = repacked(wt)   # buf: the copy's memory, alive while rt is used
        out.update({f"bf16x8 T={T}": mul_mat(rt, x[:T], N, pool) for T in (1, 2, 9)})
    return out


@pytest.mark.parametrize("dot", ["1", "0"], ids=["vdpbf16ps", "f32"])
def test_bf16_contracts_equal_scalar_at_every_level(tmp_path, dot):
    """bf16 weights under each contract (POWERINFER_BF16_DOT: 1, vdpbf16ps's arithmetic on bf16 activations, the
    default on CPUs with AVX512_BF16; 0, f32 activations), in another process (the choice is made at load): at every
    level this CPU runs, the file's rows and the BF16X8 copy give the scalar level's bits on bf16_edge_case (flush
    edges: a flush judged on the rounded sum, or steps without DAZ, fail here) and on ordinary rows. Under 1 the
    avx512 level runs vdpbf16ps where the CPU has it (else the avx2 level's fma steps), avx2 the fma steps under
    MXCSR FTZ + DAZ, scalar the steps spelled out."""
    import os
    import subprocess
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import powerinfer as pi\n"
        "from test_isa import LEVELS, bf16_edge_case, bf16_results\n"
        "out = {}\n"
        "for level in [lv for lv in LEVELS if pi.cpu_isa_supported(lv)]:\n"
        "    pi.set_cpu_isa(level)\n"
        "    for seed in (5, 6):\n"
        "        raw, x = bf16_edge_case(seed)\n"
        "        out.update({f'{level}|{seed} {k}': v for k, v in bf16_results(raw, x, pi._ffi.ffi.NULL, level).items()})\n"
        "print(int(pi.bf16_dot()))\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, **out)\n")
    env = {**os.environ, "POWERINFER_BF16_DOT": dot}
    env.pop("POWERINFER_ISA", None)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-600:]
    assert p.stdout.strip() == dot
    got = dict(np.load(tmp_path / "out.npz"))
    levels = {k.split("|")[0] for k in got}
    assert "scalar" in levels and len(got) >= 6 * len(levels)
    for k, v in got.items():
        level, case = k.split("|")
        want = got[f"scalar|{case}"]
        assert_bit_equal(v, want, f"bf16 ({'vdpbf16ps' if dot == '1' else 'f32'} contract) {case} at {level} vs scalar")
    if dot == "1":   # not everything flushed to zero
        assert np.count_nonzero(got["scalar|5 rows T=9"]) > got["scalar|5 rows T=9"].size // 3
