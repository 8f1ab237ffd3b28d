"""Speculative decoding (powerinfer.speculative, Engine._verify): drafts change the speed, never the output.

The contract tested: with any drafter, every request's tokens equal those of the same request without one, for
greedy and seeded sampling with penalties, stop strings, grammars, n_predict limits and a full context, in the
server's slot layout (regions, concurrent requests) and main.py's (Generator); and the drafters themselves
(prompt lookup against a brute-force reference, a draft model, llama-cpp-python's callable interface)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import TINY_SHAPE
from model_files import write_sparse_model
import powerinfer as pi
from powerinfer.generator import Generator
from powerinfer.speculative import (CallableDrafter, DraftModel, Drafter, FirstOf, PromptLookup, SpecParams,
                                    check_vocab_compatible)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Once upon a time", "the cat sat on"]


class NoisyOracle(Drafter):
    """Proposes the continuation a plain run produced for the prompt the sequence starts with, each draft
    token replaced by a wrong one with probability p_wrong: both the accept and the reject paths run."""

    def __init__(self, runs: dict[tuple, list[int]], n_vocab: int, p_wrong: float = 0.3, seed: int = 0):
        self.runs, self.n_vocab, self.p_wrong = runs, n_vocab, p_wrong
        self.rng = np.random.default_rng(seed)

    def draft(self, seq, tokens, n_max, p_min=None):
        for prompt, out in self.runs.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                d = list(out[len(tokens) - len(prompt):][:n_max])
                return [(t + 1) % self.n_vocab if self.rng.random() < self.p_wrong else t for t in d]
        return []


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("q8_0", seed=3)


def run_all(llm: pi.PowerInfer, prompts, **kw) -> list:
    """The Results of `prompts` submitted together (concurrent requests, one per slot)."""
    done: dict[int, object] = {}
    tasks = []
    for i, p in enumerate(prompts):
        t = llm.make_task(llm.tokenize(p), **kw)
        t.emit = (lambda i: (lambda ev: done.__setitem__(i, ev[1]) if ev[0] in ("done", "error") else None))(i)
        tasks.append(llm.engine.submit(t))
    for t in tasks:
        llm.engine.run_until_done(t)
    for i in range(len(prompts)):
        assert not isinstance(done[i], Exception), done[i]
    return [done[i] for i in range(len(prompts))]


SAMPLINGS = [dict(temperature=0.0), dict(temperature=0.9, seed=11, repeat_penalty=1.3, presence_penalty=0.4,
                                         top_k=0, top_p=1.0, min_p=0.0)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "seeded"])
def test_concurrent_requests_equal_plain_decoding(model_path, sampling):
    plain = pi.PowerInfer(model_path, n_ctx=256, n_parallel=2, verbose=False)
    ref = run_all(plain, PROMPTS, max_tokens=60, ignore_eos=True, **sampling)
    runs = {tuple(plain.tokenize(p)): r.tokens for p, r in zip(PROMPTS, ref)}
    oracle = NoisyOracle(runs, plain.n_vocab())
    llm = pi.PowerInfer(model_path, n_ctx=256, n_parallel=2, verbose=False, draft_model=oracle, draft_max=5)
    for _ in range(2):                                 # again: over the stale cells of the first round
        got = run_all(llm, PROMPTS, max_tokens=60, ignore_eos=True, **sampling)
        for a, b in zip(got, ref):
            assert a.tokens == b.tokens and a.text == b.text
            assert a.n_predicted == 60 and a.stop_type == "limit"
            assert 0 < a.n_draft_accepted < a.n_drafted          # kept and rejected drafts both happened
    assert llm.engine.n_decode_calls < plain.engine.n_decode_calls


def test_stop_strings_grammar_and_limits_equal_plain_decoding(model_path):
    plain = pi.PowerInfer(model_path, n_ctx=128, verbose=False)
    full = run_all(plain, PROMPTS[:1], max_tokens=40, temperature=0.0, ignore_eos=True)[0]
    stop = full.text[10:14]
    cases = [dict(max_tokens=40, stop=[stop]), dict(max_tokens=7), dict(max_tokens=-1),    # -1: a full context
             dict(max_tokens=30, grammar=pi.Grammar.from_json_schema({"type": "string"}))]
    for kw in cases:
        ref = run_all(plain, PROMPTS[:1], temperature=0.0, ignore_eos=True, **kw)[0]
        runs = {tuple(plain.tokenize(PROMPTS[0])): ref.tokens + [5] * 200}
        llm = pi.PowerInfer(model_path, n_ctx=128, verbose=False, draft_model=NoisyOracle(runs, plain.n_vocab()))
        got = run_all(llm, PROMPTS[:1], temperature=0.0, ignore_eos=True, **kw)[0]
        assert (got.tokens, got.text, got.stop_type, got.truncated) == (ref.tokens, ref.text, ref.stop_type,
                                                                          ref.truncated), kw
        assert got.n_drafted > 0


def test_generator_equals_plain_and_leaves_no_stale_cells(model_path):
    """main.py's layout (no regions): a sequence fed and generated in turns, each ending at a stop token that
    can fall inside a draft; the KV cache then holds exactly the sequence's tokens."""
    model = pi.Model(model_path)
    first = model.tokenizer.encode("Once upon a time")
    more = model.tokenizer.encode(" and then", add_special=False)

    def turns(drafter, stop_ids=()):
        ctx = pi.Context(model, n_ctx=200)
        sampler = pi.Sampler(pi.SamplingParams(temperature=0.8, seed=5, ignore_eos=True))
        gen = Generator(ctx, sampler, drafter=drafter, spec=SpecParams(4))
        gen.feed(first)
        for _ in range(3):
            list(gen.generate(16, stop_token_ids=stop_ids))
            assert ctx.kv_used == len(gen.tokens)
            gen.feed(more)
        return gen
    probe = turns(None).tokens
    stop = probe[len(first) + 9]                       # a token of the first turn: ends it early
    ref = turns(None, [stop])
    got = turns(NoisyOracle({tuple(first): probe[len(first):]}, model.n_vocab), [stop])
    assert got.tokens == ref.tokens and ref.tokens != probe
    assert got.engine.n_draft_accepted > 0


