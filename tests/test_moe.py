"""Mixture-of-experts FFNs (Mixtral's llama layout, qwen3moe; core/src/moe.c): the logits equal the float64 reference
forward (softmax router, the top n_expert_used renormalized) and llama.cpp's on the same files; a prompt's chunking
is neutral (each expert's rows are mul_mat rows); gemma4's fused gate/up experts and per-expert scales in any MoE
file."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from helpers import FLOAT_REL_RMS, llama_cpp_logits, logits_all, logits_in_calls, rel_rms
from model_files import CONFIGS, make_weights, rename_arch, rewrite, write_arch_model
from reference_model import ReferenceModel

import powerinfer as pi

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
N_EXPERT, N_USED = 4, 2
SHEXP = 48      # qwen2moe's shared expert's width


def write_moe(d, arch: str, seed: int = 3, n_ff_exp: int | None = None, dtype: str = "f32",
              dtypes: dict[str, str] | None = None):
    """The tiny llama (Mixtral's layout), qwen3 (as qwen3moe) or qwen2 (as qwen2moe, with a gated shared expert of
    width 48) of model_files with each layer's FFN replaced by N_EXPERT random experts and a router; n_ff_exp: the
    experts' width (expert_feed_forward_length); dtype: the matrices' type (dtypes: others by part of their names,
    model_files.tensor_dtype)."""
    base = {"llama": "llama", "qwen3moe": "qwen3", "qwen2moe": "qwen2"}[arch]
    c = CONFIGS[base]
    w = make_weights(base, seed)
    rng = np.random.default_rng(seed + 100)
    E, F = c["n_embd"], n_ff_exp or c["n_ff"]
    if arch == "qwen2moe":      # llama.cpp's qwen2moe has an output matrix of its own
        w["output.weight"] = (rng.standard_normal((c["n_vocab"], E)) / np.sqrt(E)).astype(np.float32)
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        for k in ("ffn_gate", "ffn_up", "ffn_down"):
            del w[p + k + ".weight"]
        w[p + "ffn_gate_inp.weight"] = (rng.standard_normal((N_EXPERT, E)) / np.sqrt(E)).astype(np.float32)
        w[p + "ffn_gate_exps.weight"] = (rng.standard_normal((N_EXPERT, F, E)) / np.sqrt(E)).astype(np.float32)
        w[p + "ffn_up_exps.weight"] = (rng.standard_normal((N_EXPERT, F, E)) / np.sqrt(E)).astype(np.float32)
        w[p + "ffn_down_exps.weight"] = (rng.standard_normal((N_EXPERT, E, F)) / np.sqrt(F)).astype(np.float32)
        if arch == "qwen2moe":
            w[p + "ffn_gate_shexp.weight"] = (rng.standard_normal((SHEXP, E)) / np.sqrt(E)).astype(np.float32)
            w[p + "ffn_up_shexp.weight"] = (rng.standard_normal((SHEXP, E)) / np.sqrt(E)).astype(np.float32)
            w[p + "ffn_down_shexp.weight"] = (rng.standard_normal((E, SHEXP)) / np.sqrt(SHEXP)).astype(np.float32)
            w[p + "ffn_gate_inp_shexp.weight"] = (rng.standard_normal(E) / np.sqrt(E)).astype(np.float32)
    write_arch_model(d / "dense-keys.gguf", base, weights=w, dtype=dtype, dtypes=dtypes)
    meta = {f"{base}.expert_count": (N_EXPERT, VT.UINT32), f"{base}.expert_used_count": (N_USED, VT.UINT32)}
    if arch == "llama":
        return rewrite(d / "dense-keys.gguf", d / "mixtral.gguf", meta=meta)
    # qwen3moe / qwen2moe: every qwen3.* / qwen2.* key under its own name
    extra = {f"{arch}.expert_shared_feed_forward_length": (SHEXP, VT.UINT32)} if arch == "qwen2moe" else {}
    return rename_arch(d / "dense-keys.gguf", d / f"{arch}.gguf", arch,
                       {f"{arch}.expert_count": (N_EXPERT, VT.UINT32),
                        f"{arch}.expert_used_count": (N_USED, VT.UINT32),
                        f"{arch}.expert_feed_forward_length": (F, VT.UINT32), **extra})


def test_expert_weights_scale_read_where_llama_cpp_reads_it(tmp_path):
    """A qwen3moe / qwen2moe / Mixtral file's expert_weights_scale is not applied (llama.cpp's loaders of those archs
    do not read it; the deepseek2 and moe_archs tests show where it is)."""
    for arch in ("llama", "qwen3moe", "qwen2moe"):
        f = write_moe(tmp_path, arch)
        base = "llama" if arch == "llama" else arch
        scaled = rewrite(f, tmp_path / f"{arch}-scaled.gguf", meta={f"{base}.expert_weights_scale": (2.0, VT.FLOAT32)})
        assert pi.Model(str(scaled)).hparams.expert_weights_scale == 0.0, arch


@pytest.fixture(scope="module", params=["llama", "qwen3moe", "qwen2moe"])
def moe_file(request, tmp_path_factory):
    return write_moe(tmp_path_factory.mktemp("moe"), request.param,
                     n_ff_exp=None if request.param == "llama" else 64)


def test_moe_matches_the_reference(moe_file):
    model = pi.Model(moe_file)
    assert model.hparams.n_expert == N_EXPERT and model.hparams.n_expert_used == N_USED
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    ref = ReferenceModel(moe_file).forward(PROMPT)
    assert rel_rms(ours, ref) < FLOAT_REL_RMS, rel_rms(ours, ref)


def test_moe_rows_do_not_depend_on_the_batch(moe_file):
    ctx = pi.Context(pi.Model(moe_file), n_ctx=64, kv_type="f32", n_threads=2)
    one = logits_all(ctx, PROMPT, clear=True)
    assert np.array_equal(logits_in_calls(ctx, PROMPT, 1, clear=True), one)
    assert np.array_equal(logits_in_calls(ctx, PROMPT, 5, clear=True), one)


def test_moe_agrees_with_llama_cpp(moe_file):
    theirs = llama_cpp_logits(moe_file, PROMPT)
    ours = logits_all(pi.Context(pi.Model(moe_file), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert rel_rms(ours, theirs) < 1e-5, rel_rms(ours, theirs)


def test_moe_generates_through_the_api(moe_file):
    llm = pi.PowerInfer(moe_file, n_ctx=128, n_threads=1, verbose=False)
    out = llm.create_completion([1, 5, 9], max_tokens=8, temperature=0)
    assert llm.last_result.n_predicted == 8 or out["choices"][0]["finish_reason"] == "stop"


def test_quantized_experts_agree_with_llama_cpp(tmp_path):
    """Q8_0 experts and router (activations quantized to Q8_0 on both sides): llama.cpp's logits within 1e-3."""
    f = write_moe(tmp_path, "llama", dtype="q8_0")
    theirs = llama_cpp_logits(f, PROMPT)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"q8_0 experts: relative RMS difference {err:.2e}")
    assert err < 1e-3, err


