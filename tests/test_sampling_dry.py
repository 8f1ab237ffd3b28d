"""powerinfer.sampling_dry (llama.cpp's DRY repetition penalty) against a plain-Python reference.

The reference below follows llama.cpp's DRY sampler step by step with nested loops: the breaker multimap
(head -> tails, single-token breakers have an empty tail), the backward scan for the repeat limit, a reversed
Z-algorithm for the repeat counts (checked against the naive longest-common-suffix), the per-token maximum and the
clamped penalty.  Token ids must agree exactly; penalties within PENALTY_RTOL: both sides compute
``float32(multiplier * pow(double(base), exponent))`` (llama.cpp's std::pow(float, int) is a double pow); the
module may take the double pow from numpy's SIMD code rather than libm, which can move the float32 result by at
most one unit in the last place.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from powerinfer import sampling_dry
from powerinfer.sampling_dry import (DEFAULT_SEQUENCE_BREAKERS, MAX_BREAKER_BYTES, MAX_TAIL_TOKENS, DryBreakers,
                                     _repeat_lengths, _repeat_limit, dry_penalties)

PENALTY_RTOL = 2.0 ** -23      # one float32 ulp


# ---------------------------------------------------------------------- the reference

def naive_repeat_count(tokens: list[int], j: int) -> int:
    """Length of the longest common suffix of tokens[:j + 1] and tokens."""
    n = 0
    while n <= j and tokens[j - n] == tokens[len(tokens) - 1 - n]:
        n += 1
    return n


def z_repeat_counts(tokens: list[int], rep_limit: int) -> list[int]:
    """Repeat counts (capped at rep_limit) by the Z-algorithm on the reversed sequence, as llama.cpp runs it
    (the capped counts are reused inside a Z-box)."""
    n = len(tokens)
    back = tokens[::-1]                       # back[i]: i tokens before the newest
    counts = [0] * n                          # counts[j] for the forward position j
    box_left = box_right = 0                  # back[box_left..box_right] == back[0..box_right - box_left]
    for k in range(1, n):
        if k > box_right:
            z = 0
            while k + z < n and back[z] == back[k + z]:
                z += 1
            counts[n - 1 - k] = min(z, rep_limit)
            if z > 0:
                box_left, box_right = k, k + z - 1
        else:
            mirror = counts[n - 1 - (k - box_left)]
            room = box_right - k + 1
            if mirror < room:
                counts[n - 1 - k] = min(mirror, rep_limit)
            else:
                end = box_right + 1
                while end < n and back[end] == back[end - k]:
                    end += 1
                counts[n - 1 - k] = min(end - k, rep_limit)
                box_left, box_right = k, end - 1
    return counts


def reference_dry(history, entries, multiplier, base, allowed_length, penalty_last_n) -> dict[int, np.float32]:
    """token -> penalty; ``entries``: (head, tail) pairs, an empty tail for single-token breakers."""
    multiplier, base = np.float32(multiplier), np.float32(base)
    if penalty_last_n == -1:
        penalty_last_n = len(history)
    if multiplier == 0 or base < 1 or penalty_last_n == 0:
        return {}
    tokens = list(history)[-penalty_last_n:]
    n = len(tokens)
    if n <= allowed_length:
        return {}

    def from_end(i):
        return tokens[n - 1 - i]

    rep_limit = n
    for i in range(n):
        longest = -1
        for head, tail in entries:
            if head != from_end(i) or len(tail) <= longest or len(tail) > i:
                continue
            if all(tail[k] == from_end(i - 1 - k) for k in range(len(tail))):
                longest = len(tail)
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed_length:
        return {}

    counts = z_repeat_counts(tokens, rep_limit)
    assert counts[:-1] == [min(naive_repeat_count(tokens, j), rep_limit) for j in range(n - 1)]

    longest_repeat: dict[int, int] = {}
    for j in range(n - 1):
        if counts[j] >= allowed_length:
            token = tokens[j + 1]
            longest_repeat[token] = max(longest_repeat.get(token, counts[j]), counts[j])

    max_exponent = 0
    if base > np.float32(1.000001):
        max_exponent = int(np.float32(88.7228391) / np.float32(math.log(float(base))))
    out = {}
    for token, length in longest_repeat.items():
        if any(head == token and not tail for head, tail in entries):
            continue
        exponent = length - allowed_length
        if max_exponent > 0 and exponent > max_exponent:
            exponent = max_exponent
        with np.errstate(over="ignore"):
            out[token] = np.float32(float(multiplier) * math.pow(float(base), exponent))
    return out


def check_against_reference(history, entries, n_vocab, multiplier, base, allowed_length, penalty_last_n):
    breakers = DryBreakers.from_token_sequences(n_vocab, [(h, *t) for h, t in entries])
    ids, penalties = dry_penalties(np.array(history, dtype=np.int64), breakers, multiplier, base, allowed_length,
                                   penalty_last_n)
    assert ids.dtype == np.int64 and penalties.dtype == np.float32 and ids.shape == penalties.shape
    want = reference_dry(history, entries, multiplier, base, allowed_length, penalty_last_n)
    assert ids.tolist() == sorted(want), (history, entries, multiplier, base, allowed_length, penalty_last_n)
    np.testing.assert_allclose(penalties, np.array([want[t] for t in sorted(want)], dtype=np.float32),
                               rtol=PENALTY_RTOL, atol=0)


# ---------------------------------------------------------------------- random comparisons

def random_history(rng: random.Random, alphabet: int) -> list[int]:
    """Random tokens, sometimes built from repeated blocks so that long repeats happen."""
    n = rng.randrange(0, 70)
    if rng.random() < 0.5:
        return [rng.randrange(alphabet) for _ in range(n)]
    blocks = [[rng.randrange(alphabet) for _ in range(rng.randrange(1, 8))] for _ in range(3)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(blocks) if rng.random() < 0.8 else [rng.randrange(alphabet)]
    return out[:n]


def random_entries(rng: random.Random, alphabet: int) -> list[tuple[int, tuple[int, ...]]]:
    entries: list[tuple[int, tuple[int, ...]]] = []
    for _ in range(rng.randrange(0, 4)):
        head = rng.randrange(alphabet)
        tail = tuple(rng.randrange(alphabet) for _ in range(rng.choice([0, 0, 1, 2, 3])))
        if (head, tail) not in entries:
            entries.append((head, tail))
    return entries


@pytest.mark.parametrize("narrowing_budget", [None, 0], ids=["narrowing", "prefix-doubling"])
def test_random_histories_match_reference(narrowing_budget, monkeypatch):
    if narrowing_budget is not None:          # send every candidate left after the first token to prefix doubling
        monkeypatch.setattr(sampling_dry, "_NARROWING_BUDGET", narrowing_budget)
    rng = random.Random(1234)
    for _ in range(3000):
        alphabet = rng.choice([2, 3, 5, 8])
        check_against_reference(
            random_history(rng, alphabet), random_entries(rng, alphabet), alphabet + 2,
            multiplier=rng.choice([0.0, 0.8, 1.5, -0.5]),
            base=rng.choice([0.9, 1.0, 1.0000005, 1.75, 3.0]),
            allowed_length=rng.choice([-1, 0, 1, 2, 2, 3, 5]),
            penalty_last_n=rng.choice([-1, -1, 0, 1, 5, 20, 100]))


def test_long_repeats_match_reference_and_naive_counts():
    """Long periodic histories take the prefix-doubling path of the repeat lengths."""
    rng = random.Random(7)
    for _ in range(40):
        period = [rng.randrange(4) for _ in range(rng.randrange(1, 6))]
        noise = [rng.randrange(4) for _ in range(rng.randrange(0, 30))]
        history = noise + period * rng.randrange(20, 80)
        history = history[:len(history) - rng.randrange(len(period))]
        for cap in (len(history), rng.randrange(1, len(history) + 1)):
            ends, lengths = _repeat_lengths(np.array(history, dtype=np.int64), cap)
            got = dict(zip(ends.tolist(), lengths.tolist()))
            want = {j: min(naive_repeat_count(history, j), cap) for j in range(len(history) - 1)}
            assert {j: got.get(j, 0) for j in want} == want
        check_against_reference(history, [], 4, 0.8, 1.75, rng.choice([0, 2, 4]), -1)


# ---------------------------------------------------------------------- llama.cpp's example and fixed cases

def test_llama_cpp_example():
    """llama.cpp's documented example: "a b c c b c y a b c" has repeat counts 0 0 3 1 0 2 0 0 0 (0); emitting
    c would repeat 3 (+1) tokens, b 1, y 2."""
    a, b, c, y = 0, 1, 2, 3
    window = np.array([a, b, c, c, b, c, y, a, b, c], dtype=np.int64)
    ends, lengths = _repeat_lengths(window, cap=window.size)
    counts = np.zeros(window.size, dtype=np.int64)
    counts[ends] = lengths
    assert counts.tolist() == [0, 0, 3, 1, 0, 2, 0, 0, 0, 0]

    none = DryBreakers.from_token_sequences(4, [])
    ids, penalties = dry_penalties(window, none, 0.8, 1.75, 1, -1)
    assert ids.tolist() == [b, c, y]
    expected = [np.float32(0.8 * 1.75 ** e) for e in (0, 2, 1)]     # lengths 1, 3, 2 minus allowed_length 1
    np.testing.assert_allclose(penalties, expected, rtol=PENALTY_RTOL)
    # with allowed_length 2 only c and y extend long-enough repeats
    ids, penalties = dry_penalties(window, none, 0.8, 1.75, 2, -1)
    assert ids.tolist() == [c, y]
    np.testing.assert_allclose(penalties, [np.float32(0.8 * 1.75), np.float32(0.8)], rtol=PENALTY_RTOL)


def test_breakers_limit_repeats_and_are_never_penalised():
    a, b, c, nl, h1, h2 = range(6)
    history = [a, b, c, nl, a, b, c, nl, a, b]
    # nl is a single-token breaker: the repeat "a b" after the last nl may extend (limit 2), nl itself is exempt
    single = DryBreakers.from_token_sequences(6, [[nl]])
    assert _repeat_limit(np.array(history), single) == 2
    ids, _ = dry_penalties(history, single, 1.0, 2.0, 2, -1)
    assert ids.tolist() == [c]
    # a two-token breaker h1 h2 at the end: nothing may repeat
    two = DryBreakers.from_token_sequences(6, [[h1, h2]])
    assert _repeat_limit(np.array(history + [h1, h2]), two) == 0
    assert dry_penalties(history + [h1, h2], two, 1.0, 2.0, 2, -1)[0].size == 0
    # h1 without its tail is no breaker; a tail running past the window's end does not match
    assert _repeat_limit(np.array(history + [h1]), two) == len(history) + 1
    assert _repeat_limit(np.array([h1, h2, a, b]), two) == 2
    # a head that is also a single-token breaker: the longest matching tail wins at that position
    both = DryBreakers.from_token_sequences(6, [[h1], [h1, h2]])
    assert _repeat_limit(np.array([a, h1, h2, a, b]), both) == 2
    assert _repeat_limit(np.array([a, h1, a, b]), both) == 2


def test_disabled_settings_return_empty_arrays():
    breakers = DryBreakers.from_token_sequences(4, [[3]])
    history = [0, 1, 2, 0, 1, 2, 0, 1]
    assert dry_penalties(history, breakers, 0.8, 1.75, 2, -1)[0].size > 0
    for args in [(0.0, 1.75, 2, -1), (1e-50, 1.75, 2, -1),       # multiplier 0 (in float32)
                 (0.8, 0.99, 2, -1),                              # base < 1
                 (0.8, 1.75, 2, 0),                               # penalty_last_n 0
                 (0.8, 1.75, 8, -1), (0.8, 1.75, 2, 2),           # window no longer than allowed_length
                 ]:
        ids, penalties = dry_penalties(history, breakers, *args)
        assert ids.dtype == np.int64 and penalties.dtype == np.float32
        assert ids.size == 0 and penalties.size == 0, args
    assert dry_penalties(history + [3], breakers, 0.8, 1.75, 2, -1)[0].size == 0   # repeat limit 0 < 2
    assert dry_penalties([], breakers, 0.8, 1.75, 0, -1)[0].size == 0
    with pytest.raises(ValueError):
        dry_penalties(history, breakers, 0.8, 1.75, 2, -2)
    with pytest.raises(ValueError):
        dry_penalties([0, 1, 9], breakers, 0.8, 1.75, 0, -1)


def test_penalties_clamp_for_huge_repeats():
    none = DryBreakers.from_token_sequences(2, [])
    history = [1] * 300
    for base, max_exponent in [(3.0, 80), (1.75, 158)]:     # int(88.7228391 / ln(base)) in float32
        ids, penalties = dry_penalties(history, none, 1.0, base, 2, -1)
        assert ids.tolist() == [1]
        assert np.isfinite(penalties).all()
        np.testing.assert_allclose(penalties, [np.float32(math.pow(np.float32(base), max_exponent))],
                                   rtol=PENALTY_RTOL)
    # a multiplier above 1 takes the clamped power past FLT_MAX: inf, as float arithmetic gives in llama.cpp
    assert np.isposinf(dry_penalties(history, none, 4.0, 3.0, 2, -1)[1]).all()
    # base <= 1.000001 is not clamped (and stays small)
    np.testing.assert_allclose(dry_penalties(history, none, 1.0, 1.0, 2, -1)[1], [1.0])


# ---------------------------------------------------------------------- breaker processing on real vocabularies

def reference_breakers(tokenizer, texts: list[bytes], breakers) -> tuple[set[int], dict[int, set[tuple[int, ...]]]]:
    """Single-token breakers and head -> tails, by checking every overlap length of every token's end."""
    single: set[int] = set()
    tails: dict[int, set[tuple[int, ...]]] = {}
    for breaker in breakers:
        pattern = breaker.encode()[:MAX_BREAKER_BYTES]
        if not pattern:
            continue
        for tid, text in enumerate(texts):
            if pattern in text:
                single.add(tid)
                continue
            for overlap in range(1, len(pattern)):
                if text.endswith(pattern[:overlap]):
                    rest = pattern[overlap:].decode("utf-8", errors="replace")
                    tail = tuple(tokenizer.encode(rest, add_special=False)[:MAX_TAIL_TOKENS])
                    tails.setdefault(tid, set()).add(tail)
    return single, tails


