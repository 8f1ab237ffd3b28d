"""Ollama's REST API (docs/api.md of ollama/ollama) over this server's paths, for the tools that speak it (Open WebUI,
Continue, editors' "Ollama" providers, the official `ollama` clients) pointed here as their Ollama host. llama.cpp's
llama-server has /api/tags, /api/show and /api/chat as aliases of its own routes; here each route answers in Ollama's
shapes.

GET /api/tags, /api/ps: {"models": [the served model]}: name and model (the alias or file name; any name a client
sends is answered by the one model), modified_at (the file's time), size (bytes), digest (an id of the file's path,
size and time, not a hash of its bytes), details {format "gguf", family (the architecture), families,
parameter_size ("7.2B"), quantization_level ("Q4_K_M")}; /api/ps adds context_length (a slot's), size_vram 0 and an
expires_at far ahead (never unloaded), and is empty while the model loads.
GET /api/version: {"version": VERSION}, the Ollama release whose API this mirrors (clients gate features on it).
POST /api/show: {modelfile, parameters (the server's sampling defaults, num_ctx, the end-of-turn stops), template
(the chat template's Jinja source), details, model_info (the GGUF metadata: general.architecture,
<arch>.context_length (the trained one), <arch>.embedding_length...; tokenizer arrays as [] unless "verbose": true),
capabilities: completion, tools (a template that renders tools), thinking (one that thinks), insert (FIM tokens:
suffix), embedding (--embedding)}.
POST /api/chat: messages [{role: system | user | assistant | tool, content, thinking, tool_calls [{function: {name,
arguments: an object}}], tool_name}] -> the /v1/chat/completions path (tool calls get ids, and each tool message the
id of the first unanswered call of its name); tools as they are; format "json" or a JSON schema -> response_format;
think (true, false, or "high" / "medium" / "low") -> the template's enable_thinking (and reasoning_effort); options
-> the sampling fields (below). Streamed (Ollama's default: stream true) as NDJSON, one object a line: {model,
created_at, message: {role, content, thinking?}, done: false} ..., a call's message.tool_calls in an object of its
own, then {..., message: {role, content: ""}, done: true, done_reason: stop | length, total_duration,
load_duration, prompt_eval_count, prompt_eval_duration, eval_count, eval_duration} (nanoseconds, the engine's
timings); stream false: one object with the whole message. No messages: the "load" ping ({..., done_reason: load}).
POST /api/generate: the prompt through the chat template ([system, user prompt], as the chat path renders it) or,
with raw, as it is (tokenized as /completion does); suffix -> the infill prompt (the model's FIM tokens, as
/v1/completions' suffix); context (the ids of an earlier answer) goes before the prompt (an empty prompt with a
context continues it); format, options, think as for chat. Objects {model, created_at, response, thinking?, done};
the last adds the counts, durations and `context` (the prompt's ids and the answer's; raw answers have one too). An
empty prompt without a context: {..., response: "", done: true, done_reason: "load"}.
POST /api/embed: input (a string or strings) -> {model, embeddings, prompt_eval_count, ...}: /v1/embeddings'
vectors; truncate (default true) cuts an input to the embedding context; dimensions keeps the first n (L2-normalized
again). POST /api/embeddings {prompt} -> {embedding}. Both need --embedding (501 as the other embedding routes).

options: temperature, top_k, top_p, min_p, typical_p, repeat_penalty, repeat_last_n, presence_penalty,
frequency_penalty, mirostat, mirostat_tau, mirostat_eta, seed, stop, tfs_z (only off) as the server's fields of those
names (left out: the server's defaults, not Ollama's Modelfile ones), llama.cpp's other sampling fields (dry_*, xtc_*,
grammar...) too; num_predict -> n_predict (-1 / -2: no limit; 0 on /api/chat: refused); num_ctx is the server's
(-c / -np): a request cannot change it, and a larger one is logged and otherwise ignored (clients such as Continue
send theirs with every request; a prompt longer than a slot is refused as everywhere). Options that size or place the
model (num_gpu, num_thread, num_batch, use_mmap...) and num_keep, penalize_newline are ignored, as are unknown ones
(logged, as Ollama does). keep_alive is ignored (the model stays loaded). Beyond Ollama, /api/chat takes llama.cpp's
tool_choice, chat_template_kwargs and reasoning_format (Ollama has no tool_choice: a client may force a call with it).

Errors are Ollama's {"error": "message"} with the HTTP status (mid-stream: an {"error"} line). Refused (400 naming
them): /api/generate's images (/api/chat's are served with --mmproj), template (an Ollama Go template: send raw
prompts instead), system with raw, context with suffix, logprobs. Not served (404): pull, push, create, copy, delete,
blobs: the server has the one model it was started with. The --api-key check applies as on every route (Ollama
clients send none unless told to: their headers option).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import gguf
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from ..chat import TEMPLATE_KEY
from ..reasoning import splitter_for
from ..request import RequestError, Result
from ..sampling import EXTRA_NUMBERS
from . import embeddings
from .protocol import JSON, chat_deltas, dumps, errors_as, field, read_json, text_of

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("powerinfer.server")

VERSION = "0.9.0"           # the Ollama release whose API is mirrored: `think` and `thinking` came with 0.9
NEVER = "2318-08-02T00:00:00Z"   # /api/ps' expires_at of a model that stays loaded (Ollama's, for keep_alive -1)

# Ollama's options that are this server's sampling fields of the same name (/completion's), and llama.cpp's others
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
             "frequency_penalty", "seed", "stop", "tfs_z", *EXTRA_NUMBERS, "dry_sequence_breakers", "samplers",
             "logit_bias", "ignore_eos", "grammar", "lora", "cache_prompt")
# options without a bearing here: what sizes or places the model (the server's flags), context shifts, newlines
_IGNORED = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap",
            "use_mlock", "embedding_only", "num_thread", "num_keep", "penalize_newline")
# llama.cpp's extensions /api/chat passes on to the chat path
_CHAT_EXTRAS = ("tool_choice", "reasoning_format")


def error_response(status: int, message: str, headers: dict | None = None) -> JSON:
    """Ollama's error: {"error": message}."""
    return JSON({"error": message}, status_code=status, headers=headers)


