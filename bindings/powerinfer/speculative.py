"""Speculative decoding's drafters: what proposes the tokens the Engine then checks in one decode call.

The Engine (engine.py) evaluates a generating slot's last sampled token together with up to n_max draft
tokens, then samples each row with the request's own sampler, in order, keeping a draft token only while
the sampled token equals it (llama.cpp's "sample and accept"). Every kept token is thus one the target
model sampled from its own distribution with the sampler's next random draw: the output is the one of
plain decoding, token for token, for any sampler and seed (a batch's rows are the bits of one token at a
time: the numeric contract). Drafts only change the speed.

Drafters (`Drafter.draft(seq, tokens, n_max) -> list[int]`, tokens = the sequence so far, its last token
sampled but not evaluated yet):

* `PromptLookup`: no second model; the tokens that followed the most recent earlier occurrence of the
  sequence's last n-gram (llama.cpp's `--spec-type ngram-simple`, llama-cpp-python's
  `LlamaPromptLookupDecoding`). Pays where the output repeats its input: edits, extraction, code.
* `DraftModel`: a smaller model with the same vocabulary, run greedily in its own Context, one sequence per
  slot, stopping where its top token's probability falls below p_min (llama.cpp's `-md` / `--draft-p-min`).
* `CallableDrafter`: llama-cpp-python's draft-model interface, `fn(input_ids: intc array) -> draft ids`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ._ffi import PowerInferError
from .context import Context
from .request import common_prefix
from .tokenizer import Tokenizer

log = logging.getLogger("powerinfer.speculative")

__all__ = ["CallableDrafter", "DraftModel", "Drafter", "FirstOf", "PromptLookup", "SpecParams",
           "check_vocab_compatible", "make_drafter"]


@dataclass
class SpecParams:
    """How much to draft: at most n_max tokens per step (0: no speculation), none when the drafter offers fewer
    than n_min; a draft model stops below p_min (None: its own) (llama.cpp's --draft-max, --draft-min,
    --draft-p-min, and the server's per-request speculative.n_max / n_min / p_min)."""
    n_max: int = 16
    n_min: int = 0
    p_min: float | None = None

    def validate(self) -> None:
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (self.n_max, self.n_min))
        if not ok:
            raise ValueError(f"draft sizes must be non-negative integers, got n_max={self.n_max!r}, "
                             f"n_min={self.n_min!r}")
        if self.p_min is not None and not (isinstance(self.p_min, (int, float)) and 0.0 <= self.p_min <= 1.0):
            raise ValueError(f"draft p_min must be a number in [0, 1], got {self.p_min!r}")


class Drafter:
    """Proposes tokens that may follow a sequence. seq: the engine slot's id (a drafter with state keeps one
    sequence per slot); tokens: the sequence so far; n_max >= 1; p_min: a model's confidence bound (None: its
    own; drafters without one ignore it)."""

    def draft(self, seq: int, tokens: list[int], n_max: int, p_min: float | None = None) -> list[int]:
        raise NotImplementedError


class FirstOf(Drafter):
    """The first non-empty draft of several drafters (llama.cpp: a draftless method before the draft model)."""

    def __init__(self, drafters: list[Drafter]):
        self.drafters = list(drafters)

    def draft(self, seq: int, tokens: list[int], n_max: int, p_min: float | None = None) -> list[int]:
        for d in self.drafters:
            out = d.draft(seq, tokens, n_max, p_min)
            if out:
                return out
        return []


class PromptLookup(Drafter):
    """Drafts from the sequence itself: finds the most recent earlier occurrence of its last n tokens, for n
    from ngram_max down to ngram_min, and proposes the (at most n_draft) tokens that followed it.
    llama.cpp's ngram-simple is ngram_min = ngram_max = --spec-ngram-size-n, n_draft = --spec-ngram-size-m."""

    def __init__(self, ngram_max: int = 12, ngram_min: int | None = None, n_draft: int = 48):
        ngram_min = ngram_max if ngram_min is None else ngram_min
        if not 1 <= ngram_min <= ngram_max or n_draft < 1:
            raise ValueError(f"prompt lookup needs 1 <= ngram_min <= ngram_max and n_draft >= 1, got "
                             f"ngram_min={ngram_min}, ngram_max={ngram_max}, n_draft={n_draft}")
        self.ngram_max, self.ngram_min, self.n_draft = ngram_max, ngram_min, n_draft

    def draft(self, seq: int, tokens: list[int], n_max: int, p_min: float | None = None) -> list[int]:
        hist = np.asarray(tokens, dtype=np.int64)            # [n]
        n_max = min(n_max, self.n_draft)
        for n in range(min(self.ngram_max, len(hist) - 1), self.ngram_min - 1, -1):
            start = self._continuation(hist, n)
            if start >= 0:
                return hist[start:start + n_max].tolist()
        return []

    @staticmethod
    def _continuation(hist: np.ndarray, n: int) -> int:
        """Where the tokens after the most recent earlier occurrence of hist[-n:] begin; -1: none."""
        key = hist[-n:]
        # candidate ends: positions j < len - 1 holding key's last token, with room for the n-gram before them
        ends = np.flatnonzero(hist[n - 1:-1] == key[-1]) + (n - 1)         # [m]
        for k in range(1, n):                                              # narrow the candidates, column by column
            if not ends.size:
                return -1
            ends = ends[hist[ends - k] == key[-1 - k]]
        return int(ends[-1]) + 1 if ends.size else -1


