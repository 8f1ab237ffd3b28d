"""Embedding routes (with --embedding): OpenAI's POST /v1/embeddings and llama.cpp's POST /embedding.

Both run on the model's `Embedder` (powerinfer.embedding: its own context, so they never wait for
or disturb the completion slots; completions keep working with --embedding, unlike llama.cpp, whose
--embedding server has one kind of context). Without --embedding both answer 501 with llama.cpp's
message.

/v1/embeddings  input: string | [string] | [token ids] | [[token ids]] (mixed lists too); encoding_format
                "float" (default) or "base64" (little-endian float32, what the official `openai` client
                asks for by default); dimensions, if given, must be n_embd; embd_normalize as below.
                Pooling "none" is refused (400), as llama.cpp: OpenAI's shape has one vector per input.
/embedding      content (or input), same forms; answers [{"index": i, "embedding": [[...]]}], per token
                with --pooling none (not normalized, as llama.cpp), else one pooled vector.
embd_normalize  llama.cpp's: -1 none, 0 max-abs to int16 range, 1 taxicab, 2 L2 (default), p > 2 p-norm.
/rerank         (also /reranking, /v1/rerank, /v1/reranking; with --reranking, a reranker model: pooling rank)
                query, documents (or TEI's texts), top_n: Jina's {model, object, usage, results: [{index,
                relevance_score}]} best first; with texts TEI's bare [{index, score, text (return_text)}].
"""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from ..request import RequestError
from .protocol import JSON, field, read_json

if TYPE_CHECKING:
    from .app import ServerState

MAX_INPUTS = 2048        # OpenAI's limit on inputs per request


def _token_list(x) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_inputs(llm, value, param: str) -> list[list[int]]:
    """Token lists for an OpenAI-style input (string, token ids, or a list of strings / token-id lists)."""
    def tokens(x, where: str) -> list[int]:
        if isinstance(x, str):
            if not x:
                raise RequestError(f"'{where}' is an empty string", param=param)
            return llm.tokenizer.encode(x, add_special=True, parse_special=True)
        if _token_list(x):
            return list(x)
        raise RequestError(f"'{where}' must be a string or an array of token ids", param=param)
    if isinstance(value, str) or _token_list(value):
        return [tokens(value, param)]
    if not isinstance(value, list) or not value:
        raise RequestError(f"'{param}' must be a string, an array of token ids, or a non-empty array of those",
                           param=param)
    if len(value) > MAX_INPUTS:
        raise RequestError(f"'{param}' has {len(value)} inputs; at most {MAX_INPUTS} per request", param=param)
    return [tokens(x, f"{param}[{i}]") for i, x in enumerate(value)]


def normalize_field(body: dict) -> int:
    n = field(body, "embd_normalize", "int", 2)
    if n < -1:
        raise RequestError("'embd_normalize' must be -1 (none), 0 (max abs), 1 (taxicab), 2 (L2) or p > 2",
                           param="embd_normalize")
    return n


def require(state: ServerState):
    """The model, for an embedding route: 501 without --embedding (llama.cpp's message)."""
    if not state.embedding:
        raise RequestError("This server does not support embeddings. Start it with `--embeddings`",
                           code=501, status=501, type="not_supported_error")
    return state.require()


async def compute(state: ServerState, llm, inputs: list[list[int]], embd_normalize: int, pooling: str | None = None):
    """The embeddings of token lists (a vector each; per token with pooling "none"), counted by --metrics."""
    emb = llm.embedder
    for i, t in enumerate(inputs):
        if len(t) > emb.n_ctx:
            raise RequestError(f"input {i} has {len(t)} tokens, more than the embedding context of {emb.n_ctx} "
                               "(-c / -np)", code="context_length_exceeded", param="input")
        if len(t) > emb.max_tokens:   # an encoder reads an input in one batch (llama.cpp: n_ubatch >= its tokens)
            raise RequestError(f"input {i} has {len(t)} tokens; this encoder model reads at most {emb.max_tokens} "
                               f"in one batch (-b / -ub, and its {llm.model.hparams.n_ctx_train} positions)",
                               code="context_length_exceeded", param="input")
    bad = next((t for ts in inputs for t in ts if not 0 <= t < llm.model.n_vocab), None)
    if bad is not None:
        raise RequestError(f"token {bad} is out of range [0, {llm.model.n_vocab})", param="input")
    pooling = pooling or emb.pooling
    norm = -1 if pooling == "none" else embd_normalize      # llama.cpp normalizes pooled vectors only
    vecs = await run_in_threadpool(emb.embed_tokens, inputs, pooling=pooling, embd_normalize=norm)
    if state.metrics_store is not None:
        state.metrics_store.add_prompt(sum(len(t) for t in inputs))
    return vecs


