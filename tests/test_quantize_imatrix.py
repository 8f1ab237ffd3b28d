"""Quantizing with an importance matrix (tools/quantize.py --imatrix, powerinfer.quantize imatrix=, the C
pi_quantize_rows_imatrix): llama-quantize's file, byte for byte.

With llama-cpp-python: llama_model_quantize with params.imatrix (the llama_model_imatrix_data array llama-quantize
builds) and the same metadata keys (quantize.imatrix.*) against quantize_file on tiny models: an 8-layer llama of
n_embd 256 (every K-quant and the Q4_0 / Q5_0 ffn_down guard apply), an 8-expert MoE (each expert's slice of the
matrix), gemma3 at n_embd 128 (the K-quants fall back to the legacy types, quantized with the weights too).
Without it: the weighted quantizers against a numpy float64 evaluation of what they optimise (the weighted error is
no worse than the unweighted quantizer's on the weights it was given), the rules and the refusals.

Run: PYTHONPATH=bindings python -m pytest tests/test_quantize_imatrix.py -q
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

import powerinfer as pi
from powerinfer._ffi import PowerInferError, check, ffi, lib
from powerinfer.imatrix import Imatrix, ImatrixEntry, collect, quant_weights, write_imatrix
from powerinfer.quant_rules import parse_ftype
from powerinfer.quantize import QuantizeError, quantize_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from test_quantize import _arch_file, _moe8_file, assert_same_file, opts_for, ref_quantize, tool  # noqa: E402

sys.path.insert(0, str(REPO / "tools"))
from make_test_model import write_model  # noqa: E402

FTYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q3_K_S", "Q3_K_L", "Q2_K", "Q2_K_S", "Q4_K_S", "Q5_K_S", "Q4_0",
          "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M", "IQ3_XS"]
TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13,
         "q6_K": 14, "iq4_nl": 20, "iq4_xs": 23, "iq3_xxs": 18, "iq3_s": 21}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("qimatrix")
    files = {"llama": d / "llama-f16.gguf"}
    write_model(files["llama"], dtype="f16", n_vocab=320, n_embd=256, n_ff=256, n_head=4, n_head_kv=2, n_layer=8)
    files["gemma3"] = _arch_file(d / "gemma3-f32.gguf", "gemma3", "f32")
    files["moe8"] = _moe8_file(d)
    return files


@pytest.fixture(scope="module")
def imatrices(inputs):
    """Per model: an importance matrix collected on random tokens (the MoE's: random, with an expert never routed,
    whose weights are llama-quantize's ones)."""
    toks = np.random.default_rng(5).integers(3, 300, size=96).tolist()
    out = {m: quant_weights(collect(pi.Model(inputs[m]), toks, n_ctx=32, log=lambda s: None))
           for m in ("llama", "gemma3")}
    rng = np.random.default_rng(9)
    moe = {}
    for il in range(2):
        for k in ("attn_q", "attn_k", "attn_v", "attn_output"):
            moe[f"blk.{il}.{k}.weight"] = rng.gamma(1.0, 1.0, 256).astype(np.float32)
        for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            e = Imatrix(entries={"x": ImatrixEntry(rng.gamma(1.0, 1.0, (8, 256)).astype(np.float32),
                                                   np.array([5, 0, 3, 3, 1, 2, 9, 4]))}, chunk_size=1)
            moe[f"blk.{il}.{k}.weight"] = quant_weights(e)["x"]
    out["moe8"] = moe
    return out


def ref_with_imatrix(llama_cpp, src, dst, name, imatrix: dict, kv_overrides=(), **params):
    """llama_model_quantize with params.imatrix = imatrix (a {name: float32 array} as llama-quantize hands it)."""
    arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
    keep = []
    for i, (k, v) in enumerate(imatrix.items()):
        v = np.ascontiguousarray(v, dtype=np.float32)
        keep.append(v)
        arr[i].name = k.encode()
        arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        arr[i].size = v.size
    arr[len(imatrix)].name = None
    p_imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    return ref_quantize(llama_cpp, src, dst, name, kv_overrides=kv_overrides, imatrix=p_imatrix, **params)


@pytest.fixture(scope="module")
def llama_cpp():
    lc = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: no byte-for-byte comparison")
    if not hasattr(lc, "llama_model_imatrix_data"):
        pytest.skip("this llama-cpp-python has no llama_model_imatrix_data")
    return lc


CASES = [("llama", t) for t in FTYPES] + \
    [("moe8", t) for t in ("Q4_K_M", "Q2_K_S", "Q3_K_M", "Q4_0", "IQ4_XS", "IQ3_XS", "IQ3_M")] + \
    [("gemma3", t) for t in ("Q4_K_M", "Q6_K", "Q2_K", "Q5_0", "IQ4_XS", "IQ4_NL", "IQ3_S")]


@pytest.mark.parametrize("model,ftype", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_same_file_as_llama_cpp(llama_cpp, inputs, imatrices, tmp_path, model, ftype):
    qw = imatrices[model]
    ref = ref_with_imatrix(llama_cpp, inputs[model], tmp_path / "ref.gguf", ftype, qw)
    ours = tmp_path / "ours.gguf"
    quantize_file(inputs[model], ours, opts_for(ftype), nthread=2, imatrix=qw)
    assert_same_file(ours, ref)


IQ4_CASES = [(m, t) for m in ("llama", "moe8", "gemma3") for t in ("IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M")]


@pytest.mark.parametrize("model,ftype", IQ4_CASES, ids=[f"{m}-{t}" for m, t in IQ4_CASES])
def test_iq_without_imatrix_as_llama_cpp(llama_cpp, inputs, tmp_path, model, ftype):
    """IQ4_NL / IQ4_XS / IQ3_S / IQ3_M need no importance matrix: llama.cpp's searches (quantize_iq4_nl, _iq4_xs,
    _iq3_s) and its rules without one (IQ4: the first eighth of ffn_down in Q5_K)."""
    ref = ref_quantize(llama_cpp, inputs[model], tmp_path / "ref.gguf", ftype)
    ours = tmp_path / "ours.gguf"
    quantize_file(inputs[model], ours, opts_for(ftype), nthread=2)
    assert_same_file(ours, ref)


def test_partial_imatrix_and_prune_as_llama_cpp(llama_cpp, inputs, imatrices, tmp_path):
    """Tensors without an entry use the reference quantizers; --prune-layers looks entries up by the input's names."""
    qw = {k: v for k, v in imatrices["llama"].items() if "ffn" in k or "blk.3." in k}
    ref = ref_with_imatrix(llama_cpp, inputs["llama"], tmp_path / "ref.gguf", "Q4_K_M", qw, prune=[1, 2])
    ours = tmp_path / "ours.gguf"
    quantize_file(inputs["llama"], ours, opts_for("Q4_K_M"), nthread=2, imatrix=qw, prune_layers=[1, 2])
    assert_same_file(ours, ref)


def test_cli_as_llama_quantize(llama_cpp, inputs, imatrices, tmp_path):
    """tools/quantize.py --imatrix FILE --exclude-weights: llama-quantize's file, its quantize.imatrix.* keys too."""
    toks = np.random.default_rng(5).integers(3, 300, size=96).tolist()
    im = collect(pi.Model(inputs["llama"]), toks, n_ctx=32, dataset="data/t.txt", log=lambda s: None)
    f = tmp_path / "im.gguf"
    write_imatrix(f, im)
    ours = tmp_path / "ours.gguf"
    assert tool.main(["--imatrix", str(f), "--exclude-weights", "attn_v", "-q", str(inputs["llama"]), str(ours),
                      "Q4_K_M", "2"]) == 0
    qw = {k: v for k, v in quant_weights(im).items() if "attn_v" not in k}
    kv = [("quantize.imatrix.file", str(f)), ("quantize.imatrix.dataset", "data/t.txt"),
          ("quantize.imatrix.entries_count", len(qw)), ("quantize.imatrix.chunks_count", 3)]
    ref = ref_with_imatrix(llama_cpp, inputs["llama"], tmp_path / "ref.gguf", "Q4_K_M", qw, kv_overrides=kv)
    assert_same_file(ours, ref)


def _ggml_base(llama_cpp):
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    try:
        g = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    except OSError:
        pytest.skip("llama-cpp-python's libggml-base.so is not loadable")
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_void_p]
    g.ggml_quantize_init.argtypes = [ctypes.c_int]
    return g


ROW_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs",
             "iq3_xxs", "iq3_s"]


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("tname", ROW_TYPES)
def test_rows_as_ggml_quantize_chunk(llama_cpp, tname, weights):
    """Row by row against ggml_quantize_chunk (llama-cpp-python's libggml-base, what llama_model_quantize calls), with
    zero sub-blocks and a zero row (IQ3_S writes a zero sub-block's successor in its place; a zero K-quant block's
    min is +0)."""
    g = _ggml_base(llama_cpp)
    t = TYPES[tname]
    g.ggml_quantize_init(t)
    rng = np.random.default_rng(t)
    n, rows = 1024, 48
    x = (rng.standard_normal((rows, n)) * rng.gamma(1.0, 1.0, (rows, 1))).astype(np.float32)
    x[3, 32:64] = 0
    x[5] = 0
    x[7, 256:320] = 0
    x[9, ::7] *= 20
    qw = rng.gamma(0.5, 1.0, n).astype(np.float32) if weights else None
    rb = int(lib.pi_row_bytes(t, n))
    ref, ours = np.zeros(rows * rb, np.uint8), np.ones(rows * rb, np.uint8)
    g.ggml_quantize_chunk(t, x.ctypes.data, ref.ctypes.data, 0, rows, n, None if qw is None else qw.ctypes.data)
    check(lib.pi_quantize_rows_imatrix(t, ffi.from_buffer("float[]", x), ffi.from_buffer(ours), rows, n,
                                       ffi.NULL if qw is None else ffi.from_buffer("float[]", qw)))
    bad = np.flatnonzero(ref != ours)
    assert bad.size == 0, f"{tname}: {bad.size} bytes differ, first in row {bad[0] // rb}"


