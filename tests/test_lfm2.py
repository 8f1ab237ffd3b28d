"""lfm2 (Liquid AI's LFM2 / LFM2.5): short conv layers over the per-sequence recurrent state's conv part and GQA
attention layers with q/k norms, against the float64 reference (reference_lfm2.py); the recurrent state's rules for
these layers (recurrent.c with no matrix part); files refused by name.

The tiny files: model_files.LFM2 (5 layers: 0, 1, 3 short convs of kernel 3 over n_embd 64; 2 and 4 attention, 4 heads
of 16, 2 KV heads; SwiGLU FFN 96; the output tied). Measured (seed 0): ours 4.1e-7 from the reference in f32 at every
level; each piece's absence moves the reference far from ours (test_each_piece_matters prints it)."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOAT_REL_RMS, check_level, emulated_offload, logits_all, logits_one_by_one, rel_rms
from model_files import LFM2, rewrite, write_lfm2_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer._ffi import PowerInferError
from powerinfer.gguf_file import ModelLoadError

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]
# Q8_0 / Q4_0 weights from the float64 reference (llama.cpp gives our bits or within 1e-7 of them:
# tests/compat/test_lfm2_vs_llama_cpp.py)
LFM2_QUANT_REL_RMS = 5e-2


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    path = tmp_path_factory.mktemp("lfm2") / "tiny-lfm2.gguf"
    write_lfm2_model(path)
    return path


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512", "amx"])
def test_matches_the_reference_at_every_level(lfm2, level):
    """The prompt in one call and token by token (the conv state one token per call) within FLOAT_REL_RMS of the
    reference at every ISA level, with the scalar level's bits."""
    check_level(lfm2, level, ReferenceModel(lfm2).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_hparams(lfm2):
    m = pi.Model(lfm2)
    hp = m.hparams
    assert [g.recurrent for g in hp.layer_geom] == [True, True, False, True, False]
    assert hp.shortconv and hp.ssm_d_conv == 3 and hp.ssm_d_state == 0 and hp.n_head_kv == 2
    assert hp.qk_norm and hp.rope_mode == "neox" and not hp.attn_output_gate
    assert m.recurrent


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized(tmp_path, dtype):
    f = tmp_path / f"lfm2-{dtype}.gguf"
    write_lfm2_model(f, dtype=dtype)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
    err = rel_rms(ours, ReferenceModel(f).forward(PROMPT))
    print(f"{dtype}: {err:.2e} from the reference")
    assert err < LFM2_QUANT_REL_RMS


def test_f16_kv_cache_and_calls_of_any_size(tmp_path):
    """The default f16 cache within its bound; the prompt in calls of 5 tokens (the conv state carried across calls,
    a call shorter and longer than the kernel)."""
    f = tmp_path / "lfm2.gguf"
    write_lfm2_model(f, seed=1)
    ref = ReferenceModel(f).forward(PROMPT)
    assert rel_rms(logits_all(pi.Context(pi.Model(f), n_ctx=64, n_batch=5), PROMPT), ref) < 3e-3
    for n_batch in (1, 2, 5):
        ctx = pi.Context(pi.Model(f), n_ctx=64, n_batch=n_batch, kv_type="f32")
        assert rel_rms(logits_all(ctx, PROMPT), ref) < FLOAT_REL_RMS


def test_each_piece_matters(lfm2):
    """The reference without the conv, the b or c gate, or the q/k norms is far from ours."""
    ours = logits_all(pi.Context(pi.Model(lfm2), n_ctx=64, kv_type="f32"), PROMPT)
    for piece in ("conv", "b", "c", "qk_norm"):
        ref = ReferenceModel(lfm2)
        ref.lfm2_drop = (piece,)
        err = rel_rms(ours, ref.forward(PROMPT))
        print(f"without {piece}: {err:.2e}")
        assert err > 1e-3, piece


def test_two_sequences_in_one_batch(tmp_path):
    """Two prompts decoded together (their tokens interleaved in one batch, then a step of both): each sequence's
    logits are the reference's of its prompt alone and the bits of decoding it alone."""
    f = tmp_path / "lfm2.gguf"
    write_lfm2_model(f, seed=2)
    a, b = PROMPT[:7], PROMPT[5:]
    ctx = pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_seq_max=2)
    ctx.decode([t for pair in zip(a, b) for t in pair], pos=[p for i in range(7) for p in (i, i)],
               seq_id=[0, 1] * 7, logits="all")
    got_a, got_b = (np.stack([ctx.logits(2 * i + s) for i in range(7)]) for s in (0, 1))
    ctx.decode([5, 6], pos=[7, 7], seq_id=[0, 1], logits="all")
    ref = ReferenceModel(f)
    assert rel_rms(np.vstack([got_a, ctx.logits(0)]), ref.forward(a + [5])) < FLOAT_REL_RMS
    assert rel_rms(np.vstack([got_b, ctx.logits(1)]), ref.forward(b + [6])) < FLOAT_REL_RMS
    solo = pi.Context(pi.Model(f), n_ctx=64, kv_type="f32")
    assert np.array_equal(logits_all(solo, b + [6])[-1], ctx.logits(1))


