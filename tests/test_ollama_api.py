"""Ollama's REST API (server/ollama.py) through the official `ollama` client, and raw HTTP where the client hides the
wire: /api/chat's text equal to /v1/chat/completions' for the same messages (streamed pieces adding up, NDJSON by
default), /api/generate equal to /completion's (raw) and to the chat path's (templated), its `context` continuing an
answer, the load pings, options (num_predict, stop, seed, num_ctx), format json / a schema, thinking, forced tool
calls and the tool-call round trip, /api/tags, /api/show, /api/ps and /api/version, /api/embed and /api/embeddings
equal to /v1/embeddings, and Ollama's {"error": ...} for what is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

import powerinfer as pi

ollama = pytest.importorskip("ollama", reason="the Ollama API tests drive the official ollama client")
pytest.importorskip("uvicorn")

KEY = "sk-ollama-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
# tool calls, tool results and enable_thinking reach the prompt (so the translation shows in the text and the counts)
TEMPLATE = ("{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
            "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
            "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
            "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 99},
                                           "b": {"type": "integer", "maximum": 99}},
          "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": SCHEMA}}]
FIXED = 'root ::= "the cat sat on the mat. the end."'           # a reply the grammar writes (then the end of text)
THOUGHT = 'root ::= "<think>" thought "</think>" "\\n\\n" answer\n' \
          'thought ::= "the user " ("asks" | "wants") " a thing"\nanswer ::= "yes." | "no."'
HI = [{"role": "user", "content": "Once upon a time"}]
GREEDY = {"temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def server(tiny_model):
    from powerinfer.server.app import ServerState, create_app
    from test_server import InProcessServer, wait_healthy
    m = pi.PowerInfer(tiny_model("q8_0", seed=3), n_ctx=1024, n_threads=1, verbose=False, chat_template=TEMPLATE)
    srv = InProcessServer(create_app(ServerState(model_path=str(m.model.path), alias="tiny", llm=m, api_keys=[KEY],
                                                 embedding=True)))
    wait_healthy(srv.base)
    yield srv.base
    srv.close()


@pytest.fixture(scope="module")
def plain(tiny_model):
    """A server without --embedding (nor an API key)."""
    from test_server import serve_model
    srv = serve_model(tiny_model("q8_0", seed=3))
    yield srv.base
    srv.close()


def client(base, headers=AUTH):
    return ollama.Client(host=base, headers=headers, timeout=30)


def post(base, path, body, **kw):
    from test_server import post as raw
    return raw(base, path, body, headers=AUTH, **kw)


def ok(r):
    assert r.status_code == 200, r.text
    return r.json()


def ndjson(base, path, body):
    """The lines of a streamed answer (the request's stream as given: Ollama streams by default), and its headers."""
    from test_server import _HTTP
    with _HTTP.stream("POST", base + path, json=body, headers=AUTH) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line], r.headers


def chat_ref(base, **body):
    return ok(post(base, "/v1/chat/completions", body))


