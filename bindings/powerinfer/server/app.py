"""The Starlette application: llama.cpp's native routes and the OpenAI-compatible routes.

Routes
------
GET  /health                 503 {"status": "loading model"} while loading, then {"status": "ok", ...}
GET  /v1/models, /models     the served model (answers while loading too)
GET  /props                   server settings
GET  /slots, /metrics        per-slot state (--no-slots: 501), Prometheus metrics (--metrics) (server/metrics.py)
POST /slots/{id}?action=save|restore|erase   a slot's prompt cache to and from --slot-save-path (server/slot_files.py)
GET/POST /lora-adapters                    the LoRA adapters and their scales (server/lora_adapters.py)
POST /v1/embeddings, /embedding   embeddings (--embedding; server/embeddings.py)
GET  /                       the chat page (server/static/index.html; --no-webui: 404)
POST /completion, /completions   llama.cpp native completion (SSE with "stream": true)
POST /tokenize, /detokenize
POST /v1/completions         OpenAI legacy completions
POST /v1/chat/completions, /chat/completions   OpenAI chat
POST /v1/responses, /v1/messages (+ /count_tokens)   OpenAI's Responses, Anthropic's Messages (server/responses.py,
                             server/messages.py): translated to chat bodies

Errors are `{"error": {"message", "type", "param", "code"}}` with 4xx for bad input. The `model`
field of OpenAI requests may name any model (many OpenAI apps hard-code one): this server has one,
which answers, and which responses and /v1/models name.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..api import CompletionShaper, PowerInfer, check_unimplemented, resolve_grammar
from ..reasoning import splitter_for
from ..request import RequestError, Result, Task
from ..sampling import EXTRA_NUMBERS, SamplingParams, parse_samplers
from ..speculative import SpecParams
from .protocol import (
    JSON,
    dumps,
    error_body,
    error_response,
    field,
    read_json,
    request_error_response,
)

log = logging.getLogger("powerinfer.server")

PUBLIC_PATHS = {"/health", "/v1/health", "/v1/models", "/models", "/"}   # "/": the page asks for the key


class ServerState:
    """What the routes share: the model (None while loading), settings, and start time."""

    def __init__(self, *, model_path: str, alias: str | None = None, api_keys: list[str] | None = None,
                 n_predict_max: int = -1, timeout: float = 600.0, loader: Callable[[], PowerInfer] | None = None,
                 llm: PowerInfer | None = None, embedding: bool = False, metrics: bool = False, slots: bool = True,
                 webui: bool = True, template_kwargs: dict | None = None, slot_save_path: str | None = None,
                 sampling: SamplingParams | None = None, api_prefix: str = "", context_shift: bool = False,
                 n_keep: int = 0):
        from pathlib import Path

        from .metrics import Metrics
        self.model_path = model_path
        self.model_name = alias or Path(model_path).name
        self.api_keys = [k for k in (api_keys or []) if k]
        self.n_predict_max = n_predict_max
        self.timeout = timeout
        self.loader = loader
        self.llm: PowerInfer | None = llm
        self.load_error: str | None = None
        self.created = int(time.time())
        self.embedding, self.slots, self.webui = embedding, slots, webui   # --embedding, --slots, --webui
        self.slot_save_path = slot_save_path                              # --slot-save-path (POST /slots/N)
        self.template_kwargs = dict(template_kwargs or {})   # --chat-template-kwargs, --reasoning-budget 0
        self.sampling = sampling or SamplingParams()          # the sampling flags: what a request leaves out
        self.api_prefix = api_prefix.rstrip("/")              # --api-prefix: every route under it
        self.context_shift, self.n_keep = context_shift, n_keep   # --context-shift, --keep: a request's defaults
        self.metrics_store = Metrics() if metrics else None               # --metrics
        self.stats = self.metrics_store or Metrics()                      # /slots reads the last requests
        self.ready = threading.Event()
        if llm is not None:
            self.ready.set()

    def readiness(self) -> tuple[int, dict]:
        """(HTTP status, body) of /health: 200 ready, 503 still loading, 500 failed to load or the
        engine's scheduler is not running. Ray Serve's health check asks the same (powerinfer.serve)."""
        if self.llm is None:
            if self.load_error:
                return 500, {"status": "error", "error": error_body(self.load_error, "server_error")["error"]}
            return 503, {"status": "loading model",
                         "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        engine = self.llm.engine
        if engine.thread is None or not engine.thread.is_alive():
            return 500, {"status": "error", "error": error_body("the engine is not running", "server_error")["error"]}
        slots = engine.slots_info()
        busy = sum(1 for s in slots if s["is_processing"])
        return 200, {"status": "ok", "slots_idle": len(slots) - busy, "slots_processing": busy}

    def require(self) -> PowerInfer:
        if self.llm is None:
            if self.load_error:
                raise RequestError(f"the model failed to load: {self.load_error}", code="model_load_failed",
                                   status=500, type="server_error")
            raise RequestError("Loading model", code="loading_model", status=503, type="unavailable_error")
        return self.llm


# ------------------------------------------------------------------------------------------ validation
def sampling_fields(body: dict, defaults: SamplingParams | None = None, keep: tuple[bool, int] | None = None) -> dict:
    """The sampling fields shared by every completion route (llama.cpp names; a field the request leaves out takes
    the server's default: `defaults`, its sampling flags), and the output's grammar (grammar, json_schema or
    response_format). tfs_z and the other options we lack are refused unless off. keep: the server's --context-shift
    and --keep (a full slot drops the older half of its tokens after the first n_keep and goes on; a request's
    n_keep, -1: its whole prompt)."""
    d = defaults or SamplingParams()
    check_unimplemented(body)
    stop = field(body, "stop", "any", None)
    if stop is not None and not (isinstance(stop, str)
                                 or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise RequestError("'stop' must be a string or an array of strings", param="stop")
    seed = field(body, "seed", "int", -1)
    if seed == 0xFFFFFFFF:      # llama.cpp reports "random" as 4294967295
        seed = -1
    if seed < -1:
        raise RequestError("'seed' must be -1 (random) or a non-negative integer", param="seed")
    logit_bias = field(body, "logit_bias", "any", None)
    if logit_bias is None and d.logit_bias:       # the server's -l flags
        logit_bias = {str(k): v for k, v in d.logit_bias.items()}
    if logit_bias is not None and not isinstance(logit_bias, (dict, list)):
        raise RequestError("'logit_bias' must be an object or an array of [token, bias] pairs", param="logit_bias")
    out = dict(
        temperature=float(field(body, "temperature", "num", d.temperature)),
        top_k=field(body, "top_k", "int", d.top_k),
        top_p=float(field(body, "top_p", "num", d.top_p)),
        min_p=float(field(body, "min_p", "num", d.min_p)),
        repeat_penalty=float(field(body, "repeat_penalty", "num", d.repeat_penalty)),
        repeat_last_n=field(body, "repeat_last_n", "int", d.repeat_last_n),
        presence_penalty=float(field(body, "presence_penalty", "num", d.presence_penalty)),
        frequency_penalty=float(field(body, "frequency_penalty", "num", d.frequency_penalty)),
        seed=seed, stop=stop, logit_bias=logit_bias,
        ignore_eos=field(body, "ignore_eos", "bool", d.ignore_eos),
        cache_prompt=field(body, "cache_prompt", "bool", True),
    )
    n_keep = field(body, "n_keep", "int", keep[1] if keep else 0)
    if n_keep < -1:
        raise RequestError("'n_keep' must be -1 (the whole prompt) or >= 0", param="n_keep")
    out.update(context_shift=bool(keep and keep[0]), n_keep=n_keep)
    for name in EXTRA_NUMBERS:
        kind = "int" if SamplingParams.__dataclass_fields__[name].type == "int" else "num"
        v = field(body, name, kind, getattr(d, name))
        out[name] = float(v) if kind == "num" else v
    breakers = field(body, "dry_sequence_breakers", "list", list(d.dry_sequence_breakers))
    if not all(isinstance(b, str) for b in breakers):
        raise RequestError("'dry_sequence_breakers' must be an array of strings", param="dry_sequence_breakers")
    out["dry_sequence_breakers"] = tuple(breakers)
    samplers = body.get("samplers")
    if samplers is None and tuple(d.samplers) != SamplingParams().samplers:
        out["samplers"] = tuple(d.samplers)
    if samplers is not None:
        if not (isinstance(samplers, str)
                or (isinstance(samplers, list) and all(isinstance(x, str) for x in samplers))):
            raise RequestError("'samplers' must be a string of sampler letters or an array of names", param="samplers")
        try:
            out["samplers"] = parse_samplers(samplers if isinstance(samplers, list) else list(samplers))
        except ValueError as e:
            raise RequestError(f"'samplers': {e}", param="samplers") from None
    spec = {k: field(body, f"speculative.{k}", kind, None) for k, kind in (("n_max", "int"), ("n_min", "int"),
                                                                           ("p_min", "num"))}
    out["speculative"] = None
    if any(v is not None for v in spec.values()):     # llama.cpp's per-request draft settings
        d = SpecParams()
        out["speculative"] = SpecParams(*(d.__dict__[k] if v is None else v for k, v in spec.items()))
        try:
            out["speculative"].validate()
        except ValueError as e:
            raise RequestError(f"speculative.*: {e}", param="speculative") from None
    out["lora"] = field(body, "lora", "list", None)    # this request's adapter scales (llama.cpp's [{id, scale}])
    rf = field(body, "response_format", "dict", None)
    out["grammar"] = resolve_grammar(field(body, "grammar", "str", None), field(body, "json_schema", "any", None), rf)
    return out


def speculative_settings(engine, spec: SpecParams | None) -> dict:
    """llama.cpp's generation_settings keys for the draft settings a request runs with (the server's unless it
    gave its own)."""
    s = spec or engine.spec
    p_min = next((p for p in (s.p_min, engine.spec.p_min) if p is not None), 0.75)
    return {"speculative.n_max": s.n_max, "speculative.n_min": s.n_min, "speculative.p_min": p_min}


MAX_CHOICES = 16      # OpenAI's n: choices of one request
MAX_PROMPTS = 256     # /v1/completions: prompts (times n) of one request


def _cap(state: ServerState, n: int) -> int:
    if state.n_predict_max >= 0 and (n < 0 or n > state.n_predict_max):
        return state.n_predict_max
    return n


# ------------------------------------------------------------------------------------------ engine I/O
class EngineStream(StreamingResponse):
    """SSE response whose engine task(s) are cancelled however the response ends (client gone, error)."""

    def __init__(self, content, task: Task | list[Task], llm: PowerInfer):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.tasks = task if isinstance(task, list) else [task]
        self.llm = llm

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            for t in self.tasks:
                if not t.finished:
                    self.llm.engine.cancel(t)


def attach(task: Task, stats=None, q: asyncio.Queue | None = None, index: int | None = None) -> asyncio.Queue:
    """Route the task's engine events into an asyncio queue of this loop (thread-safe handoff): a new one, or `q`
    shared by several tasks, each event then as (index, event); `stats` (server/metrics.py) counts the finished
    request."""
    loop = asyncio.get_running_loop()
    q = asyncio.Queue() if q is None else q
    if stats is not None:
        task.id_task = stats.task_id()

    def emit(ev):
        if stats is not None and ev[0] == "done":
            stats.observe(task, ev[1])
        try:
            loop.call_soon_threadsafe(q.put_nowait, ev if index is None else (index, ev))
        except RuntimeError:     # the loop is closed: nobody is listening any more
            pass
    task.emit = emit
    return q


async def _watch_disconnect(request: Request, llm: PowerInfer, tasks: list[Task]) -> None:
    """Cancel the request's tasks when its client goes away."""
    try:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                if not all(t.finished for t in tasks):
                    log.info("client disconnected; cancelling its request")
                for t in tasks:
                    if not t.finished:
                        llm.engine.cancel(t)
                return
    except Exception:
        return