def test_state_rules(lfm2):
    """The recurrent rules with a conv-only state: an absorbed tail cannot be removed, the whole sequence can (then
    it decodes from scratch to the same bits); a copy continues as the original; a sequence state round-trips."""
    model = pi.Model(lfm2)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_seq_max=2)
    first = logits_all(ctx, PROMPT)
    with pytest.raises(PowerInferError, match="recurrent state has absorbed"):
        ctx.kv_seq_rm(0, 5, -1)
    ctx.kv_seq_rm(0, 0, -1)
    assert ctx.recurrent_pos(0) == -1
    assert np.array_equal(logits_all(ctx, PROMPT), first)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_seq_max=2)
    ctx.decode(PROMPT)
    ctx.kv_seq_cp(0, 1)
    n = len(PROMPT)
    # the copy continues with the bits of an uninterrupted run where its token takes the next cell (a token in a
    # later cell, past another sequence's, attends with other rounding: so does an all-attention file)
    ctx.decode([7], pos=[n], seq_id=[1])
    assert np.array_equal(ctx.logits(0), logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT + [7])[-1])
    ctx.decode([7], pos=[n], seq_id=[0])
    assert rel_rms(ctx.logits(0), logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT + [7])[-1]) < 1e-6
    with pytest.raises(PowerInferError, match="whole sequence"):
        ctx.kv_seq_state(0, 0, 5)
    other = pi.Context(model, n_ctx=64, kv_type="f32")
    other.kv_seq_set_state(0, ctx.kv_seq_state(0))
    assert other.recurrent_pos(0) == n
    other.decode([9])
    want = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT + [7, 9])[-1]
    assert rel_rms(other.logits(0), want) < 1e-6


def test_aborted_decode_leaves_the_state(lfm2):
    model = pi.Model(lfm2)
    want = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT[:6])
    calls = []
    ctx.set_abort_callback(lambda: len(calls) > 2 or calls.append(1) or False)
    with pytest.raises(PowerInferError):
        ctx.decode(PROMPT[6:], logits="all")
    ctx.set_abort_callback(None)
    assert ctx.recurrent_pos(0) == 5
    ctx.decode(PROMPT[6:], logits="all")
    assert np.array_equal(np.stack([ctx.logits(i) for i in range(6)]), want[6:])


def test_bad_files(tmp_path):
    from gguf import GGUFValueType as VT
    src = tmp_path / "lfm2.gguf"
    write_lfm2_model(src)
    cases = {
        "no_l_cache": ({"lfm2.shortconv.l_cache": None}, (), "shortconv.l_cache"),
        "l_cache_1": ({"lfm2.shortconv.l_cache": (1, VT.UINT32)}, (), "2..64"),
        "no_attention": ({"lfm2.attention.head_count_kv": ([0] * 5, VT.ARRAY, VT.INT32)}, (),
                         "without an attention layer"),
        "kv_count": ({"lfm2.attention.head_count_kv": ([0, 2], VT.ARRAY, VT.INT32)}, (), "for each of 5 layers"),
        "swa": ({"lfm2.attention.sliding_window": (64, VT.UINT32)}, (), "sliding window"),
        "bidirectional": ({"lfm2.attention.causal": (False, VT.BOOL)}, (), "bidirectional"),
        "no_conv": ({}, ("blk.0.shortconv.conv.weight",), "shortconv.conv"),
        "no_out_proj": ({}, ("blk.3.shortconv.out_proj.weight",), "shortconv.out_proj"),
        "no_norm": ({}, ("token_embd_norm.weight",), "output_norm"),
    }
    for name, (meta, drop, msg) in cases.items():
        dst = rewrite(src, tmp_path / f"{name}.gguf", meta=meta, drop=drop)
        with pytest.raises(ModelLoadError, match=msg):
            pi.Model(dst)
    assert len(LFM2["kv"]) == 5


def test_one_by_one_matches_one_call(lfm2):
    ctx = pi.Context(pi.Model(lfm2), n_ctx=64, kv_type="f32")
    one = logits_all(ctx, PROMPT)
    assert rel_rms(logits_one_by_one(pi.Context(pi.Model(lfm2), n_ctx=64, kv_type="f32"), PROMPT), one) < 1e-6


def test_offload_is_refused_with_a_message(lfm2):
    """-ngl on the emulated device: the context says lfm2 runs on the CPU only, and runs there with the CPU's bits."""
    offloaded, same_bits, warnings = emulated_offload(lfm2, PROMPT)
    assert not offloaded and same_bits
    assert "lfm2 models run on the CPU only" in warnings, warnings


def test_lfm2moe_layers_and_bad_files(tmp_path):
    """lfm2moe: the leading dense layer's FFN and the others' experts (pi_layer_geom.moe from ffn_gate_inp), the
    short convs as lfm2's; a gating function other than softmax / sigmoid, or no experts, refused by name (the logits
    against llama.cpp: tests/compat/test_lfm2_vs_llama_cpp.py)."""
    from gguf import GGUFValueType as VT
    from model_files import write_lfm2moe_model
    f = tmp_path / "lfm2moe.gguf"
    write_lfm2moe_model(f)
    m = pi.Model(f)
    assert [g.recurrent for g in m.hparams.layer_geom] == [True, True, False, True, False]
    assert m.hparams.n_expert == 4 and m.hparams.expert_sigmoid and m.recurrent
    ctx = pi.Context(m, n_ctx=64, kv_type="f32")
    assert np.isfinite(logits_all(ctx, PROMPT)).all()
    for name, meta, msg in (("gating", {"lfm2moe.expert_gating_func": (3, VT.UINT32)}, "expert_gating_func"),
                            ("no_experts", {"lfm2moe.expert_count": None}, "expert_count")):
        with pytest.raises(ModelLoadError, match=msg):
            pi.Model(rewrite(f, tmp_path / f"{name}.gguf", meta=meta))
