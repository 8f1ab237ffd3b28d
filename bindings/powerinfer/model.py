"""Model: a GGUF/PWRI file's hyper-parameters and weights handed to the C core, zero-copy."""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ._ffi import PowerInferError, check, ffi, lib
from . import act_sparsity
from .moe_archs import MOE_ARCHS, WEIGHTS_SCALE_ARCHS, moe_arch_hparams, moe_arch_views, moe_layers
from .gguf_file import GGUFFile, ModelLoadError, TensorInfo, open_gguf
from . import lfm2 as lfm2_arch
from . import qwen35 as qwen35_arch
from . import rope as rope_settings
from . import tokenizer as _tokenizer
from . import encoder as _encoder

log = logging.getLogger("powerinfer")

# GGUF general.architecture -> the C family. Mistral and TinyLlama GGUF files declare "llama"; "mistral"
# (the llama blocks under another name) is accepted too. qwen3 is the qwen2 family with per-head q/k RMSNorm
# instead of q/k/v biases, gemma2 the gemma3 family without q/k norms and with soft-capped attention scores and
# logits (the flags below say which). phi3 (Phi-3, Phi-3.5, Phi-4, Phi-4-mini) is llama with NEOX rope, fused
# tensors (split into views at load: fused_views) and long / short rope factors; glm4 (GLM-4-0414) llama with the
# same fused tensors, a q/k/v bias, NORMAL partial rope and norms before and after each block. granite (IBM Granite
# 3.x, granitemoe with its experts) is llama with four multipliers (embedding, attention, residual, logit); smollm3 is
# llama without rope in every 4th layer; olmo2 (OLMo 2 / 3) is llama with post-norms only and q/k norms over the
# whole projection.
# gpt-oss (OpenAI's gpt-oss-20b / 120b, llama.cpp's LLM_ARCH_OPENAI_MOE) is qwen2's family with an attention output
# bias, a sink logit per head, every other layer local and biased experts with the OAI SwiGLU; qwen2moe (Qwen1.5-MoE,
# Qwen2-57B-A14B) qwen2's with experts whose weights are not renormalized and a gated shared expert. gemma4 (Gemma 4's
# dense text models) is gemma3's family with layers of two shapes (local and global: their own head size, KV heads, rope
# dims and base; per-layer FFN widths: LayerGeom), V normed per head (V = K where a layer has no attn_v), attention
# scale 1, proportional rope factors in the global layers, the last layers reading earlier layers' KV caches and a scale
# of each layer's output; the 26B-A4B adds experts beside the dense FFN of the layers with ffn_gate_inp (_gemma4_moe).
_ARCHS = {"llama": lib.PI_ARCH_LLAMA, "mistral": lib.PI_ARCH_LLAMA, "bamboo": lib.PI_ARCH_BAMBOO,
          "qwen2": lib.PI_ARCH_QWEN2, "qwen3": lib.PI_ARCH_QWEN2, "qwen3moe": lib.PI_ARCH_QWEN2,
          "qwen2moe": lib.PI_ARCH_QWEN2,
          "gemma2": lib.PI_ARCH_GEMMA3, "gemma3": lib.PI_ARCH_GEMMA3, "gemma4": lib.PI_ARCH_GEMMA3,
          "phi3": lib.PI_ARCH_LLAMA,
          "granite": lib.PI_ARCH_LLAMA, "granitemoe": lib.PI_ARCH_LLAMA, "smollm3": lib.PI_ARCH_LLAMA,
          "olmo2": lib.PI_ARCH_LLAMA, "gpt-oss": lib.PI_ARCH_QWEN2, "glm4": lib.PI_ARCH_LLAMA,
          "falcon": lib.PI_ARCH_FALCON, "opt": lib.PI_ARCH_OPT,
          "deepseek2": lib.PI_ARCH_LLAMA}   # deepseek2: llama's blocks with MLA attention and experts (_deepseek2)
# architectures that run llama's blocks with flags (_llama_block_hparams, _llama_block_views)
_LLAMA_BLOCK_ARCHS = {"mistral3": lib.PI_ARCH_LLAMA, "exaone4": lib.PI_ARCH_LLAMA, "ernie4_5": lib.PI_ARCH_LLAMA,
                 "seed_oss": lib.PI_ARCH_LLAMA, "hunyuan-dense": lib.PI_ARCH_LLAMA, "arcee": lib.PI_ARCH_LLAMA,
                 "command-r": lib.PI_ARCH_LLAMA, "cohere2": lib.PI_ARCH_LLAMA, "exaone": lib.PI_ARCH_LLAMA,
                 "apertus": lib.PI_ARCH_LLAMA}
_ARCHS.update(_LLAMA_BLOCK_ARCHS)
_ARCHS.update(MOE_ARCHS)        # glm4moe, ernie4_5-moe, olmoe: llama's blocks with experts (moe_archs.py)
# hybrid gated delta net + gated attention models (powerinfer.qwen35)
_ARCHS.update({a: lib.PI_ARCH_QWEN2 for a in qwen35_arch.ARCHS})
# attention + short conv layers (powerinfer.lfm2)
_ARCHS.update({a: lib.PI_ARCH_QWEN2 for a in lfm2_arch.ARCHS})
_ARCHS.update(_encoder.ENCODER_ARCHS)     # bert, nomic-bert: encoders (powerinfer.encoder)
# those whose attn_output.bias llama.cpp adds where the file has one
_OUT_BIAS_ARCHS = ("mistral3", "apertus")
# architectures this build runs from PowerInfer (PWRI) files only
_SPARSE_ONLY = ("falcon", "opt")
# architectures whose q|k|v and gate|up matrices are fused in their files (split into views: fused_views)
FUSED_ARCHS = ("phi3", "glm4")
# opt: the original reads no LayerNorm epsilon (it stays 0.0); HF OPT uses 1e-5, and so do we unless the file says
OPT_DEFAULT_NORM_EPS = 1e-5
_ROPE_MODES = {"normal": lib.PI_ROPE_NORMAL, "neox": lib.PI_ROPE_NEOX}
_ACTS = {"silu": lib.PI_ACT_SILU, "swish": lib.PI_ACT_SILU, "relu": lib.PI_ACT_RELU, "gelu": lib.PI_ACT_GELU,
         "swiglu_oai": lib.PI_ACT_SWIGLU_OAI}   # swiglu_oai: experts only (gpt-oss)
