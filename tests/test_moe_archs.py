"""glm4moe (GLM-4.5 / 4.5-Air / 4.6 / 4.7), dots1, bailingmoe2 (Ling / Ring 2.0), ernie4_5-moe (ERNIE-4.5-21B-A3B),
hunyuan-moe (Hunyuan-A13B) and olmoe (OLMoE) on the tiny random files of model_files.MOE_ARCH_SHAPES against the float64
reference (tests/reference_model.py, _moe_arch_setup).

glm4moe: heads of 32 (n_head * head_dim 128 != n_embd 64) with NEOX rope over 16 dims, q/k/v biases, optional per-head
q/k norms, post_attention_norm as the FFN's pre-norm, the first layer dense, then 8 experts (2 per token) chosen by
sigmoid + exp_probs_b, renormalized, scaled, a shared expert; one MTP layer after the 3 (left out). dots1: the same
routing with per-head q/k norms and full rope. bailingmoe2: a fused attn_qkv, rope over half the head, groups, an MTP
layer. ernie4_5-moe: a softmax router with a selection bias, renormalized, a shared expert of 64, the first layer dense
(interleave step 2: every other layer after it). hunyuan-moe: q/k norms after the rope, a softmax router, a shared
expert in every layer. olmoe: every layer's experts weighted by their softmax probabilities as they are, the whole q
and k normed.

Measured (seed 0): 2.1e-7 .. 3.2e-7 from the reference at every ISA level; what each piece moves the reference (printed
by test_each_piece_matters): glm4moe's sigmoid (softmax instead) 0.66, selection bias 0.63, renormalization 0.47, scale
0.48, groups 0.54, shared expert 0.57, q/k norms 0.18; dots1's q/k norms 0.18, selection bias 0.44; bailingmoe2's
groups 0.63, shared expert 0.62; ernie's selection bias 0.34, renormalization 0.24; hunyuan-moe's norms after the rope
(before instead) 2.6e-2, shared expert 0.62; olmoe's raw weights (renormalized instead) 0.14.

Quantized files (Q8_0 / Q4_0) are checked against llama.cpp (tests/compat/test_moe_archs_vs_llama_cpp.py), not against
the reference: with 8-bit activations a token's router scores move by ~1e-2 and the tiny random routers then choose
other experts for some tokens (1.5e-2 .. 0.25 from the reference, where llama.cpp's logits are ours within 7e-8)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from helpers import FLOAT_REL_RMS, check_level, emulated_offload, logits_all, rel_rms
from model_files import MOE_ARCH_SHAPES, rewrite, write_moe_arch_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer.gguf_file import ModelLoadError

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]
GLM_SCALED = {"expert_weights_scale": 2.5, "expert_group_count": 4, "expert_group_used_count": 2}
VARIANTS = {"glm4moe": ("glm4moe", dict(meta=GLM_SCALED)),
            "glm4moe_qk_norm": ("glm4moe", dict(qk_norm=True, qkv_bias=False)),
            "glm4moe_softmax": ("glm4moe", dict(meta={"expert_gating_func": 1, "expert_weights_norm": False})),
            "ernie4_5-moe": ("ernie4_5-moe", {}),
            "ernie4_5-moe_step2": ("ernie4_5-moe", dict(step=2, probs_b=False)),
            "olmoe": ("olmoe", dict(qkv_bias=False)),
            "dots1": ("dots1", dict(qkv_bias=False)),
            "bailingmoe2": ("bailingmoe2", dict(qkv_bias=False, meta=GLM_SCALED)),
            "hunyuan-moe": ("hunyuan-moe", dict(qkv_bias=False))}


def write(path, variant, **kw):
    arch, opts = VARIANTS[variant]
    write_moe_arch_model(path, arch, **{**opts, **kw})
    return path


@pytest.fixture(scope="module", params=list(VARIANTS))
def moe_arch_file(request, tmp_path_factory):
    return write(tmp_path_factory.mktemp("moe_archs") / f"{request.param}.gguf", request.param)


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512", "amx"])
def test_matches_the_reference_at_every_level(moe_arch_file, level):
    """The prompt in one call and token by token within FLOAT_REL_RMS of the reference at every ISA level, with the
    scalar level's bits."""
    check_level(moe_arch_file, level, ReferenceModel(moe_arch_file).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_hparams(tmp_path):
    """What the loader reads: glm4moe's MTP layer left out of n_layer, the dense and expert widths, the routing flags;
    ernie's interleaving; olmoe's whole-projection q/k norms and raw weights."""
    from powerinfer.model import _moe_layers
    glm = pi.Model(write(tmp_path / "glm.gguf", "glm4moe"))
    hp = glm.hparams
    c = MOE_ARCH_SHAPES["glm4moe"]
    assert hp.n_layer == c["n_layer"] and hp.rope_mode == "neox" and hp.n_rot == 16 and hp.head_dim == 32
    assert (hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp) == (96, 32, 32)
    assert hp.expert_sigmoid and not hp.expert_raw_weights and hp.expert_weights_scale == 2.5
    assert (hp.n_expert_groups, hp.n_group_used) == (4, 2)
    assert _moe_layers(None, {}, hp) == [False, True, True]
    ernie = pi.Model(write(tmp_path / "ernie.gguf", "ernie4_5-moe_step2")).hparams
    assert ernie.rope_mode == "normal" and not ernie.expert_sigmoid and not ernie.expert_raw_weights
    assert _moe_layers(None, {}, ernie) == [False, True, False, True]
    olmoe = pi.Model(write(tmp_path / "olmoe.gguf", "olmoe", meta={"expert_weights_scale": 2.0})).hparams
    assert olmoe.expert_weights_scale == 0.0      # llama.cpp's olmoe loader does not read the key
    assert olmoe.qk_norm == 2 and olmoe.expert_raw_weights and olmoe.n_ff_shexp == 0 and olmoe.n_ff == 32
    ling = pi.Model(write(tmp_path / "ling.gguf", "bailingmoe2")).hparams
    assert (ling.n_layer, ling.n_rot, ling.qk_norm, ling.n_ff_shexp, ling.n_expert_groups) == (3, 8, 1, 64, 4)
    assert _moe_layers(None, {}, ling) == [False, True, True] and ling.expert_sigmoid
    hy = pi.Model(write(tmp_path / "hy.gguf", "hunyuan-moe")).hparams
    assert hy.qk_norm == 1 and hy.qk_norm_after_rope and (hy.n_ff, hy.n_ff_exp, hy.n_ff_shexp) == (32, 0, 64)
    assert not hy.expert_raw_weights and not hy.expert_sigmoid and _moe_layers(None, {}, hy) == [True, True]


def test_mtp_layer_is_left_out(tmp_path):
    """A glm4moe file without its MTP layer (and without nextn_predict_layers, as the converter's --no-mtp writes it)
    gives the same bits."""
    a, b = tmp_path / "mtp.gguf", tmp_path / "trunk.gguf"
    write(a, "glm4moe")
    c = dict(MOE_ARCH_SHAPES["glm4moe"], nextn=0)
    write_moe_arch_model(b, "glm4moe", c=c, meta=GLM_SCALED)
    run = lambda f: logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)  # noqa: E731
    assert np.array_equal(run(a), run(b))


