"""Hot-neuron placement for hybrid CPU/GPU inference (spec sections 1.6, 1.7, 2, 3).

Activation statistics (``<model_dir>/activation/activation_N.pt``) and a VRAM budget become
per-layer sets of *hot* FFN neurons, whose gate/up/down_t rows are copied to the GPU; the other
(cold) neurons stay in host memory and run on the CPU.

    >>> from powerinfer import gpu_split
    >>> plan, index = gpu_split.ensure_gpu_index("m.powerinfer.gguf", budget_bytes=8 << 30)
    >>> print(plan.summary())

Pieces, each usable on its own:

* ``load_activations(dir, n_layer, n_ff)``: the statistics, one float64 vector per layer, files
  taken in **numeric** order (the original exporter sorted them as strings: with >= 11 layers
  layer 2 got ``activation_10.pt``'s hot set).
* ``solve_greedy(acts, capacity_neurons)``: the solver. Each layer's activations are sorted
  descending and cut into groups of 256; the largest group sums over all layers are taken until
  the capacity (in groups) is used up. This is exactly the original's ILP (spec 2): maximise
  sum w[l,g] x[l,g] subject to sum x <= C, x binary; every group costs the same, so the C
  largest weights are optimal. ``solve_milp`` is that ILP through ``scipy.optimize.milp``
  (the tests check that both reach the same objective). n_ff need not be a multiple of 256:
  a layer's last, shorter group costs a whole group of capacity (never more VRAM than planned).
* ``plan_budget(info, budget)``: the VRAM accounting. In the spec's priority order, attention
  (all layers), predictors, FFN norms, output head, then the KV cache (V, then K) and the
  compute buffers (which the original forgot, the root of its out-of-memory reports), then
  hot FFN rows with what is left. Every device buffer is counted with its 256-byte padding
  plus the allocator's rounding, so ``plan.used_bytes <= budget`` always holds.
* ``write_gpuidx`` / ``read_gpuidx``: the ``<model>.generated.gpuidx`` file in the original's
  format (GGUF v3, ``PWRI`` magic, ``generic.gpu_index`` KVs, ``blk.N.gpu_idx`` /
  ``blk.N.gpu_bucket`` I32 tensors with the original ggml's I32 id 18), plus ``powerinfer_py.*``
  KVs that the original ignores: the total budget, the model file's size and mtime and a
  fingerprint of the activation files.
* ``ensure_gpu_index(model, budget)``: reuse the file only when budget, model file and
  statistics are unchanged (the original kept a smaller split when the budget grew);
  ``reset=True`` (``--reset-gpu-index``) regenerates, ``disable=True`` (``--disable-gpu-index``)
  puts no FFN rows on the GPU.

**When not even the dense part fits** (attention + predictors + norms + output + KV cache +
compute buffers): with an explicit budget (``explicit=True``, the user passed
``--vram-budget``) ``plan_budget`` raises ``BudgetError`` naming the minimum budget; with the
automatic budget (free VRAM - 256 MiB) it returns a plan with nothing offloaded and a warning,
so the model runs on the CPU. A partial dense offload (some layers' attention only) is not
done: hybrid layers need their attention, KV cache and predictor on the device.

Command line (the original's invocation, spec 2, and a friendlier one)::

    python -m powerinfer.gpu_split --activation DIR --layer N --neuron N_FF --capacity NEURONS \\
        --vram-capacity BYTES --output FILE [--batch 256] [--threshold 0]
    python -m powerinfer.gpu_split --model FILE --vram-budget GIB [-c N_CTX] [-b N_BATCH]
        [--memory-f32] [--activation DIR] [--reset-gpu-index] [--disable-gpu-index]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import math
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

log = logging.getLogger("powerinfer")

GROUP = 256                      # neurons per solver group (the original's reshape to [-1, 256])
ALIGN = 256                      # device buffers start at 256-byte boundaries (arena sub-allocation)
ARENAS = 4                       # device allocations of a context: weights, hot FFN rows, KV cache, compute
ARENA_ROUNDING = 2 << 20         # cudaMalloc rounds large allocations up to 2 MiB
DEFAULT_MARGIN = 256 << 20       # the automatic budget is free VRAM minus this (spec 3.1)
GPUIDX_SUFFIX = ".generated.gpuidx"
ARCH = "generic.gpu_index"
KV_BLOCK_COUNT = "generic.gpu_index.block_count"
KV_VRAM_CAPACITY = "split.vram_capacity"
KV_PREFIX = "powerinfer_py."
I32_LEGACY = 18                  # GGML_TYPE_I32 in the original's ggml (Nov 2023); the original rejects 26
I32_MODERN = 26                  # GGML_TYPE_I32 in current ggml / gguf-py

# ggml type id -> (elements per block, bytes per block)
TYPE_SIZES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
              15: (256, 292), 26: (1, 4), 30: (1, 2)}
TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1", 10: "q2_K",
              11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 26: "i32", 30: "bf16"}
GPU_TYPES = {0, 1, 2, 8, 30}     # weight types the GPU kernels (core/cuda) compute with

_ACT_FILE = re.compile(r"^activation_(\d+)\.pt$")


class GpuSplitError(ValueError):
    """Bad input to the placement (activation files, index file, budget)."""


class ActivationError(GpuSplitError):
    """The activation statistics are missing or malformed."""


class GpuIndexError(GpuSplitError):
    """A .gpuidx file is unreadable or inconsistent."""


class BudgetError(GpuSplitError):
    """The VRAM budget cannot hold even the dense part of the model."""

    def __init__(self, message: str, min_budget_bytes: int):
        super().__init__(message)
        self.min_budget_bytes = min_budget_bytes


def row_bytes(type_id: int, n: int) -> int:
    if type_id not in TYPE_SIZES:
        raise GpuSplitError(f"unknown ggml type id {type_id}")
    block, size = TYPE_SIZES[type_id]
    if n % block:
        raise GpuSplitError(f"{n} elements is not a multiple of the {TYPE_NAMES.get(type_id)} block size {block}")
    return n // block * size


def padded(n: int) -> int:
    """Bytes a device buffer of n bytes takes inside an arena."""
    return -(-int(n) // ALIGN) * ALIGN


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ---------------------------------------------------------------------------------------------
# activation statistics


def list_activation_files(act_dir: str | os.PathLike) -> dict[int, Path]:
    """{layer: path} of the activation_N.pt files in act_dir (numeric N)."""
    d = Path(act_dir)
    if not d.is_dir():
        raise ActivationError(f"activation directory '{d}' not found (it holds activation_N.pt, one file per "
                              "layer; tools/profile_activations.py writes them)")
    files: dict[int, Path] = {}
    for p in d.iterdir():
        m = _ACT_FILE.match(p.name)
        if m and p.is_file():
            files[int(m.group(1))] = p
    if not files:
        raise ActivationError(f"no activation_N.pt files in '{d}'")
    return dict(sorted(files.items()))


def _read_tensor_file(path: Path) -> np.ndarray:
    """A torch.save'd tensor as numpy: with torch when it is installed, else the torch-free reader."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds
            raise ActivationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
        if not isinstance(obj, torch.Tensor):
            raise ActivationError(f"{path}: holds a {type(obj).__name__}, expected a 1-D tensor")
        t = obj.detach().cpu()
        return (t.double() if t.is_floating_point() or t.dtype == torch.bool else t.long()).numpy()
    from .convert.common import ConversionError, LazyTensor
    from .convert.torch_pickle import TorchReadError, read_torch_zip
    try:
        obj = read_torch_zip(path)
        if not isinstance(obj, LazyTensor):
            raise ActivationError(f"{path}: holds a {type(obj).__name__}, expected a 1-D tensor")
        return np.asarray(obj.load())
    except (TorchReadError, ConversionError) as e:
        raise ActivationError(f"{path}: cannot read without torch ({e})") from None


