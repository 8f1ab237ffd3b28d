"""DRY ("Don't Repeat Yourself"), the repetition penalty of llama.cpp's "dry" sampler, in numpy.

DRY lowers the logit of every token that would extend a sequence which already occurred in the recent history.
If the last ``L`` tokens of the history also occur earlier, followed there by token ``t``, then emitting ``t`` would
repeat ``L + 1`` tokens; once ``L >= allowed_length`` the logit of ``t`` loses
``multiplier * base ** (L - allowed_length)`` (``L``: the longest such repeat that ``t`` would extend).

Sequence breakers are strings (default ``"\\n"``, ``":"``, ``'"'``, ``"*"``) at which a repeat starts afresh: a
repeat never reaches back over the most recent breaker of the window, and tokens that contain a breaker are never
penalised.  A breaker that takes several tokens is matched as a *head* token (one whose text ends with the start of
the breaker) followed by its *tail* (the tokenization of the rest of the breaker).

What this reproduces of llama.cpp (src/llama-sampler.cpp: the DRY sampler, its breaker processing and init):

- breakers are cut to 40 bytes, empty ones skipped; a token whose text (its one-token detokenization with special
  tokens rendered) contains a breaker is a single-token breaker; a token whose text ends with a proper prefix of a
  breaker, at any position where the breaker's first byte occurs, is a head whose tail is the tokenization (no
  BOS/EOS) of the rest of the breaker, cut to 20 tokens; a head keeps each distinct tail once.  Texts are compared
  as UTF-8 bytes, as llama.cpp compares std::string bytes;
- off when ``multiplier == 0``, ``base < 1`` or ``penalty_last_n == 0`` (in float32); the window is the last
  ``penalty_last_n`` tokens (``-1``: all of them); nothing when the window has ``<= allowed_length`` tokens;
- the repeat limit: scanning back from the newest token, the first position ``i`` (0: the newest) holding a head
  whose tail follows it inside the window (the longest such tail, length ``L``; ``L = 0`` for single-token
  breakers) limits repeats to ``i - L`` tokens (the whole window when there is none); nothing when that limit is
  below ``allowed_length``;
- repeat lengths are the longest common suffix of ``window[:j + 1]`` and ``window`` (llama.cpp: a reversed
  Z-algorithm), capped at the repeat limit; the penalty uses each token's longest one, skips single-token
  breakers, clamps the exponent at ``int(88.7228391f / logf(base))`` when ``base > 1.000001`` and is
  ``float(multiplier * pow(double(base), exponent))`` (std::pow(float, int) computes in double).

`DryBreakers.of(tokenizer, breakers)` processes a breaker list once per tokenizer (cached); `dry_penalties` then
runs once per generated token, vectorised over the window (no Python loop over the history or the vocabulary).
"""
from __future__ import annotations

import math
import threading
import weakref
from typing import Iterable, Sequence

import numpy as np

DEFAULT_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")
MAX_BREAKER_BYTES = 40       # llama.cpp's MAX_CHAR_LEN: a longer breaker is cut to its first 40 bytes
MAX_TAIL_TOKENS = 20         # llama.cpp's MAX_SEQ_LEN: a longer tail is cut to its first 20 tokens
_FLOAT_MAX_LOG = np.float32(88.7228391)     # about log(FLT_MAX): bounds the exponent so that base**exp stays finite
_NO_TOKEN = -1               # pads windows and tails; never equal to a token id
_NARROWING_BUDGET = 8        # see _repeat_lengths: comparisons per window token before prefix doubling takes over


def _token_text(tokenizer, token_id: int) -> bytes:
    """The bytes of one token detokenized on its own with special tokens rendered (llama.cpp's
    ``detokenize({id}, true)``): control tokens give their text, and a SentencePiece vocabulary that adds a space
    prefix drops the token's leading space.  Tokenizers without that hook give ``token_to_piece``."""
    render = getattr(tokenizer, "_render", None)
    if render is not None:
        return render(token_id, True, False)[0]
    return tokenizer.token_to_piece(token_id)


