"""The converters (powerinfer.convert, convert.py, convert-dense.py) on a tiny Hugging Face
llama checkpoint built here: config.json, a SentencePiece BPE tokenizer trained in the test,
random weights in safetensors (and pytorch_model.bin) files, PowerInfer predictors model_N.pt.

Needs neither torch nor the safetensors package: without them, the files are written by small
writers of the same formats below (with them, by torch.save / safetensors and cross-checked).

Tolerances are relative RMS errors of the engine's logits against a float64 numpy model written
in HF conventions (rotate_half RoPE on the unpermuted q/k weights, GQA, ReGLU), so the f32 check
also checks the converter's Q/K row permutation:
- F32_REL_RMS: f32 weights, f32 KV cache: float32 arithmetic only;
- F16_REL_RMS: + rounding the weights to f16;
- Q8_0_REL_RMS / Q4_0_REL_RMS: + weight quantization and the core's 8-bit activations;
- STORED_*: against the reference on the weights as stored (quantized and dequantized here with
  powerinfer.quants), which checks that the converter stored exactly the expected values.
"""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import powerinfer as pi
from helpers import reaped, rel_rms, torch_free_save
from powerinfer import quants
from powerinfer.convert import ConversionError, convert_dense, convert_sparse, permute_qk
from powerinfer.convert.torch_pickle import load_state_dict
from powerinfer.gguf_file import open_gguf
from model_files import layer_weights, random_weights
from reference_model import HF_OF_GGUF, ReferenceModel

spm = pytest.importorskip("sentencepiece")

ROOT = Path(__file__).resolve().parents[1]

F32_REL_RMS = 1e-4        # measured 2e-7
F16_REL_RMS = 5e-3        # measured 5e-4
Q8_0_REL_RMS = 5e-2       # measured 1.9e-2
Q4_0_REL_RMS = 3.5e-1     # measured 0.21 (4-bit weights on a 2-layer random model with std-1 embeddings)
# against the reference run on the stored (quantized then dequantized) weights, only the core's
# float32 arithmetic and 8-bit activations remain
STORED_F16_REL_RMS = 1e-4
STORED_QUANT_REL_RMS = 5e-2
WRONG_PERMUTATION_MIN_REL_RMS = 1e-2   # what a converter without the Q/K permutation gets at least

CFG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="relu",
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    vocab_size=300, tie_word_embeddings=False, torch_dtype="float32",
)
RANKS = [32, 48]            # predictor rank per layer (48: fc2 rows are not a multiple of 32)
THRESHOLD = 0.25
PROMPT_TEXT = "the quick brown fox jumps over the lazy dog, once upon a time"


# ---------------------------------------------------------------------------------------------
# writers of the input formats (used when torch / safetensors are not installed)
# ---------------------------------------------------------------------------------------------
_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def save_safetensors(path: Path, tensors: dict[str, np.ndarray], bf16: bool = False) -> None:
    """safetensors file; bf16=True stores float32 arrays as BF16 (rounded to nearest even)."""
    if not bf16:
        try:
            from safetensors.numpy import save_file
        except ImportError:
            pass
        else:
            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
            return
    header, blobs, off = {}, [], 0
    for k, v in tensors.items():
        if bf16:
            raw, dt = quants.float_to_bf16(v).tobytes(), "BF16"
        else:
            raw, dt = np.ascontiguousarray(v).tobytes(), _ST_DTYPES[v.dtype]
        header[k] = {"dtype": dt, "shape": list(v.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def save_torch(path: Path, state_dict: dict[str, np.ndarray]) -> None:
    """torch.save when torch is importable, else the torch-free writer above."""
    torch = _torch()
    if torch is None:
        torch_free_save(path, state_dict)
    else:
        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state_dict.items()}, path)


# ---------------------------------------------------------------------------------------------
# the tiny checkpoint
# ---------------------------------------------------------------------------------------------
def train_tokenizer(vocab_size: int = 300) -> bytes:
    rng = random.Random(0)
    words = ("the quick brown fox jumps over a lazy dog and then runs into the forest where many "
             "trees grow tall hello world once upon a time there was a little model").split()
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", character_coverage=1.0,
        minloglevel=2, num_threads=1)
    return out.getvalue()


def make_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng, mat, norm, _ = random_weights(seed)
    E, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = E // cfg["num_attention_heads"]
    E_kv = hd * cfg["num_key_value_heads"]
    w = {"model.embed_tokens.weight": rng.standard_normal((V, E)).astype(np.float32),
         "model.norm.weight": norm(E)}
    for i in range(cfg["num_hidden_layers"]):
        w.update((f"model.layers.{i}.{HF_OF_GGUF[k]}.weight", v) for k, v in layer_weights(mat, norm, E, F, E, E_kv).items())
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = mat(V, E)
    return w


