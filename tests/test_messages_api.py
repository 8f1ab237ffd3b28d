"""POST /v1/messages and /v1/messages/count_tokens (server/messages.py): Anthropic's Messages API through the
official `anthropic` client, over the chat path: text equal to /v1/chat/completions' for the same messages, system
prompts, stop_sequences and max_tokens, the streamed events (their order, their deltas adding up to the message),
thinking blocks, forced tool calls and the tool_use / tool_result round trip, count_tokens, x-api-key, and Anthropic's
error shape for what is refused."""
from __future__ import annotations

import json

import pytest

import powerinfer as pi

anthropic = pytest.importorskip("anthropic", reason="the Messages API tests drive the official anthropic client")
pytest.importorskip("uvicorn")

KEY = "sk-ant-test"
# tool calls, tool results and enable_thinking reach the prompt (so the translation shows in the text and the counts)
TEMPLATE = ("{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
            "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
            "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 99},
                                           "b": {"type": "integer", "maximum": 99}},
          "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"name": "add", "description": "a + b", "input_schema": SCHEMA}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": SCHEMA}}]
FIXED = 'root ::= "the cat sat on the mat. the end."'           # a reply the grammar writes (then the end of text)
THOUGHT = 'root ::= "<think>" thought "</think>" "\\n\\n" answer\n' \
          'thought ::= "the user " ("asks" | "wants") " a thing"\nanswer ::= "yes." | "no."'
HI = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def server(tiny_model):
    from powerinfer.server.app import ServerState, create_app
    from test_server import InProcessServer, wait_healthy
    m = pi.PowerInfer(tiny_model("q8_0", seed=3), n_ctx=1024, n_threads=1, verbose=False, chat_template=TEMPLATE)
    srv = InProcessServer(create_app(ServerState(model_path="tiny", llm=m, api_keys=[KEY])))
    wait_healthy(srv.base)
    yield srv.base
    srv.close()


def client(base, key=KEY, **kw):
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=30, **kw)


def post(base, path, body, key=KEY, **kw):
    from test_server import post as raw
    return raw(base, path, body, headers={"x-api-key": key, "anthropic-version": "2023-06-01"}, **kw)


