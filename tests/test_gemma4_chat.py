"""Gemma 4's chat format against llama.cpp: tests/fixtures/gemma4_chat_llama_cpp.json holds what llama.cpp's chat code
(common/chat.cpp: its Jinja engine, its Gemma 4 template adjustments and PEG parser; written by
tools/gemma4_chat_fixtures.py through tools/llama_chat) makes of Gemma 4 conversations (the prompt) and replies (the
OpenAI message), with the current template and an older one (data/google-gemma-4-31B-it*.jinja). Here: our sandbox
renders the same prompts; a reply gives the same reasoning_content, content and tool_calls through the response
shaper the API and the server use, whole and streamed in every chunking; the built-in gemma4 template of files
without one renders the text conversations alike; end to end, a tiny model with a Gemma 4 vocabulary answers
/v1/chat/completions with reasoning and tool calls."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import powerinfer as pi
from powerinfer.api import CompletionShaper
from powerinfer.chat import ChatFormatter
from powerinfer.reasoning import Gemma4Splitter, splitter_for
from powerinfer.request import Result
from powerinfer.tokenizer import Tokenizer
from powerinfer.tools import ToolCalls, parse_tool_calls
from test_reasoning import check_every_chunking
from test_tokenizer_bpe import GEMMA4_BYTES, GEMMA4_SPECIAL, gemma4_meta, gemma4_types

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = {"gemma4": (ROOT / "data" / "google-gemma-4-31B-it.jinja").read_text(),
             "gemma4-interleaved": (ROOT / "data" / "google-gemma-4-31B-it-interleaved.jinja").read_text()}
CASES = json.loads((ROOT / "tests" / "fixtures" / "gemma4_chat_llama_cpp.json").read_text())["cases"]
RENDER = [c for c in CASES if c["kind"] == "render"]
PARSE = [c for c in CASES if c["kind"] == "parse"]


def case_id(c):
    return f"{c['template']}-{c['name']}"


def render(fmt: ChatFormatter, req: dict) -> str:
    """The prompt as the server makes it: tools as the template's `tools`, enable_thinking where the request says."""
    kwargs = {k: req[k] for k in ("tools", "enable_thinking") if k in req}
    return fmt.render(req["messages"], add_generation_prompt=req.get("add_generation_prompt", True), **kwargs)


@pytest.mark.parametrize("case", RENDER, ids=case_id)
def test_template_renders_as_llama_cpp(case):
    fmt = ChatFormatter.resolve({"tokenizer.chat_template": TEMPLATES[case["template"]]}, bos_token="<bos>",
                                eos_token="<eos>")
    assert fmt.gemma4 and fmt.end_of_turn == ["<turn|>", "<|tool_response>"]
    assert render(fmt, case["request"]) == case["prompt"]


TEXT_ONLY = [c for c in RENDER if c["template"] == "gemma4" and "tools" not in c["request"]
             and c["name"] not in ("assistant_thought_stripped", "content_parts")]


@pytest.mark.parametrize("case", TEXT_ONLY, ids=case_id)
def test_builtin_template_renders_text_turns_as_llama_cpp(case):
    """Files without a template get the built-in gemma4 one: the official template's text turns."""
    assert render(ChatFormatter.builtin("gemma4", bos_token="<bos>"), case["request"]) == case["prompt"]


def test_vocabulary_without_template_gets_the_builtin():
    """A Gemma 4 vocabulary (<|turn> a control token) in a file without a template: the built-in gemma4 format, its
    turns ended by <turn|> / <|tool_response>, its markers shown in replies."""
    tokens = GEMMA4_SPECIAL + GEMMA4_BYTES
    tok = Tokenizer.from_gguf_metadata(gemma4_meta(tokens, gemma4_types(tokens), []))
    fmt = ChatFormatter.resolve({}, tokenizer=tok)
    assert fmt.name == "gemma4" and fmt.bos_token == "<bos>" and fmt.end_of_turn == ["<turn|>", "<|tool_response>"]
    assert "<|channel>" in fmt.preserved and not fmt.gemma4       # (no tools: not the official template's extras)
    hi = [{"role": "user", "content": "Hi"}]
    assert fmt.render(hi) == "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"