def routes(state: ServerState) -> list[Route]:

    async def v1_embeddings(request: Request):
        llm = require(state)
        body = await read_json(request, state)
        field(body, "model", "str", None)            # any name: this server has one model
        fmt = field(body, "encoding_format", "str", "float")
        if fmt not in ("float", "base64"):
            raise RequestError("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
        dims = field(body, "dimensions", "int", None)
        n_embd = llm.model.hparams.n_embd
        if dims is not None and dims != n_embd:
            raise RequestError(f"'dimensions' must be this model's embedding size ({n_embd}), got {dims}",
                               param="dimensions")
        if llm.embedder.pooling == "none":
            raise RequestError("Pooling type 'none' is not OAI compatible. Please use a different pooling type",
                               param="input")
        value = field(body, "input", "any", None, aliases=("content",))
        if value is None:
            raise RequestError("'input' is required", param="input")
        inputs = parse_inputs(llm, value, "input")
        vecs = await compute(state, llm, inputs, normalize_field(body))

        def encode(v: np.ndarray):
            if fmt == "base64":
                return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")
            return v.tolist()
        n = sum(len(t) for t in inputs)
        return JSON({"object": "list", "model": state.model_name,
                     "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vecs)],
                     "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def native_embedding(request: Request):
        llm = require(state)
        body = await read_json(request, state)
        value = field(body, "content", "any", None, aliases=("input",))
        if value is None:
            raise RequestError("'content' is required", param="content")
        inputs = parse_inputs(llm, value, "content")
        vecs = await compute(state, llm, inputs, normalize_field(body))
        return JSON([{"index": i, "embedding": v.tolist() if v.ndim == 2 else [v.tolist()]}
                     for i, v in enumerate(vecs)])

    async def rerank_route(request: Request):
        llm = require(state)
        if llm.embedder.pooling != "rank":
            raise RequestError("This server does not support reranking. Start it with `--reranking`", code=501,
                               status=501, type="not_supported_error")
        body = await read_json(request, state)
        query = field(body, "query", "str")
        tei = "texts" in body
        docs = field(body, "texts" if tei else "documents", "list")
        if not docs or not all(isinstance(d, str) for d in docs):
            raise RequestError(f"'{'texts' if tei else 'documents'}' must be a non-empty array of strings",
                               param="documents")
        if len(docs) > MAX_INPUTS:
            raise RequestError(f"at most {MAX_INPUTS} documents per request", param="documents")
        top_n = field(body, "top_n", "int", len(docs))
        from ..embedding import rerank
        results, n = await run_in_threadpool(rerank, llm, query, docs, top_n=top_n)
        if state.metrics_store is not None:
            state.metrics_store.add_prompt(n)
        if tei:
            return JSON([{"index": r["index"], "score": r["relevance_score"],
                          **({"text": docs[r["index"]]} if field(body, "return_text", "bool", False) else {})}
                         for r in results])
        return JSON({"model": field(body, "model", "str", None) or state.model_name, "object": "list",
                     "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results})

    return [
        *(Route(path, rerank_route, methods=["POST"]) for path in ("/rerank", "/reranking", "/v1/rerank",
                                                                     "/v1/reranking")),
        Route("/v1/embeddings", v1_embeddings, methods=["POST"]),
        Route("/embeddings", v1_embeddings, methods=["POST"]),
        Route("/embedding", native_embedding, methods=["POST"]),
    ]


__all__ = ["MAX_INPUTS", "compute", "normalize_field", "parse_inputs", "require", "routes"]