def _error_text(e: Exception) -> str:
    return e.message if isinstance(e, RequestError) else f"{type(e).__name__}: {e}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _line(obj: dict) -> str:
    return dumps(obj) + "\n"


# ------------------------------------------------------------------------------------------ requests
def _model(body: dict, state: "ServerState") -> str:
    """The name a request gives (answered by the one model) or the served model's."""
    return field(body, "model", "str", None, aliases=("name",)) or state.model_name


def _refuse_unserved(body: dict) -> None:
    if body.get("images"):
        raise RequestError("'images' are not supported on /api/generate (/api/chat takes them with --mmproj)",
                           param="images", code="not_supported")
    if body.get("logprobs"):
        raise RequestError("'logprobs' are not supported on Ollama's routes (/v1/chat/completions has them)",
                           param="logprobs", code="not_supported")


def sampling_body(body: dict, llm) -> tuple[dict, int | None]:
    """(the sampling fields of a request's options and format, llama.cpp's names as /completion and the chat path read
    them; num_predict, None where not given)."""
    opts = field(body, "options", "dict", {})
    out: dict = {}
    n_predict = None
    for key, value in opts.items():
        if value is None or key in _IGNORED:
            continue
        if key in _SAMPLING:
            out[key] = value
        elif key == "num_predict":
            n_predict = field(opts, key, "int")
        elif key == "num_ctx":
            n_ctx, slot = field(opts, key, "int"), llm.engine.n_ctx_slot
            if n_ctx > slot:
                log.warning("ollama: options.num_ctx = %d ignored: a slot holds %d tokens (the server's -c / -np)",
                            n_ctx, slot)
        else:
            log.warning("ollama: unknown option %r ignored", key)
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise RequestError("'format' must be \"json\" or a JSON schema (an object)", param="format")
    return out, n_predict


def _think(body: dict, kwargs: dict) -> dict:
    """The template variables of `think`, over kwargs."""
    think = body.get("think")
    if think is None:
        return kwargs
    if isinstance(think, bool):
        return {**kwargs, "enable_thinking": think}
    if think in ("high", "medium", "low"):
        return {**kwargs, "enable_thinking": True, "reasoning_effort": think}
    raise RequestError("'think' must be true, false, \"high\", \"medium\" or \"low\"", param="think")