def test_draft_model_of_the_same_file_is_always_right(model_path):
    """A draft model that is the target itself: its greedy drafts are the target's greedy tokens (a batch's rows
    are one token's bits), so every draft is kept."""
    plain = pi.PowerInfer(model_path, n_ctx=256, verbose=False)
    ref = run_all(plain, PROMPTS[:1], max_tokens=50, temperature=0.0, ignore_eos=True)[0]
    llm = pi.PowerInfer(model_path, n_ctx=256, verbose=False, draft_model=str(model_path), draft_max=8,
                        draft_p_min=0.0)
    got = run_all(llm, PROMPTS[:1], max_tokens=50, temperature=0.0, ignore_eos=True)[0]
    assert got.tokens == ref.tokens
    assert got.n_drafted >= 40 and got.n_draft_accepted == got.n_drafted


def test_draft_model_of_another_model_keeps_the_output(tiny_model, model_path):
    other = tiny_model("q8_0", seed=4)                      # the same vocabulary, other weights
    plain = pi.PowerInfer(model_path, n_ctx=256, verbose=False)
    llm = pi.PowerInfer(model_path, n_ctx=256, verbose=False, draft_model=str(other), draft_p_min=0.0)
    for kw in SAMPLINGS:
        ref = run_all(plain, PROMPTS[1:], max_tokens=40, ignore_eos=True, **kw)[0]
        got = run_all(llm, PROMPTS[1:], max_tokens=40, ignore_eos=True, **kw)[0]
        assert got.tokens == ref.tokens and got.n_drafted > 0


