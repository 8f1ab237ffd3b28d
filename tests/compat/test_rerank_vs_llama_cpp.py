"""A reranker (the tiny qwen3 with llama.cpp's classifier head and metadata, tests/test_rerank.py) through llama.cpp
(pooling rank, llama_get_embeddings_seq over the same prompt tokens) and through ours: both classes' scores agree
(f32 KV cache on both sides; ATOL, the measured difference in parentheses)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from powerinfer.embedding import rerank_prompt  # noqa: E402
from test_rerank import DOCS, write_reranker  # noqa: E402

ATOL = 1e-5     # (measured 2e-7)


def test_rerank_scores_agree_with_llama_cpp(tmp_path):
    path, _ = write_reranker(tmp_path)
    ll = llama_cpp.Llama(str(path), embedding=True, pooling_type=4, n_ctx=256, verbose=False, n_threads=1,
                         type_k=0, type_v=0)
    llm = pi.PowerInfer(path, n_ctx=256, n_threads=1, verbose=False, kv_type="f32")
    mem = llama_cpp.llama_get_memory(ll._ctx.ctx)
    for doc in DOCS:
        toks = rerank_prompt(llm.model, "what is a cat", doc)
        ll._batch.reset()
        ll._batch.add_sequence(toks, 0, False)
        ll._ctx.decode(ll._batch)
        ptr = llama_cpp.llama_get_embeddings_seq(ll._ctx.ctx, 0)
        theirs = np.array([ptr[0], ptr[1]])
        llama_cpp.llama_memory_clear(mem, True)
        ours = llm.embedder.embed_tokens([toks], pooling="rank")[0]
        print(f"{doc!r}: ours {ours}, llama.cpp {theirs}")
        assert np.allclose(ours, theirs, atol=ATOL), (ours, theirs)
