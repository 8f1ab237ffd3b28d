"""llama-cpp-python's token-level loop: `Llama.eval`, `sample`, `generate(tokens)`, `reset`, with the state its
callers read and write (`n_tokens`, `input_ids`, `scores`, `_input_ids`, `_scores`, `eval_tokens`).

One sequence, driven by the caller token by token, lives in slot 0 of the engine (`Engine.eval_in_slot0`): its KV
is the slot's prompt cache, so a completion whose prompt starts with the loop's tokens reuses them, and a
completion run in between costs the loop only the re-evaluation of what it overwrote (the same bits: logits are a
function of the tokens). As in llama-cpp-python:

* `eval(tokens)` appends tokens after the first `n_tokens` (what lies beyond is dropped), in `n_batch` chunks;
* `scores` holds every evaluated position's logits with `logits_all=True` ([n_ctx, n_vocab], filled up to
  n_tokens), otherwise the logits of the last position only ([1, n_vocab]);
* `sample()` samples the logits after position `idx` (default: the last) through a fresh sampler chain
  (penalties over nothing, as llama-cpp-python's temporary sampler; `logits_processor` first, a grammar from its
  start); `temp < 0` samples the unmodified distribution, `temp == 0` is greedy;
* `generate(tokens)` reuses the longest prefix it shares with the loop's tokens (at least one token is evaluated
  again so there are logits to sample), then yields sampled token ids forever, end-of-generation tokens included
  (the caller decides when to stop); one sampler for the whole generation, whose penalty window
  (`last_n_tokens_size`) holds the tokens it sampled, and one grammar state. `gen.send(tokens)` appends tokens to
  evaluate after the yielded one: each is checked against what the model samples there and kept while they agree
  (llama-cpp-python's draft verification). stopping_criteria(input_ids, logits) gets the ids up to and including
  the new token and the logits it was sampled from (the engine's convention; llama-cpp-python passes another
  row there).
"""
from __future__ import annotations

from typing import Generator, Sequence

import numpy as np

from .engine import Engine, sample_token
from .sampling import Sampler, SamplingParams

__all__ = ["TokenLoop"]