class DryBreakers:
    """The processed sequence breakers of one vocabulary.

    ``single``: bool [n_vocab], the tokens that are sequence breakers on their own (never penalised; a repeat
    cannot reach back over them).  ``tails``: head token -> its non-empty tails (token tuples); a head followed by
    one of its tails ends a repeat the same way.  A token may be both a single-token breaker and a head.
    """

    def __init__(self, n_vocab: int, single: np.ndarray, tails: dict[int, list[tuple[int, ...]]]):
        self.n_vocab = int(n_vocab)
        self.single = np.asarray(single, dtype=bool)                         # [n_vocab]
        if self.single.shape != (self.n_vocab,):
            raise ValueError(f"single must have shape ({self.n_vocab},), got {self.single.shape}")
        self.tails = {int(h): [tuple(int(t) for t in tail) for tail in ts] for h, ts in tails.items() if ts}
        for head, ts in self.tails.items():
            for tok in (head, *(t for tail in ts for t in tail)):
                if not 0 <= tok < self.n_vocab:
                    raise ValueError(f"breaker token {tok} is out of range for a vocabulary of {self.n_vocab}")
            if any(len(tail) == 0 for tail in ts):
                raise ValueError("an empty tail makes a single-token breaker: put the head in `single` instead")

        # Flat tables for the vectorised repeat-limit scan: one row per (head, tail), sorted by head.
        rows = sorted((head, tail) for head, ts in self.tails.items() for tail in ts)
        self._tail_width = max((len(tail) for _, tail in rows), default=0)
        self._tail_heads = np.array([head for head, _ in rows], dtype=np.int64)              # [n_tails]
        self._tail_lengths = np.array([len(tail) for _, tail in rows], dtype=np.int64)       # [n_tails]
        self._tail_tokens = np.full((len(rows), self._tail_width), _NO_TOKEN, dtype=np.int64)  # [n_tails, width]
        for row, (_, tail) in enumerate(rows):
            self._tail_tokens[row, :len(tail)] = tail
        self._is_head = np.zeros(self.n_vocab, dtype=bool)                   # [n_vocab]: has a non-empty tail
        self._is_head[self._tail_heads] = True

    def __repr__(self) -> str:
        return (f"DryBreakers(n_vocab={self.n_vocab}, single={int(self.single.sum())} tokens, "
                f"heads={len(self.tails)}, tails={self._tail_heads.size})")

    # ------------------------------------------------------------------ construction

    _cache: "weakref.WeakKeyDictionary[object, dict[tuple[str, ...], DryBreakers]]" = weakref.WeakKeyDictionary()
    _cache_lock = threading.Lock()
    CACHE_SETS = 16                  # breaker sets kept per tokenizer (the least recently used one goes)

    @classmethod
    def of(cls, tokenizer, breakers: Iterable[str] = DEFAULT_SEQUENCE_BREAKERS) -> "DryBreakers":
        """The breakers of ``tokenizer``, processed once per (tokenizer, breaker tuple) and cached for as long as
        the tokenizer lives."""
        key = tuple(breakers)
        with cls._cache_lock:
            try:
                per_tokenizer = cls._cache.setdefault(tokenizer, {})
            except TypeError:                  # not weakly referenceable: process it every time
                return cls.from_tokenizer(tokenizer, key)
            found = per_tokenizer.pop(key, None)
            if found is None:
                found = cls.from_tokenizer(tokenizer, key)
                while len(per_tokenizer) >= cls.CACHE_SETS:
                    del per_tokenizer[next(iter(per_tokenizer))]
            per_tokenizer[key] = found           # the most recently used last
            return found

    @classmethod
    def from_tokenizer(cls, tokenizer, breakers: Iterable[str] = DEFAULT_SEQUENCE_BREAKERS) -> "DryBreakers":
        """Process ``breakers`` against every token of ``tokenizer`` (uncached; `of` caches this)."""
        n_vocab = int(tokenizer.n_vocab)
        texts = [_token_text(tokenizer, tid) for tid in range(n_vocab)]
        single = np.zeros(n_vocab, dtype=bool)                               # [n_vocab]
        tails: dict[int, list[tuple[int, ...]]] = {}
        tail_of_rest: dict[bytes, tuple[int, ...] | None] = {}

        def tail_for(rest: bytes) -> tuple[int, ...] | None:
            if rest not in tail_of_rest:
                # rest can end inside a UTF-8 character (a cut breaker, or a head ending in part of one):
                # the tokenizer takes text, so such bytes become U+FFFD.
                try:
                    ids = tokenizer.encode(rest.decode("utf-8", errors="replace"), add_special=False)
                except ValueError:             # text this vocabulary cannot tokenize: no tail can follow
                    ids = None
                tail_of_rest[rest] = None if ids is None else tuple(int(t) for t in ids[:MAX_TAIL_TOKENS])
            return tail_of_rest[rest]

        for breaker in breakers:
            if not isinstance(breaker, str):
                raise TypeError(f"sequence breakers must be strings, got {type(breaker).__name__}")
            pattern = breaker.encode("utf-8")[:MAX_BREAKER_BYTES]
            if not pattern:
                continue
            first = pattern[:1]
            for tid in [tid for tid, text in enumerate(texts) if first in text]:
                text = texts[tid]
                if pattern in text:
                    single[tid] = True
                    continue
                pos = text.find(first)
                while pos >= 0:
                    # the text's suffix from pos is a proper prefix of the breaker (it cannot hold the whole
                    # breaker here), so the token can start it
                    if pattern.startswith(text[pos:]):
                        tail = tail_for(pattern[len(text) - pos:])
                        if tail is not None and len(tail) == 0:
                            single[tid] = True          # llama.cpp keeps an empty tail: a single-token breaker
                        elif tail is not None and tail not in tails.setdefault(tid, []):
                            tails[tid].append(tail)
                    pos = text.find(first, pos + 1)
        return cls(n_vocab, single, tails)

    @classmethod
    def from_token_sequences(cls, n_vocab: int, sequences: Iterable[Sequence[int]]) -> "DryBreakers":
        """Breakers given as token sequences (head, *tail) instead of strings (like llama.cpp's test hook); a
        sequence of one token is a single-token breaker, empty sequences are skipped."""
        single = np.zeros(int(n_vocab), dtype=bool)
        tails: dict[int, list[tuple[int, ...]]] = {}
        for seq in sequences:
            seq = tuple(int(t) for t in seq)
            if not seq:
                continue
            head, tail = seq[0], seq[1:]
            if not 0 <= head < n_vocab:
                raise ValueError(f"breaker token {head} is out of range for a vocabulary of {n_vocab}")
            if not tail:
                single[head] = True
            elif tail not in tails.setdefault(head, []):
                tails[head].append(tail)
        return cls(n_vocab, single, tails)


