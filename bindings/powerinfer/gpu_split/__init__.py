"""Hot-neuron placement for hybrid CPU/GPU inference (spec sections 1.6, 1.7, 2, 3).

Activation statistics (``<model_dir>/activation/activation_N.pt``) and a VRAM budget become
per-layer sets of *hot* FFN neurons, whose gate/up/down_t rows are copied to the GPU; the other
(cold) neurons stay in host memory and run on the CPU.

    >>> from powerinfer import gpu_split
    >>> plan, index = gpu_split.ensure_gpu_index("m.powerinfer.gguf", budget_bytes=8 << 30)
    >>> print(plan.summary())

Pieces, each usable on its own, one module per concern (they import ``common`` and the package's
one FFI, ``_ffi``, never each other; this file composes them):

* ``stats.load_activations(dir, n_layer, n_ff)``: the statistics, one float64 vector per layer, files
  taken in **numeric** order (the original exporter sorted them as strings: with >= 11 layers
  layer 2 got ``activation_10.pt``'s hot set).
* ``solver.solve_greedy(acts, capacity_neurons)``: the solver. Each layer's activations are sorted
  descending and cut into groups of 256; the largest group sums over all layers are taken until
  the capacity (in groups) is used up. This is exactly the original's ILP (spec 2): maximise
  sum w[l,g] x[l,g] subject to sum x <= C, x binary; every group costs the same, so the C
  largest weights are optimal. ``solve_milp`` is that ILP through ``scipy.optimize.milp``
  (the tests check that both reach the same objective). n_ff need not be a multiple of 256:
  a layer's last, shorter group costs a whole group of capacity (never more VRAM than planned).
* ``plan.plan_budget(info, budget)``: the VRAM accounting, with the sizes asked of libpowerinfer
  (row bytes, compute buffers). In the spec's priority order: attention (all layers), predictors,
  FFN norms, output head, the KV cache, the compute buffers, then hot FFN rows with what is left;
  ``plan.used_bytes <= budget`` always holds.
* ``gpuidx.write_gpuidx`` / ``read_gpuidx``: the ``<model>.generated.gpuidx`` file in the original's
  format (GGUF v3, ``PWRI`` magic, ``generic.gpu_index`` KVs, ``blk.N.gpu_idx`` /
  ``blk.N.gpu_bucket`` I32 tensors with the original ggml's I32 id 18), plus ``powerinfer_py.*``
  KVs that the original ignores: the total budget, the model file's size and mtime and a
  fingerprint of the activation files.
* ``device``: device queries and the automatic budget; ``__main__``: the command line.
* ``ensure_gpu_index(model, budget)`` (here): reuse the file only when budget, model file and
  statistics are unchanged (the original kept a smaller split when the budget grew);
  ``reset=True`` (``--reset-gpu-index``) regenerates, ``disable=True`` (``--disable-gpu-index``)
  puts no FFN rows on the GPU.

**When not even the dense part fits** (attention + predictors + norms + output + KV cache +
compute buffers): with an explicit budget (``explicit=True``, the user passed
``--vram-budget``) ``plan_budget`` raises ``BudgetError`` naming the minimum budget; with the
automatic budget (free VRAM - 256 MiB) it returns a plan with nothing offloaded and a warning,
so the model runs on the CPU. A partial dense offload (some layers' attention only) is not
done: hybrid layers need their attention, KV cache and predictor on the device.

Command line (``__main__.py``: the original's invocation, spec 2, and a friendlier one)::

    python -m powerinfer.gpu_split --activation DIR --layer N --neuron N_FF --capacity NEURONS \\
        --vram-capacity BYTES --output FILE [--batch 256] [--threshold 0]
    python -m powerinfer.gpu_split --model FILE --vram-budget GIB [-c N_CTX] [-b N_BATCH]
        [--memory-f32] [--activation DIR] [--reset-gpu-index] [--disable-gpu-index]
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .common import ALIGN, GROUP, ActivationError, BudgetError, GpuIndexError, GpuSplitError, gib, padded
from .device import DEFAULT_MARGIN, cuda_api, default_budget_bytes, device_info, gpu_available
from .gpuidx import (ARCH, GPUIDX_SUFFIX, I32_LEGACY, I32_MODERN, KV_BLOCK_COUNT, KV_VRAM_CAPACITY, GpuIndex,
                     gpuidx_path, read_gpuidx, write_gpuidx)
from .plan import (ARENA_ROUNDING, ARENAS, GPU_TYPES, ModelInfo, Plan, PlanItem, TensorSpec, compute_buffers,
                   dense_levels, ffn_row_bytes, library_compute_bytes, plan_budget, row_bytes, type_name)
from .solver import group_sums, hot_neurons, objective, solve_greedy, solve_milp
from .stats import activation_fingerprint, list_activation_files, load_activations

log = logging.getLogger("powerinfer")

KV_PREFIX = "powerinfer_py."

__all__ = ["ALIGN", "ARCH", "ARENAS", "ARENA_ROUNDING", "DEFAULT_MARGIN", "GPUIDX_SUFFIX", "GPU_TYPES", "GROUP",
           "I32_LEGACY", "I32_MODERN", "KV_BLOCK_COUNT", "KV_PREFIX", "KV_VRAM_CAPACITY", "ActivationError",
           "BudgetError", "GpuIndex", "GpuIndexError", "GpuSplitError", "ModelInfo", "Plan", "PlanItem", "TensorSpec",
           "activation_fingerprint", "compute_buffers", "cuda_api", "default_budget_bytes", "dense_levels",
           "device_info", "ensure_gpu_index", "ffn_row_bytes", "gib", "gpu_available", "gpuidx_path", "group_sums",
           "hot_neurons", "library_compute_bytes", "list_activation_files", "load_activations", "objective",
           "padded", "plan_budget", "read_gpuidx", "row_bytes", "solve_greedy", "solve_milp", "type_name",
           "write_gpuidx"]


def _model_stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {KV_PREFIX + "model_size": st.st_size, KV_PREFIX + "model_mtime_ns": st.st_mtime_ns}


def _no_statistics(plan: Plan, e: ActivationError, strict: bool) -> tuple[Plan, None]:
    """Missing or bad activation statistics: the FFN runs on the CPU, with a warning (strict: raise)."""
    if strict:
        raise e
    plan.warnings.append(f"{e}: the FFN runs on the CPU")
    log.warning("gpu_split: %s: the FFN runs on the CPU", e)
    return plan, None


def ensure_gpu_index(model_path: str | os.PathLike, budget_bytes: int, *, n_ctx: int = 512, n_batch: int = 512,
                     kv_type: str | tuple[str, str] = "f16", explicit: bool = True, reset: bool = False,
                     disable: bool = False, activation_dir: str | os.PathLike | None = None, strict: bool = False,
                     info: ModelInfo | None = None, compute_bytes: int | None = None) -> tuple[Plan, GpuIndex | None]:
    """The placement of a model under a budget, with its hot sets from `<model>.generated.gpuidx`.

    The file is reused only when it was made for the same FFN budget (split.vram_capacity) and total
    budget, from the same model file (size, mtime) and activation files; otherwise (or with
    reset=True) the solver runs and the file is rewritten. disable=True skips the index (FFN on
    the CPU). Missing activation statistics give a warning and an all-CPU FFN (strict=True raises
    ActivationError instead). Returns (plan, index or None)."""
    model_path = Path(model_path)
    info = info or ModelInfo.from_gguf(model_path)
    plan = plan_budget(info, budget_bytes, n_ctx=n_ctx, n_batch=n_batch, kv_type=kv_type, explicit=explicit,
                       disable_gpu_index=disable, compute_bytes=compute_bytes)
    if not plan.offload or plan.capacity_neurons == 0:
        return plan, None
    act_dir = Path(activation_dir) if activation_dir is not None else model_path.parent / "activation"
    try:
        fingerprint = activation_fingerprint(act_dir, info.n_layer)
    except ActivationError as e:
        return _no_statistics(plan, e, strict)
    extra = {KV_PREFIX + "vram_budget": int(budget_bytes), **_model_stamp(model_path),
             KV_PREFIX + "activation_fingerprint": fingerprint, KV_PREFIX + "group_size": GROUP,
             KV_PREFIX + "capacity_neurons": plan.capacity_neurons}
    idx_path = gpuidx_path(model_path)
    if idx_path.exists() and not reset:
        try:
            idx = read_gpuidx(idx_path)
            same = (idx.vram_capacity == plan.ffn_bytes and idx.n_layer == info.n_layer and idx.n_ff == info.n_ff
                    and all(idx.extra.get(k) == v for k, v in extra.items()))
            if same:
                log.info("gpu_split: reusing %s", idx_path)
                return plan.with_hot_counts(idx.hot_counts), idx
            log.info("gpu_split: %s was made for another budget, model or statistics: regenerating", idx_path)
        except GpuSplitError as e:
            log.warning("gpu_split: %s; regenerating it", e)
    try:
        acts = load_activations(act_dir, info.n_layer, info.n_ff)
    except ActivationError as e:
        return _no_statistics(plan, e, strict)
    counts = solve_greedy(acts, plan.capacity_neurons)
    buckets = [hot_neurons(a, c) for a, c in zip(acts, counts)]
    write_gpuidx(idx_path, buckets, info.n_ff, plan.ffn_bytes, extra)
    log.info("gpu_split: wrote %s", idx_path)
    return plan.with_hot_counts(counts), GpuIndex(info.n_ff, plan.ffn_bytes, buckets, extra)
