"""The tiny random glm4moe / dots1 / bailingmoe2 / ernie4_5-moe / hunyuan-moe / olmoe files of tests/model_files.py
(MOE_ARCH_SHAPES; the variants of tests/test_moe_archs.py) run by llama.cpp (llama-cpp-python, f32 KV cache) and by us.

f32 weights (seeds 0 and 3): 2.9e-7 .. 4.4e-7 from llama.cpp (glm4moe with and without q/k norms, groups and scale,
softmax gating; dots1; bailingmoe2's fused attn_qkv, partial rope, groups and MTP layer; ernie4_5-moe; hunyuan-moe;
olmoe), the same argmax at every position and the same 12 greedy tokens. Q8_0 / Q4_0 matrices: 0 .. 4.2e-3 from
llama.cpp (both round the same 8-bit activations; the tiny random routers make the reference choose other experts
there) and the same 12 greedy tokens. ernie4_5-moe files with interleave_moe_layer_step > 1 are left out: llama.cpp's
loader asks for experts in every layer after the leading dense ones (its graph runs the step's dense layers), so it
cannot load them; we run them as its graph and Hugging Face's model do (tests/test_moe_archs.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import agrees_with_llama_cpp  # noqa: E402
from test_moe_archs import VARIANTS, write  # noqa: E402

LLAMA_CPP_REL_RMS = 1e-5       # f32 (measured 2.9e-7 .. 4.4e-7)
LLAMA_CPP_QUANT_REL_RMS = 2e-2   # Q8_0 / Q4_0: the same 8-bit activations (measured 0 .. 4.2e-3)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
LOADABLE = [v for v in VARIANTS if v != "ernie4_5-moe_step2"]


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("variant", LOADABLE)
def test_f32(tmp_path, variant, seed):
    agrees_with_llama_cpp(write(tmp_path / f"{variant}-{seed}.gguf", variant, seed=seed), PROMPT, LLAMA_CPP_REL_RMS,
                          same_argmax=True)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", LOADABLE)
def test_quantized(tmp_path, variant, dtype):
    agrees_with_llama_cpp(write(tmp_path / f"{variant}-{dtype}.gguf", variant, dtype=dtype), PROMPT,
                          LLAMA_CPP_QUANT_REL_RMS, same_argmax=True)


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("variant", ["glm4moe", "bailingmoe2", "ernie4_5-moe", "hunyuan-moe", "olmoe"])
def test_quantizer_writes_llama_quantizes_file(tmp_path, variant, ftype):
    """powerinfer.quantize on the tiny files (experts, shared experts, selection biases, glm4moe's and bailingmoe2's MTP
    layer, bailingmoe2's fused attn_qkv; mostly fallback types at n_embd 64): llama-quantize's file byte for byte."""
    import ctypes

    from powerinfer.quant_rules import FTYPE, QuantOptions
    from powerinfer.quantize import quantize_file
    src, ours, theirs = tmp_path / "f32.gguf", tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    write(src, variant, seed=3)
    quantize_file(src, ours, QuantOptions(ftype=FTYPE[ftype]))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = FTYPE[ftype], 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(theirs).encode(), ctypes.byref(p)) == 0
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.mark.parametrize("variant", ["olmoe", "hunyuan-moe", "ernie4_5-moe", "glm4moe_qk_norm"])
def test_expert_weights_scale_key(tmp_path, variant):
    """expert_weights_scale 2.0 in the file: applied where llama.cpp's loader reads it (glm4moe), not where it does not
    (olmoe, hunyuan-moe, ernie4_5-moe; 2.9e-7 .. 4.0e-7 from llama.cpp either way)."""
    agrees_with_llama_cpp(write(tmp_path / f"{variant}.gguf", variant, meta={"expert_weights_scale": 2.0}),
                          PROMPT, LLAMA_CPP_REL_RMS, same_argmax=True)