# ---------------------------------------------------------------------- the per-token path

def _repeat_limit(window: np.ndarray, breakers: DryBreakers) -> int:
    """How many of the newest tokens a repeat may span: ``i - L`` for the newest position ``i`` (counted back from
    the newest token, 0) that starts a breaker (a single-token breaker, L = 0, or a head followed by one of its
    tails, L = the longest such tail); ``len(window)`` when no breaker occurs."""
    n = window.size
    single_at = np.flatnonzero(breakers.single[window])                      # [s] positions, oldest first
    best_pos = int(single_at[-1]) if single_at.size else -1                  # position from the start
    best_len = 0
    if breakers._tail_heads.size:
        start = max(best_pos, 0)              # heads older than the newest single-token breaker cannot win
        head_at = np.flatnonzero(breakers._is_head[window[start:]]) + start  # [h]
        if head_at.size:
            # one row per (head occurrence, tail of that head)
            heads = window[head_at]                                          # [h]
            first = np.searchsorted(breakers._tail_heads, heads, side="left")   # [h]
            count = np.searchsorted(breakers._tail_heads, heads, side="right") - first
            pair_pos = np.repeat(head_at, count)                             # [p]
            pair_row = (np.arange(pair_pos.size) - np.repeat(np.cumsum(count) - count, count)
                        + np.repeat(first, count))                           # [p] rows of the tail tables
            width = breakers._tail_width
            padded = np.concatenate([window, np.full(width, _NO_TOKEN, dtype=window.dtype)])   # [n + width]
            offsets = np.arange(width)                                       # [width]
            following = padded[pair_pos[:, None] + 1 + offsets]              # [p, width] tokens after the head
            lengths = breakers._tail_lengths[pair_row]                       # [p]
            agrees = (following == breakers._tail_tokens[pair_row]) | (offsets >= lengths[:, None])
            matched = agrees.all(axis=1)                                     # [p]; a tail past the end never does
            if matched.any():
                match_pos, match_len = pair_pos[matched], lengths[matched]
                newest = int(match_pos.max())
                longest = int(match_len[match_pos == newest].max())
                if newest > best_pos:
                    best_pos, best_len = newest, longest
                elif newest == best_pos:
                    best_len = max(best_len, longest)
    if best_pos < 0:
        return n
    return (n - 1 - best_pos) - best_len


