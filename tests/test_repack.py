"""Q4_0 matmul kernels and weight repacking (core/src/arch/rows8.c, core/src/repack.c).

mul_mat has three Q4_0 kernels: one row at a time (the reference order), eight rows at any
addresses, and eight interleaved rows of a repacked copy, each for up to 8 tokens per call.
They must give the same bits for every (row, token), so decode, prompt processing, the sparse
gather and a repacked model all agree; against float64 they are checked in test_ops.test_mul_mat.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import powerinfer as pi  # noqa: E402
from powerinfer._ffi import check, ffi, lib  # noqa: E402
from powerinfer import quants  # noqa: E402
from make_test_model import write_model  # noqa: E402
from test_isa import at_level  # noqa: E402,F401
from helpers import FLOAT_REL_RMS, rel_rms  # noqa: E402
from test_isa import q4_K_extreme_rows, q5_K_extreme_rows, q6_K_extreme_rows, wtensor  # noqa: E402
from test_isa import quantize as quantize_rows  # noqa: E402
from test_isa import repacked as repacked_t  # noqa: E402
from test_ops import (BF16, F16, Q4_0, Q5_0, Q8_0, assert_bit_equal, expect_error, mul_mat_case,  # noqa: E402
                      mul_mat_reference_and_tol, np_encode, tensor)


Q4_K = 12
Q5_K = 13
Q6_K = 14


def np_encode_q4_0(w):
    return np_encode(np.asarray(w, np.float32), Q4_0)

HAVE_REPACK = lib.pi_repack_bytes(tensor(np.zeros((8, 18), np.uint8), Q4_0)) > 0
needs_repack = pytest.mark.skipif(not HAVE_REPACK, reason="no interleaved layout on this CPU/build (scalar build)")



def mul_mat(pool, w, x, n_rows):
    y = np.zeros((x.shape[0], n_rows), np.float32)
    check(lib.pi_op_mul_mat(pool, w, tensor(x), tensor(y)))
    return y


def repacked(raw, dtype=Q4_0):
    w = tensor(raw, dtype)
    n = lib.pi_repack_bytes(w)
    buf = np.zeros(n, np.uint8)
    out = ffi.new("pi_tensor *")
    check(lib.pi_repack(w, ffi.cast("void *", ffi.from_buffer(buf)), n, out))
    return out, buf


# N: below, at and around multiples of the 8-row kernel and the 16-row work item; T: around the 8-token block
@pytest.mark.parametrize("K,N,T", [(32, 8, 1), (64, 13, 1), (128, 16, 4), (96, 24, 5), (256, 40, 9), (4096, 64, 3),
                                   (64, 7, 2), (64, 272, 8), (128, 48, 17)])
def test_q4_0_kernels_agree(pool2, K, N, T):
    raw, wd, x = mul_mat_case(Q4_0, K, N, T, seed=K + N + T)
    y = mul_mat(pool2, tensor(raw, Q4_0), x, N)                 # 8-row kernel + single rows for the rest
    one_by_one = np.concatenate([mul_mat(ffi.NULL, tensor(raw[i:i + 1], Q4_0), x, 1) for i in range(N)], axis=1)
    assert_bit_equal(y, one_by_one, "8-row kernel vs one row at a time")
    per_token = np.concatenate([mul_mat(pool2, tensor(raw, Q4_0), x[t:t + 1], N) for t in range(T)])
    assert_bit_equal(y, per_token, "several tokens per call vs one token per call")
    ref, tol, _, _ = mul_mat_reference_and_tol(Q4_0, wd, x)
    assert np.all(np.abs(y - ref) <= tol)
    if HAVE_REPACK and N % 8 == 0:
        w8, keep = repacked(raw)
        assert ffi.string(lib.pi_type_name(w8.type)).decode() == "q4_0x8"
        assert_bit_equal(mul_mat(pool2, w8, x, N), y, "interleaved copy vs the file's layout")
        assert_bit_equal(mul_mat(ffi.NULL, w8, x, N), y, "interleaved copy, no pool")


@pytest.mark.parametrize("K,N,T", [(32, 16, 1), (64, 48, 3), (640, 32, 17), (1088, 16, 2), (4096, 64, 9),
                                   (128, 272, 100)])
@pytest.mark.parametrize("qtype", [Q8_0, Q5_0], ids=["q8_0", "q5_0"])
def test_q8_0_interleaved_copy(pool2, K, N, T, qtype):
    """Q8_0 repacks to 16-row groups (Q8_0X16) with the bits of the file's layout, and within the tolerance of the
    float64 reference; so does Q5_0, as Q5_0X16 (the same order, 22 bytes per block as in the file; at the amx level
    prompts of 16 tokens or more unpack it into tiles: T 17 and 100 here)."""
    raw, wd, x = mul_mat_case(qtype, K, N, T, seed=K + N + T)
    y = mul_mat(pool2, tensor(raw, qtype), x, N)
    ref, tol, _, _ = mul_mat_reference_and_tol(qtype, wd, x)
    assert np.all(np.abs(y - ref) <= tol)
    as_q8 = qtype == Q8_0
    assert lib.pi_repack_bytes(tensor(raw, qtype)) == N * K // 32 * (34 if as_q8 else 22)
    w16, keep = repacked(raw, qtype)
    assert ffi.string(lib.pi_type_name(w16.type)).decode() == ("q8_0x16" if as_q8 else "q5_0x16")
    assert_bit_equal(mul_mat(pool2, w16, x, N), y, "interleaved copy vs the file's layout")
    assert_bit_equal(mul_mat(ffi.NULL, w16, x, N), y, "interleaved copy, no pool")
    per_token = np.concatenate([mul_mat(pool2, w16, x[t:t + 1], N) for t in range(T)])
    assert_bit_equal(per_token, y, "interleaved copy, one token per call")


def test_q8_0_repack_needs_whole_groups():
    raw = mul_mat_case(Q8_0, 64, 40, 1, seed=3)[0]
    assert lib.pi_repack_bytes(tensor(raw, Q8_0)) == 0          # 40 rows: not a multiple of 16
    assert lib.pi_repack_bytes(tensor(raw[:32], Q8_0)) == raw[:32].nbytes
    w16, keep = repacked(raw[:32], Q8_0)
    w16.ne[1] = 24                                  # an interleaved weight must keep whole groups of 16 rows
    x = np.ones((2, 64), np.float32)
    expect_error(lib.pi_op_mul_mat(ffi.NULL, w16, tensor(x), tensor(np.zeros((2, 24), np.float32))),
                 lib.PI_ERR_INVALID_ARG)


@pytest.mark.parametrize("qtype,name,extreme",
                         [(Q4_K, "q4_Kx16", q4_K_extreme_rows), (Q5_K, "q5_Kx16", q5_K_extreme_rows),
                          (Q6_K, "q6_Kx16", q6_K_extreme_rows)],
                         ids=["q4_K", "q5_K", "q6_K"])
@pytest.mark.parametrize("K", [256, 2048, 4096])
@pytest.mark.parametrize("N,T", [(16, 1), (48, 3), (48, 8), (272, 16), (32, 32), (48, 100)])
def test_K_interleaved_copy(pool2, qtype, name, extreme, K, N, T):
    """Q4_K, Q5_K and Q6_K repack to 16-row groups (Q4_KX16, Q5_KX16, Q6_KX16: as many bytes as the file) with the bits
    of the file's layout at this level: every token count (decode, the AVX-512 pairs, AMX tiles and their tails), with
    and without a pool (272 rows: a work item of 256 and one of 16), one token per call; rows over the whole format
    (extreme scales and mins, a zero row), large activations."""
    rng = np.random.default_rng(K + N + T)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[:, :32] *= 40.0
    x[-1, :] = np.abs(x[-1, :]) * 30
    raw = extreme(rng, N, K, quantize_rows(qtype, w))
    if lib.pi_repack_bytes(wtensor(qtype, raw)) == 0:
        if qtype == Q6_K and pi.cpu_isa() in ("scalar", "avx2"):
            pytest.skip(f"{pi.cpu_isa()}: q6_K is copied only at avx512 (its AVX2 regrouping decoded 1.4-2x slower)")
        assert pi.cpu_isa() == "amx", f"{name}: no interleaved copy at {pi.cpu_isa()}"
        pytest.skip(f"{pi.cpu_isa()}: {name[:4]} stays in the file's layout (its tile kernels read only that)")
    y = mul_mat(pool2, wtensor(qtype, raw), x, N)
    w16, keep = repacked_t(wtensor(qtype, raw))
    assert ffi.string(lib.pi_type_name(w16.type)).decode() == name
    assert keep.nbytes == raw.nbytes                        # the same bytes per weight as the file
    assert_bit_equal(mul_mat(pool2, w16, x, N), y, "interleaved copy vs the file's layout")
    assert_bit_equal(mul_mat(ffi.NULL, w16, x, N), y, "interleaved copy, no pool")
    per_token = np.concatenate([mul_mat(pool2, w16, x[t:t + 1], N) for t in range(min(T, 9))])
    assert_bit_equal(per_token, y[:min(T, 9)], "interleaved copy, one token per call")


def test_q4_K_repack_needs_whole_groups():
    """40 rows keep the file's layout; a Q4_KX16 weight is matmul-only (get_rows refuses it) and keeps whole groups."""
    raw = quantize_rows(Q4_K, np.random.default_rng(4).standard_normal((40, 256)).astype(np.float32))
    assert lib.pi_repack_bytes(wtensor(Q4_K, raw)) == 0
    w16, keep = repacked_t(wtensor(Q4_K, raw[:32]))
    ids = np.array([0, 3], np.int32)
    out = np.zeros((2, 256), np.float32)
    expect_error(lib.pi_op_get_rows(ffi.NULL, w16, ffi.cast("int32_t *", ids.ctypes.data), 2, tensor(out)),
                 lib.PI_ERR_UNSUPPORTED)
    w16.ne[1] = 24
    expect_error(lib.pi_op_mul_mat(ffi.NULL, w16, tensor(np.ones((2, 256), np.float32)),
                                   tensor(np.zeros((2, 24), np.float32))), lib.PI_ERR_INVALID_ARG)