def test_main_cnv_reply_shows_the_markers():
    """examples/main.py -cnv shows a reply's thought channel with its markers (the format's preserved tokens), so
    that ChatTurns hands it back to the template, which strips it."""
    import importlib.util
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("examples_main", ROOT / "examples" / "main.py")
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    tokens = GEMMA4_SPECIAL + GEMMA4_BYTES
    tok = Tokenizer.from_gguf_metadata(gemma4_meta(tokens, gemma4_types(tokens), []))
    text = "<|channel>thought\nhm<channel|>Hi"
    ids = tok.encode(text, add_special=False, parse_special=True)
    gen = SimpleNamespace(generate=lambda *a, **k: (t for t in ids), hit_eog=True, stop_word="")
    shown = []
    out = SimpleNamespace(write=lambda s, *a: shown.append(s))
    preserved = main.preserved_ids(ChatFormatter.builtin("gemma4"), tok)
    got = main.reply(gen, tok, 10, [], SimpleNamespace(requested=False), out, preserved=preserved)
    assert got == "".join(shown) == text
    assert main.reply(gen, tok, 10, [], SimpleNamespace(requested=False), out) == "thought\nhmHi"


def chunkings(text: str):
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


def shaped(case, pieces, stream: bool) -> dict:
    """The message our response shaper makes of the reply in `pieces` (deltas summed when streamed)."""
    req = case["request"]
    tc = ToolCalls.of_request(req.get("tools"), None, TEMPLATES["gemma4"])
    shaper = CompletionShaper("chat", "gemma4", tools=tc, reasoning=splitter_for(req["reasoning_format"],
                                                                                  case["prompt"]))
    res = Result(stop_type="eos")
    if not stream:
        for p in pieces:
            shaper.add(p, None)
        return shaper.response(res)["choices"][0]["message"]
    chunks = shaper.start_chunks() + [shaper.token_chunk(p, None) for p in pieces] + shaper.final_chunks(res)
    deltas = [c["choices"][0]["delta"] for c in chunks if c is not None and c["choices"]]
    return {"content": "".join(d.get("content") or "" for d in deltas),
            "reasoning_content": "".join(d.get("reasoning_content") or "" for d in deltas),
            "tool_calls": [tc for d in deltas for tc in d.get("tool_calls", [])]}


def summary(msg: dict):
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    return msg.get("content") or "", msg.get("reasoning_content") or "", calls


@pytest.mark.parametrize("case", PARSE, ids=case_id)
def test_reply_reads_as_llama_cpp(case):
    """reasoning_content, content and tool_calls (arguments compared as JSON), whole and streamed."""
    expect = summary(case["message"])
    text = case["request"]["text"]
    assert summary(shaped(case, [text], stream=False)) == expect
    for pieces in chunkings(text):
        assert summary(shaped(case, pieces, stream=True)) == expect, pieces
    if "tools" not in case["request"] and case["request"]["reasoning_format"] == "auto":
        check_every_chunking(Gemma4Splitter, text, expect[1], expect[0])


def test_streamed_reasoning_with_tools_comes_as_written():
    """With tools ("auto"), a streamed reply's thought channel streams as it is written, and the content before a
    call too; the call comes at the end."""
    case = next(c for c in PARSE if c["name"] == "thought_content_call")
    tc = ToolCalls.of_request(case["request"]["tools"], None, TEMPLATES["gemma4"])
    shaper = CompletionShaper("chat", "gemma4", tools=tc)
    chunks = [shaper.token_chunk(ch, None) for ch in case["request"]["text"]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c is not None]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Check the time."
    assert "".join(d.get("content", "") for d in deltas) == "One moment."
    assert len([d for d in deltas if "reasoning_content" in d]) > 5          # token by token, not at the end
    final = [c["choices"][0]["delta"] for c in shaper.final_chunks(Result(stop_type="eos"))]
    assert [list(d) for d in final] == [["tool_calls"], []]


