"""Read PyTorch checkpoints (``torch.save`` zip format) without torch.

A ``torch.save`` file (PyTorch >= 1.6) is a zip archive (entries stored, not compressed)::

    <prefix>/data.pkl      the pickled object (protocol 2)
    <prefix>/data/<key>    the raw bytes of storage <key>, little-endian
    <prefix>/byteorder     "little" (absent in old files: little)
    <prefix>/version, ...

In data.pkl each tensor is ``torch._utils._rebuild_tensor_v2(storage, storage_offset, size,
stride, requires_grad, backward_hooks[, metadata])`` whose storage is a persistent id
``("storage", <torch.FloatStorage etc.>, key, location, numel)``. We unpickle with a restricted
``find_class`` that only knows these few globals (no arbitrary code runs), map the storages to
numpy (memory-mapped when the entry is stored uncompressed) and return `LazyTensor`s.

If this reader fails (legacy non-zip files, unusual globals) and torch is installed,
`load_torch_file` falls back to ``torch.load(..., weights_only=True)``.
"""
from __future__ import annotations

import collections
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..quants import bf16_to_float
from .common import ConversionError, LazyTensor, log

# storage class name -> (numpy dtype of the raw data, dtype name)
_STORAGES = {
    "FloatStorage": (np.float32, "F32"),
    "HalfStorage": (np.float16, "F16"),
    "BFloat16Storage": (np.uint16, "BF16"),
    "DoubleStorage": (np.float64, "F64"),
    "LongStorage": (np.int64, "I64"),
    "IntStorage": (np.int32, "I32"),
    "ShortStorage": (np.int16, "I16"),
    "CharStorage": (np.int8, "I8"),
    "ByteStorage": (np.uint8, "U8"),
    "BoolStorage": (np.bool_, "BOOL"),
}


class TorchReadError(Exception):
    """The file is not a torch.save zip archive this reader understands."""


class _StorageType:
    def __init__(self, name: str):
        self.name = name
        self.np_dtype, self.dtype_name = _STORAGES[name]


class _Storage:
    """One storage of the archive: read (mmap) on first use."""

    def __init__(self, archive: "_Archive", key: str, stype: _StorageType, numel: int):
        self.archive, self.key, self.stype, self.numel = archive, key, stype, int(numel)
        self._data: np.ndarray | None = None

    def data(self) -> np.ndarray:
        if self._data is None:
            self._data = self.archive.storage_array(self.key, self.stype.np_dtype, self.numel)
        return self._data


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    if not isinstance(storage, _Storage):
        raise TorchReadError("tensor without a typed storage")
    size = tuple(int(s) for s in size)
    stride = tuple(int(s) for s in stride)
    offset = int(storage_offset)
    numel = int(np.prod(size)) if size else 1
    if numel and offset + sum((s - 1) * st for s, st in zip(size, stride)) >= storage.numel:
        raise TorchReadError(f"tensor of size {size} stride {stride} offset {offset} does not fit "
                             f"in storage {storage.key} of {storage.numel} elements")
    src = f"{storage.archive.path}:{storage.key}"

    def load() -> np.ndarray:
        base = storage.data()
        item = base.itemsize
        if numel == 0:
            a = np.zeros(size, dtype=base.dtype)
        else:
            a = np.lib.stride_tricks.as_strided(base[offset:], shape=size,
                                                strides=tuple(st * item for st in stride))
            a = np.array(a)                  # copy: contiguous, detached from the mapping
        if storage.stype.dtype_name == "BF16":
            return bf16_to_float(a)
        return a

    return LazyTensor(size, storage.stype.dtype_name, load, src)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, state=None):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    return func(*args)


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, archive: "_Archive"):
        super().__init__(f)
        self.archive = archive
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        if module == "torch._utils":
            if name == "_rebuild_tensor_v2":
                return _rebuild_tensor_v2
            if name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
                return _rebuild_parameter
        if module == "torch._tensor" and name == "_rebuild_from_type_v2":
            return _rebuild_from_type_v2
        if module == "torch.nn.parameter" and name == "Parameter":
            return lambda data=None, requires_grad=True: data
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise TorchReadError(f"unsupported object {module}.{name} in the pickle")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise TorchReadError(f"unsupported persistent id {pid!r}")
        stype, key, _location, numel = pid[1], str(pid[2]), pid[3], pid[4]
        if not isinstance(stype, _StorageType):
            raise TorchReadError(f"unsupported storage type {stype!r}")
        st = self.storages.get(key)
        if st is None:
            st = self.storages[key] = _Storage(self.archive, key, stype, numel)
        return st


