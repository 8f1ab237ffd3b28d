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

from powerinfer.gguf_copy import write, writer_like


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
    write(w)


if __name__ == "__main__":
    main()
