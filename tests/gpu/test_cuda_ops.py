"""Every GPU op (powerinfer_cuda.h) against its CPU twin (powerinfer.h) on the same inputs.

Skipped without a device or with a library built without -DPI_CUDA=ON (see conftest.py).
Each comparison uses a named tolerance on max |gpu - cpu| / max |cpu|; where the two sides run
the same float operations in the same order the tolerance is 0 (bit-identical).
"""
from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import (BF16, F16, F32, NAMES, Q4_0, Q4_K, Q8_0, WEIGHT_TYPES, check, cpu, cpu_ffi, decode,
                         encode, ffn_weights, gpu_api, rel_err, tensor)

# ---- named tolerances --------------------------------------------------------------------------
TOL_EXACT = 0.0          # get_rows, binary ops, relu: the same single f32 operation per element
TOL_ELEMENTWISE = 1e-6   # silu / gelu: the device's expf / tanhf against libm (a few ulp)
TOL_NORM = 2e-6          # rms_norm: a float tree sum on the device, a double sum on the CPU
TOL_ROPE = 2e-6          # angles in double on both sides, the rotation in f32
TOL_SOFTMAX = 2e-6       # device expf, float sums in another order
TOL_DOT = 3e-5           # f32/f16/bf16 dot products of up to a few thousand terms, another summation order
TOL_QDOT = 3e-5          # q8_0/q4_0: identical q8_0 activations and integer block dots; block sums reordered
TOL_ATTENTION = 3e-5     # scores, softmax and the weighted sum of V, each reordered
TOL_FFN = 1e-4           # two dots, the activation, then an axpy over hundreds of neurons (float sums reordered)

gffi, glib = gpu_api()
RNG = np.random.default_rng(1234)


def dot_tol(t):
    return TOL_QDOT if t in (Q4_0, Q8_0) else TOL_DOT


def cpu_call(fn, *args):
    check(cpu_ffi, cpu, fn(cpu_ffi.NULL, *args), fn.__name__ if hasattr(fn, "__name__") else "cpu op")


def gpu_call(fn, *args):
    check(gffi, glib, fn(*args), "gpu op")


def T(ffi, arr, t=None):
    return tensor(ffi, arr, t)


# ---- device ------------------------------------------------------------------------------------

def test_device_info():
    p = gffi.new("pi_cuda_device_props *")
    gpu_call(glib.pi_cuda_device_info, 0, p)
    assert gffi.string(p.name) and p.total_bytes > 0 and 0 < p.free_bytes <= p.total_bytes and p.n_sm > 0
    free, total = gffi.new("int64_t *"), gffi.new("int64_t *")
    gpu_call(glib.pi_cuda_mem_get_info, free, total)
    assert total[0] == p.total_bytes
    assert glib.pi_cuda_device_info(glib.pi_cuda_available(), p) == cpu.PI_ERR_INVALID_ARG


# ---- dense ops ---------------------------------------------------------------------------------

@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=NAMES.get)
def test_get_rows(t):
    table = encode(RNG.standard_normal((50, 96), dtype=np.float32), t)
    ids = np.array([3, 0, 49, 3, 17], np.int32)
    ref = np.zeros((5, 96), np.float32)
    out = np.full((5, 96), np.nan, np.float32)
    idc, idg = cpu_ffi.cast("int32_t *", ids.ctypes.data), gffi.cast("int32_t *", ids.ctypes.data)
    cpu_call(cpu.pi_op_get_rows, T(cpu_ffi, table, t), idc, 5, T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_get_rows, T(gffi, table, t), idg, 5, T(gffi, out))
    assert rel_err(out, ref) <= TOL_EXACT