def test_chat_equals_openai_chat_and_stream_adds_up(server):
    c = client(server)
    r = c.chat("tiny:latest", messages=HI, options={**GREEDY, "num_predict": 12})
    ref = chat_ref(server, messages=HI, max_tokens=12, **GREEDY)
    assert r.model == "tiny:latest" and r.done and r.message.role == "assistant"
    assert r.message.content == ref["choices"][0]["message"]["content"] and r.message.tool_calls is None
    assert r.done_reason == ref["choices"][0]["finish_reason"] == "length"
    assert (r.prompt_eval_count, r.eval_count) == (ref["usage"]["prompt_tokens"], ref["usage"]["completion_tokens"])
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0 and r.load_duration == 0
    parts = list(c.chat("any-name", messages=HI, options={**GREEDY, "num_predict": 12}, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == r.message.content and parts[-1].message.content == ""
    assert (parts[-1].done_reason, parts[-1].eval_count) == ("length", 12)
    # the wire: NDJSON by default (no "stream" field), every line an object with created_at
    lines, headers = ndjson(server, "/api/chat", {"model": "x", "messages": HI, "options": {**GREEDY,
                                                                                           "num_predict": 12}})
    assert headers["content-type"].startswith("application/x-ndjson")
    assert "".join(x["message"]["content"] for x in lines) == r.message.content
    assert all(x["model"] == "x" and x["created_at"].endswith("Z") for x in lines)
    assert {k for k in lines[-1] if k.endswith(("_count", "_duration"))} == {
        "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"}


def test_chat_system_and_history(server):
    c = client(server)
    msgs = [{"role": "system", "content": "Be brief."}, *HI, {"role": "assistant", "content": "there was a cat."},
            {"role": "user", "content": "And then?"}]
    r = c.chat("tiny", messages=msgs, options={**GREEDY, "num_predict": 8})
    ref = chat_ref(server, messages=msgs, max_tokens=8, **GREEDY)
    assert r.message.content == ref["choices"][0]["message"]["content"]
    assert r.prompt_eval_count == ref["usage"]["prompt_tokens"] > c.chat("tiny", messages=HI, options={
        "num_predict": 1}).prompt_eval_count


def test_generate_equals_completion_and_chat(server):
    c = client(server)
    g = c.generate("tiny", "Once upon a time", raw=True, options={**GREEDY, "num_predict": 8})
    ref = ok(post(server, "/completion", {"prompt": "Once upon a time", "n_predict": 8, **GREEDY}))
    assert g.response == ref["content"] and g.done_reason == "length"
    assert (g.prompt_eval_count, g.eval_count) == (ref["tokens_evaluated"], 8)
    prompt_ids = ok(post(server, "/tokenize", {"content": "Once upon a time", "add_special": True}))["tokens"]
    assert list(g.context[:len(prompt_ids)]) == prompt_ids and len(g.context) == len(prompt_ids) + 8
    # not raw: the chat template's [system, user prompt], as the chat path renders it
    for system in ("", "Be brief."):
        g = c.generate("tiny", "Once upon a time", system=system, options={**GREEDY, "num_predict": 8})
        msgs = ([{"role": "system", "content": system}] if system else []) + HI
        ref = chat_ref(server, messages=msgs, max_tokens=8, **GREEDY)
        assert g.response == ref["choices"][0]["message"]["content"]
        assert g.prompt_eval_count == ref["usage"]["prompt_tokens"]
    parts = list(c.generate("tiny", "Once upon a time", system="Be brief.", options={**GREEDY, "num_predict": 8},
                            stream=True))
    assert "".join(p.response for p in parts) == g.response and parts[-1].done and parts[-1].context == g.context
    assert all(p.context is None for p in parts[:-1])


def test_generate_context_continues(server):
    c = client(server)
    first = c.generate("tiny", "Once upon a time", raw=True, options={**GREEDY, "num_predict": 4})
    then = c.generate("tiny", "", context=first.context, raw=True, options={**GREEDY, "num_predict": 4})
    whole = c.generate("tiny", "Once upon a time", raw=True, options={**GREEDY, "num_predict": 8})
    assert first.response + then.response == whole.response and then.context == whole.context
    assert then.prompt_eval_count == len(first.context)
    # with a prompt: the context, then the prompt's tokens (no BOS between), as /completion takes token prompts
    more = c.generate("tiny", " and so", context=first.context, raw=True, options={**GREEDY, "num_predict": 4})
    ids = first.context + ok(post(server, "/tokenize", {"content": " and so"}))["tokens"]
    ref = ok(post(server, "/completion", {"prompt": ids, "n_predict": 4, **GREEDY}))
    assert more.response == ref["content"] and list(more.context[:len(ids)]) == ids
    # templated: the context, then the next turn
    turn = c.generate("tiny", "Once upon a time", options={**GREEDY, "num_predict": 4})
    nxt = c.generate("tiny", "And then?", context=turn.context, options={**GREEDY, "num_predict": 4})
    text = ok(post(server, "/apply-template", {"messages": [{"role": "user", "content": "And then?"}]}))["prompt"]
    ids = ok(post(server, "/tokenize", {"content": text}))["tokens"]          # the next turn, no BOS
    assert list(nxt.context[:len(turn.context) + len(ids)]) == list(turn.context) + ids
    assert nxt.prompt_eval_count == len(turn.context) + len(ids)


def test_load_pings(server):
    c = client(server)
    g = c.generate("tiny")
    assert (g.response, g.done, g.done_reason, g.context) == ("", True, "load", None)
    r = ok(post(server, "/api/chat", {"model": "tiny", "messages": []}))        # one object, streamed or not
    assert r["done"] and r["done_reason"] == "load" and r["message"] == {"role": "assistant", "content": ""}
    r = ok(post(server, "/api/generate", {"model": "tiny", "keep_alive": 0}))
    assert r["done_reason"] == "load" and r["response"] == ""


def test_options(server):
    c = client(server)
    r = c.generate("tiny", "Hi", raw=True, options={"num_predict": 3})
    assert (r.done_reason, r.eval_count) == ("length", 3)
    fixed = {"grammar": FIXED, "temperature": 0}           # llama.cpp's field, taken in options
    whole = c.generate("tiny", "Hi", options=fixed)
    assert (whole.response, whole.done_reason) == ("the cat sat on the mat. the end.", "stop")
    cut = c.generate("tiny", "Hi", options={**fixed, "stop": ["zebra", "mat"]})
    assert (cut.response, cut.done_reason) == ("the cat sat on the ", "stop")
    m = c.chat("tiny", messages=HI, options={**fixed, "stop": ["mat"]})
    assert (m.message.content, m.done_reason) == ("the cat sat on the ", "stop")
    # seed: a sampled answer repeats with its seed, as /completion's
    hot = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7, "num_predict": 12}
    a, b = (c.generate("tiny", "Hi", raw=True, options=hot).response for _ in range(2))
    ref = ok(post(server, "/completion", {"prompt": "Hi", "n_predict": 12, **{k: v for k, v in hot.items()
                                                                              if k != "num_predict"}}))
    assert a == b == ref["content"]
    assert c.generate("tiny", "Hi", raw=True, options={**hot, "seed": 8}).response != a
    # repeat_penalty and the others reach the sampler: the answer changes
    rp = c.generate("tiny", "Hi", raw=True, options={**GREEDY, "num_predict": 24, "repeat_penalty": 1.5,
                                                     "repeat_last_n": 64})
    ref = ok(post(server, "/completion", {"prompt": "Hi", "n_predict": 24, "repeat_penalty": 1.5, **GREEDY}))
    assert rp.response == ref["content"]
    # num_ctx (above a slot's size too: logged), load-time options and unknown ones: accepted
    for n_ctx in (1024, 32768):
        r = c.generate("tiny", "Hi", raw=True, options={"num_predict": 2, "num_ctx": n_ctx, "num_gpu": 99,
                                                        "num_thread": 8, "use_mmap": True, "penalize_newline": True,
                                                        "some_future_option": 1})
        assert r.eval_count == 2


def test_format_json_and_schema(server):
    import jsonschema
    c = client(server)
    # "json": any object (the tiny model's would go on for ever: a bias toward "}" ends it; llama.cpp's logit_bias)
    for fmt, bias in (("json", [["}", 10]]), (SCHEMA, None)):
        opts = {**GREEDY, "num_predict": 300, **({"logit_bias": bias} if bias else {})}
        r = c.chat("tiny", messages=[{"role": "user", "content": "Give a and b."}], format=fmt, options=opts)
        assert r.done_reason == "stop", r
        value = json.loads(r.message.content)
        assert isinstance(value, dict)
        if fmt is SCHEMA:
            jsonschema.validate(value, SCHEMA)
        g = c.generate("tiny", "Give a and b.", format=fmt, options=opts)
        assert g.done_reason == "stop" and isinstance(json.loads(g.response), dict)
        cut = c.chat("tiny", messages=[{"role": "user", "content": "Give a and b."}], format=fmt,
                     options={**GREEDY, "num_predict": 6})              # cut off: still a JSON object's start
        assert cut.done_reason == "length" and cut.message.content.startswith("{")
    ref = chat_ref(server, messages=[{"role": "user", "content": "Give a and b."}], max_tokens=300, **GREEDY,
                   response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}})
    assert r.message.content == ref["choices"][0]["message"]["content"]


