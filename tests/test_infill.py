"""Fill-in-the-middle (powerinfer.infill): the FIM tokens from metadata or spelling, the prompt's layout and its
trimming, and /infill, /v1/completions' suffix and create_completion(suffix=...) on a model whose metadata names FIM
tokens (a copy of the tiny test model with the keys added), against one without (501, OpenAI-shaped)."""
from __future__ import annotations

import sys
from pathlib import Path

import gguf
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402
from powerinfer.infill import SNIPPET, FimTokens, InfillError, fim_tokens, infill_tokens  # noqa: E402
from powerinfer.request import RequestError  # noqa: E402

FIM = FimTokens(pre=1001, suf=1002, mid=1003, pad=1004, rep=1005, sep=1006)


class CharTokenizer:
    """A stand-in: one token per character (its code point), BOS 1."""
    n_vocab, bos_id = 2000, 1

    def __init__(self, add_bos=True, texts=None, types=None):
        self.add_bos, self.texts, self.types = add_bos, texts or {}, types or {}

    def encode(self, text, add_special=True, parse_special=False):
        assert not add_special and not parse_special   # the FIM text is plain text
        return [ord(c) for c in text]

    def id_to_text(self, i):
        return self.texts.get(i, f"t{i}")

    def token_type(self, i):
        return self.types.get(i, 1)


def chars(s):
    return [ord(c) for c in s]


def test_layout_without_repo_tokens():
    fim = FimTokens(pre=1001, suf=1002, mid=1003)
    toks = infill_tokens(CharTokenizer(), fim, "ab", "cd", [{"filename": "x.py", "text": "EX"}], prompt="p")
    assert toks == chars(SNIPPET) + chars("EX") + [1, 1001] + chars("ab") + [1002] + chars("cd") + [1003] + chars("p")


def test_repo_level_layout():
    toks = infill_tokens(CharTokenizer(add_bos=False), FIM, "ab", "cd",
                         [{"filename": "a.py", "text": "A"}, {"text": "B"}])
    assert toks == ([1005] + chars("myproject\n") + [1006] + chars("a.py\n") + chars("A") + [1006] + chars("tmp\n") +
                    chars("B") + [1006] + chars("filename\n") + [1001] + chars("ab") + [1002] + chars("cd") + [1003])


def test_trimming_keeps_what_is_near_the_cursor():
    """Over budget: the extra context goes first, then the prefix's start and the suffix's end (the prefix keeping up
    to three quarters of the room); the FIM tokens and the prompt always stay."""
    tok = CharTokenizer(add_bos=False)
    fim = FimTokens(pre=1001, suf=1002, mid=1003)
    pre, suf = "P" * 30 + "p", "s" + "S" * 30
    toks = infill_tokens(tok, fim, pre, suf, [{"text": "E" * 50}], prompt="xy", budget=25)
    assert len(toks) == 25
    room = 25 - 5   # three FIM tokens and the prompt
    assert toks == [1001] + chars(pre[-15:]) + [1002] + chars(suf[:5]) + [1003] + chars("xy")
    assert toks[16] == 1002 and room * 3 // 4 == 15
    short = infill_tokens(tok, fim, "ab", "S" * 40, None, budget=20)   # a short prefix leaves the room to the suffix
    assert short == [1001] + chars("ab") + [1002] + chars("S" * 15) + [1003]
    with pytest.raises(InfillError, match="budget is 4"):
        infill_tokens(tok, fim, "a", "b", prompt="xy", budget=4)
    with pytest.raises(InfillError, match="no fill-in-the-middle tokens"):
        infill_tokens(tok, FimTokens(pre=1, suf=2), "a", "b")


def test_fim_tokens_from_metadata_and_spelling():
    tok = CharTokenizer(texts={7: "<|fim_prefix|>", 8: "<|fim_suffix|>", 9: "<|fim_middle|>", 10: "<|file_sep|>",
                               11: "<|repo_name|>", 12: "<|fim_pad|>"},
                        types={i: 3 for i in range(7, 13)})   # control tokens
    assert fim_tokens({}, tok) == FimTokens(pre=7, suf=8, mid=9, pad=12, rep=11, sep=10)
    meta = {"tokenizer.ggml.fim_pre_token_id": 20, "tokenizer.ggml.suffix_token_id": 21,   # CodeLlama-era key
            "tokenizer.ggml.middle_token_id": 22, "tokenizer.ggml.fim_sep_token_id": 5000}   # out of range: ignored
    got = fim_tokens(meta, tok)
    assert (got.pre, got.suf, got.mid, got.sep) == (20, 21, 22, 10)
    assert not fim_tokens({}, CharTokenizer()).usable


