"""A control vector through llama.cpp (llama-cpp-python's llama_set_adapter_cvec over the rows from layer 1, as its
common loader passes them) and through ours (powerinfer.control_vector): the logits of a prompt agree. f32 weights
and KV cache on both sides (REL_RMS, the measured value in parentheses)."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import logits_all, rel_rms  # noqa: E402
from model_files import write_arch_model, write_control_vector  # noqa: E402
from powerinfer.control_vector import load_control_vectors  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
REL_RMS = 1e-5     # (measured 4e-7)


@pytest.mark.parametrize("start,end", [(1, 2), (2, 2)])
def test_control_vector_agrees_with_llama_cpp(tmp_path, start, end):
    base = tmp_path / "tiny-llama.gguf"
    w = write_arch_model(base, "llama", seed=5)
    n_embd = w["token_embd.weight"].shape[1]
    write_control_vector(tmp_path / "cv.gguf", n_embd, [1, 2], seed=3, scale=1.0)
    model = pi.Model(base)
    data = load_control_vectors(model, [(tmp_path / "cv.gguf", 0.7)])        # [n_layer, n_embd], row N: direction.N
    ll = llama_cpp.Llama(str(base), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1,
                         type_k=0, type_v=0)
    rows = np.ascontiguousarray(data[1:])                                      # llama.cpp's buffer starts at layer 1
    rc = llama_cpp.llama_set_adapter_cvec(ll.ctx, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), rows.size,
                                          n_embd, start, end)
    assert rc == 0
    ll.eval(PROMPT)
    theirs = np.array(ll.scores[:len(PROMPT)], dtype=np.float64)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1)
    ctx.set_control_vector(data, start, end)
    ours = logits_all(ctx, PROMPT)
    base_logits = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"layers {start}..{end}: relative RMS difference {err:.2e} (the vector's effect "
          f"{rel_rms(base_logits, theirs):.2e})")
    assert err < REL_RMS, err
    assert rel_rms(base_logits, theirs) > 100 * REL_RMS
