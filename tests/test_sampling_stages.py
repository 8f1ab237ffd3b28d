"""llama.cpp's other sampler stages (typical, min_keep, top-n-sigma, XTC, dynamic temperature, mirostat 1 and 2)
and a reordered chain (`samplers`), each against a plain-loop reference written from llama.cpp's definitions.

Probabilities: float64 here and in the sampler; llama.cpp computes them in float32, so at exact boundaries its
choice may differ in the last bit (not tested: random logits have no ties)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from powerinfer.sampling import Sampler, SamplingParams, parse_samplers

PROB_RTOL = 1e-9          # our float64 softmax vs the reference's float64 softmax over the same logits


def P(**kw) -> SamplingParams:
    """Params with every stage off unless overridden."""
    return SamplingParams(**{**dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7), **kw})


def softmax(v):
    v = np.asarray(v, dtype=np.float64)
    e = np.exp(v - v.max())
    return e / e.sum()


def sorted_cands(logits):
    """[(logit, id)] by logit descending, id ascending (llama.cpp's sorted order, ties by id)."""
    return sorted(((float(np.float32(x)), i) for i, x in enumerate(logits) if x > -np.inf), key=lambda c: (-c[0], c[1]))


def ref_typical(cands, p_typ, min_keep):
    p = softmax([c[0] for c in cands])
    ent = -sum(pi * math.log(pi) for pi in p if pi > 0)
    order = sorted(range(len(cands)), key=lambda i: abs(-math.log(p[i]) - ent))   # stable: ties keep prob order
    cum, last = 0.0, len(order)
    for k, i in enumerate(order):
        cum += p[i]
        if cum > p_typ and (min_keep == 0 or k >= min_keep - 1):
            last = k + 1
            break
    return [cands[i] for i in order[:last]]


def ref_top_p(cands, top_p, min_keep):
    p = softmax([c[0] for c in cands])
    cum = 0.0
    for i, pi in enumerate(p):
        cum += pi
        if cum >= top_p and i + 1 >= min_keep:
            return cands[:i + 1]
    return cands


def ref_min_p(cands, min_p, min_keep):
    p = softmax([c[0] for c in cands])
    kept = [c for c, pi in zip(cands, p) if pi >= min_p * p.max()]
    return kept if len(kept) >= min_keep else cands[:min_keep]


def ref_top_n_sigma(cands, n):
    v = np.array([c[0] for c in cands], dtype=np.float64)
    return [c for c in cands if c[0] >= v.max() - n * v.std()]


def ref_xtc(cands, threshold, min_keep):
    """XTC when it fires: drop the tokens at or above the threshold except the least likely of them."""
    p = softmax([c[0] for c in cands])
    pos_last = 0
    for i, pi in enumerate(p):
        if pi >= threshold:
            pos_last = i
        else:
            break
    return cands[pos_last:] if len(cands) - pos_last >= min_keep and pos_last > 0 else cands


def ref_dyn_temp(cands, temp, rng_, exponent):
    p = softmax([c[0] for c in cands])
    ent = -sum(pi * math.log(pi) for pi in p if pi > 0)
    lo, hi = max(0.0, temp - rng_), temp + rng_
    return lo + (hi - lo) * (ent / math.log(len(cands))) ** exponent


def check(prm, logits, want_cands, temp=None):
    """Our sampler's distribution equals softmax(want logits / temp) over want_cands."""
    ids, probs = Sampler(prm).probs(logits)
    t = prm.temperature if temp is None else temp
    want = dict(zip([c[1] for c in want_cands],
                    softmax(np.array([c[0] for c in want_cands], dtype=np.float32) / np.float32(t))))
    got = dict(zip(ids.tolist(), probs.tolist()))
    assert set(got) == set(want), (sorted(got), sorted(want))
    np.testing.assert_allclose([got[i] for i in want], list(want.values()), rtol=PROB_RTOL, atol=1e-15)


@pytest.mark.parametrize("trial", range(40))
def test_stages_against_loops(trial):
    rng = np.random.default_rng(trial)
    n = int(rng.integers(2, 60))
    logits = (rng.normal(size=n) * rng.uniform(0.5, 4)).astype(np.float32)
    cands = sorted_cands(logits)
    min_keep = int(rng.integers(0, 5))
    typ = float(rng.uniform(0.05, 0.99))
    check(P(typical_p=typ, min_keep=min_keep), logits, ref_typical(cands, typ, min_keep))
    tp = float(rng.uniform(0.05, 0.99))
    check(P(top_p=tp, min_keep=min_keep), logits, ref_top_p(cands, tp, min_keep))
    mp = float(rng.uniform(0.01, 0.9))
    check(P(min_p=mp, min_keep=min_keep), logits, ref_min_p(cands, mp, min_keep))
    sig = float(rng.uniform(0.2, 3))
    check(P(top_n_sigma=sig), logits, ref_top_n_sigma(cands, sig))
    thr = float(rng.uniform(0.01, 0.5))
    check(P(xtc_probability=1.0, xtc_threshold=thr, min_keep=min_keep), logits, ref_xtc(cands, thr, min_keep))
    t, r, e = float(rng.uniform(0.3, 1.5)), float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.5, 2))
    check(P(temperature=t, dynatemp_range=r, dynatemp_exponent=e), logits, cands, ref_dyn_temp(cands, t, r, e))


