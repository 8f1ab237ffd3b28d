"""The test suite's small model files, all written by `write_gguf` (one GGUFWriter path: keys,
tensors encoded to the file's types, the PWRI magic) and `rewrite` (a copy with changes). The dense
llama/bamboo files of every size come from tools/make_test_model.py (write_model), whose vocabulary
(add_vocab) every file here shares.

    write_arch_model(path, "gemma3", seed=0)             llama/mistral, qwen2, qwen3, gemma2, gemma3, gpt-oss (f32)
    write_sparse_model(path, dtype="q4_0", ranks=(32, 64))  the tiny llama in the PowerInfer (PWRI) layout
    write_sparse_arch_model(path, "falcon", dtype="q8_0")   sparse falcon / opt (PWRI)
    rewrite(src, dst, meta=..., drop=..., replace=...)    a copy with changed keys or tensors
    write_lora(path, base, targets=..., rank=8)           a random LoRA adapter (llama.cpp's GGUF) of a base file
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf import GGUFValueType as VT
from gguf import RopeScalingType
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_test_model import add_vocab, synthetic_vocab, write_model  # noqa: E402

TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "mxfp4": Q.MXFP4}


def encode(w: np.ndarray, dtype: str):
    """(data, ggml type) of a float tensor stored as dtype (1-D tensors stay f32)."""
    if w.ndim == 1 or dtype == "f32":
        return w.astype(np.float32), Q.F32
    if dtype == "f16":
        return w.astype(np.float16), Q.F16
    return quantize(w.astype(np.float32), TYPES[dtype]), TYPES[dtype]


def tensor_dtype(name: str, dtype: str, dtypes: dict[str, str] | None) -> str:
    """dtypes[k] for the first key k that is part of name (e.g. {"ffn_": "mxfp4"}), else dtype."""
    return next((v for k, v in (dtypes or {}).items() if k in name), dtype)


def write_gguf(path, arch: str, tensors: dict, *, dtype: str = "f32", pred_dtype: str | None = None,
               keys=None, fields=(), pwri: bool = False, dtypes: dict[str, str] | None = None) -> Path:
    """Write a model file. tensors: {name: float array (numpy shape = reversed ne)}, stored as dtype
    (predictors fc1/fc2 as pred_dtype, default dtype; dtypes: other types by part of the name, tensor_dtype);
    keys(writer): adds the file's keys; fields: (name, value, type, sub type) keys copied as they are; pwri: the
    PowerInfer magic."""
    path = Path(path)
    w = GGUFWriter(str(path), arch)
    for name, value, vtype, sub in fields:
        w.add_key_value(name, value, vtype, sub_type=sub)
    if keys is not None:
        keys(w)
    for name, arr in tensors.items():
        pred = name.endswith(("fc1.weight", "fc2.weight"))
        # biases stay f32 whatever their dims (gpt-oss's [n_ff, n_expert] expert biases), as llama.cpp's converter
        # keeps every tensor whose name does not end in .weight
        data, q = encode(np.asarray(arr), "f32" if name.endswith(".bias") else (pred_dtype or dtype) if pred
                         else tensor_dtype(name, dtype, dtypes))
        w.add_tensor(name, data, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if pwri:
        with open(path, "r+b") as f:
            f.write(b"PWRI")
    return path


def rewrite(src, dst, *, meta=None, drop=(), replace=None, extra=None, arch=None) -> Path:
    """Copy a GGUF file through gguf.GGUFReader/GGUFWriter with changes.

    meta: {key: (value, GGUFValueType) | (values, ARRAY, element type) | None (delete)}; drop: tensor names to leave
    out;
    replace / extra: {name: (numpy data, ggml type)} for changed / additional tensors.
    """
    meta, replace, extra = meta or {}, replace or {}, extra or {}
    r = GGUFReader(src)
    w = GGUFWriter(str(dst), arch or r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in meta:
            continue
        vtype = f.types[0]
        w.add_key_value(key, f.contents(), vtype, sub_type=f.types[-1] if vtype == VT.ARRAY else None)
    for key, v in meta.items():
        if v is not None:          # (value, type) or (values, ARRAY, their type)
            w.add_key_value(key, v[0], v[1], sub_type=v[2] if len(v) > 2 else None)
    for t in r.tensors:
        if t.name in drop:
            continue
        data, dt = replace.get(t.name, (t.data, t.tensor_type))
        w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=dt)
    for name, (data, dt) in extra.items():
        w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=dt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def rename_arch(src, dst, arch: str, meta=None) -> Path:
    """A copy of src under general.architecture `arch`, every "<old arch>.*" key renamed "<arch>.*"; meta: more
    changes (rewrite's, applied after the renaming)."""
    r = GGUFReader(str(src))
    old = r.fields["general.architecture"].contents()
    renamed = {}
    for key, f in r.fields.items():
        if key.startswith(old + "."):
            vtype = f.types[0]
            renamed[key] = None
            renamed[arch + key[len(old):]] = (f.contents(), vtype, *([f.types[-1]] if vtype == VT.ARRAY else []))
    del r
    return rewrite(src, dst, meta={**renamed, **(meta or {})}, arch=arch)


def random_weights(seed: int):
    """mat(n_out, n_in) (std 1/sqrt(n_in)), norm(n) (1 + 0.1 N(0, 1)), bias(n) (0.1 N(0, 1)) of one generator."""
    rng = np.random.default_rng(seed)

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)
    return rng, mat, norm, bias


def layer_weights(mat, norm, E: int, F: int, Eq: int, Ekv: int) -> dict[str, np.ndarray]:
    """One llama layer's random weights under their GGUF names (without .weight), drawn in this order."""
    return {"attn_norm": norm(E), "attn_q": mat(Eq, E), "attn_k": mat(Ekv, E), "attn_v": mat(Ekv, E),
            "attn_output": mat(E, Eq), "ffn_norm": norm(E), "ffn_gate": mat(F, E), "ffn_up": mat(F, E),
            "ffn_down": mat(E, F)}


# ------------------------------------------------------------------ llama/mistral, qwen2, qwen3, gemma3 (issue 7)
CONFIGS = {
    # llama: GQA, rope "normal" pairs
    "llama": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=3, head_dim=32,
                  rope_base=10000.0, eps=1e-5),
    # qwen2: llama + q/k/v biases, NEOX rope, tied output
    "qwen2": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=3, head_dim=32,
                  rope_base=1000000.0, eps=1e-6),
    # qwen3: qwen2 without biases, with per-head q/k RMSNorm; head_dim (key_length 64) != n_embd / n_head (32), as
    # in Qwen3-0.6B (16 heads of 128 over n_embd 1024); an output matrix of its own (Qwen3-8B and larger)
    "qwen3": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=3, head_dim=64,
                  rope_base=1000000.0, eps=1e-6),
    # gemma3: head_dim (key_length 64) != n_embd / n_head (32); 7 layers = 5 local, 1 global (il = 5),
    # 1 local; a sliding window of 5 positions so that a 16-token prompt exercises it
    "gemma3": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=1, n_layer=7, head_dim=64,
                   rope_base=1000000.0, eps=1e-6, n_swa=5),
    # gemma2: gemma3's blocks without q/k norms, with soft-capped attention scores and logits; head_dim 64 !=
    # n_embd / n_head (as 2B: 256 vs 288); every other layer local (the even ones, 0 and 2 of 4) with the one rope
    # base; a window of 5 for a 16-token prompt; caps far below Gemma 2's 50 and 30 (attention 5, logits 3) so that
    # they change these small scores (about 1 unit) and logits (up to about 2): tests/test_arch.py measures each
    "gemma2": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=4, head_dim=64,
                   rope_base=10000.0, eps=1e-6, n_swa=5, attn_softcap=5.0, final_softcap=3.0),
}
CONFIGS["mistral"] = CONFIGS["llama"]
# phi3: llama with NEOX rope, fused attn_qkv and gate|up ffn_up, long / short rope factors over an original
# context of 512 positions (a multiple of 256: llama.cpp pads its contexts to those) with an attention factor
# (Phi-3.5-mini's longrope); n_rot 24 of head_dim 32: partial rotary as in Phi-4-mini (the attention factor scales
# only the rotated dims); no output matrix (tied, as Phi-4-mini)
# granite: llama with Granite 3.x's four multipliers (values of granite-3.1-2b's order of magnitude); smollm3: llama
# whose layers 3 and 7 (of 8) apply no rope
CONFIGS["granite"] = dict(CONFIGS["llama"], embedding_scale=12.0, attention_scale=0.015625, residual_scale=0.22,
                          logit_scale=8.0)
