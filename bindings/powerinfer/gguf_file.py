"""Open a GGUF or PowerInfer GGUF (`PWRI` magic) file, memory-mapped, through the gguf package.

Every way a file can be broken (truncated, wrong magic, bad offsets, unknown
types) ends up as one ModelLoadError naming the file and the problem.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType

PWRI_MAGIC = int.from_bytes(b"PWRI", "little")


class ModelLoadError(ValueError):
    """The model file is missing, unreadable or not a model this package can run."""


class _Reader(GGUFReader):
    """GGUFReader that also accepts the PowerInfer magic (the rest of the format is plain GGUF v3)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        # gguf's reader silently returns short arrays past the end of the file (and then loops over
        # a corrupt array length for as long as it says): stop at the first read that does not fit.
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if int(offset) < 0 or end > len(self.data):
            raise ValueError(f"reading {int(count)} x {np.dtype(dtype).name} at offset {int(offset)} runs past "
                             f"the end of the file ({len(self.data)} bytes)")
        value = super()._get(offset, dtype, count, override_order)
        if offset == 0 and count == 1 and value[0] == PWRI_MAGIC:
            return np.array([GGUF_MAGIC], dtype=value.dtype)
        return value

    def _build_tensors(self, start_offs, fields):
        # Check each tensor's type and extent first, so that the error names the tensor.
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                qtype = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise ValueError(f"tensor '{name}' has unknown ggml type id {int(raw_dtype[0])}") from None
            if qtype not in GGML_QUANT_SIZES:
                continue
            block, size = GGML_QUANT_SIZES[qtype]
            if dims.size and int(dims[0]) % block:
                raise ValueError(f"tensor '{name}' has type {qtype.name} but its row length {int(dims[0])} is not "
                                 f"a multiple of the {qtype.name} block size {block}")
            n = 1
            for d in dims.tolist():
                n *= int(d)
            start = int(start_offs) + int(offset_tensor[0])
            end = start + n // block * size
            if end > len(self.data):
                raise ValueError(f"tensor '{name}' data [{start}, {end}) lies outside the file ({len(self.data)} "
                                 "bytes): the file is truncated or the tensor's offset is corrupt")
        super()._build_tensors(start_offs, fields)


@dataclass
class TensorInfo:
    name: str
    type: int                 # ggml type id
    ne: tuple[int, ...]       # GGUF order: ne[0] contiguous
    data: np.ndarray          # uint8 view into the mapping
    offset: int               # absolute file offset


@dataclass
class GGUFFile:
    path: Path
    magic: str                       # "GGUF" or "PWRI"
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    mapping: np.memmap               # keep alive while tensors are in use
    file_size: int

    @property
    def is_sparse(self) -> bool:
        return self.magic == "PWRI"


def _field_value(field) -> Any:
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return np.concatenate([field.parts[i] for i in field.data]).tolist() if field.data else []
    if main == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    value = field.parts[field.data[0]][0]
    return bool(value) if main == GGUFValueType.BOOL else value.item()


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such model file")
    size = path.stat().st_size
    if size < 24:
        raise ModelLoadError(f"{path}: file is too small to be a GGUF model ({size} bytes)")
    with open(path, "rb") as f:
        head = f.read(8)
    magic = head[:4]
    if magic not in (b"GGUF", b"PWRI"):
        raise ModelLoadError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF' or b'PWRI')")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: unsupported GGUF version {version} (2 and 3 are supported)")
    try:
        reader = _Reader(path, "r")
    except Exception as e:  # the gguf package signals truncation and corruption in many ways
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e})") from None
    try:
        metadata = {name: _field_value(field) for name, field in reader.fields.items()
                    if not name.startswith("GGUF.")}
    except Exception as e:
        raise ModelLoadError(f"{path}: unreadable metadata ({type(e).__name__}: {e})") from None

    tensors: dict[str, TensorInfo] = {}
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if int(t.data_offset) < 0 or end > size or t.data.nbytes != int(t.n_bytes):
            raise ModelLoadError(f"{path}: tensor '{t.name}' data [{t.data_offset}, {end}) lies outside the file "
                                 f"({size} bytes): the file is truncated or corrupt")
        tensors[t.name] = TensorInfo(
            name=t.name, type=int(t.tensor_type), ne=tuple(int(x) for x in t.shape),
            data=reader.data[int(t.data_offset):end], offset=int(t.data_offset))
    return GGUFFile(path=path, magic=magic.decode(), version=version, metadata=metadata,
                    tensors=tensors, mapping=reader.data, file_size=size)
