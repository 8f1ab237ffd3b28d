"""Sparse (PowerInfer) falcon and opt: small random PWRI files (model_files), the C forward pass
against the independent float64 numpy implementation of each architecture (reference_model;
spec 1.4, 4.1, 4.3)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from powerinfer._ffi import ffi, lib  # noqa: E402
from reference_model import ReferenceModel, layer_norm  # noqa: E402
from model_files import SPARSE_ARCH_SHAPE as SHAPE  # noqa: E402
from model_files import write_sparse_arch_model as write_arch_model  # noqa: E402
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, logits_all, rel_rms  # noqa: E402

# with the predictor on, the quantization drift of the residual (the predictor's input) flips a few
# neurons that sit near the threshold; each flip moves the logits by a whole neuron's contribution
QUANT_PRED_REL_RMS = 8e-2
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]


# ---- tests ----------------------------------------------------------------------------------

CASES = [("falcon", "f32"), ("falcon", "q8_0"), ("opt", "f32"), ("opt", "q8_0")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("archs")
    return {(a, dt): write_arch_model(d / f"tiny-{a}-{dt}.powerinfer.gguf", a, dtype=dt, seed=3)
            for a, dt in CASES}


def test_layer_norm_op_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 96)).astype(np.float32) * 3 + 1.5
    w = rng.standard_normal(96).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    for eps, ww, bb in ((1e-5, w, b), (0.0, None, None), (1e-2, w, None)):
        out = np.empty_like(x)
        wt = _view(ww) if ww is not None else ffi.NULL
        bt = _view(bb) if bb is not None else ffi.NULL
        assert lib.pi_op_layer_norm(ffi.NULL, _view(x), wt, bt, eps, _view(out)) == 0, ffi.string(lib.pi_last_error())
        x64 = x.astype(np.float64)
        ref = layer_norm(x64, 1.0 if ww is None else ww.astype(np.float64), 0.0 if bb is None else bb, eps)
        assert np.max(np.abs(out - ref)) < 1e-5 * max(1.0, np.max(np.abs(ref)))
    # in place, and a bad bias shape
    y = x.copy()
    yt = _view(y)
    assert lib.pi_op_layer_norm(ffi.NULL, yt, _view(w), _view(b), 1e-5, yt) == 0
    assert np.allclose(y, layer_norm(x.astype(np.float64), w, b, 1e-5), atol=1e-5)
    assert lib.pi_op_layer_norm(ffi.NULL, _view(x), _view(w), _view(b[:10]), 1e-5, _view(np.empty_like(x))) != 0
    assert "bias" in ffi.string(lib.pi_last_error()).decode()


_keep = []


def _view(a: np.ndarray):
    a = np.ascontiguousarray(a)
    _keep.append(a)
    t = ffi.new("pi_tensor *")
    t.type = lib.PI_TYPE_F32
    t.n_dims = a.ndim
    ne = list(reversed(a.shape)) + [1] * (4 - a.ndim)
    for i in range(4):
        t.ne[i] = ne[i]
    t.nb[0] = 4
    for i in range(1, 4):
        t.nb[i] = t.nb[i - 1] * t.ne[i - 1]
    t.data = ffi.cast("void *", a.ctypes.data)
    _keep.append(t)
    return t


@pytest.mark.parametrize("arch,dtype", CASES)
def test_arch_matches_reference(files, arch, dtype):
    model = pi.Model(files[arch, dtype])
    assert model.sparse and model.hparams.arch == arch and model.hparams.ffn_gate == "seq"
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ours = logits_all(ctx, PROMPT)
    ref = ReferenceModel(files[arch, dtype]).forward(PROMPT)
    assert rel_rms(ours, ref) < (FLOAT_REL_RMS if dtype == "f32" else QUANT_PRED_REL_RMS)
    active, total = ctx.sparse_stats()
    assert total == len(PROMPT) * model.hparams.n_ff
    assert 0 < active.min() and active.max() < total     # the predictor really skipped neurons


@pytest.mark.parametrize("arch,dtype", CASES)
def test_arch_every_neuron(files, arch, dtype):
    model = pi.Model(files[arch, dtype])
    every = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", sparse_threshold=-np.inf), PROMPT)
    dense = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", dense=True), PROMPT)
    assert np.array_equal(every, dense)
    ref = ReferenceModel(files[arch, dtype], use_predictor=False).forward(PROMPT)
    assert rel_rms(dense, ref) < (FLOAT_REL_RMS if dtype == "f32" else QUANT_REL_RMS)
    # the predictor changes the result (it does skip neurons)
    assert not np.allclose(dense, logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT))


@pytest.mark.parametrize("arch", ["falcon", "opt"])
def test_arch_batch_equals_token_by_token(files, arch):
    model = pi.Model(files[arch, "f32"])
    batch = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    steps = []
    for tok in PROMPT:
        ctx.decode([tok], logits="all")
        steps.append(ctx.logits(0))
    assert rel_rms(np.stack(steps), batch) < 1e-5


def test_falcon_without_attn_norm_2(tmp_path):
    path = write_arch_model(tmp_path / "f7b.powerinfer.gguf", "falcon", attn_norm_2=False, n_head_kv=1, seed=5)
    model = pi.Model(path)
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < FLOAT_REL_RMS


def test_opt_position_past_learned_table(files):
    ctx = pi.Context(pi.Model(files["opt", "f32"]), n_ctx=4096, kv_type="f32")
    ctx.decode([1], pos=[2047])     # the last learned position (row 2049)
    with pytest.raises(pi.PowerInferError, match="position"):
        ctx.decode([1], pos=[2048])


@pytest.mark.parametrize("arch,drop,match", [
    ("falcon", ("blk.1.fc1.weight",), "fc1"),
    ("opt", ("blk.0.fc1.weight",), "fc1"),
    ("opt", ("position_embd.weight",), "position_embd"),
    ("opt", ("blk.1.ffn_up.bias",), "ffn_up.bias"),
    ("falcon", ("output_norm.bias",), "output_norm.bias"),
    ("falcon", ("blk.0.attn_norm_2.bias",), "attn_norm_2.bias"),
])
def test_missing_tensors(tmp_path, arch, drop, match):
    path = write_arch_model(tmp_path / "bad.powerinfer.gguf", arch, drop=drop)
    with pytest.raises(pi.ModelLoadError, match=match):
        pi.Model(path)


def test_wrong_qkv_shape(tmp_path):
    E = SHAPE["n_embd"]
    bad = np.zeros((3 * E, E), np.float32)    # [E, 3E]: the shape of a model without GQA, here n_head_kv = 2
    path = write_arch_model(tmp_path / "bad.powerinfer.gguf", "falcon", replace={"blk.0.attn_qkv.weight": bad})
    with pytest.raises(pi.ModelLoadError, match=r"attn_qkv.*shape"):
        pi.Model(path)


def test_dense_falcon_opt_refused(tmp_path):
    for arch in ("falcon", "opt"):
        path = write_arch_model(tmp_path / f"{arch}.gguf", arch, pwri=False)
        with pytest.raises(pi.ModelLoadError, match="dense falcon/opt not supported"):
            pi.Model(path)


def test_falcon_needs_layer_norm_eps(tmp_path):
    path = write_arch_model(tmp_path / "noeps.powerinfer.gguf", "falcon", eps=None)
    with pytest.raises(pi.ModelLoadError, match="falcon.attention.layer_norm_epsilon"):
        pi.Model(path)


def test_opt_eps_default_and_key(tmp_path):
    """opt files carry no epsilon (the original then uses 0.0); we use HF's 1e-5, or the key when present."""
    assert pi.Model(write_arch_model(tmp_path / "a.powerinfer.gguf", "opt")).hparams.norm_eps == pytest.approx(1e-5)
    path = write_arch_model(tmp_path / "b.powerinfer.gguf", "opt", eps=1e-3)
    assert pi.Model(path).hparams.norm_eps == pytest.approx(1e-3)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < FLOAT_REL_RMS