def make_predictors(cfg: dict, ranks, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    E, F = cfg["hidden_size"], cfg["intermediate_size"]
    return [{"fc1.weight": (rng.standard_normal((r, E)) / np.sqrt(E)).astype(np.float32),
             "fc2.weight": (rng.standard_normal((F, r)) / np.sqrt(r)).astype(np.float32)} for r in ranks]


def write_checkpoint(d: Path, cfg: dict, weights: dict, sp_model: bytes, fmt: str = "safetensors") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    (d / "tokenizer.model").write_bytes(sp_model)
    if fmt == "safetensors":
        save_safetensors(d / "model.safetensors", weights)
    elif fmt == "bin":
        save_torch(d / "pytorch_model.bin", weights)
    elif fmt == "bf16-shards":
        names = list(weights)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for fname, keys in shards.items():
            save_safetensors(d / fname, {k: weights[k] for k in keys}, bf16=True)
        index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        raise ValueError(fmt)
    return d


def write_predictor_dir(d: Path, preds, threshold=THRESHOLD) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i, sd in enumerate(preds):
        save_torch(d / f"model_{i}.pt", sd)
    if threshold is not None:
        (d / "config.json").write_text(json.dumps({"sparse_threshold": threshold}))
    return d


def stored_weights(w: dict, outtype: str) -> dict:
    """The HF weights as a dense file of outtype stores them (the Q/K permutation moves whole rows,
    so quantizing before or after it is the same); 1-D tensors stay f32."""
    out = {}
    for k, v in w.items():
        if v.ndim == 1 or outtype == "f32":
            out[k] = v
        elif outtype == "f16" or not quants.can_quantize(outtype, v.shape[-1]):
            out[k] = v.astype(np.float16).astype(np.float32)
        else:
            out[k] = quants.dequantize(quants.quantize(v, outtype), outtype)
    return out


def engine_logits(path: Path, tokens, **ctx_kw) -> np.ndarray:
    model = pi.Model(path)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", **ctx_kw)
    ctx.decode(tokens, logits="all")
    return np.stack([ctx.logits(i) for i in range(len(tokens))])


def tensor_f32(t) -> np.ndarray:
    """GGUF tensor (powerinfer.gguf_file.TensorInfo) -> float32 numpy array (shape = ne reversed)."""
    shape = tuple(reversed(t.ne))
    raw = np.asarray(t.data).reshape(int(np.prod(shape[:-1])) if len(shape) > 1 else 1, -1)
    return quants.dequantize(raw, quants.type_name_of(t.type)).reshape(shape)


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sp_model() -> bytes:
    return train_tokenizer()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, sp_model):
    base = tmp_path_factory.mktemp("convert")
    weights = make_weights(CFG)
    preds = make_predictors(CFG, RANKS)
    model_dir = write_checkpoint(base / "tiny-relu-llama", CFG, weights, sp_model)
    pred_dir = write_predictor_dir(base / "tiny-relu-llama-predictor", preds)
    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    tokens = [sp.bos_id()] + sp.encode(PROMPT_TEXT)
    return dict(base=base, model_dir=model_dir, pred_dir=pred_dir, weights=weights, preds=preds,
                tokens=tokens, sp=sp, ref=ReferenceModel.from_hf(weights, CFG).forward(tokens), out={})


def converted(ckpt, kind: str, outtype: str) -> Path:
    """Convert once per (kind, outtype) for the module."""
    key = (kind, outtype)
    if key not in ckpt["out"]:
        out = ckpt["base"] / f"{kind}-{outtype}.gguf"
        if kind == "dense":
            convert_dense(ckpt["model_dir"], out, outtype)
        else:
            convert_sparse(ckpt["model_dir"], ckpt["pred_dir"], out, outtype)
        ckpt["out"][key] = out
    return ckpt["out"][key]


# ---------------------------------------------------------------------------------------------
# dense files in the engine against the HF reference
# ---------------------------------------------------------------------------------------------
def test_dense_f32_matches_hf_reference(ckpt):
    assert len(ckpt["tokens"]) >= 12
    ours = engine_logits(converted(ckpt, "dense", "f32"), ckpt["tokens"])
    assert rel_rms(ours, ckpt["ref"]) < F32_REL_RMS