def test_thinking(server):
    c = client(server)
    q = [{"role": "user", "content": "Hi"}]
    r = c.chat("tiny", messages=q, options={"temperature": 0, "grammar": THOUGHT})
    assert r.message.thinking in ("the user asks a thing", "the user wants a thing")
    assert r.message.content in ("yes.", "no.")
    parts = list(c.chat("tiny", messages=q, options={"temperature": 0, "grammar": THOUGHT}, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    assert "".join(p.message.content for p in parts) == r.message.content
    g = c.generate("tiny", "Hi", options={"temperature": 0, "grammar": THOUGHT})
    assert (g.thinking, g.response) == (r.message.thinking, r.message.content)
    parts = list(c.generate("tiny", "Hi", options={"temperature": 0, "grammar": THOUGHT}, stream=True))
    assert "".join(p.thinking or "" for p in parts) == g.thinking and "".join(p.response for p in parts) == g.response
    # what the splitter holds back (the start of a tag) comes out at the end
    for stream in (False, True):
        out = c.generate("tiny", "Hi", options={"grammar": 'root ::= "<thi"'}, stream=stream)
        assert "".join(p.response for p in (out if stream else [out])) == "<thi"
    # think: the template's enable_thinking (here "/no_think" when off); a thought back is taken
    on, off, default = (c.chat("tiny", messages=q, think=t, options={"num_predict": 1}).prompt_eval_count
                        for t in (True, False, None))
    assert off > on == default
    assert c.generate("tiny", "Hi", think=False, options={"num_predict": 1}).prompt_eval_count == off
    assert c.chat("tiny", messages=q, think="high", options={"num_predict": 1}).prompt_eval_count == on
    back = q + [{"role": "assistant", "content": "yes.", "thinking": "hmm"}, {"role": "user", "content": "and?"}]
    r = c.chat("tiny", messages=back, options={"num_predict": 2})
    twin = q + [{"role": "assistant", "content": "yes.", "reasoning_content": "hmm"},
                {"role": "user", "content": "and?"}]
    assert r.eval_count == 2 and r.prompt_eval_count == chat_ref(server, messages=twin, max_tokens=1)["usage"][
        "prompt_tokens"] > c.chat("tiny", messages=back[:1] + [{"role": "assistant", "content": "yes."}] + back[2:],
                                  options={"num_predict": 1}).prompt_eval_count


def test_forced_tool_calls_and_round_trip(server):
    c = client(server)
    q = [{"role": "user", "content": "1 + 2?"}]
    # Ollama has no tool_choice: llama.cpp's, passed on, forces a call (the tiny model would never make one)
    body = {"model": "tiny", "messages": q, "tools": TOOLS, "tool_choice": "required", "stream": False,
            "options": {"temperature": 0, "num_predict": 300}}
    r = ok(post(server, "/api/chat", body))
    (call,) = r["message"]["tool_calls"]
    assert call["function"]["name"] == "add" and set(call["function"]["arguments"]) == {"a", "b"}
    assert r["message"]["content"] == "" and r["done_reason"] == "stop"
    ref = chat_ref(server, messages=q, tools=TOOLS, tool_choice="required", max_tokens=300, temperature=0)
    assert json.loads(ref["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == \
        call["function"]["arguments"]
    lines, _ = ndjson(server, "/api/chat", {**body, "stream": True})
    with_calls = [x for x in lines if x["message"].get("tool_calls")]
    assert len(with_calls) == 1 and not with_calls[0]["done"] and lines[-1]["done"]
    assert with_calls[0]["message"]["tool_calls"] == [call]
    # the client parses them
    parsed = ollama.ChatResponse(**r)
    assert parsed.message.tool_calls[0].function.arguments == call["function"]["arguments"]
    # tools without tool_choice: "auto" (the tiny model answers in text)
    auto = c.chat("tiny", messages=q, tools=TOOLS, options={**GREEDY, "num_predict": 4})
    assert auto.message.tool_calls is None and auto.eval_count == 4
    # the round trip: the call back (arguments an object, no id) and its result (tool_name) = the chat twin, where the
    # call has the id the route gives it (9 letters and digits) and the result that id
    back = q + [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "3", "tool_name": "add"}, {"role": "user", "content": "So?"}]
    m = c.chat("tiny", messages=back, options={**GREEDY, "num_predict": 8})
    cid = "c0001" + "0000"
    twin = q + [{"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {
                "name": "add", "arguments": json.dumps(call["function"]["arguments"])}}]},
                {"role": "tool", "tool_call_id": cid, "name": "add", "content": "3"},
                {"role": "user", "content": "So?"}]
    ref = chat_ref(server, messages=twin, max_tokens=8, **GREEDY)
    assert m.message.content == ref["choices"][0]["message"]["content"]
    assert m.prompt_eval_count == ref["usage"]["prompt_tokens"]
    from test_server import get
    slots = get(server, "/slots", headers=AUTH).json()
    assert any(f"tool\n3 ({cid})" in s["prompt"] and '"arguments"' in s["prompt"] for s in slots)
    # two calls, their results in another order: each result gets the id of its tool's call (the first unanswered one
    # of that name; one without a name: the first unanswered)
    mul = {"function": {"name": "mul", "arguments": {"a": 2, "b": 3}}}
    back = q + [{"role": "assistant", "content": "", "tool_calls": [call, mul, call]},
                {"role": "tool", "content": "six", "tool_name": "mul"},
                {"role": "tool", "content": "three", "tool_name": "add"},
                {"role": "tool", "content": "again"}, {"role": "tool", "content": "more"}]
    c.chat("tiny", messages=back, options={"num_predict": 1})
    (prompt,) = [s["prompt"] for s in get(server, "/slots", headers=AUTH).json() if "six" in s["prompt"]]
    assert "six (c00010001)" in prompt and "three (c00010000)" in prompt and "again (c00010002)" in prompt
    assert "tool\nmore<|im_end|>" in prompt


