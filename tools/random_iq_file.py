#!/usr/bin/env python3
"""A copy of a GGUF file whose weight matrices are random blocks of an IQ type (or any block type), each matrix
scaled to the RMS of the source's: files of the types llama.cpp quantizes to only with an importance matrix (IQ3_XXS,
IQ2_*, IQ1_*), for speed comparisons and for tests against llama.cpp (which runs them).

    python tools/random_iq_file.py SRC.gguf DST.gguf --type iq2_s [--all-matrices] [--seed 5]

By default only the layers' matrices (`blk.*`) are replaced; --all-matrices replaces the token table and the head
too (every 2-d tensor), as bench/README.md's 542M IQ2 / IQ1 files.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings"))
from powerinfer.gguf_copy import add_tensor_as_is, write, writer_like  # noqa: E402


def set_d(raw: np.ndarray, qtype, d: np.ndarray) -> None:
    """Each block's fp16 d: its first two bytes, or IQ1_M's, the top nibbles of its four scale words (bytes 48..55), or
    MXFP4's E8M0 byte (its first: the power of two 2^(e - 128) nearest d, as ggml's half scale)."""
    if qtype == gguf.GGMLQuantizationType.MXFP4:
        raw[:, 0] = np.clip(np.rint(np.log2(np.maximum(d, 2.0 ** -126))) + 128, 1, 254).astype(np.uint8)
        return
    bits = d.astype(np.float16).view(np.uint16).astype(np.int64)
    if qtype == gguf.GGMLQuantizationType.IQ1_M:
        sc = raw[:, 48:56].copy().view("<u2").astype(np.int64)
        sc = (sc & 0x0fff) | ((bits[:, None] >> (4 * np.arange(4))) & 15) << 12
        raw[:, 48:56] = sc.astype("<u2").view(np.uint8)
    else:
        raw[:, 0:2] = bits.astype("<u2").view(np.uint8).reshape(-1, 2)


def random_iq_file(src, dst, qtype, seed, all_matrices: bool = False) -> None:
    """A copy of src whose matrices are random blocks of qtype, d set so that each matrix has its f32 RMS (the RMS of
    the blocks' values from their first 4096 blocks: enough for a scale)."""
    rng = np.random.default_rng(seed)
    bs, bb = gguf.GGML_QUANT_SIZES[qtype]
    r = gguf.GGUFReader(src)
    w = writer_like(r, str(dst))
    for t in r.tensors:
        if len(t.shape) != 2 or not (all_matrices or t.name.startswith("blk.")):
            add_tensor_as_is(w, t)
            continue
        rows_, cols = int(t.shape[1]), int(t.shape[0])
        raw = rng.integers(0, 256, (rows_ * cols // bs, bb), dtype=np.uint8)
        set_d(raw, qtype, np.ones(len(raw)))
        rms = np.sqrt(np.mean(gguf.quants.dequantize(raw[:4096].reshape(1, -1), qtype).astype(np.float64) ** 2))
        d = np.sqrt(np.mean(np.asarray(t.data, np.float64) ** 2)) / rms
        set_d(raw, qtype, d * rng.uniform(0.5, 1.5, len(raw)))
        w.add_tensor(t.name, raw.reshape(rows_, -1), raw_dtype=qtype)
    write(w)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", required=True, help="a GGML block type, e.g. iq2_xxs, iq2_s, iq1_m")
    ap.add_argument("--all-matrices", action="store_true", help="the token table and the head too")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args(argv)
    try:
        qtype = gguf.GGMLQuantizationType[a.type.upper()]
    except KeyError:
        print(f"random_iq_file: error: no block type {a.type!r}", file=sys.stderr)
        return 1
    if qtype not in gguf.GGML_QUANT_SIZES or gguf.GGML_QUANT_SIZES[qtype][0] == 1:
        print(f"random_iq_file: error: {a.type} is not a block type", file=sys.stderr)
        return 1
    try:
        random_iq_file(a.src, a.dst, qtype, a.seed, a.all_matrices)
    except (OSError, ValueError) as e:
        print(f"random_iq_file: error: {e}", file=sys.stderr)
        return 1
    print(f"{a.dst}: {Path(a.dst).stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
