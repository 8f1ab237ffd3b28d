"""The float64 reference of lfm2 layers (HF's Lfm2 modeling as llama.cpp's llama_model_lfm2 graph runs it), called by
reference_model.ReferenceModel for that architecture.

Every layer: h = rmsnorm(x) * attn_norm (the "operator norm"); x += the layer's operator of h; x += SwiGLU FFN of
rmsnorm(x) * ffn_norm. The operator: where attention.head_count_kv[il] > 0, GQA attention with per-head q/k RMS norms
and NEOX rope (reference_model's attention); where it is 0, the short conv of h (n tokens of one sequence, its state in
the cache):
    b, c, x = split(h W_in^T into three of n_embd)
    conv = causal depthwise conv over [conv state; b * x] with shortconv.conv (n_embd, L): the state its last L - 1 rows
    out = (c * conv) W_out^T
The output norm is the file's token_embd_norm."""
from __future__ import annotations

import numpy as np

ARCHS = ("lfm2",)


def setup(ref, m) -> None:
    """Each layer's kind and KV heads (attention.head_count_kv, 0: a short conv), the conv's kernel length."""
    kv = m("attention.head_count_kv")
    kv = [int(v) for v in kv] if isinstance(kv, list) else [int(kv)] * ref.n_layer
    ref.n_head_kv = max(kv)
    ref.conv_layers = [v == 0 for v in kv]
    ref.l_cache = int(m("shortconv.l_cache"))
    ref.neox = True
    ref.lfm2_drop = ()   # pieces left out (tests): "conv", "b", "c", "qk_norm"
    ref.layer_geom = [dict(head_dim=ref.head_dim, n_head_kv=v or ref.n_head_kv, n_rot=ref.n_rot, local=False,
                           kv_source=li) for li, v in enumerate(kv)]


def shortconv(ref, L, li, h, cache):
    n, E, K = len(h), ref.n_embd, ref.l_cache
    bcx = h @ L["shortconv.in_proj"].T
    b, c, x = bcx[:, :E], bcx[:, E:2 * E], bcx[:, 2 * E:]
    drop = ref.lfm2_drop
    b, c = (np.ones_like(b) if "b" in drop else b), (np.ones_like(c) if "c" in drop else c)
    rs = cache.rs.setdefault(li, dict(conv=np.zeros((K - 1, E))))
    xin = np.concatenate([rs["conv"], b * x], axis=0)                   # (K - 1 + n, E)
    w = L["shortconv.conv"]                                             # (E, K)
    conv = np.stack([(xin[t:t + K] * w.T).sum(axis=0) for t in range(n)]) if "conv" not in drop else b * x
    rs["conv"] = xin[n:]
    return (c * conv) @ L["shortconv.out_proj"].T


def layer(ref, L, li, x, pos, all_pos, cache, trace=None):
    """x after layer li (its conv state / KV appended to the cache)."""
    if not hasattr(cache, "rs"):
        cache.rs = {}
    h = ref.rmsnorm(x, L["attn_norm"])
    if "qk_norm" in ref.lfm2_drop:
        L = {k: v for k, v in L.items() if k not in ("attn_q_norm", "attn_k_norm")}
    x = x + (shortconv(ref, L, li, h, cache) if ref.conv_layers[li] else ref.attention(L, li, h, pos, all_pos, cache))
    x = x + ref.ffn(L, ref.rmsnorm(x, L["ffn_norm"]), x, trace)
    if ref.control_vector is not None:
        x = x + ref.control_vector[li]
    return x
