"""llama.cpp's read-only types (the core has no quantizer for them), against numpy written from the block layouts
(tests/test_kquants.py's np_dequant): IQ4_NL and IQ4_XS, 4-bit types on a non-linear grid of 16 int8 values;
IQ3_XXS and IQ3_S, 3-bit types whose groups of 4 elements are points of a lattice grid (256 / 512 points), and
IQ2_XXS, IQ2_XS and IQ2_S, 2-bit types whose groups of 8 are (256 / 512 / 1024 points; the grids are the tables
core/src/iq_grids.h that tools/gen_iq_grids.py writes from gguf-py's), with a sign bit per element, and IQ1_S and
IQ1_M, whose groups of 8 are points of a 2048-point grid of {-1, 0, 1} shifted by +-1/8; and MXFP4 (gpt-oss's
experts), IQ4_NL's layout and kernels with a grid of the doubled E2M1 values and an E8M0 power-of-two scale, which
has a quantizer (llama.cpp's; tests/test_mxfp4.py):

  - dequantization of arbitrary block bytes, bit-exact (the numpy code does the C code's f32 operations), and equal
    to gguf-py's own dequantizer (the same format implemented elsewhere);
  - mul_mat at 1, 3, 8, 9 and 17 tokens (the single-row dot, the 8-row kernel where the type has one, and their
    tails) against float64 sums of the dequantized weights and the dequantized activations (IQ4_NL and MXFP4: Q8_0
    activations, the others Q8_K, as llama.cpp), within test_kquants' dot bound, which one flipped bit of a
    quant or grid index exceeds (checked);
  - every ISA level this CPU runs bit-identical to the scalar level (exact integer sums, one float order), and the
    thread count changes no bit;
  - the sparse FFN op with these up and down_t rows (the gathered dots and the axpy of the down step);
  - the IQ4 types' and MXFP4's load-time copies against their rows.

Files quantized by llama.cpp itself: tests/compat/test_iq_vs_llama_cpp.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer._ffi import check, ffi, lib
from test_isa import LEVELS, assert_sparse_ffn_equals_scalar, at_level  # noqa: F401  (at_level: a fixture)
from test_kquants import (ACT_TYPE, BLOCK, F32, IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS,
                          MXFP4, NP_ACT_QUANT,
                          assert_thread_counts_identical, assert_within, bits_equal, c_dequantize, c_mul_mat, dot_reference, np_dequant, np_dequant_act,
                          random_blocks, tensor)
from test_ops import assert_bit_equal
from test_ops import tensor as np_tensor

NAME = {IQ4_NL: "iq4_nl", IQ4_XS: "iq4_xs", IQ3_XXS: "iq3_xxs", IQ3_S: "iq3_s", IQ2_XXS: "iq2_xxs", IQ2_XS: "iq2_xs",
        IQ2_S: "iq2_s", IQ1_S: "iq1_s", IQ1_M: "iq1_m", MXFP4: "mxfp4"}
TYPES = list(NAME)
# first quant (nibble, grid index) byte of a block
QS_OFFSET = {IQ4_NL: 2, IQ4_XS: 8, IQ3_XXS: 2, IQ3_S: 2, IQ2_XXS: 2, IQ2_XS: 2, IQ2_S: 2, IQ1_S: 2, IQ1_M: 0, MXFP4: 1}


def rows(rng, t, n, k) -> np.ndarray:
    """n rows of k elements of random blocks of type t, as a (n, row bytes) uint8 array."""
    return random_blocks(rng, t, n * k // BLOCK[t][0]).reshape(n, -1)


def test_type_traits():
    for t, name in NAME.items():
        assert lib.pi_type_supported(t) == 1 and ffi.string(lib.pi_type_name(t)).decode() == name
        assert lib.pi_row_bytes(t, 4096) == 4096 // BLOCK[t][0] * BLOCK[t][1]
    assert lib.PI_TYPE_IQ4_NL == IQ4_NL and lib.PI_TYPE_IQ4_XS == IQ4_XS
    assert lib.PI_TYPE_IQ3_XXS == IQ3_XXS and lib.PI_TYPE_IQ3_S == IQ3_S
    assert (lib.PI_TYPE_IQ2_XXS, lib.PI_TYPE_IQ2_XS, lib.PI_TYPE_IQ2_S) == (IQ2_XXS, IQ2_XS, IQ2_S)
    assert (lib.PI_TYPE_IQ1_S, lib.PI_TYPE_IQ1_M) == (IQ1_S, IQ1_M)
    assert lib.pi_row_bytes(IQ4_XS, 128) == -1 and lib.pi_row_bytes(IQ4_NL, 48) == -1
    for t in TYPES:   # read only, but IQ4_NL (the KV cache's -ctk / -ctv iq4_nl) and MXFP4 (llama.cpp's quantizer)
        if t not in (IQ4_NL, MXFP4):
            assert lib.pi_quantize_row(t, ffi.new("float[256]"), ffi.new("uint8_t[512]"), 256) != 0


def test_iq4_nl_quantizer():
    """IQ4_NL rows written (a KV cache of iq4_nl): values on the grid times a power of two come back exactly; on
    Gaussian rows of mixed scales the relative RMS error is below Q4_0's (measured 0.086 against 0.103, llama.cpp's
    grid being finer near zero); an all-zero block gives zeros."""
    def round_trip(t, x, block_bytes):
        raw = np.zeros(x.size // 32 * block_bytes, np.uint8)
        out = np.zeros_like(x)
        check(lib.pi_quantize_row(t, ffi.cast("float *", x.ctypes.data), ffi.cast("void *", raw.ctypes.data), x.size))
        check(lib.pi_dequantize_row(t, ffi.cast("void *", raw.ctypes.data), ffi.cast("float *", out.ctypes.data),
                                    x.size))
        return out
    grid = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
    rng = np.random.default_rng(4)
    exact = (grid[rng.integers(0, 16, 256)] * np.float32(2.0 ** -7)).astype(np.float32)
    exact[::32] = -127 * 2.0 ** -7   # each block reaches the grid's end
    assert np.array_equal(round_trip(IQ4_NL, exact, 18), exact)
    x = (rng.standard_normal(32 * 2000) * rng.uniform(0.01, 10, 32 * 2000)).astype(np.float32)
    x[:32] = 0.0
    err = {t: np.sqrt(np.mean((round_trip(t, x, nb) - x) ** 2) / np.mean(x ** 2)) for t, nb in ((IQ4_NL, 18), (2, 18))}
    assert err[IQ4_NL] < 0.95 * err[2], err
    assert np.all(round_trip(IQ4_NL, x, 18)[:32] == 0.0)


def test_grid_tables_are_gguf_pys():
    """core/src/iq_grids.h is what tools/gen_iq_grids.py writes from gguf-py's tables."""
    import gen_iq_grids
    assert gen_iq_grids.main(["--check"]) == 0