def test_chain_order_is_followed():
    """Temperature before top_p changes which tokens top_p keeps; typical before top_k too."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=40).astype(np.float32) * 3
    cands = sorted_cands(logits)
    tempered = [(float(np.float32(v) / np.float32(0.5)), i) for v, i in cands]
    kept = {i for _, i in ref_top_p(tempered, 0.8, 0)}
    check(P(temperature=0.5, top_p=0.8, samplers="tp"), logits, [c for c in tempered if c[1] in kept], temp=1.0)
    check(P(temperature=0.5, top_p=0.8), logits, ref_top_p(cands, 0.8, 0))       # default: top_p first
    typ = {i for _, i in ref_typical(cands, 0.6, 0)}
    check(P(typical_p=0.6, top_k=5, samplers="yk"), logits, [c for c in cands if c[1] in typ][:5])
    # a stage left out of the list does nothing
    check(P(top_k=3, samplers="t"), logits, cands)
    assert parse_samplers("edskypmxt") == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                                           "xtc", "temperature")
    assert parse_samplers("top_k;temperature") == parse_samplers(["top-k", "temp"]) == ("top_k", "temperature")
    for bad, msg in (("kz", "unknown sampler"), ("ki", "infill"), (["adaptive_p"], "adaptive_p")):
        with pytest.raises(ValueError, match=msg):
            parse_samplers(bad)


def test_greedy_with_stages_that_can_drop_the_best():
    """temperature <= 0 keeps the best of what reaches it: after XTC (firing) that is not the argmax."""
    logits = np.array([5.0, 4.0, 1.0, 0.0], dtype=np.float32)
    assert Sampler(P(temperature=0.0)).sample(logits) == 0
    s = Sampler(P(temperature=0.0, xtc_probability=1.0, xtc_threshold=0.1))
    assert s.sample(logits) == 1                 # token 0 (p 0.71) excluded, token 1 (p 0.26) the last above 0.1
    assert Sampler(P(temperature=0.0, typical_p=0.2)).sample(logits) == 0


def test_xtc_fires_with_its_probability():
    logits = np.array([3.0, 2.9, 0.0, -1.0], dtype=np.float32)
    s = Sampler(P(xtc_probability=0.3, xtc_threshold=0.2, temperature=1e-3))   # near-greedy: the best survivor
    picks = [s.sample(logits) for _ in range(4000)]
    fired = picks.count(1) / len(picks)            # token 0 excluded -> token 1
    assert abs(fired - 0.3) < 0.03
    a, b = Sampler(P(xtc_probability=0.3, xtc_threshold=0.2, seed=5)), Sampler(P(xtc_probability=0.3,
                                                                                 xtc_threshold=0.2, seed=5))
    assert [a.sample(logits) for _ in range(50)] == [b.sample(logits) for _ in range(50)]
    # probs() shows the next draw's distribution without consuming it
    c = Sampler(P(xtc_probability=0.5, xtc_threshold=0.2, seed=9))
    for _ in range(20):
        ids, _ = c.probs(logits)
        assert c.sample(logits) in ids.tolist()


def ref_mirostat(logits_seq, version, tau, eta, temp, seed, m=100):
    """Mirostat 1 / 2 from their definitions, drawing with the same generator and cdf inversion as the sampler."""
    rng = np.random.default_rng(seed)
    mu = 2 * tau
    out = []
    for logits in logits_seq:
        cands = sorted_cands(np.asarray(logits, dtype=np.float32) / np.float32(temp))
        p = softmax([c[0] for c in cands])
        if version == 1:
            num = den = 0.0
            for i in range(min(m - 1, len(p) - 1)):
                t_i = math.log((i + 2) / (i + 1))
                num += t_i * math.log(p[i] / p[i + 1])
                den += t_i * t_i
            s_hat = num / den
            eps = s_hat - 1
            k = (eps * 2 ** mu / (1 - len(logits) ** -eps)) ** (1 / s_hat)
            keep = min(max(int(k), 1), len(cands))
        else:
            keep = max(sum(1 for pi in p if -math.log2(pi) <= mu), 1)
        cands = sorted(cands[:keep], key=lambda c: c[1])       # drawn in ascending id order (the chain's order)
        p = softmax([c[0] for c in cands])
        cdf = np.cumsum(p)
        i = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cands) - 1)
        out.append(cands[i][1])
        mu -= eta * (-math.log2(p[i]) - tau)
    return out, mu


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_against_its_definition(version):
    rng = np.random.default_rng(version)
    seq = [(rng.normal(size=300) * 2.5).astype(np.float32) for _ in range(60)]
    s = Sampler(P(mirostat=version, mirostat_tau=3.0, mirostat_eta=0.2, temperature=0.9, seed=11,
                  top_k=40, repeat_penalty=1.5))          # the other stages (penalties included) do not run
    got = []
    for logits in seq:
        got.append(s.sample(logits))
        s.accept(got[-1])
    want, mu = ref_mirostat(seq, version, 3.0, 0.2, 0.9, 11)
    assert got == want
    assert math.isclose(s.mu, mu, rel_tol=1e-9)
    s.reset()
    assert s.mu == 6.0


def test_validation():
    for kw, msg in ((dict(mirostat=3), "mirostat"), (dict(typical_p=-1.0), "typical_p"), (dict(min_keep=-1),
                    "min_keep"), (dict(xtc_probability=1.5), "xtc_probability"), (dict(dry_allowed_length=-1),
                    "dry_allowed_length"), (dict(dry_penalty_last_n=-2), "dry_penalty_last_n"),
                    (dict(samplers="kq"), "unknown sampler"), (dict(dry_sequence_breakers="\n"), "breakers")):
        with pytest.raises(ValueError, match=msg):
            P(**kw).validate()


def test_dry_in_the_chain():
    """DRY at its place in the chain: the logits lose exactly what sampling_dry computes for the history."""
    from powerinfer.sampling_dry import DryBreakers, dry_penalties
    rng = np.random.default_rng(2)
    logits = rng.normal(size=50).astype(np.float32)
    history = [5, 6, 7, 8, 1, 5, 6, 7]                       # "5 6 7" repeats: 8 would extend it
    prm = P(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)
    s = Sampler(prm)                                         # no tokenizer: no sequence breakers
    for t in history:
        s.accept(t)
    ids, pen = dry_penalties(history, DryBreakers.from_token_sequences(50, []), 0.8, 1.75, 2, -1)
    assert ids.tolist() == [8]
    want = logits.copy()
    want[ids] -= pen
    got_ids, got_p = s.probs(logits)
    np.testing.assert_allclose(got_p, softmax(want)[got_ids], rtol=PROB_RTOL)
    # after a truncation (samplers "kd"): top_k by the unpenalised logits, then DRY on the kept candidates
    logits[8] = logits.max() + 0.5                           # token 8 in the top 10, and first before DRY
    s2 = Sampler(P(dry_multiplier=4.0, top_k=10, samplers="kd"))
    for t in history:
        s2.accept(t)
    top = [i for _, i in sorted_cands(logits)[:10]]
    edited = logits[top].copy()
    edited[top.index(8)] -= np.float32(4.0 * 1.75)           # multiplier * base ** (repeat 3 - allowed 2)
    got_ids, got_p = s2.probs(logits)
    assert sorted(got_ids.tolist()) == sorted(top)
    want_p = dict(zip(top, softmax(edited)))
    np.testing.assert_allclose(got_p, [want_p[i] for i in got_ids.tolist()], rtol=PROB_RTOL)


@pytest.mark.parametrize("kw", [dict(mirostat=2, mirostat_tau=4.0), dict(mirostat=1),
                                dict(xtc_probability=0.5, xtc_threshold=0.05),
                                dict(dry_multiplier=0.8, typical_p=0.9, top_n_sigma=1.5, dynatemp_range=0.3)],
                         ids=["mirostat2", "mirostat1", "xtc", "dry-typical-sigma-dynatemp"])
def test_stateful_stages_under_speculative_decoding(tiny_model, kw):
    """Mirostat's mu, XTC's stream and DRY's history follow the tokens sampled, one row at a time: drafts do not
    change the output."""
    import powerinfer as pi
    from test_speculative import NoisyOracle, run_all
    path = tiny_model("q8_0", seed=3)
    plain = pi.PowerInfer(path, n_ctx=256, verbose=False)
    sampling = dict(temperature=0.9, seed=4, max_tokens=60, ignore_eos=True, **kw)
    ref = run_all(plain, ["Once upon a time"], **sampling)[0]
    runs = {tuple(plain.tokenize("Once upon a time")): ref.tokens}
    llm = pi.PowerInfer(path, n_ctx=256, verbose=False, draft_model=NoisyOracle(runs, plain.n_vocab()), draft_max=5)
    got = run_all(llm, ["Once upon a time"], **sampling)[0]
    assert got.tokens == ref.tokens and 0 < got.n_draft_accepted < got.n_drafted


def test_main_flags(tiny_model):
    import subprocess
    import sys
    from pathlib import Path
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"

    def run(*extra):
        return subprocess.run([sys.executable, str(main), "-m", str(tiny_model("q8_0", seed=3)), "-p", "Once",
                               "-n", "16", "-s", "2", "--ignore-eos", "-no-cnv", "-c", "64", *extra],
                              capture_output=True, text=True, timeout=120)
    flags = ["--mirostat", "2", "--mirostat-ent", "4", "--dry-multiplier", "0.8", "--dry-sequence-breaker", "\\n",
             "--xtc-probability", "0.5", "--typical", "0.9", "--top-n-sigma", "2", "--dynatemp-range", "0.2",
             "--min-keep", "2"]
    a, b = run(*flags), run(*flags)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout != run().stdout
    seq = run("--sampling-seq", "kt", "--top-k", "1")
    assert seq.returncode == 0 and seq.stdout == run("--temp", "0").stdout      # top_k 1 then temperature: greedy
    bad = run("--samplers", "top_k;bogus")
    assert bad.returncode == 1 and "unknown sampler 'bogus'" in bad.stderr
    bad = run("--samplers", "top_k", "--sampling-seq", "k")
    assert bad.returncode == 1 and "not both" in bad.stderr


def test_server_sampling_flags_are_request_defaults(tiny_model):
    """llama-server's sampling flags (--temp, --top-k, --mirostat, --samplers...) set what a request leaves out."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    from powerinfer.server.app import create_app
    from powerinfer.server.cli import make_state, parse_args
    from test_server import InProcessServer, post, wait_healthy
    path = str(tiny_model("q8_0", seed=3))
    state = make_state(parse_args(["-m", path, "-c", "128", "-t", "1", "--temp", "0", "--top-k", "5",
                                   "--mirostat", "2", "--dry-multiplier", "0.5", "--sampling-seq", "kt"]))
    state.llm = state.loader()
    state.ready.set()
    srv = InProcessServer(create_app(state))
    try:
        wait_healthy(srv.base, timeout=30)
        r = post(srv.base, "/completion", {"prompt": "Once", "n_predict": 8, "ignore_eos": True}).json()
        gs = r["generation_settings"]
        assert (gs["temperature"], gs["top_k"], gs["mirostat"], gs["dry_multiplier"]) == (0.0, 5, 2, 0.5)
        assert gs["samplers"] == ["top_k", "temperature"]
        greedy = post(srv.base, "/completion", {"prompt": "Once", "n_predict": 8, "ignore_eos": True,
                                                "temperature": 0, "mirostat": 0, "dry_multiplier": 0}).json()
        assert r["content"] == greedy["content"]          # temp 0 with mirostat 2: the argmax, as greedy
        hot = post(srv.base, "/completion", {"prompt": "Once", "n_predict": 8, "temperature": 0.9, "seed": 1})
        assert hot.json()["generation_settings"]["temperature"] == 0.9
    finally:
        srv.close()
        state.llm.close()
    with pytest.raises(SystemExit):
        parse_args(["-m", path, "--samplers", "bogus"])


