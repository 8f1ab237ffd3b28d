"""Mixture-of-experts architectures on llama's blocks whose routing moe.c computes already (llama.cpp's
src/models/<arch>.cpp and each arch's load_arch_hparams / load_arch_tensors):

- glm4moe (GLM-4.5 / 4.5-Air / 4.6 / 4.7): NEOX rope over rope.dimension_count (half a head), q/k/v biases, per-head
  q/k RMSNorm where the file has attn_q_norm (the 355B), post_attention_norm as the FFN's pre-norm, the first
  leading_dense_block_count layers dense (feed_forward_length), then expert_count experts of
  expert_feed_forward_length with DeepSeek-V3's routing (sigmoid by default: expert_gating_func, exp_probs_b's
  selection bias, groups where the file has them, expert_weights_norm, expert_weights_scale) and expert_shared_count
  shared experts without a gate; the nextn_predict_layers MTP layers at the end of block_count are left out (llama.cpp
  runs them only to draft tokens).
- ernie4_5-moe (ERNIE-4.5-21B-A3B, 300B-A47B): NORMAL rope over the whole head, q/k/v biases where the file has them
  (attn_output.bias is not read: llama.cpp's graph leaves it out), the layers il >= leading_dense_block_count with
  (il + 1) % interleave_moe_layer_step == 0 with experts (the others dense), a softmax router renormalized over the
  chosen, exp_probs_b's selection bias where a layer has it, a shared expert of expert_shared_feed_forward_length.
- olmoe (OLMoE-1B-7B): NEOX rope, RMSNorm of the whole q and k (olmo2's), every layer with experts, the softmax
  router's probabilities of the chosen experts as they are (norm_w false), no shared expert.
"""
from __future__ import annotations

from ._ffi import lib
from .gguf_file import ModelLoadError

MOE_ARCHS = {"glm4moe": lib.PI_ARCH_LLAMA, "ernie4_5-moe": lib.PI_ARCH_LLAMA, "olmoe": lib.PI_ARCH_LLAMA}
# the archs whose dense layers and experts have widths of their own (n_ff, n_ff_exp) and whose layers with experts
# follow a rule (moe_layers)
_MIXED = ("glm4moe", "ernie4_5-moe")


def moe_arch_hparams(path, arch: str, get, as_int, as_float, head_dim: int, n_rot: int, n_head_kv: int) -> dict:
    """HParams fields of a MOE_ARCHS file ({} for other archs); get / as_int / as_float: _hparams_from_metadata's key
    readers. Includes n_ff (the dense layers' width; olmoe: the experts') and n_layer (block_count less glm4moe's MTP
    layers)."""
    from .model import LayerGeom
    if arch not in MOE_ARCHS:
        return {}
    if not get("expert_count", 0):
        raise ModelLoadError(f"{path}: {arch} without {arch}.expert_count")
    block_count = as_int("block_count", get("block_count", required=True))
    if any(get("rope.dimension_sections", [])):
        raise ModelLoadError(f"{path}: {arch} with rope.dimension_sections (multi-section rope, the vision models') "
                             "is not supported")

    def count(key):
        v = get(key, 0)
        return 0 if v == 0 else as_int(key, v)

    if arch == "olmoe":
        if n_rot != head_dim:
            raise ModelLoadError(f"{path}: olmoe with rope.dimension_count {n_rot} != the head size {head_dim}")
        key = "expert_feed_forward_length" if get("expert_feed_forward_length") is not None else "feed_forward_length"
        return dict(rope_mode="neox", qk_norm=2, expert_raw_weights=True, n_ff=as_int(key, get(key, required=True)),
                    n_layer=block_count)
    n_ff_exp = as_int("expert_feed_forward_length", get("expert_feed_forward_length", required=True))
    n_ff = as_int("feed_forward_length", get("feed_forward_length", required=True))
    lead, step = count("leading_dense_block_count"), 1
    out = dict(n_ff=n_ff, n_ff_exp=n_ff_exp, n_layer_dense_lead=lead)
    if arch == "glm4moe":
        nextn = count("nextn_predict_layers")
        n_layer = block_count - nextn
        if n_layer < 1:
            raise ModelLoadError(f"{path}: glm4moe.nextn_predict_layers {nextn} leaves no layers of {block_count}")
        gating = get("expert_gating_func", 0)    # 0 (unset): sigmoid, as llama.cpp reads GLM-4.5's files
        if gating not in (0, 1, 2):
            raise ModelLoadError(f"{path}: glm4moe.expert_gating_func {gating!r} is not supported (1 softmax, 2 "
                                 "sigmoid)")
        groups = count("expert_group_count")
        shared = get("expert_shared_count", required=True)
        shared = 0 if shared == 0 else as_int("expert_shared_count", shared)
        out.update(rope_mode="neox", n_layer=n_layer, n_ff_shexp=n_ff_exp * shared,
                   expert_raw_weights=not get("expert_weights_norm", False), expert_sigmoid=gating != 1,
                   n_expert_groups=groups if groups > 1 else 0,
                   n_group_used=as_int("expert_group_used_count", get("expert_group_used_count", required=True))
                   if groups > 1 else 0)
    else:   # ernie4_5-moe
        if n_rot != head_dim:
            raise ModelLoadError(f"{path}: ernie4_5-moe with rope.dimension_count {n_rot} != the head size {head_dim}")
        step = as_int("interleave_moe_layer_step", get("interleave_moe_layer_step", required=True))
        n_layer = block_count
        out.update(n_layer=n_layer, n_moe_layer_step=step, n_ff_shexp=count("expert_shared_feed_forward_length"))
    out["layer_geom"] = tuple(LayerGeom(head_dim, n_head_kv, n_rot, n_ff, False, il) for il in range(n_layer))
    return out


def moe_layers(hp) -> list:
    """Which layers of a MOE_ARCHS model have experts: every one (olmoe), or those il >= n_layer_dense_lead with
    (il + 1) % n_moe_layer_step == 0 (llama.cpp's graphs; glm4moe's step is 1)."""
    step = max(hp.n_moe_layer_step, 1)
    if hp.arch not in _MIXED:
        return [True] * hp.n_layer
    return [il >= hp.n_layer_dense_lead and (il + 1) % step == 0 for il in range(hp.n_layer)]


def moe_arch_views(path, tensors: dict, hp) -> tuple[dict, dict]:
    """A MOE_ARCHS file's tensors under the names the core reads and the flags their presence sets (tensors and {} for
    other archs): q/k/v biases where blk.0 has them (llama.cpp's create_tensor_qkv), glm4moe's per-head q/k norms
    where blk.0 has attn_q_norm and its post_attention_norm as ffn_norm; glm4moe's MTP layers (blk.N, N >= n_layer)
    left out, its experts' exp_probs_b.bias required; a fused attn_qkv is refused by name."""
    if hp.arch not in MOE_ARCHS:
        return tensors, {}
    from .gguf_file import TensorInfo
    out = dict(tensors)
    if "blk.0.attn_qkv.weight" in out:
        raise ModelLoadError(f"{path}: {hp.arch} with a fused blk.N.attn_qkv is not supported")
    for name in [n for n in out if n.startswith("blk.")]:
        if int(name.split(".")[1]) >= hp.n_layer:     # glm4moe's MTP layers
            del out[name]
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