def test_tags_show_ps_version(server):
    c = client(server)
    (model,) = c.list().models
    assert model.model == "tiny" and model.size > 0 and len(model.digest) == 64 and model.modified_at is not None
    d = model.details
    assert (d.format, d.family, d.families, d.quantization_level) == ("gguf", "llama", ["llama"], "Q8_0")
    assert d.parameter_size.endswith("K")
    raw = ok(post(server, "/api/show", {"model": "tiny"}))
    tags = pytest.importorskip("httpx").get(server + "/api/tags", headers=AUTH).json()
    assert tags["models"][0]["name"] == "tiny" and tags["models"][0]["details"] == raw["details"]
    s = c.show("tiny")
    assert s.template == TEMPLATE and s.details == d
    assert s.capabilities == ["completion", "thinking", "embedding"]      # enable_thinking; no tools, no FIM tokens
    info = s.modelinfo
    assert info["general.architecture"] == "llama" and info["llama.context_length"] == 512
    assert info["llama.embedding_length"] == 64 and info["general.parameter_count"] > 0
    assert info["tokenizer.ggml.tokens"] == [] and "tokenizer.chat_template" not in info
    verbose = ok(post(server, "/api/show", {"model": "tiny", "verbose": True}))
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 320
    assert "num_ctx" in s.parameters and "1024" in s.parameters and '"<|im_end|>"' in s.parameters
    assert "FROM " in s.modelfile
    (p,) = c.ps().models
    assert (p.model, p.name, p.context_length, p.size_vram) == ("tiny", "tiny", 1024, 0) and p.details == d
    assert p.expires_at.year > 2100
    v = pytest.importorskip("httpx").get(server + "/api/version", headers=AUTH).json()
    assert set(v) == {"version"} and v["version"].count(".") == 2


