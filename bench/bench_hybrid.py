#!/usr/bin/env python3
"""Decode speed of a sparse 7B-shaped file on the GPU at VRAM budgets that hold the dense part (attention,
predictors, head, KV cache) and 0/25/50/100% of the FFN neurons, against our CPU-only run and against the
dense twin with -ngl at the same device memory.

    python bench/bench_hybrid.py [--dir DIR] [--n-layer 8] [--tokens 48] [--threads N]

The file comes from bench/make_sparse_model.py (7B layer shapes, --n-layer of them, q4_0), its
activation statistics from the generator's firing rates (written as activation/activation_N.pt).
On a machine without a GPU set POWERINFER_EMULATED_GPU_MIB=N to run the same placements on the
emulated device (the speeds are then CPU speeds: a check of the code path, not a benchmark).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tools"))

import powerinfer as pi  # noqa: E402
from powerinfer import gpu_split as gs  # noqa: E402
from powerinfer._ffi import lib  # noqa: E402


def make(d: Path, n_layer: int, preset: str) -> tuple[Path, Path]:
    from make_sparse_model import PRESETS, write_models
    sparse, dense = d / f"s{preset}-{n_layer}.powerinfer.gguf", d / f"s{preset}-{n_layer}.dense.gguf"
    if sparse.exists() and dense.exists() and (d / "activation").is_dir():
        return sparse, dense
    shape = {**PRESETS[preset], "n_layer": n_layer}
    t0 = time.time()
    summary = write_models(sparse, dense_out=dense, dtype="q4_0", log=lambda *a, **k: None, **shape)
    import torch
    if (d / "activation").is_dir():
        import shutil
        shutil.rmtree(d / "activation")
    (d / "activation").mkdir()
    for il, p in enumerate(summary["preds"]):
        stats = torch.tensor(np.asarray(p.p) * 1000.0, dtype=torch.float32)   # firing rates as token counts
        torch.save(stats, d / "activation" / f"activation_{il}.pt")
    print(f"wrote {sparse.name} and {dense.name} ({n_layer} layers of {preset} shape) in {time.time() - t0:.0f}s",
          flush=True)
    return sparse, dense


def speed(ctx, n_tokens: int, prompt: list[int]) -> float:
    ctx.kv_clear()
    ctx.decode(prompt)
    tok = int(np.argmax(ctx.logits(-1)))
    t0 = time.perf_counter()
    for _ in range(n_tokens):
        ctx.decode([tok])
        tok = int(np.argmax(ctx.logits(-1)))
    return n_tokens / (time.perf_counter() - t0)


def most_layers_within(model, n_max: int, budget: int, kw: dict) -> int:
    """The largest -ngl (0..n_max) whose device bytes fit in budget: a bisection (bytes grow with -ngl)."""
    lo, hi = 0, n_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        c = pi.Context(model, n_gpu_layers=mid, **kw)
        fits = c.offload is not None and c.offload.total_bytes <= budget
        del c
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return lo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=str(ROOT / "build-cuda" / "bench-hybrid"))
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--preset", default="7b", help="bench/make_sparse_model.py shape (7b, small, tiny)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("-c", "--ctx-size", type=int, default=256)
    a = ap.parse_args(argv)
    if lib.pi_device_count() == 0:
        print("no GPU device (and POWERINFER_EMULATED_GPU_MIB unset): nothing to measure")
        return 77
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    sparse, dense = make(d, a.n_layer, a.preset)
    prompt = list(range(1, 33))
    kw = dict(n_ctx=a.ctx_size, n_batch=64, n_threads=a.threads)
    ms, md = pi.Model(sparse), pi.Model(dense)
    print(f"{pi.system_info()}\nmodel: {ms.describe()}", flush=True)
    cpu = speed(pi.Context(ms, vram_budget=0, **kw), a.tokens, prompt)
    print(f"CPU only (sparse):           {cpu:8.2f} t/s", flush=True)
    info = gs.ModelInfo.from_gguf(sparse)
    comp = lib.pi_offload_compute_bytes(ms._ptr, 0, a.ctx_size, 64)
    plan = gs.plan_budget(info, 1 << 50, n_ctx=a.ctx_size, n_batch=64, compute_bytes=comp)
    all_ffn = info.n_layer * (-(-info.n_ff // gs.GROUP) * gs.GROUP * plan.neuron_bytes + 4 * gs.ALIGN)
    print(f"device bytes: dense part {plan.dense_bytes / 2**20:.1f} MiB, all FFN neurons {all_ffn / 2**20:.1f} MiB",
          flush=True)
    for frac in (0.0, 0.25, 0.5, 1.0):
        budget = plan.dense_bytes + int(all_ffn * frac)
        lib.pi_device_reset_peak()
        ctx = pi.Context(ms, vram_budget=budget, reset_gpu_index=True, **kw)
        st = ctx.offload
        where = ("CPU (budget below the dense part)" if st is None else
                 f"{st.n_hot / st.n_neurons:6.1%} neurons hot, {st.total_bytes / 2**20:8.1f} MiB used")
        t_s = speed(ctx, a.tokens, prompt)
        peak = lib.pi_device_peak_bytes()
        del ctx
        ngl, t_d = most_layers_within(md, info.n_layer + 1, budget, kw), None
        if ngl:
            c = pi.Context(md, n_gpu_layers=ngl, **kw)
            t_d = speed(c, a.tokens, prompt)
            del c
        dense_s = f"dense -ngl {ngl}: {t_d:8.2f} t/s" if t_d else "dense: no layer fits"
        print(f"budget dense + {frac:4.0%} FFN ({budget / 2**20:8.1f} MiB): sparse {t_s:8.2f} t/s "
              f"({t_s / cpu:5.2f}x CPU; {where}; peak {peak / 2**20:.1f} MiB) | {dense_s}", flush=True)
        assert peak <= max(budget, 1), f"device peak {peak} > budget {budget}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
