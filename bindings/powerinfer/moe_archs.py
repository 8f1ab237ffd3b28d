"""Mixture-of-experts architectures on llama's blocks whose routing moe.c computes already (llama.cpp's
src/models/<arch>.cpp and each arch's load_arch_hparams / load_arch_tensors):

- glm4moe (GLM-4.5 / 4.5-Air / 4.6 / 4.7): NEOX rope over rope.dimension_count (half a head), q/k/v biases, per-head
  q/k RMSNorm where the file has attn_q_norm (the 355B), post_attention_norm as the FFN's pre-norm, the first
  leading_dense_block_count layers dense (feed_forward_length), then expert_count experts of
  expert_feed_forward_length with DeepSeek-V3's routing (sigmoid by default: expert_gating_func, exp_probs_b's
  selection bias, groups where the file has them, expert_weights_norm, expert_weights_scale) and expert_shared_count
  shared experts without a gate; the nextn_predict_layers MTP layers at the end of block_count are left out (llama.cpp
  runs them only to draft tokens).
- dots1 (dots.llm1): glm4moe's layers with per-head q/k norms always, rope over the whole head, the FFN's pre-norm
  ffn_norm, no biases; expert_gating_func required (llama.cpp has no default), exp_probs_b where a layer has it.
- bailingmoe2 (Ling / Ring 2.0): dots1's with a fused attn_qkv (split into views), partial NEOX rope, shared experts of
  expert_shared_feed_forward_length (else the experts' width) times expert_shared_count, MTP layers left out.
- ernie4_5-moe (ERNIE-4.5-21B-A3B, 300B-A47B): NORMAL rope over the whole head, q/k/v biases where the file has them
  (attn_output.bias is not read: llama.cpp's graph leaves it out), the layers il >= leading_dense_block_count with
  (il + 1) % interleave_moe_layer_step == 0 with experts (the others dense), a softmax router renormalized over the
  chosen, exp_probs_b's selection bias where a layer has it, a shared expert of expert_shared_feed_forward_length.
- hunyuan-moe (Hunyuan-A13B): NEOX rope, per-head q/k norms after the rope, every layer with experts of
  feed_forward_length (llama.cpp reads expert_feed_forward_length but sizes the experts by n_ff) and a shared expert
  of expert_shared_feed_forward_length (else n_ff), a softmax router renormalized.
- olmoe (OLMoE-1B-7B): NEOX rope, RMSNorm of the whole q and k (olmo2's), every layer with experts, the softmax
  router's probabilities of the chosen experts as they are (norm_w false), no shared expert.
"""
from __future__ import annotations

from ._ffi import lib
from .gguf_file import ModelLoadError

MOE_ARCHS = {a: lib.PI_ARCH_LLAMA for a in ("glm4moe", "dots1", "bailingmoe2", "ernie4_5-moe", "hunyuan-moe",
                                             "olmoe")}
# archs whose dense layers and experts have widths of their own (n_ff, n_ff_exp) and whose layers with experts follow
# a rule (moe_layers); the others have experts in every layer
_MIXED = ("glm4moe", "dots1", "bailingmoe2", "ernie4_5-moe")
# DeepSeek-V3's routing read from the file (expert_gating_func, expert_weights_norm, the scale, groups)
_V3_ROUTED = ("glm4moe", "dots1", "bailingmoe2")
# archs with MTP layers after the trunk (nextn_predict_layers), left out
_NEXTN = ("glm4moe", "bailingmoe2")
# archs whose per-head q/k norms are required (glm4moe's: where blk.0 has them)
_QK_NORM = ("dots1", "bailingmoe2", "hunyuan-moe")
# the archs (of all ours) whose llama.cpp loader reads expert_weights_scale: a file's key is applied there only
WEIGHTS_SCALE_ARCHS = ("deepseek2", "glm4moe", "dots1", "bailingmoe2")