def test_reference_detects_a_missing_qk_permutation(ckpt, monkeypatch):
    """The f32 comparison above is sensitive to the Q/K row order."""
    import powerinfer.convert.llama as llama_mod
    monkeypatch.setattr(llama_mod, "permute_qk", lambda w, n_head: w)
    out = ckpt["base"] / "dense-unpermuted.gguf"
    convert_dense(ckpt["model_dir"], out, "f32")
    assert rel_rms(engine_logits(out, ckpt["tokens"]), ckpt["ref"]) > WRONG_PERMUTATION_MIN_REL_RMS


@pytest.mark.parametrize("outtype,tol", [("f16", F16_REL_RMS), ("q8_0", Q8_0_REL_RMS), ("q4_0", Q4_0_REL_RMS)])
def test_dense_outtypes_match_hf_reference(ckpt, outtype, tol):
    path = converted(ckpt, "dense", outtype)
    f = open_gguf(path)
    assert f.magic == "GGUF"
    assert f.metadata["general.file_type"] == quants.TYPES[outtype].file_type
    for name, t in f.tensors.items():
        want = "f32" if len(t.ne) == 1 else outtype
        assert quants.type_name_of(t.type) == want, name
    ours = engine_logits(path, ckpt["tokens"])
    assert rel_rms(ours, ckpt["ref"]) < tol
    stored_ref = ReferenceModel.from_hf(stored_weights(ckpt["weights"], outtype), CFG).forward(ckpt["tokens"])
    assert rel_rms(ours, stored_ref) < (STORED_F16_REL_RMS if outtype == "f16" else STORED_QUANT_REL_RMS)


def test_dense_file_layout_and_metadata(ckpt):
    f = open_gguf(converted(ckpt, "dense", "f16"))
    E, F, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    assert f.tensors["blk.0.ffn_down.weight"].ne == (F, E)
    assert not any("ffn_down_t" in n or ".fc1." in n or ".fc2." in n for n in f.tensors)
    assert len(f.tensors) == 3 + 9 * CFG["num_hidden_layers"]
    m = f.metadata
    assert m["general.architecture"] == "llama"
    assert m["general.name"] == "tiny-relu-llama"
    assert m["powerinfer.ffn_activation"] == "relu"
    assert "powerinfer.sparse_threshold" not in m
    assert m["llama.context_length"] == CFG["max_position_embeddings"]
    assert m["llama.embedding_length"] == E
    assert m["llama.feed_forward_length"] == F
    assert m["llama.attention.head_count"] == CFG["num_attention_heads"]
    assert m["llama.attention.head_count_kv"] == CFG["num_key_value_heads"]
    assert m["llama.block_count"] == CFG["num_hidden_layers"]
    assert m["llama.rope.dimension_count"] == E // CFG["num_attention_heads"]
    assert m["llama.rope.freq_base"] == pytest.approx(CFG["rope_theta"])
    assert m["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(CFG["rms_norm_eps"])
    assert "llama.rope.scaling.type" not in m
    sp = ckpt["sp"]
    assert m["tokenizer.ggml.model"] == "llama"
    assert m["tokenizer.ggml.tokens"] == [sp.id_to_piece(i) for i in range(V)]
    assert m["tokenizer.ggml.scores"] == pytest.approx([sp.get_score(i) for i in range(V)])
    types = m["tokenizer.ggml.token_type"]
    assert types[sp.unk_id()] == 2 and types[sp.bos_id()] == 3 and types[sp.eos_id()] == 3
    assert types[sp.piece_to_id("<0x41>")] == 6 and types[V - 1] == 1
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"],
            m["tokenizer.ggml.unknown_token_id"]) == (sp.bos_id(), sp.eos_id(), sp.unk_id())
    assert m["tokenizer.ggml.add_bos_token"] is True and m["tokenizer.ggml.add_eos_token"] is False
    # the engine's tokenizer agrees with sentencepiece on the converted vocabulary
    model = pi.Model(converted(ckpt, "dense", "f16"))
    assert model.tokenizer.encode(PROMPT_TEXT) == ckpt["tokens"]


