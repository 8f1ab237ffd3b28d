"""LoRA adapter files (llama.cpp's GGUF adapter layout, tests/model_files.write_lora) run by llama.cpp
(llama-cpp-python, lora_path / lora_scale) and by us: the logits of a 16-token prompt agree, so both read the same
pairs, shapes and alpha (and apply scale * alpha / r) -- every linear weight, the output head, an f16 adapter of odd
rank. f32 weights and KV cache on both sides: the remaining difference is float32 summation order (REL_RMS, measured
values in parentheses), and for an f16 adapter llama.cpp's rounding of the activations to f16 before an f16 weight's
dot products (ours keep them f32: within 6e-7 of the float64 reference of the merged weights there, llama.cpp
1.2e-3)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import logits_all, rel_rms  # noqa: E402
from model_files import LORA_ALL_LINEAR, write_arch_model, write_lora  # noqa: E402
from powerinfer.lora import LoraAdapter  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]
REL_RMS = {"f32": 1e-5,     # (measured 5e-7 and 1.2e-6)
           "f16": 3e-3}     # (measured 1.2e-3)


@pytest.mark.parametrize("arch,targets,rank,dtype,scale", [
    ("llama", ("attn_q", "attn_v"), 8, "f32", 1.0),
    ("llama", LORA_ALL_LINEAR + ("output",), 5, "f16", 0.6),
    ("qwen2", LORA_ALL_LINEAR, 16, "f32", -0.8),
])
def test_lora_logits_agree_with_llama_cpp(tmp_path, arch, targets, rank, dtype, scale):
    base, adapter = tmp_path / f"tiny-{arch}.gguf", tmp_path / "adapter.gguf"
    write_arch_model(base, arch, seed=5)
    write_lora(adapter, base, targets=targets, rank=rank, alpha=2.0 * rank, dtype=dtype, seed=6)
    ll = llama_cpp.Llama(str(base), n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=1,
                         type_k=0, type_v=0, lora_path=str(adapter), lora_scale=scale)
    ll.eval(PROMPT)
    theirs = np.array(ll.scores[:len(PROMPT)], dtype=np.float64)
    model = pi.Model(base)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1)
    ctx.set_lora([(LoraAdapter(adapter, model), scale)])
    ours = logits_all(ctx, PROMPT)
    base_logits = logits_all(pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"{arch} {dtype} rank {rank}: relative RMS difference {err:.2e} (adapter's effect "
          f"{rel_rms(base_logits, theirs):.2e})")
    assert err < REL_RMS[dtype], err
    assert rel_rms(base_logits, theirs) > 100 * REL_RMS[dtype]
