"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat completion path (as
llama.cpp's llama-server serves it, for Anthropic clients pointed here by their base_url).

A request is translated into a /v1/chat/completions body: `system` (a string or text blocks) -> a system message
first; `messages` (role user or assistant; content a string or blocks: `text`, an assistant's `tool_use` {id, name,
input} and `thinking`, a user's `tool_result` {tool_use_id, content}) -> messages, a tool_use an assistant tool call
and a tool_result a "tool" message; `max_tokens` (required), `stop_sequences` -> stop, `temperature`, `top_p`,
`top_k`, `stream` as they are; `tools` [{name, description, input_schema}] and `tool_choice` {type: auto | any | tool
| none} -> the chat forms; `thinking` {type: enabled | disabled} -> the chat template's enable_thinking (like
--reasoning-budget; budget_tokens is not enforced); `output_config.format` (json_schema) -> response_format. Other
fields pass to the chat path as they are (llama.cpp's extensions: seed, min_p, grammar...; `metadata` is ignored).
The reply becomes a Message: a `thinking` block for a <think> part (signature ""), a `text` block, a `tool_use` block
per call (input: the parsed arguments); stop_reason end_turn, max_tokens, stop_sequence (with the string) or
tool_use; usage {input_tokens: the prompt, output_tokens}. Streaming sends Anthropic's events (message_start, ping,
content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) / content_block_stop per
block, message_delta, message_stop), each as `event: <type>` + `data: <json>`.

count_tokens takes the same body (max_tokens not needed) and answers {"input_tokens": N}: the rendered chat prompt's
tokens, tools included (a prompt too long for a slot too: counted, not run). Errors on these routes are Anthropic's
{"type": "error", "error": {"type", "message"}} with the HTTP status (a 401 of the API key check too). Not served (400
naming them): document blocks (image blocks with base64 sources are served with --mmproj), Anthropic's server tools
(web search, code execution...), `n` other than 1. A trailing assistant message is a finished turn (no prefill); a
tool_result's is_error is dropped.
"""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from ..request import RequestError, Result
from .protocol import JSON, chat_deltas, errors_as, field, read_json, sse_event, text_of

if TYPE_CHECKING:
    from .app import ServerState

PATHS = ("/v1/messages", "/v1/messages/count_tokens")

# Anthropic fields with no bearing here (never passed to the chat path)
_IGNORED = ("metadata", "service_tier", "container", "mcp_servers", "context_management", "inference_geo", "speed",
            "cache_control", "diagnostics", "anthropic_version")
_TRANSLATED = ("messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice", "thinking",
               "output_config", "output_format")
_UNSERVED_BLOCKS = {"document": "no documents here", "search_result": "text only",
                    "container_upload": "no files here"}

# HTTP status -> Anthropic's error type
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    """Anthropic's error object for an HTTP status."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, message: str, headers: dict | None = None) -> JSON:
    return JSON(error_body(status, message), status_code=status, headers=headers)