@pytest.mark.parametrize("t", [F32, F16, BF16], ids=NAMES.get)
def test_set_rows_stores_kv_cells_like_the_cpu(t):
    src = RNG.standard_normal((4, 256), dtype=np.float32) * 100
    src[0, :3] = [np.inf, -np.inf, 65519.0]                # overflow and rounding edges of f16
    rows = np.array([7, 0, 31, 8], np.int32)
    dst = encode(RNG.standard_normal((32, 256), dtype=np.float32), t)
    ref = dst.copy()
    for i, r in enumerate(rows):                          # the CPU's conversion, row by row
        check(cpu_ffi, cpu, cpu.pi_quantize_row(t, cpu_ffi.cast("float *", src[i].ctypes.data),
                                                cpu_ffi.cast("void *", ref[r].ctypes.data), 256))
    gpu_call(glib.pi_cuda_op_set_rows, T(gffi, dst, t), T(gffi, src), gffi.cast("int32_t *", rows.ctypes.data))
    assert np.array_equal(dst.view(np.uint8), ref.view(np.uint8))


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=NAMES.get)
@pytest.mark.parametrize("K,N,n_tok", [(512, 301, 1), (512, 64, 5), (2048, 130, 17), (96, 33, 3)])
def test_mul_mat(t, K, N, n_tok):
    if t in (Q4_0, Q8_0) and K % 32:
        pytest.skip("quant rows are whole blocks")
    w = encode(RNG.standard_normal((N, K), dtype=np.float32), t)
    x = RNG.standard_normal((n_tok, K), dtype=np.float32)
    ref, out = np.zeros((n_tok, N), np.float32), np.zeros((n_tok, N), np.float32)
    cpu_call(cpu.pi_op_mul_mat, T(cpu_ffi, w, t), T(cpu_ffi, x), T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_mul_mat, T(gffi, w, t), T(gffi, x), T(gffi, out))
    assert rel_err(out, ref) < dot_tol(t)


@pytest.mark.parametrize("t", [F16, Q4_0])
def test_mul_mat_odd_and_strided(t):
    """A strided activation view (every other row) and K not a multiple of 8 (the scalar float path)."""
    K = 64 if t == Q4_0 else 100
    w = encode(RNG.standard_normal((40, K), dtype=np.float32), t)
    xs = RNG.standard_normal((6, K), dtype=np.float32)[::2]
    ref, out = np.zeros((3, 40), np.float32), np.zeros((3, 40), np.float32)
    cpu_call(cpu.pi_op_mul_mat, T(cpu_ffi, w, t), T(cpu_ffi, xs), T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_mul_mat, T(gffi, w, t), T(gffi, xs), T(gffi, out))
    assert rel_err(out, ref) < dot_tol(t)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(with_weight):
    x = RNG.standard_normal((2, 7, 4096), dtype=np.float32)
    w = RNG.standard_normal(4096, dtype=np.float32)
    ref, out = np.zeros_like(x), np.zeros_like(x)
    wc = T(cpu_ffi, w) if with_weight else cpu_ffi.NULL
    wg = T(gffi, w) if with_weight else gffi.NULL
    cpu_call(cpu.pi_op_rms_norm, T(cpu_ffi, x), wc, np.float32(1e-5), T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_rms_norm, T(gffi, x), wg, np.float32(1e-5), T(gffi, out))
    assert rel_err(out, ref) < TOL_NORM


@pytest.mark.parametrize("mode", [0, 2], ids=["normal", "neox"])
@pytest.mark.parametrize("n_rot", [128, 64])
def test_rope(mode, n_rot):
    x = RNG.standard_normal((9, 8, 128), dtype=np.float32)       # [head_dim, n_head, T]
    pos = np.array([0, 1, 2, 100, 511, 4000, 7, 8, 32767], np.int32)
    ref, out = np.zeros_like(x), np.zeros_like(x)
    cpu_call(cpu.pi_op_rope, T(cpu_ffi, x), cpu_ffi.cast("int32_t *", pos.ctypes.data), n_rot, mode,
             np.float32(10000.0), np.float32(0.5), T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_rope, T(gffi, x), gffi.cast("int32_t *", pos.ctypes.data), n_rot, mode,
             np.float32(10000.0), np.float32(0.5), T(gffi, out))
    assert rel_err(out, ref) < TOL_ROPE


def test_softmax():
    x = RNG.standard_normal((6, 1000), dtype=np.float32) * 10
    x[2, :] = -np.inf                     # a fully masked row: zeros
    x[3, ::3] = -np.inf
    ref, out = np.zeros_like(x), np.full_like(x, np.nan)
    cpu_call(cpu.pi_op_softmax, T(cpu_ffi, x), T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_softmax, T(gffi, x), T(gffi, out))
    assert rel_err(out, ref) < TOL_SOFTMAX and not out[2].any()


@pytest.mark.parametrize("op,tol", [(0, TOL_ELEMENTWISE), (1, TOL_EXACT), (2, TOL_ELEMENTWISE)],
                         ids=["silu", "relu", "gelu"])