def check_breakers(tokenizer, breakers) -> DryBreakers:
    texts = [tokenizer._render(tid, True, False)[0] for tid in range(tokenizer.n_vocab)]   # detokenize({id}, true)
    got = DryBreakers.of(tokenizer, breakers)
    single, tails = reference_breakers(tokenizer, texts, breakers)
    assert set(np.flatnonzero(got.single).tolist()) == single
    assert {h: set(ts) for h, ts in got.tails.items()} == tails
    assert all(len(ts) == len(set(ts)) for ts in got.tails.values())
    return got


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    import powerinfer
    return powerinfer.Model(tiny_model("f32")).tokenizer


def test_breakers_of_the_tiny_vocabulary(tiny_tokenizer):
    tok = tiny_tokenizer
    default = check_breakers(tok, DEFAULT_SEQUENCE_BREAKERS)
    assert not default.tails                                   # one-byte breakers have no heads
    for breaker in (b"\n", b":", b"\"", b"*"):                 # the byte tokens and pieces that are the breaker
        exact = [tid for tid in range(tok.n_vocab) if tok.token_to_piece(tid) == breaker]
        assert exact and default.single[exact].all()
    assert DryBreakers.of(tok, list(DEFAULT_SEQUENCE_BREAKERS)) is default        # cached per breaker tuple
    # a multi-token breaker: tokens ending in a prefix of it are heads whose tails tokenize the rest
    multi = check_breakers(tok, ["the end"])
    the = tok.encode("the", add_special=False)
    assert len(the) == 1 and tok.id_to_text(the[0]) == "\u2581the"     # rendered alone as "the"
    assert multi.tails[the[0]] == [tuple(tok.encode(" end", add_special=False))]
    assert not multi.single.any()


