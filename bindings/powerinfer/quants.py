"""numpy quantizers and dequantizers for the weight types the converters write.

F32, F16, BF16, Q8_0 and Q4_0, byte-exact with ggml's reference (scalar) quantizers:
arithmetic in float32 in the same order as ggml, fp16 scales rounded to nearest-even.
Block layouts (powerinfer-spec.md section 8, little-endian):

- Q8_0: 32 elements in 34 bytes: ``d`` fp16, ``qs[32]`` int8. Value = q*d.
- Q4_0: 32 elements in 18 bytes: ``d`` fp16, ``qs[16]``; element j (0..15) is the low nibble
  of qs[j], element j+16 the high nibble. Value = (q - 8)*d.

Quantized data is handled as raw bytes: a float array of shape (..., n) becomes a uint8
array of shape (..., row_bytes(type, n)), i.e. one row of GGUF tensor data per numpy row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK = 32                  # elements per block, Q4_0 and Q8_0
Q4_0_BYTES = 18          # fp16 d + 16 bytes of nibbles
Q8_0_BYTES = 34          # fp16 d + 32 int8


@dataclass(frozen=True)
class QuantType:
    name: str
    ggml_type: int       # ggml type id (GGUF tensor info)
    file_type: int       # llama_ftype written as general.file_type for a file mostly of this type
    block_size: int      # elements per block
    type_size: int       # bytes per block


TYPES: dict[str, QuantType] = {
    "f32": QuantType("f32", 0, 0, 1, 4),
    "f16": QuantType("f16", 1, 1, 1, 2),
    "q4_0": QuantType("q4_0", 2, 2, QK, Q4_0_BYTES),
    "q8_0": QuantType("q8_0", 8, 7, QK, Q8_0_BYTES),
    "bf16": QuantType("bf16", 30, 32, 1, 2),
}


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of one row of n elements; ValueError when n is not a multiple of the block size."""
    t = TYPES[type_name]
    if n % t.block_size:
        raise ValueError(f"{type_name}: row length {n} is not a multiple of the block size {t.block_size}")
    return n // t.block_size * t.type_size


def can_quantize(type_name: str, n: int) -> bool:
    """True when rows of n elements can be stored as type_name."""
    return n % TYPES[type_name].block_size == 0


# --------------------------------------------------------------------------------------
# F16 / BF16
# --------------------------------------------------------------------------------------
def float_to_f16(x: np.ndarray) -> np.ndarray:
    """float -> IEEE half (numpy float16, round-to-nearest-even like ggml's FP32_TO_FP16)."""
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def float_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16): top 16 bits with round-to-nearest-even (NaN kept quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = np.where(is_nan, (u >> 16) | 0x40, r)
    return r.astype(np.uint16)


def bf16_to_float(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16, or the raw bytes as uint8) -> float32 (exact)."""
    b = np.asarray(bits)
    if b.dtype == np.uint8:
        b = np.ascontiguousarray(b).view(np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


# --------------------------------------------------------------------------------------
# Q8_0
# --------------------------------------------------------------------------------------
def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float rows (..., n) with n % 32 == 0 -> uint8 (..., n//32*34).

    Per block: amax = max|x|, d = amax/127, id = 1/d (0 if d == 0),
    q = roundf(x*id) (half away from zero); stored: fp16(d), int8 q[32].
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK:
        raise ValueError("Q8_0 row length must be a multiple of 32")
    lead = x.shape[:-1]
    b = x.reshape(-1, QK)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = (b * idv).astype(np.float32)
    a = np.abs(v)
    fl = np.floor(a)
    q = np.sign(v) * (fl + np.floor(2 * (a - fl)))                     # roundf, exact
    out = np.empty((b.shape[0], Q8_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(*lead, -1)


def dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    """uint8 rows (..., nb*34) -> float32 (..., nb*32)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim == 0 or raw.shape[-1] % Q8_0_BYTES:
        raise ValueError("Q8_0 data rows must be a multiple of 34 bytes")
    lead = raw.shape[:-1]
    b = raw.reshape(-1, Q8_0_BYTES)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(*lead, -1)


# --------------------------------------------------------------------------------------
# Q4_0
# --------------------------------------------------------------------------------------
def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float rows (..., n) with n % 32 == 0 -> uint8 (..., n//32*18).

    Per block: max = element with the largest |x| (sign kept), d = max/-8, id = 1/d,
    q = min(15, int(x*id + 8.5)); stored: fp16(d), qs[16] with element j in the low
    nibble of qs[j] and element j+16 in the high nibble.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % QK:
        raise ValueError("Q4_0 row length must be a multiple of 32")
    lead = x.shape[:-1]
    b = x.reshape(-1, QK)
    imax = np.abs(b).argmax(axis=1)[:, None]
    mx = np.take_along_axis(b, imax, axis=1)
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    v = (b * idv + np.float32(8.5)).astype(np.float32)
    q = np.minimum(np.trunc(v), 15).astype(np.uint8)                   # v >= 0.5 always
    out = np.empty((b.shape[0], Q4_0_BYTES), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << np.uint8(4))
    return out.reshape(*lead, -1)


def dequantize_q4_0(raw: np.ndarray) -> np.ndarray:
    """uint8 rows (..., nb*18) -> float32 (..., nb*32)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim == 0 or raw.shape[-1] % Q4_0_BYTES:
        raise ValueError("Q4_0 data rows must be a multiple of 18 bytes")
    lead = raw.shape[:-1]
    b = raw.reshape(-1, Q4_0_BYTES)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    qs = b[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - np.float32(8)
    return (q * d).reshape(*lead, -1)


# --------------------------------------------------------------------------------------
# generic
# --------------------------------------------------------------------------------------
def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """float rows (..., n) -> raw uint8 bytes (..., row_bytes(type_name, n)) of GGUF tensor data."""
    if type_name == "f32":
        a = np.ascontiguousarray(x, dtype=np.float32)
    elif type_name == "f16":
        a = np.ascontiguousarray(float_to_f16(x))
    elif type_name == "bf16":
        a = float_to_bf16(x)
    elif type_name == "q8_0":
        return quantize_q8_0(x)
    elif type_name == "q4_0":
        return quantize_q4_0(x)
    else:
        raise ValueError(f"unknown type {type_name!r} (known: {', '.join(TYPES)})")
    if a.ndim == 0:
        a = a.reshape(1)
    return a.view(np.uint8)


def dequantize(raw: np.ndarray, type_name: str) -> np.ndarray:
    """raw uint8 rows (..., row_bytes) of type_name -> float32 (..., n)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if type_name == "f32":
        return raw.view(np.float32).copy()
    if type_name == "f16":
        return raw.view(np.float16).astype(np.float32)
    if type_name == "bf16":
        return bf16_to_float(raw)
    if type_name == "q8_0":
        return dequantize_q8_0(raw)
    if type_name == "q4_0":
        return dequantize_q4_0(raw)
    raise ValueError(f"unknown type {type_name!r} (known: {', '.join(TYPES)})")


def type_name_of(ggml_type: int) -> str:
    """ggml type id -> name of the types above; ValueError for others."""
    for t in TYPES.values():
        if t.ggml_type == ggml_type:
            return t.name
    raise ValueError(f"ggml type {ggml_type} is not one of {', '.join(TYPES)}")