_ACTS["xielu"] = lib.PI_ACT_XIELU     # apertus: per-layer parameters (HParams.xielu), no gate
# gpt-oss's SwiGLU constants (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE: alpha 1.702, limit 7.0; no file key holds them)
GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT = 1.702, 7.0
ACTIVATION_KEY = "powerinfer.ffn_activation"
SPARSE_THRESHOLD_KEY = "powerinfer.sparse_threshold"


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_layer: int
    n_rot: int
    ffn_act: str
    ffn_gate: str          # "par" (act(gate)*up), "sym" (act(gate)*act(up)), "seq" (act(up))
    norm_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    # architecture details (the defaults are llama's)
    head_dim: int = 0               # q/k/v size per head; 0: n_embd // n_head
    rope_mode: str = "normal"       # "normal": pairs (2i, 2i+1); "neox": pairs (i, i + n_rot/2)
    attn_scale: float = 0.0         # 0: 1/sqrt(head_dim)
    embd_scale: float = 0.0         # 0: none
    attn_softcap: float = 0.0       # > 0: attention scores s -> cap tanh(s / cap) before the mask (gemma2); 0: none
    final_softcap: float = 0.0      # > 0: logits -> cap tanh(logits / cap) (gemma2); 0: none
    qkv_bias: bool = False
    qk_norm: int = 0                # 1: per head; 2: of the whole q and k (olmo2)
    post_norms: bool = False
    post_norms_only: bool = False   # no pre-norms: blocks read the residual stream (olmo2)
    n_swa: int = 0                  # sliding window of the local layers (0: every layer global)
    swa_pattern: int = 0            # with n_swa: layer il is local iff il % swa_pattern < swa_pattern - 1
    rope_freq_base_swa: float = 0.0   # local layers' rope (0: as the global layers)
    rope_freq_scale_swa: float = 0.0
    # rope scaling (llama.cpp's names): "none", "linear" (rope_freq_scale) or "yarn"; YaRN's extrapolation ramp runs
    # where yarn_ext_factor != 0 (RopeYarn: the per-pair frequencies and the cos/sin scale it gives)
    rope_scaling: str = "linear"
    yarn_orig_ctx: int = 0          # the context the model was trained on before scaling (0: n_ctx_train)
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0   # cos/sin scale without the extrapolation (llama.cpp's --yarn-attn-factor)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rope_attn_factor: float = 1.0   # the file's rope.scaling.attn_factor: multiplies the cos/sin scale
    n_expert: int = 0               # mixture of experts (Mixtral's llama layout, qwen3moe): experts per layer
    n_expert_used: int = 0          # experts per token
    expert_weights_scale: float = 0.0   # the chosen experts' weights times this (0: none)
    residual_scale: float = 0.0     # granite: each block's output times this before the residual add (0: 1)
    logit_scale: float = 0.0        # granite: logits divided by this (0: 1)
    n_no_rope_layer_step: int = 0   # > 0: layers with (il + 1) % step == 0 apply no rope (smollm3: 4; 1: none)
    attn_sinks: bool = False        # gpt-oss: blk.N.attn_sinks.weight, a logit per head in each softmax row
    attn_out_bias: bool = False     # gpt-oss: blk.N.attn_output.bias
    expert_bias: bool = False       # gpt-oss: the router's and the experts' biases
    swiglu_alpha: float = 0.0       # ffn_act swiglu_oai (gpt-oss): alpha and limit
    swiglu_limit: float = 0.0
    expert_raw_weights: bool = False   # qwen2moe: the chosen experts' softmax probabilities, not renormalized
    n_ff_shexp: int = 0             # > 0: a shared expert of this width (qwen2moe, granitemoe's shared variant)
    v_norm: bool = False            # gemma4: V RMS-normed per head without a weight; attn_v may be absent (V = K)
    rope_freqs_global: bool = False   # gemma4: rope_freqs.weight applies to the global layers only
    layer_geom: tuple = ()          # gemma4: a LayerGeom per layer (pi_layer_geom); (): every layer as the fields above
    n_embd_per_layer: int = 0       # gemma4 E2B / E4B: per-layer embeddings of this width (0: none)
    n_ff_exp: int = 0               # gemma4: the experts' width (expert_feed_forward_length; n_ff: the dense FFNs')
    moe_router_norm: bool = False   # gemma4: the router reads rms_norm(x) / sqrt(n_embd) * ffn_gate_inp.scale
    moe_dense_ffn: bool = False     # gemma4: a layer with experts runs its dense FFN beside them (post_ffw_norm_1, ...)
    # the flags of the architectures on llama's blocks (_LLAMA_BLOCK_ARCHS)
    qk_norm_after_rope: bool = False   # hunyuan-dense: q and k normed after their rope
    ffn_act_square: bool = False    # arcee: the FFN's activation squared (ReLU^2, no gate: ffn_gate "seq")
    layer_norm: bool = False        # command-r, cohere2: LayerNorm without biases instead of RMSNorm
    parallel_block: bool = False    # command-r, cohere2: x += attn(h) + ffn(h) from one norm
    xielu: tuple = ()               # apertus: per layer (a_n, a_p, beta, eps) of its xIELU (ffn_act "xielu")
    attn_temp_scale: float = 0.0    # mistral3: q times 1 + this * ln(floor(pos / attn_temp_floor) + 1) (0: none)
    attn_temp_floor: int = 0
    yarn_log_mul: float = 0.0       # YaRN's mscale_all_dim (rope.scaling.yarn_log_multiplier; deepseek2's files hold
                                    # it times 0.1): rope.rope_mscale, rope.mla_attn_scale
    # deepseek2 (DeepSeek-V2 / V3, Kimi-K2, Moonlight): multi-head latent attention (pi_hparams.mla_kv_rank)
    mla_kv_rank: int = 0            # the latent's width (attention.kv_lora_rank); 0: no MLA
    mla_head_k: int = 0             # q/k head size before absorption (nope + n_rot: attention.key_length_mla)
    mla_head_v: int = 0             # v head size (attention.value_length_mla)
    q_lora_rank: int = 0            # > 0: q through attn_q_a, attn_q_a_norm, attn_q_b (attention.q_lora_rank)
    mla_kv_b: bool = False          # an older file with blk.N.attn_kv_b (split into attn_k_b / attn_v_b at load)
    n_layer_dense_lead: int = 0     # the first layers with a dense FFN (leading_dense_block_count); then experts
    expert_sigmoid: bool = False    # DeepSeek-V3: the router's probabilities are sigmoids (expert_gating_func 2)
    n_expert_groups: int = 0        # > 1: expert groups, n_group_used of them compete per token (expert_group_count)
    n_group_used: int = 0
    n_moe_layer_step: int = 0       # ernie4_5-moe: layers il >= n_layer_dense_lead, (il + 1) % step == 0 have experts
    # qwen35 / qwen35moe / qwen3next (powerinfer.qwen35): gated delta net layers (LayerGeom.recurrent) and gated q
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    ssm_n_group: int = 0
    ssm_head_interleave: bool = False
    attn_output_gate: bool = False
    shortconv: bool = False         # lfm2 (powerinfer.lfm2): the recurrent layers are short convs (ssm_d_conv)

    def is_swa_layer(self, il: int) -> bool:
        if self.layer_geom:
            return self.layer_geom[il].is_local
        return self.n_swa > 0 and (self.swa_pattern <= 0 or il % self.swa_pattern < self.swa_pattern - 1)

    def layers(self) -> tuple:
        """Each layer's LayerGeom: layer_geom, or the one shape of every layer."""
        if self.layer_geom:
            return self.layer_geom
        hd = self.head_dim or self.n_embd // self.n_head
        return tuple(LayerGeom(hd, self.n_head_kv, self.n_rot, self.n_ff, self.is_swa_layer(il), il)
                     for il in range(self.n_layer))


@dataclass(frozen=True)
class LayerGeom:
    """One layer's shape (the core's pi_layer_geom)."""
    head_dim: int
    n_head_kv: int
    n_rot: int
    n_ff: int
    is_local: bool
    kv_source: int      # the layer itself, or the earlier layer whose KV cache it reads (gemma4's shared KV layers)
    recurrent: bool = False   # a gated delta net layer (qwen35): a recurrent state, no KV cache


def _gemma4_moe(path, get, as_int) -> dict:
    """gemma4's mixture of experts (the 26B-A4B; llama_model_gemma4): the layers with blk.N.ffn_gate_inp (which:
    _moe_layers) run their dense FFN and expert_count experts of expert_feed_forward_length side by side, the router
    reading the residual stream; {} without experts."""
    if not get("expert_count", 0):
        return {}
    return dict(n_ff_exp=as_int("expert_feed_forward_length", get("expert_feed_forward_length", required=True)),
                moe_router_norm=True, moe_dense_ffn=True)


def _softplus32(x: float) -> float:
    """ggml_compute_softplus_f32 in float32."""
    x = np.float32(x)
    return float(x if x > 20.0 else np.log(np.float32(1.0) + np.exp(x)))


def _xielu_params(path, meta: dict, n_layer: int) -> tuple:
    """apertus: each layer's xIELU parameters (a_n, a_p, beta, eps) from xielu.alpha_n / alpha_p / beta / eps (a value
    or one per layer), a_n = beta + softplus(alpha_n), a_p = softplus(alpha_p) as ggml_xielu computes them (float32)."""
    cols = []
    for key in ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps"):
        v = meta.get(key)
        if v is None:
            raise ModelLoadError(f"{path}: missing metadata key {key}")
        v = list(v) if isinstance(v, (list, tuple)) else [v] * n_layer
        if len(v) != n_layer or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v):
            raise ModelLoadError(f"{path}: {key} must be a finite number or one per layer ({n_layer})")
        cols.append(v)
    return tuple((float(np.float32(b) + np.float32(_softplus32(an))), _softplus32(ap), float(b), float(e))
                 for an, ap, b, e in zip(*cols))


def _llama_block_hparams(path, arch: str, get, as_int, as_float, yarn: dict, swa_pattern, swa_rope_base, meta) -> dict:
    """What the architectures on llama's blocks change from their family's defaults (pi_hparams; llama.cpp's
    src/models/<arch>.cpp); {} for the others. get, as_int, as_float, swa_pattern, swa_rope_base:
    _hparams_from_metadata's readers of the file's keys; meta: the file's metadata."""
    if arch == "apertus":
        # Apertus (llama_model_apertus): NEOX rope after per-head q/k RMSNorm, an optional attn_output.bias, an FFN
        # without a gate whose activation is xIELU with per-layer parameters (global xielu.* keys)
        return dict(rope_mode="neox", qk_norm=1, ffn_act="xielu", ffn_gate="seq",
                    xielu=_xielu_params(path, meta, as_int("block_count", get("block_count", required=True))))
    if arch == "mistral3":
        # Ministral 3 (llama_model_mistral3): llama with YaRN (yarn_log_multiplier: rope_mscale), the file's YaRN betas,
        # an optional attn_output.bias, and q scaled per position (attention.temperature_scale, Llama 4's temperature
        # tuning) in steps of the YaRN original context
        if get("expert_count", 0):
            raise ModelLoadError(f"{path}: mistral3 with experts is not supported")
        out = dict(yarn_beta_fast=as_float("rope.scaling.yarn_beta_fast", get("rope.scaling.yarn_beta_fast", 32.0)),
                   yarn_beta_slow=as_float("rope.scaling.yarn_beta_slow", get("rope.scaling.yarn_beta_slow", 1.0)))
        temp = as_float("attention.temperature_scale", get("attention.temperature_scale", 0.0))
        if temp:
            floor = yarn["yarn_orig_ctx"]
            if not floor:
                raise ModelLoadError(f"{path}: mistral3.attention.temperature_scale without "
                                     "mistral3.rope.scaling.original_context_length (its position step)")
            out.update(attn_temp_scale=temp, attn_temp_floor=floor)
        return out
    if arch == "ernie4_5":
        # ERNIE 4.5 dense (0.3B; llama_model_ernie4_5): llama's blocks and NORMAL rope; the file's attn_output.bias,
        # where it has one, is not read (llama.cpp loads it and leaves it out of the graph); the MoE variant is another
        # architecture
        return {}
    if arch == "seed_oss":
        # ByteDance Seed-OSS (llama_model_seed_oss): NEOX rope, q/k/v biases (where the file has them:
        # _llama_block_views), blk.N.post_attention_norm the FFN's pre-norm (gptoss_views' renaming)
        return dict(rope_mode="neox")
    if arch == "hunyuan-dense":
        # Hunyuan dense (llama_model_hunyuan_vl's graph): NEOX rope, then per-head q/k RMSNorm (after the rope); the
        # converter bakes NTK alpha into rope.freq_base, a file with rope.scaling.alpha gets base * alpha^(d / (d - 2))
        # as llama.cpp; multi-section rope (the VL model's) is not supported
        if any(get("rope.dimension_sections", [])):
            raise ModelLoadError(f"{path}: hunyuan-dense with rope.dimension_sections (multi-section rope) is not "
                                 "supported")
        out = dict(rope_mode="neox", qk_norm=1, qk_norm_after_rope=True)
        alpha = as_float("rope.scaling.alpha", get("rope.scaling.alpha", 0.0))
        if alpha > 0.0:
            d = as_int("attention.key_length", get("attention.key_length", None) or
                       as_int("embedding_length", get("embedding_length")) //
                       as_int("attention.head_count", get("attention.head_count")))
            out["rope_freq_base"] = as_float("rope.freq_base", get("rope.freq_base", 10000.0)) * alpha ** (d / (d - 2))
        return out
    if arch == "arcee":
        # Arcee AFM-4.5B (llama_model_arcee): llama with NORMAL rope (rope_freqs where the file has them) and an FFN
        # without a gate, relu(W_up x)^2 (llama.cpp's LLM_FFN_RELU_SQR, LLM_FFN_SEQ): a naturally sparse activation
        # (exact zeros where W_up x <= 0), run dense here
        return dict(ffn_act="relu", ffn_gate="seq", ffn_act_square=True)
    if arch in ("command-r", "cohere2"):
        # Cohere Command-R (llama_model_command_r) / Command R7B (llama_model_cohere2): LayerNorm without biases
        # (attention.layer_norm_epsilon), attention and FFN side by side from one norm, NORMAL rope, tied output,
        # logits times logit_scale (our logit_scale divides); cohere2 windows every layer but each period's last, and
        # those global layers apply no rope
        f = as_float("logit_scale", get("logit_scale", required=arch == "cohere2") or 0.0)
        if not (math.isfinite(f) and f >= 0.0):
            raise ModelLoadError(f"{path}: {arch}.logit_scale = {f} must be finite and >= 0")
        out = dict(layer_norm=True, parallel_block=True, logit_scale=1.0 / f if f else 0.0,
                   norm_eps=as_float("attention.layer_norm_epsilon", get("attention.layer_norm_epsilon",
                                                                           required=True)))
        if arch == "cohere2":
            period = swa_pattern(4)
            if yarn["yarn_ext_factor"]:
                raise ModelLoadError(f"{path}: cohere2 with YaRN is not supported (its local layers rope apart)")
            out.update(n_swa=as_int("attention.sliding_window", get("attention.sliding_window", required=True)),
                       swa_pattern=period, n_no_rope_layer_step=period, rope_freq_base_swa=swa_rope_base())
        return out
    if arch == "exaone":
        # EXAONE 3.5 (llama_model_exaone): llama's blocks with NEOX rope (rope_freqs where the file has them)
        return dict(rope_mode="neox")
    if arch == "exaone4":
        # EXAONE 4.0 (llama_model_exaone4): NEOX rope, q/k RMSNorm per head, no pre-norms and the blocks' outputs normed
        # (olmo2's post_norms_only); llama.cpp windows only the 64-layer 32B (sliding_window, the pattern of the file,
        # default every 4th layer global), whose global layers apply no rope (a NoPE layer every period)
        if get("nextn_predict_layers", 0):
            raise ModelLoadError(f"{path}: exaone4 with next-token-prediction layers (nextn_predict_layers) is not "
                                 "supported")
        out = dict(rope_mode="neox", qk_norm=1, post_norms=True, post_norms_only=True)
        if as_int("block_count", get("block_count", required=True)) == 64:
            period = swa_pattern(4)
            if yarn["yarn_ext_factor"]:
                raise ModelLoadError(f"{path}: exaone4 with a sliding window and YaRN is not supported")
            out.update(n_swa=as_int("attention.sliding_window", get("attention.sliding_window", 4096)),
                       swa_pattern=period, n_no_rope_layer_step=period, rope_freq_base_swa=swa_rope_base())
        return out
    return {}