def test_each_piece_matters(tmp_path):
    """The reference without each piece is far from ours (and ours within FLOAT_REL_RMS of the full reference)."""
    cases = {"glm4moe": dict(sigmoid=dict(ds_gating="softmax"), bias=dict(ds_bias=False), norm=dict(ds_norm=False),
                             scale=dict(expert_weights_scale=1.0), groups=dict(ds_groups=(0, 0)), shared="shexp"),
             "glm4moe_qk_norm": dict(qk_norm="qk_norm"),
             "ernie4_5-moe": dict(bias=dict(ds_bias=False), norm=dict(ds_norm=False)),
             "olmoe": dict(raw_weights=dict(expert_gating="softmax_norm")),
             "dots1": dict(qk_norm="qk_norm", bias=dict(ds_bias=False)),
             "bailingmoe2": dict(groups=dict(ds_groups=(0, 0)), shared="shexp"),
             "hunyuan-moe": dict(norm_after_rope=dict(qk_norm_after_rope=False), shared="shexp")}
    for variant, pieces in cases.items():
        f = write(tmp_path / f"{variant}.gguf", variant)
        ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
        assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < FLOAT_REL_RMS
        for piece, change in pieces.items():
            ref = ReferenceModel(f, **(change if isinstance(change, dict) else {}))
            drop = {"shexp": ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"),
                    "qk_norm": ("attn_q_norm", "attn_k_norm")}.get(change, ()) if isinstance(change, str) else ()
            for L in ref.layers:
                for k in drop:
                    L.pop(k, None)
            err = rel_rms(ours, ref.forward(PROMPT))
            print(f"{variant} without {piece}: {err:.2e}")
            assert err > 1e-2, (variant, piece, err)


def test_two_sequences_in_one_batch(tmp_path):
    """Two prompts decoded together: each sequence's logits are the reference's of its prompt alone."""
    f = write(tmp_path / "glm.gguf", "glm4moe", seed=2)
    a, b = PROMPT[:7], PROMPT[5:]
    ctx = pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_seq_max=2)
    ctx.decode([t for pair in zip(a, b) for t in pair], pos=[p for i in range(7) for p in (i, i)], seq_id=[0, 1] * 7,
               logits="all")
    got_a, got_b = (np.stack([ctx.logits(2 * i + s) for i in range(7)]) for s in (0, 1))
    ref = ReferenceModel(f)
    assert rel_rms(got_a, ref.forward(a)) < FLOAT_REL_RMS
    assert rel_rms(got_b, ref.forward(b)) < FLOAT_REL_RMS


