"""The devices libpowerinfer reports, and the automatic budget (spec 3.1: free VRAM - 256 MiB)."""
from __future__ import annotations

from typing import Any

from .._ffi import ffi, lib

DEFAULT_MARGIN = 256 << 20       # the automatic budget is free VRAM minus this (spec 3.1)


def cuda_api():
    """(ffi, lib) with the powerinfer_cuda.h functions (the package's one FFI declares both headers),
    or None when the loaded library predates them. Every build exports them (a CPU-only build:
    pi_cuda_available() == 0)."""
    try:
        lib.pi_cuda_available
    except AttributeError:
        return None
    return ffi, lib


def gpu_available() -> int:
    """Devices the library reports: CUDA/HIP GPUs, or the emulated one (POWERINFER_EMULATED_GPU_MIB)."""
    return int(lib.pi_device_count())


def device_info(device: int = 0) -> dict[str, Any] | None:
    """Backend ("cuda", "hip", "emulated"), name, total and free bytes of a device; None without one."""
    if not 0 <= device < lib.pi_device_count():
        return None
    p = ffi.new("pi_device_info *")
    if lib.pi_device_get_info(device, p) != 0:
        return None
    return {"name": ffi.string(p.name).decode(), "backend": ffi.string(p.backend).decode(),
            "total_bytes": int(p.total_bytes), "free_bytes": int(p.free_bytes)}


def default_budget_bytes(device: int = 0) -> int | None:
    """The automatic budget (spec 3.1): free VRAM minus 256 MiB; None without a GPU."""
    info = device_info(device)
    return None if info is None else max(0, info["free_bytes"] - DEFAULT_MARGIN)
