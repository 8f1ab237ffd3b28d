"""Encoders (bert, nomic-bert; tests/encoder_files.py) through llama.cpp (llama-cpp-python, embedding=True) and
through ours: WordPiece token ids equal on many strings; per-token hidden states and pooled, normalized embeddings
agree in f32, f16 and Q8_0 (the worst cosine and max relative error named below, the measured values in
parentheses); the bert reranker's scores over llama.cpp's rerank prompts agree."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from encoder_files import write_bert_model  # noqa: E402
from powerinfer.embedding import rerank_prompt  # noqa: E402

STRINGS = ["hello world", "Hello World!", "  the   quick\tbrown\nfox  ", "HeLLo, WORLD... what?!", "café Café CAFÉ",
           "naïve façade résumé", "Ünïcödé ßtraße", "中文字 日本語の世界", "你好世界hello", "한국 한국어",
           "αβγ δλ ΑΒΓ", "абв ГДЕ", "unaffable tokenization", "embeddings embedding embed", "cats' dog's",
           "a-b_c/d\\e", "1234567890 3.14 1,000", "$100 & 50% off #tag @user", "emoji 😀 🐈 ok",
           "\u200bzero\u200dwidth", "tab\tand\x0bvt", "x" * 40,
           "supercalifragilisticexpialidocious", "[CLS] not special", "[SEP][UNK]",
           "mixed中文text", "ﬁ ligature ½ ² ℌ", "\u00a0nbsp\u3000ideo", "<s> </s> <unk>", "", "   ", "!!!", "a",
           "the the the", "what is a cat? cats are very good.", "İstanbul ǅ ǈ", "Ωmega Ωhm", "ÅåÆæØø"]
# hidden states (the last layer's x): worst max |diff| / max |ref| over the texts; mean-pooled normalized vectors: worst
# cosine. Measured: bert f32 3.4e-4 (ggml's GELU is an f16 table lookup; nomic-bert's SiLU: 4.8e-7), f16 4.4e-4 /
# 7.0e-4 (ggml's f16 matmuls round the activations to f16; ours keep them f32), q8_0 9.3e-3 / 7.2e-3; cosines >=
# 0.9999999 (f32, f16), 0.999991 (q8_0)
MAX_REL = {"f32": 1e-3, "f16": 2e-3, "q8_0": 2e-2}
MIN_COS = {"f32": 0.99999, "f16": 0.99999, "q8_0": 0.9999}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("enc")
    return {(a, dt): write_bert_model(d / f"{a}-{dt}.gguf", a, dtype=dt, seed=7)[0]
            for a in ("bert", "nomic-bert") for dt in ("f32", "f16", "q8_0")}


def their_model(path, pooling):
    return llama_cpp.Llama(str(path), embedding=True, pooling_type=pooling, n_ctx=256, n_batch=256, n_ubatch=256,
                           n_threads=2, verbose=False)


def test_wordpiece_ids_equal_llama_cpp(files):
    ll = their_model(files["bert", "f32"], 0)
    tok = pi.Model(files["bert", "f32"]).tokenizer
    for s in STRINGS:
        for special in (False, True):
            theirs = ll.tokenize(s.encode(), add_bos=True, special=special)
            assert tok.encode(s, add_special=True, parse_special=special) == theirs, (s, special)
            theirs = ll.tokenize(s.encode(), add_bos=False, special=special)
            assert tok.encode(s, add_special=False, parse_special=special) == theirs, (s, special)


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("arch", ["bert", "nomic-bert"])
def test_embeddings_agree_with_llama_cpp(files, arch, dtype):
    path = files[arch, dtype]
    ll_none, ll_mean = their_model(path, 0), their_model(path, 1)
    llm = pi.PowerInfer(path, n_ctx=256, n_batch=256, n_threads=2, verbose=False)
    worst_rel, worst_cos = 0.0, 1.0
    texts = [s for s in STRINGS if s.strip()][:12]
    ours_mean = llm.embed(texts, normalize=True)
    for text, om in zip(texts, ours_mean):
        theirs = np.array(ll_none.embed(text, normalize=False))
        ours = llm.embedder.embed_tokens([llm.tokenize(text)], pooling="none", embd_normalize=-1)[0]
        worst_rel = max(worst_rel, float(np.abs(ours - theirs).max() / np.abs(theirs).max()))
        tm = np.array(ll_mean.embed(text, normalize=True))
        worst_cos = min(worst_cos, float(np.dot(om, tm) / np.linalg.norm(om) / np.linalg.norm(tm)))
    print(f"{arch} {dtype}: max rel {worst_rel:.2e}, min cosine {worst_cos:.8f}")
    assert worst_rel < MAX_REL[dtype] and worst_cos > MIN_COS[dtype]


def test_bert_reranker_scores_agree_with_llama_cpp(tmp_path):
    path = write_bert_model(tmp_path / "rerank.gguf", "bert", rerank=True, seed=5)[0]
    ll = their_model(path, 4)
    llm = pi.PowerInfer(path, n_ctx=256, n_threads=2, verbose=False)
    mem = llama_cpp.llama_get_memory(ll._ctx.ctx)
    for doc in ("a cat is an animal", "the sky is blue", "dogs bark", "cats purr"):
        toks = rerank_prompt(llm.model, "what is a cat", doc)
        ll._batch.reset()
        ll._batch.add_sequence(toks, 0, False)
        ll._ctx.decode(ll._batch)
        theirs = llama_cpp.llama_get_embeddings_seq(ll._ctx.ctx, 0)[0]
        llama_cpp.llama_memory_clear(mem, True)
        ours = llm.embedder.embed_tokens([toks], pooling="rank")[0][0]
        print(f"{doc!r}: ours {ours:.7f} llama.cpp {theirs:.7f}")
        assert abs(ours - theirs) < 1e-3     # (measured 1.6e-4: the GELU table)
