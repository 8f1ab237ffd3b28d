"""A request of the Engine: Task (what to generate, and the emit callback its events go to), Result
(how it ended), the errors the server reports for requests it cannot run (RequestError,
ContextLengthExceeded), TaskEvents (a task's events as an iterator, for callers that step the
engine themselves or wait for its thread) and common_prefix (how much of a cached sequence a new one reuses)."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .sampling import Sampler, SamplingParams

__all__ = ["ContextLengthExceeded", "RequestError", "Result", "Task", "TaskEvents", "common_prefix"]


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists (a slot's cache and a prompt, a drafter's cache and
    a sequence, a prompt-cache file and a prompt): C-speed comparisons, no Python loop over the tokens."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return int(np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))[0])


class RequestError(ValueError):
    """A request the engine cannot run, with the OpenAI error fields the server reports."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, code: str | None = "invalid_request_error", param: str | None = None,
                 status: int | None = None, type: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type


class ContextLengthExceeded(RequestError):
    def __init__(self, message: str, param: str | None = "prompt"):
        super().__init__(message, code="context_length_exceeded", param=param)


@dataclass
class Result:
    """How a request ended."""
    text: str = ""
    tokens: list = field(default_factory=list)   # generated token ids (end-of-generation token excluded)
    stop_type: str = "none"         # "eos" | "word" | "limit" | "none" (cancelled / n_predict == 0)
    stopping_word: str = ""
    truncated: bool = False         # stopped because the slot's context was full
    n_prompt: int = 0               # prompt tokens
    n_cached: int = 0               # prompt tokens reused from the slot's cache
    n_predicted: int = 0
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    slot: int = -1
    n_past: int = 0                 # tokens of this request in the slot's KV at the end
    prompt_probs: list = field(default_factory=list)   # Task.prompt_logprobs: {"id", "logprob", "top"} per token
    eog_token: int = -1             # the end-of-generation token that ended it (not in tokens); -1: none
    n_shifts: int = 0               # context shifts (Task.context_shift)
    n_drafted: int = 0              # speculative decoding: draft tokens evaluated
    n_draft_accepted: int = 0       # ... of which the sampled tokens kept

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stop_type in ("eos", "word") else "length"

    def timings(self) -> dict:
        pn, pm, gn, gm = self.n_prompt - self.n_cached, self.prompt_ms, self.n_predicted, self.predicted_ms
        return {
            "cache_n": self.n_cached,
            "prompt_n": pn, "prompt_ms": pm,
            "prompt_per_token_ms": pm / pn if pn else 0.0,
            "prompt_per_second": 1e3 * pn / pm if pm > 0 else 0.0,
            "predicted_n": gn, "predicted_ms": gm,
            "predicted_per_token_ms": gm / gn if gn else 0.0,
            "predicted_per_second": 1e3 * gn / gm if gm > 0 else 0.0,
            **({"draft_n": self.n_drafted, "draft_n_accepted": self.n_draft_accepted} if self.n_drafted else {}),
        }