def test_repack_bytes_and_errors():
    raw = mul_mat_case(Q4_0, 64, 16, 1, seed=1)[0]
    w = tensor(raw, Q4_0)
    n = lib.pi_repack_bytes(w)
    assert n == (raw.nbytes if HAVE_REPACK else 0)
    # no layout: float weights, a row count that is not a multiple of 8, 1-d, NULL, garbage
    assert lib.pi_repack_bytes(tensor(np.zeros((16, 64), np.float32))) == 0
    assert lib.pi_repack_bytes(tensor(raw[:12], Q4_0)) == 0
    assert lib.pi_repack_bytes(ffi.NULL) == 0
    bad = tensor(raw, Q4_0)
    bad.ne[0] = 33
    assert lib.pi_repack_bytes(bad) == 0
    out = ffi.new("pi_tensor *")
    buf = np.zeros(max(n, 1), np.uint8)
    p = ffi.cast("void *", ffi.from_buffer(buf))
    expect_error(lib.pi_repack(ffi.NULL, p, n, out), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_repack(w, ffi.NULL, n, out), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_repack(w, p, n, ffi.NULL), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_repack(tensor(raw[:12], Q4_0), p, n, out), lib.PI_ERR_UNSUPPORTED)
    if HAVE_REPACK:
        expect_error(lib.pi_repack(w, p, n - 1, out), lib.PI_ERR_INVALID_ARG)   # dst too small
        check(lib.pi_repack(w, p, n, out))


@needs_repack
def test_interleaved_weights_are_matmul_only():
    """Rows of an interleaved copy are not addressable: ops that read single rows refuse it."""
    raw = mul_mat_case(Q4_0, 64, 16, 2, seed=2)[0]
    w8, keep = repacked(raw)
    out = np.zeros((2, 64), np.float32)
    ids = np.array([0, 3], np.int32)
    expect_error(lib.pi_op_get_rows(ffi.NULL, w8, ffi.cast("int32_t *", ids.ctypes.data), 2, tensor(out)),
                 lib.PI_ERR_UNSUPPORTED)
    x, scores = np.ones((2, 64), np.float32), np.ones((2, 16), np.float32)
    sw = ffi.new("pi_sparse_ffn_weights *")
    sw.gate = sw.up = sw.down_t = w8[0]
    na = ffi.new("int64_t *")
    expect_error(lib.pi_op_sparse_ffn(ffi.NULL, sw, lib.PI_ACT_RELU, lib.PI_FFN_PAR, tensor(x), tensor(scores), 0.0,
                                      tensor(out), na), lib.PI_ERR_UNSUPPORTED)
    q = np.zeros((8, 64), np.uint8)
    expect_error(lib.pi_dequantize_row(w8.type, ffi.from_buffer(q), ffi.cast("float *", out.ctypes.data), 64),
                 lib.PI_ERR_UNSUPPORTED)
    w8.ne[1] = 12                                   # an interleaved weight must keep whole groups of 8 rows
    expect_error(lib.pi_op_mul_mat(ffi.NULL, w8, tensor(x), tensor(np.zeros((2, 12), np.float32))),
                 lib.PI_ERR_INVALID_ARG)


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("repack") / "tiny-q4_0.gguf"
    write_model(path, dtype="q4_0", seed=5, n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2)
    return path


def tied_model(tmp_path_factory, dtype: str, seed: int):
    """A tiny model of dtype with the output head tied to the embedding table: both are read from one interleaved
    copy (Q8_0X16, F16X8)."""
    path = tmp_path_factory.mktemp("repack") / f"tiny-{dtype}-tied.gguf"
    write_model(path, dtype=dtype, seed=seed, n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2,
                tied_output=True)
    return path


@pytest.fixture(scope="module")
def q8_tied_model(tmp_path_factory):
    return tied_model(tmp_path_factory, "q8_0", 6)


@pytest.fixture(scope="module")
def q5_tied_model(tmp_path_factory):
    """Q5_0 weights and a tied Q5_0 table: all repacked (Q5_0X16; Q8_0X16 at the amx level), and get_rows reads the
    table's copy too."""
    return tied_model(tmp_path_factory, "q5_0", 7)


