"""Whole-model GPU checks of issue 6: hybrid (hot rows on the GPU, cold on the CPU) greedy tokens equal
CPU-only ones, and the device memory a hybrid context takes stays under its budget.

The same checks run on the emulated device in every CI run (tests/test_hybrid.py); here they run on
the real one, whose kernels sum in their own order, so tokens (not logits bits) are compared. The
model: $PI_GPU_TEST_MODEL, else the bundled models/*/*.powerinfer.gguf with its activation/ folder
(copied, so the .gpuidx is written next to the copy), else a tiny random PWRI model.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_helpers import gpu_api

import powerinfer as pi
from powerinfer import gpu_split as gs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))

# cudaMemGetInfo also sees what the driver allocates for itself after the context exists (module
# loading, per-stream buffers): the measured drop in free memory may exceed the library's own
# allocations by this much.
DRIVER_SLACK = 64 << 20
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]
N_GEN = 24


@pytest.fixture(scope="module")
def sparse_model(tmp_path_factory) -> Path:
    env = os.environ.get("PI_GPU_TEST_MODEL")
    if env:
        return Path(env)
    for p in sorted(REPO.glob("models/*/*.powerinfer.gguf")):
        if (p.parent / "activation").is_dir():
            import shutil
            d = tmp_path_factory.mktemp("bundled")
            shutil.copy(p, d / p.name)
            shutil.copytree(p.parent / "activation", d / "activation")
            return d / p.name
    from sparse_model import write_sparse_model
    import torch
    d = tmp_path_factory.mktemp("hybrid")
    path = write_sparse_model(d / "tiny.powerinfer.gguf", dtype="f16", ranks=(32, 64, 32, 64), n_ff=512, seed=3)
    (d / "activation").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        torch.save(torch.tensor(rng.pareto(1.5, 512), dtype=torch.float32), d / "activation" / f"activation_{i}.pt")
    return path


def greedy(ctx, prompt, n):
    ctx.decode(prompt)
    out = []
    for _ in range(n):
        tok = int(np.argmax(ctx.logits(-1)))
        out.append(tok)
        ctx.decode([tok])
    return out


def budgets(path: Path, model, n_ctx: int):
    """Dense part only, dense + half of the FFN, everything (the library's own compute bytes counted)."""
    info = gs.ModelInfo.from_gguf(path)
    comp = pi._ffi.lib.pi_offload_compute_bytes(model._ptr, 0, n_ctx, n_ctx)
    plan = gs.plan_budget(info, 1 << 50, n_ctx=n_ctx, n_batch=n_ctx, compute_bytes=comp)
    groups = -(-info.n_ff // gs.GROUP) * gs.GROUP
    all_ffn = info.n_layer * (groups * plan.neuron_bytes + 4 * gs.ALIGN)
    return [plan.dense_bytes, plan.dense_bytes + all_ffn // 2, plan.dense_bytes + all_ffn]


def test_hybrid_greedy_tokens_equal_cpu(sparse_model):
    model = pi.Model(sparse_model)
    cpu = greedy(pi.Context(model, n_ctx=128, vram_budget=0), PROMPT, N_GEN)
    for budget in budgets(sparse_model, model, 128):
        ctx = pi.Context(model, n_ctx=128, vram_budget=budget, reset_gpu_index=True)
        assert ctx.offload is not None and ctx.offload.backend in ("cuda", "hip", "CUDA", "HIP"), ctx.gpu_warnings
        assert greedy(ctx, PROMPT, N_GEN) == cpu, f"budget {budget}"


def test_dense_ngl_tokens_equal_cpu(tmp_path):
    from make_test_model import write_model
    path = tmp_path / "llama-q4_0.gguf"
    write_model(path, dtype="q4_0", n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=3)
    model = pi.Model(path)
    cpu = greedy(pi.Context(model, n_ctx=128), PROMPT, N_GEN)
    for ngl in (1, 3, -1):
        ctx = pi.Context(model, n_ctx=128, n_gpu_layers=ngl)
        assert ctx.offload is not None
        assert greedy(ctx, PROMPT, N_GEN) == cpu, f"-ngl {ngl}"


def test_device_memory_stays_under_budget(sparse_model):
    ffi, lib = gpu_api()
    model = pi.Model(sparse_model)
    for budget in budgets(sparse_model, model, 256):
        free0, total = ffi.new("int64_t *"), ffi.new("int64_t *")
        assert lib.pi_cuda_mem_get_info(free0, total) == 0
        base = lib.pi_cuda_allocated_bytes()
        lib.pi_cuda_reset_peak()
        ctx = pi.Context(model, n_ctx=256, vram_budget=budget)
        greedy(ctx, PROMPT * 4, 8)
        free1 = ffi.new("int64_t *")
        assert lib.pi_cuda_mem_get_info(free1, total) == 0
        assert lib.pi_cuda_peak_allocated_bytes() - base <= budget
        assert free0[0] - free1[0] <= budget + DRIVER_SLACK
        del ctx
