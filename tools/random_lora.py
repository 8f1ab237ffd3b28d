#!/usr/bin/env python3
"""A random LoRA adapter (llama.cpp's GGUF layout) for any base GGUF file: the test suite's adapters and the
benchmark's (bench/bench.py --lora). Deterministic for a seed.

    python tools/random_lora.py BASE.gguf OUT.gguf [--rank 16] [--alpha 32] [--targets all-linear|attn_q,attn_v,...]
        [--dtype f16|f32] [--seed 0]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings"))
from powerinfer.gguf_file import open_gguf  # noqa: E402

LORA_ALL_LINEAR = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(path, base, *, targets=("attn_q", "attn_v"), rank: int = 8, alpha: float = 16.0, dtype: str = "f32",
               seed: int = 0, arch: str | None = None, extra=(), drop=()) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A random LoRA adapter of the base file (llama.cpp's layout: general.type adapter, adapter.lora.alpha,
    "<weight>.lora_a" ne [n_in, r], ".lora_b" ne [r, n_out]; token_embd's pair flipped: a ne [r, n_vocab], b ne
    [r, n_embd]). targets: per-layer parts (every layer), "output" and / or "token_embd"; extra: more tensor names
    (random [4, 4]); drop: names left out. Returns {weight name: (a, b)} as float32 numpy arrays (numpy shape =
    reversed ne: a (r, n_in), b (n_out, r); token_embd: a (n_vocab, r), b (n_embd, r)), the values the file holds."""
    f = open_gguf(base)                                  # GGUF or PWRI
    shapes = {name: t.ne for name, t in f.tensors.items()}                    # ne order
    arch = arch or f.metadata["general.architecture"]
    del f
    rng = np.random.default_rng(seed)
    names = []
    for t in targets:
        if t in ("output", "token_embd"):
            names.append(f"{t}.weight")
        else:
            names += [n for n in shapes if n.startswith("blk.") and n.endswith(f".{t}.weight")]
    pairs, out = {}, {}
    for name in names:
        ne0, ne1 = shapes[name][:2]                          # the weight: [n_in, n_out]
        if name == "token_embd.weight":
            a = rng.standard_normal((ne1, rank)).astype(np.float32)                      # ne [r, n_vocab]
            b = (rng.standard_normal((ne0, rank)) / math.sqrt(rank)).astype(np.float32)  # ne [r, n_embd]
        else:
            a = (rng.standard_normal((rank, ne0)) / math.sqrt(ne0)).astype(np.float32)  # ne [n_in, r]
            b = (rng.standard_normal((ne1, rank)) / math.sqrt(rank)).astype(np.float32)  # ne [r, n_out]
        if dtype == "f16":   # the values the file holds
            a, b = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
        pairs[name] = (a, b)
        out[name + ".lora_a"], out[name + ".lora_b"] = a, b
    for name in extra:
        out[name] = rng.standard_normal((4, 4)).astype(np.float32)
    w = GGUFWriter(str(path), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, arr in out.items():
        if name in drop:
            continue
        data, q = (arr.astype(np.float16), Q.F16) if dtype == "f16" else (arr, Q.F32)
        w.add_tensor(name, data, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--targets", default="attn_q,attn_v",
                    help="comma-separated weight parts (attn_q, ..., ffn_down, output, token_embd) or all-linear")
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    targets = LORA_ALL_LINEAR if a.targets == "all-linear" else tuple(a.targets.split(","))
    try:
        pairs = write_lora(a.out, a.base, targets=targets, rank=a.rank, alpha=a.alpha, dtype=a.dtype, seed=a.seed)
    except (OSError, KeyError, ValueError) as e:
        print(f"random_lora: {e}", file=sys.stderr)
        return 1
    print(f"{a.out}: {len(pairs)} weights adapted, rank {a.rank}, alpha {a.alpha:g}, {a.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
