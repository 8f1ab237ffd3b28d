"""tools/quantize.py (powerinfer.quantize, powerinfer.quant_rules): llama-quantize's file, byte for byte.

With llama-cpp-python installed, every supported file type of tiny random models (a llama of 8 layers and n_embd 256
so that the K-quants and Q4_K_M's "use_more_bits" layers apply; a tied qwen2; gemma3 at n_embd 128, where every
K-quant falls back; a llama of n_embd 80, where the 32-element types fall back to f16; an 8-expert MoE; phi3's fused
attn_qkv; a dense falcon; an 80-layer llama with GQA, llama.cpp's "70B") is compared with
llama_cpp.llama_model_quantize on the same input: the same tensors (names, order, types, shapes, data), the same
metadata (general.file_type, general.quantization_version), the same bytes. So are the options (--pure,
--leave-output-tensor, --output-tensor-type, --token-embedding-type, --tensor-type, --allow-requantize,
--prune-layers, --override-kv, COPY).

Without the peer: the types llama.cpp's rules give (written out below for the llama), the metadata, each tensor's
weights within its type's error bound, the logits of every type against the f16 model within a per-type tolerance,
greedy generation, PowerInfer (PWRI) files, and the errors of bad input.

Run: PYTHONPATH=bindings python -m pytest tests/test_quantize.py -q
"""
from __future__ import annotations

import ctypes
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from helpers import logits_all, rel_rms
from model_files import CONFIGS, make_weights, rewrite, write_arch_model, write_gguf, write_sparse_model

import powerinfer as pi
from powerinfer._ffi import ffi, lib
from powerinfer.gguf_file import open_gguf
from powerinfer.quant_rules import FTYPE, QuantOptions, parse_ftype
from powerinfer.quantize import QuantizeError, quantize_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from make_test_model import add_vocab, synthetic_vocab, write_model  # noqa: E402

_spec = importlib.util.spec_from_file_location("quantize_tool", REPO / "tools" / "quantize.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

FTYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
          "Q5_K_M", "Q6_K", "F16", "BF16", "F32", "COPY"]
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12]
F32, F16, Q4_0, Q5_0, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 6, 8, 11, 12, 13, 14, 30


def opts_for(name: str, **kw) -> QuantOptions:
    return QuantOptions(ftype=parse_ftype(name)[1], only_copy=name == "COPY", **kw)