def chat_body(body: dict, llm) -> dict:
    """The /v1/chat/completions body of an /api/chat request (RequestError for what is not served)."""
    messages: list[dict] = []
    unanswered: list[tuple[str, str]] = []        # (id, name) of the last assistant message's calls
    for i, m in enumerate(field(body, "messages", "list")):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"messages[{i}].role must be system, user, assistant or tool, got {role!r}",
                               param="messages")
        msg = {"role": role, "content": text_of(m.get("content") or "", f"messages[{i}]", "messages")}
        if m.get("images"):   # base64 strings: image_url parts before the text (served with --mmproj, server/app.py)
            imgs = m["images"]
            if role != "user" or not isinstance(imgs, list) or not all(isinstance(x, str) for x in imgs):
                raise RequestError(f"messages[{i}].images must be an array of base64 strings in a user message",
                                   param="messages")
            msg["content"] = [{"type": "image_url", "image_url": {"url": x}} for x in imgs] + \
                [{"type": "text", "text": msg["content"]}]
        if role == "assistant":
            if isinstance(m.get("thinking"), str) and m["thinking"]:
                msg["reasoning_content"] = m["thinking"]
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise RequestError(f"messages[{i}].tool_calls must be an array", param="messages")
            unanswered = []
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RequestError(f"messages[{i}].tool_calls[{j}] must be {{\"function\": {{\"name\", "
                                       "\"arguments\"}}}", param="messages")
                args = fn.get("arguments", {})
                # an id of 9 letters and digits (what Mistral's templates insist on) where the client gave none
                cid = call["id"] if isinstance(call.get("id"), str) and call["id"] else f"c{i:04d}{j:04d}"
                msg.setdefault("tool_calls", []).append({"id": cid, "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args,
                                                                                                  ensure_ascii=False)}})
                unanswered.append((cid, fn["name"]))
        elif role == "tool":
            name = m.get("tool_name") or m.get("name")
            call = next((c for c in unanswered if name is None or c[1] == name), None)
            if call is not None:
                unanswered.remove(call)
            cid = m.get("tool_call_id") or (call[0] if call is not None else None)
            if cid is not None:
                msg["tool_call_id"] = cid
            if isinstance(name, str):
                msg["name"] = name
        messages.append(msg)
    fields, n_predict = sampling_body(body, llm)
    chat = {**fields, "messages": messages, "stream": field(body, "stream", "bool", True)}
    if n_predict is not None and n_predict > 0:
        chat["max_tokens"] = n_predict
    elif n_predict == 0:
        raise RequestError("options.num_predict must be positive, or -1 / -2 for no limit", param="options")
    tools = field(body, "tools", "list", None)
    if tools:
        chat["tools"] = tools
    for key in _CHAT_EXTRAS:
        if body.get(key) is not None:
            chat[key] = body[key]
    kwargs = _think(body, field(body, "chat_template_kwargs", "dict", {}))
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    return chat