def chat(base, **body):
    from test_server import post as raw
    r = raw(base, "/v1/chat/completions", body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    return r.json()


_EXTRA = ("temperature", "top_p", "top_k", "seed", "grammar")     # not (or no more) the SDK's own arguments


def create(c, how="create", **kw):
    """c.messages.create / .stream / .count_tokens, with llama.cpp's fields and the sampling ones in extra_body."""
    kw.setdefault("model", "claude-any")
    extra = {**kw.pop("extra_body", {}), **{k: kw.pop(k) for k in _EXTRA if k in kw}}
    return getattr(c.messages, how)(**kw, extra_body=extra)


def kinds(events):
    return [e.type for e in events]


def streamed_text(events, delta="text_delta"):
    return "".join(getattr(e.delta, "text" if delta == "text_delta" else "thinking") for e in events
                   if e.type == "content_block_delta" and e.delta.type == delta)


def test_text_equals_chat_and_stream_adds_up(server):
    c = client(server)
    m = create(c, max_tokens=12, messages=HI, temperature=0, seed=1)
    ref = chat(server, messages=HI, max_tokens=12, temperature=0, seed=1)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == "tiny"
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == ref["choices"][0]["message"]["content"]
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[ref["choices"][0]["finish_reason"]]
    assert m.stop_sequence is None
    assert (m.usage.input_tokens, m.usage.output_tokens) == (ref["usage"]["prompt_tokens"],
                                                             ref["usage"]["completion_tokens"])
    events = list(create(c, max_tokens=12, messages=HI, temperature=0, stream=True,
                                    seed=1))
    k = kinds(events)
    assert k[0] == "message_start" and k[-2:] == ["message_delta", "message_stop"]
    assert k[1:3] == ["content_block_start", "content_block_delta"]        # (the SDK drops the ping)
    assert k[-3] == "content_block_stop" and k.count("content_block_start") == k.count("content_block_stop") == 1
    assert set(k[2:-3]) == {"content_block_delta"}
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and start.usage.input_tokens == m.usage.input_tokens
    assert events[1].index == 0 and events[1].content_block.type == "text" and events[1].content_block.text == ""
    assert streamed_text(events) == m.content[0].text
    assert events[-2].delta.stop_reason == m.stop_reason and events[-2].usage.output_tokens == m.usage.output_tokens
    from test_server import _HTTP      # the wire: `event: <type>` lines, each naming its data's type; a ping
    with _HTTP.stream("POST", server + "/v1/messages", json={"max_tokens": 12, "messages": HI, "temperature": 0,
                                                             "seed": 1, "stream": True},
                      headers={"x-api-key": KEY}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = [f for f in r.read().decode().split("\n\n") if f]
    wire = [(f.split("\n")[0], json.loads(f.split("\n")[1].removeprefix("data: "))) for f in frames]
    assert all(line == "event: " + data["type"] for line, data in wire)
    assert [d["type"] for _, d in wire] == ["message_start", "ping"] + k[1:]
    with create(c, "stream", max_tokens=12, messages=HI, temperature=0, seed=1) as s:
        final = s.get_final_message()              # the SDK's own accumulation of the events
    assert final.content[0].text == m.content[0].text and final.stop_reason == m.stop_reason


def test_system_prompt(server):
    c = client(server)
    ref = chat(server, messages=[{"role": "system", "content": "Be brief."}] + HI, max_tokens=8, temperature=0)
    for system in ("Be brief.", [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]):
        m = create(c, max_tokens=8, system=system, messages=HI, temperature=0)
        assert m.content[0].text == ref["choices"][0]["message"]["content"]
        assert m.usage.input_tokens == ref["usage"]["prompt_tokens"]
    plain = create(c, max_tokens=8, messages=HI, temperature=0)
    assert plain.usage.input_tokens < ref["usage"]["prompt_tokens"]
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Once upon "}, {"type": "text", "text": "a time"}]}]
    split = create(c, max_tokens=8, messages=blocks, temperature=0)
    assert (split.content, split.usage) == (plain.content, plain.usage)


def test_stop_sequences_and_max_tokens(server):
    c = client(server)
    whole = create(c, max_tokens=60, messages=HI, grammar=FIXED)
    assert whole.content[0].text == "the cat sat on the mat. the end." and whole.stop_reason == "end_turn"
    m = create(c, max_tokens=60, messages=HI, stop_sequences=["zebra", "mat"],
                          grammar=FIXED)
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == ("the cat sat on the ", "stop_sequence", "mat")
    events = list(create(c, max_tokens=60, messages=HI, stop_sequences=["mat"], stream=True,
                                    grammar=FIXED))
    assert streamed_text(events) == "the cat sat on the "
    assert (events[-2].delta.stop_reason, events[-2].delta.stop_sequence) == ("stop_sequence", "mat")
    cut = create(c, max_tokens=3, messages=HI, grammar=FIXED)
    assert cut.stop_reason == "max_tokens" and cut.stop_sequence is None and cut.usage.output_tokens == 3
    assert "the cat sat on the mat. the end.".startswith(cut.content[0].text)


def test_thinking_blocks(server):
    c = client(server)
    m = create(c, max_tokens=60, messages=[{"role": "user", "content": "Hi"}], temperature=0,
                          grammar=THOUGHT)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking in ("the user asks a thing", "the user wants a thing")
    assert m.content[0].signature == "" and m.content[1].text in ("yes.", "no.")
    events = list(create(c, max_tokens=60, messages=[{"role": "user", "content": "Hi"}],
                                    temperature=0, stream=True, grammar=THOUGHT))
    starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    assert starts == [(0, "thinking"), (1, "text")]
    assert streamed_text(events, "thinking_delta") == m.content[0].thinking
    assert streamed_text(events) == m.content[1].text
    k = kinds(events)     # the thinking block closes (signature, stop) before the text block opens
    first_stop = k.index("content_block_stop")
    assert events[first_stop - 1].delta.type == "signature_delta" and k[first_stop + 1] == "content_block_start"
    # thinking on / off: the template's enable_thinking (here "/no_think" when off); a thought back is taken
    on, off = (create(c, "count_tokens", messages=HI, thinking=t).input_tokens
               for t in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}))
    assert off > on == create(c, "count_tokens", messages=HI).input_tokens
    back = HI + [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                                   {"type": "text", "text": "yes."}]},
                 {"role": "user", "content": "and?"}]
    assert create(c, max_tokens=2, messages=back, temperature=0).usage.output_tokens == 2


