"""Write a GGUF (or PowerInfer ``PWRI``) file with gguf.GGUFWriter, streaming one tensor at a time.

All tensor infos are declared first (so the header can be written), then each tensor's
float32 source is loaded, converted (`powerinfer.quants`) and written, so memory stays at
about one tensor. The file is written to a temporary file next to the output and renamed
over it only when complete: a failure never leaves a partial or corrupt output behind.
PowerInfer mode patches bytes 0..3 to ``PWRI`` before the rename (spec 1.2).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

import gguf

from .. import quants
from .common import ConversionError, log

F16_MAX = 65504.0
_CHUNK_ELEMS = 16 << 20           # rows quantized per chunk: about 64 MiB of float32


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]            # numpy shape of the float data; GGUF ne is this reversed
    type_name: str                    # "f32" | "f16" | "q8_0" | "q4_0" (powerinfer.quants.TYPES)
    source: Callable[[], np.ndarray]  # -> float32 array of `shape`

    @property
    def ne(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def nbytes(self) -> int:
        n_rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        return n_rows * quants.row_bytes(self.type_name, self.shape[-1])


def encode_tensor(spec: TensorSpec, x: np.ndarray) -> np.ndarray:
    """float32 data of spec -> raw bytes (rows, row_bytes) of its GGUF type."""
    if tuple(x.shape) != tuple(spec.shape):
        raise ConversionError(f"{spec.name}: source data has shape {tuple(x.shape)}, expected {spec.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ConversionError(f"{spec.name}: the weights contain NaN or infinite values")
    if spec.type_name in ("f16", "q8_0", "q4_0") and x.size:
        amax = float(np.abs(x).max())
        limit = F16_MAX if spec.type_name == "f16" else F16_MAX * (127 if spec.type_name == "q8_0" else 8)
        if amax > limit:
            raise ConversionError(f"{spec.name}: max |weight| {amax:g} does not fit in {spec.type_name.upper()}; "
                                  "convert with --outtype f32")
    rows = x.reshape(-1, spec.shape[-1])
    step = max(1, _CHUNK_ELEMS // max(1, spec.shape[-1]))
    if rows.shape[0] <= step:
        return quants.quantize(rows, spec.type_name)
    return np.concatenate([quants.quantize(rows[i:i + step], spec.type_name)
                           for i in range(0, rows.shape[0], step)])


def _temp_path(outfile: Path) -> Path:
    return outfile.with_name(f".{outfile.name}.{os.getpid()}.tmp")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0          # someone else's live process (or a pid we cannot ask about): keep
    return True


def remove_stale_temps(outfile: Path) -> list[Path]:
    """Delete the temporary files (_temp_path) that conversions to outfile left when they were killed
    (SIGKILL, power loss): those whose process is gone. A running conversion's file is kept."""
    removed = []
    prefix, suffix = f".{outfile.name}.", ".tmp"
    for p in outfile.parent.glob(f".{glob.escape(outfile.name)}.*.tmp"):
        pid = p.name[len(prefix):-len(suffix)]
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        try:
            p.unlink()
            removed.append(p)
            log.info("removed %s, left by an interrupted conversion", p)
        except OSError:
            pass
    return removed


def write_gguf(outfile: str | os.PathLike, arch: str, add_metadata: Callable[[gguf.GGUFWriter], None],
               tensors: list[TensorSpec], *, powerinfer_magic: bool = False,
               progress: Callable[[str], None] | None = None) -> Path:
    """Write `tensors` (in order) with the metadata that add_metadata(writer) adds; atomically."""
    outfile = Path(outfile)
    if not outfile.parent.is_dir():
        raise ConversionError(f"{outfile}: output directory {outfile.parent} does not exist")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ConversionError("duplicate tensor names in the conversion plan")
    remove_stale_temps(outfile)
    tmp = _temp_path(outfile)
    w = gguf.GGUFWriter(None, arch)
    try:
        add_metadata(w)
        for t in tensors:
            qt = quants.TYPES[t.type_name]
            n_rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
            byte_shape = (*t.shape[:-1], quants.row_bytes(t.type_name, t.shape[-1]))
            w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), n_rows * byte_shape[-1],
                              raw_dtype=gguf.GGMLQuantizationType(qt.ggml_type))
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total = sum(t.nbytes for t in tensors)
        done = 0
        for i, t in enumerate(tensors):
            data = encode_tensor(t, t.source())
            if data.nbytes != t.nbytes:
                raise ConversionError(f"{t.name}: encoded to {data.nbytes} bytes, expected {t.nbytes}")
            w.write_tensor_data(data)
            done += data.nbytes
            if progress:
                progress(f"[{i + 1:4d}/{len(tensors)}] {t.name:<32s} {t.type_name:<5s} "
                         f"ne={list(t.ne)}  {done / 2**20:8.1f}/{total / 2**20:.1f} MiB")
        w.flush()
        assert w.fout is not None
        os.fsync(w.fout[0].fileno())
        w.close()
        if powerinfer_magic:
            with open(tmp, "r+b") as f:
                f.write(b"PWRI")
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, outfile)
    except BaseException:
        w.close()
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise
    log.debug("wrote %s", outfile)
    return outfile
