"""deepseek2 (DeepSeek-V2 / V2-Lite / Coder-V2, Moonlight, DeepSeek-V3 / R1, Kimi-K2): multi-head latent attention
run in its absorbed form (one cached row of kv_lora_rank + n_rot values per token for all heads) against the float64
reference, which computes it as multi-head attention over the decompressed keys and values; the leading dense layers,
then softmax-routed experts with a shared expert; older files with attn_kv_b; q through q_a / q_b (V2 / V3); YaRN with
DeepSeek's yarn_log_multiplier. The tiny files: model_files.DEEPSEEK2 (3 layers, the first dense, 6 experts of 32, 2 per
token, one shared expert, R 32, n_rot 16, nope 32, v 16, 4 heads).

What each piece changes (rel. RMS of the reference without it against ours, seed 0, q_lora and YaRN; printed by
test_each_piece_matters): the latent's norm 0.20, k_pe's rope 0.20, q_pe's rope 0.22, YaRN's attention scale 0.14,
the experts' weights renormalized 3.5e-2, the shared expert 0.45; ours is 2.2e-7 .. 3.2e-7 from the reference. V3's
routing (seed 0; test_v3_routing_pieces_matter): softmax for its sigmoids 0.76, without the selection bias 0.56, without
the groups 0.38, not renormalized 0.40, without the scale 0.50; V2's softmax router without its groups 3.0e-2."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, check_level, emulated_offload, logits_all, rel_rms
from model_files import DEEPSEEK2, rewrite, write_deepseek2_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer.gguf_file import ModelLoadError

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]
# V2-Lite's YaRN (factor 40 there, mscale_all_dim 0.707: yarn_log_multiplier 0.0707) over a short original context
YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 64,
        "rope.scaling.yarn_log_multiplier": 0.0707}
# DeepSeek-V3's routing: sigmoid probabilities, a selection bias, 3 groups of 2 experts (2 used), renormalized, scaled
V3 = {"expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 2.5, "expert_group_count": 3,
      "expert_group_used_count": 2}
VARIANTS = {"mla": {}, "kv_b": dict(kv_b=True), "q_lora": dict(q_lora=32), "yarn": dict(q_lora=32, meta=YARN),
            "v3": dict(q_lora=32, probs_b=True, meta={**YARN, **V3})}


@pytest.fixture(scope="module", params=list(VARIANTS))
def ds2(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("ds2") / f"tiny-deepseek2-{request.param}.gguf"
    write_deepseek2_model(path, **VARIANTS[request.param])
    return path


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512", "amx"])
def test_matches_the_reference_at_every_level(ds2, level):
    """The prompt in one call and token by token (decode steps over the cached latents) within FLOAT_REL_RMS of the
    reference at every ISA level, with the scalar level's bits."""
    check_level(ds2, level, ReferenceModel(ds2).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_hparams_and_cache_rows(ds2):
    """The layers' geometry: one KV head of R + n_rot values (the cached row), the first layer dense."""
    hp = pi.Model(ds2).hparams
    R, nr = DEEPSEEK2["kv_lora_rank"], DEEPSEEK2["n_rot"]
    assert (hp.mla_kv_rank, hp.mla_head_k, hp.mla_head_v, hp.n_head_kv) == (R, DEEPSEEK2["nope"] + nr,
                                                                           DEEPSEEK2["v"], 1)
    assert all(g.head_dim == R + nr and g.n_head_kv == 1 for g in hp.layer_geom)
    assert hp.n_layer_dense_lead == 1 and hp.n_ff_exp == 32 and hp.n_ff_shexp == 32
    assert hp.expert_raw_weights != hp.expert_sigmoid     # V2's weights as they are, V3's renormalized


def test_the_cache_holds_one_row_per_token_and_layer(tmp_path):
    """MLA's point: a token's cached state is one row of R + n_rot values per layer (V is read from it, no V rows), a
    sequence state restored into another context continues with the same bits, and a V cache type other than K's is
    refused (as llama.cpp)."""
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f, q_lora=32)
    m = pi.Model(f)
    ctx = pi.Context(m, n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT[:5])
    five = len(ctx.kv_seq_state(0))
    ctx.decode(PROMPT[5:10])
    row = DEEPSEEK2["kv_lora_rank"] + DEEPSEEK2["n_rot"]
    assert len(ctx.kv_seq_state(0)) - five == 5 * (4 + DEEPSEEK2["n_layer"] * row * 4)   # position + K rows (f32)
    other = pi.Context(m, n_ctx=64, kv_type="f32")
    other.kv_seq_set_state(0, ctx.kv_seq_state(0))
    ctx.decode([PROMPT[10]])
    other.decode([PROMPT[10]])
    assert np.array_equal(ctx.logits(), other.logits())
    with pytest.raises(pi.PowerInferError, match="reads V from the K cache"):
        pi.Context(m, n_ctx=64, kv_type=("f16", "f32"))


