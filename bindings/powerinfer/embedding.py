"""Embeddings: the model's final hidden state per token, pooled into one vector per input.

The hidden state is the output norm's result, the output head's input (`Context.set_outputs`,
`pi_set_outputs` in C); the head itself is skipped. Pooling, as llama.cpp's `--pooling`:

    none   every token's vector ([n_tokens, n_embd] per input)
    mean   the average over the input's tokens (BOS included, as llama.cpp)
    cls    the first token's vector (encoder models; on a causal decoder the first token sees only
           itself, so every input that starts with BOS gets the same vector)
    last   the last token's vector (decoder embedding models: e5-mistral, Qwen3-Embedding, ...)

The default is the file's `<arch>.pooling_type` (llama.cpp's key), else `mean`. Normalization is
llama.cpp's `embd_normalize`: -1 none, 0 max-absolute scaled to int16 range, 1 taxicab, 2 Euclidean
(L2, the default), p > 2 the p-norm.

An `Embedder` owns its own Context (KV cache of n_ctx cells, CPU only), so embeddings never disturb
the completion engine's slots and can run while it generates. Several short inputs are decoded in
one call, one sequence each; an input longer than n_batch is decoded in chunks (causal attention
makes that exact), up to n_ctx tokens.
"""
from __future__ import annotations

import threading

import numpy as np

from .context import Context
from .model import Model

__all__ = ["POOLING_TYPES", "Embedder", "default_pooling", "normalize"]

POOLING_TYPES = ("none", "mean", "cls", "last")
_GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}   # llama_pooling_type


def default_pooling(model: Model) -> str:
    """The file's `<arch>.pooling_type` (llama.cpp's key) as a name, else "mean"."""
    arch = model.metadata.get("general.architecture", "")
    v = model.metadata.get(f"{arch}.pooling_type")
    name = _GGUF_POOLING.get(int(v)) if isinstance(v, int) else None
    return name if name in POOLING_TYPES else "mean"


def check_pooling(pooling: str) -> str:
    if pooling == "rank":
        raise ValueError("pooling 'rank' is for reranker models (llama.cpp's /rerank), which are not supported")
    if pooling not in POOLING_TYPES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_TYPES)}, got {pooling!r}")
    return pooling


def normalize(v: np.ndarray, embd_normalize: int = 2) -> np.ndarray:
    """llama.cpp's common_embd_normalize over the last axis (float64 sums, float32 result)."""
    x = np.asarray(v, dtype=np.float64)
    if embd_normalize < 0:
        return x.astype(np.float32)
    if embd_normalize == 0:       # max absolute value -> 32760 (int16 range)
        s = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    elif embd_normalize == 2:
        s = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    else:
        p = float(embd_normalize)
        s = (np.abs(x) ** p).sum(axis=-1, keepdims=True) ** (1.0 / p)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 0, x / s, 0.0).astype(np.float32)