async def collect(request: Request, llm: PowerInfer, task: Task, on_token: Callable) -> Result:
    """Run a task to completion for a non-streaming response; cancel it if the client goes away."""
    q = attach(task, request.app.state.server.stats)
    llm.engine.submit(task)
    watcher = asyncio.ensure_future(_watch_disconnect(request, llm, [task]))
    try:
        while True:
            ev = await q.get()
            if ev[0] == "token":
                on_token(ev[1], ev[2])
            elif ev[0] == "error":
                raise ev[1]
            else:
                return ev[1]
    finally:
        watcher.cancel()
        if not task.finished:
            llm.engine.cancel(task)


def sse(obj) -> str:
    return f"data: {dumps(obj)}\n\n"


def _stats(request: Request, **kv) -> None:
    request.scope.setdefault("pi_stats", {}).update(kv)


# ------------------------------------------------------------------------------------------ routes
def build_routes(state: ServerState) -> list[Route]:

    async def health(request: Request):
        status, body = state.readiness()
        return JSON(body, status_code=status)

    async def models(request: Request):
        entry = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "powerinfer"}
        llm = state.llm
        if llm is not None:
            hp = llm.model.hparams
            entry["meta"] = {"vocab_type": 1, "n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train,
                             "n_embd": hp.n_embd, "n_params": llm.model.n_params, "size": llm.model.size_bytes,
                             "sparse": llm.model.sparse}
        return JSON({"object": "list", "data": [entry]})

    def generation_settings(llm: PowerInfer, s: dict | None = None, n_predict: int = -1, stream: bool = False,
                            n_probs: int = 0) -> dict:
        s = s or sampling_fields({}, state.sampling, (state.context_shift, state.n_keep))
        bias = s.get("logit_bias")
        return {
            "n_ctx": llm.engine.n_ctx_slot, "n_predict": n_predict, "model": state.model_name,
            "seed": 0xFFFFFFFF if s["seed"] == -1 else s["seed"], "temperature": s["temperature"],
            "top_k": s["top_k"], "top_p": s["top_p"], "min_p": s["min_p"], "repeat_last_n": s["repeat_last_n"],
            "repeat_penalty": s["repeat_penalty"], "presence_penalty": s["presence_penalty"],
            "frequency_penalty": s["frequency_penalty"],
            **{k: s[k] for k in EXTRA_NUMBERS},
            "dry_sequence_breakers": list(s["dry_sequence_breakers"]),
            "samplers": list(s.get("samplers") or SamplingParams().samplers),
            "stop": [s["stop"]] if isinstance(s["stop"], str) else list(s["stop"] or []),
            "ignore_eos": s["ignore_eos"], "stream": stream, "n_probs": n_probs, "cache_prompt": s["cache_prompt"],
            "n_keep": s["n_keep"], "context_shift": s["context_shift"],
            "grammar": s["grammar"].source if s.get("grammar") is not None else "",
            "logit_bias": [[k, (v if math.isfinite(v) else False)] for k, v in llm._logit_bias(bias).items()],
            **speculative_settings(llm.engine, s.get("speculative")),
            "lora": [{"id": i, "scale": scale} for i, (_, scale) in
                     enumerate(llm._lora_request(s.get("lora")) or llm.lora_adapters)],
        }

    async def props(request: Request):
        llm = state.require()
        return JSON({
            "default_generation_settings": generation_settings(llm),
            "total_slots": llm.engine.n_slots,
            "n_ctx": llm.ctx.n_ctx,
            "model_path": state.model_path,
            "model_alias": state.model_name,
            "chat_template": llm.chat_formatter.source,
            "chat_format": llm.chat_formatter.name,
            "modalities": {"vision": False, "audio": False},
            "build_info": f"powerinfer-py {__version__}",
            "sparse": {"enabled": llm.ctx.sparse, "threshold": llm.ctx.sparse_threshold},
            "engine": {"n_decode_calls": llm.engine.n_decode_calls, "max_batch_slots": llm.engine.max_batch_slots,
                       "n_filler_tokens": llm.engine.n_filler_tokens},
        })

    async def tokenize(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        content = field(body, "content", "str")
        add_special = field(body, "add_special", "bool", False)
        parse_special = field(body, "parse_special", "bool", True)
        with_pieces = field(body, "with_pieces", "bool", False)
        def work() -> bytes:      # long texts: off the event loop, the JSON rendering included
            toks = llm.tokenizer.encode(content, add_special=add_special, parse_special=parse_special)
            if not with_pieces:
                return dumps({"tokens": toks}).encode("utf-8")
            out = []
            for t in toks:
                b = llm.tokenizer.token_to_piece(t)
                try:
                    piece: Any = b.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(b)
                out.append({"id": t, "piece": piece})
            return dumps({"tokens": out}).encode("utf-8")
        return Response(await run_in_threadpool(work), media_type="application/json")

    async def detokenize(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        toks = field(body, "tokens", "list")
        n = llm.model.n_vocab

        def work() -> bytes:      # long token lists: off the event loop
            for t in toks:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise RequestError("'tokens' must be an array of integers", param="tokens")
                if not 0 <= t < n:
                    raise RequestError(f"token {t} is out of range [0, {n})", param="tokens")
            return dumps({"content": llm.detokenize(toks)}).encode("utf-8")
        return Response(await run_in_threadpool(work), media_type="application/json")

    # ---- native completion
    def n_predict_field(body: dict) -> int:
        n_predict = field(body, "n_predict", "int", -1, aliases=("max_tokens",))
        if n_predict < -1:
            raise RequestError("'n_predict' must be >= -1 (-1: no limit)", param="n_predict")
        return _cap(state, n_predict)

    async def completion(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        bodies = prompt_bodies(body)     # llama.cpp's array of prompts: an array of results (a stream of chunks), each
        jobs = []                        # with its index
        for i, b in enumerate(bodies):
            prompt = field(b, "prompt", "any")
            tokens = await run_in_threadpool(llm.tokenize_prompt, prompt)     # long prompts: off the event loop
            jobs.append(native_job(request, llm, b, tokens, prompt if isinstance(prompt, str) else None, i))
        return await native_completion(request, llm, jobs, many=len(bodies) > 1)

    async def infill(request: Request):
        """llama.cpp's /infill: input_prefix, input_suffix, input_extra [{filename, text}], prompt (after FIM_MID),
        and every /completion option; the FIM prompt of powerinfer.infill (PowerInfer.infill_prompt: trimmed to the
        slot's context less n_predict, less half of it where n_predict is -1; 501 where the model has no FIM tokens)."""
        llm = state.require()
        body = await read_json(request, state)
        prefix = field(body, "input_prefix", "str", "")
        suffix = field(body, "input_suffix", "str", "")
        prompt = field(body, "prompt", "str", "")
        extra = field(body, "input_extra", "list", [])
        for i, chunk in enumerate(extra):
            if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) or \
                    not isinstance(chunk.get("filename", "tmp"), str):
                raise RequestError(f"input_extra[{i}] must be an object with string 'text' and 'filename'",
                                   param="input_extra")
        tokens = await run_in_threadpool(lambda: llm.infill_prompt(prefix, suffix, extra, prompt,
                                                                   max_tokens=n_predict_field(body)))
        return await native_completion(request, llm, [native_job(request, llm, body, tokens, None)])

    def native_job(request: Request, llm: PowerInfer, body: dict, tokens: list[int], prompt_text: str | None,
                   index: int = 0) -> SimpleNamespace:
        """One /completion prompt's task and the shapes of its chunks and result (prompt_text: the request's text,
        None: the tokens' text; index: its place among the request's prompts)."""
        if field(body, "n_cmpl", "int", 1) != 1:
            raise RequestError("'n_cmpl' above 1 is served on /v1/completions and /v1/chat/completions (as n), not on "
                               "/completion", param="n_cmpl", code="not_supported")
        n_predict = n_predict_field(body)
        n_probs = field(body, "n_probs", "int", 0)
        if not 0 <= n_probs <= 100:
            raise RequestError("'n_probs' must be in [0, 100]", param="n_probs")
        stream = field(body, "stream", "bool", False)
        return_tokens = field(body, "return_tokens", "bool", False)
        s = sampling_fields(body, state.sampling, (state.context_shift, state.n_keep))
        task = llm.make_task(tokens, max_tokens=n_predict, n_probs=n_probs, **s)
        settings = generation_settings(llm, s, n_predict, stream, n_probs)
        if prompt_text is None:   # after make_task, which refuses ids out of the vocabulary
            prompt_text = llm.detokenize(tokens)
        tok = llm.tokenizer

        def probs(info) -> list:
            if info is None or "top" not in info:
                return []

            def entry(t, lp):
                b = tok.token_to_piece(t)
                return {"id": t, "token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}
            e = entry(info["id"], info["logprob"])
            e["top_logprobs"] = [entry(t, lp) for t, lp in info["top"]]
            return [e]

        def chunk(text: str, info) -> dict:
            out = {"index": index, "content": text, "tokens": [], "stop": False, "id_slot": -1, "multimodal": False}
            if n_probs:
                out["completion_probabilities"] = probs(info)
            return out

        def final(res: Result, content: str, all_probs: list) -> dict:
            out = {
                "index": index, "content": content, "tokens": res.tokens if return_tokens else [],
                "id_slot": res.slot, "stop": True,
                "model": state.model_name, "tokens_predicted": res.n_predicted, "tokens_evaluated": res.n_prompt,
                "generation_settings": settings, "prompt": prompt_text, "has_new_line": "\n" in res.text,
                "truncated": res.truncated, "stopped_eos": res.stop_type == "eos",
                "stopped_word": res.stop_type == "word", "stopped_limit": res.stop_type == "limit",
                "stop_type": res.stop_type, "stopping_word": res.stopping_word, "tokens_cached": res.n_past,
                "timings": res.timings(),
            }
            if n_probs:
                out["completion_probabilities"] = all_probs
            return out
        return SimpleNamespace(task=task, stream=stream, n_probs=n_probs, probs=probs, chunk=chunk, final=final)

    async def native_completion(request: Request, llm: PowerInfer, jobs: list, many: bool = False):
        """/completion's response for its prompts' jobs (native_job): one result, or with `many` an array of them;
        streamed: the jobs' chunks as they come, each with its index, and each job's final chunk."""
        _stats(request, prompt=sum(len(j.task.prompt_tokens) for j in jobs))
        if jobs[0].stream:
            q: asyncio.Queue = asyncio.Queue()
            for i, j in enumerate(jobs):
                attach(j.task, state.stats, q, index=i)
            for j in jobs:
                llm.engine.submit(j.task)

            async def events():
                left, predicted = len(jobs), 0
                while left:
                    i, ev = await q.get()
                    if ev[0] == "token":
                        yield sse(jobs[i].chunk(ev[1], ev[2]))
                    elif ev[0] == "error":
                        yield sse(_error_of(ev[1]))
                        return
                    else:
                        left, predicted = left - 1, predicted + ev[1].n_predicted
                        _stats(request, predicted=predicted)
                        yield sse(jobs[i].final(ev[1], "", []))
            return EngineStream(events(), [j.task for j in jobs], llm)

        async def one(j):
            all_probs: list = []
            res = await collect(request, llm, j.task,
                                lambda text, info: all_probs.extend(j.probs(info)) if j.n_probs else None)
            return j.final(res, res.text, all_probs)
        results = await asyncio.gather(*(one(j) for j in jobs))
        _stats(request, predicted=sum(r["tokens_predicted"] for r in results))
        return JSON(results if many else results[0])

    # ---- OpenAI
    def openai_common(body: dict, llm: PowerInfer) -> tuple[dict, bool, bool]:
        llm.check_model_name(field(body, "model", "str", None))
        n_choices(body)
        stream = field(body, "stream", "bool", False)
        opts = field(body, "stream_options", "dict", {})
        include_usage = bool(opts.get("include_usage", False))
        return sampling_fields(body, state.sampling, (state.context_shift, state.n_keep)), stream, include_usage

    def n_choices(body: dict) -> int:
        n = field(body, "n", "int", 1, aliases=("n_cmpl",))      # n_cmpl: llama.cpp's newer name
        if not 1 <= n <= MAX_CHOICES:
            raise RequestError(f"'n' must be in [1, {MAX_CHOICES}]", param="n")
        return n

    def choice_bodies(body: dict, llm: PowerInfer) -> list[dict]:
        """The bodies of a request's n choices: each its own seed (the request's or the server's + i; random ones
        stay random), so seeded choices differ and repeat."""
        n = n_choices(body)
        base = field(body, "seed", "int", -1)
        base = llm.seed if base in (-1, 0xFFFFFFFF) else base
        return [body if i == 0 or base is None or base < 0 else {**body, "seed": base + i} for i in range(n)]

    def max_tokens_field(body: dict, default):
        mt = field(body, "max_tokens", "int", default, aliases=("max_completion_tokens", "n_predict"))
        if mt is not None and mt <= 0:
            raise RequestError(f"'max_tokens' must be at least 1, got {mt}", param="max_tokens")
        return mt

    async def run_openai(request: Request, llm: PowerInfer, task: Task, shaper: CompletionShaper, stream: bool,
                         include_usage: bool):
        _stats(request, prompt=len(task.prompt_tokens))
        if stream:
            q = attach(task, state.stats)
            llm.engine.submit(task)

            async def events():
                for c in shaper.start_chunks():
                    yield sse(c)
                while True:
                    ev = await q.get()
                    if ev[0] == "token":
                        c = shaper.token_chunk(ev[1], ev[2])
                        if c is not None:
                            yield sse(c)
                    elif ev[0] == "error":
                        yield sse(_error_of(ev[1]))
                        break
                    else:
                        _stats(request, predicted=ev[1].n_predicted)
                        for c in shaper.final_chunks(ev[1], include_usage):
                            yield sse(c)
                        break
                yield "data: [DONE]\n\n"
            return EngineStream(events(), task, llm)
        res = await collect(request, llm, task, shaper.add)
        _stats(request, predicted=res.n_predicted)
        out = shaper.response(res)
        out["timings"] = res.timings()
        return JSON(out)

    def prompt_bodies(body: dict) -> list[dict]:
        """A completion's prompt: one (a string or token ids), or a list of them (strings, token-id lists), one body
        each, whose results come in that order (OpenAI's /v1/completions, llama.cpp's /completion; lm-evaluation-harness
        batches requests so)."""
        prompt = body.get("prompt")
        many = isinstance(prompt, list) and len(prompt) > 1 and \
            all(isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                                                         for t in p)) for p in prompt)
        if not many:
            return [body]
        if len(prompt) * n_choices(body) > MAX_PROMPTS:
            raise RequestError(f"at most {MAX_PROMPTS} prompts (times n) per request", param="prompt")
        return [{**body, "prompt": p} for p in prompt]

    async def v1_completions(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        bodies = prompt_bodies(body)
        pairs = [await completion_task(llm, c) for b in bodies for c in choice_bodies(b, llm)]
        return await run_openai_n(request, llm, pairs, pairs[0][2], pairs[0][3], n_prompts=len(bodies))

    async def completion_task(llm: PowerInfer, body: dict) -> tuple[Task, CompletionShaper, bool, bool]:
        """The engine task and response shaper of a /v1/completions body."""
        s, stream, include_usage = openai_common(body, llm)
        suffix = field(body, "suffix", "str", "")
        max_tokens = _cap(state, max_tokens_field(body, 16))
        if suffix:   # an insertion: the prompt is the text before it (the model's FIM tokens)
            prompt = field(body, "prompt", "str")
            tokens = await run_in_threadpool(lambda: llm.infill_prompt(prompt, suffix, max_tokens=max_tokens,
                                                                       param="suffix"))
        else:
            tokens = await run_in_threadpool(llm.tokenize_prompt, field(body, "prompt", "any"))
        logprobs = field(body, "logprobs", "int", None)
        if logprobs is not None and not 0 <= logprobs <= 20:
            raise RequestError("'logprobs' must be in [0, 20]", param="logprobs")
        echo = field(body, "echo", "bool", False)
        prompt_lp = bool(echo and logprobs is not None)
        if prompt_lp and stream:
            raise RequestError("'echo' with 'logprobs' is not supported when streaming", param="echo")
        task = llm.make_task(tokens, max_tokens=max_tokens, n_probs=0 if logprobs is None else max(1, logprobs),
                             prompt_logprobs=prompt_lp, **s)
        prompt = body["prompt"]
        prefix = ((prompt if isinstance(prompt, str) else llm.detokenize(tokens)) if echo else "")
        shaper = CompletionShaper("text", state.model_name, prefix=prefix, logprobs=logprobs, tokenizer=llm.tokenizer)
        return task, shaper, stream, include_usage

    async def v1_chat(request: Request):
        llm = state.require()
        body = await read_json(request, state)
        pairs = [await chat_task(llm, b) for b in choice_bodies(body, llm)]
        return await run_openai_n(request, llm, pairs, pairs[0][2], pairs[0][3])

    async def run_openai_n(request: Request, llm: PowerInfer, pairs: list, stream: bool, include_usage: bool,
                           n_prompts: int = 1):
        """run_openai for n choices (OpenAI's `n`) of n_prompts prompts (pairs: each prompt's n in turn): the tasks run
        side by side (each in a slot as one frees), their responses merged into one with choices 0.. in that order
        (usage: each prompt once, every completion's tokens)."""
        if len(pairs) == 1:
            return await run_openai(request, llm, pairs[0][0], pairs[0][1], stream, include_usage)
        tasks = [p[0] for p in pairs]
        shapers = [p[1] for p in pairs]
        q: asyncio.Queue = asyncio.Queue()
        for i, t in enumerate(tasks):
            attach(t, state.stats, q, i)
        n = len(tasks) // n_prompts                 # choices per prompt
        _stats(request, prompt=sum(len(t.prompt_tokens) for t in tasks[::n]))
        for t in tasks:
            llm.engine.submit(t)

        def indexed(chunk, i):
            for ch in chunk.get("choices", []):
                ch["index"] = i
            return chunk

        def merged_usage(results):
            u = CompletionShaper.usage(results[0])
            u["prompt_tokens"] = sum(r.n_prompt for r in results[::n])
            u["completion_tokens"] = sum(r.n_predicted for r in results)
            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
            return u

        if stream:
            async def events():
                for i, sh in enumerate(shapers):
                    for c in sh.start_chunks():
                        yield sse(indexed(c, i))
                results: dict[int, Result] = {}
                while len(results) < len(tasks):
                    i, ev = await q.get()
                    if ev[0] == "token":
                        c = shapers[i].token_chunk(ev[1], ev[2])
                        if c is not None:
                            yield sse(indexed(c, i))
                    elif ev[0] == "error":
                        yield sse(_error_of(ev[1]))
                        break
                    else:
                        results[i] = ev[1]
                        for c in shapers[i].final_chunks(ev[1], False):
                            yield sse(indexed(c, i))
                if len(results) == len(tasks):
                    _stats(request, predicted=sum(r.n_predicted for r in results.values()))
                    if include_usage:
                        yield sse(shapers[0]._chunk(None, usage=merged_usage([results[i] for i in range(len(tasks))])))
                yield "data: [DONE]\n\n"
            return EngineStream(events(), tasks, llm)
        watcher = asyncio.ensure_future(_watch_disconnect(request, llm, tasks))
        results: dict[int, Result] = {}
        try:
            while len(results) < len(tasks):
                i, ev = await q.get()
                if ev[0] == "token":
                    shapers[i].add(ev[1], ev[2])
                elif ev[0] == "error":
                    raise ev[1]
                else:
                    results[i] = ev[1]
        finally:
            watcher.cancel()
            for t in tasks:
                if not t.finished:
                    llm.engine.cancel(t)
        res = [results[i] for i in range(len(tasks))]
        _stats(request, predicted=sum(r.n_predicted for r in res))
        out = shapers[0].response(res[0])
        out["choices"] = [indexed(sh.response(r), i)["choices"][0] for i, (sh, r) in enumerate(zip(shapers, res))]
        out["usage"] = merged_usage(res)
        return JSON(out)

    async def chat_task(llm: PowerInfer, body: dict) -> tuple[Task, CompletionShaper, bool, bool]:
        """The engine task and response shaper of a /v1/chat/completions body (also /v1/responses' after its
        translation: server/responses.py)."""
        s, stream, include_usage = openai_common(body, llm)
        messages = field(body, "messages", "list")
        if body.get("functions") or body.get("function_call") is not None:
            raise RequestError("the legacy 'functions' / 'function_call' are not supported; use 'tools'",
                               param="functions", code="not_supported")
        tc = llm.tool_calls(field(body, "tools", "list", None), body.get("tool_choice"),
                            body.get("parallel_tool_calls"))
        if tc is not None:
            if s["grammar"] is not None:
                raise RequestError("tools and a grammar / response_format cannot be combined", param="tools")
        max_tokens = _cap(state, max_tokens_field(body, None) or -1)     # no max_tokens: until EOS / full slot
        logprobs = field(body, "logprobs", "bool", False)
        top_logprobs = field(body, "top_logprobs", "int", 0)
        if not 0 <= top_logprobs <= 20:
            raise RequestError("'top_logprobs' must be in [0, 20]", param="top_logprobs")
        kwargs = {**state.template_kwargs, **field(body, "chat_template_kwargs", "dict", {})}
        if tc is not None:
            messages = llm.tool_messages(messages, tc, kwargs)
        prompt_text, tokens, extra_stops, stop_ids = await run_in_threadpool(llm.chat_prompt, messages, **kwargs)
        if tc is not None:
            tc.after_prompt(prompt_text)
            s["grammar"] = tc.grammar
        reasoning = splitter_for(field(body, "reasoning_format", "str", llm.reasoning_format), prompt_text)
        stop = s.pop("stop")
        stop = ([stop] if isinstance(stop, str) else list(stop or [])) + extra_stops
        n_lp = top_logprobs if logprobs else None
        task = llm.make_task(tokens, max_tokens=max_tokens, stop=stop, stop_token_ids=stop_ids,
                             n_probs=0 if n_lp is None else max(1, n_lp), preserved_ids=llm.chat_preserved_ids, **s)
        shaper = CompletionShaper("chat", state.model_name, logprobs=n_lp, tokenizer=llm.tokenizer, tools=tc,
                                  reasoning=reasoning)
        return task, shaper, stream, include_usage

    async def apply_template(request: Request):
        """llama.cpp's /apply-template: the chat template's text for `messages` (with the generation prompt; tools and
        chat_template_kwargs as /v1/chat/completions takes them), no inference: {"prompt": text}."""
        llm = state.require()
        body = await read_json(request, state)
        messages = field(body, "messages", "list")
        kwargs = {**state.template_kwargs, **field(body, "chat_template_kwargs", "dict", {})}
        tc = llm.tool_calls(field(body, "tools", "list", None), body.get("tool_choice"))
        if tc is not None:
            messages = llm.tool_messages(messages, tc, kwargs)
        text = (await run_in_threadpool(llm.chat_prompt, messages, **kwargs))[0]
        return JSON({"prompt": text})

    async def index(request: Request):
        if not state.webui:
            raise HTTPException(404, "Not Found (the web page is off: --no-webui)")
        return Response(_index_html(), media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-cache"})

    from . import embeddings, lora_adapters, messages, metrics, ollama, responses, slot_files
    return embeddings.routes(state) + metrics.routes(state) + slot_files.routes(state) + lora_adapters.routes(state) + \
        responses.routes(state, chat_task) + messages.routes(state, chat_task) + ollama.routes(state, chat_task) + [
        Route("/", index, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/props", props, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/completion", completion, methods=["POST"]),
        Route("/completions", completion, methods=["POST"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/v1/completions", v1_completions, methods=["POST"]),
        Route("/v1/chat/completions", v1_chat, methods=["POST"]),
        Route("/chat/completions", v1_chat, methods=["POST"]),
    ]


def _index_html() -> bytes:
    from pathlib import Path
    return (Path(__file__).parent / "static" / "index.html").read_bytes()


def _error_of(e: Exception) -> dict:
    if isinstance(e, RequestError):
        return error_body(e.message, e.type, e.code, e.param)
    return error_body(f"{type(e).__name__}: {e}", "server_error", "internal_error")


# ------------------------------------------------------------------------------------------ middleware
class RequestLog:
    """One log line per request: method, path, status, wall time, prompt / predicted tokens."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = [0]
        stats = scope.setdefault("pi_stats", {})

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)
        try:
            await self.app(scope, receive, send_)
        finally:
            ms = (time.perf_counter() - t0) * 1e3
            extra = ""
            if "prompt" in stats:
                extra = f" prompt={stats['prompt']} predicted={stats.get('predicted', 0)}"
            log.info("request: %s %s %d %.1f ms%s", scope.get("method", "?"), scope.get("path", "?"),
                     status[0] or 500, ms, extra)


class APIKeyAuth:
    """Authorization: Bearer <key> (or x-api-key: <key>) on every route but the public ones (and CORS preflights)."""

    def __init__(self, app, keys: list[str]):
        self.app = app
        self.keys = set(keys)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.keys and scope.get("method") != "OPTIONS" \
                and scope.get("path") not in PUBLIC_PATHS:
            auth, x_key = "", ""
            for k, v in scope.get("headers", []):
                if k == b"authorization":
                    auth = v.decode("latin-1")
                elif k == b"x-api-key":     # Anthropic's clients (server/messages.py); taken on every route
                    x_key = v.decode("latin-1").strip()
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if token not in self.keys and x_key not in self.keys:
                from .messages import PATHS, error_response as anthropic_error
                headers = {"WWW-Authenticate": "Bearer"}
                resp = anthropic_error(401, "Invalid API Key", headers) if scope.get("path") in PATHS else \
                    error_response(401, "Invalid API Key", "authentication_error", "invalid_api_key", headers=headers)
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


class ApiPrefix:
    """llama.cpp's --api-prefix: every route is served under the prefix (behind a reverse proxy), nothing outside it."""

    def __init__(self, app, prefix: str):
        self.app, self.prefix = app, prefix

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path != self.prefix and not path.startswith(self.prefix + "/"):
            resp = error_response(404, f"Not Found: {path} (this server's routes are under {self.prefix})",
                                  "not_found_error", "not_found")
            return await resp(scope, receive, send)
        scope = dict(scope, path=path[len(self.prefix):] or "/", root_path=scope.get("root_path", "") + self.prefix)
        return await self.app(scope, receive, send)


# ------------------------------------------------------------------------------------------ app
def create_app(state: ServerState) -> Starlette:
    """The ASGI app. With `state.loader`, the model is loaded in a background thread at startup
    (routes answer 503 meanwhile); with `state.llm`, it is served at once."""

    async def on_request_error(request: Request, e: RequestError):
        return request_error_response(e)

    async def on_http_error(request: Request, e: HTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(e.status_code, "invalid_request_error")
        return error_response(e.status_code, f"{e.detail}: {request.method} {request.url.path}", kind,
                              {404: "not_found", 405: "method_not_allowed"}.get(e.status_code))

    async def on_error(request: Request, e: Exception):
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(e).__name__}: {e}", "server_error", "internal_error",
                              headers={"x-should-retry": "false"})

    def load():
        try:
            llm = state.loader()
            llm.engine.start()
            state.llm = llm
            log.info("server: model loaded; ready")
        except Exception as e:   # reported by /health and the routes; the CLI exits on it
            state.load_error = f"{type(e).__name__}: {e}"
            log.error("server: failed to load the model: %s", state.load_error)
        finally:
            state.ready.set()

    @asynccontextmanager
    async def lifespan(app):
        if state.llm is None and state.loader is not None:
            threading.Thread(target=load, name="powerinfer-load", daemon=True).start()
        elif state.llm is not None:
            state.llm.engine.start()
        try:
            yield
        finally:
            if state.llm is not None and state.llm.engine is not None:
                state.llm.engine.stop()

    middleware = [Middleware(ApiPrefix, prefix=state.api_prefix)] if state.api_prefix else []
    middleware += [
        Middleware(RequestLog),
        Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]),
        Middleware(APIKeyAuth, keys=state.api_keys),
    ]
    app = Starlette(routes=build_routes(state), middleware=middleware, lifespan=lifespan,
                    exception_handlers={RequestError: on_request_error, HTTPException: on_http_error,
                                        Exception: on_error})
    app.state.server = state
    return app
