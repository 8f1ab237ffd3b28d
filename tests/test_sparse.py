"""Sparse (PowerInfer) inference: the predictor-guided FFN against numpy, and whole PWRI models
against the float64 reference (tests/reference_model.py), every supported dtype."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from powerinfer._ffi import ffi, lib  # noqa: E402
from reference_model import ReferenceModel, bf16_round, dequantize  # noqa: E402
from model_files import TYPES, write_sparse_model  # noqa: E402
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, logits_all, logits_one_by_one, rel_rms  # noqa: E402

DTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sparse")
    # f16 predictors keep the predictor's decisions free of activation quantization, so that
    # neurons near the threshold are selected the same way in C and in the float64 reference
    return {dt: write_sparse_model(d / f"tiny-{dt}.powerinfer.gguf", dtype=dt, pred_dtype="f16", seed=2)
            for dt in DTYPES}


# ---- whole models -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_model_matches_reference(sparse_files, dtype):
    model = pi.Model(sparse_files[dtype])
    assert model.sparse
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ours = logits_all(ctx, PROMPT)
    ref = ReferenceModel(sparse_files[dtype]).forward(PROMPT)
    assert rel_rms(ours, ref) < (FLOAT_REL_RMS if dtype in ("f32", "f16", "bf16") else QUANT_REL_RMS)
    active, total = ctx.sparse_stats()
    assert total == len(PROMPT) * model.hparams.n_ff
    assert 0 < active.min() and active.max() < total     # the predictor really skipped neurons


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_neurons_selected_equals_dense(sparse_files, dtype):
    """A threshold that selects every neuron gives exactly the dense computation of the same file,
    and that matches the reference's dense FFN."""
    model = pi.Model(sparse_files[dtype])
    every = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", sparse_threshold=-np.inf), PROMPT)
    dense = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", dense=True), PROMPT)
    assert np.array_equal(every, dense)
    ref = ReferenceModel(sparse_files[dtype])
    ref.use_predictor = False
    assert rel_rms(dense, ref.forward(PROMPT)) < (FLOAT_REL_RMS if dtype in ("f32", "f16", "bf16") else QUANT_REL_RMS)


def test_threshold_sources(sparse_files, monkeypatch, tmp_path):
    path = write_sparse_model(tmp_path / "thr.powerinfer.gguf", threshold=0.25, seed=2)
    model = pi.Model(path)
    assert model.sparse_threshold == pytest.approx(0.25)
    assert pi.Context(model, n_ctx=16).sparse_threshold == pytest.approx(0.25)
    monkeypatch.setenv("LLAMA_SPARSE_PRED_THRESHOLD", "0.5")
    assert pi.Context(model, n_ctx=16).sparse_threshold == pytest.approx(0.5)
    assert pi.Context(model, n_ctx=16, sparse_threshold=-1.0).sparse_threshold == -1.0
    monkeypatch.setenv("LLAMA_SPARSE_PRED_THRESHOLD", "abc")
    with pytest.raises(ValueError, match="LLAMA_SPARSE_PRED_THRESHOLD"):
        pi.Context(model, n_ctx=16)


def test_higher_threshold_computes_fewer_neurons(sparse_files):
    model = pi.Model(sparse_files["f32"])
    fractions = []
    for thr in (-1.0, 0.0, 1.0):
        ctx = pi.Context(model, n_ctx=64, sparse_threshold=thr)
        ctx.decode(PROMPT)
        active, total = ctx.sparse_stats()
        fractions.append(active.sum() / (total * len(active)))
    assert fractions[0] > fractions[1] > fractions[2]


