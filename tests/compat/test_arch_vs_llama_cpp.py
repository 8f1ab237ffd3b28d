"""The tiny random f32 models of tests/model_files.py (llama, qwen2, qwen3, gemma3) run by llama.cpp
(llama-cpp-python) and by us: the logits of a 16-token prompt must agree.

Both sides use f32 weights and an f32 KV cache, so no activation is quantized and the remaining
differences are float32 summation order, plus, for gemma3, llama.cpp's GELU, which it evaluates
through a table of f16 inputs (ggml's GGML_GELU_FP16): up to ~1e-3 relative per FFN activation.
Tolerances: REL_RMS below (relative RMS of the logits, measured values in parentheses; for gemma3
8e-5 when the numpy reference emulates the f16 GELU table).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from model_files import make_weights, write_arch_model  # noqa: E402

REL_RMS = {"llama": 1e-5,     # (measured 4e-7)
           "llama-ff": 1e-5,  # llama with rope_freqs.weight (Llama 3.1-style frequency factors; measured 4e-7)
           "qwen2": 1e-5,     # (measured 4e-7)
           "qwen3": 1e-5,     # (measured 3.5e-7)
           "gemma3": 3e-3}    # (measured 4.5e-4: the f16 GELU table)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


def rel_rms(a, b) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.mark.parametrize("arch", ["llama", "llama-ff", "qwen2", "qwen3", "gemma3"])
def test_logits_agree_with_llama_cpp(tmp_path, arch):
    path = tmp_path / f"tiny-{arch}.gguf"
    if arch == "llama-ff":
        write_arch_model(path, "llama", weights=make_weights("llama", 5, rope_freqs=True))
    else:
        write_arch_model(path, arch, seed=5)
    ll = llama_cpp.Llama(str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1,
                         type_k=0, type_v=0)   # GGML_TYPE_F32 KV cache
    ll.eval(PROMPT)
    theirs = np.array(ll.scores[:len(PROMPT)], dtype=np.float64)
    ctx = pi.Context(pi.Model(path), n_ctx=64, kv_type="f32", n_threads=1)
    ctx.decode(PROMPT, logits="all")
    ours = np.stack([ctx.logits(i) for i in range(len(PROMPT))])
    err = rel_rms(ours, theirs)
    print(f"{arch}: relative RMS difference {err:.2e}")
    assert err < REL_RMS[arch], err
    assert np.array_equal(ours.argmax(axis=1), theirs.argmax(axis=1))