def _llama_block_views(path, tensors: dict, hp: HParams) -> tuple[dict, dict]:
    """The tensors of the architectures on llama's blocks under the names the core reads and the flags their presence
    sets ({} for other architectures): llama.cpp's create_tensor_qkv adds q/k/v biases wherever a file has them
    (qkv_bias), mistral3 an attn_output.bias (attn_out_bias); seed_oss's post_attention_norm is its FFN's pre-norm."""
    if hp.arch not in _LLAMA_BLOCK_ARCHS:
        return tensors, {}
    if hp.arch == "command-r" and "blk.0.attn_q_norm.weight" in tensors:
        raise ModelLoadError(f"{path}: command-r with q/k LayerNorms (attn_q_norm: Command R+) is not supported")
    if hp.arch == "apertus" and "blk.0.attn_q_norm.bias" in tensors:
        raise ModelLoadError(f"{path}: apertus with q/k norm biases is not supported")
    if hp.xielu:    # each layer's xIELU parameters as a tensor the core reads (blk.N.ffn_act [4] f32)
        tensors = dict(tensors)
        for il, params in enumerate(hp.xielu):
            name = f"blk.{il}.ffn_act.weight"
            tensors[name] = _ArrayTensor(name, 0, (4,), np.array(params, dtype=np.float32))
    if hp.arch == "seed_oss":
        tensors = gptoss_views(tensors, hp)
    flags = {"qkv_bias": int("blk.0.attn_q.bias" in tensors)}
    if hp.arch in _OUT_BIAS_ARCHS:
        flags["attn_out_bias"] = int("blk.0.attn_output.bias" in tensors)
    return tensors, flags


def _moe_layers(path, tensors: dict, hp: HParams) -> list:
    """Which layers have experts (pi_layer_geom.moe): all with n_expert where the layers have one shape; deepseek2's
    after its leading dense ones; with a geometry table (gemma4), those whose file has blk.N.ffn_gate_inp.weight
    (llama.cpp's rules)."""
    if hp.arch == "deepseek2":
        return [hp.n_expert > 0 and il >= hp.n_layer_dense_lead for il in range(hp.n_layer)]
    if hp.arch in MOE_ARCHS:
        return moe_layers(hp)
    if not hp.layer_geom:
        return [hp.n_expert > 0] * hp.n_layer
    moe = [f"blk.{il}.ffn_gate_inp.weight" in tensors for il in range(hp.n_layer)]
    if any(moe) != (hp.n_expert > 0):
        raise ModelLoadError(f"{path}: {hp.arch}.expert_count is {hp.n_expert} and {sum(moe)} layers have "
                             "ffn_gate_inp (experts need both)")
    return moe


def _deepseek2(path, get, as_int, as_float, n_rot: int, n_layer: int, n_ff: int) -> dict:
    """deepseek2's attention and experts (llama.cpp's llama_model_deepseek2): MLA of kv_lora_rank R with q through
    attn_q or (q_lora_rank) attn_q_a / attn_q_b; newer files (key_length_mla / value_length_mla, key_length R + n_rot)
    carry attn_k_b / attn_v_b, older ones (key_length = the q/k head size) attn_kv_b; the cache's one KV head of R +
    n_rot values (LayerGeom); the first leading_dense_block_count layers dense, then experts with a router whose softmax
    probabilities (V2; expert_gating_func 1 or unset) or sigmoids (V3: 2) are renormalized over the chosen ones only
    with expert_weights_norm, times expert_weights_scale, the experts chosen among the expert_group_used_count best of
    expert_group_count groups where the file has groups (blk.N.exp_probs_b.bias, where a layer has it, shifts the
    choice), and expert_shared_count shared experts of the experts' width beside them."""
    for key in ("attention.temperature_scale", "nextn_predict_layers"):   # Mistral-Large 3's, GLM's MTP layers
        if get(key, 0):
            raise ModelLoadError(f"{path}: deepseek2.{key} is not supported")
    rank = as_int("attention.kv_lora_rank", get("attention.kv_lora_rank", required=True))
    q_lora = get("attention.q_lora_rank", 0)
    q_lora = 0 if q_lora == 0 else as_int("attention.q_lora_rank", q_lora)
    kv_b = get("attention.key_length_mla") is None
    suffix = "" if kv_b else "_mla"
    head_k = as_int("attention.key_length" + suffix, get("attention.key_length" + suffix, required=True))
    head_v = as_int("attention.value_length" + suffix, get("attention.value_length" + suffix, required=True))
    if head_k <= n_rot:
        raise ModelLoadError(f"{path}: deepseek2.attention.key_length{suffix} {head_k} must exceed "
                             f"rope.dimension_count {n_rot} (the q/k head: nope + rope dims)")
    if not kv_b and (get("attention.key_length") not in (None, rank + n_rot) or
                     get("attention.value_length") not in (None, rank)):
        raise ModelLoadError(f"{path}: deepseek2.attention.key_length / value_length must be kv_lora_rank + rope dims "
                             f"({rank + n_rot}) / kv_lora_rank ({rank}) in a file with key_length_mla")
    lead = get("leading_dense_block_count", 0)
    lead = 0 if lead == 0 else as_int("leading_dense_block_count", lead)
    out = dict(mla_kv_rank=rank, mla_head_k=head_k, mla_head_v=head_v, q_lora_rank=q_lora, mla_kv_b=kv_b,
               n_layer_dense_lead=lead, head_dim=rank + n_rot,
               layer_geom=tuple(LayerGeom(rank + n_rot, 1, n_rot, n_ff, False, il) for il in range(n_layer)))
    if not get("expert_count", 0):
        return out
    gating = get("expert_gating_func", 1)     # 0 (unset): softmax, as llama.cpp reads V2 / V2.5 files
    if gating not in (0, 1, 2):
        raise ModelLoadError(f"{path}: deepseek2.expert_gating_func {gating!r} is not supported (1 softmax, 2 sigmoid)")
    groups = get("expert_group_count", 0)
    groups = 0 if groups == 0 else as_int("expert_group_count", groups)
    used = as_int("expert_group_used_count", get("expert_group_used_count", required=True)) if groups > 1 else 0
    n_ff_exp = as_int("expert_feed_forward_length", get("expert_feed_forward_length", required=True))
    shared = get("expert_shared_count", required=True)
    shared = 0 if shared == 0 else as_int("expert_shared_count", shared)
    return dict(out, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_exp * shared,
                expert_raw_weights=not get("expert_weights_norm", False), expert_sigmoid=gating == 2,
                n_expert_groups=groups if groups > 1 else 0, n_group_used=used)


