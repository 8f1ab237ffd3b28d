"""Embeddings: the model's final hidden state per token, pooled into one vector per input.

The hidden state is the output norm's result, the output head's input (`Context.set_outputs`,
`pi_set_outputs` in C); the head itself is skipped. Pooling, as llama.cpp's `--pooling`:

    none   every token's vector ([n_tokens, n_embd] per input)
    mean   the average over the input's tokens (BOS included, as llama.cpp)
    cls    the first token's vector (encoder models; on a causal decoder the first token sees only
           itself, so every input that starts with BOS gets the same vector)
    last   the last token's vector (decoder embedding models: e5-mistral, Qwen3-Embedding, ...)
    rank   reranker models (a classifier head cls.output.weight [n_embd, n_cls], e.g. Qwen3-Reranker as llama.cpp
           converts it): the last token's vector times the head (+ cls.output.bias), softmax for qwen3 as llama.cpp;
           score 0 is the relevance (`rerank`); not normalized. Encoders (bert rerankers, e.g. the ms-marco
           MiniLM cross-encoders): the first ([CLS]) token's vector through the pooler cls.weight [n_embd, n_embd]
           + cls.bias and tanh where the file has it, then cls.output (llama.cpp's build_pooling)

The default is the file's `<arch>.pooling_type` (llama.cpp's key), else `mean`. Normalization is
llama.cpp's `embd_normalize`: -1 none, 0 max-absolute scaled to int16 range, 1 taxicab, 2 Euclidean
(L2, the default), p > 2 the p-norm.

An `Embedder` owns its own Context (KV cache of n_ctx cells, CPU only), so embeddings never disturb
the completion engine's slots and can run while it generates. Several short inputs are decoded in
one call, one sequence each; an input longer than n_batch is decoded in chunks (causal attention
makes that exact), up to n_ctx tokens. An encoder (powerinfer.encoder: bert, nomic-bert) decodes each input whole, so
an input longer than the batch, the context or the model's positions (n_ctx_train) is refused (`max_tokens`); its K/V
rows are kept in f32 (they live for one decode, as llama.cpp's cache-less encoder attention).
"""
from __future__ import annotations

import threading

import numpy as np

from .context import Context
from .encoder import is_encoder
from .model import Model

__all__ = ["POOLING_TYPES", "Embedder", "default_pooling", "normalize"]

POOLING_TYPES = ("none", "mean", "cls", "last", "rank")
POOLING_IDS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}   # llama.cpp's llama_pooling_type


RANK_HEAD = "cls.output.weight"
POOLER = "cls.weight"       # encoders' rerankers: the pooler before the classifier (or in its place)


def has_rank_head(model: Model) -> bool:
    names = model.file.tensors
    return RANK_HEAD in names or (is_encoder(model.hparams.arch) and POOLER in names)


def default_pooling(model: Model) -> str:
    """The file's `<arch>.pooling_type` (llama.cpp's key) as a name, else "mean" ("rank" only with a classifier
    head)."""
    arch = model.metadata.get("general.architecture", "")
    v = model.metadata.get(f"{arch}.pooling_type")
    name = POOLING_IDS.get(int(v)) if isinstance(v, int) else None
    if name == "rank" and not has_rank_head(model):
        name = None
    return name if name in POOLING_TYPES else "mean"


def check_pooling(pooling: str, model: Model | None = None) -> str:
    if pooling not in POOLING_TYPES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_TYPES)}, got {pooling!r}")
    if pooling == "rank" and model is not None and not has_rank_head(model):
        raise ValueError(f"pooling 'rank' needs a reranker model: this file has no classifier head ({RANK_HEAD}; "
                         "llama.cpp's converter writes one for Qwen3-Reranker)")
    return pooling