def load_activations(act_dir: str | os.PathLike, n_layer: int | None = None,
                     n_ff: int | None = None) -> list[np.ndarray]:
    """One float64 vector [n_ff] per layer, layer i from activation_i.pt (numeric order).
    Raises ActivationError for a missing directory or file, a wrong shape or a bad value."""
    files = list_activation_files(act_dir)
    if n_layer is None:
        n_layer = max(files) + 1
    missing = [i for i in range(n_layer) if i not in files]
    if missing:
        shown = ", ".join(f"activation_{i}.pt" for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ActivationError(f"'{act_dir}': missing {shown} ({len(missing)} of {n_layer} layers)")
    extra = [i for i in files if i >= n_layer]
    if extra:
        log.warning("gpu_split: %s has files for %d layers beyond the model's %d; ignored",
                    act_dir, len(extra), n_layer)
    acts = []
    for i in range(n_layer):
        a = _read_tensor_file(files[i])
        if a.ndim != 1:
            raise ActivationError(f"{files[i]}: shape {tuple(a.shape)}, expected a 1-D tensor [n_ff]")
        if n_ff is not None and a.shape[0] != n_ff:
            raise ActivationError(f"{files[i]}: {a.shape[0]} neurons, the model's n_ff is {n_ff}")
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)) or (a < 0).any():
            raise ActivationError(f"{files[i]}: activation statistics must be finite and >= 0 (counts or "
                                  "frequencies)")
        acts.append(a)
    widths = {a.shape[0] for a in acts}
    if len(widths) != 1:
        raise ActivationError(f"'{act_dir}': layers have different lengths {sorted(widths)}")
    return acts


def activation_fingerprint(act_dir: str | os.PathLike, n_layer: int) -> str:
    """Changes when any of the first n_layer activation files changes (name, size, mtime)."""
    h = hashlib.sha256()
    files = list_activation_files(act_dir)
    for i in range(n_layer):
        p = files.get(i)
        st = p.stat() if p else None
        h.update(f"{i}:{st.st_size if st else -1}:{st.st_mtime_ns if st else -1};".encode())
    return h.hexdigest()[:32]


# ---------------------------------------------------------------------------------------------
# the solver


def _check_acts(acts: Sequence[np.ndarray], group: int) -> None:
    if group < 1:
        raise GpuSplitError(f"group size {group} must be >= 1")
    if not acts:
        raise GpuSplitError("no layers")
    for i, a in enumerate(acts):
        if np.ndim(a) != 1 or len(a) == 0:
            raise GpuSplitError(f"layer {i}: activations must be a non-empty 1-D array")


def group_sums(act: np.ndarray, group: int = GROUP) -> tuple[np.ndarray, np.ndarray]:
    """(sums, sizes) of one layer's groups: activations sorted descending, cut into groups of
    `group` (the last one shorter when len % group != 0)."""
    s = np.sort(np.asarray(act, dtype=np.float64))[::-1]
    starts = np.arange(0, len(s), group)
    return np.add.reduceat(s, starts), np.minimum(group, len(s) - starts)


def solve_greedy(acts: Sequence[np.ndarray], capacity_neurons: int, group: int = GROUP) -> list[int]:
    """Hot neurons per layer: the floor(capacity / group) largest group sums over all layers.
    Equal sums go to the lower layer, then the lower group index, so each layer gets a prefix of
    its sorted groups (for non-negative activations)."""
    _check_acts(acts, group)
    n_groups = max(0, int(capacity_neurons)) // group
    sums, sizes, layer = [], [], []
    for i, a in enumerate(acts):
        s, z = group_sums(a, group)
        sums.append(s)
        sizes.append(z)
        layer.append(np.full(len(s), i))
    sums_a, sizes_a, layer_a = np.concatenate(sums), np.concatenate(sizes), np.concatenate(layer)
    gidx = np.concatenate([np.arange(len(s)) for s in sums])
    order = np.lexsort((gidx, layer_a, -sums_a))[:n_groups]
    counts = np.zeros(len(acts), dtype=np.int64)
    np.add.at(counts, layer_a[order], sizes_a[order])
    return [int(c) for c in counts]


