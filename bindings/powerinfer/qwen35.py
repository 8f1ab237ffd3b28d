"""Qwen3.5 (qwen35, qwen35moe) and Qwen3-Next (qwen3next): hybrid models of gated delta net layers (a short causal
conv and the gated delta rule over a per-sequence recurrent state: the core's gdn.c / recurrent.c) and full-attention
layers whose query carries a sigmoid output gate, the FFN dense (qwen35) or experts with a gated shared expert.

What llama.cpp reads (its llama_model_qwen35 / qwen35moe / qwen3next loaders): ssm.conv_kernel, ssm.inner_size,
ssm.state_size, ssm.time_step_rank (value heads), ssm.group_count (key heads); which layers are recurrent from
attention.recurrent_layers (a bool per layer) or else full_attention_interval (default 4: layer il is recurrent unless
(il + 1) % interval == 0). Qwen3.5's interleaved M-RoPE (rope.dimension_sections) of text tokens is NEOX rope over the
first rope.dimension_count dims (every section reads the same position). Refused by name: nextn_predict_layers (MTP
layers) and vision towers (mmproj files are separate and never loaded here)."""
from __future__ import annotations

ARCHS = ("qwen35", "qwen35moe", "qwen3next")


def hparams(path, arch: str, get, as_int, n_layer: int, head_dim: int, n_rot: int, n_ff: int, n_head_kv: int,
            error, layer_geom) -> dict:
    """The HParams fields of a qwen35 / qwen35moe / qwen3next file (error: the loader's exception class, layer_geom:
    model.LayerGeom)."""
    if get("nextn_predict_layers", 0):
        raise error(f"{path}: {arch}.nextn_predict_layers: MTP (multi-token prediction) layers are not supported")
    ssm = {k: as_int(f"ssm.{k}", get(f"ssm.{k}", required=True))
           for k in ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")}
    flags = get("attention.recurrent_layers")
    if flags is not None:
        if not isinstance(flags, list) or len(flags) < n_layer:
            raise error(f"{path}: {arch}.attention.recurrent_layers must hold a flag for each of {n_layer} layers")
        recurrent = tuple(bool(f) for f in flags[:n_layer])
    else:
        interval = as_int("full_attention_interval", get("full_attention_interval", 4))
        if interval < 1:
            raise error(f"{path}: {arch}.full_attention_interval {interval} must be >= 1")
        recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    if all(recurrent):
        raise error(f"{path}: {arch} without a full-attention layer is not supported")
    sections = get("rope.dimension_sections")
    if sections is not None and arch != "qwen3next":
        _check_text_mrope(path, arch, [int(s) for s in sections], head_dim, n_rot, error)
    geom = tuple(layer_geom(head_dim, n_head_kv, n_rot, n_ff, False, il, recurrent[il]) for il in range(n_layer))
    return dict(rope_mode="neox", qk_norm=True, attn_output_gate=True, layer_geom=geom,
                ssm_d_conv=ssm["conv_kernel"], ssm_d_inner=ssm["inner_size"], ssm_d_state=ssm["state_size"],
                ssm_dt_rank=ssm["time_step_rank"], ssm_n_group=ssm["group_count"],
                ssm_head_interleave=arch == "qwen3next")


def moe(path, arch: str, get, as_int, n_ff: int) -> dict:
    """qwen35moe / qwen3next experts: the router's softmax renormalized over the chosen (llama.cpp's norm_w), a shared
    expert (expert_shared_feed_forward_length, else feed_forward_length) gated by sigmoid(ffn_gate_inp_shexp . x)."""
    return dict(n_ff_shexp=as_int("expert_shared_feed_forward_length",
                                  get("expert_shared_feed_forward_length", n_ff)))


def _check_text_mrope(path, arch: str, sections: list, head_dim: int, n_rot: int, error) -> None:
    """Qwen3.5's interleaved M-RoPE (ggml's IMROPE) on text: pair i reads the time, height or width position (each the
    token's position for text) by (i mod the sections' sum) mod 3, or the fourth (0 for text: no rotation) where that
    section has run out. Text runs as NEOX rope where no pair reads the fourth; files where one would are refused."""
    if len(sections) < 3 or sum(sections[:4]) * 2 > head_dim or sum(sections[:4]) <= 0:
        raise error(f"{path}: {arch}.rope.dimension_sections {sections} do not fit the head size {head_dim}")
    total = sum(sections[:4])
    for i in range(n_rot // 2):
        sector = i % total
        if not ((sector % 3 == 0 and sector < 3 * sections[0]) or (sector % 3 == 1 and sector < 3 * sections[1]) or
                (sector % 3 == 2 and sector < 3 * sections[2])):
            raise error(f"{path}: {arch}.rope.dimension_sections {sections}: rope pair {i} reads the fourth section "
                        "(not supported)")