# ------------------------------------------------------------------ without the peer
def _weighted_err(t, x, qw):
    """sum qw (x - dequant(quant(x)))^2 of one row quantized with weights qw (None: the reference quantizer)."""
    n = len(x)
    rb = int(lib.pi_row_bytes(t, n))
    buf = np.empty(rb, np.uint8)
    check(lib.pi_quantize_rows_imatrix(t, ffi.from_buffer("float[]", x), ffi.from_buffer(buf), 1, n,
                                       ffi.from_buffer("float[]", qw) if qw is not None else ffi.NULL))
    y = np.empty(n, np.float32)
    check(lib.pi_dequantize_row(t, ffi.from_buffer(buf), ffi.from_buffer("float[]", y), n))
    return y


@pytest.mark.parametrize("tname", ["q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl",
                                   "iq4_xs", "iq3_xxs", "iq3_s"])
def test_weights_lower_the_weighted_error(tname):
    """Strongly uneven importance: the weighted quantizer's weighted squared error (float64) is below the reference
    quantizer's over many rows (what quantize_row_*_impl optimises; a type that ignored its weights would not)."""
    t = TYPES[tname]
    rng = np.random.default_rng(1)
    n, rows = 512, 24
    better = 0
    for _ in range(rows):
        x = rng.standard_normal(n).astype(np.float32)
        qw = (rng.gamma(0.3, 1.0, n) + 1e-3).astype(np.float32)
        e_w = float((qw.astype(np.float64) * (x - _weighted_err(t, x, qw)).astype(np.float64) ** 2).sum())
        e_r = float((qw.astype(np.float64) * (x - _weighted_err(t, x, None)).astype(np.float64) ** 2).sum())
        better += e_w < e_r
    assert better >= rows * 3 // 4, f"{tname}: weighted error lower in only {better} of {rows} rows"