def _context(body: dict) -> list[int]:
    ctx = field(body, "context", "list", [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ctx):
        raise RequestError("'context' must be an array of token ids", param="context")
    return ctx


# ------------------------------------------------------------------------------------------ responses
def _done(res: Result, t0: float) -> dict:
    """The last object's fields: why the answer ended, Ollama's counts and durations (nanoseconds)."""
    return {"done": True, "done_reason": res.finish_reason, "total_duration": int((time.perf_counter() - t0) * 1e9),
            "load_duration": 0, "prompt_eval_count": res.n_prompt, "prompt_eval_duration": int(res.prompt_ms * 1e6),
            "eval_count": res.n_predicted, "eval_duration": int(res.predicted_ms * 1e6)}


def _tool_call(call: dict) -> dict:
    """An OpenAI tool call as Ollama's: {"function": {"name", "arguments": an object}}."""
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = {}
    return {"function": {"name": call["function"]["name"], "arguments": args if isinstance(args, dict) else {}}}


def _message(content: str = "", thinking: str = "", calls: list | None = None) -> dict:
    msg = {"role": "assistant", "content": content}
    if thinking:
        msg["thinking"] = thinking
    if calls:
        msg["tool_calls"] = [_tool_call(c) for c in calls]
    return msg


def _human(n: int) -> str:
    """A parameter count as Ollama writes it: 7.2B, 137.5M, 22K."""
    for unit, scale, digits in (("B", 1e9, 1), ("M", 1e6, 1), ("K", 1e3, 0)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.{digits}f}{unit}"
    return str(n)


def _quantization(model) -> str:
    """The file's type as Ollama names it (Q4_K_M, Q8_0, F16): general.file_type, else the type of most weights."""
    ft = model.metadata.get("general.file_type")
    try:
        if isinstance(ft, int):
            return gguf.LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        sizes: dict[int, int] = {}
        for t in model.file.tensors.values():
            sizes[t.type] = sizes.get(t.type, 0) + t.data.nbytes
        return gguf.GGMLQuantizationType(max(sizes, key=sizes.get)).name if sizes else ""
    except (ValueError, AttributeError):
        return ""


def routes(state: "ServerState", chat_task) -> list[Route]:
    from .app import EngineStream, _cap, _stats, attach, collect, sampling_fields

    class NDJSON(EngineStream):
        """An engine stream as application/x-ndjson: one JSON object a line."""

        def init_headers(self, headers=None):
            self.media_type = "application/x-ndjson"
            super().init_headers(headers)

    ollama_errors = errors_as(error_response)      # the routes' errors in Ollama's shape

    # ---- the model
    def details() -> dict:
        llm = state.llm
        if llm is None:        # loading
            return {"parent_model": "", "format": "gguf", "family": "", "families": None, "parameter_size": "",
                    "quantization_level": ""}
        arch = llm.model.hparams.arch
        return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
                "parameter_size": _human(llm.model.n_params), "quantization_level": _quantization(llm.model)}

    def entry() -> dict:
        path = str(state.llm.model.path) if state.llm is not None else state.model_path
        try:
            st = os.stat(path)
            size, mtime, mtime_ns = st.st_size, st.st_mtime, st.st_mtime_ns
        except OSError:
            size = state.llm.model.size_bytes if state.llm is not None else 0
            mtime, mtime_ns = state.created, 0
        digest = hashlib.sha256(f"{os.path.abspath(path)}:{size}:{mtime_ns}".encode()).hexdigest()
        return {"name": state.model_name, "model": state.model_name,
                "modified_at": datetime.fromtimestamp(mtime, timezone.utc).isoformat().replace("+00:00", "Z"),
                "size": size, "digest": digest, "details": details()}

    async def tags(request: Request):
        return JSON({"models": [entry()]})

    async def ps(request: Request):
        llm = state.llm
        if llm is None:
            return JSON({"models": []})
        return JSON({"models": [{**entry(), "expires_at": NEVER, "size_vram": 0,
                                 "context_length": llm.engine.n_ctx_slot}]})

    async def version(request: Request):
        return JSON({"version": VERSION})

    async def show(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        _model(body, state)
        verbose = field(body, "verbose", "bool", False)
        info: dict = {}
        for key, value in llm.model.metadata.items():
            if key == TEMPLATE_KEY or isinstance(value, (bytes, bytearray)):
                continue
            if hasattr(value, "tolist"):
                value = value.tolist()
            if isinstance(value, (list, tuple)):
                value = list(value) if verbose or not key.startswith("tokenizer.") else []
            elif isinstance(value, float) and not math.isfinite(value):
                value = str(value)
            info[key] = value
        info.setdefault("general.parameter_count", llm.model.n_params)
        source = llm.chat_formatter.source or ""
        caps = ["completion"]
        if "tools" in source:
            caps.append("tools")
        if "<think>" in source or "enable_thinking" in source or "reasoning_content" in source:
            caps.append("thinking")
        if llm.fim.usable:
            caps.append("insert")
        if state.embedding:
            caps.append("embedding")
        d = state.sampling
        params = [("num_ctx", llm.engine.n_ctx_slot), ("temperature", d.temperature), ("top_k", d.top_k),
                  ("top_p", d.top_p), ("min_p", d.min_p), ("repeat_penalty", d.repeat_penalty),
                  ("repeat_last_n", d.repeat_last_n)]
        params += [("stop", json.dumps(s, ensure_ascii=False)) for s in llm.chat_formatter.end_of_turn]
        parameters = "\n".join(f"{k:<30} {v}" for k, v in params)
        modelfile = ("# Modelfile of a powerinfer-py server (its chat template is Jinja: see \"template\")\n"
                     f"FROM {llm.model.path}\n" + "".join(f"PARAMETER {k} {v}\n" for k, v in params))
        return JSON({"license": "", "modelfile": modelfile, "parameters": parameters, "template": source,
                     "details": details(), "model_info": info, "capabilities": caps,
                     "modified_at": entry()["modified_at"]})

    # ---- chat
    async def chat(request: Request):
        t0 = time.perf_counter()
        llm = state.require()
        body = await read_json(request, state)
        model = _model(body, state)
        if not field(body, "messages", "list", []):     # Ollama's "load the model"
            return JSON({"model": model, "created_at": _now(), "message": _message(), "done_reason": "load",
                         "done": True})
        _refuse_unserved(body)
        task, shaper, stream, _ = await chat_task(llm, chat_body(body, llm))
        _stats(request, prompt=len(task.prompt_tokens))
        if not stream:
            res = await collect(request, llm, task, shaper.add)
            _stats(request, predicted=res.n_predicted)
            m = shaper.response(res)["choices"][0]["message"]
            return JSON({"model": model, "created_at": _now(),
                         "message": _message(m.get("content") or "", m.get("reasoning_content") or "",
                                             m.get("tool_calls")), **_done(res, t0)})

        q = attach(task, state.stats)
        llm.engine.submit(task)

        async def lines():
            async for item in chat_deltas(q, shaper):
                if item[0] == "delta":
                    content, thinking = item[1].get("content") or "", item[1].get("reasoning_content") or ""
                    if content or thinking:
                        yield _line({"model": model, "created_at": _now(), "message": _message(content, thinking),
                                     "done": False})
                elif item[0] == "error":
                    yield _line({"error": _error_text(item[1])})
                    return
                else:
                    _, res, calls = item
                    _stats(request, predicted=res.n_predicted)
                    if calls:
                        yield _line({"model": model, "created_at": _now(), "message": _message(calls=calls),
                                     "done": False})
                    yield _line({"model": model, "created_at": _now(), "message": _message(), **_done(res, t0)})
                    return
        return NDJSON(lines(), task, llm)

    # ---- generate
    async def prompt_tokens(llm, body: dict, prompt: str, context: list[int], n_predict: int):
        """(prompt tokens, stop strings of the template, stop ids, the reasoning splitter, the control tokens the reply
        shows) of a generate request."""
        suffix = field(body, "suffix", "str", "")
        raw = field(body, "raw", "bool", False)
        if suffix:
            if context:
                raise RequestError("'context' cannot be combined with 'suffix' (an infill prompt is built whole)",
                                   param="context")
            return await run_in_threadpool(lambda: llm.infill_prompt(prompt, suffix, max_tokens=n_predict,
                                                                     param="suffix")), [], [], None, ()
        system = field(body, "system", "str", "")
        if raw or not prompt:
            if raw and system:
                raise RequestError("'system' goes through the chat template, which raw skips: put it in the prompt",
                                   param="system")
            if not context:                          # as /completion tokenizes it (BOS added per the model)
                return await run_in_threadpool(llm.tokenize_prompt, prompt), [], [], None, ()
            tokens = llm.tokenizer.encode(prompt, add_special=False, parse_special=True) if prompt else []
            return context + tokens, [], [], None, ()
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        kwargs = _think(body, {**state.template_kwargs, **field(body, "chat_template_kwargs", "dict", {})})
        text, tokens, stops, stop_ids = await run_in_threadpool(lambda: llm.chat_prompt(messages, **kwargs))
        if context and tokens and tokens[0] == llm.tokenizer.bos_id:
            tokens = tokens[1:]
        reasoning = splitter_for(field(body, "reasoning_format", "str", llm.reasoning_format), text)
        return context + tokens, stops, stop_ids, reasoning, llm.chat_preserved_ids

    async def generate(request: Request):
        t0 = time.perf_counter()
        llm = state.require()
        body = await read_json(request, state)
        model = _model(body, state)
        if field(body, "template", "str", ""):
            raise RequestError("'template' (an Ollama Go template) is not supported: send the prompt formatted, with "
                               "raw: true, or let the model's chat template format it", param="template",
                               code="not_supported")
        prompt = field(body, "prompt", "str", "")
        context = _context(body)
        if not prompt and not context and not field(body, "suffix", "str", ""):      # Ollama's "load the model"
            return JSON({"model": model, "created_at": _now(), "response": "", "done": True, "done_reason": "load"})
        _refuse_unserved(body)
        stream = field(body, "stream", "bool", True)
        fields, n_predict = sampling_body(body, llm)
        n_predict = _cap(state, -1 if n_predict is None or n_predict < 0 else n_predict)
        s = sampling_fields(fields, state.sampling, (state.context_shift, state.n_keep))
        tokens, stops, stop_ids, reasoning, preserved = await prompt_tokens(llm, body, prompt, context, n_predict)
        stop = s.pop("stop")
        stop = ([stop] if isinstance(stop, str) else list(stop or [])) + stops
        task = llm.make_task(tokens, max_tokens=n_predict, stop=stop, stop_token_ids=stop_ids, preserved_ids=preserved,
                             **s)
        _stats(request, prompt=len(tokens))

        def split(text: str) -> tuple[str, str]:
            """(thinking, response) of a piece of the answer."""
            return reasoning.feed(text) if reasoning is not None else ("", text)

        def chunk(response: str, thinking: str = "") -> dict:
            out = {"model": model, "created_at": _now(), "response": response}
            if thinking:
                out["thinking"] = thinking
            return out

        def last(res: Result, response: str = "", thinking: str = "") -> dict:
            return {**chunk(response, thinking), **_done(res, t0), "context": tokens + list(res.tokens)}

        if not stream:
            parts: list[tuple[str, str]] = []
            res = await collect(request, llm, task, lambda text, info: parts.append(split(text)))
            _stats(request, predicted=res.n_predicted)
            if reasoning is not None:
                parts.append(reasoning.finish())
            return JSON(last(res, "".join(p[1] for p in parts), "".join(p[0] for p in parts)))

        q = attach(task, state.stats)
        llm.engine.submit(task)

        async def lines():
            while True:
                ev = await q.get()
                if ev[0] == "token":
                    thinking, response = split(ev[1])
                    if thinking or response:
                        yield _line({**chunk(response, thinking), "done": False})
                elif ev[0] == "error":
                    yield _line({"error": _error_text(ev[1])})
                    return
                else:
                    _stats(request, predicted=ev[1].n_predicted)
                    thinking, response = reasoning.finish() if reasoning is not None else ("", "")
                    if thinking or response:
                        yield _line({**chunk(response, thinking), "done": False})
                    yield _line(last(ev[1]))
                    return
        return NDJSON(lines(), task, llm)

    # ---- embeddings
    async def embed_vectors(llm, body: dict, value, param: str, truncate: bool) -> tuple[list, int]:
        """(the vectors, as lists, of an input's strings, their token count), as /v1/embeddings computes them."""
        inputs = embeddings.parse_inputs(llm, value, param)
        emb = llm.embedder
        if emb.pooling == "none":
            raise RequestError("the server's pooling is 'none' (a vector per token): Ollama's routes answer one "
                               "vector per input (/embedding answers per token)", param=param)
        if truncate:                                 # Ollama's default: the end of a long input is cut
            inputs = [t[:emb.max_tokens] for t in inputs]
        norm = embeddings.normalize_field(body)
        vecs = await embeddings.compute(state, llm, inputs, norm)
        n_embd = llm.model.hparams.n_embd
        dims = field(body, "dimensions", "int", None)
        if dims is not None and not 1 <= dims <= n_embd:
            raise RequestError(f"'dimensions' must be in [1, {n_embd}] (this model's embedding size)",
                               param="dimensions")
        out = []
        for v in vecs:
            if dims is not None and dims < n_embd:
                v = v[:dims]
                if norm == 2 and float((v * v).sum()) > 0:       # Matryoshka: the first dims, unit length again
                    v = v / math.sqrt(float((v * v).sum()))
            out.append(v.tolist())
        return out, sum(len(t) for t in inputs)

    async def embed(request: Request):
        t0 = time.perf_counter()
        llm = embeddings.require(state)
        body = await read_json(request, state)
        model = _model(body, state)
        value = field(body, "input", "any", "")
        if value in ("", []):
            return JSON({"model": model, "embeddings": []})
        vecs, n = await embed_vectors(llm, body, value, "input", field(body, "truncate", "bool", True))
        return JSON({"model": model, "embeddings": vecs, "total_duration": int((time.perf_counter() - t0) * 1e9),
                     "load_duration": 0, "prompt_eval_count": n})

    async def embeddings_legacy(request: Request):
        llm = embeddings.require(state)
        body = await read_json(request, state)
        _model(body, state)
        prompt = field(body, "prompt", "str", "")
        if not prompt:
            return JSON({"embedding": []})
        vecs, _ = await embed_vectors(llm, body, prompt, "prompt", True)
        return JSON({"embedding": vecs[0]})

    return [Route("/api/tags", ollama_errors(tags), methods=["GET"]),
            Route("/api/ps", ollama_errors(ps), methods=["GET"]),
            Route("/api/version", ollama_errors(version), methods=["GET"]),
            Route("/api/show", ollama_errors(show), methods=["POST"]),
            Route("/api/chat", ollama_errors(chat), methods=["POST"]),
            Route("/api/generate", ollama_errors(generate), methods=["POST"]),
            Route("/api/embed", ollama_errors(embed), methods=["POST"]),
            Route("/api/embeddings", ollama_errors(embeddings_legacy), methods=["POST"])]