def _hparams_from_metadata(path, meta: dict) -> HParams:
    arch = meta.get("general.architecture")
    if arch is None:
        raise ModelLoadError(f"{path}: missing general.architecture")
    _encoder.refuse_unsupported(path, arch)
    if arch not in _ARCHS:
        raise ModelLoadError(f"{path}: unsupported architecture '{arch}' (general.architecture); this build runs "
                             f"{', '.join(_ARCHS)}")

    def get(key, default=None, required=False):
        full = f"{arch}.{key}"
        if full in meta:
            return meta[full]
        if required:
            raise ModelLoadError(f"{path}: missing metadata key {full}")
        return default

    def as_int(key, value):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or int(value) != value:
            raise ModelLoadError(f"{path}: metadata {arch}.{key} = {value!r} is not an integer")
        if not 0 < int(value) < 2**31:
            raise ModelLoadError(f"{path}: metadata {arch}.{key} = {value} is out of range")
        return int(value)

    def as_float(key, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadError(f"{path}: metadata {arch}.{key} = {value!r} is not a number")
        return float(value)

    def softcap(key, default):
        """A soft-capping value (gemma2; llama.cpp's defaults where the file has none): finite and >= 0, 0 = none."""
        value = as_float(key, get(key, default))
        if not (math.isfinite(value) and value >= 0.0):
            raise ModelLoadError(f"{path}: metadata {arch}.{key} = {value!r} must be a finite number >= 0 (0: none)")
        return value

    def swa_rope_base(default=None):
        """The local layers' rope base: the file's rope.freq_base_swa, else default (None: the global layers' base)."""
        if default is None:
            default = as_float("rope.freq_base", get("rope.freq_base", 10000.0))
        return as_float("rope.freq_base_swa", get("rope.freq_base_swa", default))

    def swa_pattern(default):
        """The local layers' period (llama.cpp's load_swa_pattern): the key's, else default."""
        pattern = get("attention.sliding_window_pattern", default)
        if isinstance(pattern, list):     # per-layer flags (newer converters): find the period
            flags = [bool(v) for v in pattern]
            period = 0 if all(flags) else next((p for p in range(1, len(flags) + 1)
                                                 if all(f == (i % p < p - 1) for i, f in enumerate(flags))), None)
            if period is None:
                raise ModelLoadError(f"{path}: {arch}.attention.sliding_window_pattern {flags} is not periodic "
                                     "(not supported)")
            return period
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 0:
            raise ModelLoadError(f"{path}: metadata {arch}.attention.sliding_window_pattern = {pattern!r} is not a "
                                 "layer period")
        return pattern

    if arch in _SPARSE_ONLY and not meta.get("_pwri"):
        raise ModelLoadError(f"{path}: dense falcon/opt not supported; use the PowerInfer file (a {arch} model is "
                             "run from its PWRI file with predictors only)")

    def per_layer(key, default=None):
        """An integer key that may hold a value per layer (gemma4: head_count_kv, feed_forward_length): n_layer ints."""
        value = get(key, default, required=default is None)
        n_layer = as_int("block_count", get("block_count", required=True))
        if isinstance(value, list):
            if len(value) != n_layer:
                raise ModelLoadError(f"{path}: {arch}.{key} has {len(value)} values for {n_layer} layers")
            return [as_int(key, v) for v in value]
        return [as_int(key, value)] * n_layer

    n_embd = as_int("embedding_length", get("embedding_length", required=True))
    n_head = as_int("attention.head_count", get("attention.head_count", required=True))
    n_head_kv = (per_layer("attention.head_count_kv", n_head)[0] if arch == "gemma4"
                 else 0 if arch in lfm2_arch.ARCHS      # a count per layer: lfm2_arch.hparams
                 else as_int("attention.head_count_kv", get("attention.head_count_kv", n_head)))
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError(f"{path}: missing tokenizer.ggml.tokens")
    key_length = get("attention.key_length")
    value_length = get("attention.value_length", key_length)
    if key_length is not None and arch != "deepseek2":    # deepseek2's: _deepseek2
        key_length = as_int("attention.key_length", key_length)
        if as_int("attention.value_length", value_length) != key_length:
            raise ModelLoadError(f"{path}: attention.key_length {key_length} and value_length {value_length} differ "
                                 "(not supported)")
    if arch == "deepseek2":
        key_length = None
    if key_length is None and n_embd % n_head and arch != "deepseek2":
        raise ModelLoadError(f"{path}: embedding_length {n_embd} is not a multiple of head_count {n_head}")
    head_dim = key_length if key_length is not None else n_embd // n_head
    n_rot = as_int("rope.dimension_count", get("rope.dimension_count", head_dim))
    if arch in _SPARSE_ONLY and key_length is not None and key_length != n_embd // n_head:
        raise ModelLoadError(f"{path}: {arch}: attention.key_length {key_length} must be embedding_length / head_count")
    if arch == "falcon" and n_rot != head_dim:
        raise ModelLoadError(f"{path}: falcon: rope.dimension_count {n_rot} must equal embedding_length / head_count "
                             f"= {head_dim}")
    if arch == "opt":
        n_rot = head_dim     # no rope; the value is not used

    scaling = get("rope.scaling.type", "linear")
    factor = as_float("rope.scaling.factor", get("rope.scaling.factor", get("rope.scale_linear", 1.0)))
    if scaling == "none":
        factor = 1.0
    elif scaling not in ("linear", "yarn"):
        raise ModelLoadError(f"{path}: rope scaling type '{scaling}' is not supported yet (none, linear, yarn)")
    if not factor or factor <= 0:
        raise ModelLoadError(f"{path}: rope scaling factor {factor} must be > 0")
    orig_ctx = get("rope.scaling.original_context_length")
    yarn = dict(rope_scaling=scaling, yarn_ext_factor=1.0 if scaling == "yarn" else 0.0,
                yarn_orig_ctx=(as_int("rope.scaling.original_context_length", orig_ctx) if orig_ctx is not None else 0),
                rope_attn_factor=as_float("rope.scaling.attn_factor", get("rope.scaling.attn_factor", 1.0)),
                # deepseek2's converter writes 0.1 x mscale_all_dim (llama.cpp divides it back)
                yarn_log_mul=as_float("rope.scaling.yarn_log_multiplier", get("rope.scaling.yarn_log_multiplier", 0.0))
                / (0.1 if arch == "deepseek2" else 1.0))

    if arch in ("qwen2", "qwen3", "gemma2", "gemma3", "gemma4") and meta.get("_pwri"):
        raise ModelLoadError(f"{path}: sparse (PowerInfer) inference supports llama, bamboo, falcon and opt only, "
                             f"not {arch}")
    # ReLU-LLaMA files from the original converter carry no activation key; a PWRI file is ReLU by definition
    default_act = ("relu" if arch == "bamboo" or meta.get("_pwri") else "gelu" if arch in ("gemma2", "gemma3", "gemma4")
                   else "swiglu_oai" if arch == "gpt-oss" else "silu")
    act = meta.get(ACTIVATION_KEY, default_act)
    if act not in _ACTS:
        raise ModelLoadError(f"{path}: unknown FFN activation '{act}' in {ACTIVATION_KEY}")

    # what the forward pass does differently from llama (see pi_hparams in powerinfer.h)
    extra: dict = {"head_dim": head_dim if key_length is not None else 0}
    n_ff = None           # the FFN width where the key cannot give it (gemma4: the widest of its per-layer widths)
    if arch in ("qwen2", "qwen2moe"):
        extra.update(rope_mode="neox", qkv_bias=True)
    elif arch in ("qwen3", "qwen3moe"):
        extra.update(rope_mode="neox", qk_norm=True)
    elif arch == "falcon":
        extra.update(rope_mode="neox")
    elif arch in ("granite", "granitemoe"):
        # multipliers of the muP-trained Granite 3.x (llama.cpp's f_embedding_scale, f_attention_scale,
        # f_residual_scale, f_logit_scale); rope.scaling.finetuned false: no rope in any layer
        scales = {k: as_float(k, get(k)) for k in ("embedding_scale", "attention.scale", "residual_scale",
                                                   "logit_scale") if get(k) is not None}
        if "logit_scale" not in scales:
            raise ModelLoadError(f"{path}: missing metadata key {arch}.logit_scale")
        if scales["logit_scale"] <= 0.0 or not math.isfinite(scales["logit_scale"]):
            raise ModelLoadError(f"{path}: {arch}.logit_scale = {scales['logit_scale']} must be > 0")
        extra.update(embd_scale=scales.get("embedding_scale", 0.0), attn_scale=scales.get("attention.scale", 0.0),
                     residual_scale=scales.get("residual_scale", 0.0), logit_scale=scales["logit_scale"],
                     n_no_rope_layer_step=0 if get("rope.scaling.finetuned", True) else 1)
    elif arch == "olmo2":
        # OLMo 2 (and OLMo 3's sliding window, every 4th layer global): no pre-norms, the blocks' outputs normed
        # (post_attention_norm, post_ffw_norm), RMSNorm of the whole q and k; local layers rope unscaled
        n_swa = as_int("attention.sliding_window", get("attention.sliding_window")) \
            if get("attention.sliding_window") else 0
        if n_swa and yarn["yarn_ext_factor"]:
            raise ModelLoadError(f"{path}: olmo2 with a sliding window and YaRN (its local layers rope without it) "
                                 "is not supported")
        extra.update(rope_mode="neox", qk_norm=2, post_norms=True, post_norms_only=True, n_swa=n_swa,
                     swa_pattern=swa_pattern(4) if n_swa else 0,
                     rope_freq_base_swa=swa_rope_base(), rope_freq_scale_swa=1.0)
    elif arch in qwen35_arch.ARCHS:
        n_layer_q35 = as_int("block_count", get("block_count", required=True))
        extra.update(qwen35_arch.hparams(path, arch, get, as_int, n_layer_q35, head_dim, n_rot,
                                         as_int("feed_forward_length", get("feed_forward_length", 0)),
                                         n_head_kv, ModelLoadError, LayerGeom))
    elif arch in lfm2_arch.ARCHS:
        n_layer_lfm2 = as_int("block_count", get("block_count", required=True))
        extra.update(lfm2_arch.hparams(path, arch, get, as_int, n_layer_lfm2, head_dim, n_rot,
                                       as_int("feed_forward_length", get("feed_forward_length", 0)),
                                       ModelLoadError, LayerGeom))
        n_head_kv = extra.pop("n_head_kv")
    elif arch == "smollm3":
        extra.update(n_no_rope_layer_step=4)      # llama.cpp's: layers 3, 7, 11, ... have no rope (NoPE)
    elif arch == "glm4":
        # GLM-4-0414: a q/k/v bias (fused with the weights, split by fused_views), NORMAL rope over the file's
        # rope.dimension_count (half a head), norms before and after each block (post_attention_norm, post_ffw_norm)
        if get("nextn_predict_layers", 0):
            raise ModelLoadError(f"{path}: glm4 with next-token-prediction layers (nextn_predict_layers) is not "
                                 "supported")
        extra.update(qkv_bias=True, post_norms=True)
    elif arch == "phi3":
        # phi3.attention.sliding_window is ignored, as llama.cpp does (its converters write one that the model's
        # reference attention does not apply)
        extra.update(rope_mode="neox")
    elif arch == "opt":
        extra.update(qkv_bias=True)
    elif arch == "gemma3":
        # a window: every 6th layer global (llama.cpp), local layers rope with base 10000 (rope.freq_base_swa where
        # the file has one) unscaled; no window (Rnj-1): every layer global. The final soft cap where the file has one
        n_swa = as_int("attention.sliding_window", get("attention.sliding_window")) \
            if get("attention.sliding_window") else 0
        n_layer = as_int("block_count", get("block_count", required=True))
        # llama.cpp (after gemma_pytorch): q is scaled by 1/sqrt(n_embd / n_head) in the 27B model
        # (query_pre_attn_scalar), by 1/sqrt(head_dim) in the others
        attn_scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else head_dim)
        extra.update(rope_mode="neox", qk_norm=True, post_norms=True, embd_scale=math.sqrt(n_embd),
                     attn_scale=attn_scale, n_swa=n_swa, swa_pattern=swa_pattern(6) if n_swa else 0,
                     rope_freq_base_swa=swa_rope_base(10000.0),
                     rope_freq_scale_swa=1.0, final_softcap=softcap("final_logit_softcapping", 0.0))
    elif arch == "gemma4":
        # llama.cpp (llama_model_gemma4): the local layers of sliding_window_pattern (a flag per layer) have head size
        # key_length_swa, rope.dimension_count_swa (default: the global layers' rope dims) and rope.freq_base_swa
        # (default 10000), unscaled; the global layers key_length, rope.dimension_count, rope.freq_base and the factors
        # of rope_freqs.weight; KV heads and FFN widths may be per layer; q not scaled; the last shared_kv_layers layers
        # read the cache of layer n_kv - 2 (local) or n_kv - 1 (global), n_kv = n_layer - shared_kv_layers
        n_layer = as_int("block_count", get("block_count", required=True))
        pattern = get("attention.sliding_window_pattern")
        if not isinstance(pattern, list) or len(pattern) != n_layer:
            raise ModelLoadError(f"{path}: {arch}.attention.sliding_window_pattern must be a flag per layer "
                                 f"({n_layer}), not {pattern!r}")
        local = [bool(v) for v in pattern]
        head_dim_swa = as_int("attention.key_length_swa", get("attention.key_length_swa", head_dim))
        if as_int("attention.value_length_swa", get("attention.value_length_swa", head_dim_swa)) != head_dim_swa:
            raise ModelLoadError(f"{path}: {arch}.attention.key_length_swa and value_length_swa differ (not supported)")
        n_rot_swa = as_int("rope.dimension_count_swa", get("rope.dimension_count_swa", n_rot))
        kv_heads, ffs = per_layer("attention.head_count_kv", n_head), per_layer("feed_forward_length")
        shared = get("attention.shared_kv_layers", 0)
        shared = 0 if shared == 0 else as_int("attention.shared_kv_layers", shared)
        n_pl = get("embedding_length_per_layer_input", 0)     # E2B / E4B: per-layer embeddings of this width
        n_pl = 0 if n_pl == 0 else as_int("embedding_length_per_layer_input", n_pl)
        n_kv = n_layer - shared
        if shared and n_kv < 2:
            raise ModelLoadError(f"{path}: {arch}.attention.shared_kv_layers = {shared} leaves fewer than 2 of "
                                 f"{n_layer} layers with a KV cache")
        geom = tuple(LayerGeom(head_dim_swa if loc else head_dim, kv_heads[il], n_rot_swa if loc else n_rot, ffs[il],
                               loc, il if il < n_kv else n_kv - (2 if loc else 1)) for il, loc in enumerate(local))
        glob = next((g for g in geom if not g.is_local), geom[0])
        n_head_kv, n_ff = glob.n_head_kv, max(ffs)      # the fields: the global layers', the widest FFN
        extra.update(rope_mode="neox", qk_norm=True, post_norms=True, embd_scale=math.sqrt(n_embd), attn_scale=1.0,
                     n_swa=as_int("attention.sliding_window", get("attention.sliding_window", required=True)),
                     rope_freq_base_swa=swa_rope_base(10000.0), rope_freq_scale_swa=1.0,
                     final_softcap=softcap("final_logit_softcapping", 0.0), v_norm=True, rope_freqs_global=True,
                     layer_geom=geom, n_embd_per_layer=n_pl)
        extra.update(_gemma4_moe(path, get, as_int))
    elif arch == "gemma2":
        # llama.cpp (llama_model_gemma2): the window defaults to 4096, every other layer local (set_swa_pattern(2):
        # even layers local, odd global) unless the file says otherwise; local layers rope with the file's base and
        # scale (rope.freq_base_swa where present), as llama.cpp's *_train_swa, not with the context's overrides
        n_swa = as_int("attention.sliding_window", get("attention.sliding_window", 4096))
        pattern = swa_pattern(2)
        n_layer = as_int("block_count", get("block_count", required=True))
        # llama.cpp (after gemma_pytorch's query_pre_attn_scalar): the 27B (46 layers) scales q by
        # 1/sqrt(n_embd / n_head), the 2B and 9B by 1/sqrt(head_dim)
        attn_scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 46 else head_dim)
        extra.update(rope_mode="neox", post_norms=True, embd_scale=math.sqrt(n_embd), attn_scale=attn_scale,
                     n_swa=n_swa, swa_pattern=pattern,
                     rope_freq_base_swa=swa_rope_base(),
                     rope_freq_scale_swa=1.0 / float(factor),
                     attn_softcap=softcap("attn_logit_softcapping", 50.0),
                     final_softcap=softcap("final_logit_softcapping", 30.0))
    elif arch == "deepseek2":
        n_layer = as_int("block_count", get("block_count", required=True))
        n_ff = as_int("feed_forward_length", get("feed_forward_length", required=True))   # the dense layers'
        n_head_kv = 1            # MLA: one cached row per token for all heads
        extra.update(_deepseek2(path, get, as_int, as_float, n_rot, n_layer, n_ff))
    elif arch == "gpt-oss":
        # llama.cpp (llama_model_openai_moe): q/k/v and output biases, one sink logit per head, NEOX rope with the
        # file's scaling (YaRN in the released files) for both kinds of layers, attention.sliding_window required and
        # every other layer local (set_swa_pattern(2): the even ones) unless sliding_window_pattern says otherwise, the
        # local layers' rope base rope.freq_base_swa where given (else the one base), q scaled by 1/sqrt(n_rot); the
        # experts' router and matrices with biases and the OAI SwiGLU; blk.N.post_attention_norm is the FFN's pre-norm
        # (gptoss_views names it ffn_norm)
        if get("attention.sliding_window") is None:
            raise ModelLoadError(f"{path}: missing metadata key {arch}.attention.sliding_window")
        if n_rot != head_dim:
            raise ModelLoadError(f"{path}: gpt-oss with rope.dimension_count {n_rot} != the head size {head_dim} is "
                                 "not supported (llama.cpp sizes its heads by n_rot)")
        extra.update(rope_mode="neox", qkv_bias=True, attn_out_bias=True, attn_sinks=True, expert_bias=True,
                     attn_scale=1.0 / math.sqrt(n_rot),
                     n_swa=as_int("attention.sliding_window", get("attention.sliding_window")),
                     swa_pattern=swa_pattern(2),
                     rope_freq_base_swa=swa_rope_base(),
                     rope_freq_scale_swa=1.0 / float(factor),
                     swiglu_alpha=GPT_OSS_SWIGLU_ALPHA, swiglu_limit=GPT_OSS_SWIGLU_LIMIT)
    extra.update(_llama_block_hparams(path, arch, get, as_int, as_float, yarn, swa_pattern, swa_rope_base, meta))
    extra.update(moe_arch_hparams(path, arch, get, as_int, as_float, head_dim, n_rot, n_head_kv))
    if "n_ff" in extra:
        n_ff = extra.pop("n_ff")
    if _encoder.is_encoder(arch):
        extra.update(_encoder.encoder_hparams(path, arch, get, as_float))
    if "norm_eps" in extra:
        norm_eps = extra.pop("norm_eps")
    elif arch == "falcon":
        norm_eps = as_float("attention.layer_norm_epsilon", get("attention.layer_norm_epsilon", required=True))
    elif arch == "opt":
        norm_eps = as_float("attention.layer_norm_epsilon", get("attention.layer_norm_epsilon", OPT_DEFAULT_NORM_EPS))
    else:
        norm_eps = as_float("attention.layer_norm_rms_epsilon", get("attention.layer_norm_rms_epsilon", 1e-5))
    if not 0.0 <= norm_eps < 1.0:
        raise ModelLoadError(f"{path}: norm epsilon {norm_eps} is out of range")
    # opt: the original hard-codes n_ctx_train = 2050 (the learned positions); the key is used when present
    n_ctx_train = get("context_length", 2050 if arch == "opt" else None, required=arch != "opt")
    n_ff_key = "feed_forward_length"
    if get("expert_count", 0):      # mixture of experts: the experts' width (qwen3moe has a key of its own)
        if arch in _SPARSE_ONLY or meta.get("_pwri"):
            raise ModelLoadError(f"{path}: a mixture-of-experts {arch} PowerInfer file is not supported")
        extra.update(n_expert=as_int("expert_count", get("expert_count")),
                     n_expert_used=as_int("expert_used_count", get("expert_used_count", required=True)),
                     expert_weights_scale=as_float("expert_weights_scale", get("expert_weights_scale", 0.0))
                     if arch in WEIGHTS_SCALE_ARCHS else 0.0)
        if get("expert_feed_forward_length") is not None and arch != "deepseek2":
            n_ff_key = "expert_feed_forward_length"
        if arch == "deepseek2" or arch in MOE_ARCHS:
            pass                  # their shared experts and weights: _deepseek2, moe_arch_hparams
        elif arch == "qwen2moe":     # a gated shared expert (its width: the file's key, else feed_forward_length) and
            # the router's probabilities as they are (llama.cpp's norm_w false)
            extra.update(expert_raw_weights=True, n_ff_shexp=as_int(
                "expert_shared_feed_forward_length",
                get("expert_shared_feed_forward_length", get("feed_forward_length", required=True))))
        elif arch in qwen35_arch.ARCHS:
            extra.update(qwen35_arch.moe(path, arch, get, as_int, as_int(n_ff_key, get(n_ff_key, required=True))))
        elif get("expert_shared_feed_forward_length", 0):   # granitemoe's shared variant: no gate
            extra["n_ff_shexp"] = as_int("expert_shared_feed_forward_length", get("expert_shared_feed_forward_length"))
    elif arch in ("qwen3moe", "granitemoe", "gpt-oss", "qwen2moe", "qwen35moe", "qwen3next"):
        raise ModelLoadError(f"{path}: {arch} without {arch}.expert_count")
    return HParams(
        arch=arch, n_vocab=len(tokens),
        n_ctx_train=as_int("context_length", n_ctx_train),
        n_embd=n_embd, n_ff=n_ff if n_ff is not None else as_int(n_ff_key, get(n_ff_key, required=True)),
        n_head=n_head, n_head_kv=n_head_kv,
        n_layer=extra.pop("n_layer", None) or as_int("block_count", get("block_count", required=True)),
        n_rot=n_rot, ffn_act=extra.pop("ffn_act", act),
        ffn_gate=extra.pop("ffn_gate", None) or ("sym" if arch == "bamboo" else "seq" if arch in _SPARSE_ONLY
                                                 else "par"),
        norm_eps=norm_eps,
        rope_freq_base=extra.pop("rope_freq_base", None) or as_float("rope.freq_base", get("rope.freq_base", 10000.0)),
        rope_freq_scale=1.0 / float(factor),
        **yarn,
        **extra,
    )