@pytest.mark.parametrize("qtype", [Q8_0, Q5_0], ids=["q8_0", "q5_0"])
def test_x16_rows_for_get_rows(pool2, qtype):
    """get_rows reads a Q8_0X16 or Q5_0X16 table (a tied head's copy) as the file's rows; Q4_0X8 stays matmul-only."""
    raw, wd, x = mul_mat_case(qtype, 96, 48, 1, seed=9)
    ids = np.array([0, 15, 16, 47, 5, 5], np.int32)
    got = {}
    w16, keep = repacked(raw, qtype)
    for name, w in (("rows", tensor(raw, qtype)), ("x16", w16)):
        out = np.zeros((len(ids), 96), np.float32)
        check(lib.pi_op_get_rows(pool2, w, ffi.cast("int32_t *", ids.ctypes.data), len(ids), tensor(out)))
        got[name] = out
    assert_bit_equal(got["x16"], got["rows"], "get_rows of the interleaved copy vs the file's rows")
    w16.ne[1] = 40                                  # an interleaved table must keep whole groups of 16 rows
    out = np.zeros((len(ids), 96), np.float32)
    expect_error(lib.pi_op_get_rows(pool2, w16, ffi.cast("int32_t *", ids.ctypes.data), len(ids), tensor(out)),
                 lib.PI_ERR_INVALID_ARG)


@pytest.mark.parametrize("qtype", [3, 7], ids=["q4_1", "q5_1"])
def test_q4_1_family_interleaved_copy(pool2, qtype):
    """Q4_1 and Q5_1 repack to 16-row groups (Q4_1X16, Q5_1X16: the file's bytes a row) with the bits of the file's
    layout (decode, pairs, AMX prompt tiles at T 17 / 100) and within test_kquants' tolerance of the float64 dot; a
    tied head's copy gives get_rows the file's rows."""
    from test_isa import mul_mat as mul_mat_t
    from test_kquants import BLOCK, assert_within, c_quantize, dot_reference
    rng = np.random.default_rng(qtype)
    K, N = 1088, 48
    raw = c_quantize(qtype, (rng.standard_normal((N, K)) / 30).astype(np.float32)).reshape(N, -1)
    assert lib.pi_repack_bytes(wtensor(qtype, raw)) == N * K // 32 * BLOCK[qtype][1]
    w16, keep = repacked_t(wtensor(qtype, raw))
    assert ffi.string(lib.pi_type_name(w16.type)).decode() == ("q4_1x16" if qtype == 3 else "q5_1x16")
    for T in (1, 3, 17, 100):
        x = rng.standard_normal((T, K)).astype(np.float32)
        y = mul_mat_t(wtensor(qtype, raw), x, N, pool2)
        assert_bit_equal(mul_mat_t(w16, x, N, pool2), y, f"interleaved copy vs the file's layout, T={T}")
        ref, tol = dot_reference(qtype, raw.reshape(-1), x)
        assert_within(y, ref, tol, f"mul_mat {qtype} T={T}")
    ids = np.array([0, 15, 16, 47, 5, 5], np.int32)
    got = []
    for w in (wtensor(qtype, raw), w16):
        out = np.zeros((len(ids), K), np.float32)
        check(lib.pi_op_get_rows(pool2, w, ffi.cast("int32_t *", ids.ctypes.data), len(ids), tensor(out)))
        got.append(out)
    assert_bit_equal(got[1], got[0], "get_rows of the interleaved copy vs the file's rows")


@pytest.fixture(scope="module")
def f16_tied_model(tmp_path_factory):
    return tied_model(tmp_path_factory, "f16", 7)


@pytest.mark.parametrize("qtype", [F16, BF16], ids=["f16", "bf16"])
def test_16bit_interleaved_rows_for_get_rows(pool2, qtype):
    """get_rows reads an F16X8/BF16X8 table (a tied head's copy) as the file's rows; rows whose length is not a
    multiple of 8 keep the file's layout."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((48, 96)).astype(np.float32)
    raw = w.astype(np.float16).view(np.uint16) if qtype == F16 else (w.view(np.uint32) >> 16).astype(np.uint16)
    ids = np.array([0, 3, 4, 7, 8, 47, 5, 5], np.int32)
    w8, keep = repacked(raw, qtype)
    assert ffi.string(lib.pi_type_name(w8.type)).decode() == ("f16x8" if qtype == F16 else "bf16x8")
    got = {}
    for name, t in (("rows", tensor(raw, qtype)), ("x8", w8)):
        out = np.zeros((len(ids), 96), np.float32)
        check(lib.pi_op_get_rows(pool2, t, ffi.cast("int32_t *", ids.ctypes.data), len(ids), tensor(out)))
        got[name] = out
    assert_bit_equal(got["x8"], got["rows"], "get_rows of the interleaved copy vs the file's rows")
    assert lib.pi_repack_bytes(tensor(np.zeros((16, 36), np.uint16), qtype)) == 0   # 36: not whole 8-element chunks
    assert lib.pi_repack_bytes(tensor(np.zeros((16, 40), np.uint16), qtype)) == 16 * 40 * 2


@pytest.mark.parametrize("model_name", ["q4_model", "q8_tied_model", "q5_tied_model", "f16_tied_model", "gemma_file"])
def test_repacked_model_gives_the_same_logits(request, model_name, monkeypatch):
    prompt = [1, 17, 200, 45, 3, 99, 128, 7, 300]
    logits = {}
    q4_model = request.getfixturevalue(model_name)
    for repack in (True, False):
        model = pi.Model(q4_model, repack=repack)
        ctx = pi.Context(model, n_ctx=32, n_threads=2)
        ctx.decode(prompt, logits="all")
        batch = np.stack([ctx.logits(i) for i in range(len(prompt))])
        ctx.kv_clear()
        steps = []
        for tok in prompt:                              # token by token: T = 1 kernels
            ctx.decode([tok])
            steps.append(ctx.logits(0))
        logits[repack] = (batch, np.stack(steps))
    assert_bit_equal(logits[True][0], logits[False][0], "prompt logits, repacked vs file layout")
    assert_bit_equal(logits[True][1], logits[False][1], "decode logits, repacked vs file layout")
    assert_bit_equal(logits[True][0], logits[True][1], "prompt vs token-by-token decode")
    monkeypatch.setenv("POWERINFER_NO_REPACK", "1")
    assert pi.Model(q4_model).repack is False


def fma32(a, b, c):
    """float32 fma(a, b, c) for the Q4_0 axpy's operands: a * b is exact in float64 (24 + 4 bits), and
    the float64 sum of it and c is exact too unless their exponents are far apart, so rounding the
    float64 result once to float32 is the fused result (the test below would notice if it were not)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def q4_0_parts(raw):
    """Q4_0 rows [N, row bytes] -> scales [N, nb] f32 and signed quants [N, nb * 32] f32 (in element order)."""
    N = raw.shape[0]
    blocks = raw.reshape(N, -1, 18)
    d = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    qs = blocks[:, :, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float32) - 8   # elements 0..15, then 16..31
    return d, q.reshape(N, -1)


