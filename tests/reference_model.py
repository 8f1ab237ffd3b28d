"""Independent float64 numpy reference implementation of the PowerInfer-py forward pass.

Reads a GGUF file (or a PWRI-magic file: same layout, first 4 bytes b"PWRI") with
``gguf.GGUFReader``, dequantizes every tensor with the numpy dequantizers below
(written from the ggml block layouts, NOT gguf.quants), and computes logits in float64.

Contract (what the engine must match):
  x = token_embd[tok]
  per layer:
    h = rmsnorm(x) * attn_norm,   rmsnorm(x) = x / sqrt(mean(x^2) + eps)
    q = Wq h, k = Wk h, v = Wv h                 (W numpy shape (out, in))
    RoPE "normal" mode per head on q, k: for i < head_dim/2,
        theta = pos * freq_scale * base^(-2i/n_rot),
        (x[2i], x[2i+1]) -> (x0 cos - x1 sin, x0 sin + x1 cos)
        freq_scale = 1/rope.scaling.factor for linear scaling, else 1
    attention per head, scale 1/sqrt(head_dim), causal (key j visible to query i iff
        pos[j] <= pos[i]), GQA: query head h uses kv head h // (n_head/n_head_kv)
    x += Wo concat(heads)
    g = rmsnorm(x) * ffn_norm
    llama  (PAR): hid = act(W_gate g) * (W_up g),   act = powerinfer.ffn_activation or silu
    bamboo (SYM): hid = act(W_gate g) * act(W_up g), act = powerinfer.ffn_activation or relu
    x += W_down hid
  logits = W_out (rmsnorm(x) * output_norm), W_out = output.weight or token_embd (tied)
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from gguf import GGUFReader

# ggml type ids (kept numeric on purpose: independent of gguf's enum)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30


# --------------------------------------------------------------------------------------
# dequantizers: raw little-endian bytes -> float64, from the block layouts
# --------------------------------------------------------------------------------------
def _fp16_to_f64(b: np.ndarray) -> np.ndarray:
    """(..., 2) uint8 little-endian IEEE half -> float64 (decoded by hand)."""
    u = b[..., 0].astype(np.uint32) | (b[..., 1].astype(np.uint32) << 8)
    sign = np.where(u >> 15, -1.0, 1.0)
    e = ((u >> 10) & 0x1F).astype(np.int64)
    m = (u & 0x3FF).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        val = np.where(e == 0, m * 2.0 ** -24, (1.0 + m / 1024.0) * np.exp2((e - 15).astype(np.float64)))
        val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
    return sign * val


def dequant_f32(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw, dtype=np.uint8).view("<f4").astype(np.float64)


def dequant_f16(raw: np.ndarray) -> np.ndarray:
    return _fp16_to_f64(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 2))


def dequant_bf16(raw: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 2)
    u = (b[:, 0].astype(np.uint32) << 16) | (b[:, 1].astype(np.uint32) << 24)
    with np.errstate(invalid="ignore"):
        return u.view("<f4").astype(np.float64)


def dequant_q8_0(raw: np.ndarray) -> np.ndarray:
    """Q8_0 block: 34 bytes = fp16 d, int8 q[32]; value = q * d."""
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 34)
    d = _fp16_to_f64(b[:, :2])
    q = b[:, 2:].view(np.int8).astype(np.float64)
    return (q * d[:, None]).reshape(-1)


def dequant_q4_0(raw: np.ndarray) -> np.ndarray:
    """Q4_0 block: 18 bytes = fp16 d, qs[16]; elem j = low nibble of qs[j],
    elem j+16 = high nibble of qs[j]; value = (nibble - 8) * d."""
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, 18)
    d = _fp16_to_f64(b[:, :2])
    qs = b[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64) - 8.0
    return (q * d[:, None]).reshape(-1)


DEQUANT = {
    GGML_F32: dequant_f32,
    GGML_F16: dequant_f16,
    GGML_BF16: dequant_bf16,
    GGML_Q8_0: dequant_q8_0,
    GGML_Q4_0: dequant_q4_0,
}


def dequantize(raw: np.ndarray, ggml_type: int, ne) -> np.ndarray:
    """raw bytes of a tensor -> float64 array of numpy shape reversed(ne)."""
    fn = DEQUANT.get(int(ggml_type))
    if fn is None:
        raise NotImplementedError(f"ggml type {int(ggml_type)} not supported by the reference")
    out = fn(np.asarray(raw).reshape(-1).view(np.uint8))
    shape = tuple(int(n) for n in reversed(list(ne)))
    assert out.size == int(np.prod(shape)), (out.size, shape)
    return out.reshape(shape)


# --------------------------------------------------------------------------------------
# file reading
# --------------------------------------------------------------------------------------
def read_gguf(path) -> tuple[dict, dict]:
    """-> (metadata {key: python value}, tensors {name: (ggml_type, ne tuple, raw uint8 bytes copy)}).
    Accepts the PWRI magic: the file is read into memory, the magic patched to GGUF in a
    private temporary copy which is handed to GGUFReader, and deleted afterwards."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    tmp = None
    if magic == b"PWRI":
        data = bytearray(path.read_bytes())
        data[:4] = b"GGUF"
        fd, tmp = tempfile.mkstemp(suffix=".gguf")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        del data
        src = tmp
    elif magic == b"GGUF":
        src = str(path)
    else:
        raise ValueError(f"{path}: bad magic {magic!r}")
    try:
        r = GGUFReader(src)
        meta = {}
        for k, fld in r.fields.items():
            if k.startswith("GGUF."):
                continue
            meta[k] = fld.contents()
        tensors = {}
        for t in r.tensors:
            raw = np.array(np.asarray(t.data).reshape(-1).view(np.uint8), copy=True)
            tensors[t.name] = (int(t.tensor_type), tuple(int(n) for n in t.shape), raw)
        del r
    finally:
        if tmp is not None:
            os.unlink(tmp)
    return meta, tensors