def test_forced_tool_calls_and_round_trip(server):
    c = client(server)
    q = [{"role": "user", "content": "1 + 2?"}]
    uses = []
    for choice in ({"type": "any"}, {"type": "tool", "name": "add"}):
        m = create(c, max_tokens=300, messages=q, tools=TOOLS, tool_choice=choice, temperature=0)
        assert m.stop_reason == "tool_use" and m.content[-1].type == "tool_use", m
        use = m.content[-1]
        assert use.name == "add" and set(use.input) == {"a", "b"} and use.id.startswith("toolu_")
        uses.append(use)
    ref = chat(server, messages=q, tools=CHAT_TOOLS, tool_choice="required", max_tokens=300, temperature=0)
    assert json.loads(ref["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == uses[0].input
    events = list(create(c, max_tokens=300, messages=q, tools=TOOLS, tool_choice={"type": "any"},
                                    temperature=0, stream=True))
    block = [e for e in events if e.type == "content_block_start"][-1]
    assert block.content_block.type == "tool_use" and block.content_block.name == "add"
    assert json.loads("".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                              and e.delta.type == "input_json_delta")) == uses[0].input
    assert events[-2].delta.stop_reason == "tool_use"
    with create(c, "stream", max_tokens=300, messages=q, tools=TOOLS, tool_choice={"type": "any"},
                           temperature=0) as s:
        assert s.get_final_message().content[-1].input == uses[0].input
    # the round trip: tool_use back in an assistant turn, its tool_result in a user turn = the chat twin
    use = uses[0]
    back = q + [{"role": "assistant", "content": [{"type": "text", "text": "Adding."}, use.model_dump()]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": [{"type": "text", "text": "3"}]},
                                             {"type": "text", "text": "So?"}]}]
    m = create(c, max_tokens=8, messages=back, tools=TOOLS, temperature=0,
                          tool_choice={"type": "none"})
    twin = q + [{"role": "assistant", "content": "Adding.", "tool_calls": [{
                "id": use.id, "type": "function", "function": {"name": "add", "arguments": json.dumps(use.input)}}]},
                {"role": "tool", "tool_call_id": use.id, "content": "3"}, {"role": "user", "content": "So?"}]
    ref = chat(server, messages=twin, max_tokens=8, temperature=0)
    assert m.content[0].text == ref["choices"][0]["message"]["content"]
    assert m.usage.input_tokens == ref["usage"]["prompt_tokens"]
    from test_server import get
    (slot,) = get(server, "/slots", headers={"x-api-key": KEY}).json()
    assert f"tool\n3 ({use.id})" in slot["prompt"] and '"arguments"' in slot["prompt"]


