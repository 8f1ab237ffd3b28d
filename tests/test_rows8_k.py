"""8-row matmul kernels of Q5_0, Q4_1, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (core/src/arch/rows8_k.c).

mul_mat runs 8 rows x up to 8 tokens per call (blocks of 4 inside the kernels) through the type's vec_dot8 and the
leftover rows through the single-row vec_dot; decode (T = 1), prompts, thread counts and the sparse FFN mix
them. Every kernel of a type follows one canonical order (exact integers per block, then fixed
float steps), so for every (row, token):
  - the 8-row result equals the one-row-at-a-time result, bit for bit;
  - several tokens per call equal one token per call, bit for bit;
  - the native (AVX2) build equals the portable scalar build (-DPI_NATIVE=OFF), bit for bit;
and all are within the float64 tolerance of test_kquants (exact dot of the dequantized operands).
The scalar build runs this file too (POWERINFER_LIB_PATH=.../build-scalar/libpowerinfer.so): there
the kernels are all the single-row ones.

Run: PYTHONPATH=bindings python -m pytest tests/test_rows8_k.py -q
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import powerinfer as pi  # noqa: E402
from powerinfer._ffi import check, ffi, lib  # noqa: E402
from test_kquants import (BLOCK, BLOCK_ULPS, DOT_LAMBDA, NAME, Q2_K, Q3_K, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K,  # noqa: E402
                          Q8_0, Q8_1, Q8_K, Q8_KM, U32, bits_equal, c_mul_mat, c_quantize, np_dequant, np_dequant_act,
                          np_quantize_q8_0, np_quantize_q8_1, np_quantize_q8_K, np_quantize_q8_Km, random_blocks)
from test_ops import np_bf16_bits  # noqa: E402

TYPES = [Q5_0, Q4_1, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K]
TNAME = {**NAME, Q8_0: "q8_0"}
ACT = {Q5_0: (np_quantize_q8_0, Q8_0), Q8_0: (np_quantize_q8_0, Q8_0), Q4_K: (np_quantize_q8_Km, Q8_KM),
       Q2_K: (np_quantize_q8_K, Q8_K), Q3_K: (np_quantize_q8_K, Q8_K), Q5_K: (np_quantize_q8_Km, Q8_KM),
       Q6_K: (np_quantize_q8_K, Q8_K), Q4_1: (np_quantize_q8_1, Q8_1), Q5_1: (np_quantize_q8_1, Q8_1)}

# scalar_lib: the session fixture of conftest.py (the -DPI_NATIVE=OFF library, built once per run)



def weights(t, K, N, seed, kind):
    """N rows of K weights of type t: quantized normal rows, or arbitrary block bytes."""
    rng = np.random.default_rng(seed)
    if kind == "quantized":
        return c_quantize(t, (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32))
    nb = N * K // BLOCK[t][0]
    if t == Q8_0:   # every int8 (-128 too) and signed scales
        b = rng.integers(0, 256, size=(nb, 34), dtype=np.uint8)
        d = rng.uniform(1e-3, 1.0, nb) * rng.choice([-1, 1], nb)
        b[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
        return b.reshape(-1)
    return random_blocks(rng, t, nb)


def activations(K, T, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x *= np.repeat(10.0 ** rng.uniform(-2, 2, (T, K // 32)), 32, axis=1).astype(np.float32)   # blocks of any scale
    if T > 1:
        x[1, 32:64] = 0.0   # an all-zero activation block (d = 0)
    return x


def dequant_w(t, raw, K):
    if t == Q8_0:
        return np_dequant_act(raw, Q8_0).reshape(-1, K)
    return np_dequant(raw, t).reshape(-1, K).astype(np.float64)


def reference(t, raw, x):
    """float64 dot of the dequantized weights and quantized activations (T, N), and its tolerance:
    test_kquants' bound (BLOCK_ULPS + DOT_LAMBDA sqrt(nb + 2)) U32 of the summed |block dots|; the min parts
    (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) are added as a term of their own magnitude."""
    K = x.shape[1]
    bs = BLOCK[t][0]
    nb = K // bs
    quant, at = ACT[t]
    xq = np.stack([np_dequant_act(quant(row), at) for row in x]).astype(np.float64)
    if t in (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K):
        w, sp, mp = np_dequant(raw, t, with_parts=True)
        parts = [sp.reshape(-1, K), mp.reshape(-1, K)]
        w = w.reshape(-1, K).astype(np.float64)
    else:
        w = dequant_w(t, raw, K)
        parts = [w]
    ref = xq @ w.T
    xb = xq.reshape(xq.shape[0], 1, nb, bs)
    mag = sum(np.abs((xb * p.astype(np.float64).reshape(1, -1, nb, bs)).sum(-1)).sum(-1) for p in parts)
    return ref, (BLOCK_ULPS + DOT_LAMBDA * math.sqrt(nb + 2)) * U32 * mag


def mul_mat(t, raw, x, K, L=lib, pool=ffi.NULL):
    return c_mul_mat(t, raw, x, L=L, pool=pool)


@pytest.mark.parametrize("t", TYPES, ids=TNAME.get)
@pytest.mark.parametrize("kind", ["quantized", "random"])
@pytest.mark.parametrize("N", [8, 16, 21, 7])
def test_rows8_agree(pool2, t, kind, N):
    K = 512 if BLOCK[t][0] == 256 else 640   # several blocks: the accumulation order matters
    raw = weights(t, K, N, seed=100 * t + N, kind=kind)
    rb = raw.size // N
    for T in (1, 3, 4, 5, 9):
        x = activations(K, T, seed=T + N)
        y = mul_mat(t, raw, x, K, pool=pool2)                    # 8-row kernel (+ single rows for the rest)
        one_by_one = np.concatenate([mul_mat(t, raw[i * rb:(i + 1) * rb], x, K) for i in range(N)], axis=1)
        assert bits_equal(y, one_by_one), f"{TNAME[t]} N={N} T={T}: 8-row kernel vs one row at a time"
        per_token = np.concatenate([mul_mat(t, raw, x[s:s + 1], K, pool=pool2) for s in range(T)])
        assert bits_equal(y, per_token), f"{TNAME[t]} N={N} T={T}: several tokens per call vs one"
        ref, tol = reference(t, raw, x)
        err = np.abs(y - ref)
        assert np.all(err <= tol), (TNAME[t], N, T, float((err / tol).max()))


@pytest.mark.parametrize("t", TYPES, ids=TNAME.get)
def test_rows8_thread_counts_and_scalar_build(scalar_lib, t):
    """Thread counts (which move row chunks between threads) and the scalar build give the same bits."""
    K = 1024 if BLOCK[t][0] == 256 else 640
    N, T = 45, 6
    for kind in ("quantized", "random"):
        raw = weights(t, K, N, seed=7 + t, kind=kind)
        x = activations(K, T, seed=11)
        outs = []
        for n in (1, 2, 3):
            p = ffi.new("pi_threadpool **")
            check(lib.pi_threadpool_create(n, p))
            outs.append(mul_mat(t, raw, x, K, pool=p[0]))
            lib.pi_threadpool_free(p[0])
        assert bits_equal(outs[0], outs[1]) and bits_equal(outs[0], outs[2]), TNAME[t]
        assert bits_equal(outs[0], mul_mat(t, raw, x, K, L=scalar_lib)), f"{TNAME[t]} {kind}: native vs scalar build"


@pytest.mark.parametrize("t", TYPES, ids=TNAME.get)
def test_rows8_apart_one_token(pool2, t):
    """One token over rows that do not follow each other in memory (the sparse FFN's gathered rows: here a matrix
    view with a row stride of two rows) goes through the 8-row kernel side by side, consecutive rows through the
    single-row kernel one by one: the same bits either way, every level's the scalar level's."""
    from test_kquants import tensor
    K = 512 if BLOCK[t][0] == 256 else 640
    N = 21
    raw = weights(t, K, 2 * N, seed=3 * t, kind="random")
    rb = raw.size // (2 * N)
    rows = raw.reshape(2 * N, rb)
    every_other = np.ascontiguousarray(rows[::2]).reshape(-1)   # the same N rows, consecutive
    x = activations(K, 1, seed=t)
    want = mul_mat(t, every_other, x, K, pool=pool2)

    def strided():
        y = np.zeros((1, N), np.float32)
        w = tensor(raw, t, K, N)
        w.nb[1] = 2 * rb
        check(lib.pi_op_mul_mat(pool2, w, tensor(x, 0, K, 1), tensor(y, 0, N, 1)))
        return y
    before = pi.cpu_isa()
    try:
        for level in [lv for lv in pi.CPU_ISA_LEVELS if pi.cpu_isa_supported(lv)]:
            pi.set_cpu_isa(level)
            assert bits_equal(strided(), want), f"{TNAME[t]} at {level}: rows apart vs consecutive"
    finally:
        pi.set_cpu_isa(before)


def test_every_leftover_row_count():
    """N = 8 + 1 .. 8 + 7: the rows after the last group of 8 go through the single-row kernel."""
    for t in TYPES:
        K = BLOCK[t][0] * 2
        for N in range(9, 16):
            raw = weights(t, K, N, seed=N, kind="quantized")
            x = activations(K, 2, seed=N)
            y = mul_mat(t, raw, x, K)
            ref, tol = reference(t, raw, x)
            assert np.all(np.abs(y - ref) <= tol), (TNAME[t], N)


F16, BF16 = 1, 30
HALF_REL_TOL = 1e-5   # float32 dot products of 16-bit float weights vs float64 (relative to sum |w x|)


def half_rows(t, rng, N, K):
    """N rows of K random weights as type t (f16 or bf16): (raw uint16 [N, K], their float64 values)."""
    w = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    if t == F16:
        raw = w.astype(np.float16).view(np.uint16)
        return raw, raw.view(np.float16).astype(np.float64)
    raw = (w.view(np.uint32) >> 16).astype(np.uint16)                       # bf16: the top half of the float
    return raw, (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def half_mul_mat(t, raw, x, L=lib, pool=ffi.NULL):
    """y (T, N) = x (T, K) . W^T for f16/bf16 rows W given as raw uint16 (N, K)."""
    N, K = raw.shape
    x = np.ascontiguousarray(x, np.float32)
    y = np.zeros((x.shape[0], N), np.float32)
    from test_kquants import tensor
    buf = np.ascontiguousarray(raw)
    wt = tensor(buf, t, K, N)
    wt.nb[0], wt.nb[1] = 2, 2 * K
    wt.nb[2] = wt.nb[3] = 2 * K * N
    check(L.pi_op_mul_mat(pool, wt, tensor(x, 0, K, x.shape[0]), tensor(y, 0, N, x.shape[0])))
    return y


@pytest.mark.parametrize("t", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("K", [640, 100, 7])
def test_half_float_rows8_agree(pool2, t, K):
    """f16 and bf16 weights: 8 rows x up to 8 tokens (blocks of rows x tokens in registers) give, per (row,
    token), the bits of the single-row kernel (own 8-lane accumulator, same order, same tail), whatever the
    token count (short blocks repeat their last token), the leftover rows and the thread count; and
    float64 within HALF_REL_TOL (over the activations the kernels multiply: bf16 weights' are rounded to bf16 where
    pi.bf16_dot())."""
    rng = np.random.default_rng(K + t)
    for N in (8, 21, 5):
        raw, w = half_rows(t, rng, N, K)
        for T in (1, 2, 3, 5, 8, 9):
            x = rng.standard_normal((T, K)).astype(np.float32)
            y = half_mul_mat(t, raw, x, pool=pool2)
            one_by_one = np.concatenate([half_mul_mat(t, raw[i:i + 1], x) for i in range(N)], axis=1)
            assert bits_equal(y, one_by_one), f"N={N} T={T}: 8-row kernel vs one row at a time"
            per_token = np.concatenate([half_mul_mat(t, raw, x[s:s + 1]) for s in range(T)])
            assert bits_equal(y, per_token), f"N={N} T={T}: several tokens per call vs one"
            xm = (np_bf16_bits(x).astype(np.uint32) << 16).view(np.float32) if t == BF16 and pi.bf16_dot() else x
            ref = xm.astype(np.float64) @ w.T
            mag = np.abs(xm.astype(np.float64)) @ np.abs(w).T
            assert np.all(np.abs(y - ref) <= HALF_REL_TOL * mag), (N, T)