# ----------------------------------------------------------------------------------------- a real model
SHAPE = dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=3)
IDS = {"fim_pre": 300, "fim_suf": 301, "fim_mid": 302}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from powerinfer.gguf_copy import add_tensor_as_is, write, writer_like
    d = tmp_path_factory.mktemp("infill")
    plain = d / "plain.gguf"
    write_model(plain, dtype="f32", **SHAPE)
    fim = d / "fim.gguf"
    r = gguf.GGUFReader(plain)
    w = writer_like(r, str(fim))
    for k, v in IDS.items():
        w.add_uint32(f"tokenizer.ggml.{k}_token_id", v)
    for t in r.tensors:
        add_tensor_as_is(w, t)
    write(w)
    return plain, fim


def test_api_suffix_is_an_infill(models):
    plain, fim = models
    llm = pi.PowerInfer(fim, n_ctx=128, n_threads=1, verbose=False)
    assert llm.fim == FimTokens(pre=300, suf=301, mid=302)
    want = llm.infill_prompt("def f(", "):\n", max_tokens=8)
    assert want[:2] == [llm.tokenizer.bos_id, 300] and 301 in want and want[-1] == 302
    out = llm.create_completion("def f(", suffix="):\n", max_tokens=8, temperature=0, seed=1)
    assert out["usage"]["prompt_tokens"] == len(want)
    ref = llm.create_completion(want, max_tokens=8, temperature=0, seed=1)   # the same prompt as tokens
    assert out["choices"][0]["text"] == ref["choices"][0]["text"]
    with pytest.raises(RequestError, match="prompt must be a string"):
        llm.create_completion([1, 2, 3], suffix="x")
    no = pi.PowerInfer(plain, n_ctx=128, n_threads=1, verbose=False)
    with pytest.raises(RequestError, match="no fill-in-the-middle tokens") as e:
        no.create_completion("def f(", suffix="):\n")
    assert e.value.status == 501


def test_server_infill(models):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from test_server import InProcessServer, wait_healthy
    from powerinfer.server.app import ServerState, create_app
    plain, fim = models
    servers = {}
    try:
        for name, path in (("fim", fim), ("plain", plain)):
            llm = pi.PowerInfer(path, n_ctx=256, n_parallel=2, n_threads=1, verbose=False)
            servers[name] = (InProcessServer(create_app(ServerState(model_path=str(path), llm=llm))), llm)
            wait_healthy(servers[name][0].base)
        srv, llm = servers["fim"]
        body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
                "input_extra": [{"filename": "util.py", "text": "X = 1\n"}], "prompt": "a", "n_predict": 6,
                "temperature": 0, "seed": 1}
        r = httpx.post(srv.base + "/infill", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        want = llm.infill_prompt(body["input_prefix"], body["input_suffix"], body["input_extra"], "a", max_tokens=6)
        assert out["tokens_evaluated"] == len(want) and out["tokens_predicted"] <= 6
        assert out["prompt"] == llm.detokenize(want)
        # the same prompt through /completion gives the same text (greedy)
        same = httpx.post(srv.base + "/completion", json={"prompt": want, "n_predict": 6, "temperature": 0,
                                                            "seed": 1}, timeout=60).json()
        assert same["content"] == out["content"]
        r = httpx.post(srv.base + "/v1/completions", json={"prompt": "def f(", "suffix": "):\n", "max_tokens": 4,
                                                             "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(
            llm.infill_prompt("def f(", "):\n", max_tokens=4)), r.text
        for bad, param in (({"input_extra": [{"text": 3}]}, "input_extra"), ({"input_prefix": 5}, "input_prefix"),
                           ({"input_extra": "x"}, "input_extra")):
            r = httpx.post(srv.base + "/infill", json=bad, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        srv, _ = servers["plain"]
        for path, req in (("/infill", {"input_prefix": "a", "input_suffix": "b"}),
                          ("/v1/completions", {"prompt": "a", "suffix": "b"})):
            r = httpx.post(srv.base + path, json=req, timeout=60)
            assert r.status_code == 501 and "fill-in-the-middle" in r.json()["error"]["message"], r.text
    finally:
        for srv, _ in servers.values():
            srv.close()