# ------------------------------------------------------------------ input files
def _arch_file(path, arch, dtype, **config):
    """write_arch_model with CONFIGS[arch] changed by config."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CONFIGS, arch, {**CONFIGS[arch], **config})
        write_arch_model(path, arch, dtype=dtype)
    return path


def _moe8_file(d: Path) -> Path:
    """A llama of 8 experts (Mixtral's rules: attn_v / attn_k in Q8_0, attn_output in Q5_K), n_embd 256."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(CONFIGS, "llama", {**CONFIGS["llama"], "n_embd": 256, "n_ff": 256, "head_dim": 64, "n_layer": 2})
        w = make_weights("llama", 3)
        rng = np.random.default_rng(7)
        for il in range(2):
            p = f"blk.{il}."
            for k in ("ffn_gate", "ffn_up", "ffn_down"):
                del w[p + k + ".weight"]
            w[p + "ffn_gate_inp.weight"] = rng.standard_normal((8, 256)).astype(np.float32)
            for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                w[p + k + ".weight"] = (rng.standard_normal((8, 256, 256)) / 16).astype(np.float32)
        write_arch_model(d / "moe-keys.gguf", "llama", weights=w, dtype="f16")
    return rewrite(d / "moe-keys.gguf", d / "moe8.gguf",
                   meta={"llama.expert_count": (8, VT.UINT32), "llama.expert_used_count": (2, VT.UINT32)})


def _falcon_file(path: Path) -> Path:
    """A dense falcon (llama.cpp's names: fused attn_qkv, no gate) of 16 layers: falcon's own Q3_K / Q4_K rules."""
    rng = np.random.default_rng(5)
    E, F, V = 256, 256, 320
    t = {"token_embd.weight": rng.standard_normal((V, E)), "output_norm.weight": np.ones(E),
         "output_norm.bias": np.zeros(E), "output.weight": rng.standard_normal((V, E)) / 16}
    for il in range(16):
        p = f"blk.{il}."
        t.update({p + "attn_norm.weight": np.ones(E), p + "attn_norm.bias": np.zeros(E),
                  p + "attn_qkv.weight": rng.standard_normal((E + 128, E)) / 16,
                  p + "attn_output.weight": rng.standard_normal((E, E)) / 16,
                  p + "ffn_up.weight": rng.standard_normal((F, E)) / 16,
                  p + "ffn_down.weight": rng.standard_normal((E, F)) / 16})

    def keys(w):
        w.add_context_length(2048)
        w.add_embedding_length(E)
        w.add_feed_forward_length(F)
        w.add_block_count(16)
        w.add_head_count(4)
        w.add_head_count_kv(1)
        w.add_layer_norm_eps(1e-5)
        add_vocab(w, *synthetic_vocab(V))
    return write_gguf(path, "falcon", {k: v.astype(np.float32) for k, v in t.items()}, keys=keys, dtype="f16")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("quantize")
    files = {}
    files["llama"] = d / "llama-f16.gguf"
    write_model(files["llama"], dtype="f16", n_vocab=320, n_embd=256, n_ff=256, n_head=4, n_head_kv=2, n_layer=8)
    files["qwen2"] = _arch_file(d / "qwen2-f32.gguf", "qwen2", "f32", n_embd=256, n_ff=256, head_dim=64)
    files["gemma3"] = _arch_file(d / "gemma3-f32.gguf", "gemma3", "f32")
    files["odd"] = d / "odd-f32.gguf"
    write_model(files["odd"], dtype="f32", n_vocab=320, n_embd=80, n_ff=160, n_head=4, n_head_kv=2, n_layer=2)
    files["phi3"] = _arch_file(d / "phi3-f16.gguf", "phi3", "f16", n_embd=256, n_ff=256, n_layer=9)
    files["moe8"] = _moe8_file(d)
    files["gptoss"] = _arch_file(d / "gptoss-f32.gguf", "gpt-oss", "f32")
    files["falcon"] = _falcon_file(d / "falcon-f16.gguf")
    # what llama.cpp calls a 70B (80 layers, GQA): attn_v's Q3_K / Q4_K become Q5_K (here, rows of 32: Q5_1)
    files["l80"] = d / "l80-f16.gguf"
    write_model(files["l80"], dtype="f16", n_vocab=320, n_embd=32, n_ff=64, n_head=4, n_head_kv=2, n_layer=80)
    return files


# ------------------------------------------------------------------ the peer
@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: no byte-for-byte comparison")


def ref_quantize(llama_cpp, src, dst, name: str, *, nthread=2, tensor_types=(), kv_overrides=(), prune=(), **params):
    """llama_cpp.llama_model_quantize: `name` as llama-quantize takes it, params its struct's fields."""
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = parse_ftype(name)[1], nthread
    p.only_copy = name == "COPY"
    for k, v in params.items():
        setattr(p, k, v)
    keep = []
    if tensor_types:
        arr = (llama_cpp.llama_model_tensor_override * (len(tensor_types) + 1))()
        for i, (pat, t) in enumerate(tensor_types):
            arr[i].pattern, arr[i].type = pat.encode(), t
        arr[len(tensor_types)].pattern = None
        p.tt_overrides = ctypes.cast(arr, type(p.tt_overrides))
        keep.append(arr)
    if kv_overrides:
        arr = (llama_cpp.llama_model_kv_override * (len(kv_overrides) + 1))()
        for i, (k, v) in enumerate(kv_overrides):
            arr[i].key = k.encode()
            if isinstance(v, bool):
                arr[i].tag, arr[i].value.val_bool = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, v
            elif isinstance(v, int):
                arr[i].tag, arr[i].value.val_i64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, v
            elif isinstance(v, float):
                arr[i].tag, arr[i].value.val_f64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT, v
            else:
                arr[i].tag, arr[i].value.val_str = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, v.encode()
        arr[len(kv_overrides)].key = b""
        p.kv_overrides = ctypes.cast(arr, type(p.kv_overrides))
        keep.append(arr)
    if prune:
        arr = (ctypes.c_int * (len(prune) + 1))(*prune, -1)
        p.prune_layers = ctypes.cast(arr, type(p.prune_layers))
        keep.append(arr)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    assert rc == 0, f"llama.cpp could not quantize {src} as {name}"
    return dst


def assert_same_file(ours: Path, ref: Path) -> None:
    """Tensor by tensor (names and order, types, shapes, bytes), the metadata, then the whole file."""
    a, b = open_gguf(ours), open_gguf(ref)
    assert list(a.tensors) == list(b.tensors), "tensor names / order differ"
    for name, ta in a.tensors.items():
        tb = b.tensors[name]
        assert (ta.type, ta.ne) == (tb.type, tb.ne), f"{name}: type/shape {ta.type} {ta.ne} vs llama.cpp's " \
                                                     f"{tb.type} {tb.ne}"
        assert np.array_equal(ta.data, tb.data), f"{name} ({ta.type}): data differ from llama.cpp's"
    assert "general.file_type" in b.metadata and "general.quantization_version" in b.metadata
    assert a.metadata == b.metadata
    assert list(a.metadata) == list(b.metadata)
    assert ours.read_bytes() == ref.read_bytes(), "same tensors and metadata, yet the files differ"


def _both(llama_cpp, tmp_path, src, name, *, tensor_types=(), kv_overrides=(), prune=(), **params):
    """(ours, llama.cpp's) of the same quantization."""
    ref = ref_quantize(llama_cpp, src, tmp_path / "ref.gguf", name, tensor_types=tensor_types,
                       kv_overrides=kv_overrides, prune=prune, **params)
    o = opts_for(name, pure=params.get("pure", False),
                 quantize_output_tensor=params.get("quantize_output_tensor", True),
                 output_tensor_type=params.get("output_tensor_type"),
                 token_embedding_type=params.get("token_embedding_type"), tensor_types=list(tensor_types))
    ours = tmp_path / "ours.gguf"
    quantize_file(src, ours, o, nthread=2, allow_requantize=params.get("allow_requantize", False),
                  kv_overrides=list(kv_overrides), prune_layers=list(prune))
    return ours, ref


CASES = [(m, t) for m in ("llama", "qwen2", "gemma3") for t in FTYPES] + \
        [("odd", t) for t in ("Q4_K_M", "Q4_0", "Q5_1", "Q6_K", "Q2_K")] + \
        [("moe8", t) for t in ("Q4_K_M", "Q3_K_M", "Q2_K", "Q4_K_S", "Q8_0", "MXFP4_MOE")] + \
        [("gptoss", "MXFP4_MOE"), ("gptoss", "Q4_K_M"), ("llama", "MXFP4_MOE")] + \
        [("phi3", t) for t in ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q3_K_L", "Q2_K")] + \
        [("falcon", t) for t in ("Q4_K_M", "Q3_K_M", "Q3_K_L", "Q4_K_S")] + \
        [("l80", t) for t in ("Q3_K_M", "Q4_K_S", "Q4_K_M")]


@pytest.mark.parametrize("model,ftype", CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_same_file_as_llama_cpp(llama_cpp, inputs, tmp_path, model, ftype):
    assert_same_file(*_both(llama_cpp, tmp_path, inputs[model], ftype))


OPTION_CASES = {
    "pure": ("Q4_K_M", dict(pure=True)),
    "leave-output-tensor": ("Q4_K_M", dict(quantize_output_tensor=False)),
    "output-and-embedding-types": ("Q4_K_M", dict(output_tensor_type=Q8_0, token_embedding_type=Q4_0)),
    "tensor-types": ("Q3_K_M", dict(tensor_types=[(r"blk\.1\.attn_v", Q8_0), ("attn_q", Q5_0), ("ffn_up", Q6_K)])),
    "tensor-types-with-f16": ("F16", dict(tensor_types=[("attn_q", Q8_0)])),   # ignored: F16 is not quantized
    "prune-layers": ("Q4_K_M", dict(prune=[1, 5])),
    "override-kv": ("Q5_K_M", dict(kv_overrides=[("general.name", "renamed"), ("llama.context_length", -1024),
                                                 ("llama.rope.freq_base", 5e5), ("general.file_type", 3),
                                                 ("tokenizer.ggml.add_bos_token", False)])),
}


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_options_as_llama_cpp(llama_cpp, inputs, tmp_path, case):
    name, params = OPTION_CASES[case]
    assert_same_file(*_both(llama_cpp, tmp_path, inputs["llama"], name, **params))


@pytest.mark.parametrize("src_type,dst_type", [("Q4_K_M", "Q4_0"), ("Q4_K_M", "Q6_K"), ("Q4_K_M", "F16"),
                                               ("Q8_0", "Q4_K_M"), ("Q3_K_L", "Q5_1"), ("Q2_K", "BF16"),
                                               ("Q5_K_S", "Q8_0"), ("Q4_1", "COPY")])
def test_requantize_as_llama_cpp(llama_cpp, inputs, tmp_path, src_type, dst_type):
    """--allow-requantize: dequantized (pi_dequantize_row, bit for bit ggml's to_float) and quantized again."""
    src = ref_quantize(llama_cpp, inputs["llama"], tmp_path / f"src-{src_type}.gguf", src_type)
    assert_same_file(*_both(llama_cpp, tmp_path, src, dst_type, allow_requantize=True))


def test_requantize_needs_the_option(inputs, tmp_path):
    q = tmp_path / "q.gguf"
    quantize_file(inputs["llama"], q, opts_for("Q4_K_M"))
    with pytest.raises(QuantizeError, match="requantizing from type q[46]_K is disabled"):
        quantize_file(q, tmp_path / "qq.gguf", opts_for("Q4_0"))
    assert not (tmp_path / "qq.gguf").exists()
    quantize_file(q, tmp_path / "same.gguf", opts_for("Q4_K_M"))          # nothing to convert: no option needed
    assert (tmp_path / "same.gguf").read_bytes()[:4] == b"GGUF"


def test_cli_matches_llama_cpp_and_names_the_output(llama_cpp, inputs, tmp_path):
    """INPUT TYPE NTHREADS: ggml-model-TYPE.gguf next to the input, llama.cpp's file (a number names the type as
    llama-quantize does: 15 is Q4_K)."""
    src = tmp_path / "in.gguf"
    src.write_bytes(inputs["qwen2"].read_bytes())
    r = subprocess.run([sys.executable, str(REPO / "tools" / "quantize.py"), str(src), "15", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "ggml-model-Q4_K.gguf"
    assert_same_file(out, ref_quantize(llama_cpp, src, tmp_path / "ref.gguf", "Q4_K_M"))
    assert "converting to q4_K" in r.stderr and "quant size" in r.stderr


# ------------------------------------------------------------------ without the peer
# llama.cpp's types for the 8-layer llama (n_embd 256, its own output matrix): layers 0, 3, 6, 7 are the
# "use_more_bits" ones (i < n/8, i >= 7n/8, (i - n/8) % 3 == 2)
MORE_BITS = {0, 3, 6, 7}


def expected_types(ftype: str, name: str) -> int:
    il = int(name.split(".")[1]) if name.startswith("blk.") else None
    if name.endswith("_norm.weight"):
        return F32
    if ftype == "Q4_K_M":
        if name == "output.weight" or (il in MORE_BITS and ("attn_v" in name or "ffn_down" in name)):
            return Q6_K
        return Q4_K
    if ftype == "Q3_K_M":
        return {"output.weight": Q6_K, "token_embd.weight": Q3_K}.get(name) or (
            (Q5_K if il < 2 else Q4_K) if "attn_v" in name else
            Q4_K if "ffn_down" in name or "attn_output" in name else Q3_K)
    if ftype == "Q4_K_S":
        return Q6_K if name == "output.weight" else Q5_K if il is not None and (
            ("attn_v" in name and il < 4) or ("ffn_down" in name and il < 1)) else Q4_K
    raise AssertionError(ftype)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q3_K_M", "Q4_K_S"])
def test_llama_cpp_types_and_metadata(inputs, tmp_path, ftype):
    out = tmp_path / "q.gguf"
    quantize_file(inputs["llama"], out, opts_for(ftype))
    f = open_gguf(out)
    assert {n: t.type for n, t in f.tensors.items()} == {n: expected_types(ftype, n) for n in f.tensors}
    assert f.metadata["general.file_type"] == FTYPE[ftype]
    assert f.metadata["general.quantization_version"] == 2
    assert list(f.metadata)[-2:] == ["general.quantization_version", "general.file_type"]
    assert list(f.tensors)[:3] == ["output.weight", "output_norm.weight", "token_embd.weight"]


def test_fallback_types(inputs, tmp_path):
    """Rows of 128 (gemma3): Q4_K -> Q5_0, Q6_K (layer 2 of 7 uses more bits) -> Q8_0, the tied token_embd (the
    output's rules) Q8_0; rows of 80 (odd): not even 32-element blocks, f16."""
    quantize_file(inputs["gemma3"], tmp_path / "g.gguf", opts_for("Q4_K_M"))
    g = open_gguf(tmp_path / "g.gguf").tensors
    assert g["token_embd.weight"].type == Q8_0
    assert g["blk.1.attn_q.weight"].type == g["blk.0.attn_v.weight"].type == Q5_0
    assert g["blk.2.attn_v.weight"].type == Q8_0 and g["blk.2.ffn_down.weight"].type == Q6_K
    quantize_file(inputs["odd"], tmp_path / "o.gguf", opts_for("Q4_0"))
    o = open_gguf(tmp_path / "o.gguf").tensors
    assert o["blk.0.attn_q.weight"].type == F16 and o["blk.0.ffn_down.weight"].type == Q4_0
    r = quantize_file(inputs["l80"], None, opts_for("Q3_K_M"), dry_run=True)     # a "70B": Q5_K, falling back
    assert {p.dst_type for p in r.tensors if "attn_v" in p.name} == {7}           # to Q5_1 (not Q4_K's Q5_0)


# error bound of each type on these weights (N(0, 1/n) matrices, an N(0, 1) token_embd): the relative RMS of the
# dequantized weights (measured: 0.55 to 0.7 of these)
WEIGHT_REL_RMS = {F32: 1e-7, F16: 1e-3, BF16: 5e-3, Q8_0: 1e-2, Q6_K: 2.7e-2, 7: 6e-2, 6: 6.5e-2, Q5_K: 5.5e-2,
                  3: 1.2e-1, Q4_0: 1.3e-1, Q4_K: 1.1e-1, Q3_K: 2.3e-1, 10: 4.5e-1}
# logits of the quantized llama against the f16 one (measured: 0.55 to 0.7 of these)
LOGITS_REL_RMS = {"F32": 1e-5, "F16": 1e-5, "COPY": 1e-5, "BF16": 2e-2, "Q8_0": 5e-2, "Q6_K": 0.12, "Q5_K_M": 0.2,
                  "Q5_K_S": 0.2, "Q5_1": 0.2, "Q5_0": 0.25, "Q4_K_M": 0.35, "Q4_K_S": 0.4, "Q4_1": 0.45, "Q4_0": 0.45,
                  "Q3_K_L": 0.55, "Q3_K_M": 0.6, "Q3_K_S": 0.7, "Q2_K": 1.0}


@pytest.fixture(scope="module")
def f16_logits(inputs):
    return logits_all(pi.Context(pi.Model(inputs["llama"]), n_ctx=64, kv_type="f32"), PROMPT)


def greedy(model, n: int = 8) -> list[int]:
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(ctx.logits())))
        ctx.decode([out[-1]])
    return out


@pytest.mark.parametrize("ftype", FTYPES)
def test_quantized_file_runs(inputs, f16_logits, tmp_path, ftype):
    """Every tensor within its type's bound of the f16 weights, the logits within the type's tolerance, greedy
    generation; the metadata llama.cpp writes."""
    out = tmp_path / "q.gguf"
    res = quantize_file(inputs["llama"], out, opts_for(ftype), nthread=2)
    f, src = open_gguf(out), open_gguf(inputs["llama"])
    assert f.metadata["general.file_type"] == (FTYPE["F16"] if ftype == "COPY" else parse_ftype(ftype)[1])
    assert f.metadata["general.quantization_version"] == 2
    for name, t in f.tensors.items():
        s = src.tensors[name]
        if t.type == s.type:
            assert np.array_equal(t.data, s.data)
            continue
        n = t.ne[0]
        x = np.frombuffer(s.data, np.float16).astype(np.float32)
        y = np.empty(x.size, np.float32)
        assert lib.pi_dequantize_row(t.type, ffi.from_buffer(t.data), ffi.from_buffer("float[]", y), x.size) == 0
        err = rel_rms(y, x)
        assert err < WEIGHT_REL_RMS[t.type], (name, t.type, err, n)
    model = pi.Model(out)
    err = rel_rms(logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT), f16_logits)
    assert err < LOGITS_REL_RMS[ftype], err
    tokens = greedy(model)
    assert len(tokens) == 8 and all(0 <= t < 320 for t in tokens)
    if ftype in ("F16", "F32", "COPY"):
        assert tokens == greedy(pi.Model(inputs["llama"]))
    assert res.size_out == sum(t.data.nbytes for t in f.tensors.values())


def test_mxfp4_moe_file_runs(inputs, tmp_path):
    """MXFP4_MOE (llama-quantize's file type of gpt-oss): the experts' 3-d tensors in MXFP4 (llama.cpp's reference
    quantizer), every other matrix and the head Q8_0; the logits near the f32 file's."""
    out = tmp_path / "mxfp4.gguf"
    quantize_file(inputs["gptoss"], out, opts_for("MXFP4_MOE"), nthread=2)
    f = open_gguf(out)
    assert f.metadata["general.file_type"] == FTYPE["MXFP4_MOE"]
    matrices = {n: t for n, t in f.tensors.items() if n.endswith(".weight") and len(t.ne) >= 2 and "gate_inp" not in n}
    want = {n: 39 if len(t.ne) > 2 and t.ne[2] > 1 else Q8_0 for n, t in matrices.items()}   # 39: MXFP4
    assert {n: t.type for n, t in matrices.items()} == want
    assert sum(v == 39 for v in want.values()) == 3 * CONFIGS["gpt-oss"]["n_layer"]   # up, gate, down experts
    q4 = tmp_path / "q4_0.gguf"   # the yardstick: the same model in Q4_0 (this tiny random model amplifies 4 bits)
    quantize_file(inputs["gptoss"], q4, opts_for("Q4_0"), nthread=2)
    ref = logits_all(pi.Context(pi.Model(inputs["gptoss"]), n_ctx=64, kv_type="f32"), PROMPT)
    err = {p.name: rel_rms(logits_all(pi.Context(pi.Model(p), n_ctx=64, kv_type="f32"), PROMPT), ref)
           for p in (out, q4)}
    assert 1e-3 < err["mxfp4.gguf"] < err["q4_0.gguf"], err   # measured 0.40 against Q4_0's 0.47


def test_threads_do_not_change_the_file(inputs, tmp_path):
    quantize_file(inputs["qwen2"], tmp_path / "1.gguf", opts_for("Q4_K_M"), nthread=1)
    quantize_file(inputs["qwen2"], tmp_path / "3.gguf", opts_for("Q4_K_M"), nthread=3)
    assert (tmp_path / "1.gguf").read_bytes() == (tmp_path / "3.gguf").read_bytes()


def test_copy_guesses_the_file_type(inputs, tmp_path):
    """COPY of a file without general.file_type: its most frequent type, marked guessed (1024), as llama.cpp."""
    quantize_file(inputs["gemma3"], tmp_path / "c.gguf", opts_for("COPY"))
    f, src = open_gguf(tmp_path / "c.gguf"), open_gguf(inputs["gemma3"])
    assert f.metadata["general.file_type"] == 1024 | FTYPE["F32"]
    assert all(np.array_equal(t.data, src.tensors[n].data) for n, t in f.tensors.items())


def test_pwri_file(tmp_path):
    """A PowerInfer file stays one: the PWRI magic, the predictors' type (f16) unless --tensor-type names them,
    ffn_down_t as the down matrix (Q6_K in Q4_K_M's use_more_bits layers); it runs sparse and generates."""
    src = write_sparse_model(tmp_path / "sp.gguf", dtype="f16", ranks=(32, 64, 32, 64, 32, 64, 32, 64), n_embd=256,
                             n_ff=256)
    out = tmp_path / "sp-q4_k_m.gguf"
    quantize_file(src, out, opts_for("Q4_K_M"), nthread=2)
    f = open_gguf(out)
    assert f.magic == "PWRI"
    types = {n: t.type for n, t in f.tensors.items()}
    assert types["blk.0.fc1.weight"] == types["blk.5.fc2.weight"] == F16
    assert [types[f"blk.{il}.ffn_down_t.weight"] for il in range(8)] == \
        [Q6_K if il in MORE_BITS else Q4_K for il in range(8)]
    model = pi.Model(out)
    assert model.sparse
    ref = logits_all(pi.Context(pi.Model(src, dense=True), n_ctx=64, kv_type="f32"), PROMPT)
    got = logits_all(pi.Context(pi.Model(out, dense=True), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(got, ref) < LOGITS_REL_RMS["Q4_K_M"]
    assert len(greedy(model)) == 8
    quantize_file(src, tmp_path / "p8.gguf", opts_for("Q4_K_M", tensor_types=[("fc[12]", Q8_0)]))
    assert open_gguf(tmp_path / "p8.gguf").tensors["blk.3.fc2.weight"].type == Q8_0


# ------------------------------------------------------------------ bad input
def run_tool(*args):
    """tools/quantize.py in this process: (exit status, stderr)."""
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = tool.main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
    return rc, err.getvalue()


BAD = {
    "not-gguf": (lambda d, f: (d / "x.txt", d / "o.gguf", "Q4_0"), "not a GGUF file"),
    "missing": (lambda d, f: (d / "none.gguf", d / "o.gguf", "Q4_0"), "no such model file"),
    "unknown-type": (lambda d, f: (f, d / "o.gguf", "Q4_X"), "invalid ftype 'Q4_X'"),
    "imatrix-type": (lambda d, f: (f, d / "o.gguf", "IQ2_XXS"), "needs an importance matrix"),
    "no-quantizer": (lambda d, f: (f, d / "o.gguf", "TQ1_0"), "no quantizer in this core"),
    "same-file": (lambda d, f: (f, f, "Q4_0"), "input and output files are the same"),
    "imatrix": (lambda d, f: ("--imatrix", d / "i.dat", f, d / "o.gguf", "Q4_K_M"), "failed to load imatrix"),
    "keep-split": (lambda d, f: ("--keep-split", f, d / "o.gguf", "Q4_K_M"), "--keep-split is not supported"),
    "bad-tensor-type": (lambda d, f: ("--tensor-type", "attn_q", f, d / "o.gguf", "Q4_K_M"), "malformed tensor type"),
    "bad-ggml-type": (lambda d, f: ("--output-tensor-type", "q9_0", f, d / "o.gguf", "Q4_K_M"), "invalid ggml_type"),
    "unwritable-type": (lambda d, f: ("--token-embedding-type", "iq2_s", f, d / "o.gguf", "Q4_K_M"),
                        "iq2_s has no quantizer in this core"),
    "row-length": (lambda d, f: ("--token-embedding-type", "q4_K", f, d / "o.gguf", "Q8_0"),   # n_embd 80
                   "cannot be stored as q4_K"),
    "bad-override": (lambda d, f: ("--override-kv", "general.name=text:x", f, d / "o.gguf", "Q8_0"),
                     "invalid type for KV override"),
    "bad-threads": (lambda d, f: (f, d / "o.gguf", "Q8_0", "many"), "invalid nthread 'many'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(inputs, tmp_path, case):
    (tmp_path / "x.txt").write_text("hello, not a model\n" * 4)
    src = tmp_path / "in.gguf"
    src.write_bytes(inputs["odd"].read_bytes())
    args, message = BAD[case]
    rc, err = run_tool(*args(tmp_path, src))
    assert rc != 0 and message in err, err
    assert not (tmp_path / "o.gguf").exists()
    assert src.read_bytes() == inputs["odd"].read_bytes()


def test_bad_input_exit_status(tmp_path):
    """The real process: exit status 1 and the message on stderr."""
    (tmp_path / "x.gguf").write_text("this is not a model file at all\n" * 4)
    r = subprocess.run([sys.executable, str(REPO / "tools" / "quantize.py"), str(tmp_path / "x.gguf"), "Q4_K_M"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "not a GGUF file" in r.stderr
    assert not (tmp_path / "ggml-model-Q4_K_M.gguf").exists()


def test_dry_run_writes_nothing(inputs, tmp_path):
    src = tmp_path / "in.gguf"
    src.write_bytes(inputs["llama"].read_bytes())
    rc, err = run_tool("--dry-run", src, "Q4_K_M")
    assert rc == 0 and "-> " in err and "q6_K" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf"]


def test_tensor_type_file_is_the_options(inputs, tmp_path):
    """--tensor-type-file: the --tensor-type entries of a file (blank-separated; names lowercased, as
    llama-quantize)."""
    (tmp_path / "types.txt").write_text("ATTN_Q=q8_0\n  ffn_up=Q5_K blk\\.3\\.=f16\n")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert run_tool("-q", "--tensor-type-file", tmp_path / "types.txt", inputs["llama"], a, "Q4_K_M")[0] == 0
    assert run_tool("-q", "--tensor-type", "attn_q=q8_0", "--tensor-type", "ffn_up=q5_k", "--tensor-type",
                    "blk\\.3\\.=f16", inputs["llama"], b, "Q4_K_M")[0] == 0
    assert a.read_bytes() == b.read_bytes()
    t = open_gguf(a).tensors
    assert (t["blk.0.attn_q.weight"].type, t["blk.0.ffn_up.weight"].type, t["blk.3.ffn_gate.weight"].type) == \
        (Q8_0, Q5_K, F16)
