"""The tiny random deepseek2 files of tests/model_files.py (DEEPSEEK2: MLA with a latent of 32, 4 heads, the first layer
dense, then 6 experts (2 per token) and a shared expert) run by llama.cpp (llama-cpp-python, f32 KV cache) and by us.

llama.cpp runs the newer files (attn_k_b / attn_v_b) absorbed as we do and the older ones (attn_kv_b) as multi-head
attention over the decompressed keys and values; we split attn_kv_b into the absorbed form at load.

f32 weights (measured at seeds 0 and 3): 3.2e-7 .. 4.5e-7 from llama.cpp for every variant (absorbed, attn_kv_b,
q_lora, YaRN with and without DeepSeek's yarn_log_multiplier, V3's routing: sigmoid, selection bias, groups,
renormalized and scaled; V2's softmax with groups), the same argmax at every position and the same 12
greedy tokens. Each piece's absence moves the reference 3.5e-2 .. 0.45 from ours (tests/test_deepseek2.py).

Q8_0 / Q4_0 matrices: the absorbed files 0 .. 9.0e-3 from llama.cpp (mostly its bits or 6.6e-8: both round the same
8-bit activations), the attn_kv_b files 2.0e-2 .. 2.6e-2 (llama.cpp multiplies the quantized attn_kv_b by the rounded
latent, we the f32 split of its dequantized values); all 12 greedy tokens agree at both seeds for every variant.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import QUANT_REL_RMS, agrees_with_llama_cpp, llama_cpp_eval, logits_all  # noqa: E402
from model_files import write_deepseek2_model  # noqa: E402

LLAMA_CPP_REL_RMS = 1e-5   # f32 (measured 3.2e-7 .. 4.5e-7)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 64,
        "rope.scaling.yarn_log_multiplier": 0.0707}
VARIANTS = {"mla": {}, "kv_b": dict(kv_b=True), "q_lora": dict(q_lora=32), "yarn": dict(q_lora=32, meta=YARN),
            "yarn_no_log_mul": dict(meta={k: v for k, v in YARN.items() if k != "rope.scaling.yarn_log_multiplier"}),
            "v3": dict(q_lora=32, probs_b=True, meta={"expert_gating_func": 2, "expert_weights_norm": True,
                                                      "expert_weights_scale": 2.5, "expert_group_count": 3,
                                                      "expert_group_used_count": 2}),
            "v2_groups": dict(meta={"expert_group_count": 3, "expert_group_used_count": 2})}


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_f32(tmp_path, variant, seed):
    f = tmp_path / f"ds2-{variant}-{seed}.gguf"
    write_deepseek2_model(f, seed=seed, **VARIANTS[variant])
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert np.array_equal(ours.argmax(1), llama_cpp_eval(f, PROMPT)[1].argmax(1))
    agrees_with_llama_cpp(f, PROMPT, LLAMA_CPP_REL_RMS)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", ["mla", "kv_b", "yarn", "v3"])
def test_quantized(tmp_path, variant, dtype):
    f = tmp_path / f"ds2-{variant}-{dtype}.gguf"
    write_deepseek2_model(f, dtype=dtype, **VARIANTS[variant])
    agrees_with_llama_cpp(f, PROMPT, QUANT_REL_RMS)


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M", "Q6_K"])
@pytest.mark.parametrize("variant", ["mla", "kv_b", "q_lora"])
def test_quantizer_writes_llama_quantizes_file(tmp_path, variant, ftype):
    """powerinfer.quantize on the tiny deepseek2 files (attn_k_b / attn_v_b stacks, or an older attn_kv_b; q_lora's
    attn_q_a / attn_q_b; experts and shared experts; mostly fallback types at n_embd 64): llama-quantize's file byte for
    byte."""
    import ctypes

    from powerinfer.quant_rules import FTYPE, QuantOptions
    from powerinfer.quantize import quantize_file
    src, ours, theirs = tmp_path / "f32.gguf", tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    write_deepseek2_model(src, seed=3, **VARIANTS[variant])
    quantize_file(src, ours, QuantOptions(ftype=FTYPE[ftype]))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = FTYPE[ftype], 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(theirs).encode(), ctypes.byref(p)) == 0
    assert ours.read_bytes() == theirs.read_bytes()
