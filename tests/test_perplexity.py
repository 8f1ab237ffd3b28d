"""powerinfer.perplexity and examples/perplexity.py against an independent numpy computation."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import powerinfer as pi  # noqa: E402
from powerinfer.perplexity import KLDBase, perplexity  # noqa: E402
from model_files import write_sparse_model  # noqa: E402

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more").split()
N_CTX = 64


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("q8_0", seed=3)


@pytest.fixture(scope="module")
def model(model_path):
    return pi.Model(model_path)


@pytest.fixture(scope="module")
def ctx(model):
    return pi.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_threads=1)


@pytest.fixture(scope="module")
def text():
    return " ".join(np.random.default_rng(0).choice(WORDS, 300))


def numpy_reference(ctx, tokens, n_ctx, bos):
    """Per-window NLLs computed here from the engine's logits of every position (no shared code)."""
    first = n_ctx // 2
    out = []
    for i in range(len(tokens) // n_ctx):
        window = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        window[0] = bos
        ctx.kv_clear()
        ctx.decode(window, pos=list(range(n_ctx)), logits="all")
        logits = np.stack([ctx.logits(j) for j in range(n_ctx)]).astype(np.float64)
        nll = []
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            nll.append(m + math.log(np.exp(row - m).sum()) - row[tokens[i * n_ctx + j + 1]])
        out.append(nll)
    ctx.kv_clear()
    return np.array(out)


def test_matches_numpy(model, ctx, text):
    tokens = model.tokenizer.encode(text, add_special=True)
    assert tokens[0] == model.tokenizer.bos_id
    ref = numpy_reference(ctx, tokens, N_CTX, model.tokenizer.bos_id)
    res = perplexity(ctx, text, n_ctx=N_CTX)
    n_chunk = len(tokens) // N_CTX
    assert res.n_tokens == len(tokens) and res.n_chunks == n_chunk >= 2
    assert res.token_nll.shape == ref.shape == (n_chunk, N_CTX - 1 - N_CTX // 2)
    np.testing.assert_allclose(res.token_nll, ref, rtol=0, atol=1e-9)
    flat = ref.reshape(-1)
    mean = flat.mean()
    assert res.ppl == pytest.approx(math.exp(mean), rel=1e-12)
    se = math.sqrt((np.mean(flat ** 2) - mean ** 2) / (flat.size - 1))
    assert res.stderr == pytest.approx(math.exp(mean) * se, rel=1e-9)
    running = [math.exp(ref[:k + 1].mean()) for k in range(n_chunk)]
    np.testing.assert_allclose(res.per_chunk, running, rtol=1e-12)
    np.testing.assert_allclose(res.chunk_ppl, np.exp(ref.mean(axis=1)), rtol=1e-12)
    assert res.n_scored == flat.size
    # tokens in: same result; a Model in (its own context, evaluated in n_batch pieces): same result
    assert perplexity(ctx, tokens, n_ctx=N_CTX).ppl == res.ppl
    split = perplexity(model, text, n_ctx=N_CTX, n_batch=16, n_threads=1)
    np.testing.assert_allclose(split.token_nll, ref, rtol=1e-6, atol=1e-6)


def test_chunk_counting_and_progress(model, ctx, text):
    tokens = model.tokenizer.encode(text, add_special=True)
    seen = []
    res = perplexity(ctx, tokens, n_ctx=N_CTX, chunks=3, progress=lambda *a: seen.append(a))
    assert res.n_chunks == 3 and len(res.per_chunk) == 3 and res.n_scored == 3 * 31
    assert [s[:2] for s in seen] == [(1, 3), (2, 3), (3, 3)] and [s[2] for s in seen] == res.per_chunk
    assert perplexity(ctx, tokens, n_ctx=N_CTX, chunks=10**6).n_chunks == len(tokens) // N_CTX
    odd = perplexity(ctx, tokens[:2 * 63 + 5], n_ctx=63)     # odd window: first = 31, 31 scored per window
    assert odd.n_chunks == 2 and odd.n_scored == 2 * 31


def test_exactly_two_windows_needed(model, ctx):
    short = list(range(3, 3 + 2 * N_CTX - 1))
    with pytest.raises(ValueError, match=f"at least {2 * N_CTX} tokens.*only {2 * N_CTX - 1} tokens"):
        perplexity(ctx, short, n_ctx=N_CTX)
    assert perplexity(ctx, short + [5], n_ctx=N_CTX).n_chunks == 2


def test_kld_of_a_run_against_itself_is_zero(model, ctx, text, tmp_path):
    base = tmp_path / "base.kld"
    a = perplexity(ctx, text, n_ctx=N_CTX, save_kld=base)
    kb = KLDBase(base)
    assert (kb.n_ctx, kb.n_vocab, kb.n_chunk, kb.n_scored) == (N_CTX, model.n_vocab, a.n_chunks, 31)
    assert base.stat().st_size >= a.n_chunks * 31 * model.n_vocab * 2
    b = perplexity(ctx, None, n_ctx=N_CTX, kld_base=base)           # tokens from the base file
    assert b.ppl == a.ppl
    k = b.kld
    assert k.n == a.n_scored and k.mean == 0.0 and k.max == 0.0 and k.top1 == 1.0
    assert k.ppl_ratio == 1.0 and k.base_ppl == pytest.approx(a.ppl, rel=1e-12)
    # other text, other n_ctx, a damaged file: clear errors
    with pytest.raises(ValueError, match="do not tokenize|does not tokenize"):
        perplexity(ctx, text[::-1], n_ctx=N_CTX, kld_base=base)
    with pytest.raises(ValueError, match="n_ctx = 64"):
        perplexity(ctx, text, n_ctx=32, kld_base=base)
    cut = tmp_path / "cut.kld"
    cut.write_bytes(base.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated"):
        KLDBase(cut)
    with pytest.raises(ValueError, match="not a PowerInfer KL-divergence"):
        KLDBase(ROOT / "pyproject.toml")


def test_kld_sparse_against_dense_matches_numpy(tmp_path, text):
    """KLD, top-1 agreement and PPL ratio of a sparse run against a dense base, against float64 numpy
    from the two runs' logits (the base stores float16 log-probs, hence the tolerance)."""
    path = write_sparse_model(tmp_path / "sparse.powerinfer.gguf", dtype="f32", ranks=(16, 16), seed=5)
    m = pi.Model(path)
    dense = pi.Context(m, n_ctx=N_CTX, n_threads=1, dense=True)
    sparse = pi.Context(m, n_ctx=N_CTX, n_threads=1, sparse_threshold=0.5)
    base = tmp_path / "dense.kld"
    d = perplexity(dense, text, n_ctx=N_CTX, save_kld=base, keep_logits=True)
    s = perplexity(sparse, text, n_ctx=N_CTX, kld_base=base, keep_logits=True)
    ld = np.concatenate(d.logits).astype(np.float64)
    ls = np.concatenate(s.logits).astype(np.float64)

    def lsm(x):
        m_ = x.max(axis=1, keepdims=True)
        return x - m_ - np.log(np.exp(x - m_).sum(axis=1, keepdims=True))

    pd, qs = lsm(ld), lsm(ls)
    kld = (np.exp(pd) * (pd - qs)).sum(axis=1)
    assert kld.mean() > 1e-4                                   # the runs really differ
    k = s.kld
    assert k.mean == pytest.approx(kld.mean(), rel=1e-3, abs=1e-6)
    assert k.max == pytest.approx(kld.max(), rel=1e-3, abs=1e-6)
    assert k.top1 == pytest.approx(np.mean(ld.argmax(1) == ls.argmax(1)), abs=1e-12)
    assert k.ppl_ratio == pytest.approx(s.ppl / d.ppl, rel=1e-9)
    assert k.base_ppl == pytest.approx(d.ppl, rel=1e-9)
    assert k.stderr > 0 and 0 < k.median <= k.p99 <= k.max


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "perplexity.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60, env=env)


def test_cli_output_and_kld_modes(model, model_path, ctx, text, tmp_path):
    f = tmp_path / "text.txt"
    f.write_text(text)
    base = tmp_path / "run.kld"
    r = _cli("-m", model_path, "-f", f, "-c", N_CTX, "-t", 1, "--chunks", 4, "--kl-divergence-base", base)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"(\[\d+\]\d+\.\d{4},){4}", lines[0]), lines[0]
    ref = perplexity(ctx, text, n_ctx=N_CTX, chunks=4)
    assert lines[1] == f"Final estimate: PPL = {ref.ppl:.4f} +/- {ref.stderr:.5f}"
    assert lines[0].startswith(f"[1]{ref.per_chunk[0]:.4f},[2]{ref.per_chunk[1]:.4f},")
    assert re.search(r"^perplexity: \d+\.\d\d seconds per pass - ETA (\d+ hours )?\d+\.\d\d minutes$", r.stderr, re.M)
    assert "calculating perplexity over 4 chunks" in r.stderr and base.exists()

    c = _cli("-m", model_path, "-t", 1, "--kl-divergence-base", base, "--kl-divergence")
    assert c.returncode == 0, c.stderr
    assert f"Final estimate: PPL = {ref.ppl:.4f}" in c.stdout
    assert re.search(r"^Mean    KLD\s+: 0\.000000 \+/- 0\.000000$", c.stdout, re.M)
    assert re.search(r"^Same top p\s+: 100\.000 \+/- 0\.000 %$", c.stdout, re.M)
    assert re.search(r"^Mean PPL\(Q\)/PPL\(base\) : 1\.000000", c.stdout, re.M)

    short = tmp_path / "short.txt"
    short.write_text("the cat sat")
    e = _cli("-m", model_path, "-f", short, "-c", N_CTX, "-t", 1)
    assert e.returncode == 1 and "Traceback" not in e.stderr
    assert e.stderr.strip().splitlines()[-1].startswith("perplexity: error: you need at least 128 tokens")


def test_row_helpers_are_the_whole_array_formulas_in_blocks():
    """log_softmax, the float16 rounding and the per-row KL run in blocks of rows on several threads (whole-array
    float64 temporaries of a 262144-word vocabulary cost seconds a window); their bits are the whole-array numpy
    formulas', for any number of rows (13: not a multiple of the block) and for -inf-like logits."""
    from powerinfer import perplexity as P
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((13, 3000)) * 8).astype(np.float32)
    x[2, :50] = -1e30
    y = x + rng.standard_normal(x.shape).astype(np.float32)

    def lsm(a):
        a = np.asarray(a, dtype=np.float64)
        m = np.max(a, axis=-1, keepdims=True)
        return a - m - np.log(np.sum(np.exp(a - m), axis=-1, keepdims=True))

    def f16(lp):
        return np.maximum(lp, float(np.finfo(np.float16).min)).astype(np.float16)
    assert np.array_equal(P.log_softmax(x), lsm(x)) and np.array_equal(P.log_softmax(x[0]), lsm(x[0]))
    assert np.array_equal(P._to_f16_logprobs(lsm(x)), f16(lsm(x)))
    base, this = f16(lsm(y)), f16(lsm(x))
    lp_b, lp_t = lsm(base), lsm(this)
    p_b = np.exp(lp_b)
    with np.errstate(invalid="ignore"):
        want = np.maximum(np.where(p_b > 0, p_b * (lp_b - lp_t), 0.0).sum(axis=1), 0.0)
    assert np.array_equal(P._kld_rows(base, this), want) and np.all(want > 0)
