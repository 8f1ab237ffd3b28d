"""The tiny random lfm2 files of tests/model_files.py (LFM2: three short conv layers of kernel 3 and two attention
layers of 4 heads of 16 with 2 KV heads, q/k norms; SwiGLU FFN 96; the output tied to token_embd) run by llama.cpp
(llama-cpp-python, f32 KV cache) and by us.

Measured (seeds 0 and 3): see LLAMA_CPP_REL_RMS and the printed differences; the same argmax at every position and the
same 12 greedy tokens in f32, Q8_0 and Q4_0."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import QUANT_REL_RMS, greedy_both, llama_cpp_eval, logits_all, rel_rms  # noqa: E402
from model_files import write_lfm2_model  # noqa: E402

LLAMA_CPP_REL_RMS = 1e-5
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


def agrees_with_llama_cpp(path, bound: float) -> float:
    """Our logits of PROMPT within bound of llama.cpp's, the same 12 greedy tokens; returns the difference."""
    model = pi.Model(path)
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    ll, theirs = llama_cpp_eval(path, PROMPT)
    err = rel_rms(ours, theirs)
    print(f"{path.name}: {err:.2e} from llama.cpp")
    assert err < bound, err
    theirs_greedy, ours_greedy = greedy_both(ll, model, PROMPT, 12)
    assert ours_greedy == theirs_greedy
    return err


@pytest.mark.parametrize("seed", [0, 3])
def test_f32(tmp_path, seed):
    f = tmp_path / f"lfm2-{seed}.gguf"
    write_lfm2_model(f, seed=seed)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert np.array_equal(ours.argmax(1), llama_cpp_eval(f, PROMPT)[1].argmax(1))
    agrees_with_llama_cpp(f, LLAMA_CPP_REL_RMS)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized(tmp_path, dtype):
    f = tmp_path / f"lfm2-{dtype}.gguf"
    write_lfm2_model(f, dtype=dtype)
    agrees_with_llama_cpp(f, QUANT_REL_RMS)


def test_separate_output(tmp_path):
    """An untied output.weight (the loader's other branch) read the same way by both."""
    from model_files import lfm2_weights
    w = lfm2_weights(1)
    w["output.weight"] = (np.random.default_rng(5).standard_normal((320, 64)) / 8).astype(np.float32)
    f = tmp_path / "lfm2-output.gguf"
    write_lfm2_model(f, weights=w)
    agrees_with_llama_cpp(f, LLAMA_CPP_REL_RMS)