class Embedder:
    """Final hidden states of token sequences, pooled. Thread-safe (one decode at a time)."""

    def __init__(self, model: Model, *, n_ctx: int | None = 512, n_batch: int = 512, n_seq_max: int = 8,
                 n_threads: int | None = None, kv_type: str | tuple[str, str] = "f16",
                 sparse_threshold: float | None = None, dense: bool = False, pooling: str | None = None):
        self.model = model
        self.pooling = check_pooling(pooling or default_pooling(model))
        # this context stays on the CPU (an offload would copy the device weights once more for it)
        self.ctx = Context(model, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max, n_threads=n_threads,
                           kv_type=kv_type, sparse_threshold=sparse_threshold, dense=dense,
                           vram_budget=0 if model.sparse else None, n_gpu_layers=None if model.sparse else 0)
        self.ctx.set_outputs(logits=False, embeddings=True)
        self.n_embd = model.hparams.n_embd
        self.lock = threading.Lock()

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def hidden_states(self, inputs: list[list[int]], rows: str = "all") -> list[np.ndarray]:
        """Per input, the [n, n_embd] float32 hidden states of its tokens (rows "all"), or of its
        first ("first") or last ("last") token only ([1, n_embd]). Inputs must be non-empty, within
        the vocabulary and at most n_ctx tokens (ValueError)."""
        n_vocab, ctx = self.model.n_vocab, self.ctx
        for i, toks in enumerate(inputs):
            if len(toks) == 0:
                raise ValueError(f"input {i} has no tokens")
            if len(toks) > ctx.n_ctx:
                raise ValueError(f"input {i} has {len(toks)} tokens, more than the embedding context "
                                 f"holds ({ctx.n_ctx})")
            bad = next((t for t in toks if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise ValueError(f"input {i}: token {bad} is out of range [0, {n_vocab})")
        out: list[np.ndarray] = [np.empty(0)] * len(inputs)
        with self.lock:
            i = 0
            while i < len(inputs):
                group, total = [i], len(inputs[i])     # whole inputs that fit in one decode, one sequence each
                i += 1
                while i < len(inputs) and len(group) < ctx.n_seq_max and total + len(inputs[i]) <= ctx.n_batch:
                    group.append(i)
                    total += len(inputs[i])
                    i += 1
                tokens = np.concatenate([np.asarray(inputs[j], dtype=np.int64) for j in group])
                pos = np.concatenate([np.arange(len(inputs[j])) for j in group])
                seq = np.concatenate([np.full(len(inputs[j]), k) for k, j in enumerate(group)])
                starts = np.cumsum([0] + [len(inputs[j]) for j in group])
                want = np.zeros(total, dtype=np.int8)
                for k in range(len(group)):
                    lo, hi = starts[k], starts[k + 1]
                    if rows == "all":
                        want[lo:hi] = 1
                    else:
                        want[lo if rows == "first" else hi - 1] = 1
                ctx.kv_clear()
                try:
                    ctx.decode(tokens, pos=pos, seq_id=seq, logits=want)
                finally:
                    ctx.kv_clear()
                for k, j in enumerate(group):
                    idx = np.flatnonzero(want[starts[k]:starts[k + 1]]) + starts[k]
                    out[j] = np.stack([ctx.embeddings(int(r)) for r in idx])
        return out

    def embed_tokens(self, inputs: list[list[int]], *, pooling: str | None = None,
                     embd_normalize: int = 2) -> list[np.ndarray]:
        """Per input, its pooled [n_embd] vector (pooling "none": [n_tokens, n_embd]), normalized
        per vector as `normalize(v, embd_normalize)`."""
        pooling = check_pooling(pooling or self.pooling)
        rows = {"cls": "first", "last": "last"}.get(pooling, "all")
        states = self.hidden_states(inputs, rows)
        if pooling == "mean":
            states = [s.astype(np.float64).mean(axis=0) for s in states]
        elif pooling in ("cls", "last"):
            states = [s[0] for s in states]
        return [normalize(s, embd_normalize) for s in states]


# ---- the PowerInfer object's embed() / create_embedding() (llama-cpp-python's shapes) ---------------
def _as_inputs(llm, input) -> tuple[list[list[int]], bool]:
    """(token lists, whether the caller passed one input) for str | list[str] | list[int] | list[list[int]]."""
    def one(x):
        if isinstance(x, str):
            return llm.tokenize(x, add_bos=True, special=True)
        if isinstance(x, (list, tuple)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                for t in x):
            return [int(t) for t in x]
        raise TypeError("input must be a string, a list of token ids, or a list of those")
    if isinstance(input, str) or (isinstance(input, (list, tuple)) and input
                                  and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in input)):
        return [one(input)], True
    if isinstance(input, (list, tuple)) and input:
        return [one(x) for x in input], False
    raise TypeError("input must be a string, a list of token ids, or a non-empty list of those")


def _embed(llm, input, normalize: bool, truncate: bool, pooling: str | None):
    emb = llm.embedder
    inputs, single = _as_inputs(llm, input)
    if truncate:
        inputs = [t[:emb.n_ctx] for t in inputs]
    vecs = emb.embed_tokens(inputs, pooling=pooling, embd_normalize=2 if normalize else -1)
    return [v.tolist() for v in vecs], single, sum(len(t) for t in inputs)


def embed(llm, input, *, normalize: bool = True, truncate: bool = True, return_count: bool = False,
          pooling: str | None = None):
    """PowerInfer.embed: one vector (list of floats) for a single input, a list of vectors for a
    list of inputs (pooling "none": a list of per-token vectors per input). normalize: L2 per
    vector. truncate: cut inputs to the embedding context, else ValueError."""
    vecs, single, n = _embed(llm, input, normalize, truncate, pooling)
    res = vecs[0] if single else vecs
    return (res, n) if return_count else res


def create_embedding(llm, input, model: str | None = None, *, normalize: bool = True,
                     pooling: str | None = None) -> dict:
    """PowerInfer.create_embedding: llama-cpp-python's (OpenAI's) response dict."""
    vecs, _, n = _embed(llm, input, normalize, True, pooling)
    return {"object": "list", "model": llm.model_name,
            "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vecs)],
            "usage": {"prompt_tokens": n, "total_tokens": n}}
