"""POST /v1/responses (and /responses): OpenAI's Responses API over the chat completion path.

A request is translated into a /v1/chat/completions body: `instructions` -> a system message first; `input` (a string,
or items: messages {role, content: text or input_text / output_text parts}, earlier `function_call` items and their
`function_call_output`s) -> messages; `max_output_tokens` -> max_tokens; `text.format` (text, json_object,
json_schema) -> response_format; function `tools` and `tool_choice` -> the chat forms; `parallel_tool_calls` and the
sampling fields as they are. The reply becomes `output` items: a `reasoning` item for a <think> part, a `message` with
one `output_text`, a `function_call` per call; `status` "incomplete" with incomplete_details {reason:
max_output_tokens} when cut off. Streaming sends the Responses events (response.created, output_item.added,
content_part.added, output_text.delta ..., output_text.done, content_part.done, output_item.done,
function_call_arguments.delta/.done, response.completed), each as `event: <type>` + `data: <json>`.

Not served (400 naming the field): previous_response_id / conversation (nothing is stored: `store` is answered
false), background mode, input items other than text messages and function calls (images, files).
"""
from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Route

from ..request import RequestError, Result
from .protocol import JSON, chat_deltas, field, read_json, sse_event, text_of

if TYPE_CHECKING:
    from .app import ServerState

_UNSERVED = {"previous_response_id": "nothing is stored", "conversation": "nothing is stored",
             "background": "no background mode", "prompt": "no stored prompts"}


def chat_body(body: dict) -> dict:
    """The /v1/chat/completions body of a Responses request (RequestError for what is not served)."""
    if body.get("n") not in (None, 1):
        raise RequestError("'n' is not a Responses API parameter (one output per request)", param="n")
    for name, why in _UNSERVED.items():
        if body.get(name) not in (None, False):
            raise RequestError(f"'{name}' is not supported: {why}", param=name, code="not_supported")
    messages = []
    instructions = field(body, "instructions", "str", None)
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = field(body, "input", "any")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError("'input' must be a string or a list of items", param="input")
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise RequestError(f"input[{i}] must be an object", param="input")
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"input[{i}].role must be user, assistant, system or developer", param="input")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": text_of(it.get("content"), f"input[{i}]", "input")})
        elif kind == "function_call":
            call = {"id": it.get("call_id") or it.get("id") or f"call_{i}", "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = it.get("output")
            messages.append({"role": "tool", "tool_call_id": it.get("call_id"),
                             "content": out if isinstance(out, str) else json.dumps(out)})
        else:
            raise RequestError(f"input[{i}]: items of type {kind!r} are not supported", param="input")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "max_output_tokens", "text", "tools",
                                                       "tool_choice", "store", "include", "metadata", "user",
                                                       "reasoning", "truncation", "n")}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = field(body, "max_output_tokens", "int")
    fmt = (field(body, "text", "dict", {}) or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.get("name", "schema"),
                                                                           "schema": fmt.get("schema", {})}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError("text.format must be text, json_object or json_schema", param="text")
    tools = field(body, "tools", "list", None)
    if tools:
        chat["tools"] = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, dict) else t
                raise RequestError(f"tools[{i}]: only function tools are served (not {kind!r})", param="tools")
            chat["tools"].append({"type": "function", "function": {
                k: t[k] for k in ("name", "description", "parameters") if k in t}})
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    return chat


