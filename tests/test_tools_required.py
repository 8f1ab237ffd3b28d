"""tool_choice "required" / a named tool: the reply constrained to the model's own call syntax
(powerinfer.tools.call_grammar), as llama.cpp's chat code constrains it. Per syntax, over a vocabulary that has its
markers as the special / added tokens real models have: the grammar takes the model's real call text (which then reads
as the calls) and refuses unknown tools, arguments against the schema and calls without their markers; beside it
llama.cpp's own grammar for the same request (tests/fixtures/tool_grammars_llama_cpp.json, written by
tools/tool_grammar_fixtures.py) takes the same replies, but for where the two choose differently (noted per reply).
End to end through /v1/chat/completions, whole and streamed: a Qwen-style (hermes) template on the tiny model and the
Gemma 4 template on the tiny model with Gemma 4's vocabulary, the reply forced token by token, and left to the model."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from powerinfer.grammar import Grammar, GrammarMatcher
from powerinfer.tokenizer import Tokenizer
from powerinfer.tools import ToolCalls, call_grammar, parse_tool_calls
from test_gemma4_chat import gemma4_file  # noqa: F401  (the tiny model with Gemma 4's vocabulary and template)
from test_tokenizer_bpe import GEMMA4_BYTES, GEMMA4_SPECIAL, gemma4_meta, gemma4_types

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "tests" / "fixtures" / "tool_grammars_llama_cpp.json").read_text())["cases"]
TOOLS = CASES[0]["request"]["tools"]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# the markers as real vocabularies have them: Qwen's <tool_call> / <think> added (user-defined) tokens, Mistral's and
# Llama's control tokens, harmony's (its message markers turn user-defined, <|end|> too: powerinfer.tokenizer);
# Gemma 4's are in GEMMA4_SPECIAL (control)
USER_DEFINED, CONTROL = 4, 3
MARKERS = {"<tool_call>": USER_DEFINED, "</tool_call>": USER_DEFINED, "<think>": USER_DEFINED,
           "</think>": USER_DEFINED, "[TOOL_CALLS]": CONTROL, "<|python_tag|>": CONTROL, "<|channel|>": CONTROL,
           "<|message|>": CONTROL, "<|start|>": CONTROL, "<|end|>": CONTROL, "<|constrain|>": CONTROL,
           "<|call|>": CONTROL, "<|return|>": CONTROL}


@pytest.fixture(scope="module")
def tok():
    tokens = GEMMA4_SPECIAL + GEMMA4_BYTES + ["▁", "a", "e"] + list(MARKERS)
    types = [MARKERS.get(t, k) for t, k in zip(tokens, gemma4_types(tokens))]
    return Tokenizer.from_gguf_metadata(gemma4_meta(tokens, types, []))


def matches(grammar: Grammar, tok, text: str, special: bool = True) -> bool:
    """Whether the tokens of `text` (special: marker texts as their tokens, else spelled out) are a whole reply of
    the grammar: each allowed when it comes, and end of generation allowed after the last."""
    m = GrammarMatcher(grammar, tok)
    for t in tok.encode(text, add_special=False, parse_special=special):
        if m.banned()[t]:
            return False
        m.accept(t)
    return not m.banned()[min(tok.eog_ids)]


W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
A = '{"name": "add", "arguments": {"a": 1, "b": 2.5}}'
G4W = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'
G4A = "<|tool_call>call:add{a:1,b:2.5}<tool_call|>"
# syntax -> (reply, the calls it reads as, ours takes it (parallel_tool_calls false, true), llama.cpp's takes it
# (false, true))
REPLIES = {
    "hermes": [
        (f"<tool_call>\n{W}\n</tool_call>", ["get_weather"], (1, 1), (1, 1)),
        (f"<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{A}\n</tool_call>", ["add"], (1, 1), (1, 1)),
        (f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{A}\n</tool_call>", ["get_weather", "add"], (0, 1), (1, 1)),
        ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', [], (0, 0), (0, 0)),
        ('<tool_call>\n{"name": "add", "arguments": {"a": "one", "b": 2}}\n</tool_call>', [], (0, 0), (0, 0)),
        (W, [], (0, 0), (0, 0)),                                                    # no <tool_call>
        # text before the call: llama.cpp lets it come (as content), here the call comes first
        (f"Let me look.\n<tool_call>\n{W}\n</tool_call>", ["get_weather"], (0, 0), (1, 1)),
    ],
    "gemma4": [
        (G4W, ["get_weather"], (1, 1), (1, 1)),
        ("<|channel>thought\nNeed the weather.<channel|>" + G4A, ["add"], (1, 1), (1, 1)),
        ("<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:3}<tool_call|>", ["get_weather"], (1, 1), (1, 1)),
        (G4W + G4A, ["get_weather", "add"], (0, 1), (0, 1)),
        ("<|tool_call>call:nope{}<tool_call|>", [], (0, 0), (0, 0)),
        ("call:add{a:1,b:2}", [], (0, 0), (0, 0)),                                  # no <|tool_call> ... <tool_call|>
        # arguments against the schema (a string for a number, an unknown key): llama.cpp's grammar takes any
        # Gemma 4 value (its TODO), here the parameters' schema holds
        ('<|tool_call>call:add{a:<|"|>one<|"|>,b:2}<tool_call|>', ["add"], (0, 0), (1, 1)),
        ('<|tool_call>call:get_weather{town:<|"|>Paris<|"|>}<tool_call|>', ["get_weather"], (0, 0), (1, 1)),
    ],
    "harmony": [
        ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
         ["get_weather"], (1, 1), (1, 1)),
        ('<|channel|>analysis<|message|>Need the sum.<|end|><|start|>assistant<|channel|>commentary to=functions.add'
         '<|message|>{"a": 1, "b": 2}', ["add"], (1, 1), (1, 1)),
        (' to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}', ["add"], (1, 1), (1, 1)),
        ('<|channel|>commentary to=functions.nope<|message|>{}', [], (0, 0), (0, 0)),
        ('<|channel|>commentary to=functions.add<|message|>{"a": 1}', [], (0, 0), (0, 0)),
        ("<|channel|>final<|message|>Sunny.", [], (0, 0), (0, 0)),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 3, "b": 4}, "id": "abc123def"}]', ["add"], (1, 1), (1, 1)),
        # (llama.cpp's grammar wants the "id" Mistral Nemo's template gives each call)
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}, {"name": "add", '
         '"arguments": {"a": 1, "b": 2}, "id": "123456789"}]', ["get_weather", "add"], (0, 1), (0, 1)),
        ('[TOOL_CALLS][{"name": "nope", "arguments": {}}]', [], (0, 0), (0, 0)),
        ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 3}}]', [], (0, 0), (0, 0)),
        (f"[{W}]", [], (0, 0), (0, 0)),                                              # no [TOOL_CALLS]
    ],
    "llama3": [
        ('{"name": "add", "parameters": {"a": 5, "b": 6}}', ["add"], (1, 1), (1, 1)),
        ('{"type": "function", "name": "get_weather", "parameters": {"city": "Rome"}}', ["get_weather"], (1, 1),
         (1, 1)),
        ('{"name": "nope", "parameters": {}}', [], (0, 0), (0, 0)),
        ('{"name": "add", "parameters": {"a": true, "b": 6}}', [], (0, 0), (0, 0)),
        (A, [], (0, 0), (0, 0)),                                                    # "arguments", not "parameters"
    ],
}


@pytest.mark.parametrize("syntax,reply,names,ours,theirs",
                         [(s, *r) for s, rs in REPLIES.items() for r in rs],
                         ids=[f"{s}-{i}" for s, rs in REPLIES.items() for i in range(len(rs))])
def test_call_grammar_against_llama_cpp(tok, syntax, reply, names, ours, theirs):
    for parallel in (False, True):
        g = call_grammar(syntax, SCHEMAS, tok, parallel=parallel, think=syntax == "hermes")
        assert matches(g, tok, reply) == bool(ours[parallel]), ("ours", parallel)
        case = next(c for c in CASES if c["syntax"] == syntax and c["request"]["parallel_tool_calls"] == parallel)
        # llama.cpp's grammar matches the generation prompt and the reply as text (its markers spelled out)
        # (its rule "start" renamed: in llguidance's reading of GBNF the grammar's start is that)
        theirs_g = Grammar.from_gbnf(re.sub(r"(?<![\w|-])start(?![\w|-])", "start-of-reply", case["grammar"]))
        assert matches(theirs_g, tok, case["generation_prompt"] + reply, special=False) == bool(theirs[parallel]), \
            ("llama.cpp", parallel)
    if any(ours):         # what the grammar takes reads as the calls
        assert [c["name"] for c in parse_tool_calls(reply, syntax, SCHEMAS)[0]] == names


def test_markers_are_the_special_tokens(tok):
    """A control-token marker must be the token: its characters spelled out are refused (Gemma 4's <|tool_call>,
    Mistral's [TOOL_CALLS]); an added (user-defined) one is text either way (Qwen's <tool_call>)."""
    for syntax, reply in (("gemma4", G4W), ("mistral", f"[TOOL_CALLS][{W}]")):
        g = call_grammar(syntax, SCHEMAS, tok)
        assert matches(g, tok, reply) and not matches(g, tok, reply, special=False)
    g = call_grammar("hermes", SCHEMAS, tok)
    assert matches(g, tok, f"<tool_call>{W}</tool_call>") and matches(g, tok, f"<tool_call>{W}</tool_call>", False)


def test_gemma4_arguments_are_an_object(tok):
    """A tool without properties (or without a schema type) still takes an object of any Gemma 4 values, and only
    that; a nested schema holds inside."""
    g = call_grammar("gemma4", {"noargs": {"type": "object"}, "free": {}}, tok)
    assert matches(g, tok, "<|tool_call>call:noargs{}<tool_call|>")
    assert matches(g, tok, '<|tool_call>call:free{x:[1,<|"|>a<|"|>],y:{z:null}}<tool_call|>')
    assert not matches(g, tok, '<|tool_call>call:noargs<|"|>x<|"|><tool_call|>')
    nested = {"type": "object", "properties": {"todos": {"type": "array", "items": {"type": "string"}}},
              "required": ["todos"]}
    g = call_grammar("gemma4", {"todo": nested}, tok)
    assert matches(g, tok, '<|tool_call>call:todo{todos:[<|"|>a<|"|>,<|"|>b<|"|>]}<tool_call|>')
    assert not matches(g, tok, "<|tool_call>call:todo{todos:[1]}<tool_call|>")


def test_gemma4_optional_keys(tok):
    """An object with optional keys: the required ones always, in the schema's order with the optional ones present or
    not, no key twice, none unknown (the form llama.cpp's JSON-schema grammars give objects); all optional: {} too."""
    props = {"q": {"type": "string"}, "n": {"type": "integer"}, "lang": {"type": "string"}, "safe": {"type": "boolean"}}
    g = call_grammar("gemma4", {"find": {"type": "object", "properties": props, "required": ["q", "lang"]}}, tok)
    s = '<|"|>x<|"|>'

    def call(body):
        return matches(g, tok, "<|tool_call>call:find{" + body + "}<tool_call|>")
    for body in (f"q:{s},lang:{s}", f"q:{s},n:3,lang:{s}", f"q:{s},lang:{s},safe:true",
                 f"q:{s},n:1,lang:{s},safe:false"):
        assert call(body), body
    for body in (f"q:{s}", f"lang:{s}", "", f"lang:{s},q:{s}", f"q:{s},q:{s},lang:{s}", f"q:{s},lang:{s},n:2",
                 f"q:{s},lang:{s},x:1", f"q:{s},,lang:{s}", f",q:{s},lang:{s}", f"q:{s},lang:{s},"):
        assert not call(body), body
    g = call_grammar("gemma4", {"find": {"type": "object", "properties": props}}, tok)
    for body in ("", "n:1", f"lang:{s},safe:true", f"q:{s},n:1,lang:{s},safe:false"):
        assert call(body), body
    for body in (",", "n:1,", ",n:1", "safe:true,n:1", "n:1,n:1"):
        assert not call(body), body


def test_named_tool_and_syntax_of_the_template(tok):
    """A named tool allows that one only; the syntax is the template's (a template without tools: the generic bare
    object, as before)."""
    named = {"type": "function", "function": {"name": "add"}}
    tc = ToolCalls.of_request(TOOLS, named, "{{ tools }}<tool_call>", tok)
    assert tc.syntax == "hermes" and tc.names == ["add"]
    assert matches(tc.grammar, tok, f"<tool_call>{A}</tool_call>")
    assert not matches(tc.grammar, tok, f"<tool_call>{W}</tool_call>")
    tc = ToolCalls.of_request(TOOLS, "required", "{{ messages }}", tok)
    assert tc.syntax == "generic" and matches(tc.grammar, tok, A) and not matches(tc.grammar, tok, f"[{A}]")
    msg = tc.message(A)
    assert msg["tool_calls"][0]["function"]["name"] == "add" and msg["content"] is None


def test_prompt_opened_reasoning(tok):
    """A prompt that ends inside the reasoning (hermes' <think>, Gemma 4's thought channel): a forced reply continues
    it to its close before the call (no call straight away), and the reasoning is read as reasoning_content."""
    for syntax, source, prompt, thought in (
            ("hermes", "{{ tools }}<tool_call><think>", "<|im_start|>assistant\n<think>\n", "Sum it.\n</think>\n\n"),
            ("gemma4", "{{ tools }}<|tool_call>call:", "<|turn>model\n<|channel>thought", "\nSum it.<channel|>")):
        tc = ToolCalls.of_request(TOOLS, "required", source, tok)
        call = f"<tool_call>{A}</tool_call>" if syntax == "hermes" else G4A
        assert tc.syntax == syntax and matches(tc.grammar, tok, call)
        tc.after_prompt(prompt)
        assert tc.opened and matches(tc.grammar, tok, thought + call), syntax
        assert not matches(tc.grammar, tok, call), syntax
        msg = tc.message(thought + call)
        assert msg["reasoning_content"].strip() == "Sum it." and msg["content"] is None, syntax
        assert msg["tool_calls"][0]["function"]["name"] == "add"
        tc.after_prompt(prompt + ("</think>\n\n" if syntax == "hermes" else "<channel|>"))    # closed: as before
        assert not tc.opened


# ------------------------------------------------------------------ end to end through /v1/chat/completions
HERMES_TEMPLATE = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }} "
                   "Answer with <tool_call>...</tool_call><|im_end|>\n{% endif %}"
                   "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                   "{% endfor %}<|im_start|>assistant\n"
                   "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
                   "{% if open_think is defined and open_think %}<think>\n{% endif %}")   # as Qwen3-Thinking's