@dataclass
class _ArrayTensor:
    """A tensor the loader makes (not the file's): the same fields as a GGUF file's tensor."""
    name: str
    type: int          # ggml type id (0: f32)
    ne: tuple
    data: np.ndarray


def check_kv_overrides(overrides: dict) -> dict:
    """The overrides, checked: string keys, bool / int / float / str values (llama.cpp's four types)."""
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"kv_overrides: key {key!r} is not a metadata key")
        if not isinstance(value, (bool, int, float, str)):
            raise ValueError(f"kv_overrides: {key} = {value!r}: the value must be a bool, int, float or str")
    return dict(overrides)


def parse_kv_override(text: str) -> tuple[str, bool | int | float | str]:
    """llama.cpp's --override-kv KEY=TYPE:VALUE (TYPE int, float, bool or str) -> (key, value); ValueError."""
    key, sep, rest = text.partition("=")
    kind, sep2, value = rest.partition(":")
    if not key or not sep or not sep2:
        raise ValueError(f"--override-kv {text!r}: expected KEY=TYPE:VALUE, e.g. "
                         "tokenizer.ggml.add_bos_token=bool:false")
    try:
        if kind == "int":
            return key, int(value)
        if kind == "float":
            return key, float(value)
        if kind == "bool":
            if value.lower() not in ("true", "false"):
                raise ValueError
            return key, value.lower() == "true"
        if kind == "str":
            return key, value
    except ValueError:
        raise ValueError(f"--override-kv {text!r}: {value!r} is not a {kind}") from None
    raise ValueError(f"--override-kv {text!r}: type {kind!r} is not one of int, float, bool, str")


