"""Generation: the Engine, the one place that schedules decode steps, samples, ends generations and
matches stop strings, and the pieces it is made of.

Every program generates through the Engine: `PowerInfer` (its completions and `generate`, driven
inline by the calling thread), the HTTP server (one scheduler thread), and through powerinfer.generator
main.py (`Generator`: one sequence a caller keeps feeding) and batched.py (`decode_parallel`). Each
piece has one definition here: `sample_token` (sample + accept + the error for invalid logits),
`end_of_generation` (the tokens that end a generation: the vocabulary's end-of-generation tokens
unless ignore_eos, plus a request's stop tokens), `StopMatcher` (stop strings over streamed text),
`shift_tokens` (llama.cpp's context shift), `Timings` (llama.cpp's report).

The Engine's slots: Each engine step gathers, into ONE `Context.decode` call,
the next prompt chunk of every slot still processing its prompt and the last sampled token of
every generating slot; then each slot samples from its own row of logits with its own `Sampler`
and hands text to its request through the request's `emit` callback. With a drafter (speculative
decoding, powerinfer.speculative) a generating slot's token comes with draft tokens, and its rows are
sampled in turn (`_verify`): the same tokens, fewer steps.

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
  seeded) outputs are bit-identical with or without concurrent requests. Except for a gate-sparse
  level (tools/sparsify.py): a call holding more tokens than its sparse_gather_max / sparse_batch_max
  runs other kernels (Context.exact_batch_max: dense ones over Q8-quantized activations instead of f32
  axpy rows), so a request's bits there depend on what else its steps held and on how its prompt was
  chunked (known, not fixed; --sparse-gather-max 0 makes every call exact, prompts slower).

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

import numpy as np

from ._ffi import PowerInferError
from .context import Context
from .encoder import is_encoder
from .prompt_cache import PromptCache
from .request import ContextLengthExceeded, RequestError, Result, Task, TaskEvents, common_prefix
from .sampling import Sampler
from .speculative import Drafter, SpecParams
from .tokenizer import StreamDecoder, Tokenizer

log = logging.getLogger("powerinfer.engine")

__all__ = ["ContextFull", "Engine", "StopMatcher", "Timings", "end_of_generation", "sample_token", "shift_tokens"]

@dataclass
class Timings:
    """Wall-clock time spent per stage, in milliseconds, as llama.cpp reports them."""
    load_ms: float = 0.0
    sample_ms: float = 0.0
    n_sample: int = 0
    prompt_ms: float = 0.0
    n_prompt: int = 0
    eval_ms: float = 0.0
    n_eval: int = 0
    t_start: float = field(default_factory=time.perf_counter)

    def report(self, prefix: str = "llama_print_timings") -> str:
        def rate(ms, n):
            return (ms / n if n else 0.0), (1e3 * n / ms if ms > 0 else 0.0)
        s_pt, s_ps = rate(self.sample_ms, self.n_sample)
        p_pt, p_ps = rate(self.prompt_ms, self.n_prompt)
        e_pt, e_ps = rate(self.eval_ms, self.n_eval)
        # wall time since this object was made: callers make it before loading the model, so the
        # load time is already inside (adding load_ms counted it twice)
        total = (time.perf_counter() - self.t_start) * 1e3
        return "\n".join([
            f"{prefix}:        load time = {self.load_ms:10.2f} ms",
            f"{prefix}:      sample time = {self.sample_ms:10.2f} ms / {self.n_sample:5d} runs   "
            f"({s_pt:8.2f} ms per token, {s_ps:8.2f} tokens per second)",
            f"{prefix}: prompt eval time = {self.prompt_ms:10.2f} ms / {self.n_prompt:5d} tokens "
            f"({p_pt:8.2f} ms per token, {p_ps:8.2f} tokens per second)",
            f"{prefix}:        eval time = {self.eval_ms:10.2f} ms / {self.n_eval:5d} runs   "
            f"({e_pt:8.2f} ms per token, {e_ps:8.2f} tokens per second)",
            f"{prefix}:       total time = {total:10.2f} ms",
        ])


class ContextFull(Exception):
    """The context has no room for another token (and context shifting is off or cannot help)."""


def sample_token(sampler: Sampler, logits: np.ndarray, banned: np.ndarray | None = None) -> int:
    """The next token (accepted into the sampler's history); PowerInferError for NaN / +inf logits.
    banned: the tokens a grammar forbids (GrammarMatcher.banned())."""
    try:
        token = sampler.sample(logits, banned)
    except ValueError as e:       # the model's fault, not the caller's
        raise PowerInferError(f"cannot sample the next token: {e} (the model produced invalid logits; "
                              "the file may be corrupt)") from None
    sampler.accept(token)
    return token


def end_of_generation(tokenizer: Tokenizer, *, ignore_eos: bool = False, stop_token_ids=()) -> frozenset[int]:
    """The tokens that end a generation (and are not part of its text): the vocabulary's
    end-of-generation tokens (EOS, EOT, end-of-turn...) unless ignore_eos, and stop_token_ids."""
    stop = frozenset(int(t) for t in stop_token_ids)
    return stop if ignore_eos else tokenizer.eog_ids | stop


def shift_tokens(tokens: list[int], n_keep: int, n_ctx: int) -> tuple[list[int], int]:
    """llama.cpp's context shift of a sequence that does not fit in n_ctx (or fills it): keep the
    first n_keep tokens (capped at n_ctx - 4, as llama.cpp's server does, so a shift always frees
    room), drop the older half of the others (more if the sequence needs it). Returns (the tokens
    kept, the capped n_keep); ContextFull if nothing but the kept tokens would remain."""
    n_keep = min(max(n_keep, 0), len(tokens), max(n_ctx - 4, 0))
    n_left = len(tokens) - n_keep
    n_discard = max(n_left // 2, len(tokens) - n_ctx)
    if n_discard >= n_left:
        raise ContextFull(f"{len(tokens)} tokens do not fit in the context of {n_ctx}, even after a "
                          f"context shift keeping {n_keep}")
    return tokens[:n_keep] + tokens[n_keep + n_discard:], n_keep


def _partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class StopMatcher:
    """Stop strings over text as it streams: `push(piece)` returns the text to pass on; once a stop
    string has appeared, `word` is that string and generation should end.

    hide=True (completions: the API, the server): the stop string and what follows it are not passed
    on, and a tail that could begin one is held back until it cannot (flush() returns it at the end).
    hide=False (main.py's reverse prompts and a chat turn's end-of-turn text, llama.cpp's antiprompt):
    text passes on at once, and `word` is set by the piece that completes a stop string."""

    def __init__(self, stops=(), *, hide: bool = True):
        self.stops = [s for s in stops if s]
        self.hide = hide
        self.word: str | None = None
        self._held = ""             # hide: text not passed on yet; else the tail a stop string may span

    def push(self, text: str) -> str:
        if self.word is not None:
            return ""
        if not self.stops:
            return text
        self._held += text
        cut = -1
        for w in self.stops:
            i = self._held.find(w)
            if i >= 0 and (cut < 0 or i < cut):
                cut, self.word = i, w
        if cut >= 0:
            out = self._held[:cut] if self.hide else text
            self._held = ""
            return out
        keep = _partial_stop(self._held, self.stops) if self.hide else max(len(w) for w in self.stops) - 1
        out, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return out if self.hide else text

    def flush(self) -> str:
        """hide=True: the held-back tail (no stop string came); "" otherwise."""
        out, self._held = (self._held if self.hide and self.word is None else ""), ""
        return out



class _Slot:
    def __init__(self, sid: int, n_ctx: int):
        self.id = sid
        self.n_ctx = n_ctx
        self.hw = 0                     # cells [0, hw) of the region are occupied
        self.cache: list[int] = []      # tokens whose KV is valid at positions [0, len)
        self.cache_lora: tuple = ()     # the LoRA adapters (and scales) that computed it
        self.task: Task | None = None
        self.reset_request()

    def reset_request(self):
        self.task = None
        self.todo: list[int] = []       # prompt tokens still to evaluate
        self.n_past = 0
        self.last = -1                  # sampled token not yet evaluated (-1: none)
        self.sampler: Sampler | None = None
        self.matcher = None                 # GrammarMatcher of a constrained request
        self.decoder: StreamDecoder | None = None
        self.stop = StopMatcher()
        self.eog: frozenset[int] = frozenset()
        self.result: Result | None = None
        self.fork_of: _Slot | None = None   # the slot whose prompt KV this one waits to share (Task.prompt_from)
        self.t_start = self.t_first = 0.0

    @property
    def busy(self) -> bool:
        return self.task is not None


class Engine:
    """Slots + continuous batching over `ctx` (created with n_seq_max >= n_slots).

    regions=True: slot s owns the cells [s*L, (s+1)*L) (the module doc). regions=False: the slots share
    the whole context (each may hold up to n_ctx tokens, their sum must fit), a sequence's cells are
    wherever `pi_decode` puts them and a rewritten position drops the slot's cells from there on; one
    run of requests that start together (main.py, batched.py) is laid out in position order just the
    same, and prompts can be shared (Task.prompt_from). timings: add the engine's sampling and
    decode times to this Timings (a decode holding prompt tokens counts as prompt evaluation).
    drafter: speculative decoding (powerinfer.speculative): a generating slot's last token is evaluated with up
    to spec.n_max (a Task's `speculative` overrides it) draft tokens in the same decode call, and each row is
    sampled in turn (`_verify`): the same tokens as without a drafter, fewer decode calls where drafts hold.
    prompt_cache: slots' prompts kept in RAM beyond their slots (powerinfer.prompt_cache; regions only): a request
    that continues a saved prompt better than its slot's cache gets that state back instead of evaluating it."""

    def __init__(self, ctx: Context, tokenizer: Tokenizer, n_slots: int = 1, *, n_batch: int | None = None,
                 regions: bool = True, timings: Timings | None = None, drafter: Drafter | None = None,
                 spec: SpecParams | None = None, prompt_cache: PromptCache | None = None):
        if n_slots < 1 or n_slots > ctx.n_seq_max:
            raise ValueError(f"n_slots = {n_slots} must be in [1, n_seq_max = {ctx.n_seq_max}]")
        self.ctx = ctx
        self.tokenizer = tokenizer
        self.n_slots = n_slots
        self.recurrent = ctx.recurrent      # recurrent layers (qwen35): no tail of a sequence can be removed
        if self.recurrent and drafter is not None:
            raise ValueError("speculative decoding is not supported for models with recurrent layers (qwen35, "
                             "qwen3next): a rejected draft cannot be removed from the recurrent state")
        if self.recurrent and regions:
            # the regions' filler tokens would enter the slots' recurrent states: the slots share the context
            log.info("recurrent model: the slots share the context (no regions)")
            regions = False
        self.regions = regions
        self.timings = timings or Timings()
        self.n_ctx_slot = ctx.n_ctx // n_slots if regions else ctx.n_ctx
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
        self._filler = tokenizer.bos_id if tokenizer.bos_id is not None else 0
        self.drafter = drafter
        self.spec = spec or SpecParams()
        self.spec.validate()
        self.n_drafted = self.n_draft_accepted = 0     # draft tokens proposed / kept, over the engine's life
        self.lora: tuple = ctx.lora    # the LoRA adapters of the tasks that name none (Task.lora)
        self.prompt_cache = prompt_cache if regions else None
        self.has_images = False        # a task with image rows came (powerinfer.multimodal): look for them
        self._lora_turn = 0            # which set of adapters the next step runs, when requests differ
        self.draft_ms = 0.0                            # time spent in the drafter

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
        self.cancel_all()                # no thread now: reaped at once

    def check(self, task: Task) -> None:
        """Raise RequestError for a task that cannot run (before queueing it)."""
        if "logits" not in self.ctx.outputs and is_encoder(self.ctx.model.hparams.arch):
            raise RequestError(f"this is an encoder model ({self.ctx.model.hparams.arch}): it has no output head and "
                               "generates no text; use its embeddings (/v1/embeddings, /embedding) or, for a "
                               "reranker, /rerank", code="not_supported_error", status=400)
        n = len(task.prompt_tokens)
        if n == 0:
            raise RequestError("the prompt is empty (and the model adds no BOS token)", param="prompt")
        if n > self.n_ctx_slot or (n == self.n_ctx_slot and not task.context_shift):   # no room to generate
            raise ContextLengthExceeded(
                f"the prompt has {n} tokens, but the context of a slot holds {self.n_ctx_slot} "
                f"(n_ctx {self.ctx.n_ctx} / {self.n_slots} slots); shorten the prompt or raise -c")
        vocab = self.tokenizer.n_vocab
        images = getattr(task, "images", None)
        bad = next((t for t in task.prompt_tokens if not 0 <= t < vocab and not (images and t < 0)), None)
        if images:
            self._check_images(task)
        if bad is not None:
            raise RequestError(f"prompt token {bad} is out of range [0, {vocab})", param="prompt")
        try:
            task.params.validate()
        except ValueError as e:
            raise RequestError(str(e)) from None
        bad = next((t for t in task.params.logit_bias if t >= vocab), None)
        if bad is not None:
            raise RequestError(f"logit_bias token {bad} is out of range [0, {vocab})", param="logit_bias")
        if self.recurrent and task.speculative is not None and task.speculative.n_max > 0:
            raise RequestError("speculative decoding is not supported for models with recurrent layers (qwen35, "
                               "qwen3next)", param="speculative")

    def _check_images(self, task: Task) -> None:
        """A prompt with image rows (powerinfer.multimodal placeholders; task.images: {hash: embeddings}): each image
        must fit one decode call (its rows attend to each other) and every placeholder must have its embeddings."""
        from .multimodal import split_placeholder
        if task.prompt_logprobs:
            raise RequestError("prompt logprobs are not supported with image input", param="prompt")
        for t in task.prompt_tokens:
            if t < 0:
                h, j = split_placeholder(t)
                e = task.images.get(h)
                if e is None or j >= len(e):
                    raise RequestError("an image placeholder without its embeddings", param="prompt")
        n_max = max(len(e) for e in task.images.values())
        if n_max > self.n_batch:
            raise RequestError(f"an image of {n_max} embeddings does not fit a batch of {self.n_batch} "
                               "(raise -b / --batch-size)", param="prompt")
        self.has_images = True

    def _eval_images(self, active: list) -> None:
        """Active slots whose next prompt rows are an image: decode its rows (one call, bidirectional, pi_batch.span);
        a prompt that ends there samples from the last row."""
        from .multimodal import image_run, split_placeholder
        for s in active:
            n = image_run(s.todo) if s.todo else 0
            if not n:
                continue
            if self.regions and any(r.hw < r.n_ctx for r in self.slots[:s.id]):
                continue   # a lower region's free tail first (this step's fill): the rows must land in s's region
            n0 = s.n_past
            if n0 < s.hw:
                self.ctx.kv_seq_rm(s.id, n0, n0 + n if self.regions else -1)
                s.hw = s.hw if self.regions else n0
            last = n == len(s.todo)
            t0 = time.perf_counter()
            try:
                self.ctx.set_lora(self._lora_of(s.task))
                h, j = split_placeholder(s.todo[0])
                self.ctx.decode_embd(s.task.images[h][j:j + n], pos=np.arange(n0, n0 + n), seq_id=s.id,
                                     span=1, logits="last" if last else "none")
            except Exception as e:
                self._finish(s, error=e if isinstance(e, (RequestError, PowerInferError)) else
                             RequestError(f"image decode failed: {e}"))
                continue
            self._count_decode(time.perf_counter() - t0, n, 0)
            s.cache = s.cache[:n0] + s.todo[:n]
            s.cache_lora = self._lora_of(s.task)
            s.n_past += n
            s.hw = max(s.hw, s.n_past)
            s.todo = s.todo[n:]
            if last:
                self._sample(s, self.ctx.logits())

    def submit(self, task: Task) -> Task:
        self.check(task)
        with self.cond:
            self.pending.append(task)
            self.cond.notify_all()
        return task

    def cancel(self, task: Task) -> None:
        """Cancel a task; its slot is released at the next step (at once when no thread runs)."""
        self._cancel([task])

    def cancel_all(self) -> None:
        """Cancel every queued and running request (shutdown): their consumers get ("done", ...)."""
        with self.cond:
            tasks = list(self.pending)
        self._cancel(tasks + [s.task for s in self.slots if s.task is not None])

    def _cancel(self, tasks: list[Task]) -> None:
        for t in tasks:
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

    def snapshot(self) -> list[list[int]]:
        """The tokens whose KV each slot holds (its prompt cache); see restore()."""
        with self.lock:
            if self.busy():
                raise RuntimeError("the engine has requests in flight; finish or cancel them first")
            return [list(s.cache) for s in self.slots]

    def restore(self, caches: list[list[int]]) -> None:
        """Make each slot hold the KV of caches[i] (a snapshot() of an engine over the same model and
        slot size), by evaluating the tokens again in the slot layout of the module doc: the same KV
        bits (rows are computed independently), so a request that starts with them reuses them."""
        if len(caches) != self.n_slots:
            raise ValueError(f"the state has {len(caches)} slots, this engine {self.n_slots}")
        vocab = self.tokenizer.n_vocab
        for c in caches:
            if len(c) > self.n_ctx_slot or any(not 0 <= int(t) < vocab for t in c):
                raise ValueError("the state does not fit this model or slot size")
        with self.lock:
            if self.busy():
                raise RuntimeError("the engine has requests in flight; finish or cancel them first")
            self.ctx.kv_clear()
            self.ctx.set_lora(self.lora)
            top = max((i for i, c in enumerate(caches) if c), default=-1)
            for s, c in zip(self.slots, caches):
                s.cache, s.hw = [], 0
                toks = [int(t) for t in c]
                if s.id < top:            # a higher region follows: fill this one (the layout invariant)
                    toks = toks + [self._filler] * (s.n_ctx - len(toks))
                for i in range(0, len(toks), self.n_batch):
                    chunk = toks[i:i + self.n_batch]
                    self.ctx.decode(chunk, pos=range(i, i + len(chunk)), seq_id=s.id,
                                    logits=np.zeros(len(chunk), dtype=np.int8))
                s.cache, s.hw, s.cache_lora = [int(t) for t in c], len(toks), self.lora
            self._dirty = False

    def _clear_if_dirty(self) -> None:
        """The context clear invalidate() asked for, before the engine uses the context again (the caller holds the
        lock)."""
        if self._dirty:
            self.ctx.kv_clear()
            for s in self.slots:
                s.hw, s.cache = 0, []
            self._dirty = False

    def _idle_slot(self, sid: int) -> _Slot:
        """Slot sid, which must exist and be idle (the caller holds the lock); a pending context clear is applied."""
        if not 0 <= sid < self.n_slots:
            raise RequestError(f"Invalid slot ID {sid}: this server has slots 0..{self.n_slots - 1}", param="id_slot")
        self._clear_if_dirty()
        s = self.slots[sid]
        if s.busy:
            raise RequestError(f"slot {sid} is processing a request", code=503, status=503, type="unavailable_error")
        return s

    def slot_state(self, sid: int) -> tuple[list[int], bytes]:
        """The tokens idle slot sid holds as its prompt cache and the KV state of their positions
        (Context.kv_seq_state), for the server's slot files (llama.cpp's POST /slots/N?action=save)."""
        with self.lock:
            s = self._idle_slot(sid)
            return list(s.cache), self.ctx.kv_seq_state(sid, 0, len(s.cache))

    def restore_slot_state(self, sid: int, tokens: list[int], state: bytes, keep: int | None = None) -> None:
        """Idle slot sid holds `tokens` again, their KV rows written from `state` (a slot_state of an engine over the
        same model and KV type) into the cells of its region, position p in cell sid * L + p (the module doc), so
        a request that starts with them reuses them, bit for bit. Needs the region layout, or a one-slot engine
        without regions (main.py: the context is cleared first, position p in cell p). keep: only the first `keep`
        tokens stay the slot's cache (a prompt that shares only a prefix with the file)."""
        n = len(tokens)
        with self.lock:
            s = self._idle_slot(sid)
            shared = not self.regions and self.n_slots > 1
            if shared and not self.recurrent:
                raise RequestError("this engine's slots share the context: no slot restore", code=501, status=501,
                                   type="not_supported_error")
            if not self.regions:   # (a recurrent model's slots share the context: the slot's sequence is replaced)
                if shared:
                    self.ctx.kv_seq_rm(sid, 0, -1)
                else:
                    self.ctx.kv_clear()
                s.hw, s.cache = 0, []
            if n > s.n_ctx:
                raise RequestError(f"the saved slot holds {n} tokens, more than a slot's context ({s.n_ctx})")
            if any(not 0 <= t < self.tokenizer.n_vocab for t in tokens):
                raise RequestError("the saved slot holds tokens outside this model's vocabulary")
            try:
                positions = Context.kv_state_positions(state)
            except ValueError as e:
                raise RequestError(f"invalid slot file: {e}") from None
            if not np.array_equal(positions, np.arange(n)):
                raise RequestError("invalid slot file: its KV state does not hold positions 0..n-1 of its tokens")
            try:
                self.ctx.kv_seq_set_state(sid, state, cells=None if shared else range(sid * s.n_ctx,
                                                                                      sid * s.n_ctx + n))
            except PowerInferError as e:
                raise RequestError(f"invalid slot file: {e}") from None
            s.cache, s.hw = list(tokens), max(s.hw, n)
            s.cache_lora = self.lora        # saved under the adapters of the engine's requests, as far as it knows
            if keep is not None and keep < n:
                s.cache = s.cache[:max(keep, 0)]
                if self.recurrent:          # the state cannot drop the tail: the slot starts over
                    self.ctx.kv_seq_rm(sid, 0, -1)
                    s.cache, s.hw = [], 0
                elif not self.regions:      # no stale cells without regions
                    self.ctx.kv_seq_rm(sid, len(s.cache), -1)
                    s.hw = len(s.cache)

    def erase_slot(self, sid: int) -> int:
        """Forget idle slot sid's prompt cache (its cells stay, as the layout needs); returns the tokens it held."""
        with self.lock:
            s = self._idle_slot(sid)
            n, s.cache = len(s.cache), []
            return n

    def eval_in_slot0(self, prefix: list[int], tokens: list[int], all_logits: bool) -> np.ndarray:
        """Slot 0 holds prefix + tokens afterwards, its KV evaluated from where its cache stops matching the prefix
        (the same bits as a request's: position p in cell p, the lowest region, which needs no filler); returns the
        logits of `tokens`: [len(tokens), n_vocab] with all_logits, else [1, n_vocab] of the last one. The caller
        drives one sequence token by token (powerinfer.token_loop, llama-cpp-python's Llama.eval); no request may
        be in flight. A request that starts with those tokens reuses them, as any slot's prompt cache."""
        sid = 0
        with self.lock:
            if self.busy():
                raise RuntimeError("the engine has requests in flight; finish or cancel them first")
            s = self._idle_slot(sid)
            full = prefix + tokens
            if len(full) > s.n_ctx:
                raise ContextLengthExceeded(f"Requested tokens ({len(full)}) exceed context window of {s.n_ctx}")
            n = common_prefix(s.cache, prefix) if s.cache_lora == self.lora else 0
            n = self._recurrent_reuse(s, n)
            todo, first = full[n:], len(prefix) - n       # todo[first:] are `tokens`
            self.ctx.set_lora(self.lora)
            if n < s.hw:
                self.ctx.kv_seq_rm(sid, n, n + len(todo) if self.regions else -1)
                s.hw = s.hw if self.regions else n
            s.cache, s.cache_lora = s.cache[:n], self.lora
            rows = []
            for i in range(0, len(todo), self.n_batch):
                chunk = todo[i:i + self.n_batch]
                idx = np.arange(i, i + len(chunk))
                want = (idx >= first) if all_logits else (idx == len(todo) - 1)
                self.ctx.decode(chunk, pos=range(n + i, n + i + len(chunk)), seq_id=sid, logits=want)
                rows += [self.ctx.logits(int(j)) for j in np.flatnonzero(want)]
                s.cache = full[:n + i + len(chunk)]
                s.hw = max(s.hw, len(s.cache))
            return np.stack(rows)

    def slots_info(self) -> list[dict]:
        """Per-slot state (read without waiting for a running step)."""
        return [{"id": s.id, "n_ctx": s.n_ctx, "is_processing": s.busy, "n_past": s.n_past,
                     "n_cached": len(s.cache)} for s in self.slots]

    def events(self, task: Task) -> TaskEvents:
        """Submit task; iterate over its events (see Task), stepping the engine when no thread runs it."""
        return TaskEvents(self, task)

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
                tail = slot.stop.flush() + slot.decoder.flush()
                if tail:
                    res.text += tail
                    self._emit(task, ("token", tail, None))
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
            lora = self._lora_of(task)
            for s in free:
                n = common_prefix(s.cache, task.prompt_tokens) if task.cache_prompt and s.cache_lora == lora else 0
                if n > best_n:
                    best, best_n = s, n
            slot = best
            if self.prompt_cache is not None:
                best_n = self._through_prompt_cache(slot, task, lora, best_n)
            n_reuse = min(best_n, len(task.prompt_tokens) - 1) if task.cache_prompt else 0
            n_reuse = self._recurrent_reuse(slot, max(n_reuse, 0))
            slot.reset_request()
            slot.task = task
            slot.n_past = n_reuse
            slot.cache = slot.cache[:n_reuse]
            slot.todo = task.prompt_tokens[n_reuse:]
            source = self._prompt_source(task)
            if source is not None:          # shares source's prompt KV once evaluated (_share_prompts)
                slot.fork_of, slot.todo, slot.n_past, slot.cache = source, [], 0, []
            if task.sampler is not None:
                slot.sampler = task.sampler
            else:
                slot.sampler = Sampler(task.params, eos_ids=self.tokenizer.eog_ids, tokenizer=self.tokenizer)
                for t in task.prompt_tokens:
                    if t >= 0:   # image rows (negative placeholders) are no tokens to penalise
                        slot.sampler.accept(t)
            if task.grammar is not None:
                from .grammar import GrammarMatcher
                try:
                    slot.matcher = GrammarMatcher(task.grammar, self.tokenizer, self.ctx.model.n_vocab)
                except Exception as e:
                    slot.result = Result(n_prompt=len(task.prompt_tokens))
                    self._finish(slot, error=RequestError(str(e), param="grammar"))
                    continue
            slot.decoder = StreamDecoder(self.tokenizer, strip_leading_space=False, preserved=task.preserved_ids)
            slot.stop = StopMatcher(task.stop, hide=task.hide_stop)
            slot.eog = end_of_generation(self.tokenizer, ignore_eos=task.params.ignore_eos,
                                         stop_token_ids=task.stop_token_ids)
            slot.result = Result(n_prompt=len(task.prompt_tokens), n_cached=n_reuse, slot=slot.id)
            slot.t_start = time.perf_counter()

    def _through_prompt_cache(self, s: _Slot, task: Task, lora: tuple, n: int) -> int:
        """Before idle slot s takes task: its cache, where the task's prompt would overwrite part of it, is saved to
        the RAM prompt cache, and a saved prompt that the task continues better is written back into the slot.
        Returns how many of the task's prompt tokens the slot then holds. A failure costs the cache, never the
        request (logged)."""
        pc = self.prompt_cache
        have = n if s.cache_lora == lora else 0
        key = pc.best(task.prompt_tokens, lora, have, len(s.cache)) if task.cache_prompt else None
        try:
            if s.cache and (have < len(s.cache) or key is not None):
                pc.save(s.cache, s.cache_lora, self.ctx.kv_seq_state(s.id, 0, len(s.cache)))
            if key is None:
                return n
            e = pc.take(key)
            self.restore_slot_state(s.id, e.tokens, e.state)
        except (PowerInferError, RequestError, ValueError) as err:
            log.warning("prompt cache: slot %d: %s", s.id, err)
            return n
        s.cache_lora = e.lora
        n = common_prefix(e.tokens, task.prompt_tokens)
        pc.n_restored += 1
        pc.n_tokens_restored += n
        log.debug("prompt cache: slot %d restored %d tokens (%d of the prompt)", s.id, len(e.tokens), n)
        return n

    def _prompt_source(self, task: Task) -> _Slot | None:
        """The slot still evaluating task.prompt_from's prompt, whose KV task can share; None: evaluate it."""
        src = task.prompt_from
        if self.regions or src is None or src.prompt_tokens != task.prompt_tokens or \
                self._lora_of(src) != self._lora_of(task):
            return None
        return next((s for s in self.slots if s.task is src and s.todo and s.fork_of is None), None)

    def _share_prompts(self, rows: dict[int, int]) -> None:
        """Slots waiting for another's prompt: share its cells (kv_seq_cp) once its last prompt chunk
        is decoded (its logits row in `rows`, which the waiting slot samples from too); evaluate the
        prompt themselves if that request went away first."""
        for s in self.slots:
            src = s.fork_of
            if src is None:
                continue
            if src.id in rows and not src.todo and src.task is s.task.prompt_from:
                n = len(s.task.prompt_tokens)
                if s.hw:
                    self.ctx.kv_seq_rm(s.id, 0, -1)
                self.ctx.kv_seq_cp(src.id, s.id, 0, n)
                s.n_past = s.hw = n
                s.cache = list(s.task.prompt_tokens)
                s.result.n_cached = n
                rows[s.id] = rows[src.id]
            elif src.task is not s.task.prompt_from:
                s.todo = list(s.task.prompt_tokens)
            else:
                continue
            s.fork_of = None

    def fill_pending(self) -> bool:
        """True while some region below the top one is not fully occupied yet (see the module doc)."""
        return self.regions and any(s.hw < s.n_ctx for s in self.slots[:-1])

    def step(self, *, idle_fill: bool = False) -> bool:
        """One engine step. Returns False when there was nothing to do.

        idle_fill: with no request in flight, occupy the free tails of the regions in advance (one
        n_batch chunk), so that requests arriving later do not have to wait for it."""
        with self.lock:
            self._clear_if_dirty()
            self._reap()
            self._admit()
            self._share_prompts({})           # a waiting slot whose source went away evaluates its prompt
            active = [s for s in self.slots if s.busy]
            if not active and not (idle_fill and self.fill_pending()):
                return False
            if self.has_images and any(s.todo and s.todo[0] < 0 for s in active):
                self._eval_images([s for s in active if s.fork_of is None])
                active = [s for s in self.slots if s.busy]
                if not active:
                    return True
            lora = self._step_lora(active)
            active = [s for s in active if self._lora_of(s.task) == lora]
            # --- plan, in region order. A slot may claim cells only if every region below it is
            # fully occupied by the end of this step, so the free tails of lower regions get filler
            # tokens first (at most fill_budget per step while requests run: a long fill does not
            # stall the running slots, it only delays slots in higher regions).
            want_top = max(s.id for s in active) if active else self.n_slots - 1
            fill_budget = self.n_batch if not active else max(32, self.n_batch // 4)
            budget = self.n_batch - sum(1 for s in active if not s.todo and s.last >= 0)
            # drafts only where the verification batch's rows stay the bits of single tokens (Context.exact_batch_max)
            exact = self.ctx.exact_batch_max
            draft_room = budget if not exact else exact - 1 if len(active) == 1 else 0
            plan: dict[int, tuple[list[int], bool]] = {}     # slot id -> (tokens, wants logits)
            drafts: dict[int, list[int]] = {}                # slot id -> the draft tokens after its last token
            fills: dict[int, tuple[int, int]] = {}          # region -> (first position, count)
            for s in self.slots[:want_top + 1]:
                if s in active:
                    if not s.todo and s.last >= 0:
                        d = self._draft(s, min(budget, draft_room))
                        if d:
                            drafts[s.id] = d
                            budget -= len(d)
                        plan[s.id] = ([s.last] + d, True)
                    elif s.todo and budget > 0 and s.todo[0] >= 0:
                        k = min(len(s.todo), budget)
                        if self.has_images:   # text up to the next image (decoded on its own)
                            from .multimodal import first_image_row
                            k = min(k, first_image_row(s.todo))
                        plan[s.id] = (s.todo[:k], k == len(s.todo))
                        budget -= k
                if self.regions and s.id < want_top:
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
            prompt_rows: dict[int, tuple[int, list[int]]] = {}     # slot -> (first row, its tokens): echo logprobs
            for s in self.slots[:want_top + 1]:
                if s.id in plan:
                    toks, logits = plan[s.id]
                    n0 = s.n_past
                    if n0 < s.hw:
                        self.ctx.kv_seq_rm(s.id, n0, n0 + len(toks) if self.regions else -1)
                        s.hw = s.hw if self.regions else n0
                    tokens += toks
                    pos += range(n0, n0 + len(toks))
                    seq += [s.id] * len(toks)
                    if s.task.prompt_logprobs and s.todo:
                        prompt_rows[s.id] = (len(tokens) - len(toks), toks)
                        want += [1] * (len(toks) - 1) + [1 if logits else 0]
                    elif s.id in drafts:                 # every row is sampled (_verify)
                        want += [1] * len(toks)
                    else:
                        want += [0] * (len(toks) - 1) + [1 if logits else 0]
                    if logits:
                        rows[s.id] = len(tokens) - (len(toks) if s.id in drafts else 1)
                if s.id in fills:
                    start, k = fills[s.id]
                    tokens += [self._filler] * k
                    pos += range(start, start + k)
                    seq += [s.id] * k
                    want += [0] * k
            prompt_chunks = [toks for sid, (toks, _) in plan.items() if self.slots[sid].todo]
            t0 = time.perf_counter()
            one_seq = len(set(seq)) == 1
            # one token of one sequence (a single request generating): Context.decode's path without numpy
            logits = "last" if one_seq and want == [1] else np.asarray(want, dtype=np.int8)
            try:
                self.ctx.set_lora(lora)
                self.ctx.decode(tokens, pos=pos, seq_id=seq[0] if one_seq else seq, logits=logits)
            except Exception as e:
                self._decode_failed(e)
                return True
            self._count_decode(time.perf_counter() - t0, sum(map(len, prompt_chunks)), len(plan) - len(prompt_chunks))
            self.n_decode_calls += 1
            self.n_filler_tokens += sum(k for _, k in fills.values())
            self.max_batch_slots = max(self.max_batch_slots, len(plan))
            # --- bookkeeping
            for sid, (toks, _) in plan.items():
                s = self.slots[sid]
                s.cache = s.cache[:s.n_past] + toks
                s.cache_lora = lora
                s.n_past += len(toks)
                s.hw = max(s.hw, s.n_past)
                if s.todo:
                    s.todo = s.todo[len(toks):]
                else:
                    s.last = -1
            for sid, (start, k) in fills.items():
                self.slots[sid].hw = start + k
            for sid, (r0, toks) in prompt_rows.items():     # logprob of each prompt token after the first
                s = self.slots[sid]
                pp = s.result.prompt_probs
                if not pp:
                    pp.append({"id": toks[0], "logprob": None, "top": None})
                nxt = s.task.prompt_tokens[len(pp):len(pp) + len(toks)]
                for j, t in enumerate(nxt):
                    pp.append(self._probs(self.ctx.logits(r0 + j), t, max(s.task.n_probs, 1)))
            expected = sum(s.hw for s in self.slots)
            # the layout invariant; cannot happen unless the context was shared
            if self.regions and self.ctx.kv_used != expected:
                self._decode_failed(RuntimeError(f"KV cache layout mismatch ({self.ctx.kv_used} cells used, "
                                                 f"{expected} expected)"))
                return True
            self._share_prompts(rows)
            # --- sample
            for sid, row in sorted(rows.items()):
                s = self.slots[sid]
                try:
                    if sid in drafts:
                        self._verify(s, row, drafts[sid])
                    else:
                        self._sample(s, self.ctx.logits(row))
                except Exception as e:   # a sampler error fails that request only
                    if isinstance(e, (PowerInferError, ContextFull)):   # the model's / the request's: reported to it
                        log.debug("sampling failed: %s", e)
                    else:
                        log.exception("sampling failed")
                    self._finish(s, error=e)
            return True

    def _lora_of(self, task: Task) -> tuple:
        return self.lora if task.lora is None else task.lora

    def _step_lora(self, active: list[_Slot]) -> tuple:
        """The adapters this step runs with: the busy slots' sets taken in turn (one set per decode call)."""
        sets = list(dict.fromkeys(self._lora_of(s.task) for s in active))
        if len(sets) <= 1:
            return sets[0] if sets else self.lora
        self._lora_turn += 1
        return sets[self._lora_turn % len(sets)]

    def _recurrent_reuse(self, s: _Slot, n: int) -> int:
        """How many of slot s's cached tokens a request may keep (n: the common prefix): n itself, except on a
        model with recurrent layers, whose state holds every token the slot evaluated as one whole: there only all
        of them (n is exactly what the state absorbed), else none (the sequence is evaluated again from the start;
        the next decode removes it whole)."""
        if not self.recurrent or n == 0 or n == self.ctx.recurrent_pos(s.id) + 1:
            return n
        return 0

    def _draft(self, s: _Slot, budget: int) -> list[int]:
        """Draft tokens to evaluate after generating slot s's last token: at most the request's n_max, the batch's
        budget, the room left in the slot's context and the tokens it may still sample; none below n_min."""
        spec = s.task.speculative or self.spec
        if self.drafter is None or spec.n_max <= 0 or getattr(s.task, "images", None):
            return []   # (a drafter reads the sequence as tokens: image rows are none)
        n_max = min(spec.n_max, budget, s.n_ctx - s.n_past - 1)
        if s.task.n_predict > 0:          # rows sampled = 1 + drafts <= the tokens it may still sample
            n_max = min(n_max, s.task.n_predict - s.result.n_predicted - 1)
        if n_max < max(spec.n_min, 1):
            return []
        t0 = time.perf_counter()
        try:
            d = self.drafter.draft(s.id, s.cache[:s.n_past] + [s.last], n_max, spec.p_min)
        except Exception:                # a drafter's failure costs speed, never the request
            log.exception("drafter failed")
            d = []
        self.draft_ms += (time.perf_counter() - t0) * 1e3
        d = [int(t) for t in d[:n_max]]
        vocab = self.tokenizer.n_vocab
        bad = next((i for i, t in enumerate(d) if not 0 <= t < vocab), len(d))
        d = d[:bad]
        return d if len(d) >= spec.n_min else []

    def _verify(self, s: _Slot, r0: int, drafts: list[int]) -> None:
        """Sample slot s's rows r0.. (its last token, then the drafts) in turn, each as if it were the only row:
        go on while the sampled token is the draft token that row r0 + i + 1 evaluated; the first that differs
        (or the row after the last draft) becomes the slot's next token. Positions whose draft was not kept are
        stale: hidden by the causal mask and rewritten by the next step (regions), removed now (no regions)."""
        n0 = s.n_past - len(drafts) - 1          # the position of the last token, evaluated in row r0
        cache, res = s.cache, s.result
        res.n_drafted += len(drafts)
        self.n_drafted += len(drafts)
        keep = n0 + 1
        for i in range(len(drafts) + 1):
            keep = s.n_past = n0 + 1 + i
            s.cache = cache[:keep]
            self._sample(s, self.ctx.logits(r0 + i))
            if s.task is None or s.todo or i == len(drafts) or s.last != drafts[i]:
                break                            # finished, shifted, or the sampled token is s.last
            res.n_draft_accepted += 1
            self.n_draft_accepted += 1
            s.last = -1                          # drafts[i] is in the cache already
        if not self.regions and s.hw > keep:
            self.ctx.kv_seq_rm(s.id, keep, -1)
            s.hw = keep

    def _count_decode(self, seconds: float, n_prompt: int, n_eval: int) -> None:
        t = self.timings
        t.n_prompt += n_prompt
        t.n_eval += n_eval
        if n_prompt:
            t.prompt_ms += seconds * 1e3
        else:
            t.eval_ms += seconds * 1e3

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
        if task.logits_processor or task.stopping_criteria:
            ids = np.asarray(task.prompt_tokens + res.tokens, dtype=np.intc)
        if task.logits_processor:
            logits = np.array(logits, dtype=np.float32)
            for proc in task.logits_processor:
                logits = np.asarray(proc(ids, logits), dtype=np.float32)
        t0 = time.perf_counter()
        tok = sample_token(s.sampler, logits, s.matcher.banned() if s.matcher is not None else None)
        self.timings.sample_ms += (time.perf_counter() - t0) * 1e3
        self.timings.n_sample += 1
        info = None
        if task.n_probs > 0:
            info = self._probs(logits, tok, task.n_probs)
        elif task.want_ids:
            info = {"id": tok}
        if tok in s.eog:
            res.stop_type, res.eog_token = "eos", tok
            self._finish(s)
            return
        if s.matcher is not None:
            s.matcher.accept(tok)
        res.tokens.append(tok)
        res.n_predicted += 1
        piece = s.decoder.push(tok)
        emitted = s.stop.push(piece)
        if emitted or info is not None:
            res.text += emitted
            if info is not None:
                info["piece"] = piece
            self._emit(task, ("token", emitted, info))
        if s.stop.word is not None:
            res.stop_type, res.stopping_word = "word", s.stop.word
            self._finish(s)
            return
        if s.matcher is not None and s.matcher.done:     # only end of generation may follow
            res.stop_type = "eos"
            self._finish(s)
            return
        if task.stopping_criteria:
            ids = np.append(ids, np.intc(tok))
            if any(bool(c(ids, logits)) for c in task.stopping_criteria):
                res.stop_type = "word"
                self._finish(s)
                return
        if task.n_predict > 0 and res.n_predicted >= task.n_predict:
            res.stop_type = "limit"
            self._finish(s)
            return
        if s.n_past >= s.n_ctx and task.context_shift:
            self._shift(s, tok)
            return
        if s.n_past >= s.n_ctx:
            res.stop_type = "limit"
            res.truncated = True
            self._finish(s)
            return
        s.last = tok

    def _shift(self, s: _Slot, tok: int) -> None:
        """Context shift of a full slot (Task.context_shift): keep what shift_tokens keeps of its
        tokens and `tok`; the cells after the first n_keep are dropped and the rest is evaluated again
        (the core cannot move cached keys to new positions), then generation goes on."""
        kept, n_keep = shift_tokens(s.cache[:s.n_past] + [tok], s.task.n_keep, s.n_ctx)
        if self.recurrent:   # the recurrent state cannot drop the discarded tokens: every kept token again
            n_keep = 0
        self.ctx.kv_seq_rm(s.id, n_keep, -1)
        s.cache = s.cache[:n_keep]
        s.n_past = s.hw = n_keep
        s.todo = kept[n_keep:]
        s.last = -1
        s.result.n_shifts += 1

    def _probs(self, logits: np.ndarray, tok: int, n: int) -> dict:
        x = logits.astype(np.float64)
        m = x.max()
        lse = m + math.log(np.exp(x - m).sum())
        n = min(n, x.size)
        top = np.argpartition(-x, n - 1)[:n]
        top = top[np.lexsort((top, -x[top]))]
        return {"id": int(tok), "logprob": float(x[tok] - lse),
                "top": [(int(t), float(x[t] - lse)) for t in top]}
