"""The completion engine: parallel slots over one Context, with continuous batching.

Used by both `PowerInfer.create_completion` (driven inline by the calling thread) and the HTTP
server (driven by one scheduler thread). Each engine step gathers, into ONE `Context.decode` call,
the next prompt chunk of every slot still processing its prompt and the last sampled token of
every generating slot; then each slot samples from its own row of logits with its own `Sampler`
and hands text to its request through the request's `emit` callback.

KV layout (why results do not depend on what else runs)
--------------------------------------------------------
The C core computes every batch row independently, but attention sums over a sequence's cached
cells in *cell* order, and `pi_decode` puts new tokens into the lowest free cells. If a finished
request's cells were simply freed, the next token of a still-running request could land in a
hole below its earlier cells, change its summation order, and so change its logits in the last
bits. The engine therefore gives slot `s` the fixed cell region `[s*L, (s+1)*L)` (L = n_ctx / n_slots,
the per-slot context as in llama.cpp), with the token at position p always in cell `s*L + p`:

* a region's cells, once used, stay occupied (by the last request's tokens, or by "filler"
  tokens) -- stale cells of a slot sit at positions above the live request's current position,
  so the attention mask hides them; a position is removed (`kv_seq_rm`) right before it is
  rewritten, in the same step;
* a step's batch is ordered by target cell, and a slot claims cells only once every lower
  region is fully occupied: free tails of lower regions get filler tokens first. That is a
  one-time cost of at most n_ctx tokens over the engine's life; the server's scheduler thread
  pays it while idle right after startup (`background_fill`), otherwise it is paid in chunks of
  n_batch/4 per step the first time a higher slot is needed (running slots are not stalled);
* so every sequence's cells are in position order, exactly as when it runs alone: greedy (and
  seeded) outputs are bit-identical with or without concurrent requests.

A finished or cancelled request releases its slot at once, but its cells are not freed (freeing
would create the holes above): they stay as the slot's prompt cache -- a new request reuses the
longest common prefix with what its slot last held (`cache_prompt`), which is also bit-exact since
KV rows are row-independent. The KV memory is preallocated for n_ctx cells anyway.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .context import Context
from .sampling import Sampler, SamplingParams
from .tokenizer import StreamDecoder, Tokenizer

log = logging.getLogger("powerinfer.engine")

__all__ = ["ContextLengthExceeded", "Engine", "RequestError", "Result", "Task"]


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
        }


class Task:
    """One completion request.

    emit(event) is called from the engine's thread with ("token", text, info) for each piece of
    text (info: {"id": token id, "probs": ...}), then exactly one of ("done", Result) or
    ("error", RequestError/Exception). A cancelled task gets ("done", Result) with stop_type "none".
    """

    def __init__(self, prompt_tokens: list[int], params: SamplingParams, *, n_predict: int = -1,
                 stop: list[str] | None = None, stop_token_ids=(), cache_prompt: bool = True, n_probs: int = 0,
                 emit: Callable | None = None):
        self.prompt_tokens = list(prompt_tokens)
        self.params = params
        self.n_predict = n_predict
        self.stop = [s for s in (stop or []) if s]
        self.stop_token_ids = set(int(t) for t in stop_token_ids)
        self.cache_prompt = cache_prompt
        self.n_probs = n_probs
        self.emit = emit or (lambda ev: None)
        self.cancelled = False
        self.finished = False
        self.t_submit = time.perf_counter()

    def cancel(self) -> None:
        self.cancelled = True


class _Slot:
    def __init__(self, sid: int, n_ctx: int):
        self.id = sid
        self.n_ctx = n_ctx
        self.hw = 0                     # cells [0, hw) of the region are occupied
        self.cache: list[int] = []      # tokens whose KV is valid at positions [0, len)
        self.task: Task | None = None
        self.reset_request()

    def reset_request(self):
        self.task = None
        self.todo: list[int] = []       # prompt tokens still to evaluate
        self.n_past = 0
        self.last = -1                  # sampled token not yet evaluated (-1: none)
        self.sampler: Sampler | None = None
        self.decoder: StreamDecoder | None = None
        self.held = ""
        self.result: Result | None = None
        self.t_start = self.t_first = 0.0

    @property
    def busy(self) -> bool:
        return self.task is not None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class Engine:
    """Slots + continuous batching over `ctx` (created with n_seq_max >= n_slots)."""

    def __init__(self, ctx: Context, tokenizer: Tokenizer, n_slots: int = 1, *, n_batch: int | None = None):
        if n_slots < 1 or n_slots > ctx.n_seq_max:
            raise ValueError(f"n_slots = {n_slots} must be in [1, n_seq_max = {ctx.n_seq_max}]")
        self.ctx = ctx
        self.tokenizer = tokenizer
        self.n_slots = n_slots
        self.n_ctx_slot = ctx.n_ctx // n_slots
        if self.n_ctx_slot < 2:
            raise ValueError(f"context of {ctx.n_ctx} is too small for {n_slots} slots")
        self.n_batch = n_batch or ctx.n_batch
        self.slots = [_Slot(i, self.n_ctx_slot) for i in range(n_slots)]
        self.pending: deque[Task] = deque()
        self.lock = threading.RLock()                      # held while stepping (slot state)
        self.cond = threading.Condition(threading.Lock())  # the pending queue and wake-ups
        self.thread: threading.Thread | None = None
        self._stop = False
        self._dirty = False
        self.n_decode_calls = 0
        self.n_filler_tokens = 0
        self.max_batch_slots = 0       # most slots seen in one decode (continuous batching at work)
        self.background_fill = True    # threaded mode: prepare the KV layout while idle
        eos = tokenizer.eos_id
        self._eos_ids = [eos] if eos is not None else []
        self._filler = tokenizer.bos_id if tokenizer.bos_id is not None else 0

    # ---------------------------------------------------------------- public
    @property
    def threaded(self) -> bool:
        return self.thread is not None

    def start(self) -> None:
        """Run the scheduler in a background thread (the server's mode)."""
        if self.thread is None:
            self._stop = False
            self.thread = threading.Thread(target=self._run, name="powerinfer-engine", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=10)
            self.thread = None
        with self.lock:
            with self.cond:
                tasks = list(self.pending)
            for t in tasks + [s.task for s in self.slots if s.task]:
                t.cancel()
            self._reap()

    def check(self, task: Task) -> None:
        """Raise RequestError for a task that cannot run (before queueing it)."""
        n = len(task.prompt_tokens)
        if n == 0:
            raise RequestError("the prompt is empty (and the model adds no BOS token)", param="prompt")
        if n >= self.n_ctx_slot:
            raise ContextLengthExceeded(
                f"the prompt has {n} tokens, but the context of a slot holds {self.n_ctx_slot} "
                f"(n_ctx {self.ctx.n_ctx} / {self.n_slots} slots); shorten the prompt or raise -c")
        vocab = self.tokenizer.n_vocab
        bad = next((t for t in task.prompt_tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"prompt token {bad} is out of range [0, {vocab})", param="prompt")
        try:
            task.params.validate()
        except ValueError as e:
            raise RequestError(str(e)) from None
        bad = next((t for t in task.params.logit_bias if t >= vocab), None)
        if bad is not None:
            raise RequestError(f"logit_bias token {bad} is out of range [0, {vocab})", param="logit_bias")

    def submit(self, task: Task) -> Task:
        self.check(task)
        with self.cond:
            self.pending.append(task)
            self.cond.notify_all()
        return task

    def cancel(self, task: Task) -> None:
        """Cancel a task; its slot is released at the next step (at once when no thread runs)."""
        task.cancel()
        if self.thread is None:
            with self.lock:
                self._reap()
        else:
            with self.cond:
                self.cond.notify_all()

    def cancel_all(self) -> None:
        """Cancel every queued and running request (shutdown): their consumers get ("done", ...)."""
        with self.cond:
            tasks = list(self.pending)
        for t in tasks + [s.task for s in self.slots if s.task is not None]:
            t.cancel()
        if self.thread is None:
            with self.lock:
                self._reap()
        else:
            with self.cond:
                self.cond.notify_all()

    def busy(self) -> bool:
        with self.cond:
            if self.pending:
                return True
        return any(s.busy for s in self.slots)

    def invalidate(self) -> None:
        """Someone else is about to use the context directly: the engine clears it before its next
        step. Only allowed while no request is in flight."""
        with self.lock:
            if self.busy():
                raise RuntimeError("the engine has requests in flight; finish or cancel them first")
            self._dirty = True

    def slots_info(self) -> list[dict]:
        """Per-slot state (read without waiting for a running step)."""
        return [{"id": s.id, "n_ctx": s.n_ctx, "is_processing": s.busy, "n_past": s.n_past,
                     "n_cached": len(s.cache)} for s in self.slots]

    def run_until_done(self, task: Task) -> None:
        """Inline mode: step until `task` has finished."""
        while not task.finished:
            with self.lock:
                if task.finished:
                    break
                if not self.step():
                    if not task.finished:   # nothing to do, yet the task is not done: it was never submitted
                        raise RuntimeError("task is not queued in this engine")

    # ---------------------------------------------------------------- scheduler
    def _run(self) -> None:
        while True:
            with self.cond:
                while not self._stop and not self.pending and not any(s.busy for s in self.slots) \
                        and not (self.background_fill and self.fill_pending()):
                    self.cond.wait()
                if self._stop:
                    return
            try:
                self.step(idle_fill=self.background_fill)
            except Exception:  # never let the scheduler die
                log.exception("engine step failed")

    def _finish(self, slot: _Slot, *, error: Exception | None = None) -> None:
        task, res = slot.task, slot.result
        if error is None:
            if slot.decoder is not None and res.stop_type != "word":
                tail = slot.held + slot.decoder.flush()
                if tail:
                    res.text += tail
                    self._emit(task, ("token", tail, None))
            slot.held = ""
            now = time.perf_counter()
            if slot.t_first:
                res.predicted_ms = (now - slot.t_first) * 1e3
            else:
                res.prompt_ms = (now - slot.t_start) * 1e3 if slot.t_start else 0.0
            res.n_past = slot.n_past
        # the KV of positions [0, n_past) is valid: keep it as this slot's prompt cache
        slot.cache = slot.cache[:slot.n_past]
        task.finished = True
        slot.reset_request()
        self._emit(task, ("error", error) if error is not None else ("done", res))

    @staticmethod
    def _emit(task: Task, ev) -> None:
        try:
            task.emit(ev)
        except Exception:  # a consumer that went away must not stop the engine
            log.debug("emit failed", exc_info=True)

    def _reap(self) -> None:
        """Drop cancelled tasks (pending ones, and slots whose request was cancelled)."""
        dropped = []
        with self.cond:
            if any(t.cancelled for t in self.pending):
                keep = deque()
                for t in self.pending:
                    (dropped if t.cancelled else keep).append(t)
                self.pending = keep
        for t in dropped:
            t.finished = True
            self._emit(t, ("done", Result(n_prompt=len(t.prompt_tokens))))
        for s in self.slots:
            if s.task is not None and s.task.cancelled:
                self._finish(s)

    def _admit(self) -> None:
        while True:
            free = [s for s in self.slots if not s.busy]
            if not free:
                return
            with self.cond:
                if not self.pending:
                    return
                task = self.pending.popleft()
            # the free slot with the longest reusable prefix; ties: the lowest region
            best, best_n = free[0], -1
            for s in free:
                n = _common_prefix(s.cache, task.prompt_tokens) if task.cache_prompt else 0
                if n > best_n:
                    best, best_n = s, n
            slot = best
            n_reuse = min(best_n, len(task.prompt_tokens) - 1) if task.cache_prompt else 0
            n_reuse = max(n_reuse, 0)
            slot.reset_request()
            slot.task = task
            slot.n_past = n_reuse
            slot.cache = slot.cache[:n_reuse]
            slot.todo = task.prompt_tokens[n_reuse:]
            slot.sampler = Sampler(task.params, eos_ids=self._eos_ids)
            for t in task.prompt_tokens:
                slot.sampler.accept(t)
            slot.decoder = StreamDecoder(self.tokenizer, strip_leading_space=False)
            slot.result = Result(n_prompt=len(task.prompt_tokens), n_cached=n_reuse, slot=slot.id)
            slot.t_start = time.perf_counter()

    def fill_pending(self) -> bool:
        """True while some region below the top one is not fully occupied yet (see the module doc)."""
        return any(s.hw < s.n_ctx for s in self.slots[:-1])

    def step(self, *, idle_fill: bool = False) -> bool:
        """One engine step. Returns False when there was nothing to do.

        idle_fill: with no request in flight, occupy the free tails of the regions in advance (one
        n_batch chunk), so that requests arriving later do not have to wait for it."""
        with self.lock:
            if self._dirty:
                self.ctx.kv_clear()
                for s in self.slots:
                    s.hw = 0
                    s.cache = []
                self._dirty = False
            self._reap()
            self._admit()
            active = [s for s in self.slots if s.busy]
            if not active and not (idle_fill and self.fill_pending()):
                return False
            # --- plan, in region order. A slot may claim cells only if every region below it is
            # fully occupied by the end of this step, so the free tails of lower regions get filler
            # tokens first (at most fill_budget per step while requests run: a long fill does not
            # stall the running slots, it only delays slots in higher regions).
            want_top = max(s.id for s in active) if active else self.n_slots - 1
            fill_budget = self.n_batch if not active else max(32, self.n_batch // 4)
            budget = self.n_batch - sum(1 for s in active if not s.todo and s.last >= 0)
            plan: dict[int, tuple[list[int], bool]] = {}     # slot id -> (tokens, wants logits)
            fills: dict[int, tuple[int, int]] = {}          # region -> (first position, count)
            for s in self.slots[:want_top + 1]:
                if s.busy:
                    if not s.todo and s.last >= 0:
                        plan[s.id] = ([s.last], True)
                    elif s.todo and budget > 0:
                        k = min(len(s.todo), budget)
                        plan[s.id] = (s.todo[:k], k == len(s.todo))
                        budget -= k
                if s.id < want_top:
                    start = max(s.hw, s.n_past + len(plan[s.id][0]) if s.id in plan else 0)
                    need = s.n_ctx - start
                    if need > 0:
                        k = min(need, fill_budget)
                        fills[s.id] = (start, k)
                        fill_budget -= k
                        if k < need:
                            break        # regions above this one cannot claim cells this step
            if not plan and not fills:
                return True
            # --- the batch, ordered by target cell
            tokens, pos, seq, want, rows = [], [], [], [], {}
            for s in self.slots[:want_top + 1]:
                if s.id in plan:
                    toks, logits = plan[s.id]
                    n0 = s.n_past
                    if n0 < s.hw:
                        self.ctx.kv_seq_rm(s.id, n0, n0 + len(toks))
                    tokens += toks
                    pos += range(n0, n0 + len(toks))
                    seq += [s.id] * len(toks)
                    want += [0] * (len(toks) - 1) + [1 if logits else 0]
                    if logits:
                        rows[s.id] = len(tokens) - 1
                if s.id in fills:
                    start, k = fills[s.id]
                    tokens += [self._filler] * k
                    pos += range(start, start + k)
                    seq += [s.id] * k
                    want += [0] * k
            try:
                self.ctx.decode(tokens, pos=pos, seq_id=seq, logits=np.asarray(want, dtype=np.int8))
            except Exception as e:
                self._decode_failed(e)
                return True
            self.n_decode_calls += 1
            self.n_filler_tokens += sum(k for _, k in fills.values())
            self.max_batch_slots = max(self.max_batch_slots, len(plan))
            # --- bookkeeping
            for sid, (toks, _) in plan.items():
                s = self.slots[sid]
                s.cache = s.cache[:s.n_past] + toks
                s.n_past += len(toks)
                s.hw = max(s.hw, s.n_past)
                if s.todo:
                    s.todo = s.todo[len(toks):]
                else:
                    s.last = -1
            for sid, (start, k) in fills.items():
                self.slots[sid].hw = start + k
            expected = sum(s.hw for s in self.slots)
            if self.ctx.kv_used != expected:   # the layout invariant; cannot happen unless the context was shared
                self._decode_failed(RuntimeError(f"KV cache layout mismatch ({self.ctx.kv_used} cells used, "
                                                 f"{expected} expected)"))
                return True
            # --- sample
            for sid, row in rows.items():
                s = self.slots[sid]
                try:
                    self._sample(s, self.ctx.logits(row))
                except Exception as e:   # a sampler error fails that request only
                    log.exception("sampling failed")
                    self._finish(s, error=e)
            return True

    def _decode_failed(self, e: Exception) -> None:
        """A decode error: fail every active request and start from an empty cache."""
        log.error("decode failed: %s", e)
        for s in self.slots:
            if s.task is not None:
                self._finish(s, error=e)
        self.ctx.kv_clear()
        for s in self.slots:
            s.hw = 0
            s.cache = []

    def _sample(self, s: _Slot, logits: np.ndarray) -> None:
        task, res = s.task, s.result
        now = time.perf_counter()
        if not s.t_first:
            s.t_first = now
            res.prompt_ms = (now - s.t_start) * 1e3
        if task.n_predict == 0:
            res.stop_type = "limit"
            self._finish(s)
            return
        tok = s.sampler.sample(logits)
        s.sampler.accept(tok)
        info = None
        if task.n_probs > 0:
            info = self._probs(logits, tok, task.n_probs)
        if (self.tokenizer.is_eog(tok) and not task.params.ignore_eos) or tok in task.stop_token_ids:
            res.stop_type = "eos"
            self._finish(s)
            return
        res.tokens.append(tok)
        res.n_predicted += 1
        piece = s.decoder.push(tok)
        s.held += piece
        emitted = ""
        stopped = False
        if task.stop:
            cut, word = -1, ""
            for w in task.stop:
                i = s.held.find(w)
                if i >= 0 and (cut < 0 or i < cut):
                    cut, word = i, w
            if cut >= 0:
                emitted = s.held[:cut]
                s.held = ""
                res.stop_type, res.stopping_word = "word", word
                stopped = True
            else:
                keep = _partial_stop(s.held, task.stop)
                emitted = s.held[:len(s.held) - keep]
                s.held = s.held[len(s.held) - keep:]
        else:
            emitted, s.held = s.held, ""
        if emitted or info is not None:
            res.text += emitted
            if info is not None:
                info["piece"] = piece
            self._emit(task, ("token", emitted, info))
        if stopped:
            self._finish(s)
            return
        if task.n_predict > 0 and res.n_predicted >= task.n_predict:
            res.stop_type = "limit"
            self._finish(s)
            return
        if s.n_past >= s.n_ctx:
            res.stop_type = "limit"
            res.truncated = True
            self._finish(s)
            return
        s.last = tok

    def _probs(self, logits: np.ndarray, tok: int, n: int) -> dict:
        x = logits.astype(np.float64)
        m = x.max()
        lse = m + math.log(np.exp(x - m).sum())
        n = min(n, x.size)
        top = np.argpartition(-x, n - 1)[:n]
        top = top[np.lexsort((top, -x[top]))]
        return {"id": int(tok), "logprob": float(x[tok] - lse),
                "top": [(int(t), float(x[t] - lse)) for t in top]}
