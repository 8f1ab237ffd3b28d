"""LFM2 (lfm2: Liquid AI's LFM2 / LFM2.5 dense models): attention layers (GQA, per-head q/k RMS norms, NEOX rope) mixed
with short conv layers (in_proj -> b, c, x; y = out_proj (c * causal depthwise conv of b * x)): the core's shortconv.c
over the per-sequence recurrent state's conv part (recurrent.c, no matrix part); a SwiGLU FFN in every layer.

What llama.cpp reads (llama_model_lfm2): shortconv.l_cache (the conv's kernel length), which layers are attention from
attention.head_count_kv (a count per layer, 0 for the conv layers); the output norm is named token_embd_norm in the
files (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2: renamed to output_norm at load). Refused by name: a sliding window
(attention.sliding_window > 0), bidirectional files
(attention.causal false).
lfm2moe: the same layers with experts after the leading dense ones (_moe)."""
from __future__ import annotations

ARCHS = ("lfm2", "lfm2moe")


def hparams(path, arch: str, get, as_int, n_layer: int, head_dim: int, n_rot: int, n_ff: int, error,
            layer_geom) -> dict:
    """The HParams fields of an lfm2 file (error: the loader's exception class, layer_geom: model.LayerGeom);
    n_head_kv: the attention layers' KV heads."""
    kv = get("attention.head_count_kv", required=True)
    kv = [as_int("attention.head_count_kv", v) if v != 0 else 0 for v in kv] if isinstance(kv, list) else \
        [as_int("attention.head_count_kv", kv)] * n_layer
    if len(kv) != n_layer:
        raise error(f"{path}: {arch}.attention.head_count_kv must hold a count for each of {n_layer} layers")
    if all(v == 0 for v in kv):
        raise error(f"{path}: {arch} without an attention layer is not supported")
    l_cache = as_int("shortconv.l_cache", get("shortconv.l_cache", required=True))
    if any(v == 0 for v in kv) and not 2 <= l_cache <= 64:
        raise error(f"{path}: {arch}.shortconv.l_cache {l_cache} must be in 2..64")
    if get("attention.causal", True) is False:
        raise error(f"{path}: {arch}.attention.causal false (LFM2's bidirectional embedding models) is not supported")
    if get("attention.sliding_window", 0):
        raise error(f"{path}: {arch}.attention.sliding_window: LFM2 with a sliding window is not supported")
    n_head_kv = max(kv)
    geom = tuple(layer_geom(head_dim, v or n_head_kv, n_rot, n_ff, False, il, v == 0) for il, v in enumerate(kv))
    out = dict(rope_mode="neox", qk_norm=True, layer_geom=geom, ssm_d_conv=l_cache, shortconv=True,
               n_head_kv=n_head_kv)
    if arch == "lfm2moe":
        out.update(_moe(path, arch, get, as_int, n_ff, error))
    return out


def _moe(path, arch: str, get, as_int, n_ff: int, error) -> dict:
    """lfm2moe (llama_model_lfm2moe): the first leading_dense_block_count layers dense (feed_forward_length), the others
    experts of expert_feed_forward_length (the layers with ffn_gate_inp: model._moe_layers) routed by sigmoids
    (expert_gating_func 2) or a softmax (1), a selection bias blk.N.exp_probs_b.bias, the chosen renormalized (norm_w),
    no weights scale (its loader reads none)."""
    if not get("expert_count", 0):
        raise error(f"{path}: {arch} without {arch}.expert_count")
    gating = get("expert_gating_func", required=True)
    if gating not in (1, 2):
        raise error(f"{path}: {arch}.expert_gating_func {gating} (1: softmax, 2: sigmoid) is not supported")
    ff_exp = get("expert_feed_forward_length", required=True)
    if isinstance(ff_exp, list):
        if len(set(ff_exp)) != 1:
            raise error(f"{path}: {arch}.expert_feed_forward_length per layer ({ff_exp}) is not supported")
        ff_exp = ff_exp[0]
    return dict(n_ff=n_ff, n_ff_exp=as_int("expert_feed_forward_length", ff_exp), expert_sigmoid=gating == 2,
                n_layer_dense_lead=as_int("leading_dense_block_count", get("leading_dense_block_count", 0))
                if get("leading_dense_block_count", 0) else 0)


def views(tensors: dict) -> dict:
    """The file's output norm (token_embd_norm.weight) under the core's name, output_norm.weight."""
    if "token_embd_norm.weight" in tensors and "output_norm.weight" not in tensors:
        tensors = dict(tensors)
        tensors["output_norm.weight"] = tensors.pop("token_embd_norm.weight")
    return tensors