# ---------------------------------------------------------------------------------------------
# sparse (PWRI) files
# ---------------------------------------------------------------------------------------------
def expected_sparse_layout(outtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    E, F, V = CFG["hidden_size"], CFG["intermediate_size"], CFG["vocab_size"]
    E_kv = E // CFG["num_attention_heads"] * CFG["num_key_value_heads"]

    def mat(ne):
        return ne, (outtype if ne[0] % 32 == 0 or outtype in ("f32", "f16") else "f16")
    exp = {"token_embd.weight": mat((E, V)), "output_norm.weight": ((E,), "f32"), "output.weight": mat((E, V))}
    for i, r in enumerate(RANKS):
        b = f"blk.{i}."
        exp.update({
            b + "attn_norm.weight": ((E,), "f32"), b + "attn_q.weight": mat((E, E)),
            b + "attn_k.weight": mat((E, E_kv)), b + "attn_v.weight": mat((E, E_kv)),
            b + "attn_output.weight": mat((E, E)), b + "ffn_norm.weight": ((E,), "f32"),
            b + "ffn_gate.weight": mat((E, F)), b + "ffn_up.weight": mat((E, F)),
            b + "ffn_down_t.weight": mat((E, F)), b + "fc1.weight": mat((E, r)), b + "fc2.weight": mat((r, F)),
        })
    return exp


@pytest.mark.parametrize("outtype", ["f16", "q4_0"])
def test_sparse_file_layout(ckpt, outtype):
    path = converted(ckpt, "sparse", outtype)
    assert path.read_bytes()[:4] == b"PWRI"
    f = open_gguf(path)
    assert f.magic == "PWRI" and f.version == 3
    got = {n: (t.ne, quants.type_name_of(t.type)) for n, t in f.tensors.items()}
    assert got == expected_sparse_layout(outtype)
    assert not any(n.endswith("ffn_down.weight") for n in got)
    m = f.metadata
    assert m["general.architecture"] == "llama"
    assert m["general.file_type"] == quants.TYPES[outtype].file_type
    assert m["powerinfer.sparse_threshold"] == pytest.approx(THRESHOLD)
    assert m["powerinfer.ffn_activation"] == "relu"
    if outtype == "f16":    # predictors included: every 1-D tensor F32, every 2-D tensor F16 (spec 1.4)
        assert sum(1 for _, ty in got.values() if ty == "f32") == 1 + 2 * len(RANKS)


def test_sparse_tensor_data(ckpt):
    """ffn_down_t is the transposed HF down_proj; q/k are permuted; predictors are copied."""
    f = open_gguf(converted(ckpt, "sparse", "f32"))
    w, H, KV = ckpt["weights"], CFG["num_attention_heads"], CFG["num_key_value_heads"]
    for i, pred in enumerate(ckpt["preds"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        np.testing.assert_array_equal(tensor_f32(f.tensors[b + "ffn_down_t.weight"]), w[p + "mlp.down_proj.weight"].T)
        np.testing.assert_array_equal(tensor_f32(f.tensors[b + "ffn_gate.weight"]), w[p + "mlp.gate_proj.weight"])
        np.testing.assert_array_equal(tensor_f32(f.tensors[b + "attn_q.weight"]),
                                      permute_qk(w[p + "self_attn.q_proj.weight"], H))
        np.testing.assert_array_equal(tensor_f32(f.tensors[b + "attn_k.weight"]),
                                      permute_qk(w[p + "self_attn.k_proj.weight"], KV))
        np.testing.assert_array_equal(tensor_f32(f.tensors[b + "fc1.weight"]), pred["fc1.weight"])
        np.testing.assert_array_equal(tensor_f32(f.tensors[b + "fc2.weight"]), pred["fc2.weight"])
    # quantized files hold exactly the reference quantization of the transposed matrix
    q = open_gguf(converted(ckpt, "sparse", "q4_0"))
    raw = np.asarray(q.tensors["blk.1.ffn_down_t.weight"].data)
    assert raw.tobytes() == quants.quantize_q4_0(w["model.layers.1.mlp.down_proj.weight"].T).tobytes()


@pytest.mark.parametrize("type_name", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_quants_match_the_reference_dequantizers(type_name):
    """powerinfer.quants' dequantizers agree with tests/reference_model.py's independent ones, and
    quantize -> dequantize is within the type's error bound."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import reference_model as ref
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[1, :32] = 0.0                                     # an all-zero block
    x[2, 5] = -40.0                                     # a block dominated by one value
    raw = quants.quantize(x, type_name)
    assert raw.shape == (6, quants.row_bytes(type_name, 96))
    ours = quants.dequantize(raw, type_name)
    theirs = ref.dequantize(raw, quants.TYPES[type_name].ggml_type, (96, 6))
    np.testing.assert_array_equal(ours.astype(np.float64), theirs)
    bound = {"f32": 0, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1 / 127, "q4_0": 1 / 7}[type_name]
    blocks = np.abs(x).reshape(6, -1, 32).max(-1, keepdims=True)
    err = np.abs(ours - x).reshape(6, -1, 32)
    assert (err <= bound * blocks + 1e-30).all()


def test_permute_qk_moves_rotate_half_pairs_together():
    hd, n_head = 8, 2
    w = np.arange(n_head * hd, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    rows = permute_qk(w, n_head)[:, 0].astype(int).tolist()
    assert rows == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def test_quantized_sparse_falls_back_to_f16_for_short_rows(ckpt):
    out = ckpt["base"] / "sparse-q8.gguf"
    res = convert_sparse(ckpt["model_dir"], ckpt["pred_dir"], out, "q8_0")
    assert res.tensor_types["blk.1.fc2.weight"] == "f16"          # rank 48: rows not a multiple of 32
    assert res.tensor_types["blk.0.fc2.weight"] == "q8_0"
    assert res.tensor_types["blk.1.fc1.weight"] == "q8_0"
    assert any("blk.1.fc2.weight" in wmsg for wmsg in res.warnings)


def test_sparse_all_neurons_active_equals_dense(ckpt):
    """The PWRI file in the engine with every neuron forced active gives the dense file's logits.
    xfails (not fails) only while the engine cannot load PWRI files or has no sparse_threshold."""
    sparse, dense = converted(ckpt, "sparse", "f32"), converted(ckpt, "dense", "f32")
    try:
        model = pi.Model(sparse)
    except pi.ModelLoadError as e:
        if "not implemented" in str(e):
            pytest.xfail(f"sparse engine in progress: {e}")
        raise
    try:
        ctx = pi.Context(model, n_ctx=64, kv_type="f32", sparse_threshold=-1e30)
    except TypeError as e:
        if "sparse_threshold" in str(e):
            pytest.xfail(f"sparse engine in progress: {e}")
        raise
    ctx.decode(ckpt["tokens"], logits="all")
    ours = np.stack([ctx.logits(i) for i in range(len(ckpt["tokens"]))])
    assert rel_rms(ours, engine_logits(dense, ckpt["tokens"])) < F32_REL_RMS
    assert rel_rms(ours, ckpt["ref"]) < F32_REL_RMS


# ---------------------------------------------------------------------------------------------
# other input formats and variants
# ---------------------------------------------------------------------------------------------
def _same_tensors(a: Path, b: Path) -> None:
    fa, fb = open_gguf(a), open_gguf(b)
    assert list(fa.tensors) == list(fb.tensors)
    for n, t in fa.tensors.items():
        assert (t.type, t.ne) == (fb.tensors[n].type, fb.tensors[n].ne), n
        assert np.asarray(t.data).tobytes() == np.asarray(fb.tensors[n].data).tobytes(), n


def test_pytorch_bin_checkpoint(ckpt, sp_model):
    d = write_checkpoint(ckpt["base"] / "bin-model", CFG, ckpt["weights"], sp_model, fmt="bin")
    assert not (d / "model.safetensors").exists()
    out = ckpt["base"] / "from-bin.gguf"
    convert_sparse(d, ckpt["pred_dir"], out, "f32")
    _same_tensors(out, converted(ckpt, "sparse", "f32"))


def test_bf16_sharded_safetensors(ckpt, sp_model):
    d = write_checkpoint(ckpt["base"] / "bf16-model", CFG, ckpt["weights"], sp_model, fmt="bf16-shards")
    out = ckpt["base"] / "from-bf16.gguf"
    convert_dense(d, out, "f32")
    f = open_gguf(out)
    for hf, gg in (("model.embed_tokens.weight", "token_embd.weight"),
                   ("model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"),
                   ("lm_head.weight", "output.weight")):
        want = quants.bf16_to_float(quants.float_to_bf16(ckpt["weights"][hf]))
        np.testing.assert_array_equal(tensor_f32(f.tensors[gg]), want)


def test_torch_free_reader_and_writer_agree_with_torch(tmp_path):
    rng = np.random.default_rng(5)
    sd = {"fc1.weight": rng.standard_normal((3, 5)).astype(np.float32),
          "fc2.weight": rng.standard_normal((4, 3)).astype(np.float16)}
    torch_free_save(tmp_path / "free.pt", sd)
    got = load_state_dict(tmp_path / "free.pt")
    for k, v in sd.items():
        assert got[k].shape == v.shape
        np.testing.assert_array_equal(got[k].load(), v)
    torch = _torch()
    if torch is None:
        return
    loaded = torch.load(tmp_path / "free.pt", weights_only=True)          # the writer's format is torch's
    for k, v in sd.items():
        np.testing.assert_array_equal(loaded[k].numpy(), v)
    torch_free_save(tmp_path / "one.pt", sd["fc1.weight"])                 # one tensor (activation_N.pt)
    np.testing.assert_array_equal(torch.load(tmp_path / "one.pt", weights_only=True).numpy(), sd["fc1.weight"])
    base = torch.from_numpy(sd["fc1.weight"])
    torch.save({"t": base.t(), "bf": base.to(torch.bfloat16), "view": base[1:, 2:],
                "h": base.half()}, tmp_path / "torch.pt")
    got = load_state_dict(tmp_path / "torch.pt")
    np.testing.assert_array_equal(got["t"].load(), sd["fc1.weight"].T)
    np.testing.assert_array_equal(got["view"].load(), sd["fc1.weight"][1:, 2:])
    np.testing.assert_array_equal(got["bf"].load(), base.to(torch.bfloat16).float().numpy())
    assert got["bf"].dtype == "BF16" and got["h"].dtype == "F16"


def test_tied_embeddings_added_tokens_rope_scaling_and_bamboo(ckpt, sp_model):
    cfg = dict(CFG, tie_word_embeddings=True, vocab_size=304, rope_scaling={"type": "linear", "factor": 2.0},
               model_type="bamboo", architectures=["BambooForCausalLM"])
    weights = make_weights(cfg, seed=7)
    assert "lm_head.weight" not in weights
    d = write_checkpoint(ckpt["base"] / "tied", cfg, weights, sp_model)
    (d / "added_tokens.json").write_text(json.dumps({"<extra_0>": 300, "<extra_1>": 301}))
    out = ckpt["base"] / "tied.gguf"
    res = convert_dense(d, out, "f32")
    assert res.arch == "bamboo"
    f = open_gguf(out)
    m = f.metadata
    assert "output.weight" not in f.tensors
    assert m["general.architecture"] == "bamboo"
    assert m["bamboo.rope.scaling.type"] == "linear" and m["bamboo.rope.scaling.factor"] == pytest.approx(2.0)
    assert m["tokenizer.ggml.tokens"][300:] == ["<extra_0>", "<extra_1>", "[PAD302]", "[PAD303]"]
    assert m["tokenizer.ggml.token_type"][300:] == [4, 4, 4, 4]
    # as a llama model the engine must match the reference (tied head, linear RoPE scaling)
    cfg_llama = dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"])
    (d / "config.json").write_text(json.dumps(cfg_llama))
    out2 = ckpt["base"] / "tied-llama.gguf"
    convert_dense(d, out2, "f32")
    ref = ReferenceModel.from_hf(weights, cfg_llama).forward(ckpt["tokens"])
    assert rel_rms(engine_logits(out2, ckpt["tokens"]), ref) < F32_REL_RMS


def test_silu_model_records_silu(ckpt, sp_model):
    d = write_checkpoint(ckpt["base"] / "silu", dict(CFG, hidden_act="silu"), ckpt["weights"], sp_model)
    out = ckpt["base"] / "silu.gguf"
    convert_dense(d, out, "f16")
    assert open_gguf(out).metadata["powerinfer.ffn_activation"] == "silu"


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
@pytest.fixture()
def broken(ckpt, tmp_path):
    """Fresh copies of the model and predictor dirs to break."""
    m = tmp_path / "m"
    p = tmp_path / "p"
    shutil.copytree(ckpt["model_dir"], m)
    shutil.copytree(ckpt["pred_dir"], p)
    return m, p, tmp_path / "out.gguf"


def _edit_config(m: Path, **changes):
    cfg = json.loads((m / "config.json").read_text())
    cfg.update(changes)
    (m / "config.json").write_text(json.dumps(cfg))


def _no_leftovers(out: Path):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


ERROR_CASES = {
    "no_config": (lambda m, p: (m / "config.json").unlink(), "config.json"),
    "no_weights": (lambda m, p: (m / "model.safetensors").unlink(), "no weights"),
    "no_tokenizer": (lambda m, p: (m / "tokenizer.model").unlink(), "tokenizer.model"),
    "no_predictors": (lambda m, p: [f.unlink() for f in p.glob("*.pt")], "model_0.pt"),
    "no_predictor_dir": (lambda m, p: shutil.rmtree(p), "does not exist"),
    "too_few_predictors": (lambda m, p: (p / "model_1.pt").unlink(), "found 1 predictor files"),
    "too_many_predictors": (lambda m, p: shutil.copy(p / "model_0.pt", p / "model_2.pt"), "found 3 predictor files"),
    "gap_in_predictors": (lambda m, p: (p / "model_0.pt").rename(p / "model_5.pt"), "no predictor files"),
    "fc1_wrong_n_embd": (lambda m, p: save_torch(p / "model_1.pt", {
        "fc1.weight": np.zeros((32, 65), np.float32), "fc2.weight": np.zeros((128, 32), np.float32)}),
        "fc1.weight has shape [32, 65]"),
    "fc2_wrong_n_ff": (lambda m, p: save_torch(p / "model_0.pt", {
        "fc1.weight": np.zeros((32, 64), np.float32), "fc2.weight": np.zeros((100, 32), np.float32)}),
        "fc2.weight has shape [100, 32]"),
    "predictor_bias": (lambda m, p: save_torch(p / "model_0.pt", {
        "fc1.weight": np.zeros((32, 64), np.float32), "fc2.weight": np.zeros((128, 32), np.float32),
        "fc1.bias": np.zeros(32, np.float32)}), "unexpected fc1.bias"),
    "model_type_falcon": (lambda m, p: _edit_config(m, model_type="falcon", architectures=["FalconForCausalLM"]),
                          "'falcon'"),
    "architecture_mistral": (lambda m, p: _edit_config(m, architectures=["MistralForCausalLM"]),
                             "'MistralForCausalLM'"),
    "bad_activation": (lambda m, p: _edit_config(m, hidden_act="tanh"), "hidden_act 'tanh'"),
    "layer_count": (lambda m, p: _edit_config(m, num_hidden_layers=3), "the model has 3 layers"),
    # the loader refuses a sparse file of a non-ReLU model, so the converter does not write one
    "silu_model": (lambda m, p: _edit_config(m, hidden_act="silu"), "hidden_act 'silu': a sparse"),
    "gelu_model": (lambda m, p: _edit_config(m, hidden_act="gelu"), "convert-dense.py"),
    "predictors_vs_n_ff": (lambda m, p: _edit_config(m, intermediate_size=96),
                           "fc2.weight has shape [128, 32], expected [96, 32]"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_sparse_conversion_errors(broken, case):
    m, p, out = broken
    breaker, needle = ERROR_CASES[case]
    breaker(m, p)
    with pytest.raises(ConversionError) as ei:
        convert_sparse(m, p, out, "f16")
    assert needle in str(ei.value)
    assert "\n" not in str(ei.value)
    _no_leftovers(out)


def test_dense_weight_shape_and_missing_tensor_errors(broken):
    m, p, out = broken
    _edit_config(m, intermediate_size=96)
    with pytest.raises(ConversionError, match=r"mlp.gate_proj.weight has shape \[128, 64\], expected \[96, 64\]"):
        convert_dense(m, out, "f16")
    _edit_config(m, intermediate_size=128, num_hidden_layers=3)
    with pytest.raises(ConversionError, match="model.layers.2.self_attn.q_proj.weight is missing"):
        convert_dense(m, out, "f16")
    _no_leftovers(out)


def test_unknown_outtype(ckpt, tmp_path):
    with pytest.raises(ConversionError, match="unknown outtype 'q5_k'"):
        convert_dense(ckpt["model_dir"], tmp_path / "o.gguf", "q5_k")
    with pytest.raises(ConversionError, match="unknown outtype"):
        convert_sparse(ckpt["model_dir"], ckpt["pred_dir"], tmp_path / "o.gguf", "bf16")


def test_failure_while_writing_keeps_the_old_file(broken, ckpt):
    """A conversion that fails after the header was written leaves the old output untouched."""
    m, p, out = broken
    w = dict(ckpt["weights"])
    w["model.layers.1.mlp.up_proj.weight"] = w["model.layers.1.mlp.up_proj.weight"].copy()
    w["model.layers.1.mlp.up_proj.weight"][3, 4] = np.nan
    save_safetensors(m / "model.safetensors", w)
    out.write_bytes(b"old contents")
    with pytest.raises(ConversionError, match="blk.1.ffn_up.weight: the weights contain NaN"):
        convert_sparse(m, p, out, "f16")
    assert out.read_bytes() == b"old contents"
    assert not [q for q in out.parent.iterdir() if q.name.endswith(".tmp")]


# ---------------------------------------------------------------------------------------------
# command lines
# ---------------------------------------------------------------------------------------------
def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bindings")]
                                        + [env.get("PYTHONPATH", "")] * bool(env.get("PYTHONPATH")))
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_convert_default_outfile(ckpt, tmp_path):
    m, p = tmp_path / "My-Model", tmp_path / "pred"
    shutil.copytree(ckpt["model_dir"], m)
    shutil.copytree(ckpt["pred_dir"], p)
    r = _run("convert.py", str(m), str(p))
    assert r.returncode == 0, r.stderr
    out = m / "My-Model.powerinfer.gguf"
    assert out.read_bytes()[:4] == b"PWRI"
    assert "blk.1.fc2.weight" in r.stderr and r.stdout == ""
    r = _run("convert-dense.py", "--outtype", "q8_0", str(m))
    assert r.returncode == 0, r.stderr
    assert open_gguf(m / "ggml-model-q8_0.gguf").magic == "GGUF"


def test_cli_errors_exit_1_with_one_line(ckpt, tmp_path):
    r = _run("convert.py", "--outfile", str(tmp_path / "x.gguf"), str(ckpt["model_dir"]), str(tmp_path / "nope"))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "does not exist" in r.stderr
    assert not (tmp_path / "x.gguf").exists()
    r = _run("convert-dense.py", str(tmp_path / "missing-model"))
    assert r.returncode == 1 and "model directory does not exist" in r.stderr
    r = _run("convert-dense.py", "--outtype", "q5_k", str(ckpt["model_dir"]))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "invalid choice: 'q5_k'" in r.stderr


def test_next_run_removes_temporaries_of_a_killed_conversion(ckpt, tmp_path):
    """A conversion killed with SIGKILL leaves .<out>.<pid>.tmp behind; the next conversion to the same
    output deletes it (its process is gone) and keeps the temporary of a conversion still running."""
    out = tmp_path / "out.gguf"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".out.gguf.{dead.pid}.tmp"
    stale.write_bytes(b"half a model")
    live = tmp_path / f".out.gguf.{os.getppid()}.tmp"        # our parent is alive
    live.write_bytes(b"being written")
    other = tmp_path / f".other.gguf.{dead.pid}.tmp"         # another output's: not ours to touch
    other.write_bytes(b"x")
    convert_dense(ckpt["model_dir"], out, "f16")
    assert out.is_file() and not stale.exists() and live.exists() and other.exists()


def test_sigterm_during_conversion_leaves_no_temporary(ckpt, tmp_path):
    """convert.py unwinds on SIGTERM as on Ctrl+C: exit 130 and no temporary file."""
    import signal
    out = tmp_path / "big.gguf"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bindings")]
                                        + [env.get("PYTHONPATH", "")] * bool(env.get("PYTHONPATH")))
    code = ("import sys, time, runpy; sys.argv = ['convert-dense.py', '--outfile', sys.argv[1], sys.argv[2]];"
            "import powerinfer.convert.writer as w; real = w.encode_tensor;"
            "w.encode_tensor = lambda *a: (print('writing', flush=True), time.sleep(60), real(*a))[2];"
            "sys.exit(runpy.run_path(%r)['main'](sys.argv[1:]))" % str(ROOT / "convert-dense.py"))
    proc = subprocess.Popen([sys.executable, "-c", code, str(out), str(ckpt["model_dir"])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        assert proc.stdout.readline().strip() == "writing"
        assert [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_dense_down_t_from_the_checkpoint_is_kept_by_sparsify(ckpt, tmp_path):
    """convert-dense.py --down-t writes ffn_down_t quantized from the checkpoint's own matrix; tools/sparsify.py
    keeps those bytes (no second rounding) instead of transposing the quantized ffn_down."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import sparsify
    out, sparse = tmp_path / "dense-down-t.gguf", tmp_path / "dense-down-t.sparse.gguf"
    convert_dense(ckpt["model_dir"], out, "q4_0", down_t=True)
    f = open_gguf(out)
    down = ckpt["weights"]["model.layers.0.mlp.down_proj.weight"]            # [n_embd, n_ff]
    raw = np.asarray(f.tensors["blk.0.ffn_down_t.weight"].data).reshape(-1)
    assert np.array_equal(raw, quants.quantize(np.ascontiguousarray(down.T), "q4_0").reshape(-1))
    assert sparsify.main([str(out), str(Path(__file__).resolve().parents[1] / "data" / "heldout.txt"), "-o",
                          str(sparse), "--calib-tokens", "128", "--ctx", "64", "--eval-chunks", "0"]) == 0
    g = open_gguf(sparse)
    for il in range(CFG["num_hidden_layers"]):
        name = f"blk.{il}.ffn_down_t.weight"
        assert np.array_equal(np.asarray(g.tensors[name].data), np.asarray(f.tensors[name].data)), name
    assert pi.Model(sparse).gate_sparse
