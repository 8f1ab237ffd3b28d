"""Independent float64 numpy reference implementation of the PowerInfer-py forward pass: the one
reference forward of every architecture the engine runs (llama/mistral, bamboo, qwen2, qwen3, gemma2, gemma3,
gpt-oss, and the sparse falcon and opt), written from llama.cpp's graphs and the original PowerInfer's.

Reads a GGUF file (or a PWRI-magic file: same layout, first 4 bytes b"PWRI") with
``gguf.GGUFReader``, dequantizes every tensor with the numpy dequantizers below
(written from the ggml block layouts, NOT gguf.quants), and computes logits in float64.
`ReferenceModel.from_weights` takes float weights under their GGUF names instead (with the file's
metadata), `ReferenceModel.from_hf` a Hugging Face llama/bamboo checkpoint's weights and config.

Contract (what the engine must match):
  x = token_embd[tok]  (gemma2, gemma3: * sqrt(n_embd); opt: + position_embd[pos + 2])
  per layer:
    h = norm(x, attn_norm),   rmsnorm(x) = x / sqrt(mean(x^2) + eps); falcon/opt: LayerNorm with bias
    q = Wq h, k = Wk h, v = Wv h                 (W numpy shape (out, in); + bias where the file has one;
                                                  falcon, phi3: one fused attn_qkv, all Q heads, then K,
                                                  then V)
    gemma3: q, k = rmsnorm per head (attn_q_norm, attn_k_norm)
    RoPE per head on q, k (not opt) over the first n_rot dims, pairs (2i, 2i+1) ("normal": llama,
        bamboo) or (i, i + n_rot/2) ("neox": qwen2, qwen3, gemma2, gemma3, falcon, HF checkpoints):
        theta = pos * freq_scale * base^(-2i/n_rot) / rope_freqs[i],
        freq_scale = 1/rope.scaling.factor for linear scaling, else 1; rope_freqs: 1 unless the file has them;
        yarn (ggml's rope_yarn): theta blends theta and theta / freq_scale by a per-pair ramp over the correction
        dims of rope.scaling.original_context_length (beta 32 / 1), cos and sin times 1 + 0.1 ln(1/freq_scale);
        cos and sin times rope.scaling.attn_factor; phi3: rope_freqs = rope_factors_short (the attribute
        rope_factors["long"] for a context longer than rope.scaling.original_context_length)
    attention per head, scale 1/sqrt(head_dim) (the 27B gemma2 / gemma3: 1/sqrt(n_embd / n_head); granite:
        attention.scale), causal (key j
        visible to query i iff pos[j] <= pos[i]; gemma3's local layers, il % 6 < 5: also pos[i] - pos[j] < n_swa,
        rope base 10000; gemma2's, il % 2 < 1: the same window, the one rope base (rope.freq_base_swa if given)),
        GQA: query head h uses kv head h // (n_head/n_head_kv);
        gemma2: each scaled score s -> attn_logit_softcapping * tanh(s / attn_logit_softcapping) before the mask
    a = Wo concat(heads) (+ bias); gemma2, gemma3: a = rmsnorm(a, post_attention_norm)
    falcon (parallel): x += a(norm(x, attn_norm_2 if present else attn_norm)) + ffn(norm(x, attn_norm))
    else: x += a; g = norm(x, ffn_norm); x += ffn(g) (gemma2, gemma3: rmsnorm(ffn(g), post_ffw_norm))
    ffn:
      llama  (PAR): hid = act(W_gate g) * (W_up g),   act = powerinfer.ffn_activation or silu (gemma2/3: gelu)
      bamboo (SYM): hid = act(W_gate g) * act(W_up g), act = powerinfer.ffn_activation or relu
      falcon/opt (SEQ): hid = relu(W_up g + up bias)
      sparse files: hid of neurons the predictor does not select is 0: relu(x W_fc1^T) W_fc2^T >= threshold
      over the pre-norm residual x; W_down = ffn_down_t^T; opt: + down bias
    x += W_down hid
  logits = W_out norm(x, output_norm), W_out = output.weight or token_embd (tied);
  gemma2: logits -> final_logit_softcapping * tanh(logits / final_logit_softcapping)
  gpt-oss (llama.cpp's openai-moe.cpp graph, build_attn with sinks, build_moe_ffn): q/k/v and attn_output biases, NEOX
    rope with the file's YaRN, scale 1/sqrt(n_rot); the softmax of each head's row takes one more column, the head's
    attn_sinks logit (unscaled), with no value; every other layer local (il % 2 == 0, attention.sliding_window), one
    rope base; post_attention_norm is the FFN's pre-norm (no post-norm anywhere); the FFN is a mixture of experts:
    router logits l = W_gate_inp g + bias, the n_expert_used largest l, their weights softmax(l_chosen)
    (SOFTMAX_WEIGHT), each expert hid = swiglu_oai(W_gate_e g + b_gate_e, W_up_e g + b_up_e) with
    swiglu_oai(a, b) = a' sigmoid(1.702 a') (b' + 1), a' = min(a, 7), b' = clip(b, -7, 7), out_e = W_down_e hid +
    b_down_e; the FFN's output sum_e w_e out_e
  gemma4 (llama.cpp's gemma4.cpp graph, without per-layer embeddings): gemma3's blocks where each layer has
    its own shape (layer_geom): local layers (sliding_window_pattern[il]) of head size key_length_swa, rope over
    rope.dimension_count_swa dims with base rope.freq_base_swa (10000) and no factors; global layers of key_length, rope
    over rope.dimension_count with base rope.freq_base and rope_freqs (1e30: a pair left unrotated); KV heads per layer
    (head_count_kv may be an array); q, k: rmsnorm per head with weights, v = rmsnorm per head without one (v = the k
    projection where the layer has no attn_v); scale 1; layers il >= n_kv = n_layer - shared_kv_layers have no k, v
    and attend over the cache of layer n_kv - 2 (local) or n_kv - 1 (global); after the FFN's residual add x *=
    layer_output_scale where the layer has one; FFN widths per layer. Its experts (the 26B-A4B; the layers with
    ffn_gate_inp): gemma4_moe_ffn
  gemma4's per-layer embeddings (E2B / E4B: embedding_length_per_layer_input n_pl > 0; llama.cpp's
    build_inp_per_layer and project_per_layer_inputs): per token P = (rmsnorm(x0 W_model_proj^T / sqrt(n_embd)) per
    n_pl chunk * per_layer_proj_norm + per_layer_token_embd[token] * sqrt(n_pl)) / sqrt(2), shape (n_layer, n_pl), x0
    the scaled token embedding; after layer li's FFN residual add (before layer_output_scale) x += rmsnorm(
    (gelu(x W_inp_gate^T) * P[li]) W_proj^T) * post_norm
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from gguf import GGUFReader

import reference_lfm2
import reference_qwen35

# ggml type ids (kept numeric on purpose: independent of gguf's enum)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16, GGML_MXFP4 = 0, 1, 2, 8, 30, 39


# --------------------------------------------------------------------------------------
# dequantizers: raw little-endian bytes -> float64, from the block layouts
# --------------------------------------------------------------------------------------
def _fp16_to_f64(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian IEEE half -> float64 (decoded by hand)."""
    u = b[..., 0].astype(np.uint32) | (b[..., 1].astype(np.uint32) << 8)
    sign = np.where(u >> 15, -1.0, 1.0)
    e = ((u >> 10) & 0x1F).astype(np.int64)
    m = (u & 0x3FF).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        val = np.where(e == 0, m * 2.0 ** -24, (1.0 + m / 1024.0) * np.exp2((e - 15).astype(np.float64)))
        val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
    return sign * val


def dequant_f32(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw, dtype=np.uint8).view("<f4").astype(np.float64)


def dequant_f16(raw: np.ndarray) -> np.ndarray:
    return _fp16_to_f64(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 2))