SPARSE_RANGE = 512   # sparse_ffn.c: neurons per partial sum of the down step
AXPY_GROUP = 16      # internal.h PI_AXPY_GROUP: rows per integer sum of the Q4_0R down step


def np_q4_0r_group_axpy(part, coefs, d, q):
    """arch/q4_0r.c's axpy_group, emulated: y += the group's rows (coefs [k], block scales d [k, nb], signed
    quants q [k, nb * 32]) with c = coef * d per block quantized to 14 bits against the group's largest |c|
    (m = rint(c * (8191 / M)), halves to even as cvtps2dq and lrintf), an exact integer sum, one fma per output."""
    c = (coefs.astype(np.float32)[:, None] * d).astype(np.float32)                 # [k, nb] f32 products
    M = np.abs(c).max(axis=0)
    with np.errstate(divide="ignore"):
        inv = np.where(M > 0, np.float32(8191) / M, np.float32(0)).astype(np.float32)
    m = np.rint((c * inv[None]).astype(np.float32)).astype(np.int64)
    S = (M / np.float32(8191)).astype(np.float32)
    i = (m[:, :, None] * q.reshape(len(coefs), -1, 32).astype(np.int64)).sum(axis=0)   # [nb, 32], exact
    return fma32(np.repeat(S, 32), i.reshape(-1).astype(np.float32), part)


def down_groups(h):
    """Per range of SPARSE_RANGE channels, the list of its groups: its rows with h != 0 in order, AXPY_GROUP at a
    time (sparse_ffn.c's axpy queue)."""
    for r0 in range(0, len(h), SPARSE_RANGE):
        nz = r0 + np.flatnonzero(h[r0:r0 + SPARSE_RANGE])
        yield [nz[g:g + AXPY_GROUP] for g in range(0, len(nz), AXPY_GROUP)]


def np_q4_0r_down(h, d, q):
    """The Q4_0R down step of one token, emulated: per range, its groups into a partial from 0;
    out = ((0 + p_0) + p_1) + ..."""
    y = np.zeros(q.shape[1], np.float32)
    for groups in down_groups(h):
        part = np.zeros(q.shape[1], np.float32)
        for rows in groups:
            part = np_q4_0r_group_axpy(part, h[rows], d[rows], q[rows])
        y = y + part
    return y


def np_q4_0r_down_bound(h, d, q):
    """How far np_q4_0r_down may be from the exact sum of h_i * row_i: each 14-bit coefficient is off by at most
    half a step S of its group and block (times |q - 8| per output), plus a little for S's own rounding."""
    bound = np.zeros(q.shape[1], np.float64)
    for groups in down_groups(h):
        for rows in groups:
            S = np.abs(h[rows, None].astype(np.float64) * d[rows]).max(axis=0) / 8191       # [nb]
            bound += np.repeat(S, 32) * (0.5 + 1e-5) * np.abs(q[rows]).sum(axis=0)
    return bound


