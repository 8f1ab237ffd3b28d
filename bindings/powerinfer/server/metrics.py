"""GET /metrics (Prometheus text, with --metrics) and GET /slots (on by default, --no-slots), as
llama.cpp's server has them.

/metrics names are llama.cpp's (`llamacpp:` prefix), where ours map:
    counter  prompt_tokens_total             prompt tokens evaluated (cache hits excluded, embedding inputs included)
    counter  prompt_seconds_total            seconds spent on them
    counter  tokens_predicted_total          generated tokens
    counter  tokens_predicted_seconds_total  seconds spent generating
    counter  n_decode_total                  decode calls of the completion engine
    gauge    prompt_tokens_seconds           prompt tokens / s, since the last /metrics call (llama.cpp's bucket)
    gauge    predicted_tokens_seconds        generated tokens / s, since the last /metrics call
    gauge    requests_processing             requests in a slot now
    gauge    requests_deferred               requests waiting for a free slot
plus `powerinfer:requests_total` (finished requests; llama.cpp has no such counter). llama.cpp's
n_tokens_max and n_busy_slots_per_decode are not reported (the engine does not count them).

/slots is llama.cpp's list: id, id_task, n_ctx, speculative, is_processing, and for a slot that has run
a request, that request's params, next_token {has_next_token, has_new_line, n_remain, n_decoded,
stopping_word}, prompt (the slot's cached tokens as text), n_past and n_cached (= tokens_cached).
`?fail_on_no_slot=1` answers 503 when no slot is idle.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..request import RequestError, Result, Task
from ..sampling import EXTRA_NUMBERS
from .protocol import JSON, error_response

if TYPE_CHECKING:
    from .app import ServerState


class Metrics:
    """Counters fed by every finished server request (app.attach) and embedding request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.t_start = int(time.time())
        self.n_prompt = self.n_predicted = self.n_requests = 0
        self.t_prompt = self.t_predicted = 0.0          # seconds
        self._bucket = [0, 0.0, 0, 0.0]                  # since the last /metrics: prompt n, s, predicted n, s
        self.last_task: dict[int, tuple[Task, Result]] = {}   # slot -> its last request, how it ended (/slots)
        self._ids = itertools.count()

    def task_id(self) -> int:
        return next(self._ids)

    def observe(self, task: Task, res: Result) -> None:
        pn = res.n_prompt - res.n_cached
        with self.lock:
            self.n_requests += 1
            self.n_prompt += pn
            self.t_prompt += res.prompt_ms / 1e3
            self.n_predicted += res.n_predicted
            self.t_predicted += res.predicted_ms / 1e3
            b = self._bucket
            b[0] += pn
            b[1] += res.prompt_ms / 1e3
            b[2] += res.n_predicted
            b[3] += res.predicted_ms / 1e3
            if res.slot >= 0:
                self.last_task[res.slot] = (task, res)

    def add_prompt(self, n: int, seconds: float = 0.0) -> None:
        with self.lock:
            self.n_prompt += n
            self.t_prompt += seconds
            self._bucket[0] += n
            self._bucket[1] += seconds

    def render(self, engine) -> str:
        with self.lock:
            pn, ps, gn, gs = self._bucket
            self._bucket = [0, 0.0, 0, 0.0]
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed.", self.n_prompt),
                ("prompt_seconds_total", "Prompt process time", self.t_prompt),
                ("tokens_predicted_total", "Number of generation tokens processed.", self.n_predicted),
                ("tokens_predicted_seconds_total", "Predict process time", self.t_predicted),
                ("n_decode_total", "Total number of llama_decode() calls", engine.n_decode_calls),
            ]
            n_requests = self.n_requests
        busy = sum(1 for s in engine.slots_info() if s["is_processing"])
        with engine.cond:
            deferred = len(engine.pending)
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", pn / ps if ps > 0 else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s.", gn / gs if gs > 0 else 0.0),
            ("requests_processing", "Number of requests processing.", busy),
            ("requests_deferred", "Number of requests deferred.", deferred),
        ]
        out = []
        for kind, rows in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in rows:
                out += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}",
                        f"llamacpp:{name} {_num(value)}"]
        out += ["# HELP powerinfer:requests_total Number of requests finished (or cancelled).",
                "# TYPE powerinfer:requests_total counter", f"powerinfer:requests_total {n_requests}"]
        return "\n".join(out) + "\n"


def _num(v) -> str:
    return str(int(v)) if isinstance(v, int) else repr(float(v))


def _params(task: Task, model_name: str, n_ctx: int) -> dict:
    p = task.params
    return {
        "n_predict": task.n_predict, "seed": 0xFFFFFFFF if p.seed == -1 else p.seed, "temperature": p.temperature,
        "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repeat_penalty, "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty, "stop": list(task.stop), "ignore_eos": p.ignore_eos,
        "n_probs": task.n_probs, "cache_prompt": task.cache_prompt, "model": model_name, "n_ctx": n_ctx,
        **{k: getattr(p, k) for k in EXTRA_NUMBERS},
        "dry_sequence_breakers": list(p.dry_sequence_breakers), "samplers": list(p.samplers),
    }


def slots_json(state: ServerState, llm) -> list[dict]:
    engine, tok = llm.engine, llm.tokenizer
    last = state.stats.last_task
    out = []
    for s in list(engine.slots):
        task, res = s.task, s.result            # a snapshot: the engine thread may move on meanwhile
        busy = task is not None
        if busy:
            res = res or Result()
        else:
            task, res = last.get(s.id, (None, None))
        entry = {"id": s.id, "id_task": getattr(task, "id_task", -1), "n_ctx": s.n_ctx,
                 "speculative": engine.drafter is not None,
                 "is_processing": busy, "state": 1 if busy else 0}
        if task is not None:
            n_dec = res.n_predicted
            entry["params"] = _params(task, state.model_name, s.n_ctx)
            entry["next_token"] = {
                "has_next_token": busy, "has_new_line": "\n" in res.text,
                "n_remain": task.n_predict - n_dec if task.n_predict >= 0 else -1, "n_decoded": n_dec,
                "stopping_word": res.stopping_word}
        cache = list(s.cache)
        entry["n_past"] = s.n_past if busy else len(cache)
        entry["n_cached"] = entry["tokens_cached"] = len(cache)
        entry["prompt"] = tok.decode(cache) if cache else ""
        out.append(entry)
    return out


def routes(state: ServerState) -> list[Route]:

    async def metrics(request: Request):
        if state.metrics_store is None:
            return error_response(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                                  "not_supported_error", 501)
        llm = state.require()
        return Response(state.metrics_store.render(llm.engine), media_type="text/plain; version=0.0.4",
                        headers={"Process-Start-Time-Unix": str(state.metrics_store.t_start)})

    async def slots(request: Request):
        if not state.slots:
            return error_response(501, "This server does not support slots endpoint. Start it with `--slots`",
                                  "not_supported_error", 501)
        llm = state.require()
        info = slots_json(state, llm)
        fail = request.query_params.get("fail_on_no_slot", "")
        if fail not in ("", "0", "false") and all(s["is_processing"] for s in info):
            raise RequestError("no slot available", code=503, status=503, type="unavailable_error")
        return JSON(info)

    return [Route("/metrics", metrics, methods=["GET"]), Route("/slots", slots, methods=["GET"])]
