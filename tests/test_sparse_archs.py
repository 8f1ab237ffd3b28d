"""Sparse (PowerInfer) falcon and opt: small random PWRI files written here, the C forward pass
against an independent float64 numpy implementation of each architecture (spec 1.4, 4.1, 4.3)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from powerinfer._ffi import ffi, lib  # noqa: E402
from reference_model import ReferenceModel, layer_norm  # noqa: E402
from sparse_model import _encode  # noqa: E402
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, logits_all, rel_rms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_test_model import write_model  # noqa: E402

# with the predictor on, the quantization drift of the residual (the predictor's input) flips a few
# neurons that sit near the threshold; each flip moves the logits by a whole neuron's contribution
QUANT_PRED_REL_RMS = 8e-2
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]
SHAPE = dict(n_vocab=320, n_embd=64, n_ff=256, n_head=4)


# ---- writing test files ---------------------------------------------------------------------

def _tokenizer_fields(tmp: Path):
    """The tokenizer.* keys of the tiny llama test model (a SentencePiece vocabulary of n_vocab tokens)."""
    dense = tmp / "tok-source.gguf"
    if not dense.exists():
        write_model(dense, dtype="f32", seed=0, n_vocab=SHAPE["n_vocab"], n_embd=32, n_ff=64, n_head=2,
                    n_head_kv=2, n_layer=1)
    reader = GGUFReader(dense)
    return [(n, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
            for n, f in reader.fields.items() if n.startswith("tokenizer.")]


def arch_tensors(arch, *, n_vocab, n_embd, n_ff, n_head, n_head_kv, ranks, attn_norm_2, seed):
    """numpy float32 weights, numpy shape = reversed GGUF ne (row i of an [E, N] tensor = output i)."""
    rng = np.random.default_rng(seed)
    E, F, hd = n_embd, n_ff, n_embd // n_head
    Ekv = hd * n_head_kv

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def normw(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": rng.standard_normal((n_vocab, E)).astype(np.float32),
         "output_norm.weight": normw(E), "output_norm.bias": bias(E)}
    if arch == "falcon":
        t["output.weight"] = mat(n_vocab, E)
    else:
        t["position_embd.weight"] = (0.5 * rng.standard_normal((2050, E))).astype(np.float32)
    for il, r in enumerate(ranks):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"], t[p + "attn_norm.bias"] = normw(E), bias(E)
        if arch == "falcon":
            if attn_norm_2:
                t[p + "attn_norm_2.weight"], t[p + "attn_norm_2.bias"] = normw(E), bias(E)
            t[p + "attn_qkv.weight"] = mat(E + 2 * Ekv, E)
            t[p + "attn_output.weight"] = mat(E, E)
        else:
            for n, rows in (("q", E), ("k", Ekv), ("v", Ekv), ("output", E)):
                t[p + f"attn_{n}.weight"], t[p + f"attn_{n}.bias"] = mat(rows, E), bias(rows)
            t[p + "ffn_norm.weight"], t[p + "ffn_norm.bias"] = normw(E), bias(E)
            t[p + "ffn_up.bias"] = bias(F)
            t[p + "ffn_down_t.bias"] = bias(E)
        t[p + "ffn_up.weight"] = mat(F, E)
        t[p + "ffn_down_t.weight"] = (rng.standard_normal((F, E)) / np.sqrt(F)).astype(np.float32)
        t[p + "fc1.weight"] = mat(r, E)
        t[p + "fc2.weight"] = mat(F, r)
    return t


def write_arch_model(path, arch, *, dtype="f32", ranks=(32, 64), n_head_kv=None, attn_norm_2=True, seed=0,
                     drop=(), replace=None, pwri=True, eps="default") -> Path:
    """A small random PWRI falcon/opt file. drop: tensor names to leave out; replace: {name: array};
    eps: {arch}.attention.layer_norm_epsilon (default: 1e-5 for falcon, none for opt, as the converters)."""
    path = Path(path)
    n_head_kv = n_head_kv or (2 if arch == "falcon" else SHAPE["n_head"])
    tensors = arch_tensors(arch, **SHAPE, n_head_kv=n_head_kv, ranks=ranks, attn_norm_2=attn_norm_2, seed=seed)
    tensors.update(replace or {})
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(2048)
    w.add_embedding_length(SHAPE["n_embd"])
    w.add_feed_forward_length(SHAPE["n_ff"])
    w.add_block_count(len(ranks))
    w.add_head_count(SHAPE["n_head"])
    w.add_head_count_kv(n_head_kv)
    if eps == "default":
        eps = 1e-5 if arch == "falcon" else None
    if eps is not None:
        w.add_layer_norm_eps(eps)
    if arch == "falcon":
        w.add_string("falcon.tensor_data_layout", "jploski")
    for name, value, vtype, sub in _tokenizer_fields(path.parent):
        w.add_key_value(name, value, vtype, sub_type=sub)
    for name, arr in tensors.items():
        if name in drop:
            continue
        pred = name.endswith(("fc1.weight", "fc2.weight"))
        # f16 predictors keep the selection free of activation quantization (as tests/test_sparse.py)
        data, q = _encode(arr, "f16" if pred and dtype != "f32" else dtype)
        w.add_tensor(name, data, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if pwri:
        with open(path, "r+b") as f:
            f.write(b"PWRI")
    return path


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
