"""LoRA adapters (llama.cpp's GGUF adapters, powerinfer.lora): the logits equal the float64 reference forward of the
merged weights W + scale * alpha / r * B A for every weight an adapter can adapt, several adapters at once, on
float and quantized bases; scale 0 and no adapter are the base model's bits; a prompt's chunking stays neutral; bad
adapters are refused with the reason."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, logits_all, logits_in_calls, rel_rms
from model_files import LORA_ALL_LINEAR, merge_lora, write_arch_model, write_lora, write_sparse_model
from reference_model import ReferenceModel, dequantize, read_gguf

import powerinfer as pi
from powerinfer.lora import LoraAdapter

PROMPT = [1, 17, 93, 5, 200, 41, 7, 66, 130, 12, 3, 250]


def reference(base, adapters, **overrides) -> np.ndarray:
    """The float64 forward of base with [(pairs, scale, alpha)] merged in."""
    meta, tensors = read_gguf(base)
    w = {n: dequantize(raw, tt, ne) for n, (tt, ne, raw) in tensors.items()}
    w.setdefault("output.weight", w["token_embd.weight"])   # tied: token_embd's adapter is for the input only
    for pairs, scale, alpha in adapters:
        w = merge_lora(w, pairs, scale, alpha)
    return ReferenceModel.from_weights(meta, w, **overrides).forward(PROMPT)


def ours(model, adapters, **kw) -> np.ndarray:
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", **kw)
    ctx.set_lora(adapters)
    return logits_all(ctx, PROMPT)


@pytest.mark.parametrize("targets", [("attn_q", "attn_v"), LORA_ALL_LINEAR + ("output", "token_embd")])
def test_lora_matches_merged_reference(tiny_model, tmp_path, targets):
    base = tiny_model("f32", seed=2)
    pairs = write_lora(tmp_path / "a.gguf", base, targets=targets, rank=8, alpha=16.0, seed=1)
    model = pi.Model(base)
    ad = LoraAdapter(tmp_path / "a.gguf", model)
    assert ad.n_weights == len(pairs) and ad.alpha == 16.0
    want = reference(base, [(pairs, 0.7, 16.0)])
    got = ours(model, [(ad, 0.7)])
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)
    base_logits = ours(model, [])
    assert rel_rms(base_logits, want) > 100 * FLOAT_REL_RMS   # the adapter changes the model


def test_two_adapters_f16_on_quantized_base(tiny_model, tmp_path):
    """Two adapters at once (their terms add), an f16 one of odd rank with alpha 0 (the scale alone), on a Q8_0 base."""
    base = tiny_model("q8_0", seed=3)
    p1 = write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR, rank=3, alpha=0.0, dtype="f16", seed=4)
    p2 = write_lora(tmp_path / "b.gguf", base, targets=("attn_k", "attn_output", "output"), rank=16, alpha=8.0, seed=5)
    model = pi.Model(base)
    a, b = LoraAdapter(tmp_path / "a.gguf", model), LoraAdapter(tmp_path / "b.gguf", model)
    want = reference(base, [(p1, 0.5, 0.0), (p2, -1.5, 8.0)])
    got = ours(model, [(a, 0.5), (b, -1.5)])
    assert rel_rms(got, want) < QUANT_REL_RMS, rel_rms(got, want)
    only_b = reference(base, [(p2, -1.5, 8.0)])
    assert rel_rms(got, only_b) > 3 * rel_rms(got, want)


def test_lora_keeps_the_numeric_contract(tiny_model, tmp_path):
    """Scale 0 and no adapter: the base model's bits; with an adapter, a prompt's rows are the same bits in one call
    or in chunks (the terms are per-row ops too); the context's list is what the decode applies."""
    base = tiny_model("q8_0", seed=3)
    write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR + ("output", "token_embd"), rank=4, seed=6)
    model = pi.Model(base)
    ad = LoraAdapter(tmp_path / "a.gguf", model)
    plain = ours(model, [])
    assert np.array_equal(ours(model, [(ad, 0.0)]), plain)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.set_lora([(ad, 1.0)])
    one = logits_all(ctx, PROMPT, clear=True)
    assert not np.array_equal(one, plain)
    assert np.array_equal(logits_in_calls(ctx, PROMPT, 5, clear=True), one)
    assert np.array_equal(logits_in_calls(ctx, PROMPT, 1, clear=True), one)
    ctx.set_lora([])
    assert np.array_equal(logits_all(ctx, PROMPT, clear=True), plain)


