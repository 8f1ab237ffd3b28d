"""tool_choice "auto" (OpenAI's default with tools): the reply is read afterwards in the call syntax of the model's
chat template (powerinfer.tools.parse_tool_calls): Hermes / Qwen <tool_call>, Mistral [TOOL_CALLS], Llama 3.1
<|python_tag|> / bare {"name", "parameters"}, the generic {"name", "arguments"}; calls of unknown tools and broken
JSON stay text; end to end with the reply forced token by token through a logits processor."""
from __future__ import annotations

import json

import numpy as np
import pytest

import powerinfer as pi
from powerinfer.tools import parse_tool_calls, syntax_of

NAMES = {"get_weather", "add"}


@pytest.mark.parametrize("syntax,text,calls,content", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     [("get_weather", {"city": "Paris"})], "Let me check."),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n<tool_call>{"name": '
               '"get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
     [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})], ""),
    ("hermes", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', [], None),
    ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', [], None),      # broken JSON
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 3, "b": 4}, "id": "abc123def"}]',
     [("add", {"a": 3, "b": 4})], ""),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}',
     [("get_weather", {"city": "Rome"})], ""),
    ("llama3", '{"name": "add", "parameters": {"a": 5, "b": 6}}', [("add", {"a": 5, "b": 6})], ""),
    ("generic", 'Sure: {"name": "add", "arguments": {"a": 7, "b": 8}}', [("add", {"a": 7, "b": 8})], "Sure:"),
    ("generic", "Paris is sunny today {not json}.", [], None),
    # gpt-oss's harmony: the call in a commentary message (to= after or before the channel), the analysis apart
    ("harmony", '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
     [("get_weather", {"city": "Paris"})], ""),
    ("harmony", '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}<|call|>',
     [("add", {"a": 1, "b": 2})], ""),
    ("harmony", '<|channel|>analysis<|message|>No tool.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.',
     [], "Sunny."),
])
def test_parse(syntax, text, calls, content):
    got, rest = parse_tool_calls(text, syntax, NAMES)
    assert [(c["name"], c["arguments"]) for c in got] == calls
    assert rest == (content if content is not None else text.strip())


def test_syntax_of_templates():
    assert syntax_of("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    assert syntax_of("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]") == "mistral"
    assert syntax_of("<|start_header_id|>ipython<|end_header_id|>{{ tools }}") == "llama3"
    assert syntax_of("{{ messages }}") == "generic" and syntax_of(None) == "generic"
    assert syntax_of('<|start|>assistant to={{ "functions." + name }}<|channel|>commentary') == "harmony"


HERMES_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }} "
                   "Answer with <tool_call>...</tool_call><|im_end|>\n{% endif %}"
                   "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                   "{% endfor %}<|im_start|>assistant\n")


class Force:
    """A logits processor that makes the model write `ids`, then end of text (the test's stand-in for a model that
    knows the tool-call syntax)."""

    def __init__(self, ids, eos):
        self.ids, self.eos, self.n0 = list(ids), eos, None

    def __call__(self, input_ids, scores):
        if self.n0 is None:
            self.n0 = len(input_ids)
        i = len(input_ids) - self.n0
        out = np.full_like(scores, -np.inf)
        out[self.ids[i] if i < len(self.ids) else self.eos] = 0.0
        return out


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def llm(tiny_model):
    m = pi.PowerInfer(tiny_model("q8_0", seed=3), n_ctx=512, verbose=False, chat_template=HERMES_TEMPLATE)
    yield m
    m.close()


def forced(llm, text):
    return Force(llm.tokenize(text, add_bos=False), llm.tokenizer.eos_id)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_call_end_to_end(llm, stream):
    reply = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    if reply != llm.detokenize(llm.tokenize(reply, add_bos=False)):
        pytest.skip("the tiny vocabulary cannot spell the reply")
    r = llm.create_chat_completion([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, max_tokens=200,
                                   logits_processor=[forced(llm, reply)], stream=stream, temperature=0)
    if stream:
        chunks = list(r)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        content = "".join(d.get("content") or "" for d in deltas)
        calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    else:
        msg = r["choices"][0]["message"]
        content, calls, finish = msg["content"], msg["tool_calls"], r["choices"][0]["finish_reason"]
    assert finish == "tool_calls" and content == "Checking."
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_auto_text_reply_is_content(llm):
    r = llm.create_chat_completion([{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=12, temperature=0)
    c = r["choices"][0]
    assert c["finish_reason"] in ("stop", "length") and "tool_calls" not in c["message"]
    assert isinstance(c["message"]["content"], str)


def stream_parts(llm, reply, **kw):
    chunks = list(llm.create_chat_completion([{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=200,
                                             logits_processor=[forced(llm, reply)], stream=True, temperature=0, **kw))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    contents = [d["content"] for d in deltas if d.get("content")]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    return contents, calls


@pytest.mark.parametrize("reply,content,n_calls", [
    ("Hello there, no call is needed here.", "Hello there, no call is needed here.", 0),
    ("Use <tool_call> wisely, it is no call.", "Use <tool_call> wisely, it is no call.", 0),
    ('  Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>  ', "Checking.", 1),
])
def test_auto_streams_text_before_a_call(llm, reply, content, n_calls):
    """The text streams as it comes until a call may begin; the deltas add up to the whole reply's content."""
    if reply != llm.detokenize(llm.tokenize(reply, add_bos=False)):
        pytest.skip("the tiny vocabulary cannot spell the reply")
    whole = llm.create_chat_completion([{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=200,
                                       logits_processor=[forced(llm, reply)], temperature=0)["choices"][0]["message"]
    assert (whole["content"] or "") == content and len(whole.get("tool_calls") or []) == n_calls
    contents, calls = stream_parts(llm, reply)
    assert "".join(contents) == content and len(calls) == n_calls
    if n_calls == 0 and "<tool_call>" not in reply:
        assert len(contents) > 3                   # streamed token by token, not at the end


def test_server_reads_auto_calls_in_the_templates_syntax(llm):
    """The server and the API make their ToolCalls in one place, with the template's syntax."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    assert llm.tool_calls(TOOLS, None).syntax == "hermes" and llm.tool_calls(TOOLS, "auto").auto
    assert llm.tool_calls(TOOLS, "required").grammar is not None and llm.tool_calls(TOOLS, "none") is None
    from powerinfer.server.app import ServerState, create_app
    from test_server import InProcessServer, post, wait_healthy
    srv = InProcessServer(create_app(ServerState(model_path="tiny", llm=llm)))
    try:
        wait_healthy(srv.base, timeout=30)
        r = post(srv.base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                                                    "max_tokens": 6, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        t = post(srv.base, "/apply-template", {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
        assert "<tool_call>" in t.json()["prompt"] and "get_weather" in t.json()["prompt"]
    finally:
        srv.close()
