"""Placing a context on the GPU: --vram-budget for sparse (PWRI) files, -ngl for dense GGUF files.

Context calls place() once, before its first decode. The placement is decided here and handed
to the C core (pi_context_offload), which counts every device byte against the budget before it
allocates anything and runs one forward pass for every placement:

* sparse files: gpu_split plans the budget (attention, predictors, norms, output head, KV cache,
  the library's own compute buffers, then hot FFN rows) and takes the hot neurons from the
  ``<model>.generated.gpuidx`` file (made or reused by ensure_gpu_index); every layer's attention
  runs on the device, its hot neurons there too, its cold neurons on the CPU;
* dense files: llama.cpp's -ngl: the last N layers on the device, the output head too when
  N > n_layer (-1 = all).

A library or machine without a device, a budget too small for the dense part, or a flag that does
not apply to the file (vram_budget on a dense file, n_gpu_layers on a sparse one) gives one warning
and runs on the CPU. The log lines follow the original's (llm_load_sparse_model_tensors,
llm_load_gpu_split, llm_load_tensors).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from . import gpu_split as gs
from ._ffi import PowerInferError, check, ffi, lib

log = logging.getLogger("powerinfer")
MIB = 1 << 20


@dataclass
class OffloadStats:
    device: int
    backend: str
    device_name: str
    n_layer: int
    n_attn_layers: int
    n_ffn_layers: int
    output: bool
    n_hot: int
    n_neurons: int
    model_bytes: int
    ffn_bytes: int
    kv_bytes: int
    compute_bytes: int
    total_bytes: int


def _warn(ctx, msg: str) -> None:
    log.warning("warning: %s", msg)
    ctx.gpu_warnings.append(msg)


def _stats(ctx, device: int) -> OffloadStats | None:
    s = ffi.new("pi_offload_stats *")
    check(lib.pi_context_offload_stats(ctx._ptr, s), "offload stats")
    if s.device < 0:
        return None
    info = gs.device_info(device) or {}
    hp = ctx.model.hparams
    return OffloadStats(device=s.device, backend=info.get("backend", "?"), device_name=info.get("name", "?"),
                        n_layer=hp.n_layer, n_attn_layers=s.n_attn_layers, n_ffn_layers=s.n_ffn_layers,
                        output=bool(s.output), n_hot=int(s.n_hot), n_neurons=hp.n_layer * hp.n_ff,
                        model_bytes=int(s.model_bytes), ffn_bytes=int(s.ffn_bytes), kv_bytes=int(s.kv_bytes),
                        compute_bytes=int(s.compute_bytes), total_bytes=int(s.total_bytes))


def _offload(ctx, placements, output: bool, budget: int, device: int) -> bool:
    """pi_context_offload; False (and one warning) when the device cannot run this model (falcon/opt,
    types without GPU kernels): the context stays on the CPU. Other failures raise."""
    n = len(placements)
    arr = ffi.new("pi_layer_placement[]", n)
    keep = []
    for i, (attn, ffn, hot) in enumerate(placements):
        arr[i].attn = lib.PI_PLACE_DEVICE if attn else lib.PI_PLACE_CPU
        arr[i].ffn = lib.PI_PLACE_DEVICE if ffn else lib.PI_PLACE_CPU
        if hot is not None and len(hot):
            h = np.ascontiguousarray(hot, dtype=np.int32)
            keep.append(h)
            arr[i].n_hot = len(h)
            arr[i].hot = ffi.from_buffer("int32_t[]", h)
    p = ffi.new("pi_offload_params *")
    p.device, p.budget_bytes, p.n_layer, p.layers = device, max(0, int(budget)), n, arr
    p.output = lib.PI_PLACE_DEVICE if output else lib.PI_PLACE_CPU
    try:
        check(lib.pi_context_offload(ctx._ptr, p), "offloading to the GPU")
    except PowerInferError as e:
        if e.status != lib.PI_ERR_UNSUPPORTED:
            raise
        _warn(ctx, f"{e}: running on the CPU")
        return False
    return True


def _info(ctx, fmt: str, *args) -> None:
    line = fmt % args
    ctx.gpu_log.append(line)
    log.info("%s", line)


def _log_sparse(ctx, st: OffloadStats, budget: int) -> None:
    _info(ctx, "llm_load_sparse_model_tensors: using %s for GPU acceleration (%s)", st.backend, st.device_name)
    _info(ctx, "llm_load_sparse_model_tensors: offloaded layers from VRAM budget(%d bytes): %d/%d",
          budget, st.n_attn_layers, st.n_layer)
    _info(ctx, "llm_load_gpu_split: offloaded %.2f MiB of FFN weights to GPU (%d layers, %d of %d neurons hot)",
          st.ffn_bytes / MIB, st.n_ffn_layers, st.n_hot, st.n_neurons)
    _info(ctx, "llm_load_sparse_model_tensors: VRAM used: %.2f MiB (model %.2f MiB, KV cache %.2f MiB, "
          "compute %.2f MiB)", st.total_bytes / MIB, (st.model_bytes + st.ffn_bytes) / MIB, st.kv_bytes / MIB,
          st.compute_bytes / MIB)


def _log_dense(ctx, st: OffloadStats, n_gpu_layers: int) -> None:
    _info(ctx, "llm_load_tensors: using %s for GPU acceleration (%s)", st.backend, st.device_name)
    _info(ctx, "llm_load_tensors: offloading %d repeating layers to GPU", st.n_attn_layers)
    if st.output:
        _info(ctx, "llm_load_tensors: offloading non-repeating layers to GPU")
    _info(ctx, "llm_load_tensors: offloaded %d/%d layers to GPU", st.n_attn_layers + int(st.output), st.n_layer + 1)
    _info(ctx, "llm_load_tensors: VRAM used: %.2f MiB (model %.2f MiB, KV cache %.2f MiB, compute %.2f MiB)",
          st.total_bytes / MIB, (st.model_bytes + st.ffn_bytes) / MIB, st.kv_bytes / MIB, st.compute_bytes / MIB)


def place(ctx, *, vram_budget: int | None, reset_gpu_index: bool, disable_gpu_index: bool,
          n_gpu_layers: int | None, main_gpu: int = 0, kv_type: str | tuple[str, str] = "f16") -> None:
    """Sets ctx.gpu_plan, ctx.gpu_index, ctx.offload (OffloadStats or None) and ctx.gpu_warnings."""
    model = ctx.model
    hp = model.hparams
    n_dev = int(lib.pi_device_count())
    if vram_budget is not None and (isinstance(vram_budget, bool) or not vram_budget >= 0):
        raise ValueError(f"vram_budget must be a number of bytes >= 0, not {vram_budget!r}")
    if n_gpu_layers is not None and (isinstance(n_gpu_layers, bool) or int(n_gpu_layers) != n_gpu_layers
                                     or n_gpu_layers < -1):
        raise ValueError(f"n_gpu_layers must be an integer >= -1, not {n_gpu_layers!r}")
    if not model.sparse:
        if vram_budget is not None:
            _warn(ctx, "vram_budget / --vram-budget applies to sparse (PowerInfer) files; this dense file is "
                       "placed with n_gpu_layers / -ngl: the budget is ignored")
        if reset_gpu_index or disable_gpu_index:
            _warn(ctx, "--reset-gpu-index / --disable-gpu-index apply to sparse (PowerInfer) files: ignored")
        ngl = int(n_gpu_layers or 0)
        if ngl == 0:
            return
        if n_dev == 0:
            _warn(ctx, f"n_gpu_layers = {ngl}: no GPU device ({lib_backend()}): running on the CPU")
            return
        n = hp.n_layer if ngl < 0 else min(ngl, hp.n_layer)
        first = hp.n_layer - n
        output = ngl < 0 or ngl > hp.n_layer
        # a mixture of experts runs its FFN on the CPU: the attention (and the head) go to the device
        placements = [(il >= first, il >= first and not hp.n_expert, None) for il in range(hp.n_layer)]
        # a layer that reads an earlier layer's KV cache (gemma4's shared KV layers) needs that cache beside its
        # attention: the source's attention (and cache) goes to the device with it, its FFN stays where -ngl says
        pulled = sorted({g.kv_source for il, g in enumerate(hp.layers()) if il >= first and g.kv_source < first})
        for src in pulled:
            placements[src] = (True,) + placements[src][1:]
        if pulled:
            _info(ctx, "offload: the attention of layer(s) %s on the device too: later layers read their KV caches",
                  ", ".join(map(str, pulled)))
        if hp.n_expert:
            _warn(ctx, "mixture of experts: the experts run on the CPU; -ngl places the attention only")
        if _offload(ctx, placements, output, 0, main_gpu):
            ctx.offload = _stats(ctx, main_gpu)
        if ctx.offload:
            _log_dense(ctx, ctx.offload, ngl)
        return
    # sparse (PWRI) files
    if n_gpu_layers:
        _warn(ctx, "sparse inference ignores n_gpu_layers, you can use --vram-budget option instead")
    if n_dev == 0:
        if vram_budget is not None:
            _warn(ctx, f"vram_budget given but there is no GPU device ({lib_backend()}): running on the CPU")
        return
    explicit = vram_budget is not None
    budget = int(vram_budget) if explicit else gs.default_budget_bytes(main_gpu)
    if budget is None:
        return
    auto = gs.default_budget_bytes(main_gpu)
    if explicit and auto is not None and budget > auto:
        _warn(ctx, f"vram_budget {budget / 2**30:.2f} GiB is more than the device has free (minus "
                   f"{gs.DEFAULT_MARGIN >> 20} MiB): using {auto / 2**30:.2f} GiB")
        budget = auto
    compute = int(lib.pi_offload_compute_bytes(model._ptr, main_gpu, ctx.n_ctx, ctx.n_batch))
    if compute < 0:
        check(-1, "pi_offload_compute_bytes")
    info = gs.ModelInfo.from_gguf(model.path)
    try:
        plan, idx = gs.ensure_gpu_index(model.path, budget, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, kv_type=kv_type,
                                        explicit=False, reset=reset_gpu_index, disable=disable_gpu_index,
                                        info=info, compute_bytes=compute)
    except (gs.GpuSplitError, OSError) as e:   # e.g. a read-only model directory
        _warn(ctx, f"failed to generate gpu split ({e}), an empty one will be used")
        plan, idx = gs.plan_budget(info, budget, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, kv_type=kv_type,
                                   explicit=False, disable_gpu_index=True, compute_bytes=compute), None
    ctx.gpu_plan, ctx.gpu_index = plan, idx
    for w in plan.warnings:   # budget too small / unsupported types: one warning; the others gpu_split logged
        if not plan.offload:
            _warn(ctx, w + ": running on the CPU")
        else:
            ctx.gpu_warnings.append(w)
    if not plan.offload:
        return   # the warning above says why (budget too small, unsupported types)
    hot = [None] * hp.n_layer
    if idx is not None:
        if idx.n_layer != hp.n_layer or idx.n_ff != hp.n_ff:
            raise gs.GpuIndexError(f"{gs.gpuidx_path(model.path)} is for {idx.n_layer} layers of {idx.n_ff} neurons")
        hot = [b if len(b) else None for b in idx.buckets]
    placements = [(True, False, hot[il]) for il in range(hp.n_layer)]
    if _offload(ctx, placements, True, budget, main_gpu):
        ctx.offload = _stats(ctx, main_gpu)
    if ctx.offload:
        _log_sparse(ctx, ctx.offload, budget)


def add_gpu_args(p, *, positional_note: str = "") -> None:
    """--vram-budget, --reset-gpu-index, --disable-gpu-index, -ngl/--n-gpu-layers (the original's flags)."""
    g = p.add_argument_group("GPU offload")
    g.add_argument("--vram-budget", type=float, default=None, metavar="GIB",
                   help="PowerInfer (sparse) files: GiB of GPU memory to use: attention, predictors, KV cache and "
                        "compute buffers first, then the hottest FFN neurons (default: free GPU memory - 256 MiB; "
                        "no GPU: ignored with a warning)")
    g.add_argument("--reset-gpu-index", action="store_true",
                   help="regenerate <model>.generated.gpuidx (the hot-neuron split) even if it is up to date")
    g.add_argument("--disable-gpu-index", action="store_true",
                   help="no hot FFN neurons on the GPU (attention etc. still go there)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", type=int, default=None,
                   metavar="N", help="dense GGUF files: layers to put on the GPU, the last N (-1 or > n_layer: all, "
                                     "with the output head) (default: 0)")


def gpu_kwargs(args) -> dict:
    """Context/PowerInfer keyword arguments of the flags add_gpu_args defines (GiB -> bytes)."""
    vb = getattr(args, "vram_budget", None)
    if vb is not None and not vb >= 0:
        raise ValueError(f"--vram-budget must be >= 0 GiB, got {vb}")
    return dict(vram_budget=None if vb is None else int(vb * 2**30),
                reset_gpu_index=bool(getattr(args, "reset_gpu_index", False)),
                disable_gpu_index=bool(getattr(args, "disable_gpu_index", False)),
                n_gpu_layers=getattr(args, "n_gpu_layers", None))


def lib_backend() -> str:
    return ffi.string(lib.pi_gpu_backend_name()).decode()
