"""phi3 (Phi-3, Phi-3.5, Phi-4, Phi-4-mini) on a tiny random file with what real ones have: fused attn_qkv and
gate|up ffn_up (split into views at load, powerinfer.model.phi3_views), NEOX rope over n_rot < head_dim (Phi-4-mini's
partial rotary), long / short rope factors (the context picks the long ones past the original context, llama.cpp's
rule) and a rope attention factor that scales cos and sin of the rotated dims only. Reference: the float64 forward
(tests/reference_model.py); llama.cpp checks the same file in tests/compat/test_phi3_vs_llama_cpp.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, logits_all, rel_rms  # noqa: E402
from model_files import CONFIGS, write_arch_model  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
LONG = 1024     # a context past the file's original one (512)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    path = tmp_path_factory.mktemp("phi3") / "tiny-phi3.gguf"
    write_arch_model(path, "phi3", seed=3)
    return path


def test_hparams_and_views(phi3):
    model = pi.Model(phi3)
    hp, c = model.hparams, CONFIGS["phi3"]
    assert (hp.arch, hp.rope_mode, hp.n_rot, hp.n_swa) == ("phi3", "neox", c["n_rot"], 0)
    assert hp.yarn_orig_ctx == c["orig_ctx"] and hp.rope_attn_factor == pytest.approx(c["attn_factor"])


def test_short_factors_within_the_original_context(phi3):
    ours = logits_all(pi.Context(pi.Model(phi3), n_ctx=8, kv_type="f32"), PROMPT[:8])
    ref = ReferenceModel(phi3)
    assert rel_rms(ours, ref.forward(PROMPT[:8])) < FLOAT_REL_RMS
    # a long context split into 2 sequences of 512 positions: the short factors too (per-sequence context)
    many = logits_all(pi.Context(pi.Model(phi3), n_ctx=LONG, n_seq_max=2, kv_type="f32"), PROMPT[:8])
    np.testing.assert_array_equal(many, ours)


def test_long_factors_past_the_original_context(phi3):
    ours = logits_all(pi.Context(pi.Model(phi3), n_ctx=LONG, kv_type="f32"), PROMPT)
    ref = ReferenceModel(phi3)
    long = ReferenceModel(phi3, rope_freqs=ref.rope_factors["long"]).forward(PROMPT)
    assert rel_rms(ours, long) < FLOAT_REL_RMS, rel_rms(ours, long)
    # what each piece changes: the short factors, no attention factor, the factor on every dim of q and k
    assert rel_rms(ours, ref.forward(PROMPT)) > 1e-3
    assert rel_rms(ours, ReferenceModel(phi3, rope_freqs=ref.rope_factors["long"],
                                        rope_attn_factor=1.0).forward(PROMPT)) > 1e-3


def test_quantized_views(tmp_path):
    """Q8_0 and Q4_0 rows of the fused tensors: the views start on whole rows. Against the reference of the same file
    (which dequantizes the fused tensors whole); a view one row off would be far from it."""
    for dtype in ("q8_0", "q4_0"):
        path = tmp_path / f"phi3-{dtype}.gguf"
        write_arch_model(path, "phi3", seed=3, dtype=dtype)
        ours = logits_all(pi.Context(pi.Model(path), n_ctx=8, kv_type="f32"), PROMPT[:8])
        err = rel_rms(ours, ReferenceModel(path).forward(PROMPT[:8]))
        assert err < QUANT_REL_RMS, (dtype, err)


def test_generates_through_the_api(phi3):
    llm = pi.PowerInfer(phi3, n_ctx=64, verbose=False)
    out = llm.create_completion([1, 17, 200], max_tokens=8, temperature=0)
    assert out["usage"]["completion_tokens"] <= 8 and out["choices"][0]["finish_reason"] in ("stop", "length")


def test_lora_of_the_fused_weights(phi3, tmp_path):
    """A phi3 adapter adapts the fused weights (attn_qkv, gate|up ffn_up): its pairs split as the weights do."""
    from model_files import merge_lora, write_lora
    from powerinfer.lora import LoraAdapter
    from reference_model import dequantize, read_gguf
    pairs = write_lora(tmp_path / "a.gguf", phi3, targets=("attn_qkv", "ffn_up", "attn_output", "ffn_down"),
                       rank=4, alpha=8.0, seed=2)
    model = pi.Model(phi3)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.set_lora([(LoraAdapter(tmp_path / "a.gguf", model), 0.8)])
    got = logits_all(ctx, PROMPT)
    meta, tensors = read_gguf(phi3)
    w = merge_lora({n: dequantize(raw, tt, ne) for n, (tt, ne, raw) in tensors.items()}, pairs, 0.8, 8.0)
    want = ReferenceModel.from_weights(meta, w).forward(PROMPT)
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)
    assert rel_rms(logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT), want) > 1e-3