class _Builder:
    """The Response object of one request, filled from the chat completion's message (or its stream)."""

    def __init__(self, model: str, body: dict):
        self.id = "resp_" + uuid.uuid4().hex
        self.msg_id = "msg_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.body = body

    def response(self, status: str, output: list, res: Result | None) -> dict:
        b = self.body
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
               "incomplete_details": None, "instructions": b.get("instructions"),
               "max_output_tokens": b.get("max_output_tokens"), "model": self.model, "output": output,
               "parallel_tool_calls": True, "previous_response_id": None, "store": False,
               "temperature": b.get("temperature"), "top_p": b.get("top_p"),
               "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools", []),
               "text": b.get("text") or {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {}}
        if res is not None:
            out["usage"] = {"input_tokens": res.n_prompt, "input_tokens_details": {"cached_tokens": res.n_cached},
                            "output_tokens": res.n_predicted, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": res.n_prompt + res.n_predicted}
            if res.finish_reason == "length":
                out["status"], out["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        return out

    def message_item(self, text: str, status: str = "completed") -> dict:
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}

    @staticmethod
    def call_item(call: dict, status: str = "completed") -> dict:
        return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}

    def output(self, message: dict) -> list:
        items = []
        if message.get("reasoning_content"):
            items.append({"type": "reasoning", "id": "rs_" + uuid.uuid4().hex, "summary": [],
                          "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
        if message.get("content"):
            items.append(self.message_item(message["content"]))
        items += [self.call_item(c) for c in message.get("tool_calls") or []]
        return items


def _event(kind: str, seq: int, **data) -> str:
    return sse_event(kind, {"sequence_number": seq, **data})


def routes(state: "ServerState", chat_task) -> list[Route]:
    from .app import EngineStream, _stats, attach, collect

    async def responses(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        task, shaper, stream, _ = await chat_task(llm, chat_body(body))
        build = _Builder(state.model_name, body)
        _stats(request, prompt=len(task.prompt_tokens))
        if not stream:
            res = await collect(request, llm, task, shaper.add)
            _stats(request, predicted=res.n_predicted)
            message = shaper.response(res)["choices"][0]["message"]
            return JSON(build.response("completed", build.output(message), res))

        q = attach(task, state.stats)
        llm.engine.submit(task)

        async def events():
            seq = 0

            def ev(kind, **data):
                nonlocal seq
                seq += 1
                return _event(kind, seq - 1, **data)
            yield ev("response.created", response=build.response("in_progress", [], None))
            yield ev("response.in_progress", response=build.response("in_progress", [], None))
            text, opened, reasoning = "", False, ""
            ids = {"item_id": build.msg_id, "output_index": 0, "content_index": 0}

            def deltas(d):
                nonlocal text, opened, reasoning
                out = []
                reasoning += d.get("reasoning_content") or ""
                piece = d.get("content") or ""
                if piece:
                    if not opened:        # the message: after the reasoning item when the reply had one
                        opened = True
                        ids["output_index"] = 1 if reasoning else 0
                        out.append(ev("response.output_item.added", output_index=ids["output_index"],
                                      item=build.message_item("", "in_progress")))
                        out.append(ev("response.content_part.added", **ids,
                                      part={"type": "output_text", "text": "", "annotations": []}))
                    text += piece
                    out.append(ev("response.output_text.delta", **ids, delta=piece))
                return out
            async for item in chat_deltas(q, shaper):
                if item[0] == "delta":
                    for e in deltas(item[1]):
                        yield e
                elif item[0] == "error":
                    err = item[1]
                    yield ev("error", code=getattr(err, "code", None), message=str(err), param=getattr(err, "param",
                                                                                                         None))
                    return
                else:
                    _, res, calls = item
                    _stats(request, predicted=res.n_predicted)
                    output = build.output({"reasoning_content": reasoning, "content": text, "tool_calls": calls})
                    for at, out_item in enumerate(output):
                        if out_item["type"] == "message":
                            yield ev("response.output_text.done", **ids, text=text)
                            yield ev("response.content_part.done", **ids, part=out_item["content"][0])
                            yield ev("response.output_item.done", output_index=at, item=out_item)
                        elif out_item["type"] == "function_call":
                            yield ev("response.output_item.added", output_index=at,
                                     item=dict(out_item, arguments="", status="in_progress"))
                            yield ev("response.function_call_arguments.delta", item_id=out_item["id"],
                                     output_index=at, delta=out_item["arguments"])
                            yield ev("response.function_call_arguments.done", item_id=out_item["id"],
                                     output_index=at, arguments=out_item["arguments"])
                            yield ev("response.output_item.done", output_index=at, item=out_item)
                    final = build.response("completed", output, res)
                    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
                    yield ev(kind, response=final)
                    return
        return EngineStream(events(), task, llm)

    return [Route("/v1/responses", responses, methods=["POST"]), Route("/responses", responses, methods=["POST"])]