class _Archive:
    def __init__(self, path: Path):
        self.path = path
        try:
            self.zf = zipfile.ZipFile(path)
        except zipfile.BadZipFile:
            raise TorchReadError("not a zip archive (a legacy torch.save file?)") from None
        names = self.zf.namelist()
        pkl = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pkl) != 1:
            raise TorchReadError("no single data.pkl in the archive")
        self.pkl_name = pkl[0]
        self.prefix = pkl[0][: -len("data.pkl")]
        bo = self.prefix + "byteorder"
        if bo in names and self.zf.read(bo).strip() not in (b"little", b""):
            raise TorchReadError(f"byte order {self.zf.read(bo).strip().decode()!r} is not supported")

    def storage_array(self, key: str, np_dtype, numel: int) -> np.ndarray:
        name = f"{self.prefix}data/{key}"
        try:
            info = self.zf.getinfo(name)
        except KeyError:
            raise ConversionError(f"{self.path}: storage {name} is missing from the archive") from None
        nbytes = np.dtype(np_dtype).itemsize * numel
        if info.file_size < nbytes:
            raise ConversionError(f"{self.path}: storage {name} has {info.file_size} bytes, expected {nbytes}")
        if info.compress_type == zipfile.ZIP_STORED and nbytes > 0:
            with open(self.path, "rb") as f:
                f.seek(info.header_offset)
                head = f.read(30)
            if len(head) == 30 and head[:4] == b"PK\x03\x04":
                n_name, n_extra = struct.unpack("<HH", head[26:30])
                start = info.header_offset + 30 + n_name + n_extra
                return np.memmap(self.path, dtype=np_dtype, mode="r", offset=start, shape=(numel,))
        return np.frombuffer(self.zf.read(name), dtype=np_dtype, count=numel)

    def load(self) -> Any:
        with self.zf.open(self.pkl_name) as f:
            return _Unpickler(f, self).load()


def read_torch_zip(path: str | Path) -> Any:
    """Unpickle a torch.save zip archive without torch; tensors come back as LazyTensor.
    Raises TorchReadError when the file is not in a form this reader understands."""
    path = Path(path)
    try:
        return _Archive(path).load()
    except (TorchReadError, ConversionError):
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            struct.error, zipfile.BadZipFile) as e:
        raise TorchReadError(f"{type(e).__name__}: {e}") from None


def _from_torch(obj: Any, path: Path) -> Any:
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        name = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}.get(t.dtype)
        if name is None:
            arr = t.numpy()
            return LazyTensor.from_array(arr, source=str(path))
        arr = (t.float() if name == "BF16" else t).contiguous().numpy()
        return LazyTensor.from_array(arr, name, source=str(path))
    if isinstance(obj, dict):
        return {k: _from_torch(v, path) for k, v in obj.items()}
    return obj


def load_torch_file(path: str | Path) -> Any:
    """Read a torch checkpoint: the torch-free reader first, then torch.load if torch is installed."""
    path = Path(path)
    try:
        return read_torch_zip(path)
    except TorchReadError as e:
        reason = str(e)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConversionError(f"{path}: cannot read this PyTorch file without torch ({reason}); "
                              "install torch or convert it to safetensors") from None
    log.info("%s: torch-free reader failed (%s); using torch.load", path, reason)
    import torch
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds
        raise ConversionError(f"{path}: torch.load failed: {type(e).__name__}: {e}") from None
    return _from_torch(obj, path)


def load_state_dict(path: str | Path) -> dict[str, LazyTensor]:
    """A flat {name: LazyTensor} state dict from a torch checkpoint (unwrapping a single
    'state_dict' / 'model' / 'module' level if that is what the file holds)."""
    path = Path(path)
    obj = load_torch_file(path)
    for _ in range(2):
        if isinstance(obj, dict) and len(obj) == 1:
            (k, v), = obj.items()
            if k in ("state_dict", "model", "module") and isinstance(v, dict):
                obj = v
    if not isinstance(obj, dict):
        raise ConversionError(f"{path}: expected a state dict (a mapping of names to tensors), "
                              f"found {type(obj).__name__}")
    out: dict[str, LazyTensor] = {}
    for k, v in obj.items():
        if not isinstance(v, LazyTensor):
            raise ConversionError(f"{path}: entry {k!r} is a {type(v).__name__}, not a tensor")
        out[str(k)] = v
    return out
