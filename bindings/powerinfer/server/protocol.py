"""What every route module of the server shares: JSON responses, OpenAI-shaped error bodies, the errors of a route
group with a shape of its own (errors_as), and the checked reading of request bodies (field, read_json, text_of); and
what the APIs translated to a chat completion (responses.py, messages.py, ollama.py) stream: named SSE events
(sse_event) of a chat stream's deltas (chat_deltas). Below app.py, metrics.py and embeddings.py, which import it (and
not each other)."""
from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..request import RequestError

if TYPE_CHECKING:
    from .app import ServerState

__all__ = ["JSON", "chat_deltas", "dumps", "error_body", "error_response", "errors_as", "field", "read_json",
           "request_error_response", "sse_event", "text_of"]

log = logging.getLogger("powerinfer.server")


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default)


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


def error_body(message: str, type_: str = "invalid_request_error", code: Any = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: Any = None, param: str | None = None,
                   headers: dict | None = None) -> JSON:
    return JSON(error_body(message, type_, code, param), status_code=status, headers=headers)


def request_error_response(e: RequestError) -> JSON:
    return error_response(e.status, e.message, e.type, e.code, e.param)


def errors_as(respond):
    """A decorator for the handlers of a route group whose errors have a shape of their own (the app's exception
    handlers answer OpenAI's): a RequestError becomes respond(status, message), any other exception is logged and
    becomes respond(500, "internal error: ...", {"x-should-retry": "false"})."""
    def wrap(handler):
        async def run(request: Request):
            try:
                return await handler(request)
            except RequestError as e:
                return respond(e.status, e.message)
            except Exception as e:
                log.exception("unhandled error in %s %s", request.method, request.url.path)
                return respond(500, f"internal error: {type(e).__name__}: {e}", {"x-should-retry": "false"})
        return run
    return wrap


_MISSING = object()


def _typename(v) -> str:
    return "null" if v is None else {bool: "boolean", int: "integer", float: "number", str: "string",
                                     list: "array", dict: "object"}.get(type(v), type(v).__name__)


def field(body: dict, name: str, kind: str, default=_MISSING, *, aliases: tuple = ()):
    """body[name] checked against kind: int, num, bool, str, list, dict, any. null means the default."""
    value = _MISSING
    for key in (name, *aliases):
        if key in body and body[key] is not None:
            value = body[key]
            break
    if value is _MISSING:
        if default is _MISSING:
            raise RequestError(f"'{name}' is required", param=name)
        return default
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "num": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "list": lambda v: isinstance(v, list),
        "dict": lambda v: isinstance(v, dict),
        "any": lambda v: True,
    }[kind](value)
    if not ok and kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if not ok:
        want = {"int": "an integer", "num": "a finite number", "bool": "a boolean", "str": "a string",
                "list": "an array", "dict": "an object"}[kind]
        raise RequestError(f"'{name}' must be {want}, got {_typename(value)}", param=name)
    return value


def _lone_surrogate(value, path: str = "") -> str | None:
    """The path of the first string (key or value) holding a lone UTF-16 surrogate ("\\ud800" is
    valid JSON but not text: it cannot be encoded, tokenized or sent back), else None."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return p or "(body)"
        elif isinstance(v, dict):
            for k, x in v.items():
                sub = f"{p}.{k}" if p else str(k)
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    return (p + "." if p else "") + ascii(k)
                stack.append((x, sub))
        elif isinstance(v, list):
            stack.extend((x, f"{p}[{i}]") for i, x in enumerate(v))
    return None


def _parse_body(raw: bytes, array: bool = False) -> dict | list:
    try:
        body = json.loads(raw or b"")
    except (ValueError, RecursionError) as e:      # JSONDecodeError, bad UTF-8, absurd nesting or numbers
        raise RequestError(f"invalid JSON in the request body: {type(e).__name__}: {str(e)[:200]}",
                           code="invalid_json") from None
    if not isinstance(body, list if array else dict):
        raise RequestError(f"the request body must be a JSON {'array' if array else 'object'}, got "
                           f"{_typename(body)}", code="invalid_json")
    bad = _lone_surrogate(body)
    if bad is not None:
        raise RequestError(f"'{bad}' holds a lone UTF-16 surrogate (e.g. \\ud800), which is not text",
                           code="invalid_json", param=bad.split(".")[0].split("[")[0])
    return body


_BIG_BODY = 64 << 10      # bodies above this are parsed off the event loop


async def read_json(request: Request, state: ServerState, *, array: bool = False) -> dict | list:
    """The request body as a JSON object (array: an array) whose strings are all valid text; RequestError (4xx)
    otherwise."""
    try:
        raw = await asyncio.wait_for(request.body(), timeout=state.timeout)
    except asyncio.TimeoutError:
        raise RequestError("timed out reading the request body", code="request_timeout", status=408) from None
    if len(raw) > _BIG_BODY:
        return await run_in_threadpool(_parse_body, raw, array)
    return _parse_body(raw, array)


def text_of(content, where: str, param: str) -> str:
    """The text of a message's content: a string, or a list of text parts ({"type": "text" (or the Responses API's
    "input_text" / "output_text"), "text": ...}, joined with no separator, as the chat path joins them); RequestError
    (param) naming any other part (images, files)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text") \
                    and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"{where}: content part {kind!r} is not supported (text only)", param=param)
        return "".join(out)
    raise RequestError(f"{where}: content must be a string or a list of text parts", param=param)


def sse_event(kind: str, data: dict | None = None) -> str:
    """One named server-sent event: `event: <kind>` and `data: <json>` whose `type` is the kind (the Responses and
    Messages APIs' streams)."""
    return f"event: {kind}\ndata: {dumps({'type': kind, **(data or {})})}\n\n"


async def chat_deltas(q: asyncio.Queue, shaper):
    """A streamed chat completion of one task (its engine events in q, server/app.py's attach; shaper its
    CompletionShaper) as ("delta", delta) for each chunk's delta (role, content, reasoning_content, tool_calls), then
    ("done", Result, tool calls: those of the final chunks) or ("error", exception)."""
    for c in shaper.start_chunks():
        yield "delta", c["choices"][0]["delta"]
    while True:
        ev = await q.get()
        if ev[0] == "token":
            c = shaper.token_chunk(ev[1], ev[2])
            if c is not None and c.get("choices"):
                yield "delta", c["choices"][0]["delta"]
        elif ev[0] == "error":
            yield "error", ev[1]
            return
        else:
            calls = []
            for c in shaper.final_chunks(ev[1]):
                if c.get("choices"):
                    calls += c["choices"][0]["delta"].get("tool_calls", [])
                    yield "delta", c["choices"][0]["delta"]
            yield "done", ev[1], calls
            return
