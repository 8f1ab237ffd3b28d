"""Reranker models (pooling "rank": a classifier head cls.output.weight, as llama.cpp converts Qwen3-Reranker):
the scores equal the float64 reference forward's last hidden state through the head and softmax; PowerInfer.rerank
and the server's /rerank (Jina's and TEI's shapes, llama.cpp's routes and --reranking) rank documents by them."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from model_files import make_weights, rewrite, write_arch_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer.embedding import rerank_prompt

TEMPLATE = ("<|im_start|>system\nJudge whether the Document meets the requirements.<|im_end|>\n<|im_start|>user\n"
            "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n")
DOCS = ["a cat is an animal", "the sky is blue today", "dogs bark at night", "cats purr"]


def write_reranker(d, *, template: bool = True):
    """The tiny qwen3 of model_files with a 2-class head ("yes", "no") and llama.cpp's reranker metadata."""
    w = make_weights("qwen3", 3)
    E = w["token_embd.weight"].shape[1]
    w["cls.output.weight"] = (0.3 * np.random.default_rng(1).standard_normal((2, E))).astype(np.float32)
    write_arch_model(d / "base.gguf", "qwen3", weights=w)
    meta = {"qwen3.pooling_type": (4, VT.UINT32),
            "qwen3.classifier.output_labels": (["yes", "no"], VT.ARRAY, VT.STRING)}
    if template:
        meta["tokenizer.chat_template.rerank"] = (TEMPLATE, VT.STRING)
    return rewrite(d / "base.gguf", d / "reranker.gguf", meta=meta), w["cls.output.weight"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return write_reranker(tmp_path_factory.mktemp("rerank"))


def reference_score(path, head, tokens) -> float:
    h = ReferenceModel(path).forward(tokens, hidden=True)[-1]
    z = head.astype(np.float64) @ h
    z = np.exp(z - z.max())
    return float(z[0] / z.sum())


def test_scores_match_the_reference(reranker):
    path, head = reranker
    llm = pi.PowerInfer(path, n_ctx=256, n_threads=1, verbose=False, kv_type="f32")
    assert llm.embedder.pooling == "rank"           # the file's pooling type
    toks = rerank_prompt(llm.model, "what is a cat", DOCS[1])
    assert toks == llm.tokenizer.encode(TEMPLATE.format(query="what is a cat", document=DOCS[1]),
                                        add_special=False, parse_special=True)
    got = llm.rerank("what is a cat", DOCS)
    assert sorted(r["index"] for r in got) == list(range(len(DOCS)))
    assert [r["relevance_score"] for r in got] == sorted((r["relevance_score"] for r in got), reverse=True)
    for r in got:
        want = reference_score(path, head, rerank_prompt(llm.model, "what is a cat", DOCS[r["index"]]))
        assert abs(r["relevance_score"] - want) < 1e-5, (r, want)
    assert len({round(r["relevance_score"], 6) for r in got}) == len(DOCS)   # the documents are told apart
    assert llm.rerank("what is a cat", DOCS, top_n=2) == got[:2]
    vec = llm.embed(toks, normalize=False)           # the embeddings' view of the same: both classes' scores
    assert abs(vec[0] - next(r["relevance_score"] for r in got if r["index"] == 1)) < 1e-6
    assert len(vec) == 2 and abs(sum(vec) - 1.0) < 1e-5


def test_prompt_without_a_template(tmp_path):
    """llama.cpp's fallback: [BOS] query [EOS] [SEP] document [EOS] as the vocabulary adds them."""
    path, _ = write_reranker(tmp_path, template=False)
    model = pi.Model(path)
    tok = model.tokenizer
    want = ([tok.bos_id] if tok.add_bos else []) + tok.encode("q", add_special=False) + \
        ([tok.eos_id] if tok.add_eos else []) + tok.encode("doc", add_special=False) + \
        ([tok.eos_id] if tok.add_eos else [])
    assert rerank_prompt(model, "q", "doc") == want


def test_errors(reranker, tiny_model):
    llm = pi.PowerInfer(tiny_model("f32"), n_ctx=128, n_threads=1, verbose=False)
    with pytest.raises(ValueError, match="needs a reranker model"):
        llm.rerank("q", ["a"])
    llm = pi.PowerInfer(reranker[0], n_ctx=128, n_threads=1, verbose=False)
    for q, docs, words in (("q", [], "non-empty"), ("q", ["a", 3], "strings"), (3, ["a"], "query")):
        with pytest.raises(ValueError, match=words):
            llm.rerank(q, docs)


def test_server_rerank(reranker, tiny_model):
    pytest.importorskip("uvicorn")
    from test_server import InProcessServer, post, wait_healthy

    from powerinfer.server.app import ServerState, create_app
    path, _ = reranker
    llm = pi.PowerInfer(path, n_ctx=512, n_parallel=2, n_threads=1, verbose=False)
    want = llm.rerank("what is a cat", DOCS)
    srv = InProcessServer(create_app(ServerState(model_path=str(path), llm=llm, embedding=True)))
    plain = pi.PowerInfer(tiny_model("f32"), n_ctx=256, n_threads=1, verbose=False)
    other = InProcessServer(create_app(ServerState(model_path="tiny", llm=plain, embedding=True)))
    try:
        wait_healthy(srv.base)
        wait_healthy(other.base)
        for route in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
            r = post(srv.base, route, {"model": "x", "query": "what is a cat", "documents": DOCS, "top_n": 3})
            body = r.json()
            assert r.status_code == 200 and body["object"] == "list" and body["model"] == "x"
            assert body["results"] == want[:3]
            assert body["usage"]["prompt_tokens"] == sum(len(rerank_prompt(llm.model, "what is a cat", d))
                                                         for d in DOCS)
        tei = post(srv.base, "/rerank", {"query": "what is a cat", "texts": DOCS, "return_text": True}).json()
        assert [(t["index"], t["score"], t["text"]) for t in tei] == \
            [(w["index"], w["relevance_score"], DOCS[w["index"]]) for w in want]
        for body, words in (({"documents": DOCS}, "'query' is required"), ({"query": "q", "documents": []},
                            "non-empty"), ({"query": "q", "documents": ["a", 1]}, "strings")):
            r = post(srv.base, "/v1/rerank", body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        r = post(other.base, "/v1/rerank", {"query": "q", "documents": ["a"]})
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]
    finally:
        srv.close()
        other.close()
