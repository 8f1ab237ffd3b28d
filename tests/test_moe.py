"""Mixture-of-experts FFNs (Mixtral's llama layout, qwen3moe; core/src/moe.c): the logits equal the float64 reference
forward (softmax router, the top n_expert_used renormalized) and llama.cpp's on the same files; a prompt's chunking
is neutral (each expert's rows are mul_mat rows)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from helpers import FLOAT_REL_RMS, logits_all, logits_in_calls, rel_rms
from model_files import CONFIGS, make_weights, rename_arch, rewrite, write_arch_model
from reference_model import ReferenceModel

import powerinfer as pi

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
N_EXPERT, N_USED = 4, 2


def write_moe(d, arch: str, seed: int = 3, n_ff_exp: int | None = None, dtype: str = "f32",
              dtypes: dict[str, str] | None = None):
    """The tiny llama (Mixtral's layout) or qwen3 (as qwen3moe) of model_files with each layer's FFN replaced by
    N_EXPERT random experts and a router; n_ff_exp: the experts' width (qwen3moe's expert_feed_forward_length);
    dtype: the matrices' type (dtypes: others by part of their names, model_files.tensor_dtype)."""
    base = "llama" if arch == "llama" else "qwen3"
    c = CONFIGS[base]
    w = make_weights(base, seed)
    rng = np.random.default_rng(seed + 100)
    E, F = c["n_embd"], n_ff_exp or c["n_ff"]
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        for k in ("ffn_gate", "ffn_up", "ffn_down"):
            del w[p + k + ".weight"]
        w[p + "ffn_gate_inp.weight"] = (rng.standard_normal((N_EXPERT, E)) / np.sqrt(E)).astype(np.float32)
        w[p + "ffn_gate_exps.weight"] = (rng.standard_normal((N_EXPERT, F, E)) / np.sqrt(E)).astype(np.float32)
        w[p + "ffn_up_exps.weight"] = (rng.standard_normal((N_EXPERT, F, E)) / np.sqrt(E)).astype(np.float32)
        w[p + "ffn_down_exps.weight"] = (rng.standard_normal((N_EXPERT, E, F)) / np.sqrt(F)).astype(np.float32)
    write_arch_model(d / "dense-keys.gguf", base, weights=w, dtype=dtype, dtypes=dtypes)
    meta = {f"{base}.expert_count": (N_EXPERT, VT.UINT32), f"{base}.expert_used_count": (N_USED, VT.UINT32)}
    if arch == "llama":
        return rewrite(d / "dense-keys.gguf", d / "mixtral.gguf", meta=meta)
    # qwen3moe: every qwen3.* key under its own name
    return rename_arch(d / "dense-keys.gguf", d / "qwen3moe.gguf", "qwen3moe",
                       {"qwen3moe.expert_count": (N_EXPERT, VT.UINT32),
                        "qwen3moe.expert_used_count": (N_USED, VT.UINT32),
                        "qwen3moe.expert_feed_forward_length": (F, VT.UINT32)})


@pytest.fixture(scope="module", params=["llama", "qwen3moe"])
def moe_file(request, tmp_path_factory):
    return write_moe(tmp_path_factory.mktemp("moe"), request.param,
                     n_ff_exp=64 if request.param == "qwen3moe" else None)


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
    llama_cpp = pytest.importorskip("llama_cpp")
    ll = llama_cpp.Llama(str(moe_file), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1,
                         type_k=0, type_v=0)
    ll.eval(PROMPT)
    theirs = np.array(ll.scores[:len(PROMPT)], dtype=np.float64)
    ours = logits_all(pi.Context(pi.Model(moe_file), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert rel_rms(ours, theirs) < 1e-5, rel_rms(ours, theirs)


def test_moe_generates_through_the_api(moe_file):
    llm = pi.PowerInfer(moe_file, n_ctx=128, n_threads=1, verbose=False)
    out = llm.create_completion([1, 5, 9], max_tokens=8, temperature=0)
    assert llm.last_result.n_predicted == 8 or out["choices"][0]["finish_reason"] == "stop"


def test_quantized_experts_agree_with_llama_cpp(tmp_path):
    """Q8_0 experts and router (activations quantized to Q8_0 on both sides): llama.cpp's logits within 1e-3."""
    llama_cpp = pytest.importorskip("llama_cpp")
    f = write_moe(tmp_path, "llama", dtype="q8_0")
    ll = llama_cpp.Llama(str(f), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1, type_k=0, type_v=0)
    ll.eval(PROMPT)
    theirs = np.array(ll.scores[:len(PROMPT)], dtype=np.float64)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"q8_0 experts: relative RMS difference {err:.2e}")
    assert err < 1e-3, err
