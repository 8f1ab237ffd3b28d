#!/usr/bin/env python3
"""Write a copy of a GGUF file with every tensor dequantized to f32 (same metadata).

    python tools/dequantize_gguf.py MODEL.gguf OUT-f32.gguf

Run through our f32 path it is an exact-weights reference: the same quantized weights, with no
8-bit activation quantization and float32 accumulation, to judge how far a quantized forward pass
(ours or llama.cpp's) is from the result its weights define (tests/compat/test_gemma3.py).
"""
from __future__ import annotations

import argparse

import gguf
import numpy as np


def field_value(f):
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        sub = f.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data], sub
        return [f.parts[i].tolist()[0] for i in f.data], sub
    if t == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8"), None
    return f.parts[f.data[0]].tolist()[0], None


def writer_like(r: gguf.GGUFReader, dst: str) -> gguf.GGUFWriter:
    """A GGUFWriter for dst with every key/value of r (its architecture included); tensors are the caller's."""
    w = gguf.GGUFWriter(dst, field_value(r.fields["general.architecture"])[0])
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        val, sub = field_value(f)
        w.add_key_value(f.name, val, f.types[0], sub_type=sub)
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    w = writer_like(r, a.dst)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape(tuple(int(x) for x in reversed(t.shape.tolist()))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
