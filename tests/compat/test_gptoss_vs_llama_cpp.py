"""The tiny random gpt-oss files of tests/model_files.py (CONFIGS["gpt-oss"]: sinks, every bias, YaRN, every other
layer local under a window of 5, 4 biased experts with the OAI SwiGLU) run by llama.cpp (llama-cpp-python, f32 KV
cache) and by us.

f32 weights: the logits within REL_RMS (measured 5.2e-7 .. 5.7e-7 at seeds 3, 5, 7, 11: float32 summation orders; the
float64 reference is 4.1e-7 .. 4.4e-7 from ours) and the same argmax at every position. Each feature's absence moves the
reference 0.27 .. 0.97 from llama.cpp's logits (tests/test_gptoss.py), so llama.cpp confirms each one as we run it:
which layers are local, the sinks, the SwiGLU's clamp, the gating, the biases, YaRN.

Q8_0 matrices (the router kept f32, as llama.cpp's converter keeps ffn_gate_inp; biases and sinks f32): both engines
quantize the activations to Q8_0 the same way and sum the blocks exactly, so the logits agree more closely than in f32
(measured 7.4e-8 .. 7.8e-8 at seeds 3, 5, 7, 11, a Q8_0 router too; each is 2.3e-2 .. 4.1e-2 from the float64
reference of the dequantized weights), and 16 greedy tokens after the prompt are the same at each of those seeds.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from helpers import greedy_both, llama_cpp_eval, logits_all, rel_rms  # noqa: E402
from model_files import rewrite, write_arch_model  # noqa: E402

REL_RMS = 1e-5            # f32 (measured 5.2e-7 .. 5.7e-7)
REL_RMS_Q8_0 = 1e-6       # Q8_0 (measured 7.4e-8 .. 7.8e-8)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


@pytest.mark.parametrize("seed", [3, 5, 7])
def test_f32_logits_agree_with_llama_cpp(tmp_path, seed):
    path = tmp_path / f"tiny-gpt-oss-{seed}.gguf"
    write_arch_model(path, "gpt-oss", seed=seed)
    _, theirs = llama_cpp_eval(path, PROMPT)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"gpt-oss f32 seed {seed}: relative RMS difference {err:.2e}")
    assert err < REL_RMS, err
    assert np.array_equal(ours.argmax(axis=1), theirs.argmax(axis=1))


@pytest.mark.parametrize("seed", [3, 7])
def test_q8_0_agrees_with_llama_cpp(tmp_path, seed):
    """Q8_0 matrices, an f32 router: the prompt's logits within REL_RMS_Q8_0 and the same 16 greedy tokens."""
    raw = tmp_path / "q8_0-router-q8_0.gguf"
    w = write_arch_model(raw, "gpt-oss", seed=seed, dtype="q8_0")
    path = rewrite(raw, tmp_path / "q8_0.gguf",
                   replace={k: (v, Q.F32) for k, v in w.items() if k.endswith("ffn_gate_inp.weight")})
    ll, theirs = llama_cpp_eval(path, PROMPT)
    model = pi.Model(path)
    ours = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"gpt-oss q8_0 seed {seed}: relative RMS difference {err:.2e}")
    assert err < REL_RMS_Q8_0, err

    a, b = greedy_both(ll, model, PROMPT, 16)
    assert a == b, (a, b)