def dequant_bf16(raw: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 2)
    u = (b[:, 0].astype(np.uint32) << 16) | (b[:, 1].astype(np.uint32) << 24)
    with np.errstate(invalid="ignore"):
        return u.view("<f4").astype(np.float64)


def dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q8_0 block: 34 bytes = fp16 d, int8 q[32]; value = q * d."""
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 34)
    d = _fp16_to_f64(b[:, :2])
    q = b[:, 2:].view(np.int8).astype(np.float64)
    return (q * d[:, None]).reshape(-1)


def dequant_q4_0(raw: np.ndarray) -> np.ndarray:
    """Q4_0 block: 18 bytes = fp16 d, qs[16]; elem j = low nibble of qs[j],
    elem j+16 = high nibble of qs[j]; value = (nibble - 8) * d."""
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 18)
    d = _fp16_to_f64(b[:, :2])
    qs = b[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8.0
    return (q * d[:, None]).reshape(-1)


def dequant_mxfp4(raw: np.ndarray) -> np.ndarray:
    """MXFP4 block (OCP microscaling FP4): 17 bytes = E8M0 e, qs[16]; elem j = low nibble of qs[j], elem j+16 = high
    nibble; value = 2^(e - 127) * E2M1(nibble), E2M1 = sign bit 3, exponent bits 2..1, mantissa bit 0: (-1)^s * m/2
    for exponent 0, else (-1)^s * (1 + m/2) * 2^(exponent - 1). (E8M0's 255, a NaN in the spec, is 2^128 as in
    ggml.)"""
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 17)
    scale = np.exp2(b[:, 0].astype(np.float64) - 127.0)
    q = np.concatenate([b[:, 1:] & 0x0F, b[:, 1:] >> 4], axis=1).astype(np.int64)
    sign, ex, m = np.where(q >> 3, -1.0, 1.0), (q >> 1) & 3, (q & 1).astype(np.float64)
    mag = np.where(ex == 0, m / 2.0, (1.0 + m / 2.0) * np.exp2(ex.astype(np.float64) - 1.0))
    return (sign * mag * scale[:, None]).reshape(-1)


DEQUANT = {
    GGML_F32: dequant_f32,
    GGML_F16: dequant_f16,
    GGML_BF16: dequant_bf16,
    GGML_Q8_0: dequant_q8_0,
    GGML_Q4_0: dequant_q4_0,
    GGML_MXFP4: dequant_mxfp4,
}


def bf16_round(x) -> np.ndarray:
    """x rounded to the nearest bf16 (ties to even), as float64."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


class Bf16Weight(np.ndarray):
    """A bf16 weight matrix: x @ W (W.T too) rounds x to bf16 first, as the engine's bf16 matmuls do where
    powerinfer.bf16_dot() (and llama.cpp's: vdpbf16ps's operands). Every other operation gives plain arrays."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(i) if isinstance(i, Bf16Weight) else i for i in inputs]
        if ufunc is np.matmul and method == "__call__" and len(inputs) == 2 and isinstance(inputs[1], Bf16Weight):
            plain[0] = bf16_round(plain[0])
        return getattr(ufunc, method)(*plain, **kwargs)


def dequantize(raw: np.ndarray, ggml_type: int, ne) -> np.ndarray:
    """raw bytes of a tensor -> float64 array of numpy shape reversed(ne)."""
    fn = DEQUANT.get(int(ggml_type))
    if fn is None:
        raise NotImplementedError(f"ggml type {int(ggml_type)} not supported by the reference")
    out = fn(np.asarray(raw).reshape(-1).view(np.uint8))
    shape = tuple(int(n) for n in reversed(list(ne)))
    assert out.size == int(np.prod(shape)), (out.size, shape)
    return out.reshape(shape)


# --------------------------------------------------------------------------------------
# file reading
# --------------------------------------------------------------------------------------
def read_gguf(path) -> tuple[dict, dict]:
    """-> (metadata {key: python value}, tensors {name: (ggml_type, ne tuple, raw uint8 bytes copy)}).
    Accepts the PWRI magic: the file is read into memory, the magic patched to GGUF in a
    private temporary copy which is handed to GGUFReader, and deleted afterwards."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    tmp = None
    if magic == b"PWRI":
        data = bytearray(path.read_bytes())
        data[:4] = b"GGUF"
        fd, tmp = tempfile.mkstemp(suffix=".gguf")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        del data
        src = tmp
    elif magic == b"GGUF":
        src = str(path)
    else:
        raise ValueError(f"{path}: bad magic {magic!r}")
    try:
        r = GGUFReader(src)
        meta = {}
        for k, fld in r.fields.items():
            if k.startswith("GGUF."):
                continue
            meta[k] = fld.contents()
        tensors = {}
        for t in r.tensors:
            raw = np.array(np.asarray(t.data).reshape(-1).view(np.uint8), copy=True)
            tensors[t.name] = (int(t.tensor_type), tuple(int(n) for n in t.shape), raw)
        del r
    finally:
        if tmp is not None:
            os.unlink(tmp)
    return meta, tensors


# --------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------
def silu(x):
    return x / (1.0 + np.exp(-x))


def relu(x):
    return np.maximum(x, 0.0)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ACTS = {"silu": silu, "relu": relu, "gelu": gelu}


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + (0.0 if b is None else b)
NEOX_ARCHS = ("qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "gemma3", "gemma4", "falcon", "phi3", "olmo2",
              "gpt-oss")          # llama.cpp's LLAMA_ROPE_TYPE_NEOX among ours
LAYER_NORM_ARCHS = ("falcon", "opt")            # LayerNorm with bias, and the no-gate ReLU FFN
ARCHS = ("llama", "mistral", "bamboo", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "gemma3", "gemma4", "phi3",
         "granite",
         "granitemoe", "smollm3", "olmo2", "gpt-oss", "glm4", "deepseek2") + LAYER_NORM_ARCHS
# architectures on llama's blocks (_llama_block_setup)
ARCHS += ("mistral3", "exaone4", "ernie4_5", "seed_oss", "hunyuan-dense", "arcee", "command-r", "cohere2",
          "exaone", "apertus")
NEOX_ARCHS += ("exaone4", "seed_oss", "hunyuan-dense", "exaone", "apertus")
# mixture-of-experts archs on llama's blocks (_moe_arch_setup)
MOE_ARCHS = ("glm4moe", "dots1", "bailingmoe2", "ernie4_5-moe", "hunyuan-moe", "olmoe")
ARCHS += MOE_ARCHS
NEOX_ARCHS += ("glm4moe", "dots1", "bailingmoe2", "hunyuan-moe", "olmoe")
ARCHS += reference_qwen35.ARCHS     # hybrid gated delta net + gated attention (reference_qwen35.py)
ARCHS += reference_lfm2.ARCHS       # attention + short conv layers (reference_lfm2.py)
GEMMA_ARCHS = ("gemma2", "gemma3", "gemma4")     # embedding scale sqrt(n_embd), GELU, local layers
# Hugging Face llama/bamboo checkpoint names -> GGUF names (the rotate_half rope of HF is "neox" on the
# unpermuted q/k weights: the reference reads the checkpoint as it is)
HF_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
            "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
            "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
            "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down"}
HF_OF_GGUF = {gguf_name: hf for hf, gguf_name in HF_NAMES.items()}


def _weight(w: np.ndarray, ggml_type: int) -> np.ndarray:
    """bf16 matrices as Bf16Weight where the engine computes them on bf16 activations (powerinfer.bf16_dot())"""
    if ggml_type == GGML_BF16 and w.ndim == 2:
        import powerinfer
        if powerinfer.bf16_dot():
            return w.view(Bf16Weight)
    return w


class KVCache:
    def __init__(self, n_layer: int):
        self.k = [None] * n_layer   # per layer: (n_tok, n_head_kv, head_dim), post-RoPE
        self.v = [None] * n_layer
        self.pos = np.zeros(0, dtype=np.int64)