def test_unary(op, tol):
    x = RNG.standard_normal((3, 5, 333), dtype=np.float32) * 4
    ref, out = np.zeros_like(x), np.zeros_like(x)
    check(cpu_ffi, cpu, cpu.pi_op_unary(cpu_ffi.NULL, op, T(cpu_ffi, x), T(cpu_ffi, ref)))
    gpu_call(glib.pi_cuda_op_unary, op, T(gffi, x), T(gffi, out))
    assert rel_err(out, ref) <= tol


@pytest.mark.parametrize("op", [0, 1], ids=["add", "mul"])
@pytest.mark.parametrize("bshape", [(4, 6, 70), (1, 6, 70), (4, 1, 1), (1, 1, 70)])
def test_binary(op, bshape):
    a = RNG.standard_normal((4, 6, 70), dtype=np.float32)
    b = RNG.standard_normal(bshape, dtype=np.float32)
    ref, out = np.zeros_like(a), np.zeros_like(a)
    bc, bg = T(cpu_ffi, b), T(gffi, b)
    bc.n_dims = bg.n_dims = 3
    check(cpu_ffi, cpu, cpu.pi_op_binary(cpu_ffi.NULL, op, T(cpu_ffi, a), bc, T(cpu_ffi, ref)))
    gpu_call(glib.pi_cuda_op_binary, op, T(gffi, a), bg, T(gffi, out))
    assert rel_err(out, ref) <= TOL_EXACT


@pytest.mark.parametrize("kv", [F16, F32], ids=["kv_f16", "kv_f32"])
@pytest.mark.parametrize("n_tok,n_kv,H,Hkv", [(1, 300, 8, 2), (7, 64, 4, 4), (3, 1500, 32, 8)])
def test_attention(kv, n_tok, n_kv, H, Hkv):
    hd = 64
    q = RNG.standard_normal((n_tok, H, hd), dtype=np.float32)
    kf = RNG.standard_normal((n_kv, Hkv, hd), dtype=np.float32)
    vf = RNG.standard_normal((n_kv, Hkv, hd), dtype=np.float32)
    k, v = (kf.astype(np.float16).view(np.uint16), vf.astype(np.float16).view(np.uint16)) if kv == F16 else (kf, vf)
    mask = np.zeros((n_tok, n_kv), np.float32)
    for t in range(n_tok):
        mask[t, n_kv - n_tok + t + 1:] = -np.inf        # causal over the last n_tok cells
        mask[t, t::5] = -np.inf
    if n_tok > 1:
        mask[1, :] = -np.inf                            # a token that sees nothing: zeros
    ref, out = np.zeros_like(q), np.full_like(q, np.nan)
    scale = np.float32(1 / np.sqrt(hd))
    cpu_call(cpu.pi_op_attention, T(cpu_ffi, q), T(cpu_ffi, k, kv), T(cpu_ffi, v, kv), T(cpu_ffi, mask), scale,
             T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_attention, T(gffi, q), T(gffi, k, kv), T(gffi, v, kv), T(gffi, mask), scale,
             T(gffi, out))
    assert rel_err(out, ref) < TOL_ATTENTION
    if n_tok > 1:
        assert not out[1].any()


@pytest.mark.parametrize("kv", [F16, F32], ids=["kv_f16", "kv_f32"])
@pytest.mark.parametrize("n_tok", [1, 7])
def test_attention_softcap(kv, n_tok):
    """Gemma 2's soft-capped scores (cap 5: most scores of a scale of 1 are capped): the device's tanhf against the
    CPU's exp-based tanh."""
    hd, H, Hkv, n_kv = 64, 4, 2, 200
    q = RNG.standard_normal((n_tok, H, hd), dtype=np.float32)
    kf = RNG.standard_normal((n_kv, Hkv, hd), dtype=np.float32)
    vf = RNG.standard_normal((n_kv, Hkv, hd), dtype=np.float32)
    k, v = (kf.astype(np.float16).view(np.uint16), vf.astype(np.float16).view(np.uint16)) if kv == F16 else (kf, vf)
    mask = np.zeros((n_tok, n_kv), np.float32)
    for t in range(n_tok):
        mask[t, n_kv - n_tok + t + 1:] = -np.inf
    ref, plain, out = np.zeros_like(q), np.zeros_like(q), np.full_like(q, np.nan)
    args = (T(cpu_ffi, q), T(cpu_ffi, k, kv), T(cpu_ffi, v, kv), T(cpu_ffi, mask), np.float32(1.0))
    cpu_call(cpu.pi_op_attention_softcap, *args, np.float32(5.0), T(cpu_ffi, ref))
    cpu_call(cpu.pi_op_attention, *args, T(cpu_ffi, plain))
    gpu_call(glib.pi_cuda_op_attention_softcap, T(gffi, q), T(gffi, k, kv), T(gffi, v, kv), T(gffi, mask),
             np.float32(1.0), np.float32(5.0), T(gffi, out))
    assert rel_err(out, ref) < TOL_ATTENTION
    assert rel_err(plain, ref) > 100 * TOL_ATTENTION     # the cap did something


