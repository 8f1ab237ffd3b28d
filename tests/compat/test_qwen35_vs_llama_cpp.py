"""The tiny random qwen35 / qwen35moe / qwen3next files of tests/model_files.py (QWEN35: three gated delta net layers
with 2 key and 4 value heads of 32 and a conv of 4, two full-attention layers with an output gate; the FFN dense, or 4
experts (2 per token) with a gated shared expert) run by llama.cpp (llama-cpp-python, f32 KV cache) and by us.

f32 weights (measured at seeds 0 and 3): 4e-7 .. 1.1e-6 from llama.cpp, the same argmax at every position and the same
12 greedy tokens (llama.cpp's recurrence is its fused gated_delta_net op, ours the same order of operations per state
row). Q8_0 / Q4_0 matrices: 0 .. 1.1e-2 from llama.cpp (mostly its bits: both round the same 8-bit activations); the
same 12 greedy tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import QUANT_REL_RMS, agrees_with_llama_cpp, llama_cpp_eval, logits_all  # noqa: E402
from model_files import write_qwen35_model  # noqa: E402

LLAMA_CPP_REL_RMS = 1e-5   # f32 (measured 4e-7 .. 1.1e-6)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
ARCHS = ("qwen35", "qwen35moe", "qwen3next")


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_f32(tmp_path, arch, seed):
    f = tmp_path / f"{arch}-{seed}.gguf"
    write_qwen35_model(f, arch, seed=seed)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert np.array_equal(ours.argmax(1), llama_cpp_eval(f, PROMPT)[1].argmax(1))
    agrees_with_llama_cpp(f, PROMPT, LLAMA_CPP_REL_RMS)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized(tmp_path, arch, dtype):
    f = tmp_path / f"{arch}-{dtype}.gguf"
    write_qwen35_model(f, arch, dtype=dtype)
    agrees_with_llama_cpp(f, PROMPT, QUANT_REL_RMS)


def test_recurrent_layers_flags(tmp_path):
    """attention.recurrent_layers (a flag per layer) instead of full_attention_interval: the same file layout read the
    same way by both."""
    f = tmp_path / "flags.gguf"
    write_qwen35_model(f, "qwen35", meta={"full_attention_interval": None,
                                          "attention.recurrent_layers": [True, False, True, False, True]})
    agrees_with_llama_cpp(f, PROMPT, LLAMA_CPP_REL_RMS)