def _repeat_lengths(window: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(ends [c], lengths [c]): the positions ``j < len(window) - 1`` whose token equals the newest one and, for
    each, the length of the longest common suffix of ``window[:j + 1]`` and ``window``, capped at ``cap``.  Every
    other position has length 0.

    The candidates are narrowed block by block (blocks of 1, 2, 4, ... tokens further back): a candidate leaves at
    its first mismatch, so typical text needs a few small steps.  When the candidates still left would cost more
    than about ``_NARROWING_BUDGET * len(window)`` comparisons (long repeats of short loops), the rest is measured
    by `_lengths_by_doubling` instead, which costs O(n log^2 n) whatever the text.
    """
    n = window.size
    newest = n - 1
    active = np.flatnonzero(window[:-1] == window[-1])                       # [a] candidate ends
    limit = min(cap, n - 1)                   # a suffix of window[:j + 1] has at most j + 1 <= n - 1 tokens
    ends: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    matched = 1                               # tokens known to agree for every active candidate
    block = 1
    while active.size and matched < limit:
        width = min(block, limit - matched)
        if active.size * width > _NARROWING_BUDGET * n:
            ends.append(active)
            lengths.append(_lengths_by_doubling(window, active, matched, limit))
            active = active[:0]
            break
        offsets = matched + np.arange(width)                                 # [width] distances back from the end
        reference = window[newest - offsets]                                 # [width] (indices >= 1)
        back = active[:, None] - offsets                                     # [a, width]
        earlier = np.where(back >= 0, window[np.maximum(back, 0)], _NO_TOKEN)
        mismatch = earlier != reference                                      # [a, width]
        stops = mismatch.any(axis=1)                                         # [a]
        ends.append(active[stops])
        lengths.append(matched + mismatch[stops].argmax(axis=1))
        active = active[~stops]
        matched += width
        block *= 2
    ends.append(active)
    lengths.append(np.full(active.size, matched, dtype=np.int64))
    return np.concatenate(ends), np.minimum(np.concatenate(lengths), max(cap, 0))


def _lengths_by_doubling(window: np.ndarray, ends: np.ndarray, matched: int, limit: int) -> np.ndarray:
    """[c]: for each end ``j`` (whose last ``matched`` tokens agree with the window's), the longest common suffix
    of ``window[:j + 1]`` and ``window``, at most ``limit``; exact, by prefix doubling.

    In the reversed window, ``rank[m][i]`` numbers the distinct blocks ``reversed[i : i + 2**m]`` (blocks cut by
    the end of the window get ranks of their own), so one comparison of two ranks compares two blocks of 2**m
    tokens; each length is then found bit by bit from the largest block down (binary lifting).
    """
    n = window.size
    reversed_window = window[::-1]                                           # [n] newest first
    rank = np.unique(reversed_window, return_inverse=True)[1].reshape(-1).astype(np.int64)   # [n]
    ranks = [rank]
    span = 1
    while 2 * span <= limit - matched:
        following = np.full(n, -1, dtype=np.int64)                           # [n] rank of the next block, -1: none
        following[:n - span] = rank[span:]
        rank = np.unique(rank * (n + 1) + (following + 1), return_inverse=True)[1].reshape(-1).astype(np.int64)
        ranks.append(rank)
        span *= 2
    shift = (n - 1) - ends                    # [c] each end's index in reversed_window
    length = np.full(ends.size, matched, dtype=np.int64)                     # [c]
    for level in range(len(ranks) - 1, -1, -1):
        size = 1 << level
        fits = (length + size <= limit) & (shift + length + size <= n)
        here = np.minimum(shift + length, n - 1)
        there = np.minimum(length, n - 1)
        agree = fits & (ranks[level][here] == ranks[level][there])
        length += size * agree
    return length


def _max_exponent(base: np.float32) -> int:
    """llama.cpp's exponent clamp, ``int(88.7228391f / logf(base))`` for base > 1.000001, else 0 (no clamp)."""
    if not base > np.float32(1.000001):
        return 0
    return int(_FLOAT_MAX_LOG / np.float32(math.log(float(base))))


def dry_penalties(history, breakers: DryBreakers, multiplier: float, base: float, allowed_length: int,
                  penalty_last_n: int) -> tuple[np.ndarray, np.ndarray]:
    """DRY for the next token: (token ids int64 [m] ascending, penalties float32 [m]) to subtract from those
    tokens' logits; both empty when DRY is off or nothing repeats.

    ``history``: the accepted tokens, oldest first, prompt included.  ``penalty_last_n``: how many of the newest
    tokens DRY looks at (-1: all, 0: DRY is off).
    """
    no_penalty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    multiplier, base = np.float32(multiplier), np.float32(base)
    allowed_length, penalty_last_n = int(allowed_length), int(penalty_last_n)
    if penalty_last_n < -1:
        raise ValueError(f"penalty_last_n must be >= -1 (-1: the whole history, 0: off), got {penalty_last_n}")
    if multiplier == 0 or base < 1 or penalty_last_n == 0:
        return no_penalty
    window = np.asarray(history, dtype=np.int64).reshape(-1)                 # [n] oldest first
    if penalty_last_n > 0:
        window = window[-penalty_last_n:]
    n = window.size
    if n == 0 or n <= allowed_length:       # (an empty window can pass a negative allowed_length)
        return no_penalty
    if window.min() < 0 or window.max() >= breakers.n_vocab:
        raise ValueError(f"history holds token ids outside [0, {breakers.n_vocab})")

    rep_limit = _repeat_limit(window, breakers)
    if rep_limit < allowed_length:
        return no_penalty

    ends, lengths = _repeat_lengths(window, rep_limit)                       # [c], [c]
    if allowed_length <= 0:                   # every position ends a long-enough repeat, length 0 ones included
        all_lengths = np.zeros(n - 1, dtype=np.int64)                        # [n - 1]
        all_lengths[ends] = lengths
        ends, lengths = np.arange(n - 1), all_lengths
    else:
        keep = lengths >= allowed_length
        ends, lengths = ends[keep], lengths[keep]
    if ends.size == 0:
        return no_penalty

    # the token after a repeat would extend it: keep each token's longest repeat
    tokens, which = np.unique(window[ends + 1], return_inverse=True)         # [m], [c]
    longest = np.zeros(tokens.size, dtype=np.int64)                          # [m]
    np.maximum.at(longest, which, lengths)
    penalised = ~breakers.single[tokens]
    tokens, longest = tokens[penalised], longest[penalised]

    exponent = longest - allowed_length                                      # [m], >= 0
    max_exponent = _max_exponent(base)
    if max_exponent > 0:
        exponent = np.minimum(exponent, max_exponent)
    with np.errstate(over="ignore"):          # multiplier * base**max_exponent may pass FLT_MAX: inf, as in C
        penalties = (np.float64(multiplier) * np.power(np.float64(base), exponent.astype(np.float64))
                     ).astype(np.float32)                                    # [m]
    return tokens, penalties