ONE_TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}},
    TOOLS[1]]


def chat(http, body: dict) -> tuple[dict, str]:
    """(the message, whole or put together from the stream's deltas; finish_reason) of a /v1/chat/completions body."""
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        return r.json()["choices"][0]["message"], r.json()["choices"][0]["finish_reason"]
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    msg = {k: "".join(d.get(k) or "" for d in deltas) for k in ("content", "reasoning_content")}
    msg["tool_calls"] = [tc for d in deltas for tc in d.get("tool_calls", [])]
    return msg, [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]


def calls_of(msg) -> list:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]


class Prefix:
    """A logits processor that makes the model write `ids` first, then leaves the reply to it (and the grammar)."""

    def __init__(self, ids):
        self.ids, self.n0 = list(ids), None

    def __call__(self, input_ids, scores):
        self.n0 = len(input_ids) if self.n0 is None else self.n0
        i = len(input_ids) - self.n0
        if i >= len(self.ids):
            return scores
        out = np.full_like(scores, -np.inf)
        out[self.ids[i]] = 0.0
        return out


def run_server(llm, monkeypatch, reply: dict):
    """A test client of the server on `llm`, each task's reply forced to reply["ids"] (then end of generation) when
    set, else the model's own under the grammar after reply["prefix"] (the call's marker: a tiny random model that
    began reasoning would not end it)."""
    from starlette.testclient import TestClient
    from powerinfer.server.app import ServerState, create_app
    from test_tools_auto import Force
    make_task = llm.make_task
    eos = min(llm.tokenizer.eog_ids)

    def forced(tokens, **kw):
        if reply.get("ids") is not None:
            kw["logits_processor"] = [Force(reply["ids"], eos)]
        elif reply.get("prefix") is not None:
            kw["logits_processor"] = [Prefix(reply["prefix"])]
        return make_task(tokens, **kw)
    monkeypatch.setattr(llm, "make_task", forced)
    return TestClient(create_app(ServerState(model_path="tiny", llm=llm)))