def test_splitter_chosen_by_the_prompt():
    prompts = {c["name"]: c["prompt"] for c in RENDER if c["template"] == "gemma4"}
    assert isinstance(splitter_for("auto", prompts["user"]), Gemma4Splitter)
    assert isinstance(splitter_for("auto", prompts["user_no_thinking"]), Gemma4Splitter)
    assert splitter_for("none", prompts["user"]) is None
    s = splitter_for("auto", "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n")   # a continuation
    assert s.feed("still thinking<channel|>Done") == ("still thinking", "Done")


def test_tool_call_values():
    """Gemma 4's argument syntax: <|"|> strings (anything inside, quotes and newlines too), numbers, literals, nested
    objects and arrays, spaces; a call of an unknown tool or a broken one stays text."""
    q = '<|"|>'
    text = (f'Sure.<|tool_call>call:f{{s:{q}a "b", {{c}}{q},n:-1.5e3,t:true,z:null,o:{{ k : [1, {q}x{q}, {{}}] }}}}'
            f'<tool_call|><|tool_call>call:nope{{a:1}}<tool_call|><|tool_call>call:f{{a:{q}open}}<tool_call|>')
    calls, content = parse_tool_calls(text, "gemma4", {"f"})
    assert calls == [{"name": "f", "arguments": {"s": 'a "b", {c}', "n": -1500.0, "t": True, "z": None,
                                                 "o": {"k": [1, "x", {}]}}}]
    assert content == f"Sure.<|tool_call>call:nope{{a:1}}<tool_call|><|tool_call>call:f{{a:{q}open}}<tool_call|>"


# ------------------------------------------------------------------ end to end: a tiny model with a Gemma 4 vocabulary
WORDS = ["▁", "a", "e", "i", "o", "u", "n", "r", "s", "t", "h", "l", "d", "c", "m", "p", "y", "w", "g", ".", ",",
         "!", "?", ":", "{", "}", "\n", "P", "H", "T", "N", "I", "_", "th", "▁t", "▁th", "er", "in", "an", "on", "at",
         "en", "ar", "he", "Pa", "Par", "Pari", "Paris"]
