"""llama-cpp-python's token-level loop on PowerInfer (powerinfer.token_loop): eval / sample / generate(tokens) /
reset, n_tokens, input_ids, scores. The reference is the engine's own path: eval_logits (every position's logits
from an empty cache) and greedy generate_tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("m") / "tiny.gguf"
    write_model(p, dtype="q8_0", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
    return p


@pytest.fixture(scope="module")
def llm(path):
    return pi.PowerInfer(path, n_ctx=128, n_batch=8, verbose=False, logits_all=True, seed=5)


@pytest.fixture(scope="module")
def llm_last(path):
    return pi.PowerInfer(path, n_ctx=128, verbose=False, seed=5)


def greedy(llm, prompt, n):
    return list(llm.generate_tokens(prompt, pi.SamplingParams(temperature=0, ignore_eos=True), max_tokens=n))


def take(gen, n):
    out = []
    for t in gen:
        out.append(t)
        if len(out) == n:
            return out
    return out


def test_eval_keeps_every_position_logits(llm):
    toks = llm.tokenize("the cat sat on the mat")
    llm.reset()
    llm.eval(toks[:5])          # several calls, chunks of n_batch = 8: the same bits as one call from empty
    llm.eval(toks[5:])
    assert llm.n_tokens == len(toks) and llm._input_ids.tolist() == toks and llm.eval_tokens == toks
    assert llm.scores.shape == (llm.n_ctx(), llm.n_vocab())
    np.testing.assert_array_equal(llm._scores, llm.eval_logits(toks))


def test_without_logits_all_only_the_last_row(llm_last):
    toks = llm_last.tokenize("the cat sat")
    llm_last.reset()
    llm_last.eval(toks)
    assert llm_last.scores.shape == (1, llm_last.n_vocab())
    np.testing.assert_array_equal(llm_last.scores[0], llm_last.eval_logits(toks)[-1])
    with pytest.raises(ValueError, match="only the last"):
        llm_last.sample(idx=0)


@pytest.mark.parametrize("which", ["llm", "llm_last"])
def test_greedy_generate_equals_the_engine(which, request):
    llm = request.getfixturevalue(which)
    toks = llm.tokenize("once upon a time")
    want = greedy(llm, toks, 12)
    llm.reset()
    assert take(llm.generate(toks, temp=0), 12) == want
    # the loop holds the prompt and the tokens it evaluated (the last yielded one is not evaluated)
    assert llm._input_ids.tolist() == toks + want[:11]


def test_generate_reuses_the_shared_prefix(llm, monkeypatch):
    evaluated = []
    real = llm.engine.eval_in_slot0
    monkeypatch.setattr(llm.engine, "eval_in_slot0", lambda p, t, a: evaluated.append(len(t)) or real(p, t, a))
    toks = llm.tokenize("a b c d e f")
    llm.reset()
    first = take(llm.generate(toks, temp=0), 4)
    assert evaluated == [len(toks), 1, 1, 1]
    assert llm.n_tokens == len(toks) + 3
    longer = toks + first[:2]
    # a prompt the loop holds (and more): its last token is evaluated again (logits to sample), no more
    assert take(llm.generate(longer, temp=0), 1) == [first[2]]
    assert llm.n_tokens == len(longer) and evaluated[4:] == [1]
    # a prompt already fully evaluated, logits at hand: sampled at once
    assert take(llm.generate(longer, temp=0), 1) == [first[2]]
    assert evaluated[5:] == []


def test_sent_tokens_are_verified(llm):
    toks = llm.tokenize("the quick brown fox")
    want = greedy(llm, toks, 10)
    llm.reset()
    g = llm.generate(toks, temp=0)
    got = [next(g)]
    got.append(g.send(want[1:6]))          # a right draft: evaluated in one call and kept
    assert llm.n_tokens == len(toks) + 6
    while len(got) < 6:
        got.append(next(g))
    assert llm.n_tokens == len(toks) + 6    # the draft's positions were sampled without evaluating again
    got.append(next(g))                     # sampled after the draft's last token: nothing pending now
    wrong = [(t + 1) % llm.n_vocab() for t in want[7:10]]
    got.append(g.send(wrong))               # a wrong draft: evaluated, its first token disagrees with the model's
    assert llm.n_tokens == len(toks) + 10 and llm._input_ids[-3:].tolist() == wrong
    got.append(next(g))                     # so the draft is dropped and the model's token evaluated instead
    assert llm._input_ids.tolist() == toks + want[:8]
    got += take(g, 1)
    assert got == want
    g.close()


def test_completions_in_between_cost_the_loop_nothing(path):
    llm = pi.PowerInfer(path, n_ctx=128, verbose=False, logits_all=True, n_parallel=2, seed=1)
    toks = llm.tokenize("the cat sat on the mat and")
    want = llm.eval_logits(toks)
    llm.eval(toks[:6])
    llm.create_completion("something else entirely", max_tokens=5, temperature=0)
    llm.create_completion("and another one", max_tokens=5, temperature=0)
    llm.eval(toks[6:])           # slot 0's KV was overwritten: evaluated again, the same bits
    np.testing.assert_array_equal(llm._scores, want)
    # and a completion starting with the loop's tokens reuses its KV (slot 0's prompt cache)
    llm.create_completion(toks, max_tokens=1, temperature=0)
    assert llm.last_result.n_cached == len(toks) - 1


def test_sample_options(llm):
    toks = llm.tokenize("hello there")
    llm.reset()
    llm.eval(toks)
    logits = llm._scores[-1]
    top = int(np.argmax(logits))
    assert llm.sample(temp=0) == top
    ban = lambda ids, x: np.where(np.arange(len(x)) == top, -np.inf, x).astype(np.float32)   # noqa: E731
    assert llm.sample(temp=0, logits_processor=[ban]) == int(np.argsort(logits)[-2])
    assert llm.sample(temp=0, idx=2) == int(np.argmax(llm._scores[2]))
    for _ in range(5):          # the grammar's first tokens only
        assert "the cat".startswith(llm.detokenize([llm.sample(temp=1.5, grammar='root ::= "the cat"')]))
    # a fresh sampler per call: the same seed, the same draw
    assert len({llm.sample(temp=0.8) for _ in range(5)}) == 1
    # temp < 0: the unmodified distribution (no top-k / top-p / min-p): the top token's frequency over many seeds
    p = np.exp(logits - logits.max())
    p /= p.sum()
    n = 1500
    draws = []
    for seed in range(n):
        llm.set_seed(seed)
        draws.append(llm.sample(temp=-1))
    llm.set_seed(5)
    freq = draws.count(top) / n
    assert abs(freq - p[top]) < 4 * np.sqrt(p[top] * (1 - p[top]) / n), (freq, p[top])
    assert any(p[t] < 0.05 * p[top] for t in draws)      # tokens min_p = 0.05 would have cut


def test_seeded_sampling_repeats(llm):
    toks = llm.tokenize("tell me")
    llm.set_seed(123)
    a = take(llm.generate(toks, temp=0.9), 10)
    b = take(llm.generate(toks, temp=0.9), 10)
    llm.set_seed(124)
    c = take(llm.generate(toks, temp=0.9), 10)
    assert a == b and a != c


def test_stopping_criteria_and_grammar(llm):
    toks = llm.tokenize("x")
    seen = []

    def stop_after_three(ids, logits):
        seen.append((len(ids), logits.shape))
        return len(seen) == 3
    out = list(llm.generate(toks, temp=0, stopping_criteria=[stop_after_three]))
    assert len(out) == 2 and seen[0] == (len(toks) + 1, (llm.n_vocab(),))
    out = []
    for t in llm.generate(toks, temp=1.5, grammar='root ::= "the cat" | "a dog"'):
        out.append(t)
        if t == llm.token_eos() or len(out) == 20:
            break
    assert out[-1] == llm.token_eos() and llm.detokenize(out[:-1]) in ("the cat", "a dog")


def test_penalty_window_is_last_n_tokens_size(path):
    llm = pi.PowerInfer(path, n_ctx=64, verbose=False, last_n_tokens_size=7)
    assert llm.make_task([1, 2], max_tokens=1).params.repeat_last_n == 7
    assert llm.token_loop.sampler().params.repeat_last_n == 7
    with pytest.raises(ValueError, match="last_n_tokens_size"):
        pi.PowerInfer(path, n_ctx=64, verbose=False, last_n_tokens_size=-2)


def test_state_round_trip(llm):
    toks = llm.tokenize("save me")
    llm.reset()
    llm.eval(toks)
    state = llm.save_state()
    scores = llm._scores.copy()
    llm.reset()
    llm.eval(llm.tokenize("something else"))
    llm.load_state(state)
    assert llm._input_ids.tolist() == toks
    np.testing.assert_array_equal(llm._scores, scores)
    assert llm.sample(temp=0) == int(np.argmax(scores[-1]))


def test_bad_input(llm):
    llm.reset()
    with pytest.raises(ValueError, match="nothing is evaluated"):
        llm.sample()
    with pytest.raises(ValueError, match="token ids"):
        llm.eval([llm.n_vocab()])
    with pytest.raises(ValueError, match="exceed context window"):
        llm.eval([1] * (llm.n_ctx() + 1))
    llm.eval([1, 2, 3])
    with pytest.raises(ValueError, match="n_tokens"):
        llm.n_tokens = 4
    llm.n_tokens = 1
    assert llm._input_ids.tolist() == [1]
    with pytest.raises(ValueError, match="no tokens"):
        next(llm.generate([]))
    with pytest.raises(ValueError, match="grammar"):
        next(llm.generate([1], grammar=object()))


def test_no_reference_cycle(path):
    """The token loop reads its owner's seed without a reference cycle: the last reference to a PowerInfer frees its
    context (and its device memory) at once, not at the next garbage collection."""
    import gc
    import weakref
    gc.disable()
    try:
        llm = pi.PowerInfer(path, n_ctx=64, verbose=False)
        ctx = weakref.ref(llm.ctx)
        del llm
        assert ctx() is None
    finally:
        gc.enable()


def test_text_still_generates_text(llm_last):
    """generate("text") (and b"text") is the text API, generate([ids]) the token loop."""
    assert isinstance(llm_last.generate("the cat", max_tokens=3, temperature=0), str)
    assert llm_last.generate(b"the cat", max_tokens=3, temperature=0) == \
        llm_last.generate("the cat", max_tokens=3, temperature=0)
    assert isinstance(next(llm_last.generate(llm_last.tokenize("the cat"), temp=0)), int)