def test_sparse_batch_equals_token_by_token(sparse_files):
    model = pi.Model(sparse_files["q4_0"])
    batched = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    single = logits_one_by_one(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    np.testing.assert_allclose(single, batched, rtol=0, atol=1e-5)


def test_sparse_thread_counts_identical(sparse_files):
    model = pi.Model(sparse_files["q8_0"])
    outs = [logits_all(pi.Context(model, n_ctx=64, n_threads=n, kv_type="f32"), PROMPT) for n in (1, 2, 3)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


# ---- the op -------------------------------------------------------------------------------

def _tensor(arr: np.ndarray, ggml_type=lib.PI_TYPE_F32, ne=None):
    t = ffi.new("pi_tensor *")
    t.type = ggml_type
    ne = list(ne or reversed(arr.shape))
    t.n_dims = len(ne)
    for i in range(4):
        t.ne[i] = ne[i] if i < len(ne) else 1
    bs, bb = lib.pi_type_block_size(ggml_type), lib.pi_type_block_bytes(ggml_type)
    t.nb[0] = bb
    t.nb[1] = t.ne[0] // bs * bb
    t.nb[2] = t.nb[1] * t.ne[1]
    t.nb[3] = t.nb[2] * t.ne[2]
    t.data = ffi.from_buffer(arr)
    return t


def _weight(w: np.ndarray, dtype: str):
    """(tensor, dequantized float64 weights, keep-alive buffer) for a float matrix w (rows, cols)."""
    from gguf.quants import quantize
    q = TYPES[dtype]
    raw = w.astype(np.float32) if dtype == "f32" else (w.astype(np.float16) if dtype == "f16" else quantize(w, q))
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    deq = dequantize(raw, int(q), [w.shape[1], w.shape[0]])
    return _tensor(raw, int(q), ne=[w.shape[1], w.shape[0]]), deq, raw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gate_mode", ["par", "sym", "seq"])
def test_sparse_ffn_op_with_oracle_mask(dtype, gate_mode):
    """With an oracle mask as the scores, the op equals the masked dense FFN."""
    rng = np.random.default_rng(7)
    E, F, T = 64, 96, 5
    gate, up, down_t = (rng.standard_normal((F, E)).astype(np.float32) / 8 for _ in range(3))
    (tg, g, kg), (tu, u, ku), (td, d, kd) = _weight(gate, dtype), _weight(up, dtype), _weight(down_t, dtype)
    x = rng.standard_normal((T, E)).astype(np.float32)
    mask = rng.random((T, F)) < 0.3
    scores = np.where(mask, 1.0, -1.0).astype(np.float32)
    out = np.zeros((T, E), np.float32)
    w = ffi.new("pi_sparse_ffn_weights *")
    w.gate, w.up, w.down_t = tg[0], tu[0], td[0]
    mode = {"par": lib.PI_FFN_PAR, "sym": lib.PI_FFN_SYM, "seq": lib.PI_FFN_SEQ}[gate_mode]
    n_active = ffi.new("int64_t *")
    st = lib.pi_op_sparse_ffn(ffi.NULL, w, lib.PI_ACT_RELU, mode, _tensor(x), _tensor(scores), 0.0, _tensor(out),
                              n_active)
    assert st == 0, ffi.string(lib.pi_last_error())
    assert n_active[0] == mask.sum()
    x64 = bf16_round(x) if dtype == "bf16" and pi.bf16_dot() else x.astype(np.float64)   # bf16 activations
    a_up = x64 @ u.T
    relu = lambda v: np.maximum(v, 0.0)  # noqa: E731
    h = {"par": relu(x64 @ g.T) * a_up, "sym": relu(x64 @ g.T) * relu(a_up), "seq": relu(a_up)}[gate_mode]
    expected = np.where(mask, h, 0.0) @ d
    tol = FLOAT_REL_RMS * 10 if dtype in ("f32", "f16", "bf16") else QUANT_REL_RMS
    assert rel_rms(out, expected) < tol


def test_predictor_op_matches_numpy():
    rng = np.random.default_rng(3)
    E, r, F, T = 64, 32, 96, 4
    fc1 = rng.standard_normal((r, E)).astype(np.float32)
    fc2 = rng.standard_normal((F, r)).astype(np.float32)
    x = rng.standard_normal((T, E)).astype(np.float32)
    scores = np.zeros((T, F), np.float32)
    st = lib.pi_op_predictor(ffi.NULL, _tensor(fc1), _tensor(fc2), _tensor(x), _tensor(scores))
    assert st == 0
    np.testing.assert_allclose(scores, np.maximum(x @ fc1.T, 0) @ fc2.T, rtol=1e-4, atol=1e-4)


# ---- bad input ----------------------------------------------------------------------------

def test_pwri_without_predictor_is_refused(tmp_path):
    path = write_sparse_model(tmp_path / "nopred.powerinfer.gguf", seed=1, predictors=False)
    with pytest.raises(pi.ModelLoadError, match="fc1"):
        pi.Model(path)


def test_sparse_needs_relu(tmp_path):
    path = write_sparse_model(tmp_path / "silu.powerinfer.gguf", seed=1)
    # flip the activation key to silu in place: same length string 'relu' -> 'silu'
    data = bytearray(path.read_bytes())
    key = b"powerinfer.ffn_activation"
    i = data.find(key)
    j = data.find(b"relu", i)
    data[j:j + 4] = b"silu"
    path.write_bytes(bytes(data))
    with pytest.raises(pi.ModelLoadError, match="ReLU"):
        pi.Model(path)


PACKED_TOL = 2e-2


def test_packed_sparse_ffn_model(tmp_path):
    """q4_0 with n_embd a multiple of 256: the loader packs each neuron's rows together
    (pi_sparse_pack). The packed model matches the file layout (tested against the reference above) within
    PACKED_TOL: its dot products differ in the last bits and its down_t rows are added in integer groups with
    14-bit coefficients (arch/q4_0r.c; 1e-4 of an FFN output, measured 7.5e-3 on these logits); and it keeps the
    exact properties: every neuron selected == dense, and
    the same bits for every thread count; batches agree with token-by-token decoding."""
    path = write_sparse_model(tmp_path / "packed.powerinfer.gguf", dtype="q4_0", pred_dtype="f16", seed=4,
                              n_embd=256, n_ff=1100)
    packed, plain = pi.Model(path), pi.Model(path, repack=False)
    assert (packed.n_packed_ffn, plain.n_packed_ffn) == (2, 0)
    assert pi.Model(write_sparse_model(tmp_path / "e64.powerinfer.gguf", dtype="q4_0")).n_packed_ffn == 0  # n_embd 64
    ours = logits_all(pi.Context(packed, n_ctx=64, kv_type="f32"), PROMPT)
    file_layout = logits_all(pi.Context(plain, n_ctx=64, kv_type="f32"), PROMPT)
    assert 0 < rel_rms(ours, file_layout) < PACKED_TOL
    every = logits_all(pi.Context(packed, n_ctx=64, kv_type="f32", sparse_threshold=-np.inf), PROMPT)
    assert np.array_equal(every, logits_all(pi.Context(packed, n_ctx=64, kv_type="f32", dense=True), PROMPT))
    outs = [logits_all(pi.Context(packed, n_ctx=64, n_threads=n, kv_type="f32"), PROMPT) for n in (1, 2, 3)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    steps = logits_one_by_one(pi.Context(packed, n_ctx=64, kv_type="f32"), PROMPT)
    np.testing.assert_allclose(steps, ours, rtol=0, atol=1e-5 * np.abs(ours).max())



def test_neuron_counts(tmp_path):
    """count_neurons counts, per neuron of the file, the tokens that computed it: the same totals as
    sparse_stats, every neuron for every token with dense=True, zeroed by sparse_stats_reset."""
    path = write_sparse_model(tmp_path / "c.powerinfer.gguf", dtype="q4_0", pred_dtype="f16", seed=4,
                              n_embd=256, n_ff=1100)
    model = pi.Model(path)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", count_neurons=True)
    ours = logits_all(ctx, PROMPT)
    counts = ctx.neuron_counts()
    active, _ = ctx.sparse_stats()
    assert counts.shape == (2, 1100) and counts.max() <= len(PROMPT)
    assert np.array_equal(counts.sum(axis=1), active) and 0 < active.min()
    assert 0 < (counts == 0).sum() and 0 < (counts == len(PROMPT)).sum()         # cold and always-on neurons
    plain = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    assert np.array_equal(ours, plain)                                         # counting changes nothing
    ctx.sparse_stats_reset()
    assert not ctx.neuron_counts().any()
    steps = pi.Context(model, n_ctx=64, kv_type="f32", count_neurons=True)
    logits_one_by_one(steps, PROMPT)
    assert np.array_equal(steps.neuron_counts(), counts)            # batch or token by token: the same choices
    every = pi.Context(model, n_ctx=64, kv_type="f32", dense=True, count_neurons=True)
    every.decode(PROMPT)
    assert (every.neuron_counts() == len(PROMPT)).all()
    with pytest.raises(pi.PowerInferError, match="count_neurons"):
        pi.Context(model, n_ctx=8).neuron_counts()
    c = ffi.new("int64_t[]", 1100)
    for il in (-1, 2):
        assert lib.pi_neuron_counts(ctx._ptr, il, c) == lib.PI_ERR_INVALID_ARG
        assert "out of range" in ffi.string(lib.pi_last_error()).decode()


def test_profile_sparse_tool(tmp_path, capsys):
    """tools/profile_sparse.py: the engine's neuron counts as activation_N.pt next to the model, in the
    format the GPU split reads; bad input is one line on stderr and exit 1."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import profile_sparse
    from powerinfer import gpu_split
    path = write_sparse_model(tmp_path / "p.powerinfer.gguf", dtype="q4_0", pred_dtype="f16", seed=4,
                              n_embd=256, n_ff=1100)
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 8)
    assert profile_sparse.main([str(path), str(text), "--ctx", "32", "-t", "2"]) == 0
    acts = np.stack(gpu_split.load_activations(tmp_path / "activation", 2, 1100))
    model = pi.Model(path)
    args = profile_sparse._parser().parse_args([str(path), str(text), "--ctx", "32"])
    windows = profile_sparse.token_windows(model, args)
    assert len(windows) > 1 and all(w[0] == model.tokenizer.bos_id and len(w) <= 32 for w in windows)
    ctx = pi.Context(model, n_ctx=32, count_neurons=True)
    for w in windows:
        ctx.kv_clear()
        ctx.decode(w, logits="none")
    assert np.array_equal(acts, ctx.neuron_counts()) and acts.sum() > 0
    assert "hottest 10% share" in capsys.readouterr().out
    assert profile_sparse.main([str(path), "--random", "40", "--out", str(tmp_path / "r")]) == 0
    assert np.stack(gpu_split.load_activations(tmp_path / "r", 2, 1100)).sum() > 0
    for args in ([str(path)], [str(path), str(tmp_path / "missing.txt")],
                 [str(tmp_path / "none.gguf"), "--random", "4"], [str(path), "--random", "4", "--ctx", "1"]):
        capsys.readouterr()
        assert profile_sparse.main(args) == 1
        err = capsys.readouterr().err
        assert err.startswith("profile_sparse: error: ") and err.count("\n") == 1
