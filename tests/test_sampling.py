"""Tests for powerinfer.sampling against straightforward reference computations.

Run: PYTHONPATH=bindings python -m pytest tests/test_sampling.py -q
"""

import math

import numpy as np
import pytest

from powerinfer.sampling import Sampler, SamplingParams

# Chi-square acceptance bound for the empirical-frequency tests: the 99.9th
# percentile of chi2 with 7 degrees of freedom (8 categories).  With a fixed
# seed the test is deterministic; the bound only documents how far off a
# correct sampler could plausibly be.
CHI2_DF7_P999 = 24.32


def P(**kw) -> SamplingParams:
    """Params with every filter disabled unless overridden."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    base.update(kw)
    return SamplingParams(**base)


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


# --------------------------------------------------------------- reference


def ref_penalties(logits, history, repeat_penalty, presence, frequency, last_n):
    """llama.cpp llama_sample_repetition_penalties, one token at a time."""
    x = np.array(logits, dtype=np.float32)
    window = history if last_n < 0 else (history[-last_n:] if last_n > 0 else [])
    counts = {}
    for t in window:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        v = x[t]
        if v <= 0:
            v = v * np.float32(repeat_penalty)
        else:
            v = v / np.float32(repeat_penalty)
        v = v - (np.float32(c) * np.float32(frequency) + np.float32(1.0) * np.float32(presence))
        x[t] = np.float32(v)
    return x


def ref_chain(logits, prm: SamplingParams):
    """Classic chain on a small vocab with full sorts and explicit loops.
    Returns {token: prob}.  (No bias/penalties/eos: tested separately.)"""
    x = np.asarray(logits, dtype=np.float32)
    cand = [(float(x[i]), i) for i in range(x.size) if x[i] > -np.inf]
    cand.sort(key=lambda c: (-c[0], c[1]))
    if prm.temperature <= 0:
        return {cand[0][1]: 1.0}
    if prm.top_k > 0:
        cand = cand[: prm.top_k]
    if prm.top_p < 1.0:
        p = softmax([c[0] for c in cand])
        cum, last = 0.0, len(cand)
        for i, pi in enumerate(p):
            cum += pi
            if cum >= prm.top_p:
                last = i + 1
                break
        cand = cand[:last]
    if prm.min_p > 0.0:
        p = softmax([c[0] for c in cand])
        cand = [c for c, pi in zip(cand, p) if pi >= prm.min_p * p.max()]
    v = np.array([c[0] for c in cand], dtype=np.float32) / np.float32(prm.temperature)
    return dict(zip([c[1] for c in cand], softmax(v)))


def as_dict(ids, probs):
    return dict(zip(ids.tolist(), probs.tolist()))


def assert_matches_ref(logits, prm):
    ids, probs = Sampler(prm).probs(logits)
    got = as_dict(ids, probs)
    want = ref_chain(logits, prm)
    assert set(got) == set(want), (prm, sorted(got), sorted(want))
    np.testing.assert_allclose([got[t] for t in want], list(want.values()), rtol=1e-6, atol=1e-12)
    # sorted by probability, descending
    assert np.all(np.diff(probs) <= 1e-15)
    assert math.isclose(probs.sum(), 1.0, rel_tol=1e-9)


# ------------------------------------------------------------------ greedy


@pytest.mark.parametrize("temp", [0.0, -1.0])
def test_greedy_is_argmax(temp):
    rng = np.random.default_rng(0)
    s = Sampler(P(temperature=temp, top_k=40, top_p=0.5, min_p=0.1))
    for _ in range(50):
        logits = rng.normal(size=1000).astype(np.float32) * 3
        assert s.sample(logits) == int(np.argmax(logits))
    ids, probs = s.probs(logits)
    assert ids.tolist() == [int(np.argmax(logits))] and probs.tolist() == [1.0]


def test_greedy_tie_picks_lowest_id():
    logits = np.array([0.0, 5.0, 1.0, 5.0], dtype=np.float32)
    assert Sampler(P(temperature=0)).sample(logits) == 1


@pytest.mark.parametrize("temp", [0.01, 1.0, 100.0])
def test_top_k_1_is_greedy_at_any_temperature(temp):
    rng = np.random.default_rng(1)
    s = Sampler(P(temperature=temp, top_k=1))
    for _ in range(50):
        logits = rng.normal(size=500).astype(np.float32)
        assert s.sample(logits) == int(np.argmax(logits))


# ----------------------------------------------------------------- filters


def test_top_k_alone():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=100).astype(np.float32)
    for k in [1, 2, 7, 99, 100, 1000, 0, -3]:
        prm = P(top_k=k)
        ids, probs = Sampler(prm).probs(logits)
        kk = 100 if k <= 0 or k >= 100 else k
        assert set(ids.tolist()) == set(np.argsort(-logits)[:kk].tolist())
        assert_matches_ref(logits, prm)


def test_top_k_ties_at_boundary_keep_lower_ids():
    logits = np.array([1.0, 3.0, 2.0, 2.0, 2.0, 0.0], dtype=np.float32)
    ids, _ = Sampler(P(top_k=3)).probs(logits)
    assert ids.tolist() == [1, 2, 3]


def test_top_p_alone_hand_computed():
    logits = np.log(np.array([0.05, 0.5, 0.15, 0.3]))
    for top_p, want in [(0.0, {1}), (0.3, {1}), (0.75, {1, 3}), (0.85, {1, 3, 2}),
                        (0.99, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})]:
        ids, probs = Sampler(P(top_p=top_p)).probs(logits)
        assert set(ids.tolist()) == want, top_p
        assert_matches_ref(logits, P(top_p=top_p))


def test_min_p_alone_hand_computed():
    logits = np.log(np.array([0.05, 0.5, 0.15, 0.3]))
    for min_p, want in [(0.0, {0, 1, 2, 3}), (0.05, {0, 1, 2, 3}), (0.2, {1, 2, 3}),
                        (0.5, {1, 3}), (0.7, {1}), (1.0, {1})]:
        ids, _ = Sampler(P(min_p=min_p)).probs(logits)
        assert set(ids.tolist()) == want, min_p
        assert_matches_ref(logits, P(min_p=min_p))


def test_temperature_alone():
    logits = np.array([0.0, 1.0, 2.0, -1.0], dtype=np.float32)
    for t in [0.3, 1.0, 2.5]:
        ids, probs = Sampler(P(temperature=t)).probs(logits)
        np.testing.assert_allclose(as_dict(ids, probs)[2], softmax(logits / t)[2], rtol=1e-6)
        assert_matches_ref(logits, P(temperature=t))


def test_random_chains_match_reference():
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        logits = (rng.normal(size=n) * rng.uniform(0.1, 5)).astype(np.float32)
        if n > 3 and rng.random() < 0.3:
            logits[rng.choice(n, size=n // 3, replace=False)] = -np.inf
            if not np.isfinite(logits).any():
                logits[0] = 0.0
        prm = P(
            temperature=float(rng.choice([0.0, 0.5, 1.0, 1.7])),
            top_k=int(rng.choice([0, 1, 3, 10, 100])),
            top_p=float(rng.choice([1.0, 0.95, 0.7, 0.3, 0.0])),
            min_p=float(rng.choice([0.0, 0.05, 0.2, 0.6])),
        )
        assert_matches_ref(logits, prm)


def test_large_vocab_top_p_matches_reference():
    # flat-ish distribution so the top_p prefix spans thousands of tokens
    rng = np.random.default_rng(4)
    logits = (rng.normal(size=5000) * 0.5).astype(np.float32)
    for top_p in [0.1, 0.5, 0.95]:
        assert_matches_ref(logits, P(top_p=top_p))
        assert_matches_ref(logits, P(top_p=top_p, min_p=0.2, top_k=3000))


def test_large_vocab_top_p_with_ties_matches_reference():
    # coarse logits -> many exact ties at every cut point (ties: lower id first)
    rng = np.random.default_rng(10)
    logits = (np.round(rng.normal(size=4000) * 4) / 4).astype(np.float32)
    for top_p in [0.05, 0.3, 0.8]:
        assert_matches_ref(logits, P(top_p=top_p))


def test_big_vocab_default_params_smoke():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=256_000).astype(np.float32) * 4
    s = Sampler(SamplingParams(seed=7))
    toks = [s.sample(logits) for _ in range(5)]
    allowed = set(s.probs(logits)[0].tolist())
    assert allowed and set(toks) <= allowed and len(allowed) <= 40


# --------------------------------------------------------------- penalties


@pytest.mark.parametrize(
    "rp,pres,freq,last_n",
    [(1.3, 0.0, 0.0, 64), (0.7, 0.0, 0.0, 64), (1.0, 0.5, 0.0, 64), (1.0, 0.0, 0.25, 64),
     (1.1, 0.4, 0.3, 64), (1.2, 0.5, 0.5, 3), (1.2, 0.5, 0.5, -1), (1.2, 0.5, 0.5, 0)],
)
def test_penalties_exact(rp, pres, freq, last_n):
    rng = np.random.default_rng(6)
    logits = rng.normal(size=30).astype(np.float32) * 2
    logits[5] = 0.0
    logits[6] = -np.inf
    history = [3, 5, 3, 6, 10, 3, 11, 10, 29, 0, 3]
    prm = P(repeat_penalty=rp, presence_penalty=pres, frequency_penalty=freq, repeat_last_n=last_n)
    s = Sampler(prm)
    for t in history:
        s.accept(t)
    got = s.process_logits(logits)
    want = ref_penalties(logits, history, rp, pres, freq, last_n)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    # the caller's logits are untouched
    assert logits[3] == np.float32(np.random.default_rng(6).normal(size=30)[3] * 2)


def test_penalty_formulas_by_hand():
    logits = np.array([2.0, -2.0, 0.0, 1.0], dtype=np.float32)
    s = Sampler(P(repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25))
    for t in [0, 0, 1, 2]:
        s.accept(t)
    got = s.process_logits(logits)
    # token 0: 2/2 - (2*0.25 + 0.5); token 1: -2*2 - (0.25+0.5); token 2: 0*2 - 0.75
    np.testing.assert_array_equal(got, np.array([0.0, -4.75, -0.75, 1.0], dtype=np.float32))


def test_penalties_window_and_history():
    logits = np.zeros(4, dtype=np.float32)
    s = Sampler(P(presence_penalty=1.0, repeat_last_n=2))
    s.sample(logits)
    assert s.history == []  # sample() does not record
    for t in [0, 1, 2]:
        s.accept(t)
    assert s.process_logits(logits).tolist() == [0.0, -1.0, -1.0, 0.0]
    s.reset()
    assert s.history == [] and s.process_logits(logits).tolist() == [0.0] * 4
    # long histories are trimmed but the window stays correct
    for i in range(5000):
        s.accept(i % 4)
    assert len(s.history) < 5000 and s.history[-2:] == [2, 3]
    assert s.process_logits(logits).tolist() == [0.0, 0.0, -1.0, -1.0]


def test_penalty_steers_sampling():
    logits = np.array([3.0, 2.9, -5.0], dtype=np.float32)
    s = Sampler(P(temperature=0, presence_penalty=1.0))
    assert s.sample(logits) == 0
    s.accept(0)
    assert s.sample(logits) == 1


# ---------------------------------------------------- bias / eos / masking


def test_logit_bias():
    logits = np.array([1.0, 2.0, 0.5, -1.0], dtype=np.float32)
    prm = P(logit_bias={0: 3.0, 3: -np.inf, 2: -0.5})
    s = Sampler(prm)
    want = logits + np.array([3.0, 0.0, -0.5, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(s.process_logits(logits), want)
    ids, probs = s.probs(logits)
    assert 3 not in ids.tolist() and ids[0] == 0
    np.testing.assert_allclose(as_dict(ids, probs)[0], softmax(want[:3])[0], rtol=1e-6)
    assert Sampler(P(temperature=0, logit_bias={2: 10.0})).sample(logits) == 2
    with pytest.raises(ValueError, match="out of range"):
        Sampler(P(logit_bias={4: 1.0})).sample(logits)


def test_ignore_eos():
    logits = np.array([0.0, 5.0, 1.0, 4.0], dtype=np.float32)
    s = Sampler(P(ignore_eos=True), eos_ids=[1, 3])
    ids, _ = s.probs(logits)
    assert set(ids.tolist()) == {0, 2}
    assert all(s.sample(logits) in (0, 2) for _ in range(200))
    assert Sampler(P(temperature=0, ignore_eos=True), eos_ids=[1]).sample(logits) == 3
    # not ignored: eos is a normal token
    assert Sampler(P(temperature=0), eos_ids=[1]).sample(logits) == 1
    assert 1 in Sampler(P(), eos_ids=[1]).probs(logits)[0].tolist()


def test_neg_inf_logits_never_sampled():
    logits = np.full(10, -np.inf, dtype=np.float32)
    logits[[2, 7]] = [0.0, 0.1]
    s = Sampler(P(top_k=5, top_p=0.99, min_p=0.0))
    assert {s.sample(logits) for _ in range(300)} == {2, 7}


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_all_masked_falls_back_to_raw_argmax(temp):
    logits = np.array([0.0, 3.0, 1.0], dtype=np.float32)
    s = Sampler(P(temperature=temp, ignore_eos=True), eos_ids=[0, 1, 2])
    assert s.sample(logits) == 1
    ids, probs = s.probs(logits)
    assert ids.tolist() == [1] and probs.tolist() == [1.0]
    s2 = Sampler(P(temperature=temp, logit_bias={0: -np.inf, 1: -np.inf, 2: -np.inf}))
    assert s2.sample(logits) == 1
    # even an all -inf input does not crash
    assert Sampler(P(temperature=temp)).sample(np.full(4, -np.inf, np.float32)) in range(4)


def test_single_token_vocab():
    assert Sampler(P()).sample(np.array([0.3], np.float32)) == 0


def test_bad_logits():
    s = Sampler(P())
    with pytest.raises(ValueError, match="NaN"):
        s.sample(np.array([0.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="NaN"):
        s.probs(np.array([0.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="1-D"):
        s.sample(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="empty"):
        s.sample(np.zeros(0, np.float32))


@pytest.mark.parametrize("kw", [dict(), dict(logit_bias={0: 5.0}, presence_penalty=1.0, ignore_eos=True)])
def test_sample_does_not_modify_input(kw):
    logits = np.array([1.0, 2.0, 3.0], np.float32)
    logits.flags.writeable = False  # any write into the caller's array would raise
    s = Sampler(P(**kw), eos_ids=[2])
    s.accept(1)
    s.sample(logits)
    s.probs(logits)
    out = s.process_logits(logits)
    assert out is not logits and out.flags.writeable
    assert logits.tolist() == [1.0, 2.0, 3.0]
    # other dtypes / plain lists are accepted too
    assert s.sample([1.0, 2.0, 3.0]) in range(3)
    assert s.sample(logits.astype(np.float16)) in range(3)


# ----------------------------------------------------------- determinism


def _draw(sampler, logits_seq):
    return [sampler.sample(l) for l in logits_seq]


def test_seed_determinism_and_reset():
    rng = np.random.default_rng(8)
    seq = [rng.normal(size=64).astype(np.float32) for _ in range(300)]
    prm = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.02, seed=42)
    a, b = Sampler(prm), Sampler(prm)
    ta = _draw(a, seq)
    assert ta == _draw(b, seq)
    a.reset()
    assert _draw(a, seq) == ta
    other = _draw(Sampler(SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.02, seed=43)), seq)
    assert sum(x != y for x, y in zip(ta, other)) > 100


def test_random_seed_is_reported_and_reproducible():
    rng = np.random.default_rng(9)
    seq = [rng.normal(size=32).astype(np.float32) for _ in range(100)]
    s1 = Sampler(P(seed=-1))
    assert isinstance(s1.seed, int) and s1.seed >= 0
    t1 = _draw(s1, seq)
    assert _draw(Sampler(P(seed=s1.seed)), seq) == t1


@pytest.mark.parametrize("prm", [
    P(temperature=0.7),
    P(temperature=1.3, top_k=6),
    P(temperature=1.0, top_p=0.9),
])
def test_empirical_frequencies_match_softmax(prm):
    logits = np.array([2.0, 1.5, 1.0, 0.8, 0.5, 0.0, -0.5, -1.0], dtype=np.float32)
    s = Sampler(prm)
    ids, probs = s.probs(logits)
    expected = np.zeros(logits.size)
    expected[ids] = probs
    n = 6000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=logits.size)
    assert counts[expected == 0].sum() == 0
    m = expected > 0
    chi2 = (((counts[m] - n * expected[m]) ** 2) / (n * expected[m])).sum()
    assert chi2 < CHI2_DF7_P999, (chi2, counts, n * expected)


# ------------------------------------------------------------- validation


@pytest.mark.parametrize("kw,msg", [
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=-0.1), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(repeat_penalty=0.0), "repeat_penalty"),
    (dict(repeat_penalty=-1.0), "repeat_penalty"),
    (dict(repeat_penalty=float("nan")), "repeat_penalty"),
    (dict(repeat_last_n=-2), "repeat_last_n"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(frequency_penalty=float("inf")), "frequency_penalty"),
    (dict(seed=-5), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(ignore_eos="yes"), "ignore_eos"),
    (dict(logit_bias=[(1, 2.0)]), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={1: float("nan")}), "logit_bias"),
    (dict(logit_bias={1: float("inf")}), "logit_bias"),
])
def test_validation_errors(kw, msg):
    prm = SamplingParams(**kw)
    with pytest.raises(ValueError, match=msg):
        prm.validate()
    with pytest.raises(ValueError, match=msg):
        Sampler(prm)


def test_valid_params_pass():
    SamplingParams().validate()
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0, repeat_last_n=-1,
                   presence_penalty=-0.5, seed=0, logit_bias={3: -np.inf, 4: 2}).validate()
    with pytest.raises(ValueError):
        Sampler(P(), eos_ids=[-1])
    with pytest.raises(ValueError):
        Sampler(P()).accept(-3)


def test_results_do_not_alias_between_calls():
    # the sampler reuses a scratch buffer internally; returned arrays must be independent
    s = Sampler(P(presence_penalty=1.0, logit_bias={0: 1.0}, top_k=0))
    s.accept(2)
    a = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    b = np.array([9.0, -9.0, 4.0, 0.5], np.float32)
    out_a = s.process_logits(a)
    ids_a, p_a = s.probs(a)
    snap = (out_a.copy(), ids_a.copy(), p_a.copy())
    s.process_logits(b)
    s.probs(b)
    s.sample(b)
    np.testing.assert_array_equal(out_a, snap[0])
    np.testing.assert_array_equal(ids_a, snap[1])
    np.testing.assert_array_equal(p_a, snap[2])
