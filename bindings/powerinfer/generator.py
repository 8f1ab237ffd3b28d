"""The examples' ways of generating, as requests of an Engine (which samples, ends generations, matches
stop strings and shifts the context for them):

* `Generator`: one sequence that a caller keeps feeding (main.py's plain, interactive and chat modes);
* `decode_parallel`: N continuations of one prompt, the prompt decoded once and shared (batched.py).

Both run the engine inline, in the caller's thread, without regions (one run of requests that start
together: every sequence's cells are in position order, as when it runs alone).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from .context import Context
from .engine import ContextFull, Engine, Timings, shift_tokens
from .request import Result, Task
from .sampling import Sampler
from .tokenizer import StreamDecoder

__all__ = ["BatchedResult", "Generator", "decode_parallel"]


class Generator:
    """One sequence of a Context that a caller keeps feeding: feed() adds tokens, generate() samples
    a continuation (each is one Task of a one-slot engine, its prompt the sequence so far: the KV
    already there is reused, so only the new tokens are evaluated).

    `tokens` is the sequence: after generate() exactly what the KV cache holds, and nothing else of
    the context is; with context_shift, a sequence that would fill the context drops old tokens
    instead of ending (llama.cpp's --context-shift / --keep; see shift_tokens). drafter / spec: speculative
    decoding (Engine's; powerinfer.speculative)."""

    def __init__(self, ctx: Context, sampler: Sampler, *, timings: Timings | None = None,
                 context_shift: bool = False, n_keep: int = 0, drafter=None, spec=None):
        self.engine = Engine(ctx, ctx.model.tokenizer, 1, regions=False, timings=timings, drafter=drafter, spec=spec)
        self.ctx = ctx
        self.sampler = sampler
        self.context_shift = context_shift
        self.n_keep = n_keep
        self.tokens: list[int] = []
        self._undecoded: list[int] = []     # the last sampled token, evaluated by the next feed()
        self._fed = False                   # tokens were fed since the last generate()
        self.context_full = False
        self.n_shifts = 0
        self.result: Result | None = None  # how the last generate() ended
        self.images: dict = {}              # powerinfer.multimodal: hash -> embeddings of the image rows fed

    @property
    def timings(self) -> Timings:
        return self.engine.timings

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def stop_word(self) -> str | None:
        """The stop string that ended the last generate(), if one did."""
        return self.result.stopping_word if self.result is not None and self.result.stop_type == "word" else None

    @property
    def hit_eog(self) -> bool:
        """The last generate() ended at an end-of-generation token."""
        return self.result is not None and self.result.eog_token >= 0

    def keep_prompt(self, prompt_ids: list[int], keep: int) -> None:
        """n_keep from --keep as llama.cpp counts it: prompt tokens after the BOS (-1: the whole
        prompt); the BOS is kept too."""
        bos_id = self.ctx.model.tokenizer.bos_id
        bos = 1 if prompt_ids and bos_id is not None and prompt_ids[0] == bos_id else 0
        self.n_keep = len(prompt_ids) if keep < 0 or keep + bos > len(prompt_ids) else keep + bos

    def load_state(self, tokens: list[int], state: bytes, keep: int | None = None) -> None:
        """The sequence becomes tokens[:keep] (default: all), their KV rows written from `state` (the KV state of
        positions 0..len(tokens)-1, e.g. read from a --prompt-cache file) into an emptied cache: what is fed next
        is evaluated after them. ValueError for a state that does not fit this context."""
        self.engine.restore_slot_state(0, tokens, state, keep=keep)
        self.tokens = list(tokens[:keep] if keep is not None else tokens)
        self._undecoded, self._fed = [], False

    def state(self, n: int | None = None) -> tuple[list[int], bytes]:
        """(the first n tokens of the sequence (default: all), the KV state of their positions)."""
        tokens = self.tokens[:n] if n is not None else list(self.tokens)
        return tokens, self.ctx.kv_seq_state(0, 0, len(tokens))

    def restart(self) -> None:
        """Forget the sequence: the next feed() starts a new one in an empty KV cache."""
        self.engine.invalidate()
        self.tokens, self._undecoded, self._fed = [], [], False

    def feed(self, tokens: Iterable[int]) -> None:
        """Add tokens (a prompt or user input) to the sequence; ContextFull if they do not fit (and
        context_shift is off)."""
        tokens = self._undecoded + list(tokens)
        self._undecoded = []
        if not tokens:
            return
        seq = self.tokens + tokens
        if len(seq) >= self.ctx.n_ctx and not self.context_shift:    # leaves no room to generate
            raise ContextFull(f"{len(seq)} tokens do not fit in the context of {self.ctx.n_ctx}")
        if len(seq) > self.ctx.n_ctx:            # a full context shifts after the next token
            seq, _ = shift_tokens(seq, self.n_keep, self.ctx.n_ctx)
            self.n_shifts += 1
        self.tokens = seq
        self._fed = True
        for t in tokens:
            if t >= 0:   # not an image row (powerinfer.multimodal's placeholders)
                self.sampler.accept(t)

    def generate(self, n_predict: int = -1, *, stop=(), stop_token_ids: Iterable[int] = (),
                 grammar=None) -> Iterator[int]:
        """Yield sampled tokens until an end-of-generation token (not yielded; see end_of_generation:
        the sampler's ignore_eos, plus stop_token_ids), a stop string (text passes on at once: main's
        reverse prompts), n_predict tokens (-1: no limit), a full context (then `context_full` is set)
        or the end of `grammar` (a powerinfer.grammar.Grammar the tokens follow). Closing the iterator
        early ends the generation; the token it yielded last is then not part of the sequence."""
        if not self._fed:
            raise RuntimeError("generate: feed() a prompt first")
        self._fed = False
        self.context_full = False
        task = Task(self.tokens, self.sampler.params, n_predict=n_predict, stop=list(stop), hide_stop=False,
                    stop_token_ids=stop_token_ids, want_ids=True, sampler=self.sampler, grammar=grammar,
                    context_shift=self.context_shift, n_keep=self.n_keep)
        if self.images:
            task.images = self.images   # powerinfer.multimodal: the embeddings of the sequence's image rows
        self.result = None
        events = self.engine.events(task)
        try:
            for ev in events:
                if ev[0] == "token" and ev[2] is not None:
                    yield ev[2]["id"]
                elif ev[0] == "done":
                    self._ended(ev[1])
                elif ev[0] == "error":
                    raise ev[1]
        finally:
            if not events.done:              # closed early: the task is cancelled, its Result queued
                events.close()
                while not events.q.empty():
                    ev = events.q.get_nowait()
                    if ev[0] == "done":
                        self._ended(ev[1])
            self.tokens = list(self.engine.slots[0].cache)

    def _ended(self, res: Result) -> None:
        self.result = res
        self.n_shifts += res.n_shifts
        self.context_full = res.truncated
        # a generation that stopped at its limit (or the grammar's end) leaves its last token to be
        # evaluated with what is fed next; one that ended at a token or a stop string does not
        limit = res.stop_type == "limit" or (res.stop_type == "eos" and res.eog_token < 0)
        self._undecoded = res.tokens[-1:] if limit else []


@dataclass
class BatchedResult:
    tokens: list[list[int]]              # generated tokens of each sequence (the end-of-text token excluded)
    texts: list[str]                     # their text
    finished_at: list[int]               # n_cur (prompt + generated tokens) when each sequence ended
    n_decode: int = 0                    # tokens decoded after the prompt (all sequences)
    n_steps: int = 0                     # decode calls after the prompt
    t_gen_s: float = 0.0                 # seconds from the first sample to the end
    timings: Timings = field(default_factory=Timings)


def decode_parallel(ctx: Context, prompt_ids: list[int], n_len: int, samplers: list[Sampler],
                    eog_ids=(), on_token=None, on_finish=None, timings: Timings | None = None) -> BatchedResult:
    """Decode prompt_ids once into sequence 0, share it with sequences 1..N-1 (N = len(samplers);
    Task.prompt_from), then extend every sequence by one token per step in a single decode call until
    an end-of-generation token (end_of_generation with eog_ids as stop tokens) or a total length of
    n_len. on_token(s, token, piece) / on_finish(s, n_cur) are called as it goes. Sequence s equals a
    single-sequence run with samplers[s] (every row is computed independently).
    As llama.cpp's batched, a sequence's last token is evaluated too: the engine samples one more,
    which is not kept (so its n_predict is n_len - n_prompt + 1)."""
    n_gen = n_len - len(prompt_ids)           # tokens kept per sequence at most
    ctx.kv_clear()
    engine = Engine(ctx, ctx.model.tokenizer, len(samplers), regions=False, timings=timings)
    res = BatchedResult(tokens=[[] for _ in samplers], texts=[""] * len(samplers), finished_at=[-1] * len(samplers),
                        timings=engine.timings)
    decoders = [StreamDecoder(ctx.model.tokenizer, strip_leading_space=False) for _ in samplers]
    errors: list[Exception] = []
    t_first: list[float] = []

    def emitter(s: int):
        def emit(ev):
            if ev[0] == "token" and ev[2] is not None:
                t_first[:] = t_first or [time.perf_counter()]
                if len(res.tokens[s]) < n_gen:
                    res.tokens[s].append(ev[2]["id"])
                    piece = decoders[s].push(ev[2]["id"])
                    res.texts[s] += piece
                    if on_token:
                        on_token(s, ev[2]["id"], piece)
            elif ev[0] == "done":
                res.texts[s] += decoders[s].flush()
                res.finished_at[s] = len(prompt_ids) + len(res.tokens[s])
                if on_finish:
                    on_finish(s, res.finished_at[s])
            elif ev[0] == "error":
                errors.append(ev[1])
        return emit

    tasks: list[Task] = []
    for s, smp in enumerate(samplers):
        for t in prompt_ids:
            smp.accept(t)
        tasks.append(engine.submit(Task(prompt_ids, smp.params, n_predict=n_gen + 1, stop_token_ids=eog_ids,
                                        want_ids=True, sampler=smp, cache_prompt=False,
                                        prompt_from=tasks[0] if tasks else None, emit=emitter(s))))
    for task in tasks:
        engine.run_until_done(task)
    if errors:
        raise errors[0]
    res.n_decode = sum(map(len, res.tokens))
    res.n_steps = max(map(len, res.tokens))
    res.t_gen_s = time.perf_counter() - t_first[0] if t_first else 0.0
    return res
