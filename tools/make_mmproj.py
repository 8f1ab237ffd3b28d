"""Write a random Gemma 3 multimodal projector (mmproj) GGUF, the keys and tensors llama.cpp's convert_hf_to_gguf.py
--mmproj writes for Gemma3VisionModel (conversion/gemma.py): general.architecture "clip", clip.projector_type
"gemma3", v.* SigLIP tensors (patch and position embeddings f32, 2-d weights f16 / f32 / q8_0, norms and biases
f32), mm.input_projection.weight (f16) and mm.soft_emb_norm.weight. Deterministic for a seed.

    python tools/make_mmproj.py OUT.gguf [--preset tiny|gemma3-4b] [--n-embd-text N] [--dtype f16] [--seed 0]

tiny: a 2-layer tower of 64 on 32 x 32 images in 4-pixel patches pooled 2 x 2 (16 image tokens), for tests;
gemma3-4b: SigLIP-400M's shapes (27 layers of 1152, 16 heads, n_ff 4304, 896 x 896 images in 14-pixel patches, 256
tokens) projected to Gemma 3 4B's n_embd 2560, for timing encodes (random weights).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize

PRESETS = {
    "tiny": dict(n_embd=64, n_head=4, n_ff=128, n_layer=2, image_size=32, patch_size=4, n_merge=2, n_embd_text=128),
    "gemma3-4b": dict(n_embd=1152, n_head=16, n_ff=4304, n_layer=27, image_size=896, patch_size=14, n_merge=4,
                      n_embd_text=2560),
}
TYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0}


def mmproj_weights(c: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """numpy arrays in GGUF order reversed (shape (ne[1], ne[0]) etc.), float32."""
    rng = np.random.default_rng(seed)
    E, F, ps, P, T = c["n_embd"], c["n_ff"], c["patch_size"], c["image_size"] // c["patch_size"], c["n_embd_text"]

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def vec(n, base=0.0, s=0.1):
        return (base + s * rng.standard_normal(n)).astype(np.float32)

    w = {"v.patch_embd.weight": (rng.standard_normal((E, 3, ps, ps)) / np.sqrt(3 * ps * ps)).astype(np.float32),
         "v.patch_embd.bias": vec(E),
         "v.position_embd.weight": (0.5 * rng.standard_normal((P * P, E))).astype(np.float32)}
    for il in range(c["n_layer"]):
        p = f"v.blk.{il}."
        for n in ("ln1", "ln2"):
            w[p + n + ".weight"], w[p + n + ".bias"] = vec(E, 1.0), vec(E)
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w[p + n + ".weight"], w[p + n + ".bias"] = mat(E, E), vec(E)
        w[p + "ffn_up.weight"], w[p + "ffn_up.bias"] = mat(F, E), vec(F)
        w[p + "ffn_down.weight"], w[p + "ffn_down.bias"] = mat(E, F), vec(E)
    w["v.post_ln.weight"], w["v.post_ln.bias"] = vec(E, 1.0), vec(E)
    w["mm.soft_emb_norm.weight"] = vec(E, 1.0)
    w["mm.input_projection.weight"] = (rng.standard_normal((E, T)) / np.sqrt(E)).astype(np.float32)  # x @ W
    return w


def tensor_type(name: str, arr: np.ndarray, dtype: str) -> Q:
    if arr.ndim == 1 or ".position_embd." in name or ".patch_embd." in name:
        return Q.F32          # the converter's ".embeddings." -> F32, and 1-d tensors
    if "input_projection" in name:
        return Q.F16          # always F16 (llama.cpp issue 13025)
    return TYPES[dtype]


def write_mmproj(path, preset: str = "tiny", *, seed: int = 0, dtype: str = "f16", n_embd_text: int | None = None,
                 overrides: dict | None = None, meta: dict | None = None, drop=()) -> dict[str, np.ndarray]:
    """Write the file; return its float32 weights (as written before rounding to the file's types). overrides:
    changes to the preset's shape; meta: keys to set / replace (None: drop the key); drop: tensors left out."""
    c = dict(PRESETS[preset], **(overrides or {}))
    if n_embd_text is not None:
        c["n_embd_text"] = n_embd_text
    w = mmproj_weights(c, seed)
    g = GGUFWriter(str(path), "clip")
    keys = {
        "general.type": "mmproj", "general.file_type": 1,
        "clip.has_vision_encoder": True, "clip.projector_type": "gemma3", "clip.use_gelu": True,
        "clip.vision.image_size": c["image_size"], "clip.vision.patch_size": c["patch_size"],
        "clip.vision.embedding_length": c["n_embd"], "clip.vision.feed_forward_length": c["n_ff"],
        "clip.vision.block_count": c["n_layer"], "clip.vision.attention.head_count": c["n_head"],
        "clip.vision.projection_dim": c["n_embd_text"],
        "clip.vision.attention.layer_norm_epsilon": 1e-6,
        "clip.vision.image_mean": [0.5, 0.5, 0.5], "clip.vision.image_std": [0.5, 0.5, 0.5],
    }
    if c["n_merge"] != 4:
        keys["clip.vision.projector.scale_factor"] = c["n_merge"]
    keys.update(meta or {})
    for k, v in keys.items():
        if v is None:
            continue
        if isinstance(v, bool):
            g.add_bool(k, v)
        elif isinstance(v, str):
            g.add_string(k, v)
        elif isinstance(v, int):
            g.add_uint32(k, v)
        elif isinstance(v, float):
            g.add_float32(k, v)
        else:
            g.add_array(k, [float(x) for x in v])
    for name, arr in w.items():
        if name in drop:
            continue
        t = tensor_type(name, arr, dtype)
        if t == Q.F32:
            g.add_tensor(name, arr)
        elif t == Q.F16:
            g.add_tensor(name, arr.astype(np.float16))
        else:
            g.add_tensor(name, quantize(arr, t), raw_dtype=t)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return w


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--dtype", choices=sorted(TYPES), default="f16")
    ap.add_argument("--n-embd-text", type=int)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write_mmproj(a.out, a.preset, seed=a.seed, dtype=a.dtype, n_embd_text=a.n_embd_text)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
