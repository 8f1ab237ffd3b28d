"""Token sampling: llama.cpp's sampler chain over a logits vector.

    logit_bias -> ignore_eos mask -> grammar mask (``banned``: powerinfer.grammar)
    -> the stages of ``params.samplers``, by default llama.cpp's order:
       penalties -> dry -> top_n_sigma -> top_k -> typ_p -> top_p -> min_p -> xtc -> temperature
    -> softmax -> draw

or, with ``mirostat`` 1 or 2 (as llama.cpp: the stages are skipped, penalties included),
temperature -> mirostat (v1: a top-k from the estimated Zipf exponent; v2: the tokens whose
surprise is at most mu) -> draw, mu following the observed surprise towards ``mirostat_tau``.
A disabled stage (its off value) does nothing; temperature <= 0 keeps the most likely token
(greedy).  Each stage is llama.cpp's: typ_p is locally typical sampling, xtc drops the tokens above
xtc_threshold but the least likely of them with xtc_probability (its own random stream, drawn only
when it can apply), dynatemp_range > 0 sets the temperature from the candidates' entropy, top_n_sigma
keeps the logits within n standard deviations of the max, dry is powerinfer.sampling_dry.

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

import copy
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

__all__ = ["EXTRA_NUMBERS", "SAMPLER_NAMES", "SamplingParams", "Sampler", "parse_samplers"]

_F32 = np.float32
MAX_DRY_BREAKERS = 32      # DRY's breakers are each processed against the whole vocabulary (~40 ms per 262k tokens)

# llama.cpp's chain stages, in its default order, with the names and letters its --samplers / --sampling-seq take
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
SAMPLER_NAMES = {
    "penalties": "penalties", "e": "penalties", "dry": "dry", "d": "dry", "top_n_sigma": "top_n_sigma",
    "top-n-sigma": "top_n_sigma", "s": "top_n_sigma", "n": "top_n_sigma", "top_k": "top_k", "top-k": "top_k",
    "k": "top_k", "typ_p": "typ_p", "typical_p": "typ_p", "typical-p": "typ_p", "typical": "typ_p", "typ": "typ_p",
    "y": "typ_p", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p", "p": "top_p", "min_p": "min_p",
    "min-p": "min_p", "m": "min_p", "xtc": "xtc", "x": "xtc", "temperature": "temperature", "temp": "temperature",
    "t": "temperature",
}
_NOT_HERE = {"infill": "infill", "i": "infill", "adaptive_p": "adaptive_p", "adaptive-p": "adaptive_p",
             "a": "adaptive_p"}


def parse_samplers(spec) -> tuple[str, ...]:
    """llama.cpp's sampler list: names separated by ';' (--samplers), a string of letters (--sampling-seq), or a list
    of names; ValueError naming an unknown one or one this chain lacks (infill, adaptive_p)."""
    if isinstance(spec, str):
        items = [x for x in spec.split(";") if x] if (";" in spec or spec in SAMPLER_NAMES
                                                      and len(spec) > 1) else list(spec)
    else:
        items = list(spec)
    out = []
    for x in items:
        if not isinstance(x, str):
            raise ValueError(f"samplers: {x!r} is not a sampler name")
        key = x.strip().lower()
        if key in _NOT_HERE:
            raise ValueError(f"samplers: {_NOT_HERE[key]} is not implemented by this sampler")
        if key not in SAMPLER_NAMES:
            raise ValueError(f"samplers: unknown sampler {x!r} (known: {', '.join(DEFAULT_SAMPLERS)})")
        out.append(SAMPLER_NAMES[key])
    return tuple(out)


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
    typical_p: float = 1.0  # >= 1.0 disables
    min_keep: int = 0  # top_p, min_p, typ_p and xtc keep at least this many tokens (0: no minimum)
    top_n_sigma: float = -1.0  # <= 0 disables
    xtc_probability: float = 0.0  # <= 0 disables
    xtc_threshold: float = 0.1  # > 0.5 disables
    dynatemp_range: float = 0.0  # <= 0 disables: temperature in [temp - range, temp + range] by entropy
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 0 off, 1 mirostat, 2 mirostat 2.0
    mirostat_tau: float = 5.0  # target surprise (bits)
    mirostat_eta: float = 0.1  # learning rate
    dry_multiplier: float = 0.0  # 0 disables
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1: the whole history, 0 disables
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS

    @property
    def dry_on(self) -> bool:
        """DRY does something (llama.cpp's test: a multiplier, a base of at least 1, a window)."""
        return self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_penalty_last_n != 0

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

        typ = real("typical_p")
        if typ < 0.0:
            raise ValueError(f"typical_p must be >= 0 (>= 1.0 disables it), got {typ}")
        if integer("min_keep") < 0:
            raise ValueError(f"min_keep must be >= 0, got {self.min_keep}")
        real("top_n_sigma")
        xp = real("xtc_probability")
        if xp > 1.0:
            raise ValueError(f"xtc_probability must be <= 1 (<= 0 disables it), got {xp}")
        real("xtc_threshold")
        real("dynatemp_range")
        real("dynatemp_exponent")
        if integer("mirostat") not in (0, 1, 2):
            raise ValueError(f"mirostat must be 0 (off), 1 or 2, got {self.mirostat}")
        real("mirostat_tau")
        real("mirostat_eta")
        real("dry_multiplier")
        real("dry_base")
        if integer("dry_allowed_length") < 0:
            raise ValueError(f"dry_allowed_length must be >= 0, got {self.dry_allowed_length}")
        if integer("dry_penalty_last_n") < -1:
            raise ValueError(f"dry_penalty_last_n must be >= -1 (-1: the whole history, 0 disables it), "
                             f"got {self.dry_penalty_last_n}")
        br = self.dry_sequence_breakers
        if isinstance(br, str) or not all(isinstance(b, str) for b in br):
            raise ValueError("dry_sequence_breakers must be a list of strings")
        if len(br) > MAX_DRY_BREAKERS:
            raise ValueError(f"dry_sequence_breakers: {len(br)} strings, at most {MAX_DRY_BREAKERS} (each is matched "
                             "against the whole vocabulary)")
        parse_samplers(self.samplers)

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


# the numeric settings of llama.cpp's samplers beyond the classic chain (SamplingParams' fields after logit_bias):
# a request may set them (the API's keywords, the server's fields), generation_settings and /slots echo them
EXTRA_NUMBERS = ("typical_p", "min_keep", "top_n_sigma", "xtc_probability", "xtc_threshold", "dynatemp_range",
                 "dynatemp_exponent", "mirostat", "mirostat_tau", "mirostat_eta", "dry_multiplier", "dry_base",
                 "dry_allowed_length", "dry_penalty_last_n")


class Sampler:
    """Stateful sampler: holds the RNGs, the penalty history and mirostat's mu.

    ``sample()`` does not record the chosen token; call ``accept()`` for every
    token that should count towards the penalties and DRY (generated tokens, and
    prompt tokens too, as llama.cpp does).  tokenizer: the vocabulary's, for DRY's
    sequence breakers (without one DRY runs with none).  Like any stateful RNG
    holder, one Sampler must not be used from two threads at once.
    """

    def __init__(self, params: SamplingParams, eos_ids: Iterable[int] = (), tokenizer=None):
        params.validate()
        self.params = params
        self.order = parse_samplers(params.samplers)

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

        self._dry_on = params.dry_on
        self._dry = None           # DRY's processed sequence breakers (made on first use without a tokenizer)
        self._tokenizer = tokenizer
        if self._dry_on and tokenizer is not None:
            from .sampling_dry import DryBreakers
            self._dry = DryBreakers.of(tokenizer, tuple(params.dry_sequence_breakers))
        # history kept: the longest window a stage reads (None: all of it)
        windows = [params.repeat_last_n] + ([params.dry_penalty_last_n] if self._dry_on else [])
        self._keep = None if min(windows) < 0 else max(windows)

        self._history: list[int] = []
        self._buf: np.ndarray | None = None  # scratch for edited logits
        self.reset()

    # ------------------------------------------------------------------ state

    def accept(self, token: int) -> None:
        """Add ``token`` to the history (penalties, DRY)."""
        if not _is_int(token) or token < 0:
            raise ValueError(f"token must be a non-negative integer, got {token!r}")
        self._history.append(int(token))
        n = self._keep
        if n is not None and len(self._history) > 2 * n + 1024:
            del self._history[: len(self._history) - n]

    def reset(self) -> None:
        """Clear the history, re-seed the RNGs from ``self.seed`` and restart mirostat's mu at 2 tau."""
        self._history.clear()
        self._rng = np.random.default_rng(self.seed)
        self._xtc_rng = np.random.default_rng([self.seed, 1])   # XTC's own stream, as llama.cpp's
        self.mu = 2.0 * float(self.params.mirostat_tau)

    @property
    def history(self) -> list[int]:
        """The recent accepted tokens (at least the last ``repeat_last_n``)."""
        return list(self._history)

    # ------------------------------------------------------------ public API

    def process_logits(self, logits, banned: np.ndarray | None = None) -> np.ndarray:
        """Return a float32 copy of ``logits`` after logit_bias, ignore_eos, grammar masking and the penalty and DRY
        stages that head the chain (the logit edits before any truncation)."""
        raw = self._check(logits)
        return self._head_edits(self._process(raw, banned), self._head(), raw).copy()

    def sample(self, logits, banned: np.ndarray | None = None) -> int:
        """Run the chain on a copy of ``logits`` and draw one token id. banned: bool
        [n_vocab], True for the tokens a grammar forbids (GrammarMatcher.banned())."""
        raw = self._check(logits)
        ids, p = self._chain(raw, need_sorted=False, banned=banned, xtc_rng=self._xtc_rng)
        if p is None:  # greedy, or everything masked
            i, tok = 0, int(ids[0])
        else:
            cdf = np.cumsum(p)
            u = self._rng.random() * cdf[-1]
            i = min(int(np.searchsorted(cdf, u, side="right")), ids.size - 1)
            tok = int(ids[i])
        if self.params.mirostat:   # mu follows the observed surprise (bits) towards tau
            p_tok = 1.0 if p is None else float(p[i])
            surprise = -math.log2(p_tok) if p_tok > 0 else math.inf
            self.mu -= float(self.params.mirostat_eta) * (surprise - float(self.params.mirostat_tau))
        return tok

    def probs(self, logits, banned: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, probabilities) after the whole chain, sorted by
        probability descending (ties: lower id first): the distribution the next
        ``sample()`` would draw from.  Greedy mode returns the single argmax token
        with probability 1.  Does not touch the RNGs or mirostat's mu."""
        raw = self._check(logits)
        ids, p = self._chain(raw, need_sorted=True, banned=banned, xtc_rng=copy.deepcopy(self._xtc_rng))
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

    def _stages(self) -> tuple[str, ...]:
        """The chain's stages: params.samplers, or temperature alone before mirostat (llama.cpp skips the rest)."""
        return ("temperature",) if self.params.mirostat else self.order

    def _head(self) -> tuple[str, ...]:
        """The leading penalty / DRY stages (logit edits before any truncation: applied to the whole vector)."""
        stages = self._stages()
        n = 0
        while n < len(stages) and stages[n] in ("penalties", "dry"):
            n += 1
        return stages[:n]

    def _penalty_window(self) -> list[int]:
        prm = self.params
        n = prm.repeat_last_n
        if n == 0 or not self._history or (
            prm.repeat_penalty == 1.0 and prm.presence_penalty == 0.0 and prm.frequency_penalty == 0.0
        ):
            return []
        return self._history if n < 0 else self._history[-n:]

    def _penalties(self, n_vocab: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens [m] ascending, their counts [m]) of the penalty window, or None when the penalties are off."""
        window = self._penalty_window()
        if not window:
            return None
        toks, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        if toks[-1] >= n_vocab:
            raise ValueError(f"history token id {int(toks[-1])} is out of range for a vocabulary of {n_vocab}")
        return toks, counts

    def _penalize(self, v: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """llama.cpp's repeat / frequency / presence penalties of logits v [m] whose tokens occur counts [m] times."""
        prm = self.params
        if prm.repeat_penalty != 1.0:
            rp = _F32(prm.repeat_penalty)
            v = np.where(v <= 0, v * rp, v / rp).astype(_F32, copy=False)
        return v - (counts.astype(_F32) * _F32(prm.frequency_penalty) + _F32(prm.presence_penalty))

    def _dry_penalties(self, n_vocab: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens [m], penalties [m]) of DRY, or None when it is off or has none."""
        if not self._dry_on or not self._history:
            return None
        from .sampling_dry import DryBreakers, dry_penalties
        if self._dry is None:        # no tokenizer: no sequence breakers
            self._dry = DryBreakers.from_token_sequences(n_vocab, [])
        prm = self.params
        ids, pen = dry_penalties(np.asarray(self._history, dtype=np.int64), self._dry, prm.dry_multiplier,
                                 prm.dry_base, prm.dry_allowed_length, prm.dry_penalty_last_n)
        return (ids, pen) if ids.size else None

    def _process(self, raw: np.ndarray, banned: np.ndarray | None = None) -> np.ndarray:
        """logit_bias -> ignore_eos -> grammar mask.  Never writes into ``raw``: returns ``raw`` itself when nothing
        applies, else an edited copy (the scratch buffer)."""
        n_vocab = raw.size
        prm = self.params
        masks_eos = bool(prm.ignore_eos and self.eos_ids.size)
        if banned is not None and banned.shape != raw.shape:
            raise ValueError(f"the grammar mask has {banned.size} entries for {raw.size} logits")
        if not (self._bias_ids.size or masks_eos or banned is not None):
            return raw
        x = self._private(raw, raw)

        if self._bias_ids.size:
            if self._bias_ids[-1] >= n_vocab:
                raise ValueError(
                    f"logit_bias token id {int(self._bias_ids[-1])} is out of range "
                    f"for a vocabulary of {n_vocab}"
                )
            x[self._bias_ids] += self._bias_vals

        if masks_eos:
            if self.eos_ids[-1] >= n_vocab:
                raise ValueError(
                    f"eos id {int(self.eos_ids[-1])} is out of range for a vocabulary of {n_vocab}"
                )
            x[self.eos_ids] = -np.inf

        if banned is not None:
            np.copyto(x, -np.inf, where=banned)
        return self._finite_top(x)

    def _private(self, x: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """x, or a copy of it in the scratch buffer when x is the caller's raw array.  Editing a reusable buffer
        rather than a fresh copy: allocating a vocab-sized array each token costs more (page faults) than the whole
        rest of the chain.  Nothing returned by _chain aliases it."""
        if x is not raw:
            return x
        if self._buf is None or self._buf.shape != raw.shape:
            self._buf = np.empty_like(raw)
        np.copyto(self._buf, raw)
        return self._buf

    @staticmethod
    def _finite_top(x: np.ndarray) -> np.ndarray:
        # A huge bias can overflow float32 to +inf; keep the token as the top one.
        if np.isposinf(x).any():
            x[np.isposinf(x)] = np.finfo(_F32).max
        return x

    def _head_edits(self, x: np.ndarray, head: tuple[str, ...], raw: np.ndarray) -> np.ndarray:
        """The penalty / DRY stages of `head` on the whole vector x (a private copy is made when x is raw)."""
        for stage in head:
            edit = self._penalties(x.size) if stage == "penalties" else self._dry_penalties(x.size)
            if edit is None:
                continue
            x = self._private(x, raw)
            toks, arg = edit
            if stage == "penalties":
                x[toks] = self._penalize(x[toks], arg)
            else:
                x[toks] -= arg.astype(_F32)
            x = self._finite_top(x)
        return x

    @staticmethod
    def _fallback(raw: np.ndarray, banned: np.ndarray | None) -> np.ndarray:
        """Everything masked: the raw argmax (among the tokens the grammar allows)."""
        if banned is None:
            return np.array([int(np.argmax(raw))], dtype=np.int64)
        if banned.all():
            raise ValueError("the grammar allows no token at all")
        return np.array([int(np.argmax(np.where(banned, -np.inf, raw)))], dtype=np.int64)

    def _greedy_is_argmax(self, stages: tuple[str, ...], n_head: int) -> bool:
        """temperature <= 0 keeps the best remaining token: is that the argmax after the head's edits? Yes unless a
        stage before temperature may drop the best token (typ_p, xtc) or edits logits after a truncation."""
        prm = self.params
        on = {"penalties": bool(self._penalty_window()), "dry": self._dry_on,
              "top_k": prm.top_k > 0, "top_p": prm.top_p < 1.0, "min_p": prm.min_p > 0.0,
              "top_n_sigma": prm.top_n_sigma > 0.0, "typ_p": prm.typical_p < 1.0,
              "xtc": prm.xtc_probability > 0.0 and prm.xtc_threshold <= 0.5}
        for stage in stages[n_head:]:
            if stage == "temperature":
                return prm.dynatemp_range <= 0.0
            if stage in ("typ_p", "xtc", "penalties", "dry") and on[stage]:
                return False
        return False

    def _chain(self, raw: np.ndarray, need_sorted: bool, banned: np.ndarray | None, xtc_rng):
        """Run the chain.  Returns (ids, probs) or (ids, None) for a forced
        single token (greedy / fallback)."""
        prm = self.params
        stages = self._stages()
        head = self._head()
        x = self._head_edits(self._process(raw, banned), head, raw)

        if prm.temperature <= 0 and self._greedy_is_argmax(stages, len(head)):
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
        cand = _Candidates(ids, vals)
        rest = stages[len(head):]
        i = 0
        while i < len(rest):
            if rest[i:i + 2] == ("top_p", "min_p") and prm.top_p < 1.0 and prm.min_p > 0.0 and not prm.min_keep:
                self._top_p_then_min_p(cand)          # the same result, min_p's cut made first (cheaper)
                i += 2
            else:
                getattr(self, "_stage_" + rest[i])(cand, x.size, xtc_rng)
                i += 1
            if cand.ids.size == 0:
                return self._fallback(raw, banned), None
        if cand.forced:
            return cand.ids, None
        if prm.mirostat:
            self._mirostat(cand, x.size)
        if cand.ids.size == 1:
            return cand.ids, np.ones(1, dtype=np.float64)
        if need_sorted:
            cand.sort()
        return cand.ids, cand.probs()

    # -------------------------------------------------------------- stages (llama.cpp's)

    def _stage_penalties(self, c: "_Candidates", n_vocab: int, rng) -> None:
        """Penalties after a truncation: on the candidates that occur in the window."""
        edit = self._penalties(n_vocab)
        if edit is None:
            return
        toks, counts = edit
        pos = np.flatnonzero(np.isin(c.ids, toks))
        if pos.size:
            c.vals = c.vals.copy()
            c.vals[pos] = self._penalize(c.vals[pos], counts[np.searchsorted(toks, c.ids[pos])])

    def _stage_dry(self, c: "_Candidates", n_vocab: int, rng) -> None:
        edit = self._dry_penalties(n_vocab)
        if edit is None:
            return
        toks, pen = edit
        order = np.argsort(toks)
        toks, pen = toks[order], pen[order]
        pos = np.flatnonzero(np.isin(c.ids, toks))
        if pos.size:
            c.vals = c.vals.copy()
            c.vals[pos] -= pen[np.searchsorted(toks, c.ids[pos])].astype(_F32)
            c.sorted = False

    def _stage_top_n_sigma(self, c: "_Candidates", n_vocab: int, rng) -> None:
        n = self.params.top_n_sigma
        if n <= 0.0 or c.ids.size <= 1:
            return
        v = c.vals.astype(np.float64)
        keep = v >= v.max() - n * v.std()
        c.keep(keep)

    def _stage_top_k(self, c: "_Candidates", n_vocab: int, rng) -> None:
        """Keep the k largest logits (ties at the boundary: lower ids); k <= 0: all."""
        if self.params.top_k > 0:
            c.keep_top(self.params.top_k)

    def _stage_typ_p(self, c: "_Candidates", n_vocab: int, rng) -> None:
        """Locally typical sampling: the tokens whose surprise is nearest the entropy, up to typical_p of the mass."""
        prm = self.params
        if prm.typical_p >= 1.0:
            return
        c.sort()
        p = c.probs()
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.log(p)
            entropy = -np.sum(np.where(p > 0, p * logp, 0.0))
            shifted = np.abs(-logp - entropy)
        order = np.argsort(shifted, kind="stable")
        cum = np.cumsum(p[order])
        i0 = max(prm.min_keep - 1, 0)
        hit = np.flatnonzero(cum[i0:] > prm.typical_p)
        last = int(hit[0]) + i0 + 1 if hit.size else order.size
        c.take(order[:last], is_sorted=False)

    def _stage_top_p(self, c: "_Candidates", n_vocab: int, rng) -> None:
        prm = self.params
        if prm.top_p >= 1.0 or c.ids.size <= 1:
            return
        ids, vals = self._top_p(c.ids, c.vals, c.probs(), prm.top_p, prm.min_keep)
        c.ids, c.vals, c.sorted = ids, vals, True

    def _top_p_then_min_p(self, c: "_Candidates") -> None:
        """top_p then min_p (min_keep 0), computed the other way round: both keep a prefix of the sorted order and
        min_p's test (p_i >= min_p * p_max) does not change under renormalisation, so min_p's cut first, then
        top_p's with the probabilities before it, keeps the same tokens while sorting only what min_p kept."""
        prm = self.params
        if c.ids.size <= 1:
            return
        p = c.probs()
        keep = p >= prm.min_p * p.max()
        ids, vals, p = c.ids[keep], c.vals[keep], p[keep]
        if ids.size > 1:
            ids, vals = self._top_p(ids, vals, p, prm.top_p)
            c.ids, c.vals, c.sorted = ids, vals, True
        else:
            c.ids, c.vals = ids, vals

    def _stage_min_p(self, c: "_Candidates", n_vocab: int, rng) -> None:
        """Keep p_i >= min_p * p_max (at least min_keep, the most likely)."""
        prm = self.params
        if prm.min_p <= 0.0:
            return
        p = c.probs()
        keep = p >= prm.min_p * p.max()
        if int(np.count_nonzero(keep)) < prm.min_keep:
            c.sort()
            c.take(np.arange(min(prm.min_keep, c.ids.size)), is_sorted=True)
        else:
            c.keep(keep)

    def _stage_xtc(self, c: "_Candidates", n_vocab: int, rng) -> None:
        """Exclude top choices: with xtc_probability, drop every token at or above xtc_threshold but the least likely
        of them (the draw from XTC's own stream happens only when it can apply)."""
        prm = self.params
        if prm.xtc_probability <= 0.0 or prm.xtc_threshold > 0.5 or c.ids.size < 2:
            return
        if rng.random() > prm.xtc_probability:
            return
        c.sort()
        p = c.probs()
        above = int(np.argmin(p >= prm.xtc_threshold)) if not (p >= prm.xtc_threshold).all() else p.size
        pos_last = max(above - 1, 0)
        if c.ids.size - pos_last >= prm.min_keep and pos_last > 0:
            c.take(np.arange(pos_last, c.ids.size), is_sorted=True)

    def _stage_temperature(self, c: "_Candidates", n_vocab: int, rng) -> None:
        prm = self.params
        t = float(prm.temperature)
        if prm.dynatemp_range > 0.0 and not prm.mirostat:
            if c.ids.size <= 1:
                return
            lo, hi = max(0.0, t - prm.dynatemp_range), t + prm.dynatemp_range
            p = c.probs()
            with np.errstate(divide="ignore", invalid="ignore"):
                entropy = -np.sum(np.where(p > 0, p * np.log(p), 0.0))
            t = lo + (hi - lo) * (entropy / math.log(c.ids.size)) ** prm.dynatemp_exponent
        if t <= 0:    # greedy: the most likely (ties: the lowest id)
            c.sort()
            c.take(np.arange(1), is_sorted=True)
            c.forced = True
            return
        c.vals = (c.vals / _F32(t)).astype(_F32, copy=False)

    def _mirostat(self, c: "_Candidates", n_vocab: int) -> None:
        """Mirostat's truncation of the (tempered) candidates, before the draw: v1 keeps the top k that the Zipf
        exponent estimated from the 100 most likely tokens and mu give; v2 the tokens of surprise <= mu. The kept
        tokens stay in their order (ascending ids unless a stage sorted them): nothing but the 100 is sorted, though
        the whole vocabulary reaches this stage."""
        prm = self.params
        if prm.mirostat == 1:
            head = c.top(100)                                   # the 100 most likely, sorted: [ids], [vals]
            k = c.ids.size
            m = head[1].size - 1
            if m > 0:
                i = np.arange(m, dtype=np.float64)
                t_i = np.log((i + 2) / (i + 1))
                v = head[1].astype(np.float64)
                b_i = v[:m] - v[1:m + 1]                        # log(p_i / p_{i+1})
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    s_hat = float(np.sum(t_i * b_i) / np.sum(t_i * t_i))
                    eps = s_hat - 1.0
                    kf = (eps * 2.0 ** self.mu / (1.0 - float(n_vocab) ** -eps)) ** (1.0 / s_hat)
                if math.isfinite(kf):
                    k = min(max(int(kf), 1), c.ids.size)
            c.keep_top(k)
        else:
            v = c.vals.astype(np.float64)
            top = v.max()
            lse = top + math.log(np.exp(v - top).sum())       # surprise -log2 p_i <= mu  <=>  v_i >= lse - mu ln 2
            keep = v >= lse - self.mu * math.log(2.0)
            if keep.any():
                c.keep(keep)
            else:
                c.keep_top(1)

    @staticmethod
    def _top_p(ids: np.ndarray, vals: np.ndarray, p: np.ndarray, top_p: float, min_keep: int = 0):
        """Smallest prefix (logit desc, id asc) with cumulative prob >= top_p (and at least min_keep tokens).
        Sorts only a growing head of the distribution, not the whole vocab."""
        n = ids.size
        k = min(n, max(256, min_keep))
        while True:
            if k < n:
                kth = np.partition(vals, n - k)[n - k]
                head = np.flatnonzero(vals >= kth)  # includes all ties
            else:
                head = np.arange(n)
            order = head[np.lexsort((ids[head], -vals[head]))]
            cum = np.cumsum(p[order])
            if cum[-1] >= top_p or head.size == n:
                cut = min(max(int(np.searchsorted(cum, top_p, side="left")) + 1, min_keep), order.size)
                order = order[:cut]
                return ids[order], vals[order]
            k = min(n, k * 8)


class _Candidates:
    """The chain's candidate tokens: ids [m] and their logits vals [m] (float32), in ascending id order until a stage
    sorts them (by logit descending, ties by lower id); forced: one token chosen (greedy)."""

    def __init__(self, ids: np.ndarray, vals: np.ndarray):
        self.ids, self.vals = ids, vals
        self.sorted = False
        self.forced = False

    def probs(self) -> np.ndarray:
        """Softmax of the logits, float64 [m]."""
        v = self.vals.astype(np.float64)
        e = np.exp(v - v.max())
        return e / e.sum()

    def sort(self) -> None:
        if not self.sorted:
            order = np.lexsort((self.ids, -self.vals))
            self.ids, self.vals, self.sorted = self.ids[order], self.vals[order], True

    def keep(self, mask: np.ndarray) -> None:
        self.ids, self.vals = self.ids[mask], self.vals[mask]

    def take(self, idx: np.ndarray, *, is_sorted: bool) -> None:
        self.ids, self.vals, self.sorted = self.ids[idx], self.vals[idx], is_sorted

    def keep_top(self, k: int) -> None:
        """Keep the k largest logits (ties at the boundary: lower ids), in their current order."""
        n = self.ids.size
        if k >= n:
            return
        if self.sorted:
            self.ids, self.vals = self.ids[:k], self.vals[:k]
            return
        kth = np.partition(self.vals, n - k)[n - k]
        keep = self.vals > kth
        ties = np.flatnonzero(self.vals == kth)[:k - int(np.count_nonzero(keep))]
        keep[ties] = True
        self.keep(keep)

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vals) of the k largest logits, sorted (ties: lower ids), without sorting the rest."""
        n = self.ids.size
        k = min(k, n)
        if self.sorted or k == n:
            self.sort()
            return self.ids[:k], self.vals[:k]
        kth = np.partition(self.vals, n - k)[n - k]
        sel = np.flatnonzero(self.vals >= kth)               # the top k and the ties at the boundary
        order = np.lexsort((self.ids[sel], -self.vals[sel]))[:k]
        return self.ids[sel[order]], self.vals[sel[order]]