def test_embed_equals_v1_embeddings(server):
    c = client(server)
    texts = ["hello world", "the cat sat"]
    e = c.embed("tiny", texts)
    ref = ok(post(server, "/v1/embeddings", {"input": texts}))
    assert e.model == "tiny" and [list(v) for v in e.embeddings] == [d["embedding"] for d in ref["data"]]
    assert e.prompt_eval_count == ref["usage"]["prompt_tokens"]
    one = c.embed("tiny", "hello world")
    assert [list(v) for v in one.embeddings] == [ref["data"][0]["embedding"]]
    assert list(c.embeddings("tiny", "hello world").embedding) == ref["data"][0]["embedding"]
    assert ok(post(server, "/api/embed", {"model": "tiny", "input": []})) == {"model": "tiny", "embeddings": []}
    assert ok(post(server, "/api/embeddings", {"model": "tiny", "prompt": ""})) == {"embedding": []}
    # dimensions: the first n, of unit length again
    short = np.array(c.embed("tiny", "hello world", dimensions=16).embeddings[0])
    full = np.array(ref["data"][0]["embedding"][:16])
    assert short.shape == (16,) and np.allclose(short, full / np.linalg.norm(full), atol=1e-6)
    # truncate (Ollama's default): a long input is cut to the embedding context; without it, refused
    long = "word " * 1500
    t = c.embed("tiny", long)
    assert t.prompt_eval_count == 1024 and len(t.embeddings[0]) == 64
    with pytest.raises(ollama.ResponseError) as err:
        c.embed("tiny", long, truncate=False)
    assert err.value.status_code == 400 and "embedding context" in err.value.error


