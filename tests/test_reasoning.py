"""A chat reply's <think>...</think> in message.reasoning_content (powerinfer.reasoning; llama.cpp's
--reasoning-format): the splitter on every chunking of its input, and the API and the server on replies a grammar
forces the tiny model to write."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402
from powerinfer.reasoning import HarmonySplitter, ReasoningSplitter, prompt_opens_thinking, splitter_for  # noqa: E402
from powerinfer.request import RequestError  # noqa: E402

# (reply text, whether the prompt opened <think>) -> (reasoning, content)
CASES = [
    ("<think>the user asks</think>\n\nyes.", False, "the user asks", "yes."),
    ("  <think>\nplan\n</think>answer", False, "\nplan\n", "answer"),
    ("plain answer <think>not reasoning</think>", False, "", "plain answer <think>not reasoning</think>"),
    ("\n\nplain", False, "", "\n\nplain"),
    ("the user asks</think> yes", True, "the user asks", "yes"),
    ("<think>unclosed", False, "unclosed", ""),
    ("<thi", False, "", "<thi"),                      # a reply that stops inside the opening tag: its text
    ("<think>a</thin", False, "a</thin", ""),         # ... inside the closing tag: reasoning
    ("<think></think>", False, "", ""),
    ("", True, "", ""),
    ("a < b </ c </think>ok", True, "a < b </ c ", "ok"),
]


def check_every_chunking(make, text, reasoning, content):
    """Whole, one character at a time and at every single cut: a splitter from make() gives the same two strings."""
    chunkings = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for pieces in chunkings:
        s = make()
        r = c = ""
        for p in pieces:
            dr, dc = s.feed(p)
            r, c = r + dr, c + dc
        dr, dc = s.finish()
        assert (r + dr, c + dc) == (reasoning, content), pieces


@pytest.mark.parametrize("text,opened,reasoning,content", CASES)
def test_splitter_every_chunking(text, opened, reasoning, content):
    check_every_chunking(lambda: ReasoningSplitter(opened), text, reasoning, content)


# gpt-oss's harmony replies (after a prompt ending in <|start|>assistant) -> (reasoning, content)
HARMONY = [
    ("<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
     "User greets.", "Hello!"),
    ("<|channel|>final<|message|>Just this.", "", "Just this."),
    ("plain text", "", "plain text"),
    ("<|channel|>analysis<|message|>thinking <|chan", "thinking <|chan", ""),        # stopped inside a marker
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=functions.f "
     "<|constrain|>json<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>done", "a", "{}done"),
    ("<|channel|>analys", "", ""),                                                   # an unfinished header
]


@pytest.mark.parametrize("text,reasoning,content", HARMONY)
def test_harmony_every_chunking(text, reasoning, content):
    check_every_chunking(HarmonySplitter, text, reasoning, content)


def test_harmony_chosen_by_the_prompt():
    assert isinstance(splitter_for("auto", "<|start|>user<|message|>hi<|end|><|start|>assistant"), HarmonySplitter)
    assert isinstance(splitter_for("auto", "<|im_start|>assistant\n"), ReasoningSplitter)
    assert splitter_for("none", "<|start|>assistant") is None


def test_prompt_opens_thinking():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")   # thinking turned off
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


THOUGHT = 'root ::= "<think>" thought "</think>" "\\n\\n" answer\n' \
          'thought ::= "the user " ("asks" | "wants") " a thing"\nanswer ::= "yes." | "no."'


@pytest.fixture(scope="module")
def llm(tiny_model):
    m = pi.PowerInfer(tiny_model("f32", seed=1), n_ctx=256, n_threads=1)
    yield m
    m.close()


def test_api_whole_and_streamed(llm):
    msgs = [{"role": "user", "content": "Hi"}]
    r = llm.create_chat_completion(msgs, grammar=THOUGHT, max_tokens=60, seed=3)
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] in ("the user asks a thing", "the user wants a thing")
    assert msg["content"] in ("yes.", "no.")
    chunks = list(llm.create_chat_completion(msgs, grammar=THOUGHT, max_tokens=60, seed=3, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == msg["content"]
    assert not any("<think>" in d.get("content", "") or "think>" in d.get("reasoning_content", "") for d in deltas)
    whole = llm.create_chat_completion(msgs, grammar=THOUGHT, max_tokens=60, seed=3, reasoning_format="none")
    m2 = whole["choices"][0]["message"]
    assert "reasoning_content" not in m2
    assert m2["content"] == f"<think>{msg['reasoning_content']}</think>\n\n{msg['content']}"
    with pytest.raises(RequestError, match="reasoning_format"):
        llm.create_chat_completion(msgs, max_tokens=2, reasoning_format="raw")


def test_constructor_default(tiny_model):
    m = pi.PowerInfer(tiny_model("f32", seed=1), n_ctx=256, n_threads=1, reasoning_format="none")
    r = m.create_chat_completion([{"role": "user", "content": "Hi"}], grammar=THOUGHT, max_tokens=60, seed=3)
    assert r["choices"][0]["message"]["content"].startswith("<think>the user ")
    m.close()
    with pytest.raises(ValueError, match="reasoning_format"):
        pi.PowerInfer(tiny_model("f32", seed=1), n_ctx=256, reasoning_format="deepseek-legacy")


def test_server_request_field(llm):
    """The server's chat endpoint: the request's reasoning_format over the server's default; a bad one is a 400."""
    from starlette.testclient import TestClient
    from powerinfer.server.app import ServerState, create_app
    app = create_app(ServerState(model_path="tiny", llm=llm))
    with TestClient(app) as http:
        body = {"messages": [{"role": "user", "content": "Hi"}], "grammar": THOUGHT, "max_tokens": 60, "seed": 3}
        msg = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert msg["content"] in ("yes.", "no.") and msg["reasoning_content"].startswith("the user ")
        raw = http.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
        assert raw["choices"][0]["message"]["content"].startswith("<think>")
        bad = http.post("/v1/chat/completions", json={**body, "reasoning_format": 3})
        assert bad.status_code == 400 and "reasoning_format" in json.dumps(bad.json())
        bad = http.post("/v1/chat/completions", json={**body, "reasoning_format": "raw"})
        assert bad.status_code == 400 and "reasoning_format" in json.dumps(bad.json())


