"""Helpers of the GPU suite: the two APIs (CPU powerinfer.h through powerinfer._ffi, GPU
powerinfer_cuda.h through powerinfer.gpu_split.cuda_api), pi_tensor views and dtype encoders."""
from __future__ import annotations

import weakref

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from powerinfer import _ffi
from powerinfer import gpu_split

F32, F16, Q4_0, Q8_0, BF16, Q4_K, I32 = 0, 1, 2, 8, 30, 12, 26
WEIGHT_TYPES = [F32, F16, BF16, Q8_0, Q4_0]
NAMES = {F32: "f32", F16: "f16", BF16: "bf16", Q8_0: "q8_0", Q4_0: "q4_0"}
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q8_0: (32, 34), Q4_0: (32, 18), I32: (1, 4), Q4_K: (256, 144)}

cpu_ffi, cpu = _ffi.ffi, _ffi.lib


def gpu_api():
    api = gpu_split.cuda_api()
    return api if api else (None, None)


def gpu_ready() -> tuple[bool, str]:
    ffi, lib = gpu_api()
    if lib is None:
        return False, "libpowerinfer has no powerinfer_cuda.h API"
    if lib.pi_cuda_compiled() == 0:
        return False, "libpowerinfer built without -DPI_CUDA=ON / -DPI_HIP=ON"
    if lib.pi_cuda_available() == 0:
        return False, "no GPU device"
    return True, ""


def encode(x: np.ndarray, t: int) -> np.ndarray:
    """f32 rows (..., n) -> the buffer of a tensor of type t (f32, uint16 or uint8 blocks)."""
    x = np.ascontiguousarray(x, np.float32)
    if t == F32:
        return x.copy()
    if t == F16:
        return x.astype(np.float16).view(np.uint16)
    if t == BF16:
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.ascontiguousarray(quantize(x, {Q8_0: Q.Q8_0, Q4_0: Q.Q4_0}[t]))


def decode(raw: np.ndarray, t: int) -> np.ndarray:
    if t == F32:
        return raw.astype(np.float32)
    if t == F16:
        return raw.view(np.float16).astype(np.float32)
    if t == BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return dequantize(raw, {Q8_0: Q.Q8_0, Q4_0: Q.Q4_0}[t]).astype(np.float32)


def tensor(ffi, arr: np.ndarray, t: int | None = None):
    """pi_tensor (of this ffi) over numpy arr, GGUF order (ne[0] = last axis). The tensor keeps arr alive
    (a temporary array would otherwise be freed while the op reads it); a copy of the struct (tensor(...)[0])
    does not: ffn_weights keeps its own."""
    if t is None:
        t = {np.dtype(np.float32): F32, np.dtype(np.int32): I32}[arr.dtype]
    bs, bb = BLOCK[t]
    ne = list(arr.shape[::-1])
    nb = list(arr.strides[::-1])
    if bs > 1:
        ne[0] = arr.shape[-1] // bb * bs
        nb[0] = bb
    for _ in range(len(ne), 4):
        ne.append(1)
        nb.append(nb[-1] * ne[-2])
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t, arr.ndim
    for i in range(4):
        p.ne[i], p.nb[i] = ne[i], nb[i]
    p.data = ffi.cast("void *", arr.__array_interface__["data"][0])
    weakref.finalize(p, _keep_until_freed, arr)
    return p


def _keep_until_freed(*arrays):
    """weakref.finalize's callback: its arguments (the arrays) live as long as the cdata they back."""


def ffn_weights(ffi, gate, up, down_t, t):
    w = ffi.new("pi_sparse_ffn_weights *")
    if gate is not None:
        w.gate = tensor(ffi, gate, t)[0]
    w.up = tensor(ffi, up, t)[0]
    w.down_t = tensor(ffi, down_t, t)[0]
    weakref.finalize(w, _keep_until_freed, gate, up, down_t)
    return w


def check(ffi, lib, status, what=""):
    if status != 0:
        raise AssertionError(f"{what}: status {status}: {ffi.string(lib.pi_last_error()).decode()}")


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (0 when both are zero)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    return float(np.abs(got - ref).max(initial=0.0)) / scale