# --------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------
def silu(x):
    return x / (1.0 + np.exp(-x))


def relu(x):
    return np.maximum(x, 0.0)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ACTS = {"silu": silu, "relu": relu, "gelu": gelu}


class KVCache:
    def __init__(self, n_layer: int):
        self.k = [None] * n_layer   # per layer: (n_tok, n_head_kv, head_dim), post-RoPE
        self.v = [None] * n_layer
        self.pos = np.zeros(0, dtype=np.int64)


class ReferenceModel:
    def __init__(self, path):
        meta, tensors = read_gguf(path)
        self.meta = meta
        arch = meta["general.architecture"]
        if arch not in ("llama", "bamboo"):
            raise ValueError(f"unsupported architecture {arch!r}")
        self.arch = arch

        def m(key, default=None):
            return meta.get(f"{arch}.{key}", default)

        self.n_embd = int(m("embedding_length"))
        self.n_ff = int(m("feed_forward_length"))
        self.n_head = int(m("attention.head_count"))
        self.n_head_kv = int(m("attention.head_count_kv", self.n_head))
        self.n_layer = int(m("block_count"))
        self.n_ctx_train = int(m("context_length", 0))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(m("rope.dimension_count", self.head_dim))
        self.rope_base = float(m("rope.freq_base", 10000.0))
        self.eps = float(m("attention.layer_norm_rms_epsilon", 1e-5))
        scaling = m("rope.scaling.type")
        factor = m("rope.scaling.factor")
        if scaling == "linear" and factor:
            self.freq_scale = 1.0 / float(factor)
        elif scaling in (None, "none") or not factor:
            self.freq_scale = 1.0
        else:
            raise ValueError(f"unsupported rope scaling {scaling!r}")
        W = {name: dequantize(raw, tt, ne) for name, (tt, ne, raw) in tensors.items()}
        # PowerInfer layout: transposed down matrix and a predictor per layer (ReLU models only)
        self.sparse = "blk.0.ffn_down_t.weight" in W
        self.sparse_threshold = float(meta.get("powerinfer.sparse_threshold", 0.0))
        self.use_predictor = self.sparse      # False: compute every neuron
        act = meta.get("powerinfer.ffn_activation")
        if act is None:
            act = "relu" if arch == "bamboo" or self.sparse else "silu"
        if act not in ACTS:
            raise ValueError(f"unsupported ffn activation {act!r}")
        self.ffn_act = act
        self.tokens = meta.get("tokenizer.ggml.tokens")

        self.tensor_types = {name: tt for name, (tt, _, _) in tensors.items()}
        self.tok_embd = W["token_embd.weight"]                 # (n_vocab, n_embd)
        self.n_vocab = self.tok_embd.shape[0]
        self.output_norm = W["output_norm.weight"]
        self.output = W.get("output.weight", self.tok_embd)    # tied if absent
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {k: W[p + k + ".weight"] for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up")}
            if self.sparse:
                L["ffn_down"] = W[p + "ffn_down_t.weight"].T          # (n_embd, n_ff)
                L["fc1"] = W[p + "fc1.weight"]                        # (r, n_embd)
                L["fc2"] = W[p + "fc2.weight"]                        # (n_ff, r)
            else:
                L["ffn_down"] = W[p + "ffn_down.weight"]
            self.layers.append(L)
        assert self.n_rot <= self.head_dim and self.n_rot % 2 == 0

    # ---- building blocks ---------------------------------------------------------------
    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x: (n_tok, n_heads, head_dim); 'normal' mode (adjacent pairs) on the first n_rot dims."""
        half = self.n_rot // 2
        i = np.arange(half, dtype=np.float64)
        inv = self.rope_base ** (-2.0 * i / self.n_rot)
        theta = (np.asarray(pos, dtype=np.float64) * self.freq_scale)[:, None] * inv[None, :]
        c = np.cos(theta)[:, None, :]
        s = np.sin(theta)[:, None, :]
        out = x.copy()
        x0 = x[..., 0:self.n_rot:2]
        x1 = x[..., 1:self.n_rot:2]
        out[..., 0:self.n_rot:2] = x0 * c - x1 * s
        out[..., 1:self.n_rot:2] = x0 * s + x1 * c
        return out

    def act(self, x):
        return ACTS[self.ffn_act](x)

    def predictor_mask(self, L, x):
        """Neurons the predictor selects for each row of the pre-norm residual x: (n, n_ff) bool."""
        scores = relu(x @ L["fc1"].T) @ L["fc2"].T
        return scores >= self.sparse_threshold

    def ffn(self, L, g, x=None):
        """g: normed FFN input; x: pre-norm residual (the predictor's input in sparse files)."""
        gate = g @ L["ffn_gate"].T
        up = g @ L["ffn_up"].T
        if self.arch == "bamboo":
            hid = self.act(gate) * self.act(up)
        else:
            hid = self.act(gate) * up
        if self.use_predictor:
            hid = np.where(self.predictor_mask(L, x), hid, 0.0)
        return hid @ L["ffn_down"].T

    # ---- forward -------------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        return KVCache(self.n_layer)

    def forward(self, tokens, positions=None, cache: KVCache | None = None, hidden: bool = False) -> np.ndarray:
        """logits (len(tokens), n_vocab) float64 (hidden: the final hidden states (len(tokens), n_embd),
        rmsnorm(x) * output_norm, instead).  Without `cache`: causal attention over
        exactly the given sequence.  With a cache: the tokens are appended to it (their K/V
        stored) and attend to everything cached with pos <= their own."""
        tokens = np.asarray(list(tokens), dtype=np.int64)
        n = len(tokens)
        if n == 0:
            return np.zeros((0, self.n_vocab))
        if np.any(tokens < 0) or np.any(tokens >= self.n_vocab):
            raise ValueError("token id out of range")
        if cache is None:
            cache = self.new_cache()
        if positions is None:
            start = int(cache.pos[-1]) + 1 if len(cache.pos) else 0
            positions = np.arange(start, start + n)
        pos = np.asarray(list(positions), dtype=np.int64)
        assert pos.shape == (n,)
        all_pos = np.concatenate([cache.pos, pos])
        mask = all_pos[None, :] <= pos[:, None]                       # (n, n_kv_tot)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        group = nh // nkv
        scale = 1.0 / math.sqrt(hd)

        x = self.tok_embd[tokens].copy()                              # (n, n_embd)
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["attn_norm"])
            q = (h @ L["attn_q"].T).reshape(n, nh, hd)
            k = (h @ L["attn_k"].T).reshape(n, nkv, hd)
            v = (h @ L["attn_v"].T).reshape(n, nkv, hd)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            if cache.k[li] is not None:
                k = np.concatenate([cache.k[li], k], axis=0)
                v = np.concatenate([cache.v[li], v], axis=0)
            cache.k[li], cache.v[li] = k, v
            att_out = np.empty((n, nh, hd))
            for hh in range(nh):
                kv = hh // group
                s = (q[:, hh, :] @ k[:, kv, :].T) * scale               # (n, n_kv_tot)
                s = np.where(mask, s, -np.inf)
                s = s - s.max(axis=1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=1, keepdims=True)
                att_out[:, hh, :] = p @ v[:, kv, :]
            x = x + att_out.reshape(n, nh * hd) @ L["attn_output"].T
            g = self.rmsnorm(x, L["ffn_norm"])
            x = x + self.ffn(L, g, x)
        cache.pos = all_pos
        x = self.rmsnorm(x, self.output_norm)
        return x if hidden else x @ self.output.T

    def greedy(self, prompt_tokens, n) -> list[int]:
        """Greedy-decode n new tokens after prompt_tokens (float64 KV cache); returns only
        the generated tokens.  Ties resolve to the lowest token id (np.argmax)."""
        cache = self.new_cache()
        logits = self.forward(list(prompt_tokens), cache=cache)
        out = []
        for _ in range(n):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if len(out) == n:
                break
            logits = self.forward([t], cache=cache)
        return out