def test_p_min_and_request_settings(model_path):
    llm = pi.PowerInfer(model_path, n_ctx=256, verbose=False, draft_model=str(model_path), draft_p_min=1.0)
    assert run_all(llm, PROMPTS[:1], max_tokens=20, temperature=0.0)[0].n_drafted == 0    # never that sure
    got = run_all(llm, PROMPTS[:1], max_tokens=20, temperature=0.0, speculative=SpecParams(3, 0, 0.0))[0]
    assert got.n_drafted > 0 and got.n_drafted <= 3 * 20
    got = run_all(llm, PROMPTS[:1], max_tokens=20, temperature=0.0, speculative=SpecParams(0))[0]
    assert got.n_drafted == 0
    got = run_all(llm, PROMPTS[:1], max_tokens=20, temperature=0.0, speculative=SpecParams(2, 3, 0.0))[0]
    assert got.n_drafted == 0                              # n_min above n_max: never enough
    with pytest.raises(ValueError, match="non-negative"):
        SpecParams(-1).validate()
    with pytest.raises(ValueError, match="p_min"):
        SpecParams(4, 0, 1.5).validate()


def test_vocabulary_mismatch_is_refused(tiny_model, model_path):
    other = tiny_model("q8_0", seed=3, n_vocab=TINY_SHAPE["n_vocab"] + 200)
    with pytest.raises(ValueError, match="vocabulary does not match.*at most 128 apart"):
        pi.PowerInfer(model_path, n_ctx=64, verbose=False, draft_model=str(other))
    a, b = pi.Model(model_path).tokenizer, pi.Model(tiny_model("q8_0", seed=3, n_vocab=TINY_SHAPE["n_vocab"] + 2))
    check_vocab_compatible(a, b.tokenizer)                 # a few extra tokens are fine (llama.cpp's rule)


def lookup_reference(tokens: list[int], ngram_max: int, ngram_min: int, n: int) -> list[int]:
    """Plain loops: the tokens after the most recent earlier occurrence of the longest suffix n-gram."""
    for g in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        key = tokens[-g:]
        for start in range(len(tokens) - g - 1, -1, -1):
            if tokens[start:start + g] == key:
                return tokens[start + g:start + g + n]
    return []


def test_prompt_lookup_against_loops():
    rng = np.random.default_rng(0)
    for trial in range(400):
        seq = rng.integers(0, int(rng.integers(2, 12)), size=int(rng.integers(1, 60))).tolist()
        gmax = int(rng.integers(1, 6))
        gmin = int(rng.integers(1, gmax + 1))
        n = int(rng.integers(1, 10))
        assert PromptLookup(gmax, gmin, 48).draft(0, seq, n) == lookup_reference(seq, gmax, gmin, n), (seq, gmax, gmin)
    assert PromptLookup(2, 1, 3).draft(0, [1, 2, 3, 4, 5, 1, 2], 10) == [3, 4, 5]      # n_draft caps
    assert PromptLookup(2).draft(0, [1, 2, 3, 9, 2], 10) == []                        # no earlier "3 9"... "9 2"
    with pytest.raises(ValueError):
        PromptLookup(2, 3)


def test_prompt_lookup_first_of_and_callable(model_path):
    plain = pi.PowerInfer(model_path, n_ctx=256, verbose=False)
    ref = run_all(plain, PROMPTS[:1], max_tokens=60, temperature=0.0, ignore_eos=True)[0]
    calls = []

    def llama_cpp_style(input_ids):                        # llama-cpp-python's LlamaDraftModel interface
        assert input_ids.dtype == np.intc
        calls.append(len(input_ids))
        return np.array([1, 2, 3], dtype=np.intc)
    for drafter in (PromptLookup(2, 1, 8), CallableDrafter(llama_cpp_style), llama_cpp_style,
                    FirstOf([PromptLookup(3, 3), PromptLookup(1)])):
        llm = pi.PowerInfer(model_path, n_ctx=256, verbose=False, draft_model=drafter)
        got = run_all(llm, PROMPTS[:1], max_tokens=60, temperature=0.0, ignore_eos=True)[0]
        assert got.tokens == ref.tokens
    assert calls


