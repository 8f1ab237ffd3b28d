"""The tiny phi3 file of tests/test_phi3.py (fused tensors, partial NEOX rope, long / short rope factors, a rope
attention factor) through llama.cpp (llama-cpp-python) and through us: the logits of a prompt agree within the
original context (short factors) and past it (long factors). f32 weights and KV cache on both sides (REL_RMS, the
measured values in parentheses)."""
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
REL_RMS = 1e-5     # (measured: short 3e-7, long 3e-7)


@pytest.mark.parametrize("n_ctx,n", [(256, 16), (1024, 16)], ids=["short", "long"])   # the original context: 512
def test_phi3_agrees_with_llama_cpp(tmp_path, n_ctx, n):
    path = tmp_path / "tiny-phi3.gguf"
    write_arch_model(path, "phi3", seed=3)
    theirs = llama_cpp_logits(path, PROMPT[:n], n_ctx=n_ctx)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=n_ctx, kv_type="f32", n_threads=1), PROMPT[:n])
    err = rel_rms(ours, theirs)
    print(f"n_ctx {n_ctx}: relative RMS difference {err:.2e}")
    assert err < REL_RMS, err