def test_kv_b_file_gives_the_split_files_bits(tmp_path):
    """An older file's attn_kv_b, split at load, gives the bits of the converter's attn_k_b / attn_v_b of the same
    weights."""
    a, b = tmp_path / "split.gguf", tmp_path / "kv_b.gguf"
    write_deepseek2_model(a, seed=4)
    write_deepseek2_model(b, seed=4, kv_b=True)
    assert pi.Model(b).hparams.mla_kv_b
    run = lambda f: logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)  # noqa: E731
    assert np.array_equal(run(a), run(b))


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", ["mla", "kv_b"])
def test_quantized(tmp_path, dtype, variant):
    """Every matrix quantized (attn_k_b / attn_v_b stacks too; attn_kv_b dequantized at load): within QUANT_REL_RMS of
    the reference of the dequantized weights (Q4_0's absorbed file: twice that; llama.cpp's logits of that file are
    ours bit for bit, 5.7e-2 from the reference; the others 1.5e-2 .. 1.7e-2)."""
    f = tmp_path / f"{variant}-{dtype}.gguf"
    write_deepseek2_model(f, dtype=dtype, **VARIANTS[variant])
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
    err = rel_rms(ours, ReferenceModel(f).forward(PROMPT))
    print(f"{variant} {dtype}: {err:.2e} from the reference")
    assert err < (2 if dtype == "q4_0" else 1) * QUANT_REL_RMS, err


def test_f16_kv_cache(tmp_path):
    """The default f16 cache of the latent rows: within the f16 bound of the reference."""
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f, q_lora=32)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64), PROMPT)
    assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < 3e-3


def test_two_sequences_in_one_batch(tmp_path):
    """Two prompts decoded together (their tokens interleaved in one batch, then a step of both): each sequence's
    logits are the reference's of its prompt alone."""
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f, seed=2, q_lora=32)
    a, b = PROMPT[:7], PROMPT[5:]
    ctx = pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_seq_max=2)
    ctx.decode([t for pair in zip(a, b) for t in pair], pos=[p for i in range(7) for p in (i, i)], seq_id=[0, 1] * 7,
               logits="all")
    got_a, got_b = (np.stack([ctx.logits(2 * i + s) for i in range(7)]) for s in (0, 1))
    ctx.decode([5, 6], pos=[7, 7], seq_id=[0, 1], logits="all")
    ref = ReferenceModel(f)
    assert rel_rms(np.vstack([got_a, ctx.logits(0)]), ref.forward(a + [5])) < FLOAT_REL_RMS
    assert rel_rms(np.vstack([got_b, ctx.logits(1)]), ref.forward(b + [6])) < FLOAT_REL_RMS


def test_each_piece_matters(tmp_path):
    """The reference without each piece is far from ours: the latent's norm, the ropes of k_pe and q_pe, YaRN's
    attention scale (mscale^2 with yarn_log_multiplier), the experts' weights not renormalized (expert_weights_norm
    false), the shared expert."""
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f, q_lora=32, meta=YARN)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < FLOAT_REL_RMS
    without = {piece: ReferenceModel(f, mla_drop=(piece,)) for piece in ("kv_norm", "k_pe", "q_pe", "scale")}
    without["renormalized"] = ReferenceModel(f, ds_norm=True)
    without["shared expert"] = ReferenceModel(f)
    for L in without["shared expert"].layers:
        for k in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"):
            L.pop(k, None)
    for piece, ref in without.items():
        err = rel_rms(ours, ref.forward(PROMPT))
        print(f"without {piece}: {err:.2e}")
        assert err > 1e-2, (piece, err)


def test_v3_routing_pieces_matter(tmp_path):
    """DeepSeek-V3's routing: the reference without each piece is far from ours: sigmoid probabilities (softmax
    instead), the selection bias, the groups, the renormalization, the scale; V2's softmax router with groups too."""
    f = tmp_path / "v3.gguf"
    write_deepseek2_model(f, q_lora=32, probs_b=True, meta=V3)
    hp = pi.Model(f).hparams
    assert hp.expert_sigmoid and (hp.n_expert_groups, hp.n_group_used) == (3, 2) and not hp.expert_raw_weights
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < FLOAT_REL_RMS
    without = dict(softmax=dict(ds_gating="softmax"), bias=dict(ds_bias=False), groups=dict(ds_groups=(0, 0)),
                   norm=dict(ds_norm=False), scale=dict(expert_weights_scale=1.0))
    for piece, change in without.items():
        err = rel_rms(ours, ReferenceModel(f, **change).forward(PROMPT))
        print(f"without {piece}: {err:.2e}")
        assert err > 1e-2, (piece, err)
    v2 = tmp_path / "v2-groups.gguf"
    write_deepseek2_model(v2, meta={"expert_group_count": 3, "expert_group_used_count": 2})
    ours = logits_all(pi.Context(pi.Model(v2), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(v2).forward(PROMPT)) < FLOAT_REL_RMS
    assert rel_rms(ours, ReferenceModel(v2, ds_groups=(0, 0)).forward(PROMPT)) > 1e-2


def test_api_greedy_tokens(tmp_path):
    """The llama-cpp-python API (generate over token ids, temperature 0): the reference's greedy tokens."""
    from itertools import islice
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f, q_lora=32)
    llm = pi.PowerInfer(str(f), n_ctx=64, n_threads=1, verbose=False)
    assert list(islice(llm.generate(PROMPT, temp=0.0), 6)) == ReferenceModel(f).greedy(PROMPT, 6)


