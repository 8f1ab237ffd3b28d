#!/usr/bin/env python3
"""One llama-shaped model in the common llama.cpp file types, for `bench.py`'s per-type comparison.

    python bench/make_quant_models.py [OUTDIR] [--types q8_0,q6_k,...]

Writes OUTDIR/m1b_f16.gguf and m1b_bf16.gguf with tools/make_test_model.py (542M parameters: llama-7B's
vocabulary and head size, n_embd 2048, n_ff 5632, 16 heads, 8 layers; random weights), then quantizes
the f16 file with llama.cpp's own quantizer (`llama_cpp.llama_model_quantize`, llama-cpp-python, the
benchmark's peer) into OUTDIR/m1b_<type>.gguf: its K-quant mixes (q4_k_m keeps some tensors in q6_k,
as llama-quantize does), so these are the files users download. Default OUTDIR /tmp; about 5 GB in all,
2 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = ["--preset", "7b", "--n-embd", "2048", "--n-ff", "5632", "--n-head", "16", "--n-head-kv", "16",
         "--n-layer", "8"]
TYPES = "q8_0,q6_k,q5_k_m,q4_k_m,q3_k_m,q2_k,q5_1,q4_1,q4_0,iq4_xs,iq4_nl,iq3_s,iq3_m"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", nargs="?", default="/tmp")
    ap.add_argument("--types", default=TYPES, help=f"comma list of llama.cpp ftypes (default {TYPES})")
    a = ap.parse_args(argv)
    try:
        import llama_cpp
    except ImportError as e:
        print(f"make_quant_models: error: needs llama-cpp-python ({e}); see bench/README.md", file=sys.stderr)
        return 1
    names = [t for t in a.types.split(",") if t]
    unknown = [t for t in names if not hasattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + t.upper())]
    if unknown:
        print(f"make_quant_models: error: llama.cpp has no file type {', '.join(unknown)}", file=sys.stderr)
        return 1
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    for dtype in ("f16", "bf16"):
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_test_model.py"), str(out / f"m1b_{dtype}.gguf"),
                        "--dtype", dtype, *SHAPE], check=True)
    src = str(out / "m1b_f16.gguf").encode()
    for name in names:
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype, p.nthread = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + name.upper()), 0
        dst = out / f"m1b_{name}.gguf"
        if llama_cpp.llama_model_quantize(src, str(dst).encode(), ctypes.byref(p)) != 0:
            print(f"make_quant_models: error: quantizing to {name} failed", file=sys.stderr)
            return 1
        print(f"{dst}: {dst.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
