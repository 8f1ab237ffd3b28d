"""Write tests/fixtures/mtmd_gemma3.npz: what llama.cpp's mtmd (tools/mtmd_ref, built by its build.sh) makes of the
vision tests' deterministic files (tests/vision_files.py: the tiny gemma3 text model, tiny mmproj files in f16 / f32 /
q8_0, small PNG and JPEG images): per case the preprocessed image (float32 [3, S, S]), the projected embeddings,
the prompt's text chunks, its last logits and 8 greedy tokens after it. tests/test_vision.py compares ours with them.

    sh tools/mtmd_ref/build.sh && python tools/mtmd_fixtures.py [--mtmd-ref /tmp/mtmd_ref/mtmd-ref]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools")]

PROMPT = "the cat <__media__> is a"
# name: (mmproj dtype, image (w, h, seed, format))
CASES = {
    "wide_f16": ("f16", (50, 40, 1, "PNG")),
    "square_f32": ("f32", (64, 64, 2, "PNG")),
    "tall_q8_0": ("q8_0", (20, 70, 3, "PNG")),
    "exact_f16": ("f16", (32, 32, 4, "PNG")),
    "jpeg_f16": ("f16", (48, 36, 5, "JPEG")),
}


def write_case_files(d: Path, name: str):
    """(text model, mmproj, image) of a case, written into d."""
    from vision_files import image_array, write_mmproj, write_vision_text_model
    from PIL import Image
    dtype, (w, h, seed, fmt) = CASES[name]
    text = d / "text.gguf"
    if not text.exists():
        write_vision_text_model(text)
    mm = d / f"mmproj-{dtype}.gguf"
    if not mm.exists():
        write_mmproj(mm, "tiny", dtype=dtype)
    img = d / f"{name}.{fmt.lower()}"
    Image.fromarray(image_array(w, h, seed)).save(img, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return text, mm, img


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtmd-ref", default="/tmp/mtmd_ref/mtmd-ref")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "mtmd_gemma3.npz"))
    a = ap.parse_args()
    arrays = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name in CASES:
            text, mm, img = write_case_files(d, name)
            out = subprocess.run([a.mtmd_ref, str(text), str(mm), str(img), PROMPT, "8", "2", str(d / name)],
                                 capture_output=True, text=True, check=True)
            js = json.loads(out.stdout.strip().splitlines()[-1])
            info = js["chunks"][1]
            arrays[f"{name}.pix"] = np.fromfile(d / f"{name}.pix", dtype=np.float32).reshape(3, info["ny"], info["nx"])
            arrays[f"{name}.embd"] = np.fromfile(d / f"{name}.embd", dtype=np.float32).reshape(info["image_tokens"], -1)
            arrays[f"{name}.before"] = np.asarray(js["chunks"][0], dtype=np.int32)
            arrays[f"{name}.after"] = np.asarray(js["chunks"][2], dtype=np.int32)
            arrays[f"{name}.logits"] = np.fromfile(d / f"{name}.logits", dtype=np.float32)
            arrays[f"{name}.generated"] = np.asarray(js["generated"], dtype=np.int32)
            arrays[f"{name}.non_causal"] = np.asarray(info["non_causal"])
    np.savez_compressed(a.out, **arrays)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
