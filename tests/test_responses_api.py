"""POST /v1/responses (server/responses.py): OpenAI's Responses API through the official `openai` client, over the
chat path: text, the streamed events adding up to the same text, instructions and item inputs, JSON schema output,
a function call (tool_choice required) and its round trip, cut-off replies, and what is not served."""
from __future__ import annotations

import json

import pytest

import powerinfer as pi

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")
TOOLS = [{"type": "function", "name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "maximum": 99}, "b": {"type": "integer", "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}]


@pytest.fixture(scope="module")
def server(tiny_model):
    from powerinfer.server.app import ServerState, create_app
    from test_server import InProcessServer, wait_healthy
    m = pi.PowerInfer(tiny_model("q8_0", seed=3), n_ctx=1024, n_threads=1, verbose=False,
                      chat_template=TEMPLATE)
    srv = InProcessServer(create_app(ServerState(model_path="tiny", llm=m)))
    wait_healthy(srv.base)
    yield srv.base
    srv.close()


def test_text_and_stream_agree(server):
    from test_server import client
    c = client(server)
    r = c.responses.create(model="any", input="Once upon a time", max_output_tokens=12, temperature=0,
                           instructions="Be brief.")
    assert r.object == "response" and r.output[0].type == "message" and r.output_text
    assert r.usage.output_tokens == 12 and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    events = list(c.responses.create(model="any", input="Once upon a time", max_output_tokens=12, temperature=0,
                                     instructions="Be brief.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text == events[-1].response.output_text


def test_items_schema_and_function_calls(server):
    from test_server import client
    c = client(server)
    items = [{"role": "developer", "content": "You add numbers."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "1 + 2?"}]}]
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
              "additionalProperties": False}
    r = c.responses.create(model="any", input=items, max_output_tokens=60, temperature=0,
                           text={"format": {"type": "json_schema", "name": "x", "schema": schema}})
    assert set(json.loads(r.output_text)) == {"x"}
    r = c.responses.create(model="any", input=items, tools=TOOLS, tool_choice="required", max_output_tokens=300,
                           temperature=0)
    call = [o for o in r.output if o.type == "function_call"][0]
    args = json.loads(call.arguments)
    assert call.name == "add" and set(args) == {"a", "b"} and call.call_id.startswith("call_")
    back = items + [{"type": "function_call", "call_id": call.call_id, "name": "add", "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id, "output": "3"}]
    r2 = c.responses.create(model="any", input=back, max_output_tokens=6, temperature=0)
    assert r2.output_text
    events = list(c.responses.create(model="any", input=items, tools=TOOLS, tool_choice="required",
                                     max_output_tokens=300, temperature=0, stream=True))
    done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert done and json.loads(done[0].item.arguments) == args


@pytest.mark.parametrize("body,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"text": {"format": {"type": "yaml"}}}, "text"),
])
def test_refusals(server, body, param):
    from test_server import post
    r = post(server, "/v1/responses", {"model": "any", "input": "hi", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_chat_and_completions_n_choices(server):
    """OpenAI's n: n choices side by side, each its own seed (seed + i), streamed with their indices."""
    from test_server import client, post
    c = client(server)
    msgs = [{"role": "user", "content": "Once upon a time"}]
    r = c.chat.completions.create(model="any", messages=msgs, n=3, seed=5, max_tokens=10, temperature=1.0)
    texts = [ch.message.content for ch in sorted(r.choices, key=lambda ch: ch.index)]
    assert [ch.index for ch in r.choices] == [0, 1, 2] and len(set(texts)) > 1
    one = c.chat.completions.create(model="any", messages=msgs, seed=6, max_tokens=10, temperature=1.0)
    assert one.choices[0].message.content == texts[1]                 # choice i is the request with seed + i
    assert r.usage.completion_tokens == 30 and r.usage.prompt_tokens == one.usage.prompt_tokens
    parts = {}
    for chunk in c.chat.completions.create(model="any", messages=msgs, n=3, seed=5, max_tokens=10, temperature=1.0,
                                           stream=True, stream_options={"include_usage": True}):
        for ch in chunk.choices:
            parts[ch.index] = parts.get(ch.index, "") + (ch.delta.content or "")
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == 30
    assert [parts[i] for i in range(3)] == texts
    t = c.completions.create(model="any", prompt="Once", n=2, seed=1, max_tokens=6, temperature=1.0)
    assert sorted(ch.index for ch in t.choices) == [0, 1]
    bad = post(server, "/v1/chat/completions", {"messages": msgs, "n": 17})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n"
    assert post(server, "/v1/responses", {"input": "hi", "n": 2}).status_code == 400


def test_n_cmpl(server):
    from test_server import post
    r = post(server, "/v1/completions", {"prompt": "x", "n_cmpl": 2, "max_tokens": 3, "seed": 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    bad = post(server, "/completion", {"prompt": "x", "n_cmpl": 2, "n_predict": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_cmpl"


def test_completions_with_a_list_of_prompts(server):
    """OpenAI's /v1/completions prompt as a list (strings or token-id lists; lm-evaluation-harness batches so): one
    choice per prompt (n each, in order), each the text of that prompt alone; echo + logprobs per prompt; usage counts
    every prompt once."""
    from test_server import client, post
    c = client(server)
    prompts = ["Once upon a time", "The cat", "In the morning"]
    alone = [c.completions.create(model="any", prompt=p, max_tokens=6, temperature=0) for p in prompts]
    r = c.completions.create(model="any", prompt=prompts, max_tokens=6, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [a.choices[0].text for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    r2 = c.completions.create(model="any", prompt=prompts[:2], n=2, seed=3, max_tokens=6, temperature=1.0)
    assert [ch.index for ch in r2.choices] == [0, 1, 2, 3]
    second = c.completions.create(model="any", prompt=prompts[1], n=2, seed=3, max_tokens=6, temperature=1.0)
    assert [ch.text for ch in r2.choices[2:]] == [ch.text for ch in second.choices]
    ids = [post(server, "/tokenize", {"content": p}).json()["tokens"] for p in prompts[:2]]
    lp = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1,
                                          "temperature": 0}).json()
    assert [len(ch["logprobs"]["tokens"]) for ch in lp["choices"]] == [len(t) + 1 for t in ids]
    parts = {}
    for chunk in c.completions.create(model="any", prompt=prompts, max_tokens=6, temperature=0, stream=True):
        for ch in chunk.choices:
            parts[ch.index] = parts.get(ch.index, "") + ch.text
    assert [parts[i] for i in range(3)] == [a.choices[0].text for a in alone]
    bad = post(server, "/v1/completions", {"prompt": ["x"] * 300, "max_tokens": 1})
    assert bad.status_code == 400 and "at most 256 prompts" in bad.json()["error"]["message"]


def test_native_completion_with_a_list_of_prompts(server):
    """llama.cpp's /completion with an array of prompts: an array of results in order, each with its index and the
    content of that prompt alone; streamed, each prompt's chunks carry its index and end with its final chunk."""
    from test_server import post
    prompts = ["Once upon a time", [1, 5, 9, 12]]
    body = {"n_predict": 6, "temperature": 0}
    alone = [post(server, "/completion", {**body, "prompt": p}).json() for p in prompts]
    r = post(server, "/completion", {**body, "prompt": prompts})
    assert r.status_code == 200 and [x["index"] for x in r.json()] == [0, 1]
    assert [x["content"] for x in r.json()] == [a["content"] for a in alone]
    assert [x["tokens_evaluated"] for x in r.json()] == [a["tokens_evaluated"] for a in alone]
    import json

    import httpx
    with httpx.stream("POST", server + "/completion", json={**body, "prompt": prompts, "stream": True},
                      timeout=60) as resp:
        assert resp.status_code == 200
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    for i, a in enumerate(alone):
        mine = [c for c in chunks if c["index"] == i]
        assert "".join(c["content"] for c in mine) == a["content"]
        assert mine[-1]["stop"] and sum(c["stop"] for c in mine) == 1
        assert mine[-1]["tokens_predicted"] == a["tokens_predicted"]