def test_lora_on_gemma3(tmp_path):
    """gemma3: the token embedding's term is added before the embedding scale (llama.cpp's order), tied output."""
    base = tmp_path / "g.gguf"
    write_arch_model(base, "gemma3", seed=1)
    pairs = write_lora(tmp_path / "a.gguf", base, targets=LORA_ALL_LINEAR + ("token_embd",), rank=4, seed=2)
    model = pi.Model(base)
    got = ours(model, [(LoraAdapter(tmp_path / "a.gguf", model), 1.0)])
    want = reference(base, [(pairs, 1.0, 16.0)])
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)


def test_attention_lora_on_a_sparse_file(tmp_path):
    """A PowerInfer (PWRI) file: its attention takes adapters (the predictor-guided FFN runs as before); FFN
    adapters are refused with the reason."""
    base = write_sparse_model(tmp_path / "s.powerinfer.gguf", ranks=(32, 64))
    pairs = write_lora(tmp_path / "a.gguf", base, targets=("attn_q", "attn_k", "attn_v", "attn_output"), seed=3)
    model = pi.Model(base)
    ad = LoraAdapter(tmp_path / "a.gguf", model)
    got = ours(model, [(ad, 1.0)], dense=True)   # every neuron: the reference without its predictor
    want = reference(base, [(pairs, 1.0, 16.0)], use_predictor=False)
    assert rel_rms(got, want) < FLOAT_REL_RMS, rel_rms(got, want)
    assert rel_rms(ours(model, [], dense=True), want) > 100 * FLOAT_REL_RMS
    sparse = ours(model, [(ad, 1.0)])            # the predictor's selection, the adapted attention
    assert np.isfinite(sparse).all() and not np.array_equal(sparse, ours(model, []))
    write_lora(tmp_path / "f.gguf", base, targets=("ffn_up",), seed=3)
    with pytest.raises(pi.ModelLoadError, match="FFN are not supported on a PowerInfer"):
        LoraAdapter(tmp_path / "f.gguf", model)


def test_bad_adapters(tiny_model, tmp_path):
    base = tiny_model("f32", seed=2)
    model = pi.Model(base)
    with pytest.raises(pi.ModelLoadError, match="not a LoRA adapter"):
        LoraAdapter(base, model)
    write_lora(tmp_path / "arch.gguf", base, arch="qwen2")
    with pytest.raises(pi.ModelLoadError, match="'qwen2' models, the model is 'llama'"):
        LoraAdapter(tmp_path / "arch.gguf", model)
    write_lora(tmp_path / "half.gguf", base, drop=("blk.1.attn_v.weight.lora_b",))
    with pytest.raises(pi.ModelLoadError, match="blk.1.attn_v.weight' is missing its lora_b"):
        LoraAdapter(tmp_path / "half.gguf", model)
    write_lora(tmp_path / "name.gguf", base, extra=("blk.7.attn_q.weight.lora_a",))
    with pytest.raises(pi.ModelLoadError, match="which this model does not have"):
        LoraAdapter(tmp_path / "name.gguf", model)
    write_lora(tmp_path / "odd.gguf", base, extra=("blk.0.attn_q.weight.scale",))
    with pytest.raises(pi.ModelLoadError, match="neither a .lora_a nor a .lora_b"):
        LoraAdapter(tmp_path / "odd.gguf", model)
    other = tiny_model("f32", seed=2, n_embd=128)
    write_lora(tmp_path / "shape.gguf", other)
    with pytest.raises(pi.ModelLoadError, match="has shapes a .* for a weight of"):
        LoraAdapter(tmp_path / "shape.gguf", model)
    ctx = pi.Context(model, n_ctx=32)
    write_lora(tmp_path / "good.gguf", base)
    good = LoraAdapter(tmp_path / "good.gguf", model)
    with pytest.raises(ValueError, match="finite"):
        ctx.set_lora([(good, float("nan"))])
    with pytest.raises(ValueError, match="another model"):
        ctx.set_lora([(LoraAdapter(tmp_path / "good.gguf", pi.Model(base)), 1.0)])
