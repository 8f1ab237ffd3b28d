"""The ``<model>.generated.gpuidx`` file in the original's format: GGUF v3 with the ``PWRI`` magic,
``generic.gpu_index`` KVs, ``blk.N.gpu_idx`` / ``blk.N.gpu_bucket`` I32 tensors (the original ggml's
I32 id 18), plus ``powerinfer_py.*`` KVs that the original ignores."""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .common import GpuIndexError, GpuSplitError

GPUIDX_SUFFIX = ".generated.gpuidx"
ARCH = "generic.gpu_index"
KV_BLOCK_COUNT = "generic.gpu_index.block_count"
KV_VRAM_CAPACITY = "split.vram_capacity"
I32_LEGACY = 18                  # GGML_TYPE_I32 in the original's ggml (Nov 2023); the original rejects 26
I32_MODERN = 26                  # GGML_TYPE_I32 in current ggml / gguf-py


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
