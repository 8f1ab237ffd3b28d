"""The float64 numpy reference of the encoders (powerinfer.encoder: bert, nomic-bert), written from llama.cpp's bert
graph (src/models/bert.cpp) and build_pooling; the decoders' reference is reference_model.py, whose file reader,
dequantizers, GELU (tanh form, as ggml) and LayerNorm this one shares.

Contract (what the engine must match), per input sequence of n tokens at positions 0..n-1 (sequences never see each
other):
  x = token_embd[tok] + token_types[0] (+ position_embd[pos]: bert)
  x = LayerNorm(x) * token_embd_norm.weight + token_embd_norm.bias          (eps: attention.layer_norm_epsilon)
  per layer:
    q, k, v = Wq x (+ bq), Wk x (+ bk), Wv x (+ bv)       (nomic-bert: one attn_qkv, rows q | k | v; no biases)
    nomic-bert: NEOX rope of q and k over the whole head, base rope.freq_base
    per head: softmax(q k^T / sqrt(head_dim)) v over ALL n tokens (no causal mask)
    a = Wo concat(heads) (+ bo)
    x = LayerNorm(x + a) * attn_output_norm + b
    f = W_down gelu(W_up x + b_up) + b_down               (nomic-bert: W_down (silu(W_gate x) * W_up x))
    x = LayerNorm(x + f) * layer_output_norm + b
  the hidden states are the last x, no output norm; pooling: mean / cls (row 0) / last, rank: z = x[0], z = tanh(cls z
  + cls.bias) where the file has cls.weight, score = cls.output z + cls.output.bias
"""
from __future__ import annotations

import numpy as np

from reference_model import dequantize, gelu, layer_norm, read_gguf, silu


class ReferenceEncoder:
    def __init__(self, path):
        meta, tensors = read_gguf(path)
        self.arch = meta["general.architecture"]
        a = self.arch
        self.E = int(meta[f"{a}.embedding_length"])
        self.H = int(meta[f"{a}.attention.head_count"])
        self.L = int(meta[f"{a}.block_count"])
        self.eps = float(meta[f"{a}.attention.layer_norm_epsilon"])
        self.base = float(meta.get(f"{a}.rope.freq_base", 10000.0))
        self.W = {n: dequantize(raw, t, ne).reshape(tuple(reversed(ne))) for n, (t, ne, raw) in tensors.items()}

    def w(self, name):
        return self.W.get(name)

    def rope_neox(self, x, pos):
        """x [n, H, hd]: pairs (i, i + hd/2) rotated by pos * base^(-2i/hd)."""
        hd = x.shape[-1]
        half = hd // 2
        theta = pos[:, None] * self.base ** (-np.arange(half) * 2.0 / hd)[None, :]     # [n, half]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)

    def hidden(self, tokens) -> np.ndarray:
        """[n, n_embd] final hidden states of one sequence."""
        tok = np.asarray(tokens)
        n, E, H = len(tok), self.E, self.H
        hd = E // H
        pos = np.arange(n, dtype=np.float64)
        x = self.W["token_embd.weight"][tok].copy()
        if self.w("token_types.weight") is not None:
            x += self.W["token_types.weight"][0]
        if self.w("position_embd.weight") is not None:
            x += self.W["position_embd.weight"][:n]
        x = layer_norm(x, self.W["token_embd_norm.weight"], self.W["token_embd_norm.bias"], self.eps)
        for il in range(self.L):
            p = f"blk.{il}."
            if self.w(p + "attn_qkv.weight") is not None:
                qkv = x @ self.W[p + "attn_qkv.weight"].T
                q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
            else:
                q, k, v = (x @ self.W[p + f"attn_{c}.weight"].T + (self.w(p + f"attn_{c}.bias") if
                                                                 self.w(p + f"attn_{c}.bias") is not None else 0.0)
                           for c in "qkv")
            q, k, v = (t.reshape(n, H, hd) for t in (q, k, v))
            if self.arch == "nomic-bert":
                q, k = self.rope_neox(q, pos), self.rope_neox(k, pos)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = np.einsum("hts,shd->thd", s, v).reshape(n, E)
            a = att @ self.W[p + "attn_output.weight"].T
            if self.w(p + "attn_output.bias") is not None:
                a += self.W[p + "attn_output.bias"]
            x = layer_norm(x + a, self.W[p + "attn_output_norm.weight"], self.W[p + "attn_output_norm.bias"], self.eps)
            up = x @ self.W[p + "ffn_up.weight"].T
            if self.w(p + "ffn_up.bias") is not None:
                up += self.W[p + "ffn_up.bias"]
            h = silu(x @ self.W[p + "ffn_gate.weight"].T) * up if self.w(p + "ffn_gate.weight") is not None \
                else gelu(up)
            f = h @ self.W[p + "ffn_down.weight"].T
            if self.w(p + "ffn_down.bias") is not None:
                f += self.W[p + "ffn_down.bias"]
            x = layer_norm(x + f, self.W[p + "layer_output_norm.weight"], self.W[p + "layer_output_norm.bias"],
                           self.eps)
        return x

    def pooled(self, tokens, pooling: str) -> np.ndarray:
        h = self.hidden(tokens)
        if pooling == "none":
            return h
        if pooling == "mean":
            return h.mean(0)
        if pooling == "last":
            return h[-1]
        z = h[0]
        if pooling == "cls":
            return z
        if self.w("cls.weight") is not None:          # rank
            z = np.tanh(self.W["cls.weight"] @ z + self.W["cls.bias"])
        if self.w("cls.output.weight") is not None:
            z = self.W["cls.output.weight"] @ z + self.W["cls.output.bias"]
        return z