def test_without_embedding_and_api_key(server, plain):
    for path, body in (("/api/embed", {"model": "m", "input": "hi"}), ("/api/embeddings", {"model": "m",
                                                                                            "prompt": "hi"})):
        r = post(plain, path, body)
        assert r.status_code == 501 and r.json() == {"error": "This server does not support embeddings. Start it "
                                                              "with `--embeddings`"}
    assert client(plain, headers={}).generate("m", "Hi", raw=True, options={"num_predict": 1}).eval_count == 1
    with pytest.raises(ollama.ResponseError) as e:          # the key check is the app's (OpenAI's error shape)
        client(server, headers={}).list()
    assert e.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as e:
        client(server, headers={"Authorization": "Bearer wrong"}).chat("tiny", messages=HI)
    assert e.value.status_code == 401


@pytest.mark.parametrize("path,body,words", [
    ("/api/chat", {"messages": [{"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}]}, "images"),
    ("/api/generate", {"prompt": "what is this?", "images": ["iVBORw0KGgo="]}, "images"),
    ("/api/generate", {"prompt": "hi", "template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", {"prompt": "hi", "raw": True, "system": "Be brief."}, "system"),
    ("/api/generate", {"prompt": "hi", "suffix": " end", "context": [1, 2]}, "context"),
    ("/api/generate", {"prompt": "hi", "context": [1, "x"]}, "context"),
    ("/api/generate", {"prompt": "hi", "format": "yaml"}, "format"),
    ("/api/generate", {"prompt": "hi", "options": {"tfs_z": 0.5}}, "tfs_z"),
    ("/api/generate", {"prompt": "hi", "options": "hot"}, "options"),
    ("/api/generate", {"prompt": "word " * 1500}, "context"),
    ("/api/generate", {"prompt": "hi", "logprobs": True}, "logprobs"),
    ("/api/chat", {"messages": [{"role": "bot", "content": "x"}]}, "role"),
    ("/api/chat", {"messages": HI, "think": "lots"}, "think"),
    ("/api/chat", {"messages": HI, "options": {"num_predict": 0}}, "num_predict"),
    ("/api/chat", {"messages": HI, "options": {"temperature": "hot"}}, "temperature"),
    ("/api/chat", {"messages": HI, "tools": TOOLS, "format": "json"}, "tools"),
    ("/api/chat", {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"name": "add"}]}]},
     "tool_calls"),
    ("/api/chat", {"messages": "hi"}, "messages"),
    ("/api/show", {"model": 3}, "model"),
])
def test_errors_have_ollamas_shape(server, path, body, words):
    r = post(server, path, {"model": "tiny", **body})
    assert r.status_code == 400, r.text
    err = r.json()
    assert set(err) == {"error"} and isinstance(err["error"], str) and words in err["error"], err


def test_client_errors_and_unserved_routes(server):
    c = client(server)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat("tiny", messages=[{"role": "user", "content": "what is this?", "images": [b"\x89PNG"]}])
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:              # streamed: refused before the stream starts
        list(c.generate("tiny", "word " * 1500, stream=True))
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:              # no FIM tokens in the tiny model
        c.generate("tiny", "def f(", suffix="    return x")
    assert e.value.status_code == 501 and "fill-in-the-middle" in e.value.error
    for call in (lambda: c.pull("tiny"), lambda: c.delete("tiny"), lambda: c.copy("tiny", "other")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code in (404, 405)