def moe_arch_hparams(path, arch: str, get, as_int, as_float, head_dim: int, n_rot: int, n_head_kv: int) -> dict:
    """HParams fields of a MOE_ARCHS file ({} for other archs); get / as_int / as_float: _hparams_from_metadata's key
    readers. Includes n_ff (the dense layers' width; olmoe, hunyuan-moe: the experts') and n_layer (block_count less
    the MTP layers)."""
    from .model import LayerGeom
    if arch not in MOE_ARCHS:
        return {}
    if not get("expert_count", 0):
        raise ModelLoadError(f"{path}: {arch} without {arch}.expert_count")
    if any(get("rope.dimension_sections", [])):
        raise ModelLoadError(f"{path}: {arch} with rope.dimension_sections (multi-section rope, the vision models') "
                             "is not supported")
    if arch not in ("glm4moe", "bailingmoe2") and n_rot != head_dim:   # llama.cpp's graphs assert it
        raise ModelLoadError(f"{path}: {arch} with rope.dimension_count {n_rot} != the head size {head_dim}")

    def count(key):
        v = get(key, 0)
        return 0 if v == 0 else as_int(key, v)

    block_count = as_int("block_count", get("block_count", required=True))
    nextn = count("nextn_predict_layers") if arch in _NEXTN else 0
    n_layer = block_count - nextn
    if n_layer < 1:
        raise ModelLoadError(f"{path}: {arch}.nextn_predict_layers {nextn} leaves no layers of {block_count}")
    out = dict(n_layer=n_layer, rope_mode="normal" if arch == "ernie4_5-moe" else "neox",
               qk_norm=1 if arch in _QK_NORM else 0, qk_norm_after_rope=arch == "hunyuan-moe")
    if arch == "olmoe":
        key = "expert_feed_forward_length" if get("expert_feed_forward_length") is not None else "feed_forward_length"
        return dict(out, qk_norm=2, expert_raw_weights=True, n_ff=as_int(key, get(key, required=True)))
    n_ff = as_int("feed_forward_length", get("feed_forward_length", required=True))
    if arch == "hunyuan-moe":
        as_int("expert_feed_forward_length", get("expert_feed_forward_length", required=True))   # read, not used
        return dict(out, n_ff=n_ff, n_ff_shexp=count("expert_shared_feed_forward_length") or n_ff)
    n_ff_exp = as_int("expert_feed_forward_length", get("expert_feed_forward_length", required=True))
    out.update(n_ff=n_ff, n_ff_exp=n_ff_exp, n_layer_dense_lead=count("leading_dense_block_count"),
               layer_geom=tuple(LayerGeom(head_dim, n_head_kv, n_rot, n_ff, False, il) for il in range(n_layer)))
    if arch == "ernie4_5-moe":
        return dict(out, n_moe_layer_step=as_int("interleave_moe_layer_step",
                                                 get("interleave_moe_layer_step", required=True)),
                    n_ff_shexp=count("expert_shared_feed_forward_length"))
    # glm4moe, dots1, bailingmoe2: V3's routing and shared experts without a gate
    gating = get("expert_gating_func", 0 if arch == "glm4moe" else None, required=arch != "glm4moe")
    if gating not in ((0, 1, 2) if arch == "glm4moe" else (1, 2)):   # glm4moe: 0 (unset) is sigmoid
        raise ModelLoadError(f"{path}: {arch}.expert_gating_func {gating!r} is not supported (1 softmax, 2 sigmoid)")
    groups = count("expert_group_count")
    shared = get("expert_shared_count", required=True)
    shared = 0 if shared == 0 else as_int("expert_shared_count", shared)
    width = count("expert_shared_feed_forward_length") or n_ff_exp if arch == "bailingmoe2" else n_ff_exp
    return dict(out, n_ff_shexp=width * shared, expert_raw_weights=not get("expert_weights_norm", False),
                expert_sigmoid=gating != 1, n_expert_groups=groups if groups > 1 else 0,
                n_group_used=as_int("expert_group_used_count", get("expert_group_used_count", required=True))
                if groups > 1 else 0)


def moe_layers(hp) -> list:
    """Which layers of a MOE_ARCHS model have experts: every one (olmoe, hunyuan-moe), or those il >=
    n_layer_dense_lead with (il + 1) % n_moe_layer_step == 0 (llama.cpp's graphs; the step is ernie4_5-moe's, 1 for
    the others)."""
    step = max(hp.n_moe_layer_step, 1)
    if hp.arch not in _MIXED:
        return [True] * hp.n_layer
    return [il >= hp.n_layer_dense_lead and (il + 1) % step == 0 for il in range(hp.n_layer)]


def moe_arch_views(path, tensors: dict, hp) -> tuple[dict, dict]:
    """A MOE_ARCHS file's tensors under the names the core reads and the flags their presence sets (tensors and {} for
    other archs): q/k/v biases where blk.0 has them (llama.cpp's create_tensor_qkv), glm4moe's per-head q/k norms
    where blk.0 has attn_q_norm and its post_attention_norm as ffn_norm, bailingmoe2's fused attn_qkv as attn_q / k / v
    views (required there, refused elsewhere); MTP layers (blk.N, N >= n_layer) left out; glm4moe's experts'
    exp_probs_b.bias required."""
    if hp.arch not in MOE_ARCHS:
        return tensors, {}
    from .gguf_file import TensorInfo
    from .model import _split_rows
    out = dict(tensors)
    for name in [n for n in out if n.startswith("blk.")]:
        if int(name.split(".")[1]) >= hp.n_layer:     # MTP layers
            del out[name]
    hd = hp.head_dim or hp.n_embd // hp.n_head
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        t = out.pop(p + "attn_qkv.weight", None)
        if (t is None) != (hp.arch != "bailingmoe2"):
            raise ModelLoadError(f"{path}: {hp.arch} " + (f"without tensor '{p}attn_qkv.weight'" if t is None else
                                                         "with a fused blk.N.attn_qkv is not supported"))
        if t is not None:
            out.update(_split_rows(path, t, [(p + "attn_q.weight", hd * hp.n_head),
                                             (p + "attn_k.weight", hd * hp.n_head_kv),
                                             (p + "attn_v.weight", hd * hp.n_head_kv)]))
    flags = {"qkv_bias": int("blk.0.attn_q.bias" in out)}
    if hp.arch == "glm4moe":
        flags["qk_norm"] = int("blk.0.attn_q_norm.weight" in out)
        for il, moe in enumerate(moe_layers(hp)):     # the selection bias: required, as llama.cpp's loader has it
            if moe and f"blk.{il}.exp_probs_b.bias" not in out:
                raise ModelLoadError(f"{path}: missing tensor 'blk.{il}.exp_probs_b.bias'")
        for il in range(hp.n_layer):
            old, new = f"blk.{il}.post_attention_norm.weight", f"blk.{il}.ffn_norm.weight"
            if old in out and new not in out:
                t = out.pop(old)
                out[new] = TensorInfo(new, t.type, t.ne, t.data, t.offset)
    return out, flags