def test_a_failing_drafter_costs_speed_only(model_path, caplog):
    class Broken(Drafter):
        def draft(self, seq, tokens, n_max, p_min=None):
            raise RuntimeError("boom")
    plain = pi.PowerInfer(model_path, n_ctx=128, verbose=False)
    ref = run_all(plain, PROMPTS[:1], max_tokens=10, temperature=0.0, ignore_eos=True)[0]
    llm = pi.PowerInfer(model_path, n_ctx=128, verbose=False, draft_model=Broken())
    got = run_all(llm, PROMPTS[:1], max_tokens=10, temperature=0.0, ignore_eos=True)[0]
    assert got.tokens == ref.tokens and "drafter failed" in caplog.text
    dm = DraftModel(pi.Context(pi.Model(model_path), n_ctx=16, n_seq_max=2))
    assert len(dm.draft(0, list(range(1, 11)), 8, 0.0)) == 6          # capped by the context's room
    assert dm.draft(1, list(range(1, 11)), 4, 0.0) == []              # out of cells: a warning, no draft
    assert "draft model:" in caplog.text and dm.cache[1] == []
    assert dm.draft(0, list(range(1, 30)), 8, 0.0) == []              # longer than the draft context


def test_sparse_model_equals_plain(tmp_path):
    """A PowerInfer file: a verification batch runs the predictor and the sparse FFN per row as one token does."""
    path = write_sparse_model(tmp_path / "sparse.powerinfer.gguf", dtype="q8_0", seed=2)
    plain = pi.PowerInfer(path, n_ctx=128, verbose=False)
    ref = run_all(plain, PROMPTS[:1], max_tokens=40, temperature=0.0, ignore_eos=True)[0]
    llm = pi.PowerInfer(path, n_ctx=128, verbose=False, draft_model=str(path), draft_p_min=0.0)
    got = run_all(llm, PROMPTS[:1], max_tokens=40, temperature=0.0, ignore_eos=True)[0]
    assert got.tokens == ref.tokens and got.n_draft_accepted == got.n_drafted > 0


def run_main(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "main.py"), *args], capture_output=True, text=True,
                          timeout=300)


def test_main_flags(model_path):
    base = ["-m", str(model_path), "-p", "Once upon a time", "-n", "40", "--temp", "0.7", "-s", "3", "--ignore-eos",
            "-no-cnv", "-c", "128"]
    ref = run_main(*base)
    assert ref.returncode == 0, ref.stderr
    for extra in (["-md", str(model_path), "--draft-p-min", "0"], ["--spec-type", "ngram-simple",
                                                                  "--spec-ngram-size-n", "1", "--draft-max", "4"]):
        got = run_main(*base, *extra)
        assert got.returncode == 0, got.stderr
        assert got.stdout == ref.stdout
        assert "speculative: n_drafted = " in got.stderr
    bad = run_main(*base, "-md", str(model_path) + ".missing")
    assert bad.returncode == 1 and "error: failed to load the draft model" in bad.stderr
    bad = run_main(*base, "--draft-max", "-2")
    assert bad.returncode == 1 and "non-negative" in bad.stderr


