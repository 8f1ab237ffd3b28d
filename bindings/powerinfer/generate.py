"""Generation: prompt -> stream of tokens, with llama.cpp-style timings."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from ._ffi import PowerInferError
from .context import Context
from .sampling import Sampler


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


class Generator:
    """Feeds tokens into one sequence of a Context and samples continuations.

    The generator remembers what is in the KV cache (`self.tokens`), so an
    interactive loop can keep appending user input and generating.
    """

    def __init__(self, ctx: Context, sampler: Sampler, *, seq_id: int = 0, timings: Timings | None = None,
                 context_shift: bool = False, n_keep: int = 0):
        self.ctx = ctx
        self.sampler = sampler
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self.timings = timings or Timings()
        self._pending_logits = None
        self._undecoded: list[int] = []
        self.context_full = False
        # context shift (llama.cpp's --context-shift / --keep): when the context is full, keep the first
        # n_keep tokens, drop the older half of the others and go on
        self.context_shift = context_shift
        self.n_keep = n_keep
        self.n_shifts = 0

    def _shift(self, new: list[int]) -> None:
        """Evaluate `new` after the cached tokens when together they overflow the context: keep the
        first n_keep tokens, drop the older half of the others (more if `new` needs it) and evaluate
        what is kept again, in one batch, since the core cannot re-rotate cached keys to new positions.
        ContextFull if nothing but the kept tokens would remain."""
        full = self.tokens + list(new)
        n_keep = min(max(self.n_keep, 0), len(full), max(self.ctx.n_ctx - 4, 0))   # llama.cpp's cap
        n_left = len(full) - n_keep
        n_discard = max(n_left // 2, len(full) - self.ctx.n_ctx)
        if n_discard >= n_left:
            raise ContextFull(f"{len(full)} tokens do not fit in the context of {self.ctx.n_ctx}, even after a "
                              f"context shift keeping {n_keep}")
        kept = full[:n_keep] + full[n_keep + n_discard:]
        self.ctx.kv_seq_rm(self.seq_id, 0, -1)
        self.tokens = []
        t0 = time.perf_counter()
        self.ctx.decode(kept, seq_id=self.seq_id, pos=range(len(kept)))
        self.timings.prompt_ms += (time.perf_counter() - t0) * 1e3
        self.timings.n_prompt += len(kept)
        self.tokens = kept
        self._pending_logits = self.ctx.logits()
        self.n_shifts += 1

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def feed(self, tokens: Iterable[int]) -> None:
        """Evaluate tokens (a prompt or user input) in one batched decode."""
        tokens = self._undecoded + list(tokens)
        self._undecoded = []
        if not tokens:
            return
        if self.n_past + len(tokens) > self.ctx.n_ctx:
            if not self.context_shift:
                raise ContextFull(f"{self.n_past + len(tokens)} tokens do not fit in the context of "
                                  f"{self.ctx.n_ctx}")
            self._shift(tokens)
        else:
            t0 = time.perf_counter()
            self.ctx.decode(tokens, seq_id=self.seq_id, pos=range(self.n_past, self.n_past + len(tokens)))
            self.timings.prompt_ms += (time.perf_counter() - t0) * 1e3
            self.timings.n_prompt += len(tokens)
            self.tokens += tokens
            self._pending_logits = self.ctx.logits()
        for t in tokens:
            self.sampler.accept(t)

    def generate(self, n_predict: int = -1, *, eog_ids: Iterable[int] = ()) -> Iterator[int]:
        """Yield sampled tokens until an end-of-generation token (yielded, not evaluated),
        n_predict tokens (-1: no limit) or a full context (then `context_full` is set)."""
        if self._pending_logits is None:
            raise RuntimeError("generate: feed() a prompt first")
        eog = set(eog_ids)
        self.context_full = False
        n = 0
        while n_predict < 0 or n < n_predict:
            t0 = time.perf_counter()
            try:
                token = self.sampler.sample(self._pending_logits)
            except ValueError as e:       # NaN / +inf logits: the model's fault, not the caller's
                raise PowerInferError(f"cannot sample the next token: {e} (the model produced invalid logits; "
                                      "the file may be corrupt)") from None
            self.sampler.accept(token)
            self.timings.sample_ms += (time.perf_counter() - t0) * 1e3
            self.timings.n_sample += 1
            n += 1
            yield token
            if token in eog:
                self._pending_logits = None
                return
            if self.n_past >= self.ctx.n_ctx and n != n_predict and self.context_shift:
                self._shift([token])           # evaluates the token with what is kept
                continue
            if n == n_predict or self.n_past >= self.ctx.n_ctx:
                self._undecoded = [token]      # evaluated by the next feed(), if any
                self._pending_logits = None
                self.context_full = n != n_predict
                return
            t0 = time.perf_counter()
            self.ctx.decode([token], seq_id=self.seq_id, pos=[self.n_past])
            self.timings.eval_ms += (time.perf_counter() - t0) * 1e3
            self.timings.n_eval += 1
            self.tokens.append(token)
            self._pending_logits = self.ctx.logits()