class ReferenceModel:
    neox = False          # rope pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    rope_freqs = None     # per-pair frequency divisors (rope_freqs.weight)
    yarn = False          # YaRN rope scaling (rope.scaling.type yarn), over yarn_orig_ctx positions
    yarn_orig_ctx = 0
    rope_attn_factor = 1.0   # cos and sin times this (rope.scaling.attn_factor)
    control_vector = None    # (n_layer, n_embd): row li added to the residual stream after layer li (llama.cpp's cvec)
    embd_scale = 1.0         # granite: the embeddings times embedding_scale
    attn_scale = None        # granite: q.k times attention.scale (None: 1/sqrt(head_dim))
    residual_scale = 1.0     # granite: each block's output times residual_scale before the residual add
    logit_scale = 1.0        # granite: the logits divided by logit_scale
    nope_step = 0            # smollm3: layers li with (li + 1) % 4 == 0 apply no rope
    attn_softcap = 0.0       # > 0: scaled attention scores s -> cap tanh(s / cap) before the mask (gemma2)
    final_softcap = 0.0      # > 0: logits -> cap tanh(logits / cap) (gemma2)
    use_sinks = True         # gpt-oss: the attn_sinks column in each softmax row (False: left out)
    local_layers = None      # a set of layer indices: those local instead of the ones n_swa / swa_pattern give
    expert_gating = "softmax_norm"   # "softmax_norm": the top-k softmax renormalized (Mixtral); "softmax_weight": the
                             # softmax of the chosen logits (gpt-oss); "softmax": the full softmax's p, not renormalized
    swiglu_alpha = 1.702     # ffn_act swiglu_oai (gpt-oss): llama.cpp's constants
    swiglu_limit = 7.0
    layer_geom = None        # gemma4: per layer dict(head_dim, n_head_kv, n_rot, local, kv_source); None: uniform
    v_norm = False           # gemma4: v rms-normed per head without a weight
    use_out_scale = True     # gemma4: x times layer_output_scale after each layer (False: left out)
    router_of_x = True       # gemma4's experts: the router reads the residual stream (False: the experts' input)
    gelu_f16 = False         # GELU through ggml's GGML_GELU_FP16 table (f16 input and output), as llama.cpp's CPU does
    yarn_betas = (32.0, 1.0)  # YaRN's beta_fast / beta_slow (mistral3: the file's rope.scaling.yarn_beta_*)
    yarn_log_mul = 0.0       # YaRN's mscale_all_dim m (rope.scaling.yarn_log_multiplier): cos/sin / (1 + 0.1 m ln f)
    attn_temp = 0.0          # mistral3: q times 1 + attn_temp ln(floor(pos / attn_temp_floor) + 1) after rope
    attn_temp_floor = 0
    nope_global = False      # exaone4 with a window: the global layers apply no rope
    qk_norm_after_rope = False   # hunyuan-dense: the per-head q/k norms after the rope, not before
    relu_sqr = False         # arcee: the FFN is W_down relu(W_up g)^2 (no gate)
    parallel = False         # command-r, cohere2: x += attn(h) + ffn(h), h = norm(x, attn_norm)
    expert_weights_scale = 1.0   # the chosen experts' weights times this (deepseek2's expert_weights_scale)
    mla = None               # deepseek2: dict(rank, head_k, head_v, nope) of its multi-head latent attention
    mla_drop = ()            # deepseek2's pieces left out ("kv_norm", "k_pe", "q_pe", "scale")
    ds_gating = "softmax"    # deepseek2's router: "softmax" or "sigmoid" (V3)
    ds_norm = False          # deepseek2: the chosen experts' weights renormalized (expert_weights_norm)
    ds_groups = (0, 0)       # deepseek2: (expert groups, groups used) (V3's 8, 4); (0, 0): none
    ds_bias = True           # deepseek2: exp_probs_b.bias shifts the choice (False: left out)
    ds_route = False         # deepseek2_route chooses the experts (deepseek2, glm4moe, ernie4_5-moe)
    yarn_rope_mscale = True  # YaRN's cos / sin factor 1 + 0.1 ln(1 / freq_scale) (deepseek2 with yarn_log_multiplier:
                             # not applied)
    ple_drop = ()            # gemma4's per-layer embeddings: pieces left out ("tok", "proj", "proj_norm",
                             # "input_scale", "tok_scale", "proj_scale", "post_norm", "gate_act", "all")

    def __init__(self, path, **overrides):
        """The model of a GGUF/PWRI file. overrides: attributes to set after reading it (n_swa,
        rope_base_swa, rope_freqs, neox, ...: for tests that show a feature matters)."""
        meta, tensors = read_gguf(path)
        self._setup(meta, {name: _weight(dequantize(raw, tt, ne), tt) for name, (tt, ne, raw) in tensors.items()},
                    {name: tt for name, (tt, _, _) in tensors.items()}, overrides)

    @classmethod
    def from_weights(cls, meta: dict, weights: dict, **overrides) -> ReferenceModel:
        """The model of float weights under their GGUF names (numpy shape: reversed ne) and metadata."""
        m = cls.__new__(cls)
        W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        m._setup(meta, W, {k: GGML_F32 for k in W}, overrides)
        return m

    @classmethod
    def from_hf(cls, weights: dict, cfg: dict) -> ReferenceModel:
        """The model of a Hugging Face llama/bamboo checkpoint (config.json as a dict), read as it is."""
        arch = "bamboo" if cfg["model_type"] == "bamboo" else "llama"
        W = {}
        for name, w in weights.items():
            stem, kind = name.rsplit(".", 1)
            layer = stem.split(".")
            if stem.startswith("model.layers."):
                stem = f"blk.{layer[2]}." + HF_NAMES[".".join(layer[3:])]
            else:
                stem = HF_NAMES[stem]
            W[f"{stem}.{kind}"] = w
        n_head = cfg["num_attention_heads"]
        factor = (cfg.get("rope_scaling") or {}).get("factor")
        meta = {"general.architecture": arch, f"{arch}.embedding_length": cfg["hidden_size"],
                f"{arch}.feed_forward_length": cfg["intermediate_size"], f"{arch}.block_count":
                cfg["num_hidden_layers"], f"{arch}.attention.head_count": n_head,
                f"{arch}.attention.head_count_kv": cfg.get("num_key_value_heads", n_head),
                f"{arch}.rope.freq_base": cfg.get("rope_theta", 10000.0),
                f"{arch}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
                "powerinfer.ffn_activation": "relu" if arch == "bamboo" else cfg["hidden_act"]}
        if factor:
            meta.update({f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": factor})
        return cls.from_weights(meta, W, neox=True)

    def _setup(self, meta: dict, W: dict, tensor_types: dict, overrides: dict) -> None:
        self.meta = meta
        arch = meta["general.architecture"]
        if arch not in ARCHS:
            raise ValueError(f"unsupported architecture {arch!r}")
        self.arch = arch

        def m(key, default=None):
            return meta.get(f"{arch}.{key}", default)

        self.n_embd = int(m("embedding_length"))
        self.n_layer = int(m("block_count"))

        def per_layer(v):
            return [int(x) for x in v] if isinstance(v, list) else [int(v)] * self.n_layer
        self.n_ff = max(per_layer(m("expert_feed_forward_length", m("feed_forward_length"))))
        self.n_expert_used = int(m("expert_used_count", 0))      # mixture of experts (ffn_gate_inp, *_exps)
        self.n_head = int(m("attention.head_count"))
        kv_heads = per_layer(m("attention.head_count_kv", self.n_head))
        self.n_head_kv = kv_heads[0]
        self.n_ctx_train = int(m("context_length", 0))
        self.head_dim = int(m("attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(m("rope.dimension_count", self.head_dim))
        self.rope_base = float(m("rope.freq_base", 10000.0))
        # local layers (llama.cpp): gemma3's every 6th layer global, rope base 10000; gemma2's every other one (the
        # even ones local), the global rope base unless rope.freq_base_swa, a window of 4096 unless the file says
        self.rope_base_swa = (float(m("rope.freq_base_swa", self.rope_base)) if arch in ("gemma2", "olmo2", "gpt-oss")
                              else float(m("rope.freq_base_swa", 10000.0)))
        self.n_swa = int(m("attention.sliding_window", 4096 if arch == "gemma2" else 0)) \
            if arch in GEMMA_ARCHS + ("olmo2",) else 0
        if arch == "gpt-oss":     # llama_model_openai_moe: the window is required, every other layer local
            self.n_swa = int(m("attention.sliding_window"))
        pattern = m("attention.sliding_window_pattern")
        self.swa_pattern = pattern if isinstance(pattern, int) else {"gemma2": 2, "gpt-oss": 2, "olmo2": 4}.get(arch, 6)
        # q scaling (gemma_pytorch's query_pre_attn_scalar): n_embd / n_head in the 27B models, else head_dim
        big = (arch, self.n_layer) in (("gemma2", 46), ("gemma3", 62))
        self.attn_scale = 1.0 / math.sqrt(self.n_embd // self.n_head if big else self.head_dim)
        if arch == "gemma2":   # llama.cpp's defaults where the file has no value
            self.attn_softcap = float(m("attn_logit_softcapping", 50.0))
            self.final_softcap = float(m("final_logit_softcapping", 30.0))
        elif arch == "gemma3":   # a window or not (Rnj-1), a final cap where the file has one
            self.final_softcap = float(m("final_logit_softcapping", 0.0))
        self.neox = arch in NEOX_ARCHS
        self.layer_norm = arch in LAYER_NORM_ARCHS
        self.eps = float(m("attention.layer_norm_epsilon", 1e-5) if self.layer_norm
                         else m("attention.layer_norm_rms_epsilon", 1e-5))
        scaling = m("rope.scaling.type")
        factor = m("rope.scaling.factor")
        if scaling in ("linear", "yarn") and factor:
            self.freq_scale = 1.0 / float(factor)
        elif scaling in (None, "none") or not factor:
            self.freq_scale = 1.0
        else:
            raise ValueError(f"unsupported rope scaling {scaling!r}")
        # YaRN (ggml's rope_yarn, from its definition): blend of interpolated and extrapolated angles, cos/sin scaled
        self.yarn = scaling == "yarn"
        self.yarn_orig_ctx = int(m("rope.scaling.original_context_length", self.n_ctx_train) or self.n_ctx_train)
        self.rope_attn_factor = float(m("rope.scaling.attn_factor", 1.0))
        if arch in ("granite", "granitemoe"):
            self.embd_scale = float(m("embedding_scale", 1.0))
            self.attn_scale = m("attention.scale")
            self.residual_scale = float(m("residual_scale", 1.0))
            self.logit_scale = float(m("logit_scale"))
            self.nope_step = 0 if m("rope.scaling.finetuned", True) else 1
        if arch == "smollm3":
            self.nope_step = 4
        if arch == "gpt-oss":
            self.attn_scale = 1.0 / math.sqrt(self.n_rot)
            self.expert_gating = "softmax_weight"
        if arch == "qwen2moe":           # llama.cpp's norm_w false: the chosen experts' probabilities as they are
            self.expert_gating = "softmax"
        if arch == "gemma4":             # llama_model_gemma4
            local = [bool(v) for v in m("attention.sliding_window_pattern")]
            hd_swa = int(m("attention.key_length_swa", self.head_dim))
            n_rot_swa = int(m("rope.dimension_count_swa", self.n_rot))
            n_kv = self.n_layer - int(m("attention.shared_kv_layers", 0))
            self.layer_geom = [dict(head_dim=hd_swa if loc else self.head_dim, n_head_kv=kv_heads[li],
                                    n_rot=n_rot_swa if loc else self.n_rot, local=loc,
                                    kv_source=li if li < n_kv else n_kv - (2 if loc else 1))
                               for li, loc in enumerate(local)]
            self.attn_scale, self.v_norm = 1.0, True
            self.final_softcap = float(m("final_logit_softcapping", 0.0))
        self.yarn_log_mul = float(m("rope.scaling.yarn_log_multiplier", 0.0))
        self._llama_block_setup(m)
        if arch == "deepseek2":
            self._deepseek2_setup(m)
        self._moe_arch_setup(m)
        self.ssm = None
        if arch in reference_qwen35.ARCHS:
            reference_qwen35.setup(self, m)
        self.lfm2 = arch in reference_lfm2.ARCHS
        if self.lfm2:
            reference_lfm2.setup(self, m)
        # PowerInfer layout: transposed down matrix and a predictor per layer (ReLU models only)
        self.sparse = "blk.0.ffn_down_t.weight" in W
        self.sparse_threshold = float(meta.get("powerinfer.sparse_threshold", 0.0))
        self.use_predictor = self.sparse      # False: compute every neuron
        act = meta.get("powerinfer.ffn_activation")
        if act is None:
            act = ("relu" if arch == "bamboo" or self.sparse else "gelu" if arch in GEMMA_ARCHS
                   else "swiglu_oai" if arch == "gpt-oss" else "silu")
        if act not in ACTS and act != "swiglu_oai":
            raise ValueError(f"unsupported ffn activation {act!r}")
        self.ffn_act = act
        self.tokens = meta.get("tokenizer.ggml.tokens")
        self.rope_freqs = W.get("rope_freqs.weight")
        self.rope_factors = {"short": W.get("rope_factors_short.weight"), "long": W.get("rope_factors_long.weight")}
        if self.rope_freqs is None:
            self.rope_freqs = self.rope_factors["short"]

        self.tensor_types = tensor_types
        self.tok_embd = W["token_embd.weight"]                 # (n_vocab, n_embd)
        self.n_vocab = self.tok_embd.shape[0]
        self.pos_embd = W.get("position_embd.weight")          # opt: (n_pos, n_embd)
        self.output_norm = (W["output_norm.weight"] if "output_norm.weight" in W   # lfm2: token_embd_norm
                            else W["token_embd_norm.weight"], W.get("output_norm.bias"))
        self.output = W.get("output.weight", self.tok_embd)    # tied if absent
        self.ple_weights = {k: W[k] for k in ("per_layer_token_embd.weight", "per_layer_model_proj.weight",
                                              "per_layer_proj_norm.weight") if k in W}   # gemma4 E2B / E4B
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            # short names: "attn_q" (weight), "attn_q.bias"; sparse files: ffn_down = ffn_down_t^T
            L = {k[len(p):].removesuffix(".weight"): v for k, v in W.items() if k.startswith(p)}
            if arch in ("phi3", "glm4"):   # fused q|k|v rows (and bias: glm4); the FFN's gate|up rows (gate first)
                e_q, e_kv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
                for suffix in ("", ".bias"):
                    if "attn_qkv" + suffix in L:
                        qkv = L.pop("attn_qkv" + suffix)
                        L["attn_q" + suffix], L["attn_k" + suffix], L["attn_v" + suffix] = \
                            qkv[:e_q], qkv[e_q:e_q + e_kv], qkv[e_q + e_kv:]
                if "ffn_gate" not in L:
                    L["ffn_gate"], L["ffn_up"] = L["ffn_up"][:self.n_ff], L["ffn_up"][self.n_ff:]
            if arch in ("gpt-oss", "seed_oss", "glm4moe"):   # llama.cpp's attn_post_norm: the FFN's pre-norm
                L["ffn_norm"] = L.pop("post_attention_norm")
            if self.sparse:
                L["ffn_down"] = np.asarray(L.pop("ffn_down_t")).T      # (n_embd, n_ff); the engine adds its rows (axpy)
                if "ffn_down_t.bias" in L:
                    L["ffn_down.bias"] = L.pop("ffn_down_t.bias")
            self.layers.append(L)
        if arch == "apertus":     # each layer's xIELU: a_n = beta + softplus(alpha_n), a_p = softplus(alpha_p)
            cols = [meta[f"xielu.{k}"] for k in ("alpha_n", "alpha_p", "beta", "eps")]
            cols = [list(c) if isinstance(c, (list, tuple)) else [c] * self.n_layer for c in cols]
            for L, (an, ap, b, e) in zip(self.layers, zip(*cols)):
                L["xielu"] = (b + np.log1p(np.exp(an)), np.log1p(np.exp(ap)), b, e)
        for k, v in overrides.items():
            setattr(self, k, v)
        assert self.n_rot <= self.head_dim and self.n_rot % 2 == 0

    def _llama_block_setup(self, m) -> None:
        """The architectures on llama's blocks (llama.cpp's src/models/<arch>.cpp), m(key, default) the file's keys."""
        if self.arch == "mistral3":   # llama_model_mistral3: the file's YaRN betas, Llama 4's temperature tuning
            self.yarn_betas = (float(m("rope.scaling.yarn_beta_fast", 32.0)),
                               float(m("rope.scaling.yarn_beta_slow", 1.0)))
            self.attn_temp = float(m("attention.temperature_scale", 0.0))
            self.attn_temp_floor = self.yarn_orig_ctx
        if self.arch == "exaone4" and self.n_layer == 64:   # llama_model_exaone4: the 32B's window, NoPE global layers
            self.n_swa = int(m("attention.sliding_window", 4096))
            pattern = m("attention.sliding_window_pattern", 4)
            self.local_layers = ({li for li, f in enumerate(pattern) if f} if isinstance(pattern, list)
                                 else {li for li in range(self.n_layer) if li % pattern < pattern - 1})
            self.nope_global = True
            self.rope_base_swa = float(m("rope.freq_base_swa", self.rope_base))
        if self.arch in ("command-r", "cohere2"):   # LayerNorm without biases, parallel blocks, logits * logit_scale
            self.layer_norm, self.parallel = True, True
            self.eps = float(m("attention.layer_norm_epsilon"))
            self.logit_scale = 1.0 / float(m("logit_scale", 1.0))
        if self.arch == "cohere2":          # llama_model_cohere2: every 4th layer global, without rope
            self.n_swa = int(m("attention.sliding_window"))
            self.swa_pattern = int(m("attention.sliding_window_pattern", 4))
            self.nope_global = True
            self.rope_base_swa = float(m("rope.freq_base_swa", self.rope_base))
        if self.arch == "arcee":            # llama_model_arcee: LLM_FFN_RELU_SQR, LLM_FFN_SEQ
            self.relu_sqr = True
        if self.arch == "hunyuan-dense":    # llama_model_hunyuan_vl's graph; NTK alpha scales the base
            self.qk_norm_after_rope = True
            alpha = float(m("rope.scaling.alpha", 0.0))
            if alpha > 0.0:
                self.rope_base *= alpha ** (self.head_dim / (self.head_dim - 2))

    def _moe_arch_setup(self, m) -> None:
        """glm4moe, dots1, bailingmoe2, ernie4_5-moe, hunyuan-moe, olmoe (llama.cpp's src/models/<arch>.cpp): the
        experts' routing and scale; the last nextn_predict_layers layers (MTP: glm4moe, bailingmoe2) are not run;
        hunyuan-moe norms q and k after their rope. The layers with experts are those whose file has ffn_gate_inp; the
        rest of each (q/k norms, biases, a fused attn_qkv, partial rope) follows the tensors and the NEOX / normal rope
        of the arch."""
        if self.arch not in MOE_ARCHS:
            return
        if self.arch in ("glm4moe", "dots1", "bailingmoe2"):   # the others' loaders do not read the key
            self.expert_weights_scale = float(m("expert_weights_scale", 0.0)) or 1.0
        if self.arch == "olmoe":          # softmax, the chosen experts' probabilities as they are
            self.expert_gating = "softmax"
            return
        if self.arch == "hunyuan-moe":    # softmax renormalized (the default), q/k norms after the rope
            self.qk_norm_after_rope = True
            return
        self.ds_route = True
        self.ds_groups = (int(m("expert_group_count", 0)), int(m("expert_group_used_count", 0)))
        if self.arch in ("glm4moe", "dots1", "bailingmoe2"):   # sigmoid unless expert_gating_func says softmax (1)
            if self.arch != "dots1":
                self.n_layer -= int(m("nextn_predict_layers", 0))
            self.ds_gating = "softmax" if int(m("expert_gating_func", 0)) == 1 else "sigmoid"
            self.ds_norm = bool(m("expert_weights_norm", False))
        else:                             # ernie4_5-moe: softmax, renormalized
            self.ds_gating, self.ds_norm = "softmax", True

    def geometry(self, li) -> dict:
        """Layer li's head_dim, n_head_kv, n_rot, local and kv_source (layer_geom's, else the one shape and the
        window's pattern)."""
        if self.layer_geom is not None:
            return self.layer_geom[li]
        local = self.n_swa > 0 and (li % self.swa_pattern < self.swa_pattern - 1 if self.local_layers is None
                                    else li in self.local_layers)
        return dict(head_dim=self.head_dim, n_head_kv=self.n_head_kv, n_rot=self.n_rot, local=local, kv_source=li)

    # ---- building blocks ---------------------------------------------------------------
    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def norm(self, x, w, b=None):
        """rmsnorm, or (falcon, opt) LayerNorm with bias."""
        return layer_norm(x, w, b, self.eps) if self.layer_norm else self.rmsnorm(x, w)

    def rope(self, x, pos, base=None, n_rot=None, freqs=True):
        """x: (n_tok, n_heads, head_dim); the first n_rot dims (default self.n_rot), pairs (2i, 2i+1) or (neox)
        (i, i + n_rot/2); freqs False: without rope_freqs."""
        n_rot = self.n_rot if n_rot is None else n_rot
        half = n_rot // 2
        i = np.arange(half, dtype=np.float64)
        base = self.rope_base if base is None else base
        inv = base ** (-2.0 * i / n_rot)
        theta = (np.asarray(pos, dtype=np.float64) * self.freq_scale)[:, None] * inv[None, :]
        if self.rope_freqs is not None and freqs:
            theta = theta / self.rope_freqs[None, :]
        mscale = self.rope_attn_factor
        if self.yarn:
            extrap = theta / self.freq_scale
            corr = [n_rot * math.log(self.yarn_orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(base))
                    for beta in self.yarn_betas]
            low, high = max(0.0, math.floor(corr[0])), min(n_rot - 1.0, math.ceil(corr[1]))
            mix = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
            theta = theta * (1.0 - mix)[None, :] + extrap * mix[None, :]
            if self.yarn_rope_mscale:
                mscale *= 1.0 + 0.1 * math.log(1.0 / self.freq_scale) if self.freq_scale < 1.0 else 1.0
                if self.yarn_log_mul and self.freq_scale < 1.0:     # llama.cpp: get_mscale(f, 1) / get_mscale(f, m)
                    mscale /= 1.0 + 0.1 * self.yarn_log_mul * math.log(1.0 / self.freq_scale)
        c = np.cos(theta)[:, None, :] * mscale
        s = np.sin(theta)[:, None, :] * mscale
        out = x.copy()
        a, b = (np.arange(half), np.arange(half) + half) if self.neox else (np.arange(0, n_rot, 2),
                                                                            np.arange(1, n_rot, 2))
        x0, x1 = x[..., a], x[..., b]
        out[..., a] = x0 * c - x1 * s
        out[..., b] = x0 * s + x1 * c
        return out

    def act(self, x):
        if self.gelu_f16 and self.ffn_act == "gelu":   # ggml's table: f16 in, f16 out; x itself from 10, 0 to -10
            y = gelu(x.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
            return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))
        return ACTS[self.ffn_act](x)

    def predictor_mask(self, L, x):
        """Neurons the predictor selects for each row of the pre-norm residual x: (n, n_ff) bool."""
        scores = relu(x @ L["fc1"].T) @ L["fc2"].T
        return scores >= self.sparse_threshold

    def swiglu_oai(self, gate, up):
        """ggml's swiglu_oai: min(gate, limit) sigmoid(alpha min(gate, limit)) (clip(up, -limit, limit) + 1)."""
        a = np.minimum(gate, self.swiglu_limit)
        return a / (1.0 + np.exp(-self.swiglu_alpha * a)) * (np.clip(up, -self.swiglu_limit, self.swiglu_limit) + 1.0)

    def gemma4_moe_ffn(self, L, g, x):
        """gemma4's layer with experts (llama.cpp's gemma4.cpp, is_moe_layer): rms_norm(dense FFN of g) *
        post_ffw_norm_1 + rms_norm(experts of rms_norm(x) * pre_ffw_norm_2) * post_ffw_norm_2, g = ffn_norm(x), x the
        residual stream; the router reads rms_norm(x) (no weight) / sqrt(n_embd) * ffn_gate_inp.scale. A tensor a test
        removed (a norm or a scale) is left out."""
        def post(y, key):
            return self.rmsnorm(y, L[key]) if key in L else y
        dense = (self.act(g @ L["ffn_gate"].T) * (g @ L["ffn_up"].T)) @ L["ffn_down"].T
        x2 = post(x, "pre_ffw_norm_2")
        r = self.rmsnorm(x if self.router_of_x else x2, 1.0) / math.sqrt(self.n_embd) * L.get("ffn_gate_inp.scale", 1.0)
        experts = self.moe_ffn(L, x2, r)
        return post(dense, "post_ffw_norm_1") + post(experts, "post_ffw_norm_2")

    def moe_ffn(self, L, g, r=None):
        """Mixture of experts (llama.cpp's build_moe_ffn, softmax router, norm_w): per token the experts of the
        n_expert_used largest router probabilities, their outputs weighted by those renormalized to sum 1
        (expert_gating "softmax_norm"); gpt-oss ("softmax_weight"): the n_expert_used largest logits (router bias
        included), weighted by the softmax of those logits alone; "softmax": by their probabilities over every expert
        (no renormalization). Expert biases (gpt-oss) are added to each product. r: the router's input where it is
        not g (gemma4); ffn_gate_up_exps: each expert's gate rows, then its up rows; ffn_down_exps.scale: each expert's
        output scale."""
        logits = (g if r is None else r) @ L["ffn_gate_inp"].T + L.get("ffn_gate_inp.bias", 0.0)   # (n, n_expert)
        if "ffn_gate_up_exps" in L:
            n_ff = L["ffn_gate_up_exps"].shape[1] // 2
            L = dict(L, ffn_gate_exps=L["ffn_gate_up_exps"][:, :n_ff], ffn_up_exps=L["ffn_gate_up_exps"][:, n_ff:])
        scale = L.get("ffn_down_exps.scale", np.ones(len(L["ffn_gate_inp"])))
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out = np.zeros_like(g)
        for t in range(len(g)):
            if self.arch == "deepseek2" or self.ds_route:
                chosen, w = self.deepseek2_route(logits[t], L)
            elif self.expert_gating == "softmax_weight":
                chosen = np.argsort(-logits[t], kind="stable")[:self.n_expert_used]
                w = np.exp(logits[t, chosen] - logits[t, chosen].max())
                w /= w.sum()
            else:
                chosen = np.argsort(-p[t], kind="stable")[:self.n_expert_used]
                w = p[t, chosen] / p[t, chosen].sum() if self.expert_gating == "softmax_norm" else p[t, chosen]
            w = w * self.expert_weights_scale
            for e, we in zip(chosen, w):
                gate = L["ffn_gate_exps"][e] @ g[t] + (L["ffn_gate_exps.bias"][e] if "ffn_gate_exps.bias" in L else 0.0)
                up = L["ffn_up_exps"][e] @ g[t] + (L["ffn_up_exps.bias"][e] if "ffn_up_exps.bias" in L else 0.0)
                h = self.swiglu_oai(gate, up) if self.ffn_act == "swiglu_oai" else self.act(gate) * up
                down = L["ffn_down_exps"][e] @ h + (L["ffn_down_exps.bias"][e] if "ffn_down_exps.bias" in L else 0.0)
                out[t] += we * scale[e] * down
        if "ffn_gate_shexp" in L:          # a shared expert (qwen2moe: gated by sigmoid(gate_inp_shexp . g))
            h = self.act(g @ L["ffn_gate_shexp"].T) * (g @ L["ffn_up_shexp"].T)
            s = 1.0 / (1.0 + np.exp(-(g @ L["ffn_gate_inp_shexp"]))) if "ffn_gate_inp_shexp" in L else 1.0
            out += np.reshape(s, (-1, 1)) * (h @ L["ffn_down_shexp"].T)
        return out

    def ffn(self, L, g, x=None, trace=None):
        """g: normed FFN input; x: pre-norm residual (the predictor's input in sparse files);
        trace: a dict whose lists "gate" / "up" get act(W_gate g) / (bamboo: act) W_up g."""
        if self.arch == "gemma4" and "ffn_gate_inp" in L:    # gemma4's experts beside the dense FFN
            return self.gemma4_moe_ffn(L, g, x)
        if "ffn_gate_inp" in L:
            return self.moe_ffn(L, g)
        up = g @ L["ffn_up"].T
        if self.relu_sqr:                   # arcee: no gate, ReLU squared
            hid = relu(up) ** 2
        elif "xielu" in L:                  # apertus: no gate, xIELU
            an, ap, b, e = L["xielu"]
            hid = np.where(up > 0.0, ap * up * up + b * up, (np.expm1(np.minimum(up, e)) - up) * an + b * up)
        elif self.arch in LAYER_NORM_ARCHS:   # falcon/opt: no gate
            hid = relu(up + L.get("ffn_up.bias", 0.0))
        else:
            gate = self.act(g @ L["ffn_gate"].T)
            if self.arch == "bamboo":
                up = self.act(up)
            if trace is not None:
                trace.setdefault("gate", []).append(gate)
                trace.setdefault("up", []).append(up)
            hid = gate * up
        if self.use_predictor:
            hid = np.where(self.predictor_mask(L, x), hid, 0.0)
        return hid @ L["ffn_down"].T + L.get("ffn_down.bias", 0.0)

    def qkv(self, L, h, hd=None, n_head_kv=None):
        """(q, k, v) of the normed attention input h, (n, heads, head_dim) each, before rope (heads of hd, default
        head_dim; gemma4: k and v None in a layer without attn_k, v the k projection in one without attn_v, v normed
        per head)."""
        n, hd, n_head_kv = len(h), hd or self.head_dim, n_head_kv or self.n_head_kv
        if "attn_qkv" in L:                 # falcon: all Q heads, then all K heads, then all V heads
            qkv = h @ L["attn_qkv"].T
            e, ekv = self.n_head * hd, n_head_kv * hd
            q, k, v = qkv[:, :e], qkv[:, e:e + ekv], qkv[:, e + ekv:]
        else:
            q, k, v = (h @ L[f"attn_{t}"].T + L.get(f"attn_{t}.bias", 0.0) if f"attn_{t}" in L else None
                       for t in "qkv")
            if v is None:                   # gemma4: V = the K projection (None too in a shared-KV layer)
                v = k
        if "attn_q_norm" in L and L["attn_q_norm"].shape[0] == q.shape[1] != hd:   # olmo2: of the whole q and k
            q, k = self.rmsnorm(q, L["attn_q_norm"]), self.rmsnorm(k, L["attn_k_norm"])
        q = q.reshape(n, self.n_head, hd)
        per_head = "attn_q_norm" in L and L["attn_q_norm"].shape[0] == hd and not self.qk_norm_after_rope
        if per_head:       # gemma3, qwen3: of each head
            q = self.rmsnorm(q, L["attn_q_norm"])
        if k is None:
            return q, None, None
        k, v = k.reshape(n, n_head_kv, hd), v.reshape(n, n_head_kv, hd)
        if per_head:
            k = self.rmsnorm(k, L["attn_k_norm"])
        if self.v_norm:
            v = self.rmsnorm(v, 1.0)
        return q, k, v

    def attention(self, L, li, h, pos, all_pos, cache):
        """The attention block's output for the normed input h (its K/V appended to the cache)."""
        if self.mla is not None:
            return self.mla_attention(L, li, h, pos, all_pos, cache)
        geo = self.geometry(li)
        n, nh, hd, local = len(h), self.n_head, geo["head_dim"], geo["local"]
        mask = all_pos[None, :] <= pos[:, None]                       # (n, n_kv_tot)
        if local:
            mask &= (pos[:, None] - all_pos[None, :]) < self.n_swa
        q, k, v = self.qkv(L, h, hd, geo["n_head_kv"])
        nope = (self.nope_step and (li + 1) % self.nope_step == 0) or (self.nope_global and not local)
        if self.arch != "opt" and not nope:
            base = self.rope_base_swa if local else None
            rot = dict(n_rot=geo["n_rot"], freqs=not (local and self.layer_geom is not None))   # gemma4: global only
            q = self.rope(q, pos, base, **rot)
            k = None if k is None else self.rope(k, pos, base, **rot)
        if self.qk_norm_after_rope:         # hunyuan-dense: per head, after the rope
            q, k = self.rmsnorm(q, L["attn_q_norm"]), self.rmsnorm(k, L["attn_k_norm"])
        if self.attn_temp:                  # mistral3: a per-position q scale
            q = q * (1.0 + self.attn_temp * np.log(np.floor(pos / self.attn_temp_floor) + 1.0))[:, None, None]
        src = geo["kv_source"]
        if src == li:                       # its own cache (else: layer src's, already holding these tokens)
            if cache.k[li] is not None:
                k = np.concatenate([cache.k[li], k], axis=0)
                v = np.concatenate([cache.v[li], v], axis=0)
            cache.k[li], cache.v[li] = k, v
        k, v = cache.k[src], cache.v[src]
        group = nh // geo["n_head_kv"]
        att_out = np.empty((n, nh, hd))
        for hh in range(nh):
            kv = hh // group
            s = (q[:, hh, :] @ k[:, kv, :].T) * (self.attn_scale or 1.0 / math.sqrt(hd))   # (n, n_kv_tot)
            if self.attn_softcap:
                s = self.attn_softcap * np.tanh(s / self.attn_softcap)
            s = np.where(mask, s, -np.inf)
            if "attn_sinks" in L and self.use_sinks:    # gpt-oss: one more column, the head's sink, with no value
                s = np.concatenate([s, np.full((n, 1), L["attn_sinks"][hh])], axis=1)
            s = s - s.max(axis=1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=1, keepdims=True)
            att_out[:, hh, :] = p[:, :k.shape[0]] @ v[:, kv, :]
        a = att_out.reshape(n, nh * hd) @ L["attn_output"].T + L.get("attn_output.bias", 0.0)
        return self.rmsnorm(a, L["post_attention_norm"]) if "post_attention_norm" in L else a

    # ---- deepseek2 -------------------------------------------------------------------------
    def _deepseek2_setup(self, m) -> None:
        """deepseek2 (llama.cpp's llama_model_deepseek2): MLA of kv_lora_rank with q/k heads of key_length_mla (older
        files: key_length) values, nope of them without rope, v heads of value_length_mla (value_length); normal rope
        pairs; experts after leading_dense_block_count dense layers, softmax probabilities renormalized over the chosen
        only with expert_weights_norm (V3: sigmoids instead, expert_gating_func 2; groups and a selection bias:
        deepseek2_route), times expert_weights_scale; the scores scaled by mscale^2 / sqrt(head_k) with
        mscale = (1 + 0.1 mscale_all_dim ln f) times rope.scaling.attn_factor, times 1 + 0.1 ln f unless YaRN with
        DeepSeek's yarn_log_multiplier (written as 0.1 mscale_all_dim), f the scaling factor; with YaRN and the
        multiplier cos / sin are times rope.scaling.attn_factor only (llama.cpp's yarn_attn_factor takes ggml's YaRN
        factor back out)."""
        mla = "attention.key_length_mla" in {k.split(".", 1)[1] for k in self.meta if k.startswith("deepseek2.")}
        sfx = "_mla" if mla else ""
        head_k, head_v = int(m("attention.key_length" + sfx)), int(m("attention.value_length" + sfx))
        self.n_rot = int(m("rope.dimension_count"))
        self.mla = dict(rank=int(m("attention.kv_lora_rank")), head_k=head_k, head_v=head_v, nope=head_k - self.n_rot)
        self.head_dim = head_k
        self.n_ff = int(m("expert_feed_forward_length", m("feed_forward_length")))
        self.ds_gating = "sigmoid" if int(m("expert_gating_func", 1)) == 2 else "softmax"
        self.ds_norm = bool(m("expert_weights_norm", False))
        self.ds_groups = (int(m("expert_group_count", 0)), int(m("expert_group_used_count", 0)))
        self.expert_weights_scale = float(m("expert_weights_scale", 0.0)) or 1.0
        log_mul = float(m("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        ln_f = math.log(1.0 / self.freq_scale)
        yarn_factor = 1.0 if self.yarn and log_mul else 1.0 + 0.1 * ln_f
        mscale = self.rope_attn_factor * yarn_factor * (1.0 + 0.1 * log_mul * ln_f)
        self.attn_scale = mscale * mscale / math.sqrt(head_k)
        self.yarn_rope_mscale = not log_mul

    def deepseek2_route(self, logits, L):
        """deepseek2's experts of one token and their weights (llama.cpp's build_moe_ffn): probabilities p (softmax or
        sigmoid of the logits), selection scores p + exp_probs_b; with groups only the groups_used groups of the largest
        sums of their two best scores compete; the n_expert_used best scores chosen, weighted by their p (renormalized
        with ds_norm, the sum at least 6.103515625e-5)."""
        p = 1.0 / (1.0 + np.exp(-logits)) if self.ds_gating == "sigmoid" else np.exp(logits - logits.max())
        if self.ds_gating != "sigmoid":
            p = p / p.sum()
        s = p + L["exp_probs_b.bias"] if "exp_probs_b.bias" in L and self.ds_bias else p.copy()
        n_groups, n_used = self.ds_groups
        if n_groups > 1:
            by_group = s.reshape(n_groups, -1)
            score = np.sort(by_group, axis=1)[:, -2:].sum(axis=1)
            drop = np.argsort(-score, kind="stable")[n_used:]
            by_group[drop] = -np.inf
            s = by_group.reshape(-1)
        chosen = np.argsort(-s, kind="stable")[:self.n_expert_used]
        w = p[chosen]
        return chosen, (w / max(w.sum(), 6.103515625e-5) if self.ds_norm else w)

    def mla_attention(self, L, li, h, pos, all_pos, cache):
        """deepseek2's attention written as multi-head attention over the decompressed keys and values (llama.cpp's
        non-absorbed path): q (attn_q, or attn_q_b(rmsnorm(attn_q_a h))) per head [nope, rope]; the latent c =
        rmsnorm(kv_a[:R]) (attn_kv_a_norm), k_pe = kv_a[R:] one rope part for all heads; head i's k = [kv_b's k rows
        of head i . c, rope(k_pe)], v = kv_b's v rows . c (attn_kv_b, or attn_k_b transposed and attn_v_b); the
        cache holds c and rope(k_pe)."""
        c = self.mla
        n, H, R, nope, hk, vd = len(h), self.n_head, c["rank"], c["nope"], c["head_k"], c["head_v"]
        if "attn_q_a" in L:
            q = self.rmsnorm(h @ L["attn_q_a"].T, L["attn_q_a_norm"]) @ L["attn_q_b"].T
        else:
            q = h @ L["attn_q"].T
        q = q.reshape(n, H, hk)
        kva = h @ L["attn_kv_a_mqa"].T                                   # (n, R + n_rot)
        lat = kva[:, :R] if "kv_norm" in self.mla_drop else self.rmsnorm(kva[:, :R], L["attn_kv_a_norm"])
        k_pe = kva[:, None, R:]
        if "k_pe" not in self.mla_drop:
            k_pe = self.rope(k_pe, pos)
        q_pe = q[:, :, nope:] if "q_pe" in self.mla_drop else self.rope(q[:, :, nope:], pos)
        if cache.k[li] is not None:
            lat, k_pe = np.concatenate([cache.k[li], lat]), np.concatenate([cache.v[li], k_pe])
        cache.k[li], cache.v[li] = lat, k_pe
        if "attn_kv_b" in L:
            kvb = L["attn_kv_b"].reshape(H, nope + vd, R)
            wk, wv = kvb[:, :nope, :], kvb[:, nope:, :]                  # (H, nope, R), (H, vd, R)
        else:
            wk, wv = L["attn_k_b"].transpose(0, 2, 1), L["attn_v_b"]
        mask = all_pos[None, :] <= pos[:, None]
        scale = 1.0 / math.sqrt(hk) if "scale" in self.mla_drop else self.attn_scale
        out = np.empty((n, H, vd))
        for i in range(H):
            k = np.concatenate([lat @ wk[i].T, k_pe[:, 0, :]], axis=1)   # (n_kv, hk)
            s = np.where(mask, (np.concatenate([q[:, i, :nope], q_pe[:, i, :]], axis=1) @ k.T) * scale, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, i, :] = (p / p.sum(axis=1, keepdims=True)) @ (lat @ wv[i].T)
        return out.reshape(n, H * vd) @ L["attn_output"].T

    # ---- forward -------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        return KVCache(self.n_layer)

    def forward(self, tokens, positions=None, cache: KVCache | None = None, hidden: bool = False,
                trace: dict | None = None) -> np.ndarray:
        """logits (len(tokens), n_vocab) float64 (hidden: the final hidden states (len(tokens), n_embd),
        norm(x, output_norm), instead).  Without `cache`: causal attention over
        exactly the given sequence.  With a cache: the tokens are appended to it (their K/V
        stored) and attend to everything cached with pos <= their own.  trace: a dict that gets
        the list "ffn_inp" (each layer's pre-norm residual before its FFN) and those of ffn()."""
        tokens = np.asarray(list(tokens), dtype=np.int64)
        n = len(tokens)
        if n == 0:
            return np.zeros((0, self.n_vocab))
        if np.any(tokens < 0) or np.any(tokens >= self.n_vocab):
            raise ValueError("token id out of range")
        if cache is None:
            cache = self.new_cache()
        if positions is None:
            start = int(cache.pos[-1]) + 1 if len(cache.pos) else 0
            positions = np.arange(start, start + n)
        pos = np.asarray(list(positions), dtype=np.int64)
        assert pos.shape == (n,)
        all_pos = np.concatenate([cache.pos, pos])

        x = self.tok_embd[tokens].copy()                              # (n, n_embd)
        if self.arch in GEMMA_ARCHS:
            x *= math.sqrt(self.n_embd)
        if self.embd_scale != 1.0:
            x = x * self.embd_scale
        if self.pos_embd is not None:                                 # opt
            x += self.pos_embd[pos + 2]
        ple = self.per_layer_inputs(tokens, x)                        # gemma4 E2B / E4B, else None
        for li, L in enumerate(self.layers):
            if self.ssm is not None:                                  # qwen35 / qwen35moe / qwen3next
                x = reference_qwen35.layer(self, L, li, x, pos, all_pos, cache, trace)
                continue
            if self.lfm2:
                x = reference_lfm2.layer(self, L, li, x, pos, all_pos, cache, trace)
                continue
            h = self.norm(x, L["attn_norm"], L.get("attn_norm.bias")) if "attn_norm" in L else x   # olmo2: none
            if self.arch == "falcon" or self.parallel:                # parallel attention and FFN
                a_in = self.norm(x, L["attn_norm_2"], L["attn_norm_2.bias"]) if "attn_norm_2" in L else h
                x = x + self.attention(L, li, a_in, pos, all_pos, cache) + self.ffn(L, h, x, trace)
                if self.control_vector is not None:
                    x = x + self.control_vector[li]
                continue
            x = x + self.attention(L, li, h, pos, all_pos, cache) * self.residual_scale
            if trace is not None:
                trace.setdefault("ffn_inp", []).append(x.copy())
            g = self.norm(x, L["ffn_norm"], L.get("ffn_norm.bias")) if "ffn_norm" in L else x
            f = self.ffn(L, g, x, trace)
            x = x + (self.rmsnorm(f, L["post_ffw_norm"]) if "post_ffw_norm" in L else f) * self.residual_scale
            if ple is not None:
                x = x + self.per_layer_embedding(L, x, ple[:, li, :])
            if "layer_output_scale" in L and self.use_out_scale:     # gemma4
                x = x * L["layer_output_scale"]
            if self.control_vector is not None:
                x = x + self.control_vector[li]
        cache.pos = all_pos
        x = self.norm(x, *self.output_norm)
        if hidden:
            return x
        logits = x @ self.output.T / self.logit_scale
        return self.final_softcap * np.tanh(logits / self.final_softcap) if self.final_softcap else logits

    def per_layer_inputs(self, tokens, x0):
        """gemma4's per-layer inputs P (n_tok, n_layer, n_pl) from the tokens and their scaled embeddings x0, or None
        where the file has no per_layer_token_embd (or ple_drop has "all")."""
        tok_table = self.ple_weights.get("per_layer_token_embd.weight")
        if tok_table is None or "all" in self.ple_drop:
            return None
        drop, n = self.ple_drop, len(tokens)
        n_pl = tok_table.shape[1] // self.n_layer
        tok = np.asarray(tok_table[tokens], np.float64).reshape(n, self.n_layer, n_pl)
        tok = tok * (1.0 if "tok_scale" in drop else math.sqrt(n_pl))
        proj = x0 @ np.asarray(self.ple_weights["per_layer_model_proj.weight"], np.float64).T
        proj = proj.reshape(n, self.n_layer, n_pl)
        proj = proj * (1.0 if "proj_scale" in drop else 1.0 / math.sqrt(self.n_embd))
        proj = (proj / np.sqrt(np.mean(proj * proj, axis=-1, keepdims=True) + self.eps) if "proj_norm" in drop
                else self.rmsnorm(proj, self.ple_weights["per_layer_proj_norm.weight"]))
        p = (0.0 if "tok" in drop else tok) + (0.0 if "proj" in drop else proj)
        return p * (1.0 if "input_scale" in drop else 1.0 / math.sqrt(2.0))

    def per_layer_embedding(self, L, x, p):
        """Layer L's per-layer embedding term for the residual stream x (n_tok, n_embd) and its inputs p (n_tok,
        n_pl): rmsnorm((gelu(x W_inp_gate^T) * p) W_proj^T) * post_norm."""
        g = x @ L["inp_gate"].T
        g = g if "gate_act" in self.ple_drop else self.act(g) if self.ffn_act == "gelu" else gelu(g)
        y = (g * p) @ L["proj"].T
        return y if "post_norm" in self.ple_drop else self.rmsnorm(y, L["post_norm"])

    def greedy(self, prompt_tokens, n) -> list[int]:
        """Greedy-decode n new tokens after prompt_tokens (float64 KV cache); returns only
        the generated tokens.  Ties resolve to the lowest token id (np.argmax)."""
        cache = self.new_cache()
        logits = self.forward(list(prompt_tokens), cache=cache)
        out = []
        for _ in range(n):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if len(out) == n:
                break
            logits = self.forward([t], cache=cache)
        return out