class CallableDrafter(Drafter):
    """llama-cpp-python's draft-model interface (`LlamaDraftModel`): fn(input_ids: intc [n]) -> draft ids."""

    def __init__(self, fn):
        self.fn = fn

    def draft(self, seq: int, tokens: list[int], n_max: int, p_min: float | None = None) -> list[int]:
        out = self.fn(np.asarray(tokens, dtype=np.intc))
        return [int(t) for t in np.asarray(out).reshape(-1)[:n_max]]


def check_vocab_compatible(target: Tokenizer, draft: Tokenizer) -> None:
    """ValueError unless the draft model's tokens mean what the target's do (llama.cpp's check: the same kind of
    tokenizer and special tokens, vocabularies at most 128 apart in size, the same text for every shared id)."""
    def fail(why: str):
        raise ValueError(f"the draft model's vocabulary does not match the target model's: {why}")
    if type(target) is not type(draft):
        fail(f"tokenizer {type(draft).__name__} vs {type(target).__name__}")
    if abs(target.n_vocab - draft.n_vocab) > 128:
        fail(f"{draft.n_vocab} tokens vs {target.n_vocab} (at most 128 apart)")
    if (target.bos_id, target.eos_id) != (draft.bos_id, draft.eos_id):
        fail(f"BOS/EOS {draft.bos_id}/{draft.eos_id} vs {target.bos_id}/{target.eos_id}")
    n = min(target.n_vocab, draft.n_vocab)
    if target._tokens[:n] != draft._tokens[:n]:
        i = next(i for i in range(n) if target._tokens[i] != draft._tokens[i])
        fail(f"token {i} is {draft._tokens[i]!r} vs {target._tokens[i]!r}")


class DraftModel(Drafter):
    """A smaller model of the same vocabulary, run greedily: its own Context (n_seq_max >= the engine's slots),
    sequence `seq` holding what it last saw of slot seq, so each call evaluates only the tokens that changed.
    Drafting stops at the first token whose probability is below p_min, at a token the target's vocabulary
    lacks, or when the draft context is full. n_vocab: the target's."""

    def __init__(self, ctx: Context, *, p_min: float = 0.75, n_vocab: int | None = None):
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"draft p_min must be in [0, 1], got {p_min}")
        if ctx.recurrent:
            raise ValueError("a draft model with recurrent layers (qwen35, qwen3next) is not supported: its state "
                             "cannot drop the rejected drafts")
        self.ctx = ctx
        self.p_min = p_min
        self.n_vocab = n_vocab or ctx.model.n_vocab
        self.cache: dict[int, list[int]] = {}      # seq -> the tokens whose KV the draft context holds

    def draft(self, seq: int, tokens: list[int], n_max: int, p_min: float | None = None) -> list[int]:
        ctx = self.ctx
        p_min = self.p_min if p_min is None else p_min
        n_max = min(n_max, ctx.n_ctx - len(tokens))
        if n_max <= 0 or seq >= ctx.n_seq_max:
            return []
        cached = self.cache.get(seq, [])
        n = common_prefix(cached, tokens[:-1])       # reused; the last token is evaluated again for its logits
        try:
            ctx.kv_seq_rm(seq, n, -1)
            self.cache[seq] = held = cached[:n]
            for i in range(n, len(tokens), ctx.n_batch):
                chunk = tokens[i:i + ctx.n_batch]
                ctx.decode(chunk, pos=range(i, i + len(chunk)), seq_id=seq)
                held += chunk
            out: list[int] = []
            while True:
                logits = ctx.logits()                                   # [n_vocab_draft]
                tok = int(np.argmax(logits))
                p = 1.0 / float(np.exp(logits - logits[tok]).sum())
                if p < p_min or tok >= self.n_vocab:
                    break
                out.append(tok)
                if len(out) == n_max:
                    break
                ctx.decode([tok], pos=[len(held)], seq_id=seq)
                held.append(tok)
            return out
        except PowerInferError as e:       # e.g. the draft context ran out of cells: no draft this time
            log.warning("draft model: %s; this step goes without a draft", e)
            ctx.kv_seq_rm(seq, 0, -1)
            self.cache[seq] = []
            return []


def make_drafter(draft, *, target_tokenizer: Tokenizer, n_ctx: int, n_seq_max: int = 1, n_threads: int | None = None,
                 p_min: float = 0.75, kv_type="f16", n_batch: int = 512) -> Drafter | None:
    """The drafter `draft` names: None; a Drafter; a callable (llama-cpp-python's LlamaDraftModel); a draft
    model's Context; or the path of a draft model's GGUF file, loaded into a Context of n_ctx cells and n_seq_max
    sequences (one per engine slot). A draft model's vocabulary is checked against the target's."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, Context):
        check_vocab_compatible(target_tokenizer, draft.model.tokenizer)
        return DraftModel(draft, p_min=p_min, n_vocab=target_tokenizer.n_vocab)
    if callable(draft):
        return CallableDrafter(draft)
    from .model import Model
    model = Model(draft)
    check_vocab_compatible(target_tokenizer, model.tokenizer)
    ctx = Context(model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=n_threads, kv_type=kv_type, n_batch=n_batch)
    return DraftModel(ctx, p_min=p_min, n_vocab=target_tokenizer.n_vocab)