@pytest.mark.parametrize("kv", [F16, F32], ids=["kv_f16", "kv_f32"])
@pytest.mark.parametrize("n_tok", [1, 7])
def test_attention_sinks(kv, n_tok):
    """gpt-oss's attention sinks (a logit per head joining the softmax without a value; one of 8, far above the
    scores, takes nearly all of the mass): the device's against the CPU's."""
    hd, H, Hkv, n_kv = 64, 4, 2, 200
    q = RNG.standard_normal((n_tok, H, hd), dtype=np.float32)
    kf = RNG.standard_normal((n_kv, Hkv, hd), dtype=np.float32)
    vf = RNG.standard_normal((n_kv, Hkv, hd), dtype=np.float32)
    k, v = (kf.astype(np.float16).view(np.uint16), vf.astype(np.float16).view(np.uint16)) if kv == F16 else (kf, vf)
    mask = np.zeros((n_tok, n_kv), np.float32)
    for t in range(n_tok):
        mask[t, n_kv - n_tok + t + 1:] = -np.inf
    sinks = np.array([1.0, -2.0, 3.0, 8.0], np.float32)
    ref, plain, out = np.zeros_like(q), np.zeros_like(q), np.full_like(q, np.nan)
    args = (T(cpu_ffi, q), T(cpu_ffi, k, kv), T(cpu_ffi, v, kv), T(cpu_ffi, mask), np.float32(0.125), np.float32(0.0))
    cpu_call(cpu.pi_op_attention_sinks, *args, T(cpu_ffi, sinks), T(cpu_ffi, ref))
    cpu_call(cpu.pi_op_attention_softcap, *args, T(cpu_ffi, plain))
    gpu_call(glib.pi_cuda_op_attention_sinks, T(gffi, q), T(gffi, k, kv), T(gffi, v, kv), T(gffi, mask),
             np.float32(0.125), np.float32(0.0), T(gffi, sinks), T(gffi, out))
    assert rel_err(out, ref) < TOL_ATTENTION
    assert rel_err(plain, ref) > 100 * TOL_ATTENTION     # the sinks did something


@pytest.mark.parametrize("t", [F16, Q8_0, F32], ids=NAMES.get)
def test_predictor(t):
    E, r, F, n_tok = 256, 64, 700, 4
    fc1 = encode(RNG.standard_normal((r, E), dtype=np.float32) / 16, t)
    fc2 = encode(RNG.standard_normal((F, r), dtype=np.float32) / 8, t)
    x = RNG.standard_normal((n_tok, E), dtype=np.float32)
    ref, out = np.zeros((n_tok, F), np.float32), np.zeros((n_tok, F), np.float32)
    cpu_call(cpu.pi_op_predictor, T(cpu_ffi, fc1, t), T(cpu_ffi, fc2, t), T(cpu_ffi, x), T(cpu_ffi, ref))
    gpu_call(glib.pi_cuda_op_predictor, T(gffi, fc1, t), T(gffi, fc2, t), T(gffi, x), T(gffi, out))
    assert rel_err(out, ref) < dot_tol(t)


# ---- sparse FFN ----------------------------------------------------------------------------------

def ffn_case(t, mode, E=256, F=640, n_tok=3, density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    gate = encode(rng.standard_normal((F, E), dtype=np.float32) / 16, t) if mode != 2 else None
    up = encode(rng.standard_normal((F, E), dtype=np.float32) / 16, t)
    down_t = encode(rng.standard_normal((F, E), dtype=np.float32) / 16, t)
    x = rng.standard_normal((n_tok, E), dtype=np.float32)
    scores = (rng.random((n_tok, F), dtype=np.float32) - (1 - density)).astype(np.float32)
    return gate, up, down_t, x, scores


def cpu_ffn(t, mode, act, gate, up, down_t, x, scores, thr=0.0):
    out = np.zeros_like(x)
    n = cpu_ffi.new("int64_t *")
    cpu_call(cpu.pi_op_sparse_ffn, ffn_weights(cpu_ffi, gate, up, down_t, t), act, mode, T(cpu_ffi, x),
             T(cpu_ffi, scores), np.float32(thr), T(cpu_ffi, out), n)
    return out, n[0]


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=NAMES.get)
@pytest.mark.parametrize("mode,act", [(0, 1), (1, 1), (2, 1), (0, 0), (0, 2)],
                         ids=["par-relu", "sym-relu", "seq-relu", "par-silu", "par-gelu"])