@pytest.mark.parametrize("down", ["q4_0", "f16", "q8_0"])
@pytest.mark.parametrize("T", [1, 3, 6])
def test_sparse_ffn_is_the_exact_axpy_chain(pool2, T, down):
    """The gathered 8-row dot products and the 8-row axpy give exactly the bits of one row at a time:
    h from mul_mat's dot products (equal to vec_dot's, test above); per range of SPARSE_RANGE neurons a
    partial = axpy over its active rows in order, from 0; out = the partials added in range order. One
    token (the fused path) and batches (gather, then the column-split down step) alike; q4_0, f16 and q8_0
    down_t rows (pi_axpy8_q4_0, pi_axpy8_f16, pi_axpy8_q8_0)."""
    E, F = 128, 2 * SPARSE_RANGE + 88   # three ranges, the last one short
    rng = np.random.default_rng(T)
    gate, up, down_t = (np_encode_q4_0(rng.standard_normal((F, E)) / np.sqrt(E)) for _ in range(3))
    if down == "f16":
        down_t = (rng.standard_normal((F, E)) / np.sqrt(E)).astype(np.float16)
    if down == "q8_0":
        down_t = quants.quantize_q8_0(rng.standard_normal((F, E)).astype(np.float32) / np.sqrt(E)).reshape(F, -1)
    x = rng.standard_normal((T, E)).astype(np.float32)
    scores = rng.standard_normal((T, F)).astype(np.float32)      # about half of the neurons per token
    scores[:, SPARSE_RANGE:2 * SPARSE_RANGE] = -1.0               # the middle range: no neuron at all
    w = ffi.new("pi_sparse_ffn_weights *")
    w.gate, w.up = tensor(gate, Q4_0)[0], tensor(up, Q4_0)[0]
    w.down_t = tensor(down_t, {"q4_0": Q4_0, "q8_0": Q8_0}[down])[0] if down != "f16" else tensor(down_t)[0]
    out = np.zeros((T, E), np.float32)
    check(lib.pi_op_sparse_ffn(pool2, w, lib.PI_ACT_RELU, lib.PI_FFN_PAR, tensor(x), tensor(scores), 0.0,
                               tensor(out), ffi.NULL))
    g = mul_mat(ffi.NULL, tensor(gate, Q4_0), x, F)
    u = mul_mat(ffi.NULL, tensor(up, Q4_0), x, F)
    h = np.where(scores >= 0.0, np.maximum(g, 0) * u, 0).astype(np.float32)
    if down == "q4_0":
        d, q = q4_0_parts(down_t)
        add_row = lambda i, t, y: fma32(np.repeat((h[t, i] * d[i]).astype(np.float32), 32), q[i], y)  # noqa: E731
    elif down == "q8_0":   # pi_axpy_q8_0: fma(a d_b, q, y) per element
        blocks = down_t.reshape(F, E // 32, 34)
        d = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
        q = blocks[:, :, 2:].copy().view(np.int8).reshape(F, E).astype(np.float32)
        add_row = lambda i, t, y: fma32(np.repeat((h[t, i] * d[i]).astype(np.float32), 32), q[i], y)  # noqa: E731
    else:   # pi_axpy_f16 adds fma(a, x, y) at every level (E is a multiple of 8: no unfused tail)
        add_row = lambda i, t, y: fma32(np.full(E, h[t, i]), down_t[i].astype(np.float32), y)  # noqa: E731
    for t in range(T):
        y = np.zeros(E, np.float32)
        for r0 in range(0, F, SPARSE_RANGE):
            part = np.zeros(E, np.float32)
            for i in r0 + np.flatnonzero(h[t, r0:r0 + SPARSE_RANGE]):
                part = add_row(i, t, part)
            y = y + part
        assert_bit_equal(out[t], y, f"token {t}: sparse FFN vs the one-row-at-a-time chain")


LANE_OF = [0, 4, 1, 5, 2, 6, 3, 7]   # arch/q4_0r.c: the lane of block b % 8 in the packed dot product


def np_q4_0r_dot(raw, xq):
    """The packed layout's dot products, emulated: Q4_0 rows raw [N, bytes] . Q8_0S activation xq
    [nb, 36]: exact integer per block, lane LANE_OF[b % 8] accumulates fma(d_w * d_x, i_b) in block
    order, then the fixed tree over the lanes."""
    N = raw.shape[0]
    blocks = raw.reshape(N, -1, 18)
    dw = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    q = np.concatenate([blocks[:, :, 2:] & 15, blocks[:, :, 2:] >> 4], axis=2).astype(np.int64)
    dx = xq[:, :2].copy().view(np.float16)[:, 0].astype(np.float32)
    s = xq[:, 2:4].copy().view(np.int16)[:, 0].astype(np.int64)
    isum = (q * xq[:, 4:].view(np.int8).astype(np.int64)[None]).sum(axis=2) - 8 * s[None]
    prod = dw * dx[None]                                                 # float32 products
    acc = np.zeros((N, 8), np.float32)
    for b in range(blocks.shape[1]):
        lane = LANE_OF[b % 8]
        acc[:, lane] = fma32(prod[:, b], isum[:, b].astype(np.float32), acc[:, lane])
    a = acc.T
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


def sparse_packed(gate, up, down_t, gate_mode):
    w = ffi.new("pi_sparse_ffn_weights *")
    if gate is not None:
        w.gate = tensor(gate, Q4_0)[0]
    w.up, w.down_t = tensor(up, Q4_0)[0], tensor(down_t, Q4_0)[0]
    n = lib.pi_sparse_pack_bytes(w, gate_mode)
    buf = np.zeros(max(n, 1), np.uint8)
    out = ffi.new("pi_sparse_ffn_weights *")
    if n > 0:
        check(lib.pi_sparse_pack(w, gate_mode, ffi.cast("void *", ffi.from_buffer(buf)), n, out))
    return w, out, buf, n


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
@pytest.mark.parametrize("T", [1, 3, 16, 37])
@pytest.mark.parametrize("gate_mode", ["par", "seq"])
def test_sparse_pack_is_its_exact_chain(at_level, pool2, level, T, gate_mode):  # noqa: F811
    """The packed layout (pi_sparse_pack: each neuron's rows together, scales ahead of the quants) gives
    exactly its emulated arithmetic: h from the packed dot products (lane partials + tree), out from the
    integer group sums (np_q4_0r_down) over ranges, at every level. One token (fused path) and batches; with and
    without a gate. At the amx level batches of 16 and 37 tokens gather 16 rows at a time on AMX tiles (the whole
    16-token tiles; 37: two and a 5-token tail through the 8-row kernel) where a row is active for enough of the
    tokens, the rarely active rows of the last range token by token, and 1112 neurons leave row tails."""
    at_level(level)
    E, F = 512, 2 * SPARSE_RANGE + 88
    mode = lib.PI_FFN_PAR if gate_mode == "par" else lib.PI_FFN_SEQ
    rng = np.random.default_rng(10 + T)
    gate, up, down_t = (np_encode_q4_0(rng.standard_normal((F, E)) / np.sqrt(E)) for _ in range(3))
    if mode == lib.PI_FFN_SEQ:
        gate = None
    w, packed, keep, n = sparse_packed(gate, up, down_t, mode)
    assert n == (3 if gate is not None else 2) * E // 32 * 18 * F
    x = rng.standard_normal((T, E)).astype(np.float32)
    scores = rng.standard_normal((T, F)).astype(np.float32)
    scores[:, SPARSE_RANGE:2 * SPARSE_RANGE] = -1.0
    scores[:, 2 * SPARSE_RANGE:] -= 1.5   # the last range's rows active for ~7% of the tokens: token by token in batches
    out = np.zeros((T, E), np.float32)
    check(lib.pi_op_sparse_ffn(pool2, packed, lib.PI_ACT_RELU, mode, tensor(x), tensor(scores), 0.0,
                               tensor(out), ffi.NULL))
    d, q = q4_0_parts(down_t)
    hs = []
    for t in range(T):
        xq = quantize(lib.PI_TYPE_COUNT, x[t], 36)                      # Q8_0S: what Q8_0P holds, rearranged
        u = np_q4_0r_dot(up, xq)
        h = np.maximum(u, 0) if gate is None else np.maximum(np_q4_0r_dot(gate, xq), 0) * u
        h = np.where(scores[t] >= 0.0, h, 0).astype(np.float32)
        assert_bit_equal(out[t], np_q4_0r_down(h, d, q), f"token {t}: packed sparse FFN vs its emulation")
        hs.append(h)
    # and close to the file layout (f32 axpy per row): within the 14-bit coefficients' rounding, at most half a step
    # S of each group per |q - 8| (np_q4_0r_down_bound), plus the dot products' other summation order
    ref = np.zeros((T, E), np.float32)
    check(lib.pi_op_sparse_ffn(pool2, w, lib.PI_ACT_RELU, mode, tensor(x), tensor(scores), 0.0, tensor(ref), ffi.NULL))
    for t in range(T):
        bound = np_q4_0r_down_bound(hs[t], d, q)
        assert np.all(np.abs(out[t] - ref[t]) <= bound + 1e-4 * np.abs(ref).max()), f"token {t}"
        assert 0 < np.abs(out[t] - ref[t]).max()                 # the coefficients were rounded: not the f32 chain


def np_q4_0c_down(h, raw_down):
    """The Q4_0C down step of one token (arch/q4_0c.c), emulated from the file's Q4_0 matrix raw_down [E rows of F
    inputs]: per range of SPARSE_RANGE neurons, its rows with h != 0 in each block of 32 neurons are one group, whose
    coefficients are quantized as one Q8_0S block (m = rint(h * (127 / M)), S = M / 127 in fp16), an exact integer
    sum per output and y = fma(d_eb * S, sum, y); out = ((0 + p_0) + p_1) + ..."""
    d, q = q4_0_parts(raw_down)                       # [E, F / 32] scales, [E, F] signed quants
    y = np.zeros(d.shape[0], np.float32)
    for r0 in range(0, len(h), SPARSE_RANGE):
        part = np.zeros_like(y)
        for b0 in range(r0, min(r0 + SPARSE_RANGE, len(h)), 32):
            rows = b0 + np.flatnonzero(h[b0:b0 + 32])
            if len(rows) == 0:
                continue
            M = np.abs(h[rows]).max()
            m = np.rint((h[rows] * (np.float32(127) / M)).astype(np.float32)).astype(np.int64)
            S = np.float32(M / np.float32(127)).astype(np.float16).astype(np.float32)   # as Q8_0S: fp16
            isum = (q[:, rows].astype(np.int64) * m[None]).sum(axis=1)
            part = fma32((d[:, b0 // 32] * S).astype(np.float32), isum.astype(np.float32), part)
        y = y + part
    return y


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("gate_mode", ["par", "seq", "input", "seq_in_place"])
def test_sparse_pack_from_down_is_its_exact_chain(at_level, pool2, level, T, gate_mode):  # noqa: F811
    """With the file's Q4_0 down matrix given (w.down), pi_sparse_pack lays the down step out by neuron from its own
    quants and scales (Q4_0C), nothing re-quantized: out is exactly its emulation (np_q4_0c_down) at every level, one
    token (fused path) and a batch; with a gate, without, as an input-sparse matmul (up NULL, h = the scores), and
    with n_embd 192, whose up rows have no packed layout and stay in the file's (the down step alone is packed)."""
    at_level(level)
    E, F = 512 if gate_mode in ("par", "seq") else 192, 2 * SPARSE_RANGE + 96   # three ranges, the last one short
    rng = np.random.default_rng(20 + T)
    gate, up = (np_encode_q4_0(rng.standard_normal((F, E)) / np.sqrt(E)) for _ in range(2))
    down = np_encode_q4_0(rng.standard_normal((E, F)) / np.sqrt(F))    # [E rows, F inputs]: ffn_down as in the file
    w = ffi.new("pi_sparse_ffn_weights *")
    mode = lib.PI_FFN_PAR if gate_mode == "par" else lib.PI_FFN_SEQ
    if gate_mode == "par":
        w.gate = tensor(gate, Q4_0)[0]
    if gate_mode != "input":
        w.up = tensor(up, Q4_0)[0]
    w.down = tensor(down, Q4_0)[0]
    n = lib.pi_sparse_pack_bytes(w, mode)
    n_r = {"par": 2, "seq": 1, "input": 0, "seq_in_place": 0}[gate_mode]
    assert n == F * (n_r * E // 32 * 18 + E // 2) + F // 32 * E * 2
    buf = np.zeros(n, np.uint8)
    packed = ffi.new("pi_sparse_ffn_weights *")
    check(lib.pi_sparse_pack(w, mode, ffi.cast("void *", ffi.from_buffer(buf)), n, packed))
    assert ffi.string(lib.pi_type_name(packed.down_t.type)) == b"q4_0c" and packed.down_t_scales != ffi.NULL
    if gate_mode == "seq_in_place":
        assert packed.up.data == w.up.data and packed.up.type == Q4_0   # the file's rows
    x = rng.standard_normal((T, E)).astype(np.float32)
    scores = rng.standard_normal((T, F)).astype(np.float32)
    scores[:, SPARSE_RANGE:2 * SPARSE_RANGE] = -1.0 if gate_mode != "input" else 0.0   # the middle range: none
    out = np.zeros((T, E), np.float32)
    threshold = 0.0 if gate_mode != "input" else 0.5
    check(lib.pi_op_sparse_ffn(pool2, packed, lib.PI_ACT_RELU, mode, tensor(x), tensor(scores), threshold,
                               tensor(out), ffi.NULL))
    exact = np.zeros((T, E))
    dd, qq = q4_0_parts(down)
    for t in range(T):
        if gate_mode == "input":
            h = np.where(np.abs(scores[t]) >= threshold, scores[t], 0).astype(np.float32)
        elif gate_mode == "seq_in_place":   # the file layout's dot products: mul_mat's bits
            u = mul_mat(ffi.NULL, tensor(up, Q4_0), x[t:t + 1], F)[0]
            h = np.where(scores[t] >= 0.0, np.maximum(u, 0), 0).astype(np.float32)
        else:
            xq = quantize(lib.PI_TYPE_COUNT, x[t], 36)
            u = np_q4_0r_dot(up, xq)
            h = np.maximum(u, 0) if gate_mode == "seq" else np.maximum(np_q4_0r_dot(gate, xq), 0) * u
            h = np.where(scores[t] >= 0.0, h, 0).astype(np.float32)
        assert_bit_equal(out[t], np_q4_0c_down(h, down), f"token {t}: packed sparse FFN vs its emulation")
        exact[t] = (np.repeat(dd, 32, axis=1).astype(np.float64) * qq) @ h.astype(np.float64)
    # against the exact product with the file's weights: the coefficients' 8-bit rounding (Q8_0's, as the dense path)
    assert rel_rms(out, exact) < 0.01


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_q4_0c_down_with_full_blocks_is_its_exact_chain(at_level, pool2, level):  # noqa: F811
    """Blocks of 21 to 32 active rows over 16448 outputs (more than one of axpy_cols' COLS_TILE tiles, the last one
    short): on AMD Zen 3 and later (pi_cpu_one_stream_decode) such a block goes in two passes of at most 16 rows with
    exact int32 sums between them, elsewhere in one; either way the bits of np_q4_0c_down, at every level."""
    at_level(level)
    E, F = 16384 + 64, 4 * 32   # COLS_TILE (arch/q4_0c.c) + one chunk
    rng = np.random.default_rng(7)
    down = np_encode_q4_0(rng.standard_normal((E, F)) / np.sqrt(F))
    w = ffi.new("pi_sparse_ffn_weights *")
    w.down = tensor(down, Q4_0)[0]
    n = lib.pi_sparse_pack_bytes(w, lib.PI_FFN_SEQ)
    buf = np.zeros(n, np.uint8)
    packed = ffi.new("pi_sparse_ffn_weights *")
    check(lib.pi_sparse_pack(w, lib.PI_FFN_SEQ, ffi.cast("void *", ffi.from_buffer(buf)), n, packed))
    scores = rng.standard_normal((1, F)).astype(np.float32) + np.float32(3.0)   # every input above the threshold
    for b, active in enumerate((32, 21, 22, 27)):                               # but these many per block
        scores[0, 32 * b + rng.permutation(32)[active:]] = 0.0
    out = np.zeros((1, E), np.float32)
    check(lib.pi_op_sparse_ffn(pool2, packed, lib.PI_ACT_RELU, lib.PI_FFN_SEQ, tensor(np.zeros((1, E), np.float32)),
                               tensor(scores), 0.5, tensor(out), ffi.NULL))
    assert_bit_equal(out[0], np_q4_0c_down(scores[0], down), "blocks of 21-32 rows vs the emulation")


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("gate_mode", ["input", "seq", "par"])
@pytest.mark.parametrize("F", [512, 2 * SPARSE_RANGE + 256])
@pytest.mark.parametrize("kind", ["q4_K", "q6_K"])
def test_sparse_pack_from_k_quant_down_is_the_dense_product(at_level, pool2, level, T, gate_mode, F,  # noqa: F811
                                                            kind):
    """A Q4_K or Q6_K down matrix given (w.down: ffn_down of a llama.cpp Q4_K_M file, which has both) is laid out by
    neuron from its own quants, scales (and mins) (Q4_KC / Q6_KC, arch/kc.c): each super-block of 256 neurons' h
    quantized as the dense path quantizes it (Q8_KM / Q8_K), so within one range of SPARSE_RANGE neurons the sparse
    down step IS the dense product of the kept h, to the bit, at every level, one token (fused path) and a batch;
    over several ranges it differs by the f32 order of the range sums (FLOAT_REL_RMS). As an input-sparse matmul
    (h = the scores), and after the file's Q4_K up (and gate) rows, which have no packed layout and stay put."""
    at_level(level)
    rng = np.random.default_rng(30 + T)
    E_in = 256                                       # Q4_K up rows need a multiple of 256 inputs
    gate, up = (quantize_rows(Q4_K, (rng.standard_normal((F, E_in)) / np.sqrt(E_in)).astype(np.float32))
                for _ in range(2))
    dt = {"q4_K": Q4_K, "q6_K": Q6_K}[kind]
    down = quantize_rows(dt, (rng.standard_normal((E_in, F)) / np.sqrt(F)).astype(np.float32))   # [E rows, F]
    w = ffi.new("pi_sparse_ffn_weights *")
    mode = lib.PI_FFN_PAR if gate_mode == "par" else lib.PI_FFN_SEQ
    if gate_mode == "par":
        w.gate = wtensor(Q4_K, gate)[0]
    if gate_mode != "input":
        w.up = wtensor(Q4_K, up)[0]
    w.down = wtensor(dt, down)[0]
    n = lib.pi_sparse_pack_bytes(w, mode)
    assert n == (F * E_in // 2 + F // 256 * E_in * 20 if kind == "q4_K" else F * E_in * 3 // 4 + F // 256 * E_in * 18)
    buf = np.zeros(n, np.uint8)
    packed = ffi.new("pi_sparse_ffn_weights *")
    check(lib.pi_sparse_pack(w, mode, ffi.cast("void *", ffi.from_buffer(buf)), n, packed))
    assert ffi.string(lib.pi_type_name(packed.down_t.type)).decode() == kind.lower() + "c"
    assert packed.down_t_scales != ffi.NULL
    if gate_mode != "input":
        assert packed.up.data == w.up.data and packed.up.type == Q4_K   # the file's rows
    x = rng.standard_normal((T, E_in)).astype(np.float32)
    scores = rng.standard_normal((T, F)).astype(np.float32)
    scores[:, 100:356] = 0.0 if gate_mode == "input" else -1.0     # a whole super-block and parts of two: none
    out = np.zeros((T, E_in), np.float32)
    threshold = 0.0 if gate_mode != "input" else 0.5
    check(lib.pi_op_sparse_ffn(pool2, packed, lib.PI_ACT_RELU, mode, tensor(x), tensor(scores), threshold,
                               tensor(out), ffi.NULL))
    hs = np.zeros((T, F), np.float32)
    for t in range(T):
        if gate_mode == "input":
            hs[t] = np.where(np.abs(scores[t]) >= threshold, scores[t], 0)
        else:   # the file layout's dot products: mul_mat's bits
            u = mul_mat(ffi.NULL, wtensor(Q4_K, up), x[t:t + 1], F)[0]
            g = mul_mat(ffi.NULL, wtensor(Q4_K, gate), x[t:t + 1], F)[0] if gate_mode == "par" else u
            h = np.maximum(g, 0) * u if gate_mode == "par" else np.maximum(u, 0)
            hs[t] = np.where(scores[t] >= 0.0, h, 0)
    dense = mul_mat(ffi.NULL, wtensor(dt, down), hs, E_in)
    if F <= SPARSE_RANGE:
        assert_bit_equal(out, dense, "packed sparse down step vs the dense product")
    else:
        assert 0 < rel_rms(out, dense) < FLOAT_REL_RMS


def test_sparse_pack_refusals():
    rng = np.random.default_rng(3)
    q4 = np_encode_q4_0(rng.standard_normal((16, 256)))
    w, packed, keep, n = sparse_packed(q4, q4, q4, lib.PI_FFN_PAR)
    assert n == 3 * 256 // 32 * 18 * 16
    small = np.zeros(n - 1, np.uint8)
    out = ffi.new("pi_sparse_ffn_weights *")
    def refused(status, code, text):
        expect_error(status, code)
        assert text in ffi.string(lib.pi_last_error()).decode()

    refused(lib.pi_sparse_pack(w, lib.PI_FFN_PAR, ffi.cast("void *", ffi.from_buffer(small)), n - 1, out),
            lib.PI_ERR_INVALID_ARG, "dst holds")
    refused(lib.pi_sparse_pack(ffi.NULL, lib.PI_FFN_PAR, ffi.cast("void *", ffi.from_buffer(small)), n, out),
            lib.PI_ERR_INVALID_ARG, "NULL")
    assert lib.pi_sparse_pack_bytes(ffi.NULL, lib.PI_FFN_PAR) == 0
    assert lib.pi_sparse_pack_bytes(w, 99) == 0                                    # unknown gate mode
    q4_128 = np_encode_q4_0(rng.standard_normal((16, 128)))                         # n_embd not a multiple of 256
    assert sparse_packed(q4_128, q4_128, q4_128, lib.PI_FFN_PAR)[3] == 0
    assert sparse_packed(None, q4, q4, lib.PI_FFN_PAR)[3] == 0                      # par needs a gate
    w8 = ffi.new("pi_sparse_ffn_weights *")
    q8 = quantize(lib.PI_TYPE_Q8_0, rng.standard_normal(16 * 256).astype(np.float32), 34).reshape(16, -1)
    w8.gate, w8.up, w8.down_t = tensor(q8, lib.PI_TYPE_Q8_0)[0], tensor(q4, Q4_0)[0], tensor(q4, Q4_0)[0]
    assert lib.pi_sparse_pack_bytes(w8, lib.PI_FFN_PAR) == 0                        # q8_0 gate
    refused(lib.pi_sparse_pack(w8, lib.PI_FFN_PAR, ffi.cast("void *", ffi.from_buffer(small)), n, out),
            lib.PI_ERR_UNSUPPORTED, "q4_0")


def quantize(t, x, block_bytes):
    x = np.ascontiguousarray(x, np.float32)
    dst = np.zeros(x.size // 32 * block_bytes, np.uint8)
    check(lib.pi_quantize_row(t, ffi.from_buffer("float[]", x), ffi.from_buffer(dst), x.size))
    return dst.reshape(-1, block_bytes)


def test_activation_quantizers_round_exactly():
    """Q8_0 as stored (d = amax/127, roundf: halves away from zero) and the Q8_0S activations (rint(x *
    127/amax): halves to even) against numpy, bit for bit, on random data and on values that land exactly on
    and next to .5 after scaling."""
    from test_ops import np_quantize_q8_0
    rng = np.random.default_rng(7)
    ties = np.array([127, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5, 0.49999997, -0.49999997, 0.50000006,
                     3.4999998, -3.4999998, 0, -0.0, 1e-30, 64.5, -64.5, 100.5, 5.5, -5.5, 7.5, 8.5, 9.5, 10.5,
                     11.5, -11.5, 12.5, 13.5, 14.5, 15.5], np.float32)          # amax 127: d = 1, x * (1/d) = x
    x = np.concatenate([ties, rng.standard_normal(32 * 200).astype(np.float32) * 10 ** rng.uniform(-3, 3),
                        np.zeros(32, np.float32)])
    assert np.array_equal(quantize(lib.PI_TYPE_Q8_0, x, 34), np_quantize_q8_0(x).reshape(-1, 34))
    want = np_quantize_q8_0(x, activations=True).reshape(-1, 34)
    assert not np.array_equal(want, np_quantize_q8_0(x).reshape(-1, 34))   # the ties round differently
    q8s = quantize(lib.PI_TYPE_COUNT, x, 36)                      # PI_TYPE_Q8_0S: d, s = sum of quants, quants
    assert np.array_equal(q8s[:, :2], want[:, :2]) and np.array_equal(q8s[:, 4:], want[:, 2:])
    sums = q8s[:, 2:4].copy().view(np.int16)[:, 0]
    assert np.array_equal(sums, want[:, 2:].view(np.int8).astype(np.int32).sum(axis=1))


def test_examples_accept_no_repack(q4_model):
    """-nr/--no-repack reaches the model in main.py (greedy text identical: the logits are) and the
    other programs take the flag."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "PYTHONPATH": str(root / "bindings")}
    outs = []
    for extra in ([], ["-nr"], ["--no-repack"]):
        r = subprocess.run([sys.executable, str(root / "examples" / "main.py"), "-m", str(q4_model), "-p", "hello",
                            "-n", "12", "--temp", "0", "-t", "2", "--ignore-eos", *extra],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] == outs[2] and outs[0].strip()
    for prog in ("batched.py", "perplexity.py", "server.py"):
        r = subprocess.run([sys.executable, str(root / "examples" / prog), "--help"], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0 and "--no-repack" in r.stdout, (prog, r.stderr[-500:])


def supported_levels():
    return [lv for lv in pi.CPU_ISA_LEVELS if pi.cpu_isa_supported(lv)]


def test_input_sparse_matmul_packed_alone_is_its_group_sums(pool2):
    """A Q4_0 down_t packed alone (up NULL: ffn_gate_t, pi_model_create packs it) is only added: the packed rows
    give the integer group sums over ranges (np_q4_0r_down), the file layout the exact f32 axpy chain; one token
    (fused: whole rows per range) and a batch (column tiles) alike, at every level this CPU runs."""
    E, F, T = 512, 2 * SPARSE_RANGE + 88, 3
    rng = np.random.default_rng(77)
    down_t = np_encode_q4_0(rng.standard_normal((F, E)) / np.sqrt(E))
    h = rng.standard_normal((T, F)).astype(np.float32)
    h[:, SPARSE_RANGE:2 * SPARSE_RANGE] = 0.1                     # the middle range: below the threshold
    threshold = 0.6
    w = ffi.new("pi_sparse_ffn_weights *")
    w.down_t = tensor(down_t, Q4_0)[0]
    n = lib.pi_sparse_pack_bytes(w, lib.PI_FFN_SEQ)
    assert n == E // 32 * 18 * F
    assert lib.pi_sparse_pack_bytes(w, lib.PI_FFN_PAR) == 0       # a gated mode needs gate and up
    d, q = q4_0_parts(down_t)
    ref = np.zeros((T, E), np.float32)
    for t in range(T):
        for r0 in range(0, F, SPARSE_RANGE):
            part = np.zeros(E, np.float32)
            for i in r0 + np.flatnonzero(np.abs(h[t, r0:r0 + SPARSE_RANGE]) >= threshold):
                part = fma32(np.repeat((h[t, i] * d[i]).astype(np.float32), 32), q[i], part)
            ref[t] = ref[t] + part
    ref_packed = np.stack([np_q4_0r_down(np.where(np.abs(h[t]) >= threshold, h[t], 0).astype(np.float32), d, q)
                           for t in range(T)])
    assert np.abs(ref_packed - ref).max() <= 0.01 * np.abs(ref).max()

    def run(weights, x):
        y = np.zeros((x.shape[0], E), np.float32)
        check(lib.pi_op_sparse_ffn(pool2, weights, lib.PI_ACT_SILU, lib.PI_FFN_SEQ, tensor(x), tensor(x), threshold,
                                   tensor(y), ffi.NULL))
        return y

    before = pi.cpu_isa()
    try:
        for level in supported_levels():
            pi.set_cpu_isa(level)
            buf = np.zeros(n, np.uint8)
            packed = ffi.new("pi_sparse_ffn_weights *")
            check(lib.pi_sparse_pack(w, lib.PI_FFN_SEQ, ffi.cast("void *", ffi.from_buffer(buf)), n, packed))
            assert packed.up.data == ffi.NULL and packed.gate.data == ffi.NULL
            for weights, layout, r in ((w, "file layout", ref), (packed, "packed", ref_packed)):
                assert_bit_equal(run(weights, h), r, f"{level}, {layout}: a batch vs its emulation")
                for t in range(T):
                    assert_bit_equal(run(weights, h[t:t + 1])[0], r[t], f"{level}, {layout}: token {t} alone")
    finally:
        pi.set_cpu_isa(before)
    q4_128 = np_encode_q4_0(rng.standard_normal((16, 128)))      # rows not a multiple of 256
    w.down_t = tensor(q4_128, Q4_0)[0]
    assert lib.pi_sparse_pack_bytes(w, lib.PI_FFN_SEQ) == 0


# q, k, v of one input: (type, rows) each; the weights are repacked where this CPU has a layout for them
MUL_MATS_CASES = {
    "q5_0 x3 (one activation format: one pass)": [(Q5_0, 64), (Q5_0, 16), (Q5_0, 32)],
    "q5_0, q8_0 (both Q8_0 activations: one pass)": [(Q5_0, 48), (Q8_0, 32)],
    "q4_K, q4_K, q6_K (two formats: one call each)": [(Q4_K, 32), (Q4_K, 16), (Q6_K, 16)],
    "q4_0 of 13 rows (not whole 16-row items: one call each)": [(Q4_0, 13), (Q4_0, 32)],
    "f16 alone": [(F16, 24)],
}


@pytest.mark.parametrize("case", MUL_MATS_CASES, ids=str)
@pytest.mark.parametrize("T", [1, 6])
def test_mul_mats_equal_mul_mat_each(pool2, case, T):
    """pi_op_mul_mats (the forward pass's q/k/v and gate/up) gives every weight pi_op_mul_mat's bits."""
    rng = np.random.default_rng(7 + T)
    K = 512
    x = rng.standard_normal((T, K)).astype(np.float32)
    ws, keep = [], []
    for t, n in MUL_MATS_CASES[case]:
        raw = quantize_rows(t, (rng.standard_normal((n, K)) / 16).astype(np.float32))
        w = wtensor(t, raw)
        keep.append(raw)
        if lib.pi_repack_bytes(w) > 0:
            w, buf = repacked_t(w)
            keep.append(buf)
        ws.append(w)
    ys = [np.zeros((T, w.ne[1]), np.float32) for w in ws]
    check(lib.pi_op_mul_mats(pool2, len(ws), ws, tensor(x), [tensor(y) for y in ys]))
    for w, y in zip(ws, ys):
        assert_bit_equal(y, mul_mat(pool2, w, x, w.ne[1]), f"{case}: {ffi.string(lib.pi_type_name(w.type)).decode()}")


def test_mul_mats_rejects_bad_arguments(pool2):
    w = tensor(np.zeros((16, 64), np.float32))
    x, y = np.zeros((1, 64), np.float32), np.zeros((1, 16), np.float32)
    expect_error(lib.pi_op_mul_mats(pool2, 0, [w], tensor(x), [tensor(y)]), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_op_mul_mats(pool2, 4, [w] * 4, tensor(x), [tensor(y)] * 4), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_op_mul_mats(pool2, 2, [w, w], tensor(x), [tensor(y), tensor(y[:, :8])]), lib.PI_ERR_INVALID_ARG)
    expect_error(lib.pi_op_mul_mats(pool2, 1, [w], tensor(x), ffi.NULL), lib.PI_ERR_INVALID_ARG)