CONFIGS["smollm3"] = dict(CONFIGS["llama"], n_layer=8)
# glm4: fused q|k|v with a bias, fused gate|up, NORMAL rope over half of each head (rope.dimension_count 16 of 32),
# norms before and after each block
CONFIGS["glm4"] = dict(CONFIGS["llama"], n_rot=16)
# olmo2: no pre-norms, post-norms, q/k RMSNorm over the whole projection; with a window (OLMo 3): 5 layers, every 4th
# global, a window of 5 positions
CONFIGS["olmo2"] = dict(CONFIGS["llama"], n_layer=5, n_swa=5)
# gpt-oss: qwen2's family (NEOX rope, q/k/v biases) with an attention output bias, a sink logit per head, YaRN (factor
# 32 over an original 4096 positions, as the released files), head_dim 64 != n_embd / n_head (as 2880 / 64 heads of
# 64), every other layer local (0 and 2 of 4) with a window of 5 for a 16-token prompt, and biased experts (4, 2 used,
# 64 wide: expert_feed_forward_length, feed_forward_length 96 beside it) with the OAI SwiGLU. The experts' gate and up
# rows are 4x the usual scale (exp_scale) so that their values pass the SwiGLU's limit of 7 (about 1 in 12 of them
# does), and the sinks are of the scores' size (std 1.5): tests/test_gptoss.py measures what each changes.
CONFIGS["gpt-oss"] = dict(n_vocab=320, n_embd=128, n_ff=96, n_ff_exp=64, n_head=4, n_head_kv=2, n_layer=4,
                          head_dim=64, rope_base=150000.0, eps=1e-5, n_swa=5, n_expert=4, n_expert_used=2,
                          yarn_factor=32.0, orig_ctx=4096, exp_scale=4.0, sink_std=1.5)
# gemma4: gemma3's blocks with two layer shapes: local layers (L) of 2 KV heads of 32 (rope over all 32 dims, base
# 10000), global ones (G) of 1 KV head of 64 with proportional rope (rope_freqs: 8 of 32 pairs rotated, the others
# factor 1e30) over base 1e6; the pattern L L G L G L G with the last 2 layers reading the caches of layers 3 (L) and 4
# (G) (shared_kv_layers 2: llama.cpp's n_kv - 2 and n_kv - 1); the global layers without attn_v (V = K); an FFN width
# per layer; a layer_output_scale per layer; a final cap of 3 (the logits reach about 2); a window of 5 positions;
# q_norm weights of about 1/sqrt(head_dim) (the attention does not scale q: scores of about unit size, as trained models
# have)
CONFIGS["gemma4"] = dict(n_vocab=320, n_embd=128, n_head=4, n_layer=7, local=(1, 1, 0, 1, 0, 1, 0),
                         head_dim=64, head_dim_swa=32, n_head_kv=(2, 2, 1, 2, 1, 2, 1),
                         n_ff=(96, 128, 160, 96, 128, 192, 160),
                         n_rot_pairs=8, rope_base=1000000.0, rope_base_swa=10000.0, eps=1e-6, n_swa=5, shared_kv=2,
                         final_softcap=3.0)
CONFIGS["phi3"] = dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=3, head_dim=32, n_rot=24,
                       rope_base=10000.0, eps=1e-5, orig_ctx=512, attn_factor=1.2)

# ---- architectures on llama's blocks with flags (llama_block_layer_weights, llama_block_keys)
# the architectures of llama_block_layer_weights / llama_block_keys, in the order they were added
LLAMA_BLOCK_ARCHS = ("mistral3", "exaone4", "ernie4_5", "seed_oss", "hunyuan-dense", "arcee", "command-r", "cohere2",
                "exaone", "apertus")
# mistral3 (Ministral 3): llama with YaRN (factor 16, mscale_all_dim 1: llama.cpp's yarn_log_multiplier; betas 32 / 1)
# over an original context of 8 positions, so that a 16-token prompt's positions 8..15 get q times 1 + 0.1 ln 2
# (attention.temperature_scale 0.1: Ministral 3's llama_4_scaling_beta), and an attn_output bias
CONFIGS["mistral3"] = dict(CONFIGS["llama"], yarn_factor=16.0, orig_ctx=8, yarn_log_mul=1.0, temp_scale=0.1)
# exaone4 (EXAONE 4.0): no pre-norms, post-norms, q/k RMSNorm per head, NEOX rope; 64 layers (llama.cpp windows
# the 64-layer 32B only) of a smaller width, a window of 5 positions, the pattern a flag per layer (every 4th global,
# without rope) as the converter writes it
CONFIGS["exaone4"] = dict(CONFIGS["llama"], n_embd=64, n_ff=96, head_dim=16, n_layer=64, n_swa=5, rope_base=1000000.0)

# ernie4_5 (ERNIE 4.5 0.3B): llama's blocks (the converter splits its fused q|k|v and gate|up), tied embeddings
CONFIGS["ernie4_5"] = dict(CONFIGS["llama"], tied=True)
# seed_oss (Seed-OSS-36B): NEOX rope, q/k/v biases, post_attention_norm as the FFN's pre-norm, heads of 64 (key_length)
# over n_embd / n_head = 32 (as its 80 heads of 128 over 5120)
CONFIGS["seed_oss"] = dict(CONFIGS["llama"], head_dim=64, key_length=True, rope_base=10000000.0)
# hunyuan-dense (Hunyuan 0.5B .. 7B): NEOX rope, per-head q/k norms after the rope, the base as the converter writes it
# (10000 * 1000^(32 / 30): alpha baked in)
CONFIGS["hunyuan-dense"] = dict(CONFIGS["llama"], rope_base=10000.0 * 1000.0 ** (32 / 30))
# arcee (AFM-4.5B): llama with an FFN of ReLU^2 and no gate (no ffn_gate tensors)
CONFIGS["arcee"] = dict(CONFIGS["llama"])
# command-r (Command-R 35B): LayerNorm without biases, attention and FFN from one norm, tied output, logits times 0.25;
# cohere2 (Command R7B): the same with a window of 5 positions over layers 0..2 and 4 of 5 (3: global, no rope)
CONFIGS["command-r"] = dict(CONFIGS["llama"], tied=True, logit_scale=0.25)
CONFIGS["cohere2"] = dict(CONFIGS["llama"], tied=True, logit_scale=0.25, n_layer=5, n_swa=5)
# exaone (EXAONE 3.5): llama's blocks with NEOX rope and Llama 3.1-style rope factors
CONFIGS["exaone"] = dict(CONFIGS["llama"], rope_freqs=True)
# apertus (Apertus 8B / 70B): NEOX rope after per-head q/k norms, an FFN without a gate whose activation is xIELU with
# per-layer parameters (of Apertus-8B's size: alpha_p ~ 0.8 .. 1, alpha_n ~ 0.8 .. 1.6, beta 0.5, eps -1e-6)
CONFIGS["apertus"] = dict(CONFIGS["llama"], xielu_alpha_n=[0.8, 1.2, 1.6], xielu_alpha_p=[0.8, 0.9, 1.0],
                          xielu_beta=0.5, xielu_eps=-1e-6)


