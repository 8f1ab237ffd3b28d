"""Copies of GGUF files with changed tensors or metadata (tools/dequantize_gguf.py, tools/sparsify.py)."""
from __future__ import annotations

import gguf
import numpy as np


def field_value(f):
    """(value, array element type or None) of a GGUFReader field."""
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data], sub
        return [f.parts[i].tolist()[0] for i in f.data], sub
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8"), None
    return f.parts[f.data[0]].tolist()[0], None


def writer_like(r: gguf.GGUFReader, dst: str, skip=lambda name: False) -> gguf.GGUFWriter:
    """A GGUFWriter for dst with every key/value of r (its architecture included) except those skip(name)
    is true for; tensors are the caller's."""
    w = gguf.GGUFWriter(dst, field_value(r.fields["general.architecture"])[0])
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or skip(f.name):
            continue
        val, sub = field_value(f)
        w.add_key_value(f.name, val, f.types[0], sub_type=sub)
    return w


def add_tensor_as_is(w: gguf.GGUFWriter, t) -> None:
    """Copies a GGUFReader tensor (its stored bytes, whatever the type) into w."""
    if t.data.dtype == np.uint8:   # stored bytes [..., row bytes]: the writer derives the element shape
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    else:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))   # numpy order: the last dimension first
        w.add_tensor(t.name, t.data.reshape(shape), raw_dtype=t.tensor_type)


def write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