def test_server_request_fields(model_path):
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    from powerinfer.server.app import create_app
    from powerinfer.server.cli import make_state, parse_args
    from test_server import InProcessServer, get, post, wait_healthy
    state = make_state(parse_args(["-m", str(model_path), "-c", "256", "-t", "1", "--spec-type", "ngram-simple",
                                   "--spec-ngram-size-n", "1", "--draft-max", "4"]))
    state.llm = state.loader()
    state.ready.set()
    srv = InProcessServer(create_app(state))
    try:
        wait_healthy(srv.base, timeout=30)
        body = {"prompt": "Once upon a time", "n_predict": 30, "temperature": 0, "ignore_eos": True}
        r = post(srv.base, "/completion", body).json()
        off = post(srv.base, "/completion", {**body, "speculative.n_max": 0}).json()
        assert r["content"] == off["content"]
        assert r["timings"]["draft_n"] > 0 and "draft_n" not in off["timings"]
        assert r["generation_settings"]["speculative.n_max"] == 4
        assert off["generation_settings"]["speculative.n_max"] == 0
        bad = post(srv.base, "/completion", {**body, "speculative.n_max": -1})
        assert bad.status_code == 400 and "non-negative" in json.dumps(bad.json())
        assert get(srv.base, "/slots").json()[0]["speculative"] is True
    finally:
        srv.close()
        state.llm.close()


def test_gate_sparse_level_drafts_only_within_exact_batches(tmp_path):
    """A gate-sparse level runs batches above --sparse-gather-max through other kernels (not the bits of single
    tokens): with the default 1 nothing is drafted; with 17 the verification batches stay exact."""
    sys.path.insert(0, str(ROOT / "tools"))
    import sparsify
    from make_test_model import write_model
    src, dst = tmp_path / "m.gguf", tmp_path / "m.sparse.gguf"
    write_model(src, dtype="q8_0", n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, seed=3)
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(dst),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "0"]) == 0
    for gather_max, drafts in ((1, False), (17, True)):
        plain = pi.PowerInfer(dst, n_ctx=128, verbose=False, sparse_gather_max=gather_max)
        ref = run_all(plain, PROMPTS[:1], max_tokens=40, temperature=0.0, ignore_eos=True)[0]
        llm = pi.PowerInfer(dst, n_ctx=128, verbose=False, sparse_gather_max=gather_max, draft_model=str(dst),
                            draft_p_min=0.0)
        assert llm.ctx.exact_batch_max == gather_max
        got = run_all(llm, PROMPTS[:1], max_tokens=40, temperature=0.0, ignore_eos=True)[0]
        assert got.tokens == ref.tokens and (got.n_drafted > 0) == drafts


def test_llama_cpp_python_prompt_lookup_object(model_path):
    """llama-cpp-python's own drafter object, passed as it is (skipped where llama-cpp-python is absent)."""
    spec = pytest.importorskip("llama_cpp.llama_speculative")
    plain = pi.PowerInfer(model_path, n_ctx=256, verbose=False)
    ref = run_all(plain, PROMPTS[:1], max_tokens=60, temperature=0.0, ignore_eos=True)[0]
    llm = pi.PowerInfer(model_path, n_ctx=256, verbose=False,
                        draft_model=spec.LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=6))
    got = run_all(llm, PROMPTS[:1], max_tokens=60, temperature=0.0, ignore_eos=True)[0]
    assert got.tokens == ref.tokens and got.n_drafted > 0


def test_draft_model_serves_concurrent_slots(tiny_model, model_path):
    """A draft model's context holds one sequence per slot: two concurrent requests draft from their own
    sequences (another model: some drafts kept, some not) and each output equals plain decoding."""
    other = tiny_model("q8_0", seed=4)
    plain = pi.PowerInfer(model_path, n_ctx=256, n_parallel=2, verbose=False)
    llm = pi.PowerInfer(model_path, n_ctx=256, n_parallel=2, verbose=False, draft_model=str(other), draft_p_min=0.0,
                        draft_max=4)
    assert llm.engine.drafter.ctx.n_seq_max == 2
    for kw in SAMPLINGS:
        ref = run_all(plain, PROMPTS, max_tokens=40, ignore_eos=True, **kw)
        got = run_all(llm, PROMPTS, max_tokens=40, ignore_eos=True, **kw)
        for a, b in zip(got, ref):
            assert a.tokens == b.tokens and a.n_drafted > 0
    assert set(llm.engine.drafter.cache) == {0, 1}
