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

    def _get_field_parts(self, orig_offs, raw_type):
        # gguf's generic path makes numpy memmap views per array element: ~20 s for the 262k-entry
        # tokens, scores and token types of Gemma 3. Arrays of strings are read in one pass over the
        # bytes (parts: each length, then each string); arrays of numbers as one view (one part).
        if int(raw_type) == GGUFValueType.ARRAY:
            itype = int(self._get(orig_offs, np.uint32)[0])
            if itype == GGUFValueType.STRING:
                return self._get_string_array(orig_offs)
            known = itype in GGUFValueType._value2member_map_
            nptype = self.gguf_scalar_to_np.get(GGUFValueType(itype)) if known else None
            if nptype is not None:
                raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
                values = self._get(orig_offs + 12, nptype, int(alen[0]))
                types = [GGUFValueType.ARRAY] + ([GGUFValueType(itype)] if int(alen[0]) else [])
                return 12 + int(values.nbytes), [raw_itype, alen, values], [2] if int(alen[0]) else [], types
        return super()._get_field_parts(orig_offs, raw_type)

    def _get_string_array(self, orig_offs):
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n, offs, size = int(alen[0]), orig_offs + 12, len(self.data)
        order = "big" if self.byte_order == "S" else "little"
        buf = memoryview(self.data)
        parts: list = [raw_itype, alen]
        idxs: list[int] = []
        for _ in range(n):
            if offs + 8 > size:
                raise ValueError(f"string array at offset {orig_offs} runs past the end of the file ({size} bytes)")
            slen = int.from_bytes(buf[offs:offs + 8], order)
            parts.append(buf[offs:offs + 8])
            offs += 8
            if slen > size - offs:
                raise ValueError(f"string of {slen} bytes at offset {offs} runs past the end of the file "
                                 f"({size} bytes)")
            parts.append(buf[offs:offs + slen])
            idxs.append(len(parts) - 1)
            offs += slen
        types = [GGUFValueType.ARRAY] + ([GGUFValueType.STRING] if n else [])
        return offs - orig_offs, parts, idxs, types

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


# The C core reads tensor data with aligned loads (floats, fp16 scales); the file's alignment
# (general.alignment, 32 by default) keeps every tensor aligned when it is at least this.
_MIN_DATA_ALIGN = 8


def _check_layout(reader: GGUFReader) -> None:
    """The tensor data layout llama.cpp's loader requires (gguf.cpp): in the order of the tensor
    infos, each tensor starts at the running sum of the previous sizes, each padded to
    general.alignment. This rejects misaligned offsets, overlapping or out-of-order tensors, gaps,
    and a type that does not match the bytes the file reserves for a tensor (e.g. one changed to a
    smaller type). ValueError naming the tensor."""
    align = int(reader.alignment)
    expected, prev = 0, None
    for t in reader.tensors:
        rel = int(t.data_offset) - int(reader.data_offset)
        nbytes = int(t.n_bytes)
        kind = f"tensor '{t.name}' ({t.tensor_type.name}, {nbytes} bytes)"
        if rel % align:
            raise ValueError(f"{kind} has data offset {rel}, not a multiple of general.alignment = {align}")
        if int(t.data_offset) % _MIN_DATA_ALIGN:
            raise ValueError(f"{kind} data at file offset {int(t.data_offset)} is not {_MIN_DATA_ALIGN}-byte "
                             f"aligned (general.alignment = {align}); this build needs aligned tensor data")
        if rel != expected:
            prev_kind = f"tensor '{prev.name}' ({prev.tensor_type.name}, {int(prev.n_bytes)} bytes)" if prev else ""
            what = f"overlaps {prev_kind}" if rel < expected else \
                f"leaves a gap after {prev_kind}" if prev else "does not start the data section"
            raise ValueError(f"{kind} has data offset {rel}, expected {expected}: it {what} (tensor data must be "
                             "contiguous, in the order of the tensor infos, each padded to general.alignment; "
                             "the file is corrupt or a tensor's type or shape was changed)")
        expected, prev = rel + (nbytes + align - 1) // align * align, t


def _read_into_memory(path: Path, size: int) -> np.ndarray:
    """The whole file in anonymous memory (llama.cpp's --no-mmap): page-aligned, transparent huge pages asked for, so
    the weights depend neither on the page cache nor on the file staying as it is."""
    import mmap
    buf = mmap.mmap(-1, max(size, 1))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    data = np.frombuffer(buf, dtype=np.uint8)[:size]
    with open(path, "rb") as f:
        done = 0
        while done < size:
            n = f.readinto(memoryview(data)[done:])
            if not n:
                raise ModelLoadError(f"{path}: the file shrank while it was read ({done} of {size} bytes)")
            done += n
    return data


def open_gguf(path: str | os.PathLike, *, use_mmap: bool = True) -> GGUFFile:
    """The file's metadata and tensor views; use_mmap=False: the views into a copy read into memory (llama.cpp's
    --no-mmap) instead of the file's mapping."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.gguf"))[:5]
        raise ModelLoadError(f"{path}: is a directory, not a model file" +
                             (f" (GGUF files in it: {', '.join(found)})" if found else " (no .gguf file in it)"))
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

    try:
        _check_layout(reader)
    except ValueError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    tensors: dict[str, TensorInfo] = {}
    data = reader.data if use_mmap else _read_into_memory(path, size)
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if int(t.data_offset) < 0 or end > size or t.data.nbytes != int(t.n_bytes):
            raise ModelLoadError(f"{path}: tensor '{t.name}' data [{t.data_offset}, {end}) lies outside the file "
                                 f"({size} bytes): the file is truncated or corrupt")
        tensors[t.name] = TensorInfo(
            name=t.name, type=int(t.tensor_type), ne=tuple(int(x) for x in t.shape),
            data=data[int(t.data_offset):end], offset=int(t.data_offset))
    return GGUFFile(path=path, magic=magic.decode(), version=version, metadata=metadata,
                    tensors=tensors, mapping=data, file_size=size)
