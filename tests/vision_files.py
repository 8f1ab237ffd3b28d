"""The vision tests' files: a tiny Gemma 3 text model whose vocabulary holds <start_of_image> / <end_of_image> (control
tokens, as Gemma 3's), the tiny random mmproj of tools/make_mmproj.py that projects into its n_embd (128), and small
deterministic PNG images.

    write_vision_text_model(path)     gemma3 (tests/model_files.py's CONFIGS["gemma3"]: n_embd 128, 7 layers, a
                                      sliding window of 5) with the two image markers as tokens 318 and 319
    write_mmproj(path, "tiny")        2 SigLIP blocks of 64, 32 x 32 images, 16 image tokens (tools/make_mmproj.py)
    write_png(path, w, h, seed)       a w x h RGB PNG of smooth random colours
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf import GGUFValueType as VT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_mmproj import PRESETS, write_mmproj  # noqa: E402,F401

from model_files import rewrite, write_arch_model  # noqa: E402

IMAGE_TOKENS = {"<start_of_image>": 318, "<end_of_image>": 319}


def write_vision_text_model(path, seed: int = 0, chat_template: str | None = None) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".base.gguf")
    write_arch_model(tmp, "gemma3", seed=seed, chat_template=chat_template)
    r = GGUFReader(tmp)
    tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    for tok, i in IMAGE_TOKENS.items():
        tokens[i], types[i] = tok, 3   # CONTROL
    meta = {"tokenizer.ggml.tokens": (tokens, VT.ARRAY, VT.STRING),
            "tokenizer.ggml.token_type": (types, VT.ARRAY, VT.INT32)}
    rewrite(tmp, path, meta=meta)
    tmp.unlink()
    return path


def image_array(w: int, h: int, seed: int = 0) -> np.ndarray:
    """uint8 [h, w, 3]: smooth random colours (a low-frequency field, so that resizing matters but is not noise)"""
    rng = np.random.default_rng(seed)
    small = rng.uniform(0, 255, (4, 4, 3))
    ys, xs = np.linspace(0, 3, h), np.linspace(0, 3, w)
    y0, x0 = np.minimum(ys.astype(int), 2), np.minimum(xs.astype(int), 2)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    a = small[y0][:, x0] * (1 - fy) * (1 - fx) + small[y0 + 1][:, x0] * fy * (1 - fx) + \
        small[y0][:, x0 + 1] * (1 - fy) * fx + small[y0 + 1][:, x0 + 1] * fy * fx
    a += rng.normal(0, 12, a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


def write_png(path, w: int, h: int, seed: int = 0) -> Path:
    from PIL import Image
    Image.fromarray(image_array(w, h, seed)).save(path, format="PNG")
    return Path(path)