MERGES = ["t h", "▁ t", "▁t h", "e r", "i n", "a n", "o n", "a t", "e n", "a r", "h e", "P a", "Pa r", "Par i",
          "Pari s"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def gemma4_file(tiny_model, tmp_path_factory):
    """The tiny llama with Gemma 4's vocabulary (its 320 ids: the specials, the 256 byte tokens, a few words) and
    template."""
    from gguf import GGUFValueType as VT
    from model_files import rewrite
    tokens = GEMMA4_SPECIAL + GEMMA4_BYTES + WORDS
    assert len(tokens) == 320
    meta = gemma4_meta(tokens, gemma4_types(tokens), MERGES)
    kinds = {"tokenizer.ggml.tokens": VT.STRING, "tokenizer.ggml.token_type": VT.INT32,
             "tokenizer.ggml.merges": VT.STRING}
    out = {k: ((v, VT.ARRAY, kinds[k]) if k in kinds else (v, VT.STRING if isinstance(v, str) else VT.UINT32))
           for k, v in meta.items()}
    out["tokenizer.chat_template"] = (TEMPLATES["gemma4"], VT.STRING)
    out["tokenizer.ggml.scores"] = None
    return rewrite(tiny_model("f32", seed=2), tmp_path_factory.mktemp("g4") / "gemma4-vocab.gguf", meta=out)


class Force:
    """A logits processor that makes the model write `ids` (the test's stand-in for a model that knows Gemma 4)."""

    def __init__(self, ids):
        self.ids, self.n0 = list(ids), None

    def __call__(self, input_ids, scores):
        self.n0 = len(input_ids) if self.n0 is None else self.n0
        out = np.full_like(scores, -np.inf)
        out[self.ids[min(len(input_ids) - self.n0, len(self.ids) - 1)]] = 0.0
        return out


@pytest.fixture(scope="module")
def llm(gemma4_file):
    m = pi.PowerInfer(str(gemma4_file), n_ctx=1024, n_threads=1, verbose=False)
    yield m
    m.close()


REPLIES = {   # the model's reply (special tokens as text) -> (content, reasoning_content, calls)
    "answer": ("<|channel>thought\nThe user asks.<channel|>Hi there!<turn|>", ("Hi there!", "The user asks.", [])),
    "call": ('<|channel>thought\nNeed the weather.<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>}'
             "<tool_call|><|tool_response>", ("", "Need the weather.", [("get_weather", {"city": "Paris"})])),
}


def test_vocabulary_ends_turns_and_shows_markers(llm):
    tok = llm.tokenizer
    assert isinstance(tok, Tokenizer) and tok.add_bos and llm.chat_formatter.gemma4
    turn_end, response = (tok.encode(t, add_special=False, parse_special=True)[0]
                          for t in ("<turn|>", "<|tool_response>"))
    assert tok.is_eog(turn_end) and tok.is_eog(response)
    text, ids, stops, stop_ids = llm.chat_prompt([{"role": "user", "content": "Hi"}])
    assert text.startswith("<bos><|turn>system\n<|think|>\n") and ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert stop_ids == [turn_end, response] and stops == []
    shown = {tok.id_to_text(i) for i in llm.chat_preserved_ids}
    assert shown == {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>", '<|"|>'}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("reply", sorted(REPLIES))
def test_api_reasoning_and_tool_calls(llm, reply, stream):
    text, expect = REPLIES[reply]
    force = Force(llm.tokenize(text, add_bos=False, special=True))
    r = llm.create_chat_completion([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=100,
                                   logits_processor=[force], stream=stream, temperature=0)
    if stream:
        chunks = list(r)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        msg = {"content": "".join(d.get("content") or "" for d in deltas),
               "reasoning_content": "".join(d.get("reasoning_content") or "" for d in deltas),
               "tool_calls": [tc for d in deltas for tc in d.get("tool_calls", [])]}
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    else:
        msg, finish = r["choices"][0]["message"], r["choices"][0]["finish_reason"]
    assert summary(msg) == expect
    assert finish == ("tool_calls" if expect[2] else "stop")


def test_server_chat_completions(llm, monkeypatch):
    """/v1/chat/completions (the reply forced into the server's tasks): the reasoning apart (the splitter its prompt
    picks), reasoning_format none leaves the reply whole with its markers shown, with tools the calls, streamed too;
    Ollama's /api/generate: the thinking apart."""
    from starlette.testclient import TestClient
    from powerinfer.server.app import ServerState, create_app
    reply = {}
    make_task = llm.make_task
    monkeypatch.setattr(llm, "make_task", lambda tokens, **kw: make_task(
        tokens, **kw, logits_processor=[Force(llm.tokenize(reply["text"], add_bos=False, special=True))]))
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "temperature": 0}
    with TestClient(create_app(ServerState(model_path="tiny", llm=llm))) as http:
        for name, extra, want in (
                ("answer", {}, REPLIES["answer"][1]),
                ("answer", {"reasoning_format": "none"}, ("<|channel>thought\nThe user asks.<channel|>Hi there!", "",
                                                          [])),
                ("call", {"tools": TOOLS}, REPLIES["call"][1]),
                ("call", {"tools": TOOLS, "stream": True}, REPLIES["call"][1])):
            reply["text"] = REPLIES[name][0]
            r = http.post("/v1/chat/completions", json={**body, **extra})
            assert r.status_code == 200, r.text
            if extra.get("stream"):
                chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
                deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
                msg = {"content": "".join(d.get("content") or "" for d in deltas),
                       "reasoning_content": "".join(d.get("reasoning_content") or "" for d in deltas),
                       "tool_calls": [tc for d in deltas for tc in d.get("tool_calls", [])]}
            else:
                msg = r.json()["choices"][0]["message"]
            assert summary(msg) == want, (name, extra)
        reply["text"] = REPLIES["answer"][0]            # Ollama's /api/generate renders the template too
        r = http.post("/api/generate", json={"model": "tiny", "prompt": "Hi", "stream": False})
        assert r.status_code == 200, r.text
        assert (r.json()["response"], r.json()["thinking"]) == ("Hi there!", "The user asks.")
