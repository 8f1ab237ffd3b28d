"""One image's encode time through a Gemma-3-4B-shaped mmproj (SigLIP-400M shapes: 27 layers of 1152, 896 x 896
images, 4096 patches, 256 tokens projected to 2560; random weights, f16 as the converter writes them), ours against
llama.cpp's mtmd (tools/mtmd_ref, when built: /tmp/mtmd_ref/mtmd-ref).

    python bench/vision_encode.py [--threads 2] [--runs 3] [--dir /tmp/vision_bench]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools"), str(ROOT / "bindings")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="encodes of each, alternated (the first of each warms up)")
    ap.add_argument("--dir", default="/tmp/vision_bench")
    ap.add_argument("--mtmd-ref", default="/tmp/mtmd_ref/mtmd-ref")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    import model_files
    from make_mmproj import write_mmproj
    from vision_files import write_png, write_vision_text_model
    mm, text, img = d / "mmproj-4b-f16.gguf", d / "text-2560.gguf", d / "image.png"
    if not mm.exists():
        write_mmproj(mm, "gemma3-4b", dtype="f16")
    if not text.exists():   # a one-layer gemma3 of n_embd 2560: llama.cpp's mtmd needs a text model to load
        model_files.CONFIGS["gemma3"] = dict(model_files.CONFIGS["gemma3"], n_embd=2560, n_head=8, head_dim=256,
                                             n_ff=512, n_layer=1)
        write_vision_text_model(text)
    write_png(img, 1024, 768, 3)
    from powerinfer.vision import VisionProjector
    p = VisionProjector(mm, n_threads=a.threads)
    pix = p.preprocess(img)
    res = {"ours_ms": [], "llama_cpp_ms": []}
    have_ref = Path(a.mtmd_ref).exists()
    for _ in range(a.runs):   # alternated, one encode each, so that a busy machine weighs on both alike
        t0 = time.perf_counter()
        e = p.encode(pix)
        res["ours_ms"].append((time.perf_counter() - t0) * 1e3)
        if have_ref:
            out = subprocess.run([a.mtmd_ref, str(text), str(mm), str(img), "x <__media__> y", "0", str(a.threads),
                                  str(d / "ref"), "1"], capture_output=True, text=True, check=True)
            res["llama_cpp_ms"] += json.loads(out.stdout.strip().splitlines()[-1])["encode_ms"]
        print(json.dumps(res), file=sys.stderr, flush=True)
    if have_ref:
        ref = np.fromfile(d / "ref.embd", dtype=np.float32).reshape(e.shape)
        res["max_abs_diff"] = float(np.abs(ref - e).max())
        res["max_abs_ref"] = float(np.abs(ref).max())
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
