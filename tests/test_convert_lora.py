"""convert-lora.py / powerinfer.convert.convert_lora: PEFT LoRA adapters (random ones, written by
tools/make_test_lora.py) for the tiny HF llama checkpoint of test_convert.py -> llama.cpp GGUF LoRA files.

The numerical check: for every adapted tensor, the base's f32 GGUF tensor W plus (alpha / r) * lora_b @ lora_a
(token_embd: lora_a @ lora_b^T), computed from our file as llama.cpp does, must equal the tensor of the f32
GGUF conversion of the checkpoint with the adapter merged in (W_hf + s * B @ A, as PEFT's merge_and_unload):
this checks the names, the orientation of every factor, the alpha and the q/k row permutation of lora_b.
With llama-cpp-python installed, llama.cpp itself loads the adapter onto the base GGUF: its logits must be
those of the merged checkpoint's GGUF.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf
from helpers import rel_rms
from powerinfer.convert import ConversionError, convert_dense, convert_lora
from powerinfer.gguf_file import open_gguf
from test_convert import CFG, make_weights, save_safetensors, save_torch, tensor_f32, train_tokenizer, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from make_test_lora import make_lora, merge_lora  # noqa: E402

BASE_CFG = dict(CFG, hidden_act="silu")      # llama.cpp's llama FFN is SwiGLU whatever config.json says
RANK, ALPHA = 8, 16.0
ALL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head,embed_tokens"
MERGED_ATOL = 1e-5        # f32 file vs merged f32 checkpoint: float32 rounding of W + s*B@A (measured 4.8e-7;
                          # 0.89 without the q/k permutation of lora_b)
LLAMA_CPP_REL_RMS = 1e-3  # llama.cpp: base + f32 adapter vs merged model, logits (measured 4.1e-7)
LLAMA_CPP_F16_REL_RMS = 5e-3   # with the default f16 adapter (measured 1.0e-3)
LLAMA_CPP_Q8_0_REL_RMS = 5e-2  # with a q8_0 adapter (lora_b f16) (measured 1.9e-2)
ADAPTER_EFFECT_MIN = 0.1       # the adapter really changes the logits (base vs merged: measured 1.1)
TOKENS = [1, 17, 200, 45, 3, 99, 128, 7, 250, 12, 64, 5]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The HF base checkpoint, its f32 GGUF conversion and its weights."""
    d = tmp_path_factory.mktemp("lora")
    sp = train_tokenizer()
    weights = make_weights(BASE_CFG)
    model_dir = write_checkpoint(d / "base", BASE_CFG, weights, sp)
    gguf_path = d / "base-f32.gguf"
    convert_dense(model_dir, gguf_path, "f32")
    return dict(dir=d, model_dir=model_dir, gguf=gguf_path, weights=weights, sp=sp, merged={})


def adapter(base, name: str, targets=ALL, rank=RANK, alpha=ALPHA, **kw) -> tuple[Path, dict]:
    out = base["dir"] / name
    if out.exists():
        shutil.rmtree(out)
    return out, make_lora(base["model_dir"], out, rank=rank, alpha=alpha, targets=targets, scale_b=0.5, seed=3, **kw)


def merged_gguf(base, key: str, tensors, **merge_kw) -> Path:
    """The f32 GGUF of the base checkpoint with the adapter merged in (once per key)."""
    if key not in base["merged"]:
        merged = merge_lora(base["weights"], tensors, **merge_kw)
        d = write_checkpoint(base["dir"] / f"merged-{key}", BASE_CFG, merged, base["sp"])
        convert_dense(d, d / "merged-f32.gguf", "f32")
        base["merged"][key] = d / "merged-f32.gguf"
    return base["merged"][key]


def applied(base_file: Path, lora_file: Path) -> dict[str, np.ndarray]:
    """GGUF name -> W + (alpha / r) * B @ A for every adapted tensor, computed from the files as llama.cpp does."""
    b, lo = open_gguf(base_file), open_gguf(lora_file)
    alpha = lo.metadata["adapter.lora.alpha"]
    out = {}
    for name in {n.rsplit(".", 1)[0] for n in lo.tensors}:
        w = tensor_f32(b.tensors[name])
        a, bb = tensor_f32(lo.tensors[name + ".lora_a"]), tensor_f32(lo.tensors[name + ".lora_b"])
        s = alpha / lo.tensors[name + ".lora_b"].ne[0]       # llama.cpp: rank = lora_b ne[0]
        delta = a @ bb.T if name == "token_embd.weight" else bb @ a
        out[name] = w + s * delta
    return out