def test_q8_0_ignores_the_weights():
    x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    a = _weighted_err(8, x, np.ones(64, np.float32) * 3)
    b = _weighted_err(8, x, None)
    np.testing.assert_array_equal(a, b)


def test_bad_calls():
    x = np.zeros(256, np.float32)
    buf = np.zeros(1024, np.uint8)
    with pytest.raises(PowerInferError, match="no quantizer with importance weights"):
        check(lib.pi_quantize_rows_imatrix(16, ffi.from_buffer("float[]", x), ffi.from_buffer(buf), 1, 256,
                                           ffi.from_buffer("float[]", x)))
    with pytest.raises(PowerInferError, match="cannot be stored"):
        check(lib.pi_quantize_rows_imatrix(12, ffi.from_buffer("float[]", x), ffi.from_buffer(buf), 1, 64,
                                           ffi.from_buffer("float[]", x)))


def test_rules_and_refusals(inputs, imatrices, tmp_path):
    """Q4_0 with an imatrix: the first eighth of ffn_down in Q4_1 (llama.cpp's guard); Q2_K_S without one is refused
    (--dry-run warns), so is an entry of the wrong size and a non-finite value."""
    qw = imatrices["llama"]
    res = quantize_file(inputs["llama"], None, opts_for("Q4_0"), dry_run=True, imatrix=qw)
    types = {p.name: p.dst_type for p in res.tensors}
    assert types["blk.0.ffn_down.weight"] == 3 and types["blk.1.ffn_down.weight"] == 2
    res = quantize_file(inputs["llama"], None, opts_for("Q4_0"), dry_run=True)
    assert {p.name: p.dst_type for p in res.tensors}["blk.0.ffn_down.weight"] == 2
    with pytest.raises(QuantizeError, match="requires an importance matrix"):
        quantize_file(inputs["llama"], tmp_path / "o.gguf", opts_for("Q2_K_S"))
    lines = []
    quantize_file(inputs["llama"], None, opts_for("Q2_K_S"), dry_run=True, log=lines.append)
    assert any("will require an imatrix" in s for s in lines)
    with pytest.raises(QuantizeError, match="requires an importance matrix"):   # an entry missing
        quantize_file(inputs["llama"], tmp_path / "o.gguf", opts_for("Q2_K_S"),
                      imatrix={k: v for k, v in qw.items() if "blk.0.attn_q" not in k})
    with pytest.raises(QuantizeError, match="is different from tensor size"):
        quantize_file(inputs["llama"], tmp_path / "o.gguf", opts_for("Q4_K_M"),
                      imatrix={**qw, "blk.0.attn_q.weight": np.ones(8, np.float32)})
    with pytest.raises(QuantizeError, match="non-finite"):
        quantize_file(inputs["llama"], tmp_path / "o.gguf", opts_for("Q4_K_M"),
                      imatrix={**qw, "blk.0.attn_q.weight": np.full(256, np.nan, np.float32)})
    assert not (tmp_path / "o.gguf").exists()
    assert parse_ftype("Q2_K_S") == ("Q2_K_S", 21)


def test_cli_refusals(inputs, tmp_path):
    out = str(tmp_path / "o.gguf")
    assert tool.main(["--imatrix", str(tmp_path / "none.gguf"), str(inputs["llama"]), out, "Q4_K_M"]) == 1
    assert tool.main(["--imatrix", "x", "--include-weights", "a", "--exclude-weights", "b", str(inputs["llama"]), out,
                      "Q4_K_M"]) == 1
    assert tool.main([str(inputs["llama"]), out, "IQ2_XXS"]) == 1
    assert tool.main([str(inputs["llama"]), out, "IQ3_XXS"]) == 1    # its attn_q / attn_k are IQ2_S
    assert tool.main([str(inputs["llama"]), out, "IQ3_XS"]) == 1     # IQ3_XXS tensors: an imatrix is required