def solve_milp(acts: Sequence[np.ndarray], capacity_neurons: int, group: int = GROUP,
               threshold: int = 0, time_limit: float = 30.0) -> list[int]:
    """The original's ILP (spec 2) through scipy.optimize.milp: binary x[l,g] (group g of layer l on
    the GPU) and y[l]; maximise sum w x; sum x <= floor(capacity/group); per layer
    sum_g x >= floor(threshold/group) y_l and sum_g x <= 1e6 y_l. Needs scipy."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    _check_acts(acts, group)
    sums = [group_sums(a, group) for a in acts]
    n_x = sum(len(s) for s, _ in sums)
    L = len(acts)
    n_var = n_x + L
    c = np.zeros(n_var)
    A = lil_matrix((1 + 2 * L, n_var))
    col = 0
    starts = []
    for i, (s, _) in enumerate(sums):
        starts.append(col)
        c[col:col + len(s)] = -s
        A[0, col:col + len(s)] = 1
        A[1 + 2 * i, col:col + len(s)] = 1
        A[1 + 2 * i, n_x + i] = -(threshold // group)
        A[2 + 2 * i, col:col + len(s)] = 1
        A[2 + 2 * i, n_x + i] = -1e6
        col += len(s)
    lb = np.concatenate([[-np.inf], np.tile([0.0, -np.inf], L)])
    ub = np.concatenate([[max(0, int(capacity_neurons)) // group], np.tile([np.inf, 0.0], L)])
    res = milp(c, constraints=LinearConstraint(A.tocsr(), lb, ub), integrality=np.ones(n_var),
               bounds=Bounds(0, 1), options={"time_limit": time_limit, "mip_rel_gap": 0.0})
    if res.x is None:
        raise GpuSplitError(f"milp found no solution: {res.message}")
    x = np.round(res.x).astype(np.int64)
    counts = []
    for i, (s, z) in enumerate(sums):
        counts.append(int((x[starts[i]:starts[i] + len(s)] * z).sum()))
    return counts


def objective(acts: Sequence[np.ndarray], counts: Sequence[int]) -> float:
    """Activation mass on the GPU: sum over layers of the counts[l] largest activations."""
    return float(sum(np.sort(np.asarray(a, dtype=np.float64))[::-1][:c].sum() for a, c in zip(acts, counts)))


def hot_neurons(act: np.ndarray, count: int) -> np.ndarray:
    """Ascending int32 indices of the `count` most active neurons (ties: the lower index)."""
    order = np.argsort(-np.asarray(act, dtype=np.float64), kind="stable")[:count]
    return np.sort(order).astype(np.int32)


# ---------------------------------------------------------------------------------------------
# the .gpuidx file


@dataclass
class GpuIndex:
    """The hot sets of a model: buckets[l] = ascending hot neuron indices of layer l."""
    n_ff: int
    vram_capacity: int                      # split.vram_capacity: the bytes the split was solved for
    buckets: list[np.ndarray]
    extra: dict[str, Any] = field(default_factory=dict)   # the other KVs (powerinfer_py.*)

    @property
    def n_layer(self) -> int:
        return len(self.buckets)

    @property
    def hot_counts(self) -> list[int]:
        return [len(b) for b in self.buckets]

    def mask(self, il: int) -> np.ndarray:
        m = np.zeros(self.n_ff, dtype=np.int32)
        m[self.buckets[il]] = 1
        return m


def gpuidx_path(model_path: str | os.PathLike) -> Path:
    return Path(str(model_path) + GPUIDX_SUFFIX)


# GGUF value types
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALARS = {_U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?",
            _U64: "<Q", _I64: "<q", _F64: "<d"}


def _gguf_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value) -> bytes:
    out = _gguf_str(key) + struct.pack("<I", vtype)
    return out + (_gguf_str(value) if vtype == _STR else struct.pack(_SCALARS[vtype], value))


def _extra_kv(key: str, value) -> bytes:
    if isinstance(value, bool):
        return _kv(key, _BOOL, value)
    if isinstance(value, (int, np.integer)):
        return _kv(key, _U64 if value >= 0 else _I64, int(value))
    if isinstance(value, (float, np.floating)):
        return _kv(key, _F64, float(value))
    if isinstance(value, str):
        return _kv(key, _STR, value)
    raise GpuSplitError(f"extra KV {key}: unsupported value {value!r}")


def write_gpuidx(path: str | os.PathLike, buckets: Sequence[np.ndarray], n_ff: int, vram_capacity: int,
                 extra: dict[str, Any] | None = None, *, legacy_i32: bool = True) -> Path:
    """Write the hot sets as the original's gpuidx file (atomically: a temporary file, then rename).
    KVs: general.architecture, generic.gpu_index.block_count (u32), split.vram_capacity (u64), then
    `extra` (keys should start with powerinfer_py.); tensors blk.{i}.gpu_idx I32 [n_ff] (0/1) and
    blk.{i}.gpu_bucket I32 [k_i] (ascending) per layer, in that order. legacy_i32 writes the
    original ggml's I32 type id 18 (what the original accepts); False writes today's 26."""
    path = Path(path)
    n_ff = int(n_ff)
    if n_ff < 1:
        raise GpuSplitError(f"n_ff = {n_ff}")
    if not 0 <= int(vram_capacity) < 2**64:
        raise GpuSplitError(f"vram capacity {vram_capacity} out of range")
    tensors: list[tuple[str, np.ndarray]] = []
    for i, b in enumerate(buckets):
        b = np.asarray(b, dtype=np.int64)
        if b.ndim != 1 or (len(b) and (b.min() < 0 or b.max() >= n_ff)) or (np.diff(b) <= 0).any():
            raise GpuSplitError(f"layer {i}: hot neurons must be strictly ascending indices in [0, {n_ff})")
        mask = np.zeros(n_ff, dtype="<i4")
        mask[b] = 1
        tensors.append((f"blk.{i}.gpu_idx", mask))
        tensors.append((f"blk.{i}.gpu_bucket", b.astype("<i4")))
    kvs = [_kv("general.architecture", _STR, ARCH), _kv(KV_BLOCK_COUNT, _U32, len(buckets)),
           _kv(KV_VRAM_CAPACITY, _U64, int(vram_capacity))]
    for k, v in (extra or {}).items():
        if k in ("general.architecture", KV_BLOCK_COUNT, KV_VRAM_CAPACITY):
            raise GpuSplitError(f"extra KV {k} would overwrite a standard key")
        kvs.append(_extra_kv(k, v))
    type_id = I32_LEGACY if legacy_i32 else I32_MODERN
    infos, offset = [], 0
    for name, data in tensors:
        infos.append(_gguf_str(name) + struct.pack("<I", 1) + struct.pack("<Q", len(data)) +
                     struct.pack("<I", type_id) + struct.pack("<Q", offset))
        offset += -(-data.nbytes // 32) * 32
    head = b"PWRI" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(head + b"\0" * (-len(head) % 32))
            for _, data in tensors:
                raw = data.tobytes()
                f.write(raw + b"\0" * (-len(raw) % 32))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


class _Cursor:
    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise GpuIndexError(f"{self.path}: truncated (reading {n} bytes at offset {self.pos} of "
                                f"{len(self.data)})")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 20:
            raise GpuIndexError(f"{self.path}: string of {n} bytes at offset {self.pos}")
        return self.take(n).decode("utf-8", "replace")

    def value(self, vtype: int, depth: int = 0):
        if vtype == _STR:
            return self.string()
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _ARR and depth == 0:
            sub, n = self.unpack("<I"), self.unpack("<Q")
            if n > 1 << 24:
                raise GpuIndexError(f"{self.path}: array of {n} elements")
            return [self.value(sub, 1) for _ in range(n)]
        raise GpuIndexError(f"{self.path}: unknown GGUF value type {vtype}")


def read_gpuidx(path: str | os.PathLike) -> GpuIndex:
    """Read a gpuidx file (ours or the original's). Tensors are taken by position (2 per layer:
    gpu_idx then gpu_bucket, as the original loader); names, types and consistency are checked."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise GpuIndexError(f"{path}: cannot read ({e.strerror or e})") from None
    c = _Cursor(data, path)
    magic = c.take(4) if len(data) >= 4 else b""
    if magic not in (b"PWRI", b"GGUF"):
        raise GpuIndexError(f"{path}: not a gpuidx file (magic {magic!r})")
    version = c.unpack("<I")
    if version not in (2, 3):
        raise GpuIndexError(f"{path}: unsupported GGUF version {version}")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    if n_kv > 1 << 16 or n_tensors > 1 << 24:
        raise GpuIndexError(f"{path}: implausible counts ({n_tensors} tensors, {n_kv} KVs)")
    kvs: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        kvs[key] = c.value(c.unpack("<I"))
    if kvs.get("general.architecture") != ARCH:
        raise GpuIndexError(f"{path}: general.architecture is {kvs.get('general.architecture')!r}, "
                            f"expected '{ARCH}'")
    for key in (KV_BLOCK_COUNT, KV_VRAM_CAPACITY):
        if not isinstance(kvs.get(key), int):
            raise GpuIndexError(f"{path}: missing or non-integer {key}")
    n_layer = kvs[KV_BLOCK_COUNT]
    if n_tensors != 2 * n_layer:
        raise GpuIndexError(f"{path}: {n_tensors} tensors for {n_layer} layers (expected {2 * n_layer})")
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.unpack("<I")
        if not 1 <= n_dims <= 4:
            raise GpuIndexError(f"{path}: tensor '{name}' has {n_dims} dims")
        ne = [c.unpack("<Q") for _ in range(n_dims)]
        infos.append((name, ne, c.unpack("<I"), c.unpack("<Q")))
    align = kvs.get("general.alignment", 32)
    if not isinstance(align, int) or align < 1:
        raise GpuIndexError(f"{path}: bad general.alignment {align!r}")
    start = -(-c.pos // align) * align
    arrays = []
    for j, (name, ne, ttype, off) in enumerate(infos):
        want = f"blk.{j // 2}.{'gpu_idx' if j % 2 == 0 else 'gpu_bucket'}"
        if name != want:
            raise GpuIndexError(f"{path}: tensor {j} is '{name}', expected '{want}'")
        if ttype not in (I32_LEGACY, I32_MODERN):
            raise GpuIndexError(f"{path}: tensor '{name}' has type id {ttype}, expected I32 (18 or 26)")
        if len(ne) != 1:
            raise GpuIndexError(f"{path}: tensor '{name}' must be 1-D, has shape {ne}")
        lo, hi = start + off, start + off + 4 * ne[0]
        if hi > len(data):
            raise GpuIndexError(f"{path}: tensor '{name}' data [{lo}, {hi}) lies outside the file ({len(data)} bytes)")
        arrays.append(np.frombuffer(data, dtype="<i4", count=ne[0], offset=lo).astype(np.int32))
    masks, buckets = arrays[0::2], arrays[1::2]
    n_ff = len(masks[0]) if masks else 0
    for i, (m, b) in enumerate(zip(masks, buckets)):
        if len(m) != n_ff:
            raise GpuIndexError(f"{path}: blk.{i}.gpu_idx has {len(m)} entries, blk.0 has {n_ff}")
        if not np.isin(m, (0, 1)).all():
            raise GpuIndexError(f"{path}: blk.{i}.gpu_idx is not a 0/1 mask")
        if not np.array_equal(np.flatnonzero(m), b):
            raise GpuIndexError(f"{path}: blk.{i}.gpu_bucket does not list the ones of blk.{i}.gpu_idx in "
                                "ascending order")
    extra = {k: v for k, v in kvs.items() if k not in ("general.architecture", KV_BLOCK_COUNT, KV_VRAM_CAPACITY)}
    return GpuIndex(n_ff=n_ff, vram_capacity=kvs[KV_VRAM_CAPACITY], buckets=list(buckets), extra=extra)


# ---------------------------------------------------------------------------------------------
# the model and the VRAM accounting


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type: int
    ne: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.ne[1:]:
            n *= d
        return row_bytes(self.type, self.ne[0]) * n


@dataclass
class ModelInfo:
    """What the placement needs to know about a model (from its GGUF file, or built by hand)."""
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    tensors: dict[str, TensorSpec]
    sparse: bool = True
    path: Path | None = None
    n_swa: int = 0

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def max_rank(self) -> int:
        return max((t.ne[1] for n, t in self.tensors.items() if n.endswith(".fc1.weight")), default=0)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "ModelInfo":
        from .gguf_file import open_gguf
        f = open_gguf(path)
        meta = f.metadata
        arch = meta.get("general.architecture")

        def get(key, default=None):
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise GpuSplitError(f"{path}: missing metadata {arch}.{key}")
            return int(v)

        n_embd, n_head = get("embedding_length"), get("attention.head_count")
        head_dim = int(meta.get(f"{arch}.attention.key_length") or n_embd // n_head)
        tensors = {name: TensorSpec(name, t.type, tuple(t.ne)) for name, t in f.tensors.items()}
        emb = tensors.get("token_embd.weight")
        return cls(n_layer=get("block_count"), n_embd=n_embd, n_ff=get("feed_forward_length"), n_head=n_head,
                   n_head_kv=get("attention.head_count_kv", n_head), head_dim=head_dim,
                   n_vocab=emb.ne[1] if emb else len(meta.get("tokenizer.ggml.tokens") or []),
                   tensors=tensors, sparse=f.is_sparse, path=Path(path),
                   n_swa=int(meta.get(f"{arch}.attention.sliding_window") or 0))


_LEVELS = ("attn", "pred", "ffn_io", "output")
_LEVEL_RE = [
    ("attn", re.compile(r"^blk\.(\d+)\.(attn_norm(_2)?|attn_q|attn_k|attn_v|attn_output|attn_qkv|attn_q_norm|"
                        r"attn_k_norm|post_attention_norm)\.(weight|bias)$")),
    ("pred", re.compile(r"^blk\.(\d+)\.(fc1|fc2)\.weight$")),
    ("ffn_io", re.compile(r"^blk\.(\d+)\.(ffn_norm|post_ffw_norm)\.(weight|bias)$")),
    ("output", re.compile(r"^(output|output_norm)\.(weight|bias)$")),
]
_FFN_RE = re.compile(r"^blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down_t|ffn_down)\.weight$")


def dense_levels(info: ModelInfo) -> dict[str, list[TensorSpec]]:
    """Tensors of the dense levels, each level in layer order (spec 3.3). Tied output heads
    (no output.weight) put token_embd in the output level: the logits need it on the device."""
    levels: dict[str, list[tuple[int, str, TensorSpec]]] = {lv: [] for lv in _LEVELS}
    for name, t in info.tensors.items():
        for lv, rx in _LEVEL_RE:
            m = rx.match(name)
            if m:
                layer = int(m.group(1)) if lv != "output" else 0
                levels[lv].append((layer, name, t))
                break
    if "output.weight" not in info.tensors and "token_embd.weight" in info.tensors:
        levels["output"].append((0, "token_embd.weight", info.tensors["token_embd.weight"]))
    return {lv: [t for _, _, t in sorted(items, key=lambda x: (x[0], x[1]))] for lv, items in levels.items()}


def _axpy_chunks(E: int, k: int, T: int) -> int:
    """Row chunks of the GPU axpy; must match axpy_chunks() in core/cuda/sparse_ffn.cu."""
    nt = 1 if T == 1 else 8
    base = -(-E // 256) * -(-T // nt)
    R = -(-1024 // base)
    R = min(R, -(-k // 64), 65535)
    return max(1, R)


def _q8_bytes(K: int, T: int) -> int:
    return K // 32 * 34 * T


def compute_buffers(info: ModelInfo, n_ctx: int, n_batch: int) -> dict[str, int]:
    """Device buffers of one forward pass over n_batch tokens with n_ctx KV cells (bytes, unpadded).
    An upper bound of what the GPU forward pass allocates (core/cuda/README.md, "Wiring"): a context
    must not allocate more than this, so that plans stay within budget."""
    E, T, F, H = info.n_embd, n_batch, info.n_ff, info.n_head
    Eq = H * info.head_dim
    r = info.max_rank
    bufs = {
        "residual x, normed input, attention out, ffn out (GPU part, CPU part)": 5 * T * E * 4,
        "q": T * Eq * 4,
        "k, v of the batch": 2 * T * info.n_embd_kv * 4,
        "attention scores": H * T * n_ctx * 4,
        "attention masks": T * n_ctx * 4 * (2 if info.n_swa else 1),
        "positions, cells, token ids": 3 * T * 4,
        "q8_0 activations (largest K)": max(_q8_bytes(K - K % 32, T) for K in (E, Eq, F, max(r, 32))),
        "logits": T * info.n_vocab * 4,
        "counters": 8,
    }
    if info.sparse:
        bufs["predictor scores"] = T * F * 4
        bufs["predictor hidden"] = T * r * 4
        bufs["ffn hidden h (all neurons hot)"] = T * F * 4
        chunks = _axpy_chunks(E, F, T)
        bufs["axpy partial sums"] = chunks * T * E * 4 if chunks > 1 else 0
    else:
        bufs["ffn gate, up"] = 2 * T * F * 4
    return bufs


@dataclass
class PlanItem:
    name: str
    category: str            # attn, pred, ffn_io, output, kv_v, kv_k, compute, reserve, ffn_hot
    nbytes: int              # padded device bytes


@dataclass
class Plan:
    """Where everything goes. used_bytes <= budget_bytes always holds."""
    budget_bytes: int
    offload: bool                        # the dense part (attention ... output, KV, compute) is on the GPU
    items: list[PlanItem]
    dense_bytes: int                     # everything before the hot FFN rows
    ffn_bytes: int                       # budget left for hot FFN rows (split.vram_capacity)
    neuron_bytes: int                    # device bytes of one hot neuron (gate+up+down_t rows + bucket entry)
    row_bytes: list[int]                 # bytes per neuron of each FFN matrix on the GPU (gate, up, down_t)
    capacity_neurons: int                # hot neurons that fit in ffn_bytes (multiple of GROUP)
    n_layer: int
    n_ff: int
    hot_counts: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    n_ctx: int = 0
    n_batch: int = 0

    @property
    def hot_bytes(self) -> int:
        return sum(i.nbytes for i in self.items if i.category == "ffn_hot")

    @property
    def used_bytes(self) -> int:
        return sum(i.nbytes for i in self.items)

    def by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            out[i.category] = out.get(i.category, 0) + i.nbytes
        return out

    def with_hot_counts(self, counts: Sequence[int]) -> "Plan":
        """A copy with the hot FFN rows of `counts` (per layer) added; raises BudgetError if they do not
        fit (they always do for counts from solve_greedy(acts, self.capacity_neurons))."""
        counts = [int(c) for c in counts]
        if len(counts) != self.n_layer or any(not 0 <= c <= self.n_ff for c in counts):
            raise GpuSplitError(f"hot counts {counts[:4]}... do not fit {self.n_layer} layers of {self.n_ff} neurons")
        if not self.offload and any(counts):
            raise BudgetError("no FFN rows can go to the GPU: the dense part is not offloaded", self.dense_bytes)
        items = [i for i in self.items if i.category != "ffn_hot"]
        for il, k in enumerate(counts):
            if k == 0:
                continue
            nbytes = sum(padded(b * k) for b in self.row_bytes) + padded(4 * k)
            items.append(PlanItem(f"blk.{il} hot FFN rows ({k} of {self.n_ff})", "ffn_hot", nbytes))
        plan = dataclasses.replace(self, items=items, hot_counts=counts, warnings=list(self.warnings))
        if plan.used_bytes > plan.budget_bytes:
            raise BudgetError(f"hot FFN rows need {gib(plan.hot_bytes)}, only {gib(self.ffn_bytes)} is left",
                              plan.used_bytes)
        return plan

    def summary(self) -> str:
        cat = self.by_category()
        names = {"attn": "attention", "pred": "predictors", "ffn_io": "FFN norms", "output": "output head",
                 "kv_v": "KV cache V", "kv_k": "KV cache K", "compute": "compute buffers",
                 "reserve": "allocator rounding", "ffn_hot": "hot FFN rows"}
        lines = [f"VRAM budget {gib(self.budget_bytes)} (n_ctx {self.n_ctx}, n_batch {self.n_batch}): "
                 f"{'dense part on the GPU' if self.offload else 'nothing offloaded'}"]
        for c in ("attn", "pred", "ffn_io", "output", "kv_v", "kv_k", "compute", "reserve", "ffn_hot"):
            if c in cat:
                lines.append(f"  {names[c]:<20} {gib(cat[c]):>12}")
        if self.hot_counts:
            hot = sum(self.hot_counts)
            lines.append(f"  hot neurons {hot} of {self.n_layer * self.n_ff} "
                         f"({100.0 * hot / max(1, self.n_layer * self.n_ff):.1f}%), per layer "
                         f"{min(self.hot_counts)}..{max(self.hot_counts)}")
        lines.append(f"  used {gib(self.used_bytes)} of {gib(self.budget_bytes)}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _kv_type_bytes(kv_type: str) -> int:
    if kv_type not in ("f16", "f32"):
        raise GpuSplitError(f"kv_type must be 'f16' or 'f32', not {kv_type!r}")
    return 2 if kv_type == "f16" else 4


def ffn_row_bytes(info: ModelInfo) -> list[int]:
    """Device bytes per neuron of each FFN matrix that moves with a hot neuron (the largest over
    layers, in their own dtypes): gate (if any), up, down_t."""
    out = []
    for part in ("ffn_gate", "ffn_up", "ffn_down_t"):
        specs = [t for n, t in info.tensors.items() if n.endswith(f".{part}.weight") and n.startswith("blk.")]
        if specs:
            out.append(max(row_bytes(t.type, t.ne[0]) for t in specs))
    return out


def plan_budget(info: ModelInfo, budget_bytes: int, *, n_ctx: int = 512, n_batch: int = 512,
                kv_type: str = "f16", explicit: bool = True, disable_gpu_index: bool = False,
                group: int = GROUP, compute_bytes: int | None = None) -> Plan:
    """The dense part in priority order, then the capacity left for hot FFN rows (spec 3, with the
    KV cache and compute buffers counted). Raises BudgetError when an explicit budget cannot hold
    the dense part; with explicit=False returns a plan that offloads nothing, with a warning.
    compute_bytes: the device bytes of the compute buffers and scratch as the library allocates
    them (pi_offload_compute_bytes, what Context passes); None: the estimate of compute_buffers()."""
    budget_bytes = int(budget_bytes)
    if budget_bytes < 0:
        raise GpuSplitError(f"VRAM budget {budget_bytes} bytes is negative")
    if n_ctx < 1 or n_batch < 1:
        raise GpuSplitError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be >= 1")
    n_batch = min(n_batch, n_ctx)
    items: list[PlanItem] = []
    unsupported = set()
    for lv, specs in dense_levels(info).items():
        for t in specs:
            if t.type not in GPU_TYPES:
                unsupported.add(f"{t.name} ({TYPE_NAMES.get(t.type, t.type)})")
            items.append(PlanItem(t.name, lv, padded(t.nbytes)))
    kvb = _kv_type_bytes(kv_type)
    for il in range(info.n_layer):
        items.append(PlanItem(f"blk.{il} V cache", "kv_v", padded(n_ctx * info.n_embd_kv * kvb)))
    for il in range(info.n_layer):
        items.append(PlanItem(f"blk.{il} K cache", "kv_k", padded(n_ctx * info.n_embd_kv * kvb)))
    if compute_bytes is not None:
        items.append(PlanItem("compute buffers and scratch (libpowerinfer)", "compute", padded(int(compute_bytes))))
    else:
        for name, b in compute_buffers(info, n_ctx, n_batch).items():
            items.append(PlanItem(name, "compute", padded(b)))
    items.append(PlanItem(f"allocator rounding ({ARENAS} arenas)", "reserve", ARENAS * ARENA_ROUNDING))
    dense = sum(i.nbytes for i in items)
    rb = ffn_row_bytes(info)
    neuron_bytes = sum(rb) + 4
    base = dict(budget_bytes=budget_bytes, n_layer=info.n_layer, n_ff=info.n_ff, neuron_bytes=neuron_bytes,
                row_bytes=rb, n_ctx=n_ctx, n_batch=n_batch)
    if unsupported or dense > budget_bytes:
        if unsupported:
            msg = (f"the GPU kernels do not support {', '.join(sorted(unsupported)[:3])}"
                   f"{' ...' if len(unsupported) > 3 else ''}: nothing is offloaded")
        else:
            running, first = 0, None
            for i in items:
                running += i.nbytes
                if running > budget_bytes:
                    first = i
                    break
            msg = (f"VRAM budget {gib(budget_bytes)} cannot hold the dense part of the model: it needs "
                   f"{gib(dense)} (attention, predictors, norms, output head, KV cache for {n_ctx} tokens, "
                   f"compute buffers for {n_batch} tokens); the first that does not fit is {first.name}. "
                   f"Give at least --vram-budget {math.ceil(dense / 2**30 * 100) / 100:.2f}, or lower -c/-b")
        if explicit and not unsupported:
            raise BudgetError(msg, dense)
        return Plan(offload=False, items=[], dense_bytes=dense, ffn_bytes=0, capacity_neurons=0,
                    warnings=[msg], **base)
    ffn = budget_bytes - dense
    warns = []
    # per layer, each FFN matrix and the bucket are padded once: reserve that before dividing
    reserve = info.n_layer * (len(rb) + 1) * ALIGN
    cap = 0
    if disable_gpu_index:
        warns.append("--disable-gpu-index: the FFN runs on the CPU")
    elif not info.sparse:
        warns.append("dense model (GGUF magic): no hot-neuron split; the FFN runs on the CPU")
    elif not rb:
        warns.append("the model has no FFN matrices")
    else:
        ffn_types = {t.type for n, t in info.tensors.items() if _FFN_RE.match(n)}
        bad = ffn_types - GPU_TYPES
        if bad:
            warns.append(f"FFN weights of type {', '.join(TYPE_NAMES.get(b, str(b)) for b in sorted(bad))} have no "
                         "GPU kernels yet: the FFN runs on the CPU")
        else:
            cap = max(0, ffn - reserve) // neuron_bytes // group * group
            cap = min(cap, -(-info.n_ff // group) * group * info.n_layer)
    return Plan(offload=True, items=items, dense_bytes=dense, ffn_bytes=ffn, capacity_neurons=cap,
                warnings=warns, **base)


# ---------------------------------------------------------------------------------------------
# the cached index next to the model


def _model_stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {KV_PREFIX + "model_size": st.st_size, KV_PREFIX + "model_mtime_ns": st.st_mtime_ns}


def ensure_gpu_index(model_path: str | os.PathLike, budget_bytes: int, *, n_ctx: int = 512, n_batch: int = 512,
                     kv_type: str = "f16", explicit: bool = True, reset: bool = False, disable: bool = False,
                     activation_dir: str | os.PathLike | None = None, strict: bool = False,
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
        if strict:
            raise
        plan.warnings.append(f"{e}: the FFN runs on the CPU")
        log.warning("gpu_split: %s: the FFN runs on the CPU", e)
        return plan, None
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
        if strict:
            raise
        plan.warnings.append(f"{e}: the FFN runs on the CPU")
        log.warning("gpu_split: %s: the FFN runs on the CPU", e)
        return plan, None
    counts = solve_greedy(acts, plan.capacity_neurons)
    buckets = [hot_neurons(a, c) for a, c in zip(acts, counts)]
    write_gpuidx(idx_path, buckets, info.n_ff, plan.ffn_bytes, extra)
    log.info("gpu_split: wrote %s", idx_path)
    return plan.with_hot_counts(counts), GpuIndex(info.n_ff, plan.ffn_bytes, buckets, extra)


# ---------------------------------------------------------------------------------------------
# the GPU API of libpowerinfer (powerinfer_cuda.h), for device queries and the GPU tests


_CUDA = None


def cuda_api():
    """(ffi, lib) for the powerinfer_cuda.h functions of the loaded libpowerinfer, or None when the
    library predates them. Every build exports them (a CPU-only build: pi_cuda_available() == 0)."""
    global _CUDA
    if _CUDA is None:
        import cffi

        from . import _ffi
        hdr = [_ffi._PKG / "powerinfer_cuda.h", _ffi._REPO / "core" / "include" / "powerinfer_cuda.h"]
        path = next((p for p in hdr if p.is_file()), None)
        if path is None:
            _CUDA = False
            return None
        text = path.read_text()
        m = re.search(r"/\* PI_CUDA_CDEF_BEGIN \*/(.*)/\* PI_CUDA_CDEF_END \*/", text, re.S)
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S) if m else ""
        body = "\n".join(ln for ln in body.splitlines() if not ln.lstrip().startswith("#")).replace("PI_API ", "")
        ffi = cffi.FFI()
        ffi.cdef(_ffi._cdef_source(_ffi._header_path().read_text()))
        ffi.cdef(body)
        lib = ffi.dlopen(str(_ffi._library_path()))
        try:
            lib.pi_cuda_available
        except AttributeError:
            _CUDA = False
            return None
        _CUDA = (ffi, lib)
    return _CUDA or None


def gpu_available() -> int:
    """Devices the library reports: CUDA/HIP GPUs, or the emulated one (POWERINFER_EMULATED_GPU_MIB)."""
    from ._ffi import lib
    return int(lib.pi_device_count())


def device_info(device: int = 0) -> dict[str, Any] | None:
    """Backend ("cuda", "hip", "emulated"), name, total and free bytes of a device; None without one."""
    from ._ffi import ffi, lib
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


# ---------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m powerinfer.gpu_split",
        description="Choose the hot FFN neurons that go to the GPU and write the .generated.gpuidx file.",
        epilog="Original form (what the C++ engine runs): --activation DIR --layer N --neuron N_FF "
               "--capacity NEURONS --vram-capacity BYTES --output FILE.  Friendly form: --model FILE "
               "--vram-budget GIB.")
    p.add_argument("--activation", help="directory of activation_N.pt files (default with --model: "
                   "<model dir>/activation)")
    p.add_argument("--layer", type=int, help="number of layers")
    p.add_argument("--neuron", type=int, help="FFN neurons per layer (n_ff)")
    p.add_argument("--capacity", type=int, help="hot neurons that fit on the GPU, over all layers")
    p.add_argument("--vram-capacity", type=int, help="VRAM bytes the split is for (stored in the file)")
    p.add_argument("--output", help="gpuidx file to write")
    p.add_argument("--batch", type=int, default=GROUP, help="neurons per group (default %(default)s)")
    p.add_argument("--threshold", type=int, default=0,
                   help="a layer gets no neurons or at least this many (default 0; > 0 needs scipy)")
    p.add_argument("--model", help="model file (.powerinfer.gguf)")
    p.add_argument("--vram-budget", type=float, help="GiB of VRAM to use (default: free VRAM - 256 MiB)")
    p.add_argument("-c", "--ctx-size", type=int, default=512, help="KV cache size in tokens (default %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="tokens per decode call (default %(default)s)")
    p.add_argument("--memory-f32", action="store_true", help="f32 KV cache (default f16)")
    p.add_argument("--reset-gpu-index", action="store_true", help="regenerate the index file")
    p.add_argument("--disable-gpu-index", action="store_true", help="no hot FFN rows on the GPU")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(message)s")
    try:
        if a.model:
            if a.vram_budget is not None:
                if not a.vram_budget >= 0:
                    p.error("--vram-budget must be >= 0")
                budget, explicit = int(a.vram_budget * 2**30), True
            else:
                budget, explicit = default_budget_bytes(), False
                if budget is None:
                    print("error: no GPU found: give --vram-budget GIB to plan for one", file=sys.stderr)
                    return 1
            plan, idx = ensure_gpu_index(a.model, budget, n_ctx=a.ctx_size, n_batch=a.batch_size,
                                         kv_type="f32" if a.memory_f32 else "f16", explicit=explicit,
                                         reset=a.reset_gpu_index, disable=a.disable_gpu_index,
                                         activation_dir=a.activation)
            print(plan.summary())
            if idx is not None:
                print(f"index: {gpuidx_path(a.model)}")
            return 0
        missing = [f"--{n.replace('_', '-')}" for n in ("activation", "layer", "neuron", "capacity",
                                                         "vram_capacity", "output") if getattr(a, n) is None]
        if missing:
            p.error(f"missing {', '.join(missing)} (or use --model FILE --vram-budget GIB)")
        if a.layer < 1 or a.neuron < 1 or a.capacity < 0 or a.vram_capacity < 0 or a.batch < 1:
            p.error("--layer, --neuron and --batch must be >= 1, --capacity and --vram-capacity >= 0")
        acts = load_activations(a.activation, a.layer, a.neuron)
        if a.threshold > 0:
            counts = solve_milp(acts, a.capacity, a.batch, a.threshold)
        else:
            counts = solve_greedy(acts, a.capacity, a.batch)
        write_gpuidx(a.output, [hot_neurons(x, c) for x, c in zip(acts, counts)], a.neuron, a.vram_capacity)
        print(f"{sum(counts)} of {a.layer * a.neuron} neurons hot (per layer {min(counts)}..{max(counts)}); "
              f"wrote {a.output}")
        return 0
    except GpuSplitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
