"""Encoder models (powerinfer.encoder: bert, nomic-bert; the core's PI_ARCH_BERT) on tiny random files
(encoder_files.py): the hidden states against the float64 reference (reference_encoder.py) at every ISA level, every
level the scalar level's bits, sequences of one batch apart, pooling and the bert reranker's head, WordPiece
normalization, the refusals (generation, long inputs, logits, unsupported encoders and UGM vocabularies) and the server
started with --embedding and with --rerank. llama.cpp's side: tests/compat/test_encoders_vs_llama_cpp.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from encoder_files import TINY, WPM_TOKENS, write_bert_model
from gguf import GGUFValueType as VT
from helpers import rel_rms
from model_files import rewrite
from reference_encoder import ReferenceEncoder

import powerinfer as pi
from powerinfer._ffi import PowerInferError
from powerinfer.embedding import Embedder, rerank_prompt
from powerinfer.gguf_file import ModelLoadError
from powerinfer.request import RequestError

ROOT = Path(__file__).resolve().parents[1]
FLOAT_REL = 1e-6     # f32 / f16 weights, f32 K/V: hidden states' rel. RMS error vs float64 (measured 2e-7)
Q8_REL = 3e-2        # Q8_0 weights and activations (measured 0.9-1.1%)
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "中文 Café! unaffable tokenization",
         "what is a cat? cats are very good."]
ARCHS = ("bert", "nomic-bert")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("encoders")
    out = {}
    for arch in ARCHS:
        for dt in ("f32", "f16", "q8_0"):
            out[arch, dt] = write_bert_model(d / f"{arch}-{dt}.gguf", arch, dtype=dt, seed=3)[0]
    out["rerank"] = write_bert_model(d / "rerank.gguf", "bert", rerank=True, seed=5)[0]
    return out


@pytest.fixture
def at_level():
    start = pi.cpu_isa()

    def switch(level: str) -> None:
        if not pi.cpu_isa_supported(level):
            pytest.skip(f"{level}: not supported by this CPU or build")
        pi.set_cpu_isa(level)
    yield switch
    pi.set_cpu_isa(start)


def hidden(path, texts=TEXTS, n_batch=128):
    """Per text its [n, n_embd] hidden states, all texts in one decode (one sequence each)."""
    m = pi.Model(path)
    e = Embedder(m, n_ctx=256, n_batch=n_batch, n_threads=2)
    toks = [m.tokenizer.encode(t) for t in texts]
    return toks, e.embed_tokens(toks, pooling="none", embd_normalize=-1)


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_match_the_reference(files, arch, level, at_level):
    at_level(level)
    for dt, tol in (("f32", FLOAT_REL), ("f16", FLOAT_REL), ("q8_0", Q8_REL)):
        ref = ReferenceEncoder(files[arch, dt])
        toks, outs = hidden(files[arch, dt])
        for t, o in zip(toks, outs):
            err = rel_rms(o, ref.hidden(t))
            assert err < tol, (arch, dt, level, err)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_level_gives_the_scalar_bits(files, arch, at_level):
    at_level("scalar")
    want = hidden(files[arch, "q8_0"])[1]
    for level in ("avx2", "avx512"):
        if not pi.cpu_isa_supported(level):
            continue
        pi.set_cpu_isa(level)
        got = hidden(files[arch, "q8_0"])[1]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b, err_msg=level)


def test_sequences_of_one_batch_do_not_see_each_other(files):
    """Each text alone and all texts in one decode: the same states (no attention across sequences), and a text's
    first tokens are not its prefix's states (the attention sees every token of the sequence, both directions)."""
    path = files["bert", "f32"]
    toks, together = hidden(path)
    for t, text in zip(together, TEXTS):
        alone = hidden(path, [text])[1][0]
        np.testing.assert_allclose(t, alone, rtol=0, atol=1e-6)
    prefix = hidden(path, ["the quick"])[1][0]     # [CLS] the quick [SEP] vs [CLS] the quick brown ...
    assert np.abs(prefix[1] - together[1][1]).max() > 1e-3


def test_pooling_and_rank_match_the_reference(files):
    path = files["rerank"]
    ref = ReferenceEncoder(path)
    llm = pi.PowerInfer(path, n_ctx=256, n_threads=2, verbose=False)
    assert llm.embedder.pooling == "rank"           # the file's pooling_type
    toks = [llm.tokenizer.encode(t) for t in TEXTS]
    for pooling in ("mean", "cls", "last"):
        got = llm.embedder.embed_tokens(toks, pooling=pooling, embd_normalize=-1)
        for g, t in zip(got, toks):
            assert rel_rms(g, ref.pooled(t, pooling)) < FLOAT_REL, pooling
    q = "what is a cat"
    ranked = llm.rerank(q, TEXTS)
    for r in ranked:
        prompt = rerank_prompt(llm.model, q, TEXTS[r["index"]])
        assert abs(r["relevance_score"] - ref.pooled(prompt, "rank")[0]) < 1e-5
    assert [r["relevance_score"] for r in ranked] == sorted((r["relevance_score"] for r in ranked), reverse=True)
    # llama.cpp's pairing for a WordPiece vocabulary: [CLS] query [SEP] document (no trailing [SEP]: add_eos false)
    tok = llm.tokenizer
    assert rerank_prompt(llm.model, q, "cats") == [101] + tok.encode(q, add_special=False) + [102] + \
        tok.encode("cats", add_special=False)