@pytest.fixture(scope="module")
def hermes_llm(tiny_model):
    import powerinfer as pi
    m = pi.PowerInfer(tiny_model("q8_0", seed=3), n_ctx=1024, verbose=False, chat_template=HERMES_TEMPLATE)
    yield m
    m.close()


@pytest.mark.parametrize("stream", [False, True])
def test_hermes_required_and_named_end_to_end(hermes_llm, monkeypatch, stream):
    llm, reply = hermes_llm, {}
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": ONE_TOOL, "max_tokens": 300,
            "temperature": 0, "stream": stream}
    with run_server(llm, monkeypatch, reply) as http:
        text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        if text != llm.detokenize(llm.tokenize(text, add_bos=False)):
            pytest.skip("the tiny vocabulary cannot spell the reply")
        reply["ids"] = llm.tokenize(text, add_bos=False)
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            msg, finish = chat(http, {**body, "tool_choice": choice})
            assert finish == "tool_calls" and calls_of(msg) == [("get_weather", {"city": "Paris"})]
            assert not msg.get("content")
        # Qwen3's reasoning first (its template names <think>): the message's reasoning_content
        reply["ids"] = llm.tokenize("<think>\nLet me see.\n</think>\n\n" + text, add_bos=False)
        msg, finish = chat(http, {**body, "tool_choice": "required"})
        assert finish == "tool_calls" and calls_of(msg) == [("get_weather", {"city": "Paris"})]
        assert msg["reasoning_content"].strip() == "Let me see." and not msg.get("content")
        # a prompt that opens <think> (Qwen3-Thinking's template): the reply goes on reasoning, closes it, then calls
        reply["ids"] = llm.tokenize("Let me see.\n</think>\n\n" + text, add_bos=False)
        for choice in ("required", "auto"):
            msg, finish = chat(http, {**body, "tool_choice": choice, "chat_template_kwargs": {"open_think": True}})
            assert finish == "tool_calls" and calls_of(msg) == [("get_weather", {"city": "Paris"})], choice
            assert msg["reasoning_content"].strip() == "Let me see." and not msg.get("content"), choice
        # (and an "auto" reply alike, its reasoning streamed as it comes)
        reply["ids"] = llm.tokenize("<think>\nLet me see.\n</think>\n\nChecking." + text, add_bos=False)
        msg, finish = chat(http, {**body, "tool_choice": "auto"})
        assert finish == "tool_calls" and calls_of(msg) == [("get_weather", {"city": "Paris"})]
        assert msg["reasoning_content"].strip() == "Let me see." and msg["content"] == "Checking."
        two = text + "\n" + '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        reply["ids"] = llm.tokenize(two, add_bos=False)
        msg, finish = chat(http, {**body, "tool_choice": "required", "parallel_tool_calls": True})
        assert finish == "tool_calls"
        assert calls_of(msg) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
        r = http.post("/v1/responses", json={      # the Responses API passes parallel_tool_calls on
            "input": "Weather in Paris?", "tool_choice": "required", "parallel_tool_calls": True,
            "tools": [{"type": "function", **t["function"]} for t in ONE_TOOL], "temperature": 0})
        assert r.status_code == 200, r.text
        assert [o["name"] for o in r.json()["output"] if o["type"] == "function_call"] == ["get_weather", "add"]
        # the tiny model's own reply after the call's marker: the grammar makes it a call, of the named tool
        reply.update(ids=None, prefix=llm.tokenize("<tool_call>", add_bos=False))
        msg, finish = chat(http, {**body, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
        assert finish == "tool_calls" and calls_of(msg)[0][0] == "get_weather"
        assert calls_of(msg)[0][1]["city"] in ("Paris", "Rome")


@pytest.fixture(scope="module")
def gemma4_llm(request):
    import powerinfer as pi
    m = pi.PowerInfer(str(request.getfixturevalue("gemma4_file")), n_ctx=1024, n_threads=1, verbose=False)
    yield m
    m.close()


@pytest.mark.parametrize("stream", [False, True])
def test_gemma4_required_and_named_end_to_end(gemma4_llm, monkeypatch, stream):
    llm, reply = gemma4_llm, {}
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": ONE_TOOL, "max_tokens": 300,
            "temperature": 0, "stream": stream}
    with run_server(llm, monkeypatch, reply) as http:
        text = "<|channel>thought\nNeed it.<channel|>" + G4W
        reply["ids"] = llm.tokenize(text, add_bos=False, special=True)
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            msg, finish = chat(http, {**body, "tool_choice": choice})
            assert finish == "tool_calls" and calls_of(msg) == [("get_weather", {"city": "Paris"})]
            assert msg["reasoning_content"] == "Need it." and not msg.get("content")
        reply["ids"] = llm.tokenize(G4W + G4A, add_bos=False, special=True)
        msg, finish = chat(http, {**body, "tool_choice": "required", "parallel_tool_calls": True})
        assert finish == "tool_calls"
        assert calls_of(msg) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2.5})]
        # the tiny model's own reply under the grammar, after <|tool_call>
        reply.update(ids=None, prefix=llm.tokenize("<|tool_call>", add_bos=False, special=True))
        msg, finish = chat(http, {**body, "tool_choice": {"type": "function", "function": {"name": "add"}}})
        assert finish == "tool_calls" and calls_of(msg)[0][0] == "add", msg
        assert set(calls_of(msg)[0][1]) == {"a", "b"} and all(isinstance(v, (int, float))
                                                               for v in calls_of(msg)[0][1].values())
