"""Shared pieces of the converters: the error type and lazily loaded source tensors."""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

log = logging.getLogger("powerinfer.convert")


class ConversionError(Exception):
    """A conversion that cannot be done: bad or missing inputs, unsupported models or options.
    The message is one line that names the file or setting at fault."""


# dtype names as safetensors spells them
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


class LazyTensor:
    """A source tensor whose data is read only when `load()` is called.

    shape: numpy shape; dtype: "F32", "F16", "BF16", "F64", "I64", ... (safetensors names);
    load(): a numpy array of that shape (BF16 is widened to float32, exactly).
    """

    __slots__ = ("shape", "dtype", "_load", "source")

    def __init__(self, shape, dtype: str, load: Callable[[], np.ndarray], source: str = ""):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self._load = load
        self.source = source

    def load(self) -> np.ndarray:
        a = self._load()
        if tuple(a.shape) != self.shape:
            raise ConversionError(f"{self.source}: tensor data has shape {tuple(a.shape)}, "
                                  f"expected {self.shape}")
        return a

    def load_f32(self) -> np.ndarray:
        """The data as a contiguous float32 array."""
        if self.dtype not in FLOAT_DTYPES:
            raise ConversionError(f"{self.source}: tensor of dtype {self.dtype} where a float tensor was expected")
        return np.ascontiguousarray(self.load(), dtype=np.float32)

    def __repr__(self) -> str:
        return f"LazyTensor(shape={self.shape}, dtype={self.dtype}, source={self.source!r})"

    @classmethod
    def from_array(cls, a: np.ndarray, dtype: str | None = None, source: str = "") -> "LazyTensor":
        return cls(a.shape, dtype or numpy_dtype_name(a.dtype), lambda: a, source)


_NP_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.float64): "F64",
             np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
             np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


def numpy_dtype_name(dt) -> str:
    return _NP_NAMES.get(np.dtype(dt), str(np.dtype(dt)))
