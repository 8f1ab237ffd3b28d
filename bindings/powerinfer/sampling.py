"""Token sampling: a llama.cpp-style sampler chain over a logits vector.

The chain follows llama.cpp's classic order::

    logit_bias -> penalties (repeat / presence / frequency) -> ignore_eos mask
    -> grammar mask (``banned``: powerinfer.grammar) -> [greedy argmax if temperature <= 0]
    -> top_k -> top_p -> min_p -> temperature -> softmax -> draw

Everything is vectorised numpy; there is no Python loop over the vocabulary,
so a 256k-entry vocabulary costs a handful of O(n) passes per token (plus one
``argpartition`` when top_k is active).  Full sorts are only done on the small
set of tokens that survive the filters.

Conventions
-----------
* Logit edits (bias, penalties, temperature) are done in float32, exactly as
  llama.cpp does them; probabilities are computed in float64.
* Ties are broken deterministically: candidates are ordered by logit
  descending, then token id ascending (so e.g. ``top_k`` keeps the lower ids
  among equal logits at its boundary, and greedy picks the lowest id).
* ``-inf`` logits are "masked" tokens and are never sampled, unless *every*
  token ends up masked, in which case the sampler falls back to the argmax of
  the raw, unprocessed logits instead of failing -- among the tokens a grammar
  allows when there is one (a grammar is a hard constraint; bias and
  ignore_eos are not).
* NaN (and +inf) logits are rejected with ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

__all__ = ["SamplingParams", "Sampler"]

_F32 = np.float32


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclass
class SamplingParams:
    """Sampling configuration (defaults match llama.cpp's ``common`` defaults)."""

    temperature: float = 0.8  # <= 0 means greedy (argmax)
    top_k: int = 40  # <= 0 disables
    top_p: float = 0.95  # >= 1.0 disables
    min_p: float = 0.05  # <= 0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # 0 disables penalties, -1 = whole history
    presence_penalty: float = 0.0  # subtracted once per distinct token in window
    frequency_penalty: float = 0.0  # subtracted count * penalty
    seed: int = -1  # -1: random seed from os.urandom
    ignore_eos: bool = False  # if True, eos logits are set to -inf
    logit_bias: dict[int, float] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` describing the first nonsensical field."""

        def real(name: str, *, finite: bool = True) -> float:
            v = getattr(self, name)
            if not _is_real(v):
                raise ValueError(f"{name} must be a real number, got {v!r}")
            v = float(v)
            if math.isnan(v):
                raise ValueError(f"{name} must not be NaN")
            if finite and math.isinf(v):
                raise ValueError(f"{name} must be finite, got {v}")
            return v

        def integer(name: str) -> int:
            v = getattr(self, name)
            if not _is_int(v):
                raise ValueError(f"{name} must be an integer, got {v!r}")
            return int(v)

        real("temperature")  # any finite value; <= 0 means greedy
        integer("top_k")  # any integer; <= 0 disables

        top_p = real("top_p")
        if top_p < 0.0:
            raise ValueError(f"top_p must be >= 0 (>= 1.0 disables it), got {top_p}")

        min_p = real("min_p")
        if min_p > 1.0:
            raise ValueError(f"min_p must be <= 1 (<= 0 disables it), got {min_p}")

        rp = real("repeat_penalty")
        if rp <= 0.0:
            raise ValueError(f"repeat_penalty must be > 0 (1.0 disables it), got {rp}")

        n = integer("repeat_last_n")
        if n < -1:
            raise ValueError(
                f"repeat_last_n must be >= -1 (0 disables, -1 = whole history), got {n}"
            )

        real("presence_penalty")
        real("frequency_penalty")

        seed = integer("seed")
        if seed < -1:
            raise ValueError(f"seed must be -1 (random) or a non-negative integer, got {seed}")

        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

        if not isinstance(self.logit_bias, dict):
            raise ValueError(
                f"logit_bias must be a dict {{token_id: bias}}, got {type(self.logit_bias).__name__}"
            )
        for tok, bias in self.logit_bias.items():
            if not _is_int(tok) or tok < 0:
                raise ValueError(f"logit_bias keys must be non-negative token ids, got {tok!r}")
            if not _is_real(bias):
                raise ValueError(f"logit_bias[{tok}] must be a real number, got {bias!r}")
            b = float(bias)
            if math.isnan(b) or b == math.inf:
                raise ValueError(
                    f"logit_bias[{tok}] must be finite or -inf (to ban the token), got {b}"
                )


class Sampler:
    """Stateful sampler: holds the RNG and the penalty history.

    ``sample()`` does not record the chosen token; call ``accept()`` for every
    token that should count towards the penalties (generated tokens, and prompt
    tokens too if you want them penalised, as llama.cpp does).  Like any
    stateful RNG holder, one Sampler must not be used from two threads at once.
    """

    def __init__(self, params: SamplingParams, eos_ids: Iterable[int] = ()):
        params.validate()
        self.params = params

        eos = []
        for t in eos_ids:
            if not _is_int(t) or t < 0:
                raise ValueError(f"eos ids must be non-negative integers, got {t!r}")
            eos.append(int(t))
        self.eos_ids = np.unique(np.asarray(eos, dtype=np.int64))

        if params.logit_bias:
            items = sorted((int(k), float(v)) for k, v in params.logit_bias.items())
            self._bias_ids = np.array([k for k, _ in items], dtype=np.int64)
            self._bias_vals = np.array([v for _, v in items], dtype=_F32)
        else:
            self._bias_ids = np.empty(0, dtype=np.int64)
            self._bias_vals = np.empty(0, dtype=_F32)

        if params.seed == -1:
            self.seed = int.from_bytes(os.urandom(4), "little")
        else:
            self.seed = int(params.seed)

        self._history: list[int] = []
        self._buf: np.ndarray | None = None  # scratch for edited logits
        self._rng = np.random.default_rng(self.seed)

    # ------------------------------------------------------------------ state

    def accept(self, token: int) -> None:
        """Add ``token`` to the penalty history."""
        if not _is_int(token) or token < 0:
            raise ValueError(f"token must be a non-negative integer, got {token!r}")
        self._history.append(int(token))
        n = self.params.repeat_last_n
        if n >= 0 and len(self._history) > 2 * n + 1024:
            del self._history[: len(self._history) - n]

    def reset(self) -> None:
        """Clear the history and re-seed the RNG from ``self.seed``."""
        self._history.clear()
        self._rng = np.random.default_rng(self.seed)

    @property
    def history(self) -> list[int]:
        """The recent accepted tokens (at least the last ``repeat_last_n``)."""
        return list(self._history)

    # ------------------------------------------------------------ public API

    def process_logits(self, logits, banned: np.ndarray | None = None) -> np.ndarray:
        """Return a float32 copy of ``logits`` after logit_bias, penalties,
        ignore_eos and grammar masking (the stages before the truncation samplers)."""
        return self._process(self._check(logits), banned).copy()

    def sample(self, logits, banned: np.ndarray | None = None) -> int:
        """Run the chain on a copy of ``logits`` and draw one token id. banned: bool
        [n_vocab], True for the tokens a grammar forbids (GrammarMatcher.banned())."""
        raw = self._check(logits)
        ids, p = self._chain(raw, need_sorted=False, banned=banned)
        if p is None:  # greedy, or everything masked
            return int(ids[0])
        cdf = np.cumsum(p)
        u = self._rng.random() * cdf[-1]
        i = int(np.searchsorted(cdf, u, side="right"))
        return int(ids[min(i, ids.size - 1)])

    def probs(self, logits, banned: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) after the whole chain, sorted by
        probability descending (ties: lower id first).  Greedy mode returns the
        single argmax token with probability 1.  Does not touch the RNG."""
        raw = self._check(logits)
        ids, p = self._chain(raw, need_sorted=True, banned=banned)
        if p is None:
            return ids, np.ones(ids.size, dtype=np.float64)
        return ids, p

    # -------------------------------------------------------------- internals

    @staticmethod
    def _check(logits) -> np.ndarray:
        # No copy when the caller already passes float32: the chain never
        # writes into this array (see _process), it copies before editing.
        x = np.asarray(logits, dtype=_F32)
        if x.ndim != 1:
            raise ValueError(f"logits must be a 1-D vector, got shape {x.shape}")
        if x.size == 0:
            raise ValueError("logits must not be empty")
        if np.isnan(x).any():
            raise ValueError("logits contain NaN")
        if np.isposinf(x).any():
            raise ValueError("logits contain +inf")
        return x

    def _penalty_window(self) -> list[int]:
        prm = self.params
        n = prm.repeat_last_n
        if n == 0 or not self._history or (
            prm.repeat_penalty == 1.0 and prm.presence_penalty == 0.0 and prm.frequency_penalty == 0.0
        ):
            return []
        return self._history if n < 0 else self._history[-n:]

    def _process(self, raw: np.ndarray, banned: np.ndarray | None = None) -> np.ndarray:
        """logit_bias -> penalties -> ignore_eos -> grammar mask.  Never writes into
        ``raw``: returns ``raw`` itself when nothing applies, else an edited copy."""
        n_vocab = raw.size
        prm = self.params
        window = self._penalty_window()
        masks_eos = bool(prm.ignore_eos and self.eos_ids.size)
        if banned is not None and banned.shape != raw.shape:
            raise ValueError(f"the grammar mask has {banned.size} entries for {raw.size} logits")
        if not (self._bias_ids.size or window or masks_eos or banned is not None):
            return raw
        # Edit a reusable scratch buffer rather than a fresh copy: allocating
        # a vocab-sized array each token costs more (page faults) than the
        # whole rest of the chain.  Nothing returned by _chain aliases it.
        if self._buf is None or self._buf.shape != raw.shape:
            self._buf = np.empty_like(raw)
        x = self._buf
        np.copyto(x, raw)

        if self._bias_ids.size:
            if self._bias_ids[-1] >= n_vocab:
                raise ValueError(
                    f"logit_bias token id {int(self._bias_ids[-1])} is out of range "
                    f"for a vocabulary of {n_vocab}"
                )
            x[self._bias_ids] += self._bias_vals

        if window:
            toks, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
            if toks[-1] >= n_vocab:
                raise ValueError(
                    f"history token id {int(toks[-1])} is out of range for a vocabulary of {n_vocab}"
                )
            l = x[toks]
            if prm.repeat_penalty != 1.0:
                rp = _F32(prm.repeat_penalty)
                l = np.where(l <= 0, l * rp, l / rp).astype(_F32, copy=False)
            l = l - (counts.astype(_F32) * _F32(prm.frequency_penalty) + _F32(prm.presence_penalty))
            x[toks] = l

        if masks_eos:
            if self.eos_ids[-1] >= n_vocab:
                raise ValueError(
                    f"eos id {int(self.eos_ids[-1])} is out of range for a vocabulary of {n_vocab}"
                )
            x[self.eos_ids] = -np.inf

        if banned is not None:
            np.copyto(x, -np.inf, where=banned)

        # A huge bias can overflow float32 to +inf; keep the token as the top one.
        if np.isposinf(x).any():
            x[np.isposinf(x)] = np.finfo(_F32).max
        return x

    @staticmethod
    def _fallback(raw: np.ndarray, banned: np.ndarray | None) -> np.ndarray:
        """Everything masked: the raw argmax (among the tokens the grammar allows)."""
        if banned is None:
            return np.array([int(np.argmax(raw))], dtype=np.int64)
        if banned.all():
            raise ValueError("the grammar allows no token at all")
        return np.array([int(np.argmax(np.where(banned, -np.inf, raw)))], dtype=np.int64)

    def _chain(self, raw: np.ndarray, need_sorted: bool, banned: np.ndarray | None = None):
        """Run the chain.  Returns (ids, probs) or (ids, None) for a forced
        single token (greedy / fallback)."""
        prm = self.params
        x = self._process(raw, banned)

        if prm.temperature <= 0:
            t = int(np.argmax(x))
            if x[t] == -np.inf:  # everything masked
                return self._fallback(raw, banned), None
            return np.array([t], dtype=np.int64), None

        # candidates: the unmasked tokens (ascending id)
        finite = x > -np.inf
        if finite.all():
            ids = np.arange(x.size, dtype=np.int64)
            vals = x
        else:
            ids = np.flatnonzero(finite)
            if ids.size == 0:  # everything masked: fall back to raw argmax
                return self._fallback(raw, banned), None
            vals = x[ids]

        # top_k: keep the k largest logits (ties at the boundary: lower ids)
        k = prm.top_k
        if 0 < k < ids.size:
            kth = np.partition(vals, ids.size - k)[ids.size - k]
            above = vals > kth
            n_above = int(np.count_nonzero(above))
            keep = above
            if n_above < k:
                eq = np.flatnonzero(vals == kth)[: k - n_above]
                keep = above.copy()
                keep[eq] = True
            ids, vals = ids[keep], vals[keep]
        sorted_ = False

        top_p, min_p = prm.top_p, prm.min_p
        if top_p < 1.0 or min_p > 0.0:
            # probabilities over the current candidates (float64)
            e = np.exp(vals.astype(np.float64) - float(vals.max()))
            p = e / e.sum()

            # min_p keeps a prefix of the sorted order and its test is invariant
            # to renormalisation, so applying it before top_p (with top_p using
            # the pre-min_p probabilities) gives exactly the classic result
            # while shrinking the set we have to sort.
            if min_p > 0.0:
                keep = p >= min_p * p.max()
                ids, vals, p = ids[keep], vals[keep], p[keep]

            if top_p < 1.0 and ids.size > 1:
                ids, vals = self._top_p(ids, vals, p, top_p)
                sorted_ = True

        if ids.size == 1:
            return ids, np.ones(1, dtype=np.float64)

        if need_sorted and not sorted_:
            order = np.lexsort((ids, -vals))
            ids, vals = ids[order], vals[order]

        # temperature, then softmax
        v = (vals / _F32(prm.temperature)).astype(np.float64)
        e = np.exp(v - v.max())
        return ids, e / e.sum()

    @staticmethod
    def _top_p(ids: np.ndarray, vals: np.ndarray, p: np.ndarray, top_p: float):
        """Smallest prefix (logit desc, id asc) with cumulative prob >= top_p.
        Sorts only a growing head of the distribution, not the whole vocab."""
        n = ids.size
        k = min(n, 256)
        while True:
            if k < n:
                kth = np.partition(vals, n - k)[n - k]
                head = np.flatnonzero(vals >= kth)  # includes all ties
            else:
                head = np.arange(n)
            order = head[np.lexsort((ids[head], -vals[head]))]
            cum = np.cumsum(p[order])
            if cum[-1] >= top_p or head.size == n:
                cut = min(int(np.searchsorted(cum, top_p, side="left")) + 1, order.size)
                order = order[:cut]
                return ids[order], vals[order]
            k = min(n, k * 8)