def _linear(model: Model, name: str, n_in: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(W [n_out, n_in], b [n_out] or None) of NAME.weight / NAME.bias in float64, (None, None) where absent."""
    if f"{name}.weight" not in model.file.tensors:
        return None, None
    w = model.tensor_f32(f"{name}.weight").astype(np.float64)
    if w.ndim != 2 or w.shape[1] != n_in:
        raise ValueError(f"{model.path}: {name}.weight must be [{n_in}, n_out] (ne), got {w.shape[::-1]}")
    b = model.tensor_f32(f"{name}.bias").astype(np.float64) if f"{name}.bias" in model.file.tensors else None
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"{model.path}: {name}.bias must have {w.shape[0]} values")
    return w, b


class RankHead:
    """A reranker's classifier head (llama.cpp's build_pooling, rank): of the pooled final hidden state h (the last
    token's; an encoder's: its first, [CLS]), z = tanh(P h + p) where the file has the pooler P = cls.weight [n_embd,
    n_embd] (p = cls.bias), else z = h; scores [n_cls] = W z (+ b), W = cls.output.weight [n_cls, n_embd], b =
    cls.output.bias, where the file has it (else the scores are z); softmax for qwen3."""

    def __init__(self, model: Model):
        n_embd = model.hparams.n_embd
        self.pool_w, self.pool_b = _linear(model, "cls", n_embd) if is_encoder(model.hparams.arch) else (None, None)
        if self.pool_w is not None and self.pool_w.shape[0] != n_embd:
            raise ValueError(f"{model.path}: {POOLER} must be [n_embd, n_embd]")
        self.w, self.b = _linear(model, "cls.output", n_embd)
        self.softmax = model.metadata.get("general.architecture") == "qwen3"

    def __call__(self, h: np.ndarray) -> np.ndarray:
        z = h.astype(np.float64)
        if self.pool_w is not None:
            z = np.tanh(self.pool_w @ z + (self.pool_b if self.pool_b is not None else 0.0))
        if self.w is not None:
            z = self.w @ z + (self.b if self.b is not None else 0.0)
        if self.softmax:
            z = np.exp(z - z.max())
            z /= z.sum()
        return z.astype(np.float32)


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
        self.pooling = check_pooling(pooling or default_pooling(model), model)
        self._rank_head: RankHead | None = None
        self.encoder = is_encoder(model.hparams.arch)
        if self.encoder:     # K/V live for one decode: f32, as llama.cpp's encoders attend without a cache
            kv_type = "f32"
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

    @property
    def max_tokens(self) -> int:
        """The longest input: n_ctx; an encoder's: also at most one batch and the model's positions (n_ctx_train)."""
        if not self.encoder:
            return self.ctx.n_ctx
        return min(self.ctx.n_ctx, self.ctx.n_batch, self.model.hparams.n_ctx_train)

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
            if len(toks) > self.max_tokens:
                raise ValueError(f"input {i} has {len(toks)} tokens; an encoder ({self.model.hparams.arch}) reads an "
                                 f"input in one batch, at most {self.max_tokens} tokens (the batch size "
                                 f"{ctx.n_batch}, the model's {self.model.hparams.n_ctx_train} positions): "
                                 "shorten it or raise the batch size")
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
        per vector as `normalize(v, embd_normalize)`; pooling "rank": the classifier's [n_cls] scores, as they are."""
        pooling = check_pooling(pooling or self.pooling, self.model)
        rows = {"cls": "first", "last": "last", "rank": "first" if self.encoder else "last"}.get(pooling, "all")
        states = self.hidden_states(inputs, rows)
        if pooling == "rank":
            if self._rank_head is None:
                self._rank_head = RankHead(self.model)
            return [self._rank_head(s[0]) for s in states]
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
        inputs = [t[:emb.max_tokens] for t in inputs]
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


# ---- reranking (llama.cpp's /rerank) -------------------------------------------------------------------------------
def rerank_prompt(model: Model, query: str, document: str) -> list[int]:
    """llama.cpp's format_prompt_rerank: the file's rerank template (tokenizer.chat_template.rerank) with {query} and
    {document} put in, special tokens parsed and none added; without one, [BOS] query [EOS] [SEP] document [EOS] as
    the vocabulary adds them."""
    tok, meta = model.tokenizer, model.metadata
    template = meta.get("tokenizer.chat_template.rerank")
    if isinstance(template, str):
        return tok.encode(template.replace("{query}", query).replace("{document}", document), add_special=False,
                          parse_special=True)
    sep = getattr(tok, "sep_id", None)
    sep = sep if sep is not None else meta.get("tokenizer.ggml.seperator_token_id")
    eos = tok.eos_id if tok.eos_id is not None else sep
    ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    ids += tok.encode(query, add_special=False)
    if tok.add_eos and eos is not None:
        ids.append(eos)
    if getattr(tok, "add_sep", meta.get("tokenizer.ggml.add_sep_token")) and sep is not None:
        ids.append(sep)
    ids += tok.encode(document, add_special=False)
    if tok.add_eos and eos is not None:
        ids.append(eos)
    return ids


def rerank(llm, query: str, documents: list[str], *, top_n: int | None = None) -> tuple[list[dict], int]:
    """PowerInfer.rerank: ([{index, relevance_score}] best first, at most top_n, and the tokens evaluated), each score
    the reranker's first class (llama.cpp's: P("yes") for Qwen3-Reranker)."""
    if not isinstance(query, str):
        raise ValueError("query must be a string")
    if not isinstance(documents, (list, tuple)) or not documents or not all(isinstance(d, str) for d in documents):
        raise ValueError("documents must be a non-empty array of strings")
    emb = llm.embedder
    prompts = [rerank_prompt(llm.model, query, d) for d in documents]
    scores = emb.embed_tokens([p[:emb.max_tokens] for p in prompts], pooling="rank")
    ranked = sorted(({"index": i, "relevance_score": float(v[0])} for i, v in enumerate(scores)),
                    key=lambda r: -r["relevance_score"])
    n = len(ranked) if top_n is None else max(0, int(top_n))
    return ranked[:n], sum(min(len(p), emb.max_tokens) for p in prompts)