def test_qwen2moe_pieces_matter(tmp_path):
    """qwen2moe's router weights are the chosen experts' probabilities (not renormalized) and its gated shared expert
    runs for every token: the reference without either is far from ours."""
    f = write_moe(tmp_path, "qwen2moe", n_ff_exp=64)
    hp = pi.Model(f).hparams
    assert hp.expert_raw_weights and hp.n_ff_shexp == SHEXP and hp.n_ff == 64
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < FLOAT_REL_RMS
    assert rel_rms(ours, ReferenceModel(f, expert_gating="softmax_norm").forward(PROMPT)) > 1e-3
    ref = ReferenceModel(f)
    for L in ref.layers:
        L.pop("ffn_gate_inp_shexp")
    assert rel_rms(ours, ref.forward(PROMPT)) > 1e-3



def fused_or_scaled(f, dst, fused: bool):
    """f with (fused) each layer's ffn_gate_exps and ffn_up_exps as one ffn_gate_up_exps [n_embd, 2 n_ff, n_expert]
    (each expert's gate rows first; llama.cpp reads it for gemma4, deepseek2, qwen3next, ... not for these archs), or
    (not fused) an ffn_down_exps.scale [n_expert] in 0.5..1.5 (llama.cpp reads it for every arch)."""
    ref = ReferenceModel(f)
    rng = np.random.default_rng(5)
    extra, drop = {}, []
    for il, L in enumerate(ref.layers):
        p = f"blk.{il}."
        if fused:
            drop += [p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"]
            gu = np.concatenate([L["ffn_gate_exps"], L["ffn_up_exps"]], axis=1).astype(np.float32)   # (NE, 2F, E)
            extra[p + "ffn_gate_up_exps.weight"] = (gu, 0)
        else:
            extra[p + "ffn_down_exps.scale"] = (rng.uniform(0.5, 1.5, N_EXPERT).astype(np.float32), 0)
    return rewrite(f, dst, drop=drop, extra=extra)


def test_fused_gate_up_and_expert_scales(tmp_path):
    """The core reads gemma4's two expert pieces in any MoE file: fused gate/up experts give the separate ones' bits;
    per-expert output scales the reference's logits and llama.cpp's, and without them the reference is far off."""
    f = write_moe(tmp_path, "qwen3moe", n_ff_exp=64)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    fused = fused_or_scaled(f, tmp_path / "fused.gguf", True)
    assert np.array_equal(logits_all(pi.Context(pi.Model(fused), n_ctx=64, kv_type="f32", n_threads=1), PROMPT), ours)
    scaled = fused_or_scaled(f, tmp_path / "scaled.gguf", False)
    ours = logits_all(pi.Context(pi.Model(scaled), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    ref = ReferenceModel(scaled)
    assert rel_rms(ours, ref.forward(PROMPT)) < FLOAT_REL_RMS, rel_rms(ours, ref.forward(PROMPT))
    err = rel_rms(ours, llama_cpp_logits(scaled, PROMPT))
    print(f"expert scales: {err:.2e} from llama.cpp")
    assert err < 1e-5, err
    for L in ref.layers:
        L.pop("ffn_down_exps.scale")
    assert rel_rms(ours, ref.forward(PROMPT)) > 1e-2