def _turn(i: int, role: str, content, out: list) -> None:
    """messages[i] (Anthropic) appended to out as chat messages."""
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise RequestError(f"messages[{i}].content must be a string or an array of content blocks", param="messages")
    msg = None            # the open user / assistant message of this turn (text, tool calls)
    n0 = len(out)
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(block, dict):
            raise RequestError(f"{where} must be an object", param="messages")
        kind = block.get("type")
        if kind in _UNSERVED_BLOCKS:
            raise RequestError(f"{where}: {kind!r} blocks are not supported ({_UNSERVED_BLOCKS[kind]}: text blocks, "
                               "tool_use and tool_result only)", param="messages", code="not_supported")
        if kind == "image" and role == "user":   # an OpenAI image_url part (served with --mmproj: server/app.py)
            src = block.get("source") if isinstance(block.get("source"), dict) else {}
            if src.get("type") == "base64" and isinstance(src.get("data"), str):
                url = f"data:{src.get('media_type') or 'image/png'};base64,{src['data']}"
            elif src.get("type") == "url" and isinstance(src.get("url"), str):
                url = src["url"]
            else:
                raise RequestError(f"{where}: an image block needs a source of type 'base64' (media_type, data) or "
                                   "'url'", param="messages")
            if msg is None:
                msg = {"role": role, "content": ""}
                out.append(msg)
            if isinstance(msg["content"], str):
                msg["content"] = [{"type": "text", "text": msg["content"]}] if msg["content"] else []
            msg["content"].append({"type": "image_url", "image_url": {"url": url}})
            continue
        if kind == "tool_result" and role == "user":
            use_id = block.get("tool_use_id")
            if not isinstance(use_id, str):
                raise RequestError(f"{where}.tool_use_id must be a string", param="messages")
            out.append({"role": "tool", "tool_call_id": use_id,
                        "content": text_of(block.get("content") or "", f"{where}.content", "messages")})
            msg = None        # text after the results: a user message after them
            continue
        if kind not in ("text", "tool_use", "thinking", "redacted_thinking") or \
                (kind != "text" and role != "assistant"):
            raise RequestError(f"{where}: {kind!r} blocks are not supported in {role} messages", param="messages")
        if msg is None:
            msg = {"role": role, "content": ""}
            out.append(msg)
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise RequestError(f"{where}.text must be a string", param="messages")
            if isinstance(msg["content"], list):   # after an image block
                msg["content"].append({"type": "text", "text": block["text"]})
            else:
                msg["content"] += block["text"]
        elif kind == "tool_use":
            name, args = block.get("name"), block.get("input", {})
            if not isinstance(block.get("id"), str) or not isinstance(name, str) or not isinstance(args, dict):
                raise RequestError(f"{where}: a tool_use block needs a string id and name and an object input",
                                   param="messages")
            msg.setdefault("tool_calls", []).append({"id": block["id"], "type": "function", "function": {
                "name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            msg["reasoning_content"] = msg.get("reasoning_content", "") + block["thinking"]
    if len(out) == n0:        # no blocks
        out.append({"role": role, "content": ""})


def _tools(tools: list) -> list:
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            kind = t.get("type") if isinstance(t, dict) else t
            raise RequestError(f"tools[{i}]: only custom tools (name, description, input_schema) are served, not "
                               f"{kind!r}", param="tools", code="not_supported")
        fn = {"name": t.get("name"), "parameters": t.get("input_schema", {"type": "object"})}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice):
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise RequestError("tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"} (\"tool\" with a "
                           "\"name\")", param="tool_choice")
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise RequestError("tool_choice {\"type\": \"tool\"} needs the tool's \"name\"", param="tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def chat_body(body: dict, *, count: bool = False) -> dict:
    """The /v1/chat/completions body of a Messages request (count: a count_tokens body, max_tokens not needed);
    RequestError for what is not served."""
    if body.get("n") not in (None, 1):
        raise RequestError("'n' is not a Messages API parameter (one message per request)", param="n")
    if not count:
        field(body, "max_tokens", "int")          # required (its range: the chat path's)
    messages = []
    system = body.get("system")
    if system is not None:
        system = text_of(system, "system", "system")
        if system:
            messages.append({"role": "system", "content": system})
    for i, m in enumerate(field(body, "messages", "list")):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise RequestError(f"messages[{i}].role must be 'user' or 'assistant', got {role!r} (a system prompt "
                               "goes in 'system')", param="messages")
        _turn(i, role, m.get("content"), messages)
    chat = {k: v for k, v in body.items() if k not in _IGNORED + _TRANSLATED}
    chat["messages"] = messages
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    stops = field(body, "stop_sequences", "list", None)
    if stops is not None:
        if not all(isinstance(s, str) for s in stops):
            raise RequestError("'stop_sequences' must be an array of strings", param="stop_sequences")
        chat["stop"] = stops
    tools = field(body, "tools", "list", None)
    if tools:
        chat["tools"] = _tools(tools)
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    thinking = field(body, "thinking", "dict", None)
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive"):
            raise RequestError("thinking.type must be 'enabled', 'disabled' or 'adaptive'", param="thinking")
        if kind != "adaptive":        # adaptive: the template's default
            budget = thinking.get("budget_tokens")
            if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
                raise RequestError("thinking.budget_tokens must be a non-negative integer", param="thinking")
            chat["chat_template_kwargs"] = {**field(body, "chat_template_kwargs", "dict", {}),
                                            "enable_thinking": kind == "enabled" and budget != 0}
    fmt = (field(body, "output_config", "dict", {}) or {}).get("format") or body.get("output_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise RequestError("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                               param="output_config")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return chat


class _Builder:
    """The Message of one request, filled from the chat completion's message (or its stream)."""

    def __init__(self, model: str, stops: list[str]):
        self.id = "msg_" + uuid.uuid4().hex
        self.model = model
        self.stops = stops            # the request's stop_sequences (the template's end-of-turn strings are not)

    def message(self, content: list, res: Result | None, calls: bool = False, n_prompt: int = 0) -> dict:
        reason, seq = self.stop(res, calls) if res is not None else (None, None)
        usage = {"input_tokens": res.n_prompt if res is not None else n_prompt,
                 "output_tokens": res.n_predicted if res is not None else 0}
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": seq, "usage": usage}

    def stop(self, res: Result, calls: bool) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of a finished reply."""
        if calls:
            return "tool_use", None
        if res.stop_type == "word" and res.stopping_word in self.stops:
            return "stop_sequence", res.stopping_word
        return ("end_turn", None) if res.finish_reason == "stop" else ("max_tokens", None)

    @staticmethod
    def tool_use(call: dict) -> dict:
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            args = {}
        return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
                "input": args if isinstance(args, dict) else {}}

    def content(self, message: dict) -> list:
        blocks = []
        if message.get("reasoning_content"):
            blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        return blocks + [self.tool_use(c) for c in message.get("tool_calls") or []]


# stream deltas: the chat delta's key -> (block type, the block when it opens, delta type, the delta's key)
_STREAMED = (("reasoning_content", "thinking", {"type": "thinking", "thinking": "", "signature": ""}, "thinking_delta",
              "thinking"),
             ("content", "text", {"type": "text", "text": ""}, "text_delta", "text"))


def routes(state: "ServerState", chat_task) -> list[Route]:
    from .app import EngineStream, _stats, attach, collect

    anthropic_errors = errors_as(error_response)      # the routes' errors in Anthropic's shape

    async def messages(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        chat = chat_body(body)
        task, shaper, stream, _ = await chat_task(llm, chat)
        stop = chat.get("stop")
        build = _Builder(state.model_name, [stop] if isinstance(stop, str) else list(stop or []))
        _stats(request, prompt=len(task.prompt_tokens))
        if not stream:
            res = await collect(request, llm, task, shaper.add)
            _stats(request, predicted=res.n_predicted)
            message = shaper.response(res)["choices"][0]["message"]
            return JSON(build.message(build.content(message), res, bool(message.get("tool_calls"))))

        q = attach(task, state.stats)
        llm.engine.submit(task)

        async def events():
            yield sse_event("message_start", {"message": build.message([], None, n_prompt=len(task.prompt_tokens))})
            yield sse_event("ping")
            index, open_kind = -1, None

            def close() -> list[str]:
                out = []
                if open_kind == "thinking":
                    out.append(sse_event("content_block_delta", {"index": index, "delta": {
                        "type": "signature_delta", "signature": ""}}))
                if open_kind is not None:
                    out.append(sse_event("content_block_stop", {"index": index}))
                return out

            def open_block(kind: str, block: dict) -> list[str]:
                nonlocal index, open_kind
                out = close()
                index, open_kind = index + 1, kind
                return out + [sse_event("content_block_start", {"index": index, "content_block": block})]

            async for item in chat_deltas(q, shaper):
                if item[0] == "delta":
                    for key, kind, block, delta_type, delta_key in _STREAMED:
                        piece = item[1].get(key)
                        if piece:
                            if open_kind != kind:
                                for e in open_block(kind, dict(block)):
                                    yield e
                            yield sse_event("content_block_delta", {"index": index, "delta": {
                                "type": delta_type, delta_key: piece}})
                elif item[0] == "error":
                    err = item[1]
                    status = err.status if isinstance(err, RequestError) else 500
                    yield sse_event("error", error_body(status, str(err) if isinstance(err, RequestError)
                                                        else f"{type(err).__name__}: {err}"))
                    return
                else:
                    _, res, calls = item
                    _stats(request, predicted=res.n_predicted)
                    for call in calls:
                        use = build.tool_use(call)
                        for e in open_block("tool_use", dict(use, input={})):
                            yield e
                        yield sse_event("content_block_delta", {"index": index, "delta": {
                            "type": "input_json_delta", "partial_json": json.dumps(use["input"], ensure_ascii=False)}})
                    for e in close():
                        yield e
                    reason, seq = build.stop(res, bool(calls))
                    yield sse_event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                                      "usage": {"output_tokens": res.n_predicted}})
                    yield sse_event("message_stop")
                    return
        return EngineStream(events(), task, llm)

    async def count_tokens(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        chat = chat_body(body, count=True)
        # the prompt chat_task renders (the server's template variables under the request's, the tools), without its
        # task: a prompt too long for a slot is counted too
        kwargs = {**state.template_kwargs, **field(chat, "chat_template_kwargs", "dict", {})}
        messages = chat["messages"]
        tc = llm.tool_calls(field(chat, "tools", "list", None), chat.get("tool_choice"))
        if tc is not None:
            messages = llm.tool_messages(messages, tc, kwargs)
        tokens = (await run_in_threadpool(llm.chat_prompt, messages, **kwargs))[1]
        return JSON({"input_tokens": len(tokens)})

    return [Route(PATHS[0], anthropic_errors(messages), methods=["POST"]),
            Route(PATHS[1], anthropic_errors(count_tokens), methods=["POST"])]
