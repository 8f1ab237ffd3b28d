"""The tiny granite, smollm3, olmo2 and glm4 files of tests/test_llama_variants.py through llama.cpp
(llama-cpp-python) and through us: the logits of a prompt agree. f32 weights and KV cache on both sides (REL_RMS,
measured in parentheses)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import llama_cpp_logits, logits_all, rel_rms  # noqa: E402
from model_files import write_arch_model  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
REL_RMS = {"granite": 1e-5,    # (measured 9e-8)
           "smollm3": 1e-5,    # (measured 4e-7)
           "olmo2": 1e-5,      # (measured 4e-7)
           "glm4": 1e-5}       # (measured 3.5e-7)


@pytest.mark.parametrize("arch", ["granite", "smollm3", "olmo2", "glm4"])
def test_agrees_with_llama_cpp(tmp_path, arch):
    path = tmp_path / f"tiny-{arch}.gguf"
    write_arch_model(path, arch, seed=3)
    theirs = llama_cpp_logits(path, PROMPT)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"{arch}: relative RMS difference {err:.2e}")
    assert err < REL_RMS[arch], err