def test_server_flags():
    """--reasoning-budget 0 turns thinking off through the template (enable_thinking = false, as llama.cpp); only -1
    and 0 are taken; --chat-template-kwargs must be a JSON object."""
    from powerinfer.server.cli import parse_args
    assert parse_args(["-m", "x.gguf"]).template_kwargs == {}
    assert parse_args(["-m", "x.gguf", "--reasoning-budget", "0"]).template_kwargs == {"enable_thinking": False}
    a = parse_args(["-m", "x.gguf", "--chat-template-kwargs", '{"enable_thinking": true, "x": 1}'])
    assert a.template_kwargs == {"enable_thinking": True, "x": 1}
    for bad in (["--reasoning-budget", "100"], ["--chat-template-kwargs", "[1]"], ["--chat-template-kwargs", "{x"]):
        with pytest.raises(SystemExit):
            parse_args(["-m", "x.gguf", *bad])


def test_server_template_kwargs(tiny_model):
    """The server's template variables reach the template; a request's chat_template_kwargs override them."""
    from starlette.testclient import TestClient
    from powerinfer.server.app import ServerState, create_app
    template = ("{% if enable_thinking is defined and enable_thinking is false %}NOTHINK {% endif %}"
                "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    m = pi.PowerInfer(tiny_model("f32", seed=1), n_ctx=256, n_threads=1, chat_template=template)
    app = create_app(ServerState(model_path="tiny", llm=m, template_kwargs={"enable_thinking": False}))
    with TestClient(app) as http:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        for extra, expect in (({}, True), ({"chat_template_kwargs": {"enable_thinking": True}}, False)):
            assert http.post("/v1/chat/completions", json={**body, **extra}).status_code == 200
            (slot,) = http.get("/slots").json()
            assert ("NOTHINK" in slot["prompt"]) == expect, slot["prompt"]
    m.close()