class TokenLoop:
    def __init__(self, engine: Engine, n_vocab: int, *, logits_all: bool = False, last_n_tokens_size: int = 64,
                 seed=lambda: -1, eog_ids=frozenset(), tokenizer=None):
        self.engine = engine
        self.n_vocab = n_vocab
        self.n_ctx = engine.n_ctx_slot
        self.logits_all = logits_all
        self.last_n_tokens_size = last_n_tokens_size
        self._seed = seed                   # the owner's seed, read when a sampler is made
        self._eog, self._tokenizer = eog_ids, tokenizer
        self.input_ids = np.zeros(self.n_ctx, dtype=np.intc)     # [n_ctx] tokens 0..n_tokens-1 are evaluated
        self._all: np.ndarray | None = None      # logits_all: [n_ctx, n_vocab] row p = logits after token p
        self._rows = np.zeros((0, n_vocab), dtype=np.float32)    # [k, n_vocab] logits of the last eval's last k tokens
        self._rows_end = 0                       # they end at this position (n_tokens when they are current)
        self.n_tokens = 0

    # ---- state llama-cpp-python's callers read
    @property
    def scores(self) -> np.ndarray:
        """logits_all: [n_ctx, n_vocab] (rows 0..n_tokens-1 valid); otherwise [1, n_vocab], the last position's."""
        if self.logits_all:
            return self._all if self._all is not None else np.zeros((self.n_ctx, self.n_vocab), dtype=np.float32)
        return self._rows[-1:] if self._rows_end == self.n_tokens and len(self._rows) else \
            np.zeros((1, self.n_vocab), dtype=np.float32)

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[:self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[:self.n_tokens]

    @property
    def eval_tokens(self) -> list[int]:
        return self.input_ids[:self.n_tokens].tolist()

    def logits(self, idx: int | None = None) -> np.ndarray:
        """[n_vocab] the logits after position idx (None: the last evaluated one)."""
        idx = self.n_tokens - 1 if idx is None else int(idx)
        if not 0 <= idx < self.n_tokens:
            raise ValueError(f"no logits at position {idx}: {self.n_tokens} tokens are evaluated")
        if self.logits_all:
            return self._all[idx]
        first = self._rows_end - len(self._rows)
        if self._rows_end != self.n_tokens or not first <= idx < self._rows_end:
            raise ValueError(f"no logits at position {idx}: without logits_all only the last evaluated position's "
                             "are kept")
        return self._rows[idx - first]

    # ---- the loop
    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens: Sequence[int], *, keep_rows: bool = False) -> None:
        """Evaluate tokens after the first n_tokens. keep_rows: keep every one's logits (generate's verification)."""
        toks = [int(t) for t in tokens]
        if not toks:
            return
        if any(not 0 <= t < self.n_vocab for t in toks):
            raise ValueError(f"eval: token ids must be in [0, {self.n_vocab})")
        if not 0 <= self.n_tokens <= self.n_ctx:
            raise ValueError(f"n_tokens = {self.n_tokens} is outside [0, {self.n_ctx}]")
        n0 = self.n_tokens
        if n0 + len(toks) > self.n_ctx:
            raise ValueError(f"Requested tokens ({n0 + len(toks)}) exceed context window of {self.n_ctx}")
        rows = self.engine.eval_in_slot0(self.input_ids[:n0].tolist(), toks, self.logits_all or keep_rows)
        self.input_ids[n0:n0 + len(toks)] = toks
        self.n_tokens = n0 + len(toks)
        if self.logits_all:
            if self._all is None:
                self._all = np.zeros((self.n_ctx, self.n_vocab), dtype=np.float32)
            self._all[n0:self.n_tokens] = rows
        self._rows, self._rows_end = rows, self.n_tokens

    def sampler(self, *, temp=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, repeat_penalty=1.0,
                frequency_penalty=0.0, presence_penalty=0.0, mirostat_mode=0, mirostat_tau=5.0,
                mirostat_eta=0.1) -> Sampler:
        """llama-cpp-python's sampler chain: penalties, top-k, typical, top-p, min-p, temperature (mirostat instead
        of the truncations when asked); temp < 0: the unmodified distribution; temp == 0: greedy."""
        params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=self.last_n_tokens_size,
                                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                mirostat=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                                seed=self._seed(), min_keep=1)
        if temp < 0:
            params.temperature, params.top_k, params.top_p, params.min_p, params.typical_p = 1.0, 0, 1.0, 0.0, 1.0
            params.mirostat = 0
        return Sampler(params, tokenizer=self._tokenizer)

    def _sample_with(self, sampler: Sampler, logits: np.ndarray, logits_processor, matcher) -> int:
        if logits_processor:
            logits = np.array(logits, dtype=np.float32)
            for proc in logits_processor:
                logits = np.asarray(proc(self._input_ids, logits), dtype=np.float32)
        return sample_token(sampler, logits, matcher.banned() if matcher is not None else None)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor=None, grammar=None,
               idx: int | None = None) -> int:
        """A token sampled from the logits after position idx (None: the last); a fresh sampler each call.
        tfs_z and penalize_nl are accepted and change nothing (llama.cpp dropped both; so does llama-cpp-python)."""
        if self.n_tokens <= 0:
            raise ValueError("sample: nothing is evaluated yet (eval some tokens first)")
        sampler = self.sampler(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                               repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                               presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                               mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta)
        return self._sample_with(sampler, self.logits(idx), logits_processor, self._matcher(grammar))

    def _matcher(self, grammar):
        if grammar is None:
            return None
        from .grammar import Grammar, GrammarMatcher
        if isinstance(grammar, str):
            grammar = Grammar.from_gbnf(grammar)
        if not isinstance(grammar, Grammar):
            raise ValueError("grammar: give GBNF text or a powerinfer.Grammar (llama_cpp.LlamaGrammar objects "
                             "are llama.cpp's)")
        return GrammarMatcher(grammar, self._tokenizer, self.n_vocab)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor=None, stopping_criteria=None,
                 grammar=None) -> Generator[int, Sequence[int] | None, None]:
        """Token ids sampled after `tokens`, forever (the module doc)."""
        sampler = self.sampler(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                               repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                               presence_penalty=presence_penalty, mirostat_mode=mirostat_mode,
                               mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta)
        matcher = self._matcher(grammar)
        return self._generate(list(tokens), reset, sampler, matcher, logits_processor, stopping_criteria)

    def _generate(self, tokens, reset, sampler, matcher, logits_processor, stopping_criteria):
        if not tokens:
            raise ValueError("generate: no tokens")
        if reset:
            n = self.n_tokens
            shared = int(np.argmin(np.append(self.input_ids[:min(n, len(tokens))] ==
                                             np.asarray(tokens[:n], dtype=np.intc), False)))
            if shared == n == len(tokens) and self._rows_end == n and len(self._rows):
                tokens = []                      # the whole prompt is evaluated and its logits are at hand
            else:
                self.n_tokens = min(shared, len(tokens) - 1)    # one token at least is evaluated: logits to sample
                tokens = tokens[self.n_tokens:]
        sample_idx = self.n_tokens + len(tokens) - 1
        while True:
            self.eval(tokens, keep_rows=sample_idx < self.n_tokens + len(tokens) - 1)
            while sample_idx < self.n_tokens:
                logits = self.logits(sample_idx)
                token = self._sample_with(sampler, logits, logits_processor, matcher)
                if matcher is not None and token not in self._eog:
                    matcher.accept(token)
                sample_idx += 1
                if stopping_criteria is not None:
                    ids = np.append(self.input_ids[:sample_idx], np.intc(token))
                    if any(bool(c(ids, logits)) for c in stopping_criteria):
                        return
                sent = yield token
                tokens = [token] + ([int(t) for t in sent] if sent is not None else [])
                if sample_idx < self.n_tokens and token != self.input_ids[sample_idx]:
                    self.n_tokens = sample_idx     # a sent token the model did not sample: it and what follows go
                    break

    def restore(self, tokens, scores: np.ndarray | None) -> None:
        """The state of a save: tokens evaluated (their KV restored by the engine) and their saved logits."""
        n = len(tokens)
        if n > self.n_ctx:
            raise ValueError(f"the saved token loop holds {n} tokens, more than the context ({self.n_ctx})")
        self.input_ids[:n] = tokens
        self.n_tokens = n
        rows = np.zeros((0, self.n_vocab), dtype=np.float32) if scores is None else np.asarray(scores, np.float32)
        if self.logits_all and len(rows) == n and n:
            if self._all is None:
                self._all = np.zeros((self.n_ctx, self.n_vocab), dtype=np.float32)
            self._all[:n] = rows
        self._rows, self._rows_end = rows[-1:], n