def llama_block_layer_weights(arch: str, p: str, w: dict, rng, mat, norm, c: dict) -> None:
    """Layer p's weights (w, updated) where an architecture on llama's blocks differs from llama's."""
    if arch == "mistral3":
        w[p + "attn_output.bias"] = (0.5 * rng.standard_normal(c["n_embd"])).astype(np.float32)
    if arch == "seed_oss":
        Eq, Ekv = c["n_head"] * c["head_dim"], c["n_head_kv"] * c["head_dim"]
        for k, n in (("q", Eq), ("k", Ekv), ("v", Ekv)):
            w[p + f"attn_{k}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        w[p + "post_attention_norm.weight"] = w.pop(p + "ffn_norm.weight")
    if arch == "arcee":
        del w[p + "ffn_gate.weight"]
    if arch in ("command-r", "cohere2"):
        del w[p + "ffn_norm.weight"]
    if arch == "apertus":
        del w[p + "ffn_gate.weight"]
        w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(c["head_dim"]), norm(c["head_dim"])
    if arch == "hunyuan-dense":
        w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(c["head_dim"]), norm(c["head_dim"])
    if arch == "exaone4":
        del w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"]
        w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(c["head_dim"]), norm(c["head_dim"])
        w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(c["n_embd"]), norm(c["n_embd"])


def llama_block_keys(writer, arch: str, c: dict) -> None:
    """The keys llama.cpp's converter writes for an architecture on llama's blocks beyond llama's."""
    if arch == "mistral3":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(c["yarn_factor"])
        writer.add_rope_scaling_orig_ctx_len(c["orig_ctx"])
        writer.add_rope_scaling_yarn_beta_fast(32.0)
        writer.add_rope_scaling_yarn_beta_slow(1.0)
        writer.add_rope_scaling_yarn_log_mul(c["yarn_log_mul"])
        writer.add_attn_temperature_scale(c["temp_scale"])
    if c.get("key_length"):
        writer.add_key_length(c["head_dim"])
        writer.add_value_length(c["head_dim"])
    if arch in ("command-r", "cohere2"):    # what llama.cpp's converters write (CommandR2Model, Cohere2Model)
        writer.add_layer_norm_eps(c["eps"])
        writer.add_logit_scale(c["logit_scale"])
    if arch == "apertus":      # global keys (llama.cpp's LLM_KV_XIELU_*), a value per layer as the converter writes
        n = c["n_layer"]
        writer.add_xielu_alpha_n(c["xielu_alpha_n"])
        writer.add_xielu_alpha_p(c["xielu_alpha_p"])
        writer.add_xielu_beta([c["xielu_beta"]] * n)
        writer.add_xielu_eps([c["xielu_eps"]] * n)
    if arch == "cohere2":
        writer.add_sliding_window(c["n_swa"])
    if arch == "exaone4":
        writer.add_sliding_window(c["n_swa"])
        writer.add_sliding_window_pattern([(il + 1) % 4 != 0 for il in range(c["n_layer"])])


def make_weights(arch: str, seed: int = 0, rope_freqs: bool = False) -> dict[str, np.ndarray]:
    """Float32 weights (numpy shapes: (out, in) for matrices) under their GGUF names. rope_freqs: add
    Llama 3.1-style frequency factors (rope_freqs.weight, [head_dim/2], from 1 up to 8 for low frequencies)."""
    c = CONFIGS[arch]
    if arch == "gemma4":
        return gemma4_weights(c, seed)
    rng, mat, norm, _ = random_weights(seed)
    E, F, V, hd = c["n_embd"], c["n_ff"], c["n_vocab"], c["head_dim"]
    Eq, Ekv = c["n_head"] * hd, c["n_head_kv"] * hd
    w = {"token_embd.weight": rng.standard_normal((V, E)).astype(np.float32) * (0.05 if arch in ("gemma2", "gemma3")
                                                                                 else 1.0),
         "output_norm.weight": norm(E)}
    if arch in ("llama", "mistral", "qwen3", "granite", "smollm3", "olmo2", "gpt-oss", "glm4") + LLAMA_BLOCK_ARCHS and \
            not c.get("tied"):
        w["output.weight"] = mat(V, E)
    if rope_freqs:
        w["rope_freqs.weight"] = np.geomspace(1.0, 8.0, hd // 2).astype(np.float32)
    if arch == "phi3":
        half = c["n_rot"] // 2
        w["rope_factors_short.weight"] = np.geomspace(1.0, 1.5, half).astype(np.float32)
        w["rope_factors_long.weight"] = np.geomspace(1.0, 12.0, half).astype(np.float32)
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        w.update((p + k + ".weight", v) for k, v in layer_weights(mat, norm, E, F, Eq, Ekv).items())
        if arch in ("phi3", "glm4"):
            w[p + "attn_qkv.weight"] = np.concatenate([w.pop(p + f"attn_{x}.weight") for x in "qkv"])
            w[p + "ffn_up.weight"] = np.concatenate([w.pop(p + "ffn_gate.weight"), w[p + "ffn_up.weight"]])
        if arch == "glm4":      # the fused q|k|v bias and the norms after each block
            w[p + "attn_qkv.bias"] = (0.5 * rng.standard_normal(Eq + 2 * Ekv)).astype(np.float32)
            w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(E), norm(E)
        if arch == "qwen2":
            for k, n in (("q", Eq), ("k", Ekv), ("v", Ekv)):
                w[p + f"attn_{k}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if arch in ("gemma3", "qwen3"):
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        if arch in ("gemma2", "gemma3"):
            w[p + "post_attention_norm.weight"] = norm(E)
            w[p + "post_ffw_norm.weight"] = norm(E)
        if arch == "olmo2":
            del w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"]
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(Eq), norm(Ekv)
            w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(E), norm(E)
        if arch == "gpt-oss":
            w.update(gptoss_layer(rng, mat, c, p, w))
        llama_block_layer_weights(arch, p, w, rng, mat, norm, c)
    return w


def gemma4_weights(c: dict, seed: int) -> dict[str, np.ndarray]:
    """gemma4's weights: each layer of its own shape (CONFIGS["gemma4"]); the shared-KV layers without attn_k, attn_v
    and attn_k_norm, the global layers without attn_v; layer_output_scale [1] in 0.5..1.5."""
    rng, mat, norm, _ = random_weights(seed)
    E, V, H = c["n_embd"], c["n_vocab"], c["n_head"]
    half = c["head_dim"] // 2
    w = {"token_embd.weight": rng.standard_normal((V, E)).astype(np.float32) * 0.05, "output_norm.weight": norm(E),
         "rope_freqs.weight": np.array([1.0] * c["n_rot_pairs"] + [1e30] * (half - c["n_rot_pairs"]), np.float32)}
    n_kv = c["n_layer"] - c["shared_kv"]
    for il, local in enumerate(c["local"]):
        p, hd = f"blk.{il}.", c["head_dim_swa"] if local else c["head_dim"]
        lw = layer_weights(mat, norm, E, c["n_ff"][il], H * hd, c["n_head_kv"][il] * hd)
        drop = ("attn_k", "attn_v") if il >= n_kv else () if local else ("attn_v",)
        w.update((p + k + ".weight", v) for k, v in lw.items() if k not in drop)
        w[p + "attn_q_norm.weight"] = norm(hd) / math.sqrt(hd)    # scores of about unit size: the model scales q by 1
        if il < n_kv:
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(E), norm(E)
        w[p + "layer_output_scale.weight"] = rng.uniform(0.5, 1.5, 1).astype(np.float32)
    return w


# gemma4's mixture of experts (the 26B-A4B's layout): the layers of "layers" (local and global, with their own KV and
# sharing it; 1 and 4 stay dense) get 4 experts of 64 (2 per token) beside their dense FFN, the router's input scale of
# about sqrt(n_embd) (router logits of about unit size) and per-expert output scales in 0.5..1.5
GEMMA4_MOE = dict(n_expert=4, n_expert_used=2, n_ff_exp=64, layers=(0, 2, 3, 5, 6), router_std=6.0)


def gemma4_moe_weights(seed: int, fused: bool = False, moe: dict = GEMMA4_MOE) -> dict[str, np.ndarray]:
    """gemma4_weights (CONFIGS["gemma4"]) with experts in moe["layers"]: ffn_gate_inp (.weight, .scale),
    ffn_gate_exps and ffn_up_exps (fused: one ffn_gate_up_exps, each expert's gate rows then its up rows),
    ffn_down_exps (.weight, .scale), pre_ffw_norm_2, post_ffw_norm_1 and post_ffw_norm_2."""
    c = CONFIGS["gemma4"]
    w = gemma4_weights(c, seed)
    rng, mat, norm, _ = random_weights(seed + 1000)
    E, F, NE = c["n_embd"], moe["n_ff_exp"], moe["n_expert"]
    for il in moe["layers"]:
        p = f"blk.{il}."
        w[p + "ffn_gate_inp.weight"] = mat(NE, E) * np.float32(moe["router_std"])
        w[p + "ffn_gate_inp.scale"] = norm(E) * np.float32(math.sqrt(E))
        gate, up = (np.stack([mat(F, E) for _ in range(NE)]) for _ in "gu")
        if fused:
            w[p + "ffn_gate_up_exps.weight"] = np.concatenate([gate, up], axis=1)     # (NE, 2F, E)
        else:
            w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = gate, up
        w[p + "ffn_down_exps.weight"] = np.stack([mat(E, F) for _ in range(NE)])
        w[p + "ffn_down_exps.scale"] = rng.uniform(0.5, 1.5, NE).astype(np.float32)
        for k in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
            w[p + k + ".weight"] = norm(E)
    return w


def write_gemma4_moe_model(path, seed: int = 0, fused: bool = False, dtype: str = "f32",
                           dtypes: dict[str, str] | None = None, weights: dict | None = None,
                           meta: dict | None = None) -> dict[str, np.ndarray]:
    """A gemma4 file with experts (gemma4_moe_weights unless weights are given) and the keys llama.cpp's converter
    writes for them (expert_count, expert_used_count, expert_feed_forward_length); meta as write_gemma4_model's."""
    w = gemma4_moe_weights(seed, fused) if weights is None else weights
    keys = {"expert_count": GEMMA4_MOE["n_expert"], "expert_used_count": GEMMA4_MOE["n_expert_used"],
            "expert_feed_forward_length": GEMMA4_MOE["n_ff_exp"], **(meta or {})}
    return write_gemma4_model(path, w, CONFIGS["gemma4"], dtype=dtype, dtypes=dtypes, meta=keys)


def gemma4_ple_weights(c: dict, seed: int, n_pl: int) -> dict[str, np.ndarray]:
    """gemma4_weights with per-layer embeddings of width n_pl (the E2B / E4B models): per_layer_token_embd [n_pl
    n_layer, n_vocab] (std 1/sqrt(n_pl): rows of about unit size after the model's sqrt(n_pl)), per_layer_model_proj
    [n_embd, n_pl n_layer], per_layer_proj_norm [n_pl] and each layer's inp_gate [n_embd, n_pl], proj [n_pl, n_embd],
    post_norm [n_embd] (from their own generator: gemma4_weights' tensors unchanged)."""
    w = gemma4_weights(c, seed)
    rng, mat, norm, _ = random_weights(seed + 1000)
    E, V, L = c["n_embd"], c["n_vocab"], c["n_layer"]
    w["per_layer_token_embd.weight"] = (rng.standard_normal((V, n_pl * L)) / math.sqrt(n_pl)).astype(np.float32)
    w["per_layer_model_proj.weight"] = mat(n_pl * L, E)
    w["per_layer_proj_norm.weight"] = norm(n_pl)
    for il in range(L):
        p = f"blk.{il}."
        w[p + "inp_gate.weight"], w[p + "proj.weight"], w[p + "post_norm.weight"] = mat(n_pl, E), mat(E, n_pl), norm(E)
    return w


def write_gemma4_ple_model(path, seed: int = 0, n_pl: int = 32, dtype: str = "f32",
                           dtypes: dict[str, str] | None = None, weights: dict | None = None,
                           meta: dict | None = None) -> dict[str, np.ndarray]:
    """A gemma4 file with per-layer embeddings (CONFIGS["gemma4"] and gemma4_ple_weights, or weights) and
    embedding_length_per_layer_input n_pl; returns its weights."""
    c = CONFIGS["gemma4"]
    w = gemma4_ple_weights(c, seed, n_pl) if weights is None else weights
    return write_gemma4_model(path, w, c, dtype=dtype, dtypes=dtypes,
                              meta={"embedding_length_per_layer_input": n_pl, **(meta or {})})


def gptoss_layer(rng, mat, c, p, w) -> dict[str, np.ndarray]:
    """Layer p's gpt-oss tensors beyond llama's (whose FFN and ffn_norm are removed from w): q/k/v and output biases,
    sinks, post_attention_norm (the norm before the experts), the router and the experts with their biases."""
    E, Fx, NE, hd = c["n_embd"], c["n_ff_exp"], c["n_expert"], c["head_dim"]
    s = c["exp_scale"]
    out = {p + "post_attention_norm.weight": w.pop(p + "ffn_norm.weight")}
    for k in ("ffn_gate", "ffn_up", "ffn_down"):
        del w[p + k + ".weight"]
    for k, n in (("q", c["n_head"] * hd), ("k", c["n_head_kv"] * hd), ("v", c["n_head_kv"] * hd), ("output", E)):
        out[p + f"attn_{k}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
    out[p + "attn_sinks.weight"] = (c["sink_std"] * rng.standard_normal(c["n_head"])).astype(np.float32)
    out[p + "ffn_gate_inp.weight"] = mat(NE, E)
    out[p + "ffn_gate_inp.bias"] = (0.5 * rng.standard_normal(NE)).astype(np.float32)
    out[p + "ffn_gate_exps.weight"] = (s * rng.standard_normal((NE, Fx, E)) / np.sqrt(E)).astype(np.float32)
    out[p + "ffn_up_exps.weight"] = (s * rng.standard_normal((NE, Fx, E)) / np.sqrt(E)).astype(np.float32)
    out[p + "ffn_down_exps.weight"] = (rng.standard_normal((NE, E, Fx)) / np.sqrt(Fx) / s).astype(np.float32)
    for k, n in (("gate", Fx), ("up", Fx), ("down", E)):
        out[p + f"ffn_{k}_exps.bias"] = (0.5 * rng.standard_normal((NE, n))).astype(np.float32)
    return out


def write_arch_model(path, arch: str, seed: int = 0, weights: dict | None = None,
                     chat_template: str | None = None, dtype: str = "f32",
                     dtypes: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Write a GGUF of `arch` (general.architecture as given; matrices as dtype, f32 by default, or as dtypes says
    by part of their names, e.g. {"ffn_": "mxfp4"}) and return its weights."""
    c = CONFIGS[arch]
    w = make_weights(arch, seed, rope_freqs=c.get("rope_freqs", False)) if weights is None else weights
    if arch == "gemma4":
        return write_gemma4_model(path, w, c, chat_template=chat_template, dtype=dtype, dtypes=dtypes)

    def keys(writer):
        writer.add_context_length(131072 if arch == "gpt-oss" else 512)
        writer.add_embedding_length(c["n_embd"])
        writer.add_block_count(c["n_layer"])
        writer.add_feed_forward_length(c["n_ff"])
        writer.add_head_count(c["n_head"])
        writer.add_head_count_kv(c["n_head_kv"])
        writer.add_layer_norm_rms_eps(c["eps"])
        writer.add_rope_freq_base(c["rope_base"])
        if arch in ("gemma2", "gemma3", "qwen3", "gpt-oss"):
            writer.add_key_length(c["head_dim"])
            writer.add_value_length(c["head_dim"])
        if arch == "gemma2":      # the keys llama.cpp's convert_hf_to_gguf.py writes (Gemma2Model)
            writer.add_attn_logit_softcapping(c["attn_softcap"])
            writer.add_final_logit_softcapping(c["final_softcap"])
        if arch in ("gemma2", "gemma3", "olmo2", "gpt-oss"):
            writer.add_sliding_window(c["n_swa"])
        if arch not in ("gemma2", "gemma3"):
            writer.add_rope_dimension_count(c.get("n_rot", c["head_dim"]))
        if arch == "granite":
            writer.add_embedding_scale(c["embedding_scale"])
            writer.add_attention_scale(c["attention_scale"])
            writer.add_residual_scale(c["residual_scale"])
            writer.add_logit_scale(c["logit_scale"])
        if arch == "gpt-oss":    # what llama.cpp's converter writes (GptOssModel)
            writer.add_expert_count(c["n_expert"])
            writer.add_expert_used_count(c["n_expert_used"])
            writer.add_expert_feed_forward_length(c["n_ff_exp"])
            writer.add_rope_scaling_type(RopeScalingType.YARN)
            writer.add_rope_scaling_factor(c["yarn_factor"])
            writer.add_rope_scaling_orig_ctx_len(c["orig_ctx"])
        if arch == "phi3":       # what llama.cpp's converter writes for a longrope model
            writer.add_rope_scaling_orig_ctx_len(c["orig_ctx"])
            writer.add_rope_scaling_attn_factors(c["attn_factor"])
            writer.add_sliding_window(c["orig_ctx"] - 1)
        llama_block_keys(writer, arch, c)
        add_vocab(writer, *synthetic_vocab(c["n_vocab"]))
        if chat_template is not None:
            writer.add_chat_template(chat_template)
    write_gguf(path, arch, w, keys=keys, dtype=dtype, dtypes=dtypes)
    return w


def write_gemma4_model(path, w: dict, c: dict, chat_template: str | None = None, dtype: str = "f32",
                       dtypes: dict[str, str] | None = None, meta: dict | None = None) -> dict[str, np.ndarray]:
    """A gemma4 file with the keys llama.cpp's converter writes (Gemma4Model: per-layer head_count_kv and
    feed_forward_length arrays, sliding_window_pattern a flag per layer, key_length(_swa), rope.dimension_count(_swa),
    shared_kv_layers); meta: {key: value} replacing or adding keys (None: left out)."""
    keys = {"context_length": 512, "embedding_length": c["n_embd"], "block_count": c["n_layer"],
            "feed_forward_length": list(c["n_ff"]), "attention.head_count": c["n_head"],
            "attention.head_count_kv": list(c["n_head_kv"]), "attention.layer_norm_rms_epsilon": c["eps"],
            "attention.key_length": c["head_dim"], "attention.value_length": c["head_dim"],
            "attention.key_length_swa": c["head_dim_swa"], "attention.value_length_swa": c["head_dim_swa"],
            "rope.dimension_count": c["head_dim"], "rope.dimension_count_swa": c["head_dim_swa"],
            "rope.freq_base": c["rope_base"], "rope.freq_base_swa": c["rope_base_swa"],
            "attention.sliding_window": c["n_swa"], "attention.sliding_window_pattern": [bool(v) for v in c["local"]],
            "attention.shared_kv_layers": c["shared_kv"], "embedding_length_per_layer_input": 0,
            "final_logit_softcapping": c["final_softcap"], **(meta or {})}

    def add_keys(writer):
        add_arch_keys(writer, "gemma4", keys, int_list=VT.UINT32)
        add_vocab(writer, *synthetic_vocab(c["n_vocab"]))
        if chat_template is not None:
            writer.add_chat_template(chat_template)
    write_gguf(path, "gemma4", w, keys=add_keys, dtype=dtype, dtypes=dtypes)
    return w


# ------------------------------------------------------------------ the tiny llama, sparse (PWRI)
def write_sparse_model(path, *, dtype="f32", pred_dtype=None, ranks=(32, 64), seed=0, threshold=None,
                       arch="llama", predictors=True, **shape) -> Path:
    """Write a PWRI file: the tiny random llama of tools/make_test_model.py with ffn_down_t = ffn_down
    transposed and random per-layer predictors fc1/fc2; ranks gives the predictor rank per layer
    (n_layer = len(ranks)). predictors=False leaves fc1/fc2 out (an invalid sparse file, for error tests)."""
    path = Path(path)
    dense = path.with_suffix(".dense-f32.gguf")
    shape = {**dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2), **shape, "n_layer": len(ranks)}
    write_model(dense, dtype="f32", seed=seed, arch=arch, ffn_act="relu", **shape)
    reader = GGUFReader(dense)
    fields = [(name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
              for name, f in reader.fields.items() if not name.startswith("GGUF.") and name != "general.architecture"]
    tensors = {}
    for t in reader.tensors:
        w = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("ffn_down.weight"):
            tensors[t.name.replace("ffn_down", "ffn_down_t")] = np.ascontiguousarray(w.T)   # (n_ff, n_embd)
        else:
            tensors[t.name] = w
    rng = np.random.default_rng(seed + 1000)
    E, F = shape["n_embd"], shape["n_ff"]
    for il, r in enumerate(ranks if predictors else ()):
        tensors[f"blk.{il}.fc1.weight"] = rng.standard_normal((r, E)).astype(np.float32) / np.sqrt(E)
        tensors[f"blk.{il}.fc2.weight"] = rng.standard_normal((F, r)).astype(np.float32) / np.sqrt(r)
    del reader
    write_gguf(path, arch, tensors, dtype=dtype,
               pred_dtype=pred_dtype or ("f16" if dtype in ("f32", "bf16") else dtype),
               fields=fields, pwri=True,
               keys=None if threshold is None else lambda w: w.add_float32("powerinfer.sparse_threshold", threshold))
    dense.unlink()
    return path


# ------------------------------------------------------------------ sparse falcon and opt (PWRI)
SPARSE_ARCH_SHAPE = dict(n_vocab=320, n_embd=64, n_ff=256, n_head=4)


def sparse_arch_tensors(arch, *, n_vocab, n_embd, n_ff, n_head, n_head_kv, ranks, attn_norm_2, seed):
    """numpy float32 weights, numpy shape = reversed GGUF ne (row i of an [E, N] tensor = output i)."""
    rng, mat, normw, bias = random_weights(seed)
    E, F, hd = n_embd, n_ff, n_embd // n_head
    Ekv = hd * n_head_kv
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


def write_sparse_arch_model(path, arch, *, dtype="f32", ranks=(32, 64), n_head_kv=None, attn_norm_2=True,
                            seed=0, drop=(), replace=None, pwri=True, eps="default") -> Path:
    """A small random PWRI falcon/opt file. drop: tensor names to leave out; replace: {name: array};
    eps: {arch}.attention.layer_norm_epsilon (default: 1e-5 for falcon, none for opt, as the converters)."""
    shape = SPARSE_ARCH_SHAPE
    n_head_kv = n_head_kv or (2 if arch == "falcon" else shape["n_head"])
    tensors = sparse_arch_tensors(arch, **shape, n_head_kv=n_head_kv, ranks=ranks, attn_norm_2=attn_norm_2,
                                  seed=seed)
    tensors.update(replace or {})
    if eps == "default":
        eps = 1e-5 if arch == "falcon" else None

    def keys(w):
        w.add_name(f"tiny-{arch}")
        w.add_context_length(2048)
        w.add_embedding_length(shape["n_embd"])
        w.add_feed_forward_length(shape["n_ff"])
        w.add_block_count(len(ranks))
        w.add_head_count(shape["n_head"])
        w.add_head_count_kv(n_head_kv)
        if eps is not None:
            w.add_layer_norm_eps(eps)
        if arch == "falcon":
            w.add_string("falcon.tensor_data_layout", "jploski")
        add_vocab(w, *synthetic_vocab(shape["n_vocab"]))
    # f16 predictors keep the selection free of activation quantization (as tests/test_sparse.py)
    return write_gguf(path, arch, {k: v for k, v in tensors.items() if k not in drop}, dtype=dtype,
                      pred_dtype="f16" if dtype != "f32" else "f32", keys=keys, pwri=pwri)


# ------------------------------------------------------------------ LoRA adapters
from random_lora import LORA_ALL_LINEAR, write_lora  # noqa: E402,F401  (tools/random_lora.py)


def merge_lora(weights: dict, pairs: dict, scale: float, alpha: float) -> dict:
    """The weights with each adapted one W + scale * alpha / r * B A (float64), llama.cpp's rule (alpha 0: scale
    alone); weights and pairs as numpy arrays under GGUF names (write_lora's)."""
    out = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    for name, (a, b) in pairs.items():
        a, b = a.astype(np.float64), b.astype(np.float64)
        r = b.shape[1]
        s = scale * (alpha / r if alpha else 1.0)
        out[name] = out[name] + s * (a @ b.T if name == "token_embd.weight" else b @ a)
    return out


# ------------------------------------------------------------------ control vectors
def write_control_vector(path, n_embd: int, layers, *, seed: int = 0, scale: float = 0.5, extra=None) -> dict:
    """A control vector file as llama.cpp's cvector-generator writes it (general.architecture controlvector,
    controlvector.layer_count, f32 "direction.N" tensors) with random directions for the given layers (N >= 1);
    extra: {name: array} written as they are. Returns {layer: direction}."""
    rng = np.random.default_rng(seed)
    dirs = {int(il): (scale * rng.standard_normal(n_embd)).astype(np.float32) for il in layers}
    w = GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_int32("controlvector.layer_count", len(dirs))
    for il, d in dirs.items():
        w.add_tensor(f"direction.{il}", d)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dirs


# ------------------------------------------------------------------ deepseek2 (DeepSeek-V2 / V3, MLA + experts)
# Whole quant blocks along every row: nope 32 (attn_k_b's rows), R 32 (attn_v_b's, attn_q_b's with q_lora 32), n_embd
# 64, n_head * v 64 (attn_output's), the FFN widths multiples of 32.
DEEPSEEK2 = dict(n_vocab=320, n_embd=64, n_ff=96, n_head=4, n_layer=3, kv_lora_rank=32, n_rot=16, nope=32, v=16,
                 n_expert=6, n_expert_used=2, n_ff_exp=32, n_shared=1, n_dense=1, eps=1e-6, rope_base=10000.0)


def deepseek2_weights(seed: int = 0, q_lora: int = 0, kv_b: bool = False, probs_b: bool = False,
                      c: dict = DEEPSEEK2) -> dict:
    """Random deepseek2 weights: MLA attention (attn_q, or attn_q_a / attn_q_a_norm / attn_q_b with q_lora;
    attn_kv_a_mqa [n_embd, R + n_rot], attn_kv_a_norm, and attn_k_b [nope, R, n_head] / attn_v_b [R, v, n_head], or
    (kv_b, older files) one attn_kv_b [R, n_head (nope + v)], each head's k rows then its v rows), the first n_dense
    layers with a dense FFN, the others n_expert experts with a router (probs_b: and DeepSeek-V3's selection bias
    exp_probs_b.bias [n_expert], std 0.3) and n_shared shared experts (ffn_*_shexp)."""
    rng, mat, norm, bias = random_weights(seed)
    E, H, R, nr, nope, vd = c["n_embd"], c["n_head"], c["kv_lora_rank"], c["n_rot"], c["nope"], c["v"]
    NE, Fe, Fs = c["n_expert"], c["n_ff_exp"], c["n_ff_exp"] * c["n_shared"]
    w = {"token_embd.weight": mat(c["n_vocab"], E) * np.float32(8.0), "output_norm.weight": norm(E),
         "output.weight": mat(c["n_vocab"], E)}
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"] = norm(E), norm(E)
        if q_lora:
            w[p + "attn_q_a.weight"], w[p + "attn_q_a_norm.weight"] = mat(q_lora, E), norm(q_lora)
            w[p + "attn_q_b.weight"] = mat(H * (nope + nr), q_lora)
        else:
            w[p + "attn_q.weight"] = mat(H * (nope + nr), E)
        w[p + "attn_kv_a_mqa.weight"], w[p + "attn_kv_a_norm.weight"] = mat(R + nr, E), norm(R)
        kvb = mat(H * (nope + vd), R).reshape(H, nope + vd, R)
        if kv_b:
            w[p + "attn_kv_b.weight"] = kvb.reshape(H * (nope + vd), R)
        else:     # the converter's split: k_b transposed (H, R, nope), v_b (H, v, R)
            w[p + "attn_k_b.weight"] = np.ascontiguousarray(kvb[:, :nope, :].transpose(0, 2, 1))
            w[p + "attn_v_b.weight"] = np.ascontiguousarray(kvb[:, nope:, :])
        w[p + "attn_output.weight"] = mat(E, H * vd)
        if il < c["n_dense"]:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(c["n_ff"], E), mat(c["n_ff"], E)
            w[p + "ffn_down.weight"] = mat(E, c["n_ff"])
            continue
        w[p + "ffn_gate_inp.weight"] = mat(NE, E) * np.float32(3.0)
        w[p + "ffn_gate_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
        w[p + "ffn_up_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
        w[p + "ffn_down_exps.weight"] = np.stack([mat(E, Fe) for _ in range(NE)])
        w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(Fs, E), mat(Fs, E)
        w[p + "ffn_down_shexp.weight"] = mat(E, Fs)
        if probs_b:
            w[p + "exp_probs_b.bias"] = bias(NE) * np.float32(3.0)
    return w


def write_deepseek2_model(path, seed: int = 0, q_lora: int = 0, kv_b: bool = False, probs_b: bool = False,
                          dtype: str = "f32",
                          dtypes: dict[str, str] | None = None, meta: dict | None = None,
                          weights: dict | None = None, c: dict = DEEPSEEK2) -> dict[str, np.ndarray]:
    """A tiny deepseek2 file (deepseek2_weights unless weights are given) with the keys llama.cpp's converter writes
    (conversion/deepseek.py: key_length / value_length R + n_rot / R and key_length_mla / value_length_mla, or for
    kv_b the older files' key_length / value_length of the q/k and v heads; q_lora_rank 0 without q_lora, which
    llama.cpp requires for a model that is not one of the Lite layer counts); meta: {key: value} replacing or adding
    keys (None: left out; floats FLOAT32, ints UINT32, bools BOOL)."""
    w = deepseek2_weights(seed, q_lora, kv_b, probs_b, c) if weights is None else weights
    R, nr, nope, vd = c["kv_lora_rank"], c["n_rot"], c["nope"], c["v"]
    keys = {"context_length": 512, "embedding_length": c["n_embd"], "block_count": c["n_layer"],
            "feed_forward_length": c["n_ff"], "attention.head_count": c["n_head"],
            "attention.head_count_kv": c["n_head"] if kv_b else 1, "attention.layer_norm_rms_epsilon": c["eps"],
            "rope.freq_base": c["rope_base"], "rope.dimension_count": nr, "attention.q_lora_rank": q_lora,
            "attention.kv_lora_rank": R, "leading_dense_block_count": c["n_dense"], "vocab_size": c["n_vocab"],
            "expert_count": c["n_expert"], "expert_used_count": c["n_expert_used"],
            "expert_feed_forward_length": c["n_ff_exp"], "expert_shared_count": c["n_shared"],
            "expert_weights_scale": 1.0}
    if kv_b:
        keys.update({"attention.key_length": nope + nr, "attention.value_length": vd})
    else:
        keys.update({"attention.key_length": R + nr, "attention.value_length": R,
                     "attention.key_length_mla": nope + nr, "attention.value_length_mla": vd})
    keys.update(meta or {})

    def add_keys(writer):
        add_arch_keys(writer, "deepseek2", keys)
        add_vocab(writer, *synthetic_vocab(c["n_vocab"]))
    write_gguf(path, "deepseek2", w, keys=add_keys, dtype=dtype, dtypes=dtypes)
    return w


# ------------------------------------------------------------------ glm4moe, ernie4_5-moe, olmoe (moe_archs.py)
# Whole quant blocks along every row (n_embd 64, the q / expert / FFN widths multiples of 32). glm4moe: heads of 32
# (key_length: n_head * head_dim 128 != n_embd) roped over 16 dims, the first layer dense, one MTP layer after the 3;
# ernie4_5-moe: heads of 16 roped whole, a shared expert of 64, the first layer dense; olmoe: every layer with
# experts, the whole q and k normed.
MOE_ARCH_SHAPES = {
    "glm4moe": dict(n_vocab=320, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_rot=16, n_layer=3, n_ff=96,
                    n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=32, n_dense=1, nextn=1),
    "ernie4_5-moe": dict(n_vocab=320, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=16, n_layer=4, n_ff=96,
                         n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64, n_dense=1, nextn=0),
    "olmoe": dict(n_vocab=320, n_embd=64, n_head=4, n_head_kv=4, head_dim=16, n_rot=16, n_layer=3, n_ff=32,
                  n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=0, n_dense=0, nextn=0),
    "dots1": dict(n_vocab=320, n_embd=64, n_head=4, n_head_kv=4, head_dim=16, n_rot=16, n_layer=3, n_ff=96,
                  n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=32, n_dense=1, nextn=0),
    "bailingmoe2": dict(n_vocab=320, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=8, n_layer=3, n_ff=96,
                        n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64, n_dense=1, nextn=1),
    "hunyuan-moe": dict(n_vocab=320, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_rot=16, n_layer=2, n_ff=32,
                        n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64, n_dense=0, nextn=0),
}


def moe_arch_weights(arch: str, seed: int = 0, qk_norm: bool = False, qkv_bias: bool = True, probs_b: bool = True,
                     step: int = 1, c: dict | None = None) -> dict[str, np.ndarray]:
    """Random weights of a MOE_ARCH_SHAPES arch: attention (q/k/v biases with qkv_bias; glm4moe's per-head q/k norms
    with qk_norm, olmoe's whole-projection ones always), the router (std 3), experts, the shared expert where the shape
    has one, exp_probs_b.bias (std 0.3) with probs_b (not olmoe), dense layers where il < n_dense or (il + 1) % step
    (ernie4_5-moe's interleaving), glm4moe's FFN pre-norm as post_attention_norm, and its nextn MTP layers (a whole
    layer with the nextn tensors, which the loaders leave out)."""
    c = c or MOE_ARCH_SHAPES[arch]
    rng, mat, norm, bias = random_weights(seed)
    E, H, Hkv, hd = c["n_embd"], c["n_head"], c["n_head_kv"], c["head_dim"]
    NE, Fe, Fs = c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]
    w = {"token_embd.weight": mat(c["n_vocab"], E) * np.float32(8.0), "output_norm.weight": norm(E),
         "output.weight": mat(c["n_vocab"], E)}
    for il in range(c["n_layer"] + c["nextn"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(E)
        w[p + "attn_q.weight"], w[p + "attn_k.weight"] = mat(H * hd, E), mat(Hkv * hd, E)
        w[p + "attn_v.weight"] = mat(Hkv * hd, E)
        if arch == "bailingmoe2":     # one fused attn_qkv: q's rows, then k's, then v's
            w[p + "attn_qkv.weight"] = np.concatenate([w.pop(p + f"attn_{t}.weight") for t in "qkv"])
        if qkv_bias:
            w[p + "attn_q.bias"], w[p + "attn_k.bias"], w[p + "attn_v.bias"] = bias(H * hd), bias(Hkv * hd), \
                bias(Hkv * hd)
        if arch == "olmoe":
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(H * hd), norm(Hkv * hd)
        elif qk_norm or arch in ("dots1", "bailingmoe2", "hunyuan-moe"):
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(hd), norm(hd)
        w[p + "attn_output.weight"] = mat(E, H * hd)
        w[p + ("post_attention_norm.weight" if arch == "glm4moe" else "ffn_norm.weight")] = norm(E)
        if il < c["n_dense"] or (il + 1) % step:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(c["n_ff"], E), mat(c["n_ff"], E)
            w[p + "ffn_down.weight"] = mat(E, c["n_ff"])
        else:
            w[p + "ffn_gate_inp.weight"] = mat(NE, E) * np.float32(3.0)
            w[p + "ffn_gate_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
            w[p + "ffn_up_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
            w[p + "ffn_down_exps.weight"] = np.stack([mat(E, Fe) for _ in range(NE)])
            if Fs:
                w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(Fs, E), mat(Fs, E)
                w[p + "ffn_down_shexp.weight"] = mat(E, Fs)
            if probs_b and arch not in ("olmoe", "hunyuan-moe"):
                w[p + "exp_probs_b.bias"] = bias(NE) * np.float32(3.0)
        if il >= c["n_layer"]:        # an MTP layer (glm4moe, bailingmoe2)
            w[p + "nextn.eh_proj.weight"] = mat(E, 2 * E)
            w[p + "nextn.enorm.weight"], w[p + "nextn.hnorm.weight"] = norm(E), norm(E)
            w[p + "nextn.shared_head_norm.weight"] = norm(E)
            if arch == "bailingmoe2":
                w[p + "layer_output_norm.weight"] = norm(E)
    return w


def moe_arch_keys(arch: str, c: dict, step: int = 1, meta: dict | None = None) -> dict:
    """The "<arch>." keys (without the prefix) llama.cpp's converters write for a MOE_ARCH_SHAPES-like shape c
    (conversion/glm.py, dots1.py, bailingmoe.py, ernie.py, hunyuan.py, olmo.py); meta: replaced or added (None: left
    out)."""
    keys = {"context_length": 512, "embedding_length": c["n_embd"], "block_count": c["n_layer"] + c["nextn"],
            "feed_forward_length": c["n_ff"], "attention.head_count": c["n_head"],
            "attention.head_count_kv": c["n_head_kv"], "attention.layer_norm_rms_epsilon": 1e-5,
            "rope.freq_base": 10000.0, "rope.dimension_count": c["n_rot"], "expert_count": c["n_expert"],
            "expert_used_count": c["n_expert_used"], "vocab_size": c["n_vocab"]}
    if arch == "glm4moe":
        keys.update({"attention.key_length": c["head_dim"], "attention.value_length": c["head_dim"],
                     "expert_feed_forward_length": c["n_ff_exp"],
                     "expert_shared_count": c["n_ff_shexp"] // c["n_ff_exp"],
                     "leading_dense_block_count": c["n_dense"], "expert_gating_func": 2, "expert_weights_scale": 1.0,
                     "expert_weights_norm": True, "nextn_predict_layers": c["nextn"] or None})
    elif arch in ("dots1", "bailingmoe2"):
        keys.update({"expert_feed_forward_length": c["n_ff_exp"], "leading_dense_block_count": c["n_dense"],
                     "expert_gating_func": 2, "expert_weights_scale": 1.0, "expert_weights_norm": True})
        if arch == "dots1":
            keys["expert_shared_count"] = c["n_ff_shexp"] // c["n_ff_exp"]
        else:
            keys.update({"expert_shared_count": 1, "expert_shared_feed_forward_length": c["n_ff_shexp"],
                         "nextn_predict_layers": c["nextn"] or None})
    elif arch == "hunyuan-moe":
        keys.update({"expert_feed_forward_length": c["n_ff_exp"], "expert_shared_feed_forward_length": c["n_ff_shexp"]})
    elif arch == "ernie4_5-moe":
        keys.update({"expert_feed_forward_length": c["n_ff_exp"],
                     "expert_shared_feed_forward_length": c["n_ff_shexp"],
                     "leading_dense_block_count": c["n_dense"],
                     "interleave_moe_layer_step": step})
    keys.update(meta or {})
    return keys


def add_arch_keys(writer, arch: str, keys: dict, int_list: VT = VT.INT32) -> None:
    """keys as "<arch>." metadata by their Python type: None left out, str STRING, bool BOOL, int UINT32, float
    FLOAT32, lists ARRAYs of BOOL (bool items) or else of int_list."""
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, list):
            sub = VT.BOOL if value and isinstance(value[0], bool) else int_list
            writer.add_key_value(f"{arch}.{key}", value, VT.ARRAY, sub_type=sub)
            continue
        vt = (VT.STRING if isinstance(value, str) else VT.BOOL if isinstance(value, bool) else
              VT.UINT32 if isinstance(value, int) else VT.FLOAT32)
        writer.add_key_value(f"{arch}.{key}", value, vt)


def add_moe_arch_keys(writer, arch: str, keys: dict) -> None:
    """keys as "<arch>." metadata (add_arch_keys) and the test vocabulary."""
    add_arch_keys(writer, arch, keys)
    add_vocab(writer, *synthetic_vocab(int(keys["vocab_size"])))


def write_moe_arch_model(path, arch: str, seed: int = 0, dtype: str = "f32", meta: dict | None = None,
                         weights: dict | None = None, c: dict | None = None, **weight_opts) -> dict[str, np.ndarray]:
    """A tiny file of a MOE_ARCH_SHAPES arch (moe_arch_weights(arch, seed, **weight_opts) unless weights are given)
    with the keys llama.cpp's converters write (conversion/glm.py, dots1.py, bailingmoe.py, ernie.py, hunyuan.py,
    olmo.py); meta: {key: value} replacing or
    adding "<arch>." keys (None: left out; floats FLOAT32, ints UINT32, bools BOOL)."""
    c = c or MOE_ARCH_SHAPES[arch]
    w = moe_arch_weights(arch, seed, c=c, **weight_opts) if weights is None else weights
    keys = moe_arch_keys(arch, c, weight_opts.get("step", 1), meta)
    write_gguf(path, arch, w, keys=lambda writer: add_moe_arch_keys(writer, arch, keys), dtype=dtype)
# ------------------------------------------------------------------ qwen35 / qwen35moe / qwen3next (gated delta net)
# Whole quant blocks along every row: n_embd 64, the delta net's C = 2 H_k S + H_v S = 256 and H_v S = 128 (attn_qkv's,
# attn_gate's and ssm_out's), the gated q 2 n_head head_dim = 256, the FFN widths multiples of 32. Layers 0, 2, 4
# recurrent, 1 and 3 full attention (full_attention_interval 2). H_v = 2 H_k: the two head maps (tiled: qwen35,
# interleaved: qwen3next) differ.
QWEN35 = dict(n_vocab=320, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, head_dim=32, n_rot=8, n_layer=5, interval=2,
              d_conv=4, d_state=32, n_group=2, dt_rank=4, n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64,
              eps=1e-6, rope_base=10000000.0)


def qwen35_weights(arch: str = "qwen35", seed: int = 0, c: dict = QWEN35) -> dict[str, np.ndarray]:
    """Random weights in the layout llama.cpp's converter writes (conversion/qwen.py): recurrent layers attn_qkv
    [n_embd, C], attn_gate [n_embd, H_v S], ssm_beta / ssm_alpha [n_embd, H_v] (qwen3next: one ssm_ba [n_embd, 2 H_v],
    per key head its b then its a values), ssm_conv1d [d_conv, C], ssm_dt.bias, ssm_a (-exp(A_log)), ssm_norm [S],
    ssm_out; full-attention layers attn_q [n_embd, 2 n_head hd] (each head's q then its gate), attn_k / attn_v,
    attn_q_norm / attn_k_norm, attn_output; every layer attn_norm and post_attention_norm (the FFN's norm); the FFN
    dense (qwen35) or experts with a gated shared expert (qwen35moe, qwen3next)."""
    rng, mat, norm, bias = random_weights(seed)
    E, S, Hk, Hv, hd, H, Hkv = c["n_embd"], c["d_state"], c["n_group"], c["dt_rank"], c["head_dim"], c["n_head"], \
        c["n_head_kv"]
    C = 2 * Hk * S + Hv * S
    w = {"token_embd.weight": mat(c["n_vocab"], E) * np.float32(8.0), "output_norm.weight": norm(E),
         "output.weight": mat(c["n_vocab"], E)}
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"], w[p + "post_attention_norm.weight"] = norm(E), norm(E)
        if (il + 1) % c["interval"] != 0:
            w[p + "attn_qkv.weight"], w[p + "attn_gate.weight"] = mat(C, E), mat(Hv * S, E)
            if arch == "qwen3next":
                w[p + "ssm_ba.weight"] = mat(2 * Hv, E) * np.float32(2.0)
            else:
                w[p + "ssm_beta.weight"] = mat(Hv, E) * np.float32(2.0)
                w[p + "ssm_alpha.weight"] = mat(Hv, E) * np.float32(2.0)
            w[p + "ssm_conv1d.weight"] = (rng.standard_normal((C, c["d_conv"])) * 0.5).astype(np.float32)
            w[p + "ssm_dt.bias"] = bias(Hv) * np.float32(5.0)
            w[p + "ssm_a"] = -np.exp(rng.uniform(-1.0, 1.0, Hv)).astype(np.float32)
            w[p + "ssm_norm.weight"] = norm(S)
            w[p + "ssm_out.weight"] = mat(E, Hv * S)
        else:
            w[p + "attn_q.weight"] = mat(2 * H * hd, E)
            w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(Hkv * hd, E), mat(Hkv * hd, E)
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(hd), norm(hd)
            w[p + "attn_output.weight"] = mat(E, H * hd)
        if arch == "qwen35":
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(c["n_ff"], E), mat(c["n_ff"], E)
            w[p + "ffn_down.weight"] = mat(E, c["n_ff"])
            continue
        NE, Fe, Fs = c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]
        w[p + "ffn_gate_inp.weight"] = mat(NE, E) * np.float32(3.0)
        w[p + "ffn_gate_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
        w[p + "ffn_up_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
        w[p + "ffn_down_exps.weight"] = np.stack([mat(E, Fe) for _ in range(NE)])
        w[p + "ffn_gate_inp_shexp.weight"] = bias(E) * np.float32(3.0)
        w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(Fs, E), mat(Fs, E)
        w[p + "ffn_down_shexp.weight"] = mat(E, Fs)
    return w


def write_qwen35_model(path, arch: str = "qwen35", seed: int = 0, dtype: str = "f32",
                       dtypes: dict[str, str] | None = None, meta: dict | None = None, weights: dict | None = None,
                       c: dict = QWEN35, vocab=None) -> dict[str, np.ndarray]:
    """A tiny qwen35 / qwen35moe / qwen3next file with the keys llama.cpp's converter writes (ssm.*,
    full_attention_interval, rope.dimension_sections for Qwen3.5's M-RoPE, the experts' widths); meta: {key: value}
    replacing or adding keys (None: left out; lists: arrays of INT32 or BOOL)."""
    w = qwen35_weights(arch, seed, c) if weights is None else weights
    keys = {"context_length": 1024, "embedding_length": c["n_embd"], "block_count": c["n_layer"],
            "feed_forward_length": c["n_ff"], "attention.head_count": c["n_head"],
            "attention.head_count_kv": c["n_head_kv"], "attention.key_length": c["head_dim"],
            "attention.value_length": c["head_dim"], "attention.layer_norm_rms_epsilon": c["eps"],
            "rope.freq_base": c["rope_base"], "rope.dimension_count": c["n_rot"],
            "ssm.conv_kernel": c["d_conv"], "ssm.state_size": c["d_state"], "ssm.group_count": c["n_group"],
            "ssm.time_step_rank": c["dt_rank"], "ssm.inner_size": c["dt_rank"] * c["d_state"],
            "full_attention_interval": c["interval"], "vocab_size": c["n_vocab"]}
    if arch != "qwen3next":
        keys["rope.dimension_sections"] = c.get("sections", [2, 1, 1, 0])
    if arch != "qwen35":
        keys.update({"expert_count": c["n_expert"], "expert_used_count": c["n_expert_used"],
                     "expert_feed_forward_length": c["n_ff_exp"],
                     "expert_shared_feed_forward_length": c["n_ff_shexp"]})
    keys.update(meta or {})

    def add_keys(writer):
        add_arch_keys(writer, arch, keys)
        add_vocab(writer, *(vocab or synthetic_vocab(c["n_vocab"])))
    # the conv kernel stays f32 in every file type (as the converter and llama-quantize keep it)
    write_gguf(path, arch, w, keys=add_keys, dtype=dtype, dtypes={"ssm_conv1d": "f32", **(dtypes or {})})
    return w


# ------------------------------------------------------------------ lfm2 (attention + short conv layers)
# Whole quant blocks along every row: n_embd 64 (in_proj's 3 n_embd = 192 rows), n_ff 96. Layers 0, 1, 3 short convs
# (attention.head_count_kv 0), 2 and 4 attention (2 KV heads of 16); the conv's kernel length 3; the output tied to
# token_embd (as the released LFM2 files), its norm named token_embd_norm (as llama.cpp's converter writes it).
LFM2 = dict(n_vocab=320, n_embd=64, n_ff=96, n_head=4, head_dim=16, kv=[0, 0, 2, 0, 2], l_cache=3, eps=1e-5,
            rope_base=1000000.0)


def lfm2_weights(seed: int = 0, c: dict = LFM2) -> dict[str, np.ndarray]:
    """Random weights in the layout llama.cpp's converter writes (conversion/lfm2.py): conv layers
    shortconv.in_proj [n_embd, 3 n_embd], shortconv.conv [l_cache, n_embd], shortconv.out_proj; attention layers
    attn_q / attn_k / attn_v, attn_q_norm / attn_k_norm, attn_output; every layer attn_norm (the operator norm),
    ffn_norm and a SwiGLU FFN."""
    rng, mat, norm, _ = random_weights(seed)
    E, hd, H = c["n_embd"], c["head_dim"], c["n_head"]
    w = {"token_embd.weight": mat(c["n_vocab"], E) * np.float32(8.0), "token_embd_norm.weight": norm(E)}
    for il, kv in enumerate(c["kv"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"] = norm(E), norm(E)
        if kv == 0:
            w[p + "shortconv.in_proj.weight"] = mat(3 * E, E) * np.float32(2.0)
            w[p + "shortconv.conv.weight"] = (rng.standard_normal((E, c["l_cache"])) * 0.5).astype(np.float32)
            w[p + "shortconv.out_proj.weight"] = mat(E, E)
        else:
            w[p + "attn_q.weight"] = mat(H * hd, E)
            w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(kv * hd, E), mat(kv * hd, E)
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = norm(hd), norm(hd)
            w[p + "attn_output.weight"] = mat(E, H * hd)
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(c["n_ff"], E), mat(c["n_ff"], E)
        w[p + "ffn_down.weight"] = mat(E, c["n_ff"])
    return w


def write_lfm2_model(path, seed: int = 0, dtype: str = "f32", meta: dict | None = None, weights: dict | None = None,
                     c: dict = LFM2, vocab=None) -> dict[str, np.ndarray]:
    """A tiny lfm2 file with the keys llama.cpp's converter writes (attention.head_count_kv per layer,
    shortconv.l_cache); meta: {key: value} replacing or adding keys (None: left out; lists: INT32 arrays)."""
    w = lfm2_weights(seed, c) if weights is None else weights
    keys = {"context_length": 1024, "embedding_length": c["n_embd"], "block_count": len(c["kv"]),
            "feed_forward_length": c["n_ff"], "attention.head_count": c["n_head"],
            "attention.head_count_kv": list(c["kv"]), "attention.layer_norm_rms_epsilon": c["eps"],
            "rope.freq_base": c["rope_base"], "shortconv.l_cache": c["l_cache"], "vocab_size": c["n_vocab"]}
    keys.update(meta or {})

    def add_keys(writer):
        add_arch_keys(writer, "lfm2", keys)
        add_vocab(writer, *(vocab or synthetic_vocab(c["n_vocab"])))
    # the conv kernel stays f32 in every file type (llama-quantize keeps shortconv.conv.weight)
    write_gguf(path, "lfm2", w, keys=add_keys, dtype=dtype, dtypes={"shortconv.conv": "f32"})
    return w


# lfm2moe: LFM2's layers, layer 0's FFN dense (leading_dense_block_count 1), the others 4 experts of 32 (2 per token)
# routed by sigmoids with a selection bias (exp_probs_b)
LFM2MOE = dict(LFM2, n_expert=4, n_expert_used=2, n_ff_exp=32, n_dense=1)


def write_lfm2moe_model(path, seed: int = 0, dtype: str = "f32", meta: dict | None = None,
                        c: dict = LFM2MOE) -> dict[str, np.ndarray]:
    """A tiny lfm2moe file (llama.cpp's keys: leading_dense_block_count, expert_count, expert_used_count,
    expert_feed_forward_length, expert_gating_func 2)."""
    w = lfm2_weights(seed, c)
    rng, mat, _, bias = random_weights(seed + 100)
    E, NE, Fe = c["n_embd"], c["n_expert"], c["n_ff_exp"]
    for il in range(c["n_dense"], len(c["kv"])):
        p = f"blk.{il}."
        for k in ("ffn_gate", "ffn_up", "ffn_down"):
            del w[p + k + ".weight"]
        w[p + "ffn_gate_inp.weight"] = mat(NE, E) * np.float32(3.0)
        w[p + "ffn_gate_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
        w[p + "ffn_up_exps.weight"] = np.stack([mat(Fe, E) for _ in range(NE)])
        w[p + "ffn_down_exps.weight"] = np.stack([mat(E, Fe) for _ in range(NE)])
        w[p + "exp_probs_b.bias"] = bias(NE)
    keys = {"leading_dense_block_count": c["n_dense"], "expert_count": NE, "expert_used_count": c["n_expert_used"],
            "expert_feed_forward_length": Fe, "expert_gating_func": 2, **(meta or {})}
    tmp = Path(path).with_suffix(".lfm2.tmp")
    write_lfm2_model(tmp, dtype=dtype, weights=w, c=c)
    rename_arch(tmp, path, "lfm2moe", meta={f"lfm2moe.{k}": (v, VT.UINT32) for k, v in keys.items()})
    tmp.unlink()
    return w
