"""The float64 reference of qwen35 / qwen35moe / qwen3next layers (HF's Qwen3-Next / Qwen3.5 modeling as llama.cpp's
graphs run it), called by reference_model.ReferenceModel for those architectures.

A gated delta net layer over the normed input h (n tokens of one sequence), its recurrent state in the cache:
    qkv = h W_qkv^T, z = h W_gate^T, b / a = h W_beta^T / h W_alpha^T (qwen3next: h W_ba^T, per key head b then a)
    c = silu(causal conv over [conv state; qkv] with ssm_conv1d), the state the last d_conv - 1 rows
    q, k = heads of c l2-normed (/ sqrt(sum x^2 + eps)), v the rest; value head h reads key head h % H_k (qwen35) or
        h // (H_v / H_k) (qwen3next)
    beta = sigmoid(b), g = softplus(a + dt_bias) * ssm_a
    per token: S = e^g S; d = beta (v - S^T k); S += k d^T; o = S^T q / sqrt(S_dim)
    out = (rmsnorm(o per head) * ssm_norm * silu(z)) W_out^T
A full-attention layer: attn_q gives each head's q then its gate; q, k per-head RMS-normed, NEOX rope over the first
n_rot dims, causal attention, times sigmoid(gate), attn_output. Then x += FFN(rmsnorm(x) * post_attention_norm)."""
from __future__ import annotations

import math

import numpy as np

ARCHS = ("qwen35", "qwen35moe", "qwen3next")


def setup(ref, m) -> None:
    """The ssm keys and each layer's kind (attention.recurrent_layers, else full_attention_interval, default 4)."""
    ref.ssm = dict(d_conv=int(m("ssm.conv_kernel")), S=int(m("ssm.state_size")), H_k=int(m("ssm.group_count")),
                   H_v=int(m("ssm.time_step_rank")))
    flags = m("attention.recurrent_layers")
    interval = int(m("full_attention_interval", 4))
    ref.recurrent = ([bool(f) for f in flags[:ref.n_layer]] if flags is not None
                     else [(li + 1) % interval != 0 for li in range(ref.n_layer)])
    ref.neox = True
    if ref.arch != "qwen35":
        ref.expert_gating = "softmax_norm"
    ref.qwen35_drop = ()   # pieces left out (tests): "conv", "l2", "gate_norm", "z", "decay", "beta", "q_gate"


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def gdn_layer(ref, L, li, h, cache):
    c, drop = ref.ssm, ref.qwen35_drop
    n, S, Hk, Hv, K = len(h), c["S"], c["H_k"], c["H_v"], c["d_conv"]
    C = 2 * Hk * S + Hv * S
    qkv, z = h @ L["attn_qkv"].T, h @ L["attn_gate"].T
    if "ssm_ba" in L:
        ba = (h @ L["ssm_ba"].T).reshape(n, Hk, 2, Hv // Hk)
        b, a = ba[:, :, 0, :].reshape(n, Hv), ba[:, :, 1, :].reshape(n, Hv)
    else:
        b, a = h @ L["ssm_beta"].T, h @ L["ssm_alpha"].T
    beta = sigmoid(b) if "beta" not in drop else np.ones_like(b)
    g = softplus(a + L["ssm_dt.bias"]) * L["ssm_a"] if "decay" not in drop else np.zeros_like(a)
    rs = cache.rs.setdefault(li, dict(conv=np.zeros((K - 1, C)), S=np.zeros((Hv, S, S))))
    xin = np.concatenate([rs["conv"], qkv], axis=0)                    # (K - 1 + n, C)
    w = L["ssm_conv1d"]                                                 # (C, K)
    conv = (np.stack([(xin[t:t + K] * w.T).sum(axis=0) for t in range(n)]) if "conv" not in drop
            else qkv)
    rs["conv"] = xin[n:] if K > 1 else rs["conv"]
    conv = silu(conv)
    q = conv[:, :Hk * S].reshape(n, Hk, S)
    k = conv[:, Hk * S:2 * Hk * S].reshape(n, Hk, S)
    v = conv[:, 2 * Hk * S:].reshape(n, Hv, S)
    if "l2" not in drop:
        q = q / np.sqrt((q * q).sum(axis=-1, keepdims=True) + ref.eps)
        k = k / np.sqrt((k * k).sum(axis=-1, keepdims=True) + ref.eps)
    kh = [hh // (Hv // Hk) if ref.arch == "qwen3next" else hh % Hk for hh in range(Hv)]
    state = rs["S"]                                                     # (Hv, S_k, S_v)
    o = np.empty((n, Hv, S))
    for t in range(n):
        for hh in range(Hv):
            st = state[hh] * math.exp(g[t, hh])
            kk, qq = k[t, kh[hh]], q[t, kh[hh]]
            d = beta[t, hh] * (v[t, hh] - st.T @ kk)
            st = st + np.outer(kk, d)
            state[hh] = st
            o[t, hh] = st.T @ qq / math.sqrt(S)
    if "gate_norm" not in drop:
        o = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + ref.eps) * L["ssm_norm"]
    if "z" not in drop:
        o = o * silu(z.reshape(n, Hv, S))
    return o.reshape(n, Hv * S) @ L["ssm_out"].T


def gated_attention(ref, L, li, h, pos, all_pos, cache):
    n, nh, hd, nkv = len(h), ref.n_head, ref.head_dim, ref.n_head_kv
    qg = (h @ L["attn_q"].T).reshape(n, nh, 2, hd)
    q, gate = qg[:, :, 0, :], qg[:, :, 1, :]
    k, v = (h @ L["attn_k"].T).reshape(n, nkv, hd), (h @ L["attn_v"].T).reshape(n, nkv, hd)
    q, k = ref.rmsnorm(q, L["attn_q_norm"]), ref.rmsnorm(k, L["attn_k_norm"])
    q, k = ref.rope(q, pos), ref.rope(k, pos)
    if cache.k[li] is not None:
        k, v = np.concatenate([cache.k[li], k]), np.concatenate([cache.v[li], v])
    cache.k[li], cache.v[li] = k, v
    mask = all_pos[None, :] <= pos[:, None]
    out = np.empty((n, nh, hd))
    for hh in range(nh):
        kv = hh // (nh // nkv)
        s = np.where(mask, q[:, hh] @ k[:, kv].T / math.sqrt(hd), -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, hh] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
    if "q_gate" not in ref.qwen35_drop:
        out = out * sigmoid(gate)
    return out.reshape(n, nh * hd) @ L["attn_output"].T


def layer(ref, L, li, x, pos, all_pos, cache, trace=None):
    """x after layer li (its state / KV appended to the cache)."""
    if not hasattr(cache, "rs"):
        cache.rs = {}
    h = ref.rmsnorm(x, L["attn_norm"])
    x = x + (gdn_layer(ref, L, li, h, cache) if ref.recurrent[li] else
             gated_attention(ref, L, li, h, pos, all_pos, cache))
    g = ref.rmsnorm(x, L["post_attention_norm"])
    x = x + ref.ffn(L, g, x, trace)
    if ref.control_vector is not None:
        x = x + ref.control_vector[li]
    return x
