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