class Task:
    """One completion request.

    emit(event) is called from the engine's thread with ("token", text, info) for each piece of
    text (info: {"id": token id, "logprob", "top", "piece"} with n_probs, else None), then exactly
    one of ("done", Result) or ("error", RequestError/Exception). A cancelled task gets ("done",
    Result) with stop_type "none". want_ids: an event for every token, info {"id": ...} at least.
    sampler: use this Sampler (its history and random state go on) instead of a new one of params.
    grammar: a powerinfer.grammar.Grammar the output must match (constrained decoding; the request
    ends, stop_type "eos", once the grammar is complete). logits_processor: callables
    (input_ids int32 [n], scores float32 [n_vocab]) -> scores, applied in order before sampling;
    stopping_criteria: callables (input_ids, scores) -> bool, checked after each token (stop_type
    "word" when one says True) -- llama-cpp-python's, input_ids = prompt + generated tokens.
    hide_stop: see StopMatcher's hide (False: main.py's reverse prompts, the text passes on at once).
    context_shift: a full slot keeps the first n_keep tokens, drops the older half of the others
    (`shift_tokens`) and goes on, instead of ending (llama.cpp's --context-shift / --keep).
    prompt_from: a task with the same prompt tokens, submitted before this one: in an engine without
    regions, this task's prompt is not evaluated but its KV cells are shared (kv_seq_cp) once
    prompt_from's prompt is, and its first token is sampled from the same logits (batched.py).
    speculative: SpecParams for this request's draft tokens (None: the engine's; n_max 0: no drafts).
    lora: the (powerinfer.lora.LoraAdapter, scale) pairs this request runs with (None: the engine's `lora`); a
    decode step holds the requests of one set only, and a slot's cache is reused under the same set alone.
    preserved_ids: control tokens whose text the output shows (a chat format's markers, llama.cpp's preserved
    tokens; other control tokens render as nothing).
    """

    def __init__(self, prompt_tokens: list[int], params: SamplingParams, *, n_predict: int = -1,
                 stop: list[str] | None = None, stop_token_ids=(), cache_prompt: bool = True, n_probs: int = 0,
                 emit: Callable | None = None, want_ids: bool = False, sampler: Sampler | None = None,
                 grammar=None, logits_processor=None, stopping_criteria=None, prompt_logprobs: bool = False,
                 hide_stop: bool = True, context_shift: bool = False, n_keep: int = 0,
                 prompt_from: Task | None = None, speculative=None, lora: tuple | None = None, preserved_ids=()):
        self.prompt_tokens = list(prompt_tokens)
        self.params = params
        self.n_predict = n_predict
        self.stop = [s for s in (stop or []) if s]
        self.stop_token_ids = set(int(t) for t in stop_token_ids)
        self.preserved_ids = frozenset(int(t) for t in preserved_ids)
        self.cache_prompt = cache_prompt
        self.n_probs = n_probs
        self.want_ids = want_ids
        self.sampler = sampler
        self.grammar = grammar
        self.logits_processor = list(logits_processor or [])
        self.stopping_criteria = list(stopping_criteria or [])
        self.hide_stop = hide_stop
        self.context_shift = context_shift
        self.n_keep = n_keep
        self.prompt_from = prompt_from
        self.speculative = speculative        # a powerinfer.speculative.SpecParams; None: the engine's
        self.lora = None if lora is None else tuple((ad, float(s)) for ad, s in lora)
        # echo with logprobs: Result.prompt_probs gets an entry per prompt token (the first has no logprob),
        # so the whole prompt is evaluated (no prompt cache)
        self.prompt_logprobs = prompt_logprobs
        if prompt_logprobs:
            self.cache_prompt = False
        self.emit = emit or (lambda ev: None)
        self.cancelled = False
        self.finished = False
        self.t_submit = time.perf_counter()

    def cancel(self) -> None:
        self.cancelled = True


class TaskEvents:
    """Iterator over a task's events in the Engine `engine` (submitted here); cancels the task when
    closed or dropped early. (request.py does not import the engine, which imports it.)"""

    def __init__(self, engine, task: Task):
        self.engine = engine
        self.task = task
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        task.emit = self.q.put
        self.done = False
        engine.submit(task)

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        eng = self.engine
        while True:
            try:
                ev = self.q.get_nowait() if not eng.threaded else self.q.get(timeout=0.5)
                break
            except queue.Empty:
                if eng.threaded:
                    continue
                with eng.lock:
                    if self.q.empty() and not eng.step() and self.q.empty():
                        raise RuntimeError("the engine has nothing to do but this request has not finished")
        if ev[0] in ("done", "error"):
            self.done = True
        return ev

    def close(self):
        if not self.done:
            self.done = True
            self.engine.cancel(self.task)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