def test_api_greedy_tokens(tmp_path):
    """The llama-cpp-python API (generate over token ids, temperature 0): the reference's greedy tokens."""
    from itertools import islice
    f = write(tmp_path / "glm.gguf", "glm4moe")
    llm = pi.PowerInfer(str(f), n_ctx=64, n_threads=1, verbose=False)
    assert list(islice(llm.generate(PROMPT, temp=0.0), 6)) == ReferenceModel(f).greedy(PROMPT, 6)


@pytest.mark.parametrize("variant", ["glm4moe", "ernie4_5-moe", "olmoe", "bailingmoe2", "hunyuan-moe"])
def test_offload_keeps_the_experts_on_the_cpu(tmp_path, variant):
    """-ngl on the emulated device: the attention offloaded, the experts (and the dense layers' FFNs) on the CPU, the
    CPU's bits."""
    f = write(tmp_path / f"{variant}.gguf", variant)
    offloaded, same_bits, _ = emulated_offload(f, PROMPT)
    assert offloaded and same_bits


def _meta(arch, **kv):
    return {f"{arch}.{k}": v for k, v in kv.items()}


def test_bad_files(tmp_path):
    """Broken or unsupported files give a ModelLoadError naming what is wrong."""
    glm, ernie, olmoe, dots1, ling, hy = (write(tmp_path / f"{v}.gguf", v) for v in (
        "glm4moe", "ernie4_5-moe", "olmoe", "dots1", "bailingmoe2", "hunyuan-moe"))
    u32 = lambda v: (v, VT.UINT32)  # noqa: E731
    cases = [
        (glm, dict(meta=_meta("glm4moe", expert_count=None)), "without glm4moe.expert_count"),
        (glm, dict(meta=_meta("glm4moe", nextn_predict_layers=u32(4))), "leaves no layers"),
        (glm, dict(meta=_meta("glm4moe", expert_gating_func=u32(3))), "expert_gating_func"),
        (glm, dict(meta=_meta("glm4moe", expert_shared_count=None)), "expert_shared_count"),
        (glm, dict(meta=_meta("glm4moe", expert_feed_forward_length=None)), "expert_feed_forward_length"),
        (glm, dict(meta=_meta("glm4moe", expert_group_used_count=None)), "expert_group_used_count"),
        (glm, dict(meta=_meta("glm4moe", **{"rope.dimension_sections": ([8, 8, 0, 0], VT.ARRAY, VT.INT32)})),
         "dimension_sections"),
        (glm, dict(drop=("blk.1.exp_probs_b.bias",)), "blk.1.exp_probs_b.bias"),
        (glm, dict(drop=("blk.2.ffn_up_shexp.weight",)), "blk.2.ffn_up_shexp"),
        (glm, dict(drop=("blk.1.post_attention_norm.weight",)), "blk.1.ffn_norm"),
        (glm, dict(drop=("blk.0.ffn_gate.weight",)), "blk.0.ffn_gate"),
        (ernie, dict(meta=_meta("ernie4_5-moe", interleave_moe_layer_step=None)), "interleave_moe_layer_step"),
        (ernie, dict(meta=_meta("ernie4_5-moe", **{"rope.dimension_count": u32(8)})), "rope.dimension_count"),
        (ernie, dict(drop=("blk.3.ffn_gate_exps.weight",)), "blk.3.ffn_gate_exps"),
        (olmoe, dict(meta=_meta("olmoe", **{"rope.dimension_count": u32(8)})), "rope.dimension_count"),
        (olmoe, dict(replace={"blk.0.attn_q_norm.weight": (np.ones(16, np.float32), 0)}), "attn_q_norm"),
        (dots1, dict(meta=_meta("dots1", expert_gating_func=None)), "dots1.expert_gating_func"),
        (dots1, dict(drop=("blk.0.attn_k_norm.weight",)), "blk.0.attn_k_norm"),
        (ling, dict(drop=("blk.1.attn_qkv.weight",)), "blk.1.attn_qkv"),
        (ling, dict(meta=_meta("bailingmoe2", nextn_predict_layers=u32(4))), "leaves no layers"),
        (glm, dict(extra={"blk.0.attn_qkv.weight": (np.zeros((192, 64), np.float32), 0)}), "fused"),
        (hy, dict(meta=_meta("hunyuan-moe", expert_feed_forward_length=None)), "expert_feed_forward_length"),
        (hy, dict(drop=("blk.1.ffn_down_shexp.weight",)), "blk.1.ffn_down_shexp"),
    ]
    for i, (src, change, match) in enumerate(cases):
        with pytest.raises(ModelLoadError, match=match):
            pi.Model(rewrite(src, tmp_path / f"bad{i}.gguf", **change))