def _split_rows(path, t: TensorInfo, parts: list[tuple[str, int]]) -> dict:
    """Views of t's row ranges (a 2-d tensor, row i = output i; of a 1-d one, its elements: a fused bias) under new
    names: parts are (name, rows) in order."""
    rows = sum(n for _, n in parts)
    if len(t.ne) not in (1, 2) or t.ne[-1] != rows or t.data.nbytes % rows:
        raise ModelLoadError(f"{path}: tensor '{t.name}' has shape {list(t.ne)}, expected [{t.ne[0]}, {rows}]")
    row, start, out = t.data.nbytes // rows, 0, {}
    for name, n in parts:
        view = t.data[start * row:(start + n) * row]
        out[name] = TensorInfo(name, t.type, t.ne[:-1] + (n,), view, t.offset + start * row)
        start += n
    return out


def _fused(hp: HParams, il: int) -> list[tuple[str, list[tuple[str, int]]]]:
    """Layer il's fused weights (phi3, glm4) and their parts (row counts): q|k|v, gate|up (the gate's rows first)."""
    hd = hp.head_dim or hp.n_embd // hp.n_head
    p = f"blk.{il}."
    return [(p + "attn_qkv", [(p + "attn_q", hd * hp.n_head), (p + "attn_k", hd * hp.n_head_kv),
                              (p + "attn_v", hd * hp.n_head_kv)]),
            (p + "ffn_up", [(p + "ffn_gate", hp.n_ff), (p + "ffn_up", hp.n_ff)])]


def fused_views(path, tensors: dict, hp: HParams) -> dict:
    """phi3's and glm4's tensors under the names the core reads, as views of the file's bytes (no copy): a fused
    blk.N.attn_qkv [n_embd, n_embd_q + 2 n_embd_kv] is attn_q, attn_k, attn_v (its rows in that order; its bias, glm4,
    the three biases); the fused blk.N.ffn_up [n_embd, 2 n_ff] is ffn_gate (its first n_ff rows: silu's input) and
    ffn_up; rope_factors_short / rope_factors_long are rope_freqs / rope_freqs_long (the context picks one:
    pi_context_rope_freqs)."""
    out = dict(tensors)
    for il in range(hp.n_layer if hp.n_expert == 0 else 0):
        for fused, parts in _fused(hp, il):
            t = out.get(fused + ".weight")
            if t is not None and len(t.ne) == 2 and t.ne[1] == sum(n for _, n in parts):
                del out[fused + ".weight"]
                out.update(_split_rows(path, t, [(name + ".weight", n) for name, n in parts]))
                b = out.pop(fused + ".bias", None)
                if b is not None:
                    out.update(_split_rows(path, b, [(name + ".bias", n) for name, n in parts]))
    for old, new in (("rope_factors_short.weight", "rope_freqs.weight"),
                     ("rope_factors_long.weight", "rope_freqs_long.weight")):
        if old in out:
            out[new] = out.pop(old)
    return out


def gptoss_views(tensors: dict, hp: HParams) -> dict:
    """gpt-oss's tensors under the names the core reads: blk.N.post_attention_norm (the norm between the attention's
    residual add and the experts, llama.cpp's attn_post_norm) is the FFN's pre-norm, blk.N.ffn_norm (the same bytes).
    Not a post-norm: the core's post_norms (gemma) normalise a block's output before its residual add."""
    out = dict(tensors)
    for il in range(hp.n_layer):
        old, new = f"blk.{il}.post_attention_norm.weight", f"blk.{il}.ffn_norm.weight"
        if old in out and new not in out:
            t = out.pop(old)
            out[new] = TensorInfo(new, t.type, t.ne, t.data, t.offset)
    return out


def fused_adapter_views(path, tensors: dict, hp: HParams) -> dict:
    """A LoRA adapter of a phi3 / glm4 model over the views fused_views makes: a fused weight's pair (lora_a [n_in, r],
    lora_b [r, n_out]) becomes one pair per part, each with the same lora_a and its rows of lora_b."""
    out = dict(tensors)
    for il in range(hp.n_layer if hp.n_expert == 0 else 0):
        for fused, parts in _fused(hp, il):
            a, b = out.get(fused + ".weight.lora_a"), out.get(fused + ".weight.lora_b")
            if a is None or b is None or len(b.ne) != 2 or b.ne[1] != sum(n for _, n in parts):
                continue         # not fused (or broken: the core names what is wrong)
            del out[fused + ".weight.lora_a"], out[fused + ".weight.lora_b"]
            out.update(_split_rows(path, b, [(name + ".weight.lora_b", n) for name, n in parts]))
            out.update((name + ".weight.lora_a", TensorInfo(name + ".weight.lora_a", a.type, a.ne, a.data, a.offset))
                       for name, _ in parts)
    return out


def dequantized(path, t: TensorInfo) -> np.ndarray:
    """A file tensor dequantized to float32, numpy shape = ne reversed (ModelLoadError for a type this build cannot
    read)."""
    n = int(np.prod(t.ne))
    out = np.empty(n, dtype=np.float32)
    try:
        check(lib.pi_dequantize_row(t.type, ffi.from_buffer(t.data), ffi.from_buffer("float[]", out), n))
    except PowerInferError as e:
        raise ModelLoadError(f"{path}: tensor '{t.name}': {e}") from None
    return out.reshape(tuple(reversed(t.ne)))