def test_logit_bias_flag(tiny_model):
    import subprocess
    import sys
    from pathlib import Path

    from powerinfer.cli import parse_logit_bias
    assert parse_logit_bias("15043+1") == (15043, 1.0) and parse_logit_bias("7-inf") == (7, -math.inf)
    assert parse_logit_bias("3-0.5") == (3, -0.5)
    for bad in ("x+1", "15043", "+1", "5+x"):
        with pytest.raises(ValueError, match="logit-bias"):
            parse_logit_bias(bad)
    main = Path(__file__).resolve().parents[1] / "examples" / "main.py"
    path = str(tiny_model("q8_0", seed=3))

    def run(*extra):
        return subprocess.run([sys.executable, str(main), "-m", path, "-p", "Once", "-n", "6", "--temp", "0",
                               "--ignore-eos", "-no-cnv", "-c", "64", "--verbose-prompt", *extra],
                              capture_output=True, text=True, timeout=120)
    import powerinfer as pi
    llm = pi.PowerInfer(path, n_ctx=64, verbose=False)
    tok = next(llm.generate_tokens(llm.tokenize("Once"), SamplingParams(temperature=0, ignore_eos=True), 1))
    assert run("-l", f"{tok}-inf").stdout != run().stdout                # the greedy first token banned
    bad = run("-l", "nonsense")
    assert bad.returncode == 1 and "logit-bias" in bad.stderr