@pytest.mark.parametrize("n_tok", [1, 9])
def test_sparse_ffn_whole_layer(t, mode, act, n_tok):
    gate, up, down_t, x, scores = ffn_case(t, mode, n_tok=n_tok, seed=n_tok)
    ref, n_ref = cpu_ffn(t, mode, act, gate, up, down_t, x, scores)
    out, n = np.zeros_like(x), gffi.new("int64_t *")
    gpu_call(glib.pi_cuda_op_sparse_ffn, ffn_weights(gffi, gate, up, down_t, t), act, mode, T(gffi, x),
             T(gffi, scores), np.float32(0.0), T(gffi, out), n)
    assert n[0] == n_ref
    assert rel_err(out, ref) < TOL_FFN


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=NAMES.get)
@pytest.mark.parametrize("hot_fraction", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("n_tok", [1, 4, 33])
def test_hybrid_split_sums_to_the_whole_ffn(t, hot_fraction, n_tok):
    """GPU over the hot rows + CPU over the others (their scores set to -inf, so the CPU skips them)
    == the CPU over every row: the hybrid layer's arithmetic, op by op."""
    mode, act = 0, 1
    gate, up, down_t, x, scores = ffn_case(t, mode, n_tok=n_tok, seed=7 + n_tok)
    F = up.shape[0]
    rng = np.random.default_rng(int(hot_fraction * 100) + n_tok)
    k = int(hot_fraction * F)
    hot = np.sort(rng.choice(F, k, replace=False)).astype(np.int32)
    full, n_full = cpu_ffn(t, mode, act, gate, up, down_t, x, scores)
    cold_scores = scores.copy()
    cold_scores[:, hot] = -np.inf
    cold, n_cold = cpu_ffn(t, mode, act, gate, up, down_t, x, cold_scores)
    gpu_part, n_hot = np.zeros_like(x), gffi.new("int64_t *")
    if k:
        hot_rows = [np.ascontiguousarray(m[hot]) for m in (gate, up, down_t)]   # kept alive: the views point into them
        w_hot = ffn_weights(gffi, *hot_rows, t)
        gpu_call(glib.pi_cuda_op_sparse_ffn_hot, w_hot, gffi.cast("int32_t *", hot.ctypes.data), F, act, mode,
                 T(gffi, x), T(gffi, scores), np.float32(0.0), T(gffi, gpu_part), n_hot)
    assert n_cold + (n_hot[0] if k else 0) == n_full
    assert rel_err(cold + gpu_part, full) < TOL_FFN


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n_tok", [1, 6])
def test_mul_mat_sparse_gathers_hot_rows(t, n_tok):
    K, N = 256, 500
    w = encode(RNG.standard_normal((N, K), dtype=np.float32), t)
    x = RNG.standard_normal((n_tok, K), dtype=np.float32)
    scores = RNG.standard_normal((n_tok, N), dtype=np.float32)
    hot = np.sort(RNG.choice(N, 123, replace=False)).astype(np.int32)
    dense = np.zeros((n_tok, N), np.float32)
    cpu_call(cpu.pi_op_mul_mat, T(cpu_ffi, w, t), T(cpu_ffi, x), T(cpu_ffi, dense))
    sentinel = np.float32(-12345.5)
    y = np.full((n_tok, N), sentinel, np.float32)
    w_hot = np.ascontiguousarray(w[hot])
    gpu_call(glib.pi_cuda_op_mul_mat_sparse, T(gffi, w_hot, t), gffi.cast("int32_t *", hot.ctypes.data),
             T(gffi, x), T(gffi, scores), np.float32(0.25), T(gffi, y))
    cold = np.setdiff1d(np.arange(N), hot)
    assert (y[:, cold] == sentinel).all()                     # rows outside the bucket untouched
    active = scores[:, hot] >= 0.25
    assert (y[:, hot][~active] == 0).all()
    assert rel_err(np.where(active, y[:, hot], 0), np.where(active, dense[:, hot], 0)) < dot_tol(t)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n_tok", [1, 12])
def test_axpy_sparse(t, n_tok):
    E, N = 384, 900
    hot = np.sort(RNG.choice(N, 400, replace=False)).astype(np.int32)
    down_hot = encode(RNG.standard_normal((len(hot), E), dtype=np.float32), t)
    h = (RNG.standard_normal((n_tok, N), dtype=np.float32) * (RNG.random((n_tok, N)) < 0.5)).astype(np.float32)
    scores = RNG.standard_normal((n_tok, N), dtype=np.float32)
    out = np.full((n_tok, E), np.nan, np.float32)
    gpu_call(glib.pi_cuda_op_axpy_sparse, T(gffi, down_hot, t), gffi.cast("int32_t *", hot.ctypes.data),
             T(gffi, h), T(gffi, scores), np.float32(0.0), T(gffi, out))
    coef = np.where(scores[:, hot] >= 0, h[:, hot], 0).astype(np.float64)
    ref = coef @ decode(down_hot, t).astype(np.float64)
    assert rel_err(out, ref) < dot_tol(t)


# ---- errors come back as statuses ---------------------------------------------------------------

def test_errors_are_statuses_not_crashes():
    x = np.zeros((2, 64), np.float32)
    y = np.zeros((2, 10), np.float32)
    assert glib.pi_cuda_op_mul_mat(gffi.NULL, T(gffi, x), T(gffi, y)) == cpu.PI_ERR_INVALID_ARG
    w = encode(np.zeros((10, 32), np.float32), F16)
    assert glib.pi_cuda_op_mul_mat(T(gffi, w, F16), T(gffi, x), T(gffi, y)) == cpu.PI_ERR_INVALID_ARG
    assert "do not fit" in gffi.string(glib.pi_last_error()).decode()
    up = encode(np.zeros((8, 64), np.float32), F16)
    bad = np.array([3, 1, 2, 5, 6, 7, 0, 4], np.int32)         # not ascending
    out = np.zeros((2, 64), np.float32)
    sc = np.zeros((2, 16), np.float32)
    st = glib.pi_cuda_op_sparse_ffn_hot(ffn_weights(gffi, up, up, up, F16), gffi.cast("int32_t *", bad.ctypes.data),
                                        16, 1, 0, T(gffi, x), T(gffi, sc), 0.0, T(gffi, out), gffi.NULL)
    assert st == cpu.PI_ERR_INVALID_ARG and "ascending" in gffi.string(glib.pi_last_error()).decode()
    r = gffi.new("pi_cuda_bench_result *")
    assert glib.pi_cuda_bench(99, F16, 256, 256, 1, 1.0, 1.0, 1, r) == cpu.PI_ERR_INVALID_ARG


def test_unsupported_type_is_reported():
    kq = np.zeros((10, 144), np.uint8)
    x = np.zeros((2, 256), np.float32)
    y = np.zeros((2, 10), np.float32)
    assert glib.pi_cuda_op_mul_mat(T(gffi, kq, Q4_K), T(gffi, x), T(gffi, y)) == cpu.PI_ERR_UNSUPPORTED
    assert "q4_K" in gffi.string(glib.pi_last_error()).decode()


# ---- device memory --------------------------------------------------------------------------------

def test_device_memory_is_released_and_counted():
    before = glib.pi_cuda_allocated_bytes()
    glib.pi_cuda_reset_peak()
    gate, up, down_t, x, scores = ffn_case(F16, 0, E=512, F=1024, n_tok=8)
    out = np.zeros_like(x)
    gpu_call(glib.pi_cuda_op_sparse_ffn, ffn_weights(gffi, gate, up, down_t, F16), 1, 0, T(gffi, x),
             T(gffi, scores), np.float32(0.0), T(gffi, out), gffi.NULL)
    assert glib.pi_cuda_allocated_bytes() == before
    weights = 3 * gate.nbytes
    assert weights <= glib.pi_cuda_peak_allocated_bytes() - before < weights + (8 << 20)


def test_bench_runs():
    r = gffi.new("pi_cuda_bench_result *")
    for op in (0, 1, 2):
        gpu_call(glib.pi_cuda_bench, op, F16, 1024, 2048, 2, 0.5, 0.2, 3, r)
        assert r.ms_per_iter > 0 and r.bytes_per_iter > 0
    for t in (Q4_0, Q8_0, BF16, F32):
        gpu_call(glib.pi_cuda_bench, 0, t, 512, 1024, 1, 1.0, 1.0, 2, r)