def deepseek2_views(path, tensors: dict, hp: HParams) -> tuple[dict, list]:
    """deepseek2's tensors as the core reads them, and the arrays made for them (kept alive with the model): an older
    file's blk.N.attn_kv_b [R, n_head (nope + v)] (each head's nope k rows, then its v rows; llama.cpp's non-MLA path)
    becomes attn_k_b [nope, R, n_head] (head h's k rows transposed: q_nope -> the latent space, as the converter splits
    newer files) and attn_v_b [R, v, n_head] (its v rows), dequantized to f32."""
    out, made = dict(tensors), []
    H, R, nope, vd = hp.n_head, hp.mla_kv_rank, hp.mla_head_k - hp.n_rot, hp.mla_head_v
    for il in range(hp.n_layer if hp.mla_kv_b else 0):
        p = f"blk.{il}."
        t = out.pop(p + "attn_kv_b.weight", None)
        if t is None:
            raise ModelLoadError(f"{path}: missing tensor '{p}attn_kv_b.weight' (a deepseek2 file without "
                                 "key_length_mla has attn_kv_b, not attn_k_b / attn_v_b)")
        if tuple(t.ne) != (R, H * (nope + vd)):
            raise ModelLoadError(f"{path}: tensor '{t.name}' has shape {list(t.ne)}, expected [{R}, {H * (nope + vd)}]")
        kv = dequantized(path, t).reshape(H, nope + vd, R)
        k_b = np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))      # (H, R, nope): ne [nope, R, H]
        v_b = np.ascontiguousarray(kv[:, nope:, :])                         # (H, vd, R): ne [R, vd, H]
        made += [k_b, v_b]
        out[p + "attn_k_b.weight"] = _ArrayTensor(p + "attn_k_b.weight", 0, (nope, R, H), k_b)
        out[p + "attn_v_b.weight"] = _ArrayTensor(p + "attn_v_b.weight", 0, (R, vd, H), v_b)
    return out, made


def tensor_descs(path, tensors: dict) -> tuple:
    """A pi_tensor_desc[] over the tensors (name -> TensorInfo: views into a file's mapping) and the cffi name
    strings it points to, which the caller keeps alive as long as the core reads the descriptions."""
    descs = ffi.new("pi_tensor_desc[]", max(len(tensors), 1))
    names = [ffi.new("char[]", name.encode()) for name in tensors]
    for i, t in enumerate(tensors.values()):
        d = descs[i]
        d.name = names[i]
        d.type = t.type
        d.n_dims = len(t.ne)
        if d.n_dims > 4:
            raise ModelLoadError(f"{path}: tensor '{t.name}' has {d.n_dims} dims (at most 4)")
        for j, v in enumerate(t.ne):
            d.ne[j] = v
        d.data = ffi.from_buffer(t.data) if t.data.nbytes else ffi.NULL
        d.nbytes = t.data.nbytes
    return descs, names