def check_against_merged(base, lora_file: Path, merged_file: Path, atol=MERGED_ATOL) -> None:
    m = open_gguf(merged_file)
    got = applied(base["gguf"], lora_file)
    assert got
    for name, w in got.items():
        ref = tensor_f32(m.tensors[name])
        err = float(np.abs(w - ref).max())
        assert err < atol * max(1.0, float(np.abs(ref).max())), (name, err)


# ---------------------------------------------------------------------------------------------
# (1) HF base: layout, metadata, numbers
# ---------------------------------------------------------------------------------------------
def test_hf_base_layout_metadata_and_merged_weights(base):
    ad, tensors = adapter(base, "all")
    out = base["dir"] / "all-f32.gguf"
    res = convert_lora(ad, base["model_dir"], out, "f32")
    assert res.arch == "llama" and res.n_tensors == 2 * (2 * 7 + 2) and not res.warnings
    f = open_gguf(out)
    assert f.magic == "GGUF"
    md = f.metadata
    assert md["general.type"] == "adapter" and md["adapter.type"] == "lora"
    assert md["general.architecture"] == "llama" and md["adapter.lora.alpha"] == ALPHA
    field = gguf.GGUFReader(out).fields["adapter.lora.alpha"]
    assert field.types == [gguf.GGUFValueType.FLOAT32]

    # names and shapes, as llama.cpp's loader (llama-adapter.cpp) validates them against the base GGUF
    bt = open_gguf(base["gguf"]).tensors
    adapted = {n.rsplit(".", 1)[0] for n in f.tensors}
    assert adapted == {f"blk.{i}.{t}.weight" for i in range(2) for t in
                       ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")} \
        | {"output.weight", "token_embd.weight"}
    assert set(f.tensors) == {f"{n}.lora_{x}" for n in adapted for x in "ab"}
    for name in adapted:
        w, a, b = bt[name].ne, f.tensors[name + ".lora_a"].ne, f.tensors[name + ".lora_b"].ne
        assert f.tensors[name + ".lora_a"].type == f.tensors[name + ".lora_b"].type == 0     # F32
        if name == "token_embd.weight":         # flipped: a (n_vocab, r) is indexed by token, b is (n_embd, r)
            assert a == (RANK, w[1]) and b == (RANK, w[0])
        else:                                   # a ne [n_in, r], b ne [r, n_out]
            assert a == (w[0], RANK) and b == (RANK, w[1])
    # PEFT's lora_A as is; lora_B of attn_q / attn_k with its rows permuted, the others as is
    pre = "base_model.model.model.layers.1."
    np.testing.assert_array_equal(tensor_f32(f.tensors["blk.1.attn_v.weight.lora_a"]),
                                  tensors[pre + "self_attn.v_proj.lora_A.weight"])
    np.testing.assert_array_equal(tensor_f32(f.tensors["blk.1.attn_v.weight.lora_b"]),
                                  tensors[pre + "self_attn.v_proj.lora_B.weight"])
    assert not np.array_equal(tensor_f32(f.tensors["blk.1.attn_q.weight.lora_b"]),
                              tensors[pre + "self_attn.q_proj.lora_B.weight"])

    check_against_merged(base, out, merged_gguf(base, "all", tensors, rank=RANK, alpha=ALPHA))


@pytest.mark.parametrize("outtype, a_type, b_type, atol", [
    ("f16", 1, 1, 2e-3), ("bf16", 30, 30, 2e-2),
    ("q8_0", 8, 1, 2e-2),      # lora_b rows have r = 8 elements: f16
])
def test_outtypes(base, outtype, a_type, b_type, atol):
    ad, tensors = adapter(base, "all")
    out = base["dir"] / f"all-{outtype}.gguf"
    res = convert_lora(ad, base["model_dir"], out, outtype)
    f = open_gguf(out)
    for name, t in f.tensors.items():
        want = b_type if name.endswith(".lora_b") else a_type
        if name == "token_embd.weight.lora_a" and outtype == "q8_0":
            want = 1                            # its rows are the r = 8 elements of one token
        assert t.type == want, (name, t.type)
    assert bool(res.warnings) == (outtype == "q8_0")
    if outtype == "q8_0":
        assert len(res.warnings) == 1 and "17 tensors stored as f16 instead of q8_0" in res.warnings[0]
    check_against_merged(base, out, merged_gguf(base, "all", tensors, rank=RANK, alpha=ALPHA), atol=atol)


def test_rslora_and_rank_pattern(base):
    """use_rslora: the file's alpha is lora_alpha * sqrt(r) so that llama.cpp's alpha / r is rsLoRA's
    lora_alpha / sqrt(r); a module of another rank (rank_pattern) gets sqrt(r_module / r) folded into lora_b."""
    ad, tensors = adapter(base, "rs", targets="q_proj,k_proj,down_proj", rslora=True)
    res = convert_lora(ad, base["model_dir"], base["dir"] / "rs.gguf", "f32")
    assert open_gguf(res.path).metadata["adapter.lora.alpha"] == pytest.approx(ALPHA * math.sqrt(RANK), rel=1e-6)
    check_against_merged(base, res.path, merged_gguf(base, "rs", tensors, rank=RANK, alpha=ALPHA, rslora=True))

    cfg = json.loads((ad / "adapter_config.json").read_text())
    cfg.update(r=4, rank_pattern={"q_proj": 8, "k_proj": 8, "down_proj": 8})    # every tensor has rank 8
    (ad / "adapter_config.json").write_text(json.dumps(cfg))
    res = convert_lora(ad, base["model_dir"], base["dir"] / "rs-pattern.gguf", "f32")
    assert open_gguf(res.path).metadata["adapter.lora.alpha"] == pytest.approx(ALPHA * 2, rel=1e-6)
    check_against_merged(base, res.path, merged_gguf(base, "rs", tensors, rank=RANK, alpha=ALPHA, rslora=True))


def test_adapter_model_bin(base):
    """adapter_model.bin (torch.save, or its torch-free writer) gives the same file as the safetensors."""
    ad, tensors = adapter(base, "bin", targets="q_proj,v_proj,embed_tokens")
    ref = convert_lora(ad, base["model_dir"], base["dir"] / "st.gguf", "f16").path
    (ad / "adapter_model.safetensors").unlink()
    save_torch(ad / "adapter_model.bin", tensors)
    out = convert_lora(ad, base["model_dir"], base["dir"] / "bin.gguf", "f16").path
    assert out.read_bytes() == ref.read_bytes()


def test_peft_base_layer_copies_are_skipped(base):
    """With embed_tokens / lm_head among its targets, PEFT (save_embedding_layers) also saves the base's own
    matrices as <module>.base_layer.weight: they are not part of the LoRA file (llama.cpp's converter skips them)."""
    ad, tensors = adapter(base, "emb", targets="q_proj,embed_tokens,lm_head")
    ref = convert_lora(ad, base["model_dir"], base["dir"] / "emb.gguf", "f32").path
    _edit_weights(ad, add={"base_model.model.lm_head.base_layer.weight": base["weights"]["lm_head.weight"],
                           "base_model.model.model.embed_tokens.base_layer.weight":
                               base["weights"]["model.embed_tokens.weight"]})
    out = convert_lora(ad, base["model_dir"], base["dir"] / "emb-peft.gguf", "f32").path
    assert out.read_bytes() == ref.read_bytes()


# ---------------------------------------------------------------------------------------------
# (2) GGUF base
# ---------------------------------------------------------------------------------------------
def test_gguf_base_gives_the_same_file(base):
    ad, tensors = adapter(base, "all")
    from_hf = convert_lora(ad, base["model_dir"], base["dir"] / "from-hf.gguf", "f32").path
    from_gguf = convert_lora(ad, base["gguf"], base["dir"] / "from-gguf.gguf", "f32").path
    assert from_gguf.read_bytes() == from_hf.read_bytes()
    check_against_merged(base, from_gguf, merged_gguf(base, "all", tensors, rank=RANK, alpha=ALPHA))
    # a quantized base file has the same names and shapes
    q8 = base["dir"] / "base-q8_0.gguf"
    convert_dense(base["model_dir"], q8, "q8_0")
    assert convert_lora(ad, q8, base["dir"] / "from-q8.gguf", "f32").path.read_bytes() == from_hf.read_bytes()


# ---------------------------------------------------------------------------------------------
# (3) errors: one line, exit status 1, no output left behind
# ---------------------------------------------------------------------------------------------
def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bindings")]
                                        + [env.get("PYTHONPATH", "")] * bool(env.get("PYTHONPATH")))
    return subprocess.run([sys.executable, str(ROOT / "convert-lora.py"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _edit_json(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def _edit_weights(ad: Path, drop=(), add=None) -> None:
    from safetensors.numpy import load_file
    t = {k: v for k, v in load_file(str(ad / "adapter_model.safetensors")).items() if k not in drop}
    save_safetensors(ad / "adapter_model.safetensors", {**t, **(add or {})})


def _other_base(base, name: str, **cfg) -> Path:
    c = dict(BASE_CFG, **cfg)
    return write_checkpoint(base["dir"] / name, c, make_weights(c), base["sp"])


QP = "base_model.model.model.layers.0.self_attn.q_proj"
ERROR_CASES = {
    "dora": (lambda b, ad: _edit_json(ad / "adapter_config.json", use_dora=True), None, "DoRA"),
    "dora_tensor": (lambda b, ad: _edit_weights(ad, add={QP + ".lora_magnitude_vector": np.ones(64, np.float32)}),
                    None, "DoRA magnitude vector"),
    "no_lora_b": (lambda b, ad: _edit_weights(ad, drop=[QP + ".lora_B.weight"]), None,
                  "model.layers.0.self_attn.q_proj has a lora_A without its lora_B"),
    "no_lora_a": (lambda b, ad: _edit_weights(ad, drop=[QP + ".lora_A.weight"]), None, "lora_B without its lora_A"),
    "base_shape": (lambda b, ad: None, lambda b: _other_base(b, "base-ff96", intermediate_size=96),
                   "do not fit the base's blk.0.ffn_gate.weight [96, 64]"),
    "gguf_base_shape": (lambda b, ad: None, lambda b: _convert(_other_base(b, "base-e96", hidden_size=96)),
                        "do not fit the base's blk.0.attn_q.weight [96, 96]"),
    "fewer_layers": (lambda b, ad: None, lambda b: _other_base(b, "base-1layer", num_hidden_layers=1),
                     "the base model has no tensor blk.1."),
    "tied_lm_head": (lambda b, ad: _edit_weights(ad, add={
        "base_model.model.lm_head.lora_A.weight": np.zeros((8, 64), np.float32),
        "base_model.model.lm_head.lora_B.weight": np.zeros((300, 8), np.float32)}),
        lambda b: _other_base(b, "base-tied", tie_word_embeddings=True),
        "no tensor output.weight for lm_head (the base ties lm_head to the embeddings)"),
    "unmapped_module": (lambda b, ad: _edit_weights(ad, add={
        "base_model.model.model.layers.0.self_attn.rotary_emb.lora_A.weight": np.zeros((8, 64), np.float32),
        "base_model.model.model.layers.0.self_attn.rotary_emb.lora_B.weight": np.zeros((64, 8), np.float32)}),
        None, "module model.layers.0.self_attn.rotary_emb has no matrix"),
    "full_tensor": (lambda b, ad: _edit_weights(ad, add={"base_model.model.lm_head.weight": np.zeros((300, 64),
                                                                                                      np.float32)}),
                    None, "'base_model.model.lm_head.weight' is not a lora_A / lora_B factor"),
    "wrong_rank": (lambda b, ad: _edit_json(ad / "adapter_config.json", r=4), None, "has rank 8 but"),
    "bad_alpha": (lambda b, ad: _edit_json(ad / "adapter_config.json", lora_alpha="16"), None,
                  "lora_alpha = '16', expected a positive number"),
    "alpha_pattern": (lambda b, ad: _edit_json(ad / "adapter_config.json", alpha_pattern={"q_proj": 4}), None,
                      "alpha_pattern"),
    "not_lora": (lambda b, ad: _edit_json(ad / "adapter_config.json", peft_type="IA3"), None, "'IA3'"),
    "no_config": (lambda b, ad: (ad / "adapter_config.json").unlink(), None, "no adapter_config.json"),
    "no_weights": (lambda b, ad: (ad / "adapter_model.safetensors").unlink(), None,
                   "no adapter_model.safetensors or adapter_model.bin"),
    "no_base": (lambda b, ad: None, lambda b: b["dir"] / "nowhere", "base model does not exist"),
    "qwen2_config": (lambda b, ad: None, lambda b: _other_base(b, "base-qwen2", model_type="qwen2",
                                                               architectures=["Qwen2ForCausalLM"]),
                     "unsupported model_type 'qwen2'"),
    "qwen2_gguf": (lambda b, ad: None, lambda b: _qwen2_gguf(b), "architecture 'qwen2' is not supported"),
    "adapter_as_base": (lambda b, ad: None, lambda b: convert_lora(_fresh(b, "x"), b["model_dir"],
                                                                   b["dir"] / "x.gguf").path,
                        "is an adapter file"),
}


def _convert(model_dir: Path) -> Path:
    convert_dense(model_dir, model_dir / "f32.gguf", "f32")
    return model_dir / "f32.gguf"


def _qwen2_gguf(base) -> Path:
    path = base["dir"] / "qwen2.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_head_count(4)
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _fresh(base, name: str) -> Path:
    return adapter(base, name, targets="q_proj,k_proj,v_proj,gate_proj,down_proj")[0]


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_errors(base, case):
    breaker, base_of, needle = ERROR_CASES[case]
    ad = _fresh(base, "broken")
    breaker(base, ad)
    base_path = base_of(base) if base_of else base["model_dir"]
    out = base["dir"] / "broken.gguf"
    with pytest.raises(ConversionError) as ei:
        convert_lora(ad, base_path, out)
    assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
    assert not out.exists() and not [p for p in base["dir"].iterdir() if p.name.endswith(".tmp")]
    if case in ("dora", "no_lora_b", "base_shape", "no_config"):
        r = _run("--base", str(base_path), "--outfile", str(out), str(ad))
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("convert-lora.py: error: ")
        assert needle in r.stderr and not out.exists()


def test_cli_default_outfile_and_usage_errors(base):
    ad = _fresh(base, "cli")
    r = _run("--base", str(base["gguf"]), "--outtype", "q8_0", str(ad))
    assert r.returncode == 0, r.stderr
    out = ad / "ggml-lora-q8_0.gguf"
    assert out.read_bytes()[:4] == b"GGUF" and "blk.1.ffn_down.weight.lora_b" in r.stderr
    assert "stored as f16 instead of q8_0" in r.stderr and r.stdout == ""
    for args, needle in ((["--outtype", "q4_0"], "invalid choice: 'q4_0'"),
                         ([], "the following arguments are required: --base")):
        r = _run(*args, *(["--base", str(base["gguf"])] if args else []), str(ad))
        assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and needle in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# (4) llama.cpp reads our files
# ---------------------------------------------------------------------------------------------
def llama_cpp_logits(model: Path, lora: Path | None = None) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    ll = llama_cpp.Llama(str(model), lora_path=str(lora) if lora else None, n_ctx=64, logits_all=True,
                         verbose=False, n_threads=1, type_k=0, type_v=0)     # f32 KV cache
    ll.eval(TOKENS)
    return np.array(ll.scores[:len(TOKENS)], dtype=np.float64)


def test_llama_cpp_applies_our_adapter(base):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    ad, tensors = adapter(base, "all")
    lora32 = convert_lora(ad, base["gguf"], base["dir"] / "ll-f32.gguf", "f32").path
    lora16 = convert_lora(ad, base["gguf"], base["dir"] / "ll-f16.gguf").path
    lora8 = convert_lora(ad, base["gguf"], base["dir"] / "ll-q8_0.gguf", "q8_0").path
    merged = llama_cpp_logits(merged_gguf(base, "all", tensors, rank=RANK, alpha=ALPHA))
    err = {"base": rel_rms(llama_cpp_logits(base["gguf"]), merged)}
    for name, lora in (("f32", lora32), ("f16", lora16), ("q8_0", lora8)):
        err[name] = rel_rms(llama_cpp_logits(base["gguf"], lora), merged)
    print("llama.cpp logits, relative RMS vs the merged model: " + ", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    assert err["base"] > ADAPTER_EFFECT_MIN
    assert err["f32"] < LLAMA_CPP_REL_RMS
    assert err["f16"] < LLAMA_CPP_F16_REL_RMS
    assert err["q8_0"] < LLAMA_CPP_Q8_0_REL_RMS


def test_our_engine_applies_our_adapter(base):
    """The whole path a user takes: PEFT directory -> convert-lora.py -> our engine's --lora; the logits are those
    of the merged checkpoint's GGUF (f32 adapter: float32 rounding; f16: the adapter's rounding; q8_0: lora_a's)."""
    import powerinfer as pi
    from powerinfer.lora import LoraAdapter
    ad, tensors = adapter(base, "all")
    merged = merged_gguf(base, "all", tensors, rank=RANK, alpha=ALPHA)

    def logits(path, lora=None):
        model = pi.Model(path)
        ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1)
        if lora is not None:
            ctx.set_lora([(LoraAdapter(lora, model), 1.0)])
        ctx.decode(TOKENS, logits="all")
        return np.stack([ctx.logits(i) for i in range(len(TOKENS))]).astype(np.float64)
    want = logits(merged)
    err = {"base": rel_rms(logits(base["gguf"]), want)}
    for outtype in ("f32", "f16", "q8_0"):
        path = convert_lora(ad, base["gguf"], base["dir"] / f"ours-{outtype}.gguf", outtype).path
        err[outtype] = rel_rms(logits(base["gguf"], path), want)
    print("our logits, relative RMS vs the merged model: " + ", ".join(f"{k} {v:.2e}" for k, v in err.items()))
    assert err["base"] > ADAPTER_EFFECT_MIN
    assert err["f32"] < 1e-5
    assert err["f16"] < LLAMA_CPP_F16_REL_RMS
    assert err["q8_0"] < LLAMA_CPP_Q8_0_REL_RMS