def test_wordpiece_normalization(files):
    tok = pi.Model(files["bert", "f32"]).tokenizer
    ids = {t: i for i, t in enumerate(WPM_TOKENS)}
    enc = lambda s: tok.encode(s, add_special=False)  # noqa: E731
    assert tok.encode("hello") == [101, ids["\u2581hello"], 102]
    assert enc("HeLLo   WORLD") == [ids["\u2581hello"], ids["\u2581world"]]          # lowercase, whitespace
    assert enc("Café") == [ids["\u2581c"], ids["a"], ids["f"], ids["e"]]              # accents stripped (NFD)
    assert enc("hello,world!") == [ids["\u2581hello"], ids["\u2581,"], ids["\u2581world"], ids["\u2581!"]]
    assert enc("中文") == [ids["\u2581中"], ids["\u2581文"]]                             # CJK: a word each
    assert enc("unaffable") == [ids["\u2581un"], ids["aff"], ids["able"]]              # greedy longest match
    assert enc("hel\x00lo wor\u200bld") == enc("hello world")                           # NUL, Cf dropped
    assert enc("zzz☃ hello") == [100, ids["\u2581hello"]]                             # no piece: one [UNK]
    assert enc("[CLS] hi") != [101] + enc("hi")
    assert tok.encode("[CLS] hello", add_special=False, parse_special=True) == [101, ids["\u2581hello"]]
    assert tok.decode(tok.encode("hello world, tokenization")) == "hello world , tokenization"


def test_refusals(files, tmp_path):
    path = files["bert", "f32"]
    llm = pi.PowerInfer(path, n_ctx=512, n_batch=64, n_threads=1, verbose=False)
    with pytest.raises(RequestError, match="encoder model"):
        llm.create_completion("hello", max_tokens=2)
    with pytest.raises(ValueError, match="one batch, at most 64"):
        llm.embed(list(range(110, 180)), truncate=False)
    assert len(llm.embed(list(range(110, 180)))) == TINY["n_embd"]     # truncate: the first 64
    emb = Embedder(pi.Model(path), n_ctx=512, n_batch=512)
    assert emb.max_tokens == TINY["n_ctx_train"]
    with pytest.raises(ValueError, match="positions"):
        emb.embed_tokens([list(range(110, 110 + TINY["n_ctx_train"] + 1))])
    with pytest.raises(PowerInferError, match="no output head"):
        llm.ctx.set_outputs(logits=True)
    with pytest.raises(ValueError, match="decoded whole"):
        emb.ctx.decode(list(range(110, 110 + 513)), pos=list(range(513)), seq_id=0, logits="all")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "main.py"), "-m", str(path), "-p", "hi", "-n", "2"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "encoder model (bert)" in r.stderr, r.stderr
    for arch in ("jina-bert-v2", "modern-bert", "nomic-bert-moe"):
        bad = rewrite(path, tmp_path / f"{arch}.gguf", arch=arch)
        with pytest.raises(ModelLoadError, match=f"encoder architecture '{arch}'"):
            pi.Model(bad)
    ugm = rewrite(path, tmp_path / "ugm.gguf", meta={"tokenizer.ggml.model": ("t5", VT.STRING)})
    with pytest.raises(ModelLoadError, match="UGM"):
        pi.Model(ugm)


def test_server_embedding_and_rerank(files):
    """examples/server.py on a bert file with --embedding and on the reranker with --rerank (subprocesses): vectors
    and scores equal the API's (and so the reference's), completions answer 400 naming the encoder."""
    pytest.importorskip("uvicorn")
    from test_server import free_port, post, wait_healthy
    ref = ReferenceEncoder(files["bert", "f32"])
    rref = ReferenceEncoder(files["rerank"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLAMA_API_KEY", None)
    procs = []
    try:
        bases = {}
        for name, path, flag in (("embd", files["bert", "f32"], "--embedding"), ("rank", files["rerank"], "--rerank")):
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "examples" / "server.py"), "-m", str(path),
                                           "--port", str(port), "-c", "512", "-t", "1", flag],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
            bases[name] = f"http://127.0.0.1:{port}"
            wait_healthy(bases[name], proc=procs[-1])
        tok = pi.Model(files["bert", "f32"]).tokenizer
        r = post(bases["embd"], "/v1/embeddings", {"input": TEXTS[:2]})
        assert r.status_code == 200, r.text
        for d, text in zip(r.json()["data"], TEXTS[:2]):
            want = ref.pooled(tok.encode(text), "mean")
            want /= np.linalg.norm(want)
            assert rel_rms(np.array(d["embedding"]), want) < 1e-5
        r = post(bases["embd"], "/v1/completions", {"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 400 and "encoder model" in r.json()["error"]["message"], r.text
        r = post(bases["embd"], "/v1/embeddings", {"input": list(range(110, 110 + TINY["n_ctx_train"] + 1))})
        assert r.status_code == 400 and "encoder" in r.json()["error"]["message"], r.text
        r = post(bases["rank"], "/rerank", {"query": "what is a cat", "documents": TEXTS})
        assert r.status_code == 200, r.text
        rtok = pi.Model(files["rerank"])
        for res in r.json()["results"]:
            want = rref.pooled(rerank_prompt(rtok, "what is a cat", TEXTS[res["index"]]), "rank")[0]
            assert abs(res["relevance_score"] - want) < 1e-5
    finally:
        for p in procs:
            p.terminate()
            p.communicate(timeout=15)