class Model:
    """A loaded model. Weights stay in the memory-mapped file, except that the matmul weights of
    types with a faster interleaved layout (f16, bf16, Q4_0, Q8_0, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, IQ4_NL, IQ4_XS,
    MXFP4; Q6_K at the avx512 level; 2-d: 3-d expert tensors are read in place) are copied into it at load time, as
    llama.cpp's CPU repacking does (at the amx level
    Q5_0's copy is Q8_0's layout: 1.55x its bytes), and a sparse file's Q4_0 FFN (n_embd a multiple of 256) is
    copied with each neuron's rows together (n_packed_ffn layers). repack=False (or
    POWERINFER_NO_REPACK=1) reads the file's layout directly and copies nothing (slower; the same bits
    for the matmuls, the last bits of the sparse FFN's dot products differ), except the column layouts of a
    gate-sparse file's Q4_0 / Q4_K / Q6_K ffn_down (ffn_gate) where the file has no ffn_down_t (ffn_gate_t):
    its sparse step reads nothing else.

    >>> model = Model("models/tiny.gguf")
    >>> model.tokenizer.encode("Hello")
    """

    def __init__(self, path: str | os.PathLike, *, dense: bool = False, repack: bool | None = None,
                 kv_overrides: dict | None = None, use_mmap: bool = True, **rope):
        """kv_overrides: {metadata key: bool, int, float or str} read instead of the file's values (llama.cpp's
        --override-kv). rope: llama.cpp's rope settings, 0 / negative / None for the file's (powerinfer.rope):
        rope_freq_base, rope_freq_scale (1 / the context scaling factor), rope_scaling (none, linear, yarn),
        yarn_orig_ctx, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow. use_mmap=False: the file
        is read into memory instead of mapped (llama.cpp's --no-mmap)."""
        t0 = time.perf_counter()
        if repack is None:
            repack = os.environ.get("POWERINFER_NO_REPACK", "0") in ("", "0")
        self.repack = repack
        self.file: GGUFFile = open_gguf(path, use_mmap=use_mmap)
        self.path = self.file.path
        self.metadata = self.file.metadata
        if kv_overrides:
            self.metadata = {**self.metadata, **check_kv_overrides(kv_overrides)}
        self.hparams = _hparams_from_metadata(self.path, {**self.metadata, "_pwri": self.file.is_sparse})
        self.hparams = rope_settings.apply_overrides(self.hparams, **rope)
        self.sparse = self.file.is_sparse
        threshold = self.metadata.get(SPARSE_THRESHOLD_KEY, 0.0)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ModelLoadError(f"{self.path}: metadata {SPARSE_THRESHOLD_KEY} = {threshold!r} is not a finite number")
        if self.sparse:
            self._check_sparse()
        try:
            self.sparsity_levels = act_sparsity.read_levels(self.path, self.metadata, self.hparams.n_layer)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        # gate-sparse (tools/sparsify.py): a dense file with sparsity levels, or with a transposed down matrix in
        # every layer (files of earlier versions of the tool); the input-sparse gate where the levels have gate input
        # thresholds or every layer has ffn_gate_t. The loader lays the file's own ffn_down (ffn_gate) out by channel
        # where it is Q4_0 / Q4_K / Q6_K, and says so where a layer has neither that nor the transposed copy.
        names, n_layer = self.file.tensors, self.hparams.n_layer
        every = lambda part: all(f"blk.{il}.{part}.weight" in names for il in range(n_layer))  # noqa: E731
        self.gate_sparse = (not self.sparse and self.hparams.ffn_gate != "seq" and
                            (len(self.sparsity_levels.levels) > 0 or every("ffn_down_t")))
        self.gate_input_sparse = self.gate_sparse and (self.sparsity_levels.input_thresholds is not None or
                                                       every("ffn_gate_t"))
        self.attn_input_sparse = self.gate_sparse and self.sparsity_levels.attn_thresholds is not None
        try:
            self.tokenizer = _tokenizer.load(self.metadata)
        except ValueError as e:
            raise ModelLoadError(f"{self.path}: {e}") from None
        self._ptr = self._create_c_model()
        self.load_time_s = time.perf_counter() - t0

    def _check_sparse(self) -> None:
        hp = self.hparams
        if hp.ffn_act != "relu":
            raise ModelLoadError(f"{self.path}: sparse inference needs a ReLU-family FFN, but this {hp.arch} model "
                                 f"uses {hp.ffn_act} (set {ACTIVATION_KEY} = relu only if the model really is ReLU)")
        names = self.file.tensors
        required = {"falcon": ["output_norm.bias"], "opt": ["position_embd.weight", "output_norm.bias"]}
        missing = [n for n in required.get(hp.arch, []) if n not in names]
        if missing:
            raise ModelLoadError(f"{self.path}: {hp.arch} PowerInfer file without {', '.join(missing)}")
        for il in range(hp.n_layer):
            missing = [f"blk.{il}.{n}.weight" for n in ("ffn_down_t", "fc1", "fc2")
                       if f"blk.{il}.{n}.weight" not in names]
            if missing:
                raise ModelLoadError(f"{self.path}: PowerInfer (PWRI) file without {', '.join(missing)}: a sparse "
                                     "model needs a transposed down matrix and a predictor per layer")

    @property
    def sparse_threshold(self) -> float:
        """The file's predictor threshold (powerinfer.sparse_threshold, default 0.0)."""
        return float(self.metadata.get(SPARSE_THRESHOLD_KEY, 0.0))

    def _create_c_model(self):
        hp = self.hparams
        tensors = dict(self.file.tensors)
        # YaRN / a rope attention factor: the core's per-pair frequency divisors and attention scale (powerinfer.rope)
        if hp.arch in FUSED_ARCHS or hp.arch == "nomic-bert":     # nomic-bert: its attn_qkv
            tensors = fused_views(self.path, tensors, hp)
        if hp.arch == "gpt-oss":
            tensors = gptoss_views(tensors, hp)
        if hp.arch in lfm2_arch.ARCHS:
            tensors = lfm2_arch.views(tensors)
        tensors, view_flags = _llama_block_views(self.path, tensors, hp)
        tensors, moe_flags = moe_arch_views(self.path, tensors, hp)
        view_flags = {**view_flags, **moe_flags}
        if _encoder.is_encoder(hp.arch):
            tensors, view_flags = _encoder.encoder_views(self.path, tensors, hp)
        self._view_arrays = [t for t in tensors.values() if isinstance(t, _ArrayTensor)]   # kept with the model
        self._made = []              # arrays the loader makes (deepseek2's split attn_kv_b), kept with the model
        if hp.arch == "deepseek2":
            tensors, self._made = deepseek2_views(self.path, tensors, hp)
        if hp.arch == "gemma4":
            if not hp.n_embd_per_layer and any(n.startswith("per_layer_") for n in tensors):
                raise ModelLoadError(f"{self.path}: per-layer embedding tensors (per_layer_token_embd, ...) without "
                                     f"{hp.arch}.embedding_length_per_layer_input")
        if hp.arch in ("granite", "granitemoe"):      # llama.cpp reads optional biases there; this core does not
            biases = [n for n in tensors if n.startswith("blk.") and n.endswith(".bias")]
            if biases:
                raise ModelLoadError(f"{self.path}: {hp.arch} with bias tensors ({biases[0]}, ...) is not supported")
        # llama.cpp multiplies a product by NAME.scale where a file has one (quantized checkpoints' per-tensor scales);
        # the core applies the experts' down scale and gemma4's router scale only: refuse the others, not ignore them
        read = ("ffn_down_exps.scale",) + (("ffn_gate_inp.scale",) if hp.arch == "gemma4" else ())
        scales = [n for n in tensors if n.endswith(".scale") and not n.endswith(read)]
        if scales:
            raise ModelLoadError(f"{self.path}: per-tensor scales ({scales[0]}, ...) are not supported")
        # YaRN: the core's per-pair frequency divisors (powerinfer.rope), of rope_freqs and of phi3's long factors
        self._rope_freqs = []        # the arrays made here, kept alive with the model
        for name in ("rope_freqs.weight", "rope_freqs_long.weight"):
            file_ff = tensors.get(name)
            if file_ff is None and name != "rope_freqs.weight":
                continue
            if file_ff is not None and file_ff.type != 0:
                raise ModelLoadError(f"{self.path}: {name} of ggml type {file_ff.type} (f32 only)")
            file_factors = None if file_ff is None else np.frombuffer(memoryview(file_ff.data), dtype=np.float32)
            factors = rope_settings.yarn_factors(hp, file_factors)
            if factors is not None and factors is not file_factors:
                self._rope_freqs.append(np.ascontiguousarray(factors, dtype=np.float32))      # [n_rot/2]
                tensors[name] = _ArrayTensor(name, 0, (hp.n_rot // 2,), self._rope_freqs[-1])
        n = len(tensors)
        descs, self._names = tensor_descs(self.path, tensors)   # the names kept alive with the model
        desc = ffi.new("pi_model_desc *")
        p = desc.hparams
        p.arch = _ARCHS[hp.arch]
        p.n_vocab, p.n_ctx_train, p.n_embd, p.n_ff = hp.n_vocab, hp.n_ctx_train, hp.n_embd, hp.n_ff
        p.n_head, p.n_head_kv, p.n_layer, p.n_rot = hp.n_head, hp.n_head_kv, hp.n_layer, hp.n_rot
        p.ffn_act = _ACTS[hp.ffn_act]
        p.ffn_gate = {"par": lib.PI_FFN_PAR, "sym": lib.PI_FFN_SYM, "seq": lib.PI_FFN_SEQ}[hp.ffn_gate]
        p.norm_eps, p.rope_freq_base, p.rope_freq_scale = hp.norm_eps, hp.rope_freq_base, hp.rope_freq_scale
        p.sparse = 1 if self.sparse else 0
        p.gate_sparse = 1 if self.gate_sparse else 0
        p.gate_input_sparse = 1 if self.gate_input_sparse else 0
        p.attn_input_sparse = 1 if self.attn_input_sparse else 0
        p.head_dim, p.rope_mode = hp.head_dim, _ROPE_MODES[hp.rope_mode]
        p.attn_scale, p.embd_scale = hp.attn_scale, hp.embd_scale
        p.rope_mscale = rope_settings.rope_mscale(hp)
        p.n_ctx_orig = hp.yarn_orig_ctx or hp.n_ctx_train
        p.residual_scale, p.logit_scale = hp.residual_scale, hp.logit_scale
        p.n_no_rope_layer_step = hp.n_no_rope_layer_step
        p.attn_softcap, p.final_softcap = hp.attn_softcap, hp.final_softcap
        p.qkv_bias, p.qk_norm, p.post_norms = int(hp.qkv_bias), int(hp.qk_norm), int(hp.post_norms)
        p.post_norms_only = int(hp.post_norms_only)
        p.n_swa, p.swa_pattern = hp.n_swa, hp.swa_pattern
        p.n_expert, p.n_expert_used, p.expert_weights_scale = hp.n_expert, hp.n_expert_used, hp.expert_weights_scale
        p.rope_freq_base_swa, p.rope_freq_scale_swa = hp.rope_freq_base_swa, hp.rope_freq_scale_swa
        p.attn_sinks, p.attn_out_bias, p.expert_bias = int(hp.attn_sinks), int(hp.attn_out_bias), int(hp.expert_bias)
        p.swiglu_alpha, p.swiglu_limit = hp.swiglu_alpha, hp.swiglu_limit
        p.expert_raw_weights, p.n_ff_shexp = int(hp.expert_raw_weights), hp.n_ff_shexp
        p.n_embd_per_layer = hp.n_embd_per_layer
        desc.n_tensors = n
        desc.tensors = descs
        p.v_norm, p.rope_freqs_global = int(hp.v_norm), int(hp.rope_freqs_global)
        p.n_ff_exp, p.moe_router_norm, p.moe_dense_ffn = hp.n_ff_exp, int(hp.moe_router_norm), int(hp.moe_dense_ffn)
        p.attn_temp_scale, p.attn_temp_floor = hp.attn_temp_scale, hp.attn_temp_floor
        p.qk_norm_after_rope, p.ffn_act_square = int(hp.qk_norm_after_rope), int(hp.ffn_act_square)
        p.layer_norm, p.parallel_block = int(hp.layer_norm), int(hp.parallel_block)
        for name, value in view_flags.items():
            setattr(p, name, value)
        p.mla_kv_rank, p.mla_head_k, p.mla_head_v, p.q_lora_rank = (hp.mla_kv_rank, hp.mla_head_k, hp.mla_head_v,
                                                                    hp.q_lora_rank)
        if hp.mla_kv_rank:
            p.attn_scale = rope_settings.mla_attn_scale(hp)
        p.expert_sigmoid, p.n_expert_groups = int(hp.expert_sigmoid), hp.n_expert_groups
        p.n_group_used = hp.n_group_used
        p.ssm_d_conv, p.ssm_d_inner, p.ssm_d_state = hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state
        p.ssm_dt_rank, p.ssm_n_group = hp.ssm_dt_rank, hp.ssm_n_group
        p.ssm_head_interleave, p.attn_output_gate = int(hp.ssm_head_interleave), int(hp.attn_output_gate)
        p.shortconv = int(hp.shortconv)
        if hp.layer_geom:          # kept alive with the model until pi_model_create has copied it
            moe = _moe_layers(self.path, tensors, hp)
            self._geom = ffi.new("pi_layer_geom[]", [(g.head_dim, g.n_head_kv, g.n_rot, g.n_ff, int(g.is_local),
                                                      g.kv_source, int(m), int(g.recurrent))
                                                     for g, m in zip(hp.layer_geom, moe)])
            desc.layers = self._geom
        desc.no_repack = 0 if self.repack else 1
        out = ffi.new("pi_model **")
        try:
            check(lib.pi_model_create(desc, out))
        except PowerInferError as e:
            raise ModelLoadError(f"{self.path}: {e}") from None
        return ffi.gc(out[0], lib.pi_model_free)

    def mlock(self) -> str | None:
        """Keep the weights in RAM (llama.cpp's --mlock): every page mapped now is locked (mlockall(MCL_CURRENT): the
        file's mapping, faulted in, and the repacked copies, with the process's other current pages), so none is
        swapped out or dropped from the page cache. Returns None, or the warning llama.cpp prints where the system
        refuses (RLIMIT_MEMLOCK too low, or not Linux); the model works either way."""
        import ctypes
        import ctypes.util
        import sys
        if not sys.platform.startswith("linux"):
            return "--mlock: locking memory is supported on Linux only here; the weights stay pageable"
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        MCL_CURRENT = 1
        if libc.mlockall(MCL_CURRENT) == 0:
            return None
        err = ctypes.get_errno()
        return (f"--mlock: failed to lock {self.size_bytes / 2**20:.0f} MiB of weights in RAM: {os.strerror(err)}; "
                "try increasing RLIMIT_MEMLOCK ('ulimit -l unlimited' as root, or memlock in "
                "/etc/security/limits.conf); the weights stay pageable")

    def tensor_f32(self, name: str) -> np.ndarray:
        """A tensor of the file dequantized to float32, numpy shape = ne reversed (KeyError where the file has none;
        ModelLoadError for a type this build cannot read)."""
        return dequantized(self.path, self.file.tensors[name])

    @property
    def recurrent(self) -> bool:
        """Whether some layers are recurrent (qwen35 / qwen35moe / qwen3next: gated delta nets)."""
        return any(getattr(g, "recurrent", False) for g in self.hparams.layer_geom)

    @property
    def n_packed_ffn(self) -> int:
        """Layers whose sparse FFN was packed at load time (each neuron's rows together); 0 with
        repack=False, for dense models and for FFN types without a packed layout."""
        return int(lib.pi_model_n_packed_ffn(self._ptr))

    @property
    def n_vocab(self) -> int:
        return self.hparams.n_vocab

    @property
    def size_bytes(self) -> int:
        return sum(t.data.nbytes for t in self.file.tensors.values())

    @property
    def n_params(self) -> int:
        n = 0
        for t in self.file.tensors.values():
            c = 1
            for v in t.ne:
                c *= v
            n += c
        return n

    def describe(self) -> str:
        hp = self.hparams
        kind = "sparse (PowerInfer)" if self.sparse else "gate-sparse" if self.gate_sparse else "dense"
        return (f"{self.path.name}: {kind} arch={hp.arch} n_vocab={hp.n_vocab} n_embd={hp.n_embd} n_layer={hp.n_layer} "
                f"n_head={hp.n_head} n_head_kv={hp.n_head_kv} n_ff={hp.n_ff} act={hp.ffn_act} "
                f"params={self.n_params / 1e6:.2f}M size={self.size_bytes / 2**20:.2f} MiB")