def test_breakers_of_gemma(gemma_file):
    from powerinfer import tokenizer as tokenizers
    from powerinfer.gguf_file import open_gguf
    tok = tokenizers.load(open_gguf(gemma_file).metadata)
    newline = DryBreakers.of(tok, ["\n"])
    pieces = [tok.token_to_piece(tid) for tid in range(tok.n_vocab)]
    assert set(np.flatnonzero(newline.single).tolist()) == {t for t, p in enumerate(pieces) if b"\n" in p}
    assert not newline.tails

    breakers = DryBreakers.of(tok, ["### Instruction", "<start_of_turn>"])
    hashes = tok.encode("###", add_special=False)
    assert len(hashes) == 1 and tuple(tok.encode(" Instruction", add_special=False)) in breakers.tails[hashes[0]]
    assert breakers.single[tok.encode("<start_of_turn>", add_special=False, parse_special=True)[0]]
    # a repeat cannot reach back over the breaker: the limit is what follows it
    history = tok.encode("say hello ### Instruction say hello", add_special=False)
    after = len(tok.encode(" say hello", add_special=False))
    assert _repeat_limit(np.array(history), breakers) == after


def test_breaker_sets_cache_is_bounded_and_requests_are_capped(tiny_model):
    import powerinfer as pi
    from powerinfer.sampling import MAX_DRY_BREAKERS, SamplingParams
    tok = pi.Model(tiny_model("f32")).tokenizer
    sets = [(f"x{i}",) for i in range(DryBreakers.CACHE_SETS + 5)]
    for s in sets:
        DryBreakers.of(tok, s)
    cached = DryBreakers._cache[tok]
    assert len(cached) == DryBreakers.CACHE_SETS and sets[-1] in cached and sets[0] not in cached
    assert DryBreakers.of(tok, sets[-1]) is cached[sets[-1]]
    with pytest.raises(ValueError, match="at most"):
        SamplingParams(dry_sequence_breakers=tuple("ab" * MAX_DRY_BREAKERS)).validate()
