"""Float64 numpy reference of Gemma 3's vision tower and projector (llama.cpp's clip.cpp build_vit + siglip.cpp's
gemma3 branch), written from the formulas, independent of powerinfer.vision:

    x = unfold(pixels) @ patch_w^T + patch_b + pos          patches row-major, each [c][ky][kx]
    per block: x += attn(LN1(x)) Wo + bo;  x += gelu_tanh(LN2(x) Wup + bup) Wdown + bdown
        attn: per head softmax(q k^T / sqrt(head_dim)) v over all patches (no mask)
    x = LN_post(x); pooled = mean over n_merge x n_merge patch blocks; y = rmsnorm(pooled) * soft_emb_norm; y @ W_proj
"""
from __future__ import annotations

import numpy as np

from reference_model import dequantize, gelu, layer_norm, read_gguf


def load(path) -> tuple[dict, dict]:
    """(metadata, {name: float64 array of numpy shape reversed(ne)}) of an mmproj file."""
    meta, raw = read_gguf(path)
    return meta, {name: dequantize(data, t, ne) for name, (t, ne, data) in raw.items()}


def gemma3_tower(meta: dict, w: dict, pixels: np.ndarray, kv_f16: bool = False) -> np.ndarray:
    """float64 [n_image_tokens, n_embd_text] of a preprocessed image [3, S, S]; kv_f16: K and V rounded to f16 before
    the attention (llama.cpp's flash-attention path, powerinfer.vision's default)."""
    E = int(meta["clip.vision.embedding_length"])
    H = int(meta["clip.vision.attention.head_count"])
    L = int(meta["clip.vision.block_count"])
    S, ps = int(meta["clip.vision.image_size"]), int(meta["clip.vision.patch_size"])
    k = int(meta.get("clip.vision.projector.scale_factor", 4))
    eps = float(meta["clip.vision.attention.layer_norm_epsilon"])
    P, hd = S // ps, E // H
    x = np.asarray(pixels, dtype=np.float64)
    patches = x.reshape(3, P, ps, P, ps).transpose(1, 3, 0, 2, 4).reshape(P * P, 3 * ps * ps)
    x = patches @ w["v.patch_embd.weight"].reshape(E, -1).T + w["v.patch_embd.bias"] + w["v.position_embd.weight"]
    for il in range(L):
        p = f"v.blk.{il}."
        h = layer_norm(x, w[p + "ln1.weight"], w[p + "ln1.bias"], eps)
        q, kk, v = (h @ w[p + n + ".weight"].T + w[p + n + ".bias"] for n in ("attn_q", "attn_k", "attn_v"))
        if kv_f16:
            kk, v = (a.astype(np.float16).astype(np.float64) for a in (kk, v))
        q, kk, v = (a.reshape(-1, H, hd).transpose(1, 0, 2) for a in (q, kk, v))
        s = q @ kk.transpose(0, 2, 1) / np.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(1, 0, 2).reshape(-1, E) @ w[p + "attn_out.weight"].T + w[p + "attn_out.bias"]
        h = layer_norm(x, w[p + "ln2.weight"], w[p + "ln2.bias"], eps)
        u = gelu(h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
        x = x + u @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
    x = layer_norm(x, w["v.post_ln.weight"], w["v.post_ln.bias"], eps)
    n = P // k
    x = x.reshape(n, k, n, k, E).mean(axis=(1, 3)).reshape(n * n, E)
    x = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w["mm.soft_emb_norm.weight"]
    return x @ w["mm.input_projection.weight"]   # stored (n_embd_v, n_embd_text): x @ W