def test_count_tokens(server):
    c = client(server)
    n = create(c, "count_tokens", messages=HI, system="Be brief.")
    m = create(c, max_tokens=1, messages=HI, system="Be brief.")
    assert n.input_tokens == m.usage.input_tokens > 0
    with_tools = create(c, "count_tokens", messages=HI, system="Be brief.", tools=TOOLS)
    assert with_tools.input_tokens > n.input_tokens
    r = post(server, "/v1/messages/count_tokens", {"model": "x", "messages": HI, "max_tokens": 5, "stream": True})
    assert r.status_code == 200
    assert r.json() == {"input_tokens": create(c, "count_tokens", messages=HI).input_tokens}
    long = [{"role": "user", "content": "word " * 600}]        # more than the slot holds: counted, not run
    assert create(c, "count_tokens", messages=long).input_tokens > 1024
    with pytest.raises(anthropic.BadRequestError, match="context"):
        create(c, max_tokens=1, messages=long)


def test_api_keys(server):
    from test_server import post as raw
    sdk = client(server)       # api_key: x-api-key (the SDK before 2.x) or Authorization: Bearer
    ok = sdk if "X-Api-Key" in sdk.auth_headers else client(server, key=None, default_headers={"x-api-key": KEY})
    for c in (sdk, ok):
        assert create(c, max_tokens=1, messages=HI, temperature=0).usage.output_tokens == 1
    r = raw(server, "/v1/messages", {"max_tokens": 1, "messages": HI}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    with pytest.raises(anthropic.AuthenticationError) as e:
        create(client(server, key="wrong"), max_tokens=1, messages=HI)
    assert e.value.body["error"]["type"] == "authentication_error"
    for headers in ({}, {"x-api-key": "wrong"}):
        r = raw(server, "/v1/messages", {"max_tokens": 1, "messages": HI}, headers=headers)
        assert r.status_code == 401 and r.json()["type"] == "error" and \
            r.json()["error"]["type"] == "authentication_error", r.text
    r = raw(server, "/v1/chat/completions", {"max_tokens": 1, "messages": HI}, headers={"x-api-key": KEY})
    assert r.status_code == 200                                                  # x-api-key is taken everywhere
    r = raw(server, "/v1/chat/completions", {"max_tokens": 1, "messages": HI}, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"     # OpenAI's shape there


@pytest.mark.parametrize("body,words", [
    ({"messages": HI}, "max_tokens"),
    ({"max_tokens": 5}, "messages"),
    ({"max_tokens": 0, "messages": HI}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "--mmproj"),     # image blocks need a projector (tests/test_vision_server.py serves them)
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]}, "'document'"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "hi"}]}, "role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "add",
                                                                  "input": {}}]}]}, "tool_use"),
    ({"max_tokens": 5, "messages": HI + [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                            "content": "3"}]}]}, "tool_result"),
    ({"max_tokens": 5, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({"max_tokens": 5, "messages": HI, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "mul"}}, "mul"),
    ({"max_tokens": 5, "messages": HI, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": 5, "messages": HI, "thinking": {"type": "lots"}}, "thinking"),
    ({"max_tokens": 5, "messages": HI, "stop_sequences": [1]}, "stop_sequences"),
])
def test_errors_have_anthropics_shape(server, body, words):
    r = post(server, "/v1/messages", {"model": "x", **body})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert words in err["error"]["message"], err


def test_sdk_errors_and_accepted_fields(server):
    c = client(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        create(c, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": e.value.body[
        "error"]["message"]}} and "image" in e.value.message
    r = post(server, "/v1/messages/count_tokens", {"messages": [{"role": "bot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # metadata, disable_parallel_tool_use and fields we do not know are taken (and ignored)
    m = create(c, max_tokens=2, messages=HI, metadata={"user_id": "u1"}, top_k=5, top_p=0.9,
                          extra_body={"service_tier": "auto", "some_future_field": {"x": 1}})
    assert m.usage.output_tokens == 2 or m.stop_reason == "end_turn"      # sampled: the end of text may come first
    m = create(c, max_tokens=300, messages=HI, tools=TOOLS, temperature=0,
                          tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert [b.type for b in m.content] == ["tool_use"]