def test_offload_is_refused_with_a_message(tmp_path):
    """-ngl on the emulated device: the context says the MLA attention runs on the CPU only, and runs there with the
    CPU's bits."""
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f)
    offloaded, same_bits, warnings = emulated_offload(f, PROMPT)
    assert not offloaded and same_bits
    assert "the MLA attention of deepseek2 models runs on the CPU only" in warnings, warnings


def test_lora_of_the_attention_is_refused(tmp_path):
    """A LoRA adapter of attn_q / attn_output (which the MLA attention would not apply) is refused by name; one of the
    dense layer's FFN loads."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from random_lora import write_lora

    from powerinfer.lora import LoraAdapter
    f = tmp_path / "ds2.gguf"
    write_deepseek2_model(f)
    model = pi.Model(f)
    for target in ("attn_q", "attn_output"):
        write_lora(tmp_path / f"{target}.gguf", f, targets=(target,), rank=4)
        with pytest.raises(Exception, match="adapters of the MLA attention"):
            LoraAdapter(tmp_path / f"{target}.gguf", model)
    write_lora(tmp_path / "ffn.gguf", f, targets=("ffn_up",), rank=4, drop=("blk.1.ffn_up.weight.lora_a",
                                                                            "blk.1.ffn_up.weight.lora_b",
                                                                            "blk.2.ffn_up.weight.lora_a",
                                                                            "blk.2.ffn_up.weight.lora_b"))
    LoraAdapter(tmp_path / "ffn.gguf", model)


def _meta(**kv):
    return {f"deepseek2.{k}": v for k, v in kv.items()}


def test_bad_files(tmp_path):
    """Broken or unsupported files give a ModelLoadError naming what is wrong."""
    good = tmp_path / "good.gguf"
    write_deepseek2_model(good)
    old = tmp_path / "old.gguf"
    write_deepseek2_model(old, kv_b=True)
    cases = [
        (good, dict(meta=_meta(**{"attention.kv_lora_rank": None})), "kv_lora_rank"),
        (good, dict(meta=_meta(**{"attention.key_length_mla": (16, VT.UINT32)})), "must exceed rope.dimension_count"),
        (good, dict(meta=_meta(**{"attention.key_length": (40, VT.UINT32)})), "kv_lora_rank \\+ rope dims"),
        (good, dict(meta=_meta(expert_gating_func=(3, VT.UINT32))), "expert_gating_func"),
        (good, dict(meta=_meta(expert_group_count=(3, VT.UINT32))), "expert_group_used_count"),
        (good, dict(meta=_meta(expert_group_count=(4, VT.UINT32), expert_group_used_count=(2, VT.UINT32))),
         "n_expert_groups = 4"),
        (good, dict(meta=_meta(expert_group_count=(3, VT.UINT32), expert_group_used_count=(4, VT.UINT32))),
         "n_group_used = 4"),
        (good, dict(meta=_meta(expert_shared_count=None)), "expert_shared_count"),
        (good, dict(meta=_meta(**{"attention.temperature_scale": (0.1, VT.FLOAT32)})), "temperature_scale"),
        (good, dict(meta=_meta(nextn_predict_layers=(1, VT.UINT32))), "nextn_predict_layers"),
        (good, dict(drop=("blk.1.attn_k_b.weight",)), "blk.1.attn_k_b.weight"),
        (good, dict(drop=("blk.2.attn_kv_a_norm.weight",)), "blk.2.attn_kv_a_norm.weight"),
        (good, dict(replace={"blk.1.attn_v_b.weight": (np.zeros((4, 16, 16), np.float32), 0)}), "attn_v_b"),
        (good, dict(extra={"blk.1.exp_probs_b.bias": (np.zeros(5, np.float32), 0)}), "exp_probs_b"),
        (good, dict(drop=("blk.1.ffn_up_shexp.weight",)), "ffn_up_shexp"),
        (old, dict(drop=("blk.0.attn_kv_b.weight",)), "attn_kv_b"),
        (old, dict(replace={"blk.0.attn_kv_b.weight": (np.zeros((64, 32), np.float32), 0)}), "attn_kv_b"),
    ]
    for i, (src, change, match) in enumerate(cases):
        with pytest.raises(ModelLoadError, match=match):
            pi.Model(rewrite(src, tmp_path / f"bad{i}.gguf", **change))