@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
def test_dequantize_random_blocks(t):
    import gguf
    rng = np.random.default_rng(100 + t)
    raw = random_blocks(rng, t, 64)
    got = c_dequantize(t, raw)
    assert bits_equal(got, np_dequant(raw, t)), f"{NAME[t]}: {np.sum(got != np_dequant(raw, t))} values differ"
    theirs = gguf.quants.dequantize(raw.reshape(1, -1), gguf.GGMLQuantizationType(t)).astype(np.float32).ravel()
    assert bits_equal(got, theirs), f"{NAME[t]} against gguf-py: {np.sum(got != theirs)} values differ"


@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
@pytest.mark.parametrize("K", [256, 4096])
def test_mul_mat_against_numpy(t, K):
    rng = np.random.default_rng(200 + t + K)
    N = 37
    raw = rows(rng, t, N, K).reshape(-1)
    scales = np.repeat(10.0 ** rng.uniform(-2, 2, (17, K // 32)), 32, axis=1)
    x = (rng.standard_normal((17, K)) * scales).astype(np.float32)
    for T in (1, 3, 8, 9, 17):
        ref, tol = dot_reference(t, raw, x[:T])
        assert_within(c_mul_mat(t, raw, x[:T]), ref, tol, f"mul_mat {NAME[t]} K={K} T={T}")


@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
def test_dot_tolerance_is_tight(t):
    """The errors seen are far below the bound, and one flipped bit of a quant (a nibble off by one grid step, a
    grid index one point off) is far above it."""
    rng = np.random.default_rng(300 + t)
    K = 4096
    raw = rows(rng, t, 1, K).reshape(-1)
    x = rng.standard_normal((1, K)).astype(np.float32)
    bit = 1
    if t == MXFP4:   # |value| steps of 1 (IQ4: 10 and more) on scales spread 2^23 wide: block 3 at the range's top,
        raw[BLOCK[t][1] * 3] = 135   # and the high nibbles' bit (element 5's activation quantizes to 0 here)
        bit = 16
    ref, tol = dot_reference(t, raw, x)
    assert np.all(np.abs(c_mul_mat(t, raw, x) - ref) < 0.1 * tol)
    effects = []
    for k in range(8):
        bad = raw.copy()
        bad[BLOCK[t][1] * 3 + QS_OFFSET[t] + k] ^= bit   # block 3
        effects.append(abs(float(dot_reference(t, bad, x)[0][0, 0] - ref[0, 0])))
    assert min(effects) > 10 * tol[0, 0], (NAME[t], min(effects) / tol[0, 0])


def test_thread_counts_identical():
    rng = np.random.default_rng(7)
    K, N, T = 512, 70, 4
    x = rng.standard_normal((T, K)).astype(np.float32)
    for t in TYPES:
        assert_thread_counts_identical(t, rows(rng, t, N, K).reshape(-1), x, NAME[t])


def mul_mat(w, x: np.ndarray, n: int, pool) -> np.ndarray:
    y = np.zeros((x.shape[0], n), np.float32)
    check(lib.pi_op_mul_mat(pool, w, np_tensor(x), np_tensor(y)))
    return y


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
def test_mul_mat_equals_scalar(at_level, pool2, level, t):
    rng = np.random.default_rng(400 + t)
    K, N = 512, 40                       # N: five 8-row groups; K: two IQ4_XS super-blocks
    raw = rows(rng, t, N, K)
    x = rng.standard_normal((40, K)).astype(np.float32)   # 17 tokens: 8 + 8 + 1 (every kernel tail); 40: the IQ3
    x[:, :32] *= 30.0                                      # rows' second conversion (Q6_K -> Q6_KX16, avx2 and avx512)
    x[3, 64:96] = 0.0
    results = {}
    for lv in ("scalar", level):
        at_level(lv)
        results[lv] = [mul_mat(tensor(raw, t, K, N), x[:T], N, pool2) for T in (1, 3, 6, 8, 17, 40)]
    for a, b in zip(results["scalar"], results[level]):
        assert_bit_equal(b, a, f"mul_mat {NAME[t]} {level} vs scalar")


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
def test_batch_equals_one_token_at_a_time(at_level, pool2, level, t):
    """A prompt's matmul gives each token the bits of that token alone, at every level: for the IQ3 types the batch
    converts its rows to Q6_K and runs Q6_K's 8-row kernel (pi_to_batch_fn), or from 32 tokens at the avx2 and avx512 levels
    converts those again into Q6_KX16 groups (40 tokens), one token runs the type's own dot. One IQ3_XXS row has d =
    the smallest fp16 subnormal, whose half fp16 cannot hold: its rows stay on the own kernels."""
    rng = np.random.default_rng(450 + t)
    K, N = 512, 48
    raw = rows(rng, t, N, K)
    if t == IQ3_XXS:
        raw[5, 0:2] = np.array([1], np.uint16).view(np.uint8)
    x = rng.standard_normal((40, K)).astype(np.float32)
    at_level(level)
    wt = tensor(raw, t, K, N)
    alone = np.concatenate([mul_mat(wt, x[i:i + 1], N, pool2) for i in range(len(x))])
    for T in (2, 9, 17, 40):
        assert_bit_equal(mul_mat(wt, x[:T], N, pool2), alone[:T], f"{NAME[t]} {T} tokens at once vs alone ({level})")


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
def test_sparse_ffn_equals_scalar(at_level, pool2, level, t):
    """The sparse FFN's gathered dots and down step (axpy) with these rows, every neuron active."""
    rng = np.random.default_rng(500 + t)
    E, F = 256, 64
    up, down_t = rows(rng, t, F, E), rows(rng, t, F, E)
    assert_sparse_ffn_equals_scalar(at_level, pool2, level, lambda: (tensor(up, t, E, F), tensor(down_t, t, E, F)),
                                    rng, f"sparse ffn {NAME[t]} {level} vs scalar")


@pytest.mark.parametrize("t", TYPES, ids=NAME.get)
def test_sparse_ffn_op(t):
    """pi_op_sparse_ffn with gate/up/down_t of the type against numpy: h = SiLU(gate.xq) (up.xq) for the selected
    (neuron, token) pairs, out = sum_i h_i down_t[i]."""
    rng = np.random.default_rng(600 + t)
    E, F, T = 512, 96, 3
    raw = {k: rows(rng, t, F, E) for k in ("gate", "up", "down_t")}
    deq = {k: np_dequant(v.reshape(-1), t).reshape(F, E).astype(np.float64) for k, v in raw.items()}
    x = rng.standard_normal((T, E)).astype(np.float32) / 8
    scores = rng.standard_normal((T, F)).astype(np.float32)
    thr = 0.3
    w = ffi.new("pi_sparse_ffn_weights *")
    w.gate, w.up, w.down_t = (tensor(raw[k], t, E, F)[0] for k in ("gate", "up", "down_t"))
    out = np.full((T, E), -7.0, np.float32)
    check(lib.pi_op_sparse_ffn(ffi.NULL, w, lib.PI_ACT_SILU, lib.PI_FFN_PAR, tensor(x, F32, E, T),
                               tensor(scores, F32, F, T), thr, tensor(out, F32, E, T), ffi.NULL))
    at = ACT_TYPE[t]
    xq = np.stack([np_dequant_act(NP_ACT_QUANT[at](row), at) for row in x]).astype(np.float64)
    g, u = xq @ deq["gate"].T, xq @ deq["up"].T
    h = np.where(scores >= thr, g / (1 + np.exp(-np.clip(g, -80, 80))) * u, 0.0)
    ref = h @ deq["down_t"]
    tol = 1e-4 * np.abs(h) @ np.abs(deq["down_t"]) + 1e-6   # as test_kquants.test_sparse_ffn_op
    assert_within(out, ref, tol, f"sparse ffn {NAME[t]}")


COPY = {IQ4_NL: "iq4_nlx8", IQ4_XS: "iq4_xsx16", MXFP4: "mxfp4x8"}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("t", list(COPY), ids=NAME.get)
def test_interleaved_copy_equals_rows(at_level, pool2, level, t):
    """The load-time copies, IQ4_NL's in Q4_0X8's layout (the grid looked up in Q4_0's 8-row kernels), MXFP4's in its
    order (MXFP4X8: its grid, an E8M0 byte a row per block) and IQ4_XS's regrouped as Q4_KX16 (its 8-row kernel
    reading loads instead of transposes), give the bits of the file's rows at every batch size, at this level and at
    the scalar one."""
    rng = np.random.default_rng(700 + t)
    K, N = 512, 48
    raw = rows(rng, t, N, K)
    x = rng.standard_normal((17, K)).astype(np.float32)
    out = {}
    for lv in ("scalar", level):
        at_level(lv)
        wt = tensor(raw, t, K, N)
        nbytes = lib.pi_repack_bytes(wt)
        assert nbytes == raw.size
        buf = np.zeros(nbytes, np.uint8)
        rt = ffi.new("pi_tensor *")
        check(lib.pi_repack(wt, ffi.cast("void *", buf.ctypes.data), nbytes, rt))
        assert ffi.string(lib.pi_type_name(rt.type)).decode() == COPY[t]
        out[lv] = [(mul_mat(wt, x[:T], N, pool2), mul_mat(rt, x[:T], N, pool2)) for T in (1, 3, 8, 9, 17)]
    for (a, b), (c, d) in zip(out["scalar"], out[level]):
        assert_bit_equal(b, a, f"{NAME[t]} copy vs rows (scalar)")
        assert_bit_equal(c, a, f"{NAME[t]} rows {level} vs scalar")
        assert_bit_equal(d, a, f"{NAME[t]} copy {level} vs scalar")
