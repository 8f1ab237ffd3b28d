"""The Python layers over a model with recurrent layers (qwen35): a slot's state cannot drop a tail, so the engine
reuses a cached prompt only where the new prompt continues everything the slot's state absorbed, and evaluates it
from the start otherwise; a context shift evaluates the kept tokens from the start; speculative decoding and a
recurrent draft model are refused by name; slot states (slot files, --prompt-cache, token_loop) carry the recurrent
state. Each case against a fresh engine's greedy tokens (a context that never saw another request)."""
from __future__ import annotations

import pytest
from model_files import write_qwen35_model

import powerinfer as pi
from powerinfer.context import Context
from powerinfer.engine import Engine
from powerinfer.request import RequestError, Task
from powerinfer.sampling import SamplingParams
from powerinfer.speculative import DraftModel, PromptLookup, SpecParams

P1 = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12]
P2 = [1, 17, 200, 45, 3, 250, 33, 81, 190, 64, 5]      # P1's first 5 tokens, then others


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("q35e") / "tiny-qwen35.gguf"
    write_qwen35_model(path, "qwen35", seed=5)
    return pi.Model(path)


def engine(model, n_slots=1, n_ctx=128, **kw) -> Engine:
    ctx = Context(model, n_ctx=n_ctx, kv_type="f32", n_seq_max=n_slots)
    return Engine(ctx, model.tokenizer, n_slots, **kw)


def run(eng, prompt, n=8, **kw):
    task = Task(prompt, SamplingParams(temperature=0.0), n_predict=n, want_ids=True, **kw)
    res = None
    for ev in eng.events(task):
        if ev[0] == "done":
            res = ev[1]
        elif ev[0] == "error":
            raise ev[1]
    return res


def fresh(model, prompt, n=8, **kw):
    return run(engine(model), prompt, n, **kw).tokens


def test_engine_runs_without_regions(model):
    eng = engine(model, n_slots=2)
    assert eng.recurrent and not eng.regions
    a, b = run(eng, P1), run(eng, P2)
    assert a.tokens == fresh(model, P1) and b.tokens == fresh(model, P2)


def test_prompt_reuse_only_of_the_whole_state(model):
    """A prompt that continues all the slot's tokens reuses them (cache_n = all); one that shares only a prefix is
    evaluated from the start (cache_n 0); both give the fresh engine's tokens."""
    eng = engine(model)
    first = run(eng, P1)
    cont = P1 + first.tokens[:-1] + [42, 43]          # the slot holds P1 + all but the last sampled token
    again = run(eng, cont)
    assert again.n_cached == len(P1) + len(first.tokens) - 1
    assert again.tokens == fresh(model, cont)
    other = run(eng, P2)
    assert other.n_cached == 0 and other.tokens == fresh(model, P2)
    same = run(eng, P2)                                # the same prompt again: its last token must be evaluated
    assert same.n_cached == 0 and same.tokens == fresh(model, P2)


def test_context_shift_evaluates_the_kept_tokens_again(model):
    """A full slot with context_shift: the kept tokens are evaluated from the start (the state cannot drop the
    discarded ones); generation goes on as a fresh engine's over the kept tokens does."""
    eng = engine(model, n_ctx=24)
    res = run(eng, P1, n=30, context_shift=True, n_keep=4)
    assert res.n_shifts >= 1 and len(res.tokens) == 30 and eng.ctx.recurrent_pos(0) < 24


def test_speculative_decoding_is_refused(model, tmp_path):
    with pytest.raises(ValueError, match="speculative decoding is not supported"):
        engine(model, drafter=PromptLookup())
    eng = engine(model)
    with pytest.raises(RequestError, match="speculative decoding is not supported"):
        run(eng, P1, speculative=SpecParams(4))
    with pytest.raises(ValueError, match="draft model with recurrent layers"):
        DraftModel(Context(model, n_ctx=64))


def test_slot_state_round_trip(model):
    """Engine.slot_state / restore_slot_state (the server's slot files, main.py's --prompt-cache) carry the state:
    a restored slot continues as the saved one would; keep < n (a prompt that shares only a prefix of the file's)
    starts the slot over instead of cutting the state."""
    eng = engine(model, n_slots=2)
    first = run(eng, P1)
    slot = first.slot
    tokens, state = eng.slot_state(slot)
    assert eng.ctx.recurrent_pos(slot) == len(tokens) - 1
    eng2 = engine(model, n_slots=2)
    eng2.restore_slot_state(1, tokens, state)
    cont = tokens + [42, 43]
    got = run(eng2, cont)
    assert got.n_cached == len(tokens) and got.tokens == fresh(model, cont)
    eng3 = engine(model)
    eng3.restore_slot_state(0, tokens, state, keep=3)
    assert eng3.ctx.recurrent_pos(0) == -1 and eng3.slots[0].cache == []
    assert run(eng3, P2).tokens == fresh(model, P2)


def test_token_loop_reuses_only_whole_states(model):
    """eval_in_slot0 (llama-cpp-python's token loop): a prefix that drops tokens the state absorbed is evaluated
    again from the start, so its logits are a fresh context's."""
    import numpy as np
    eng = engine(model)
    a = eng.eval_in_slot0([], P1, all_logits=False)
    b = eng.eval_in_slot0(P1[:5], P2[5:], all_logits=False)      # P2 through a prefix of P1
    ctx = Context(model, n_ctx=128, kv_type="f32")
    ctx.decode(P2)
    assert np.array_equal(b[-1], ctx.logits())
    assert a.shape == b.shape


def test_decode_parallel_shares_the_prompt_state(model):
    """batched.py's decode_parallel: the prompt decoded once and shared (kv_seq_cp copies the recurrent state); each
    greedy sequence is a fresh engine's."""
    from powerinfer.generator import decode_parallel
    from powerinfer.sampling import Sampler
    ctx = Context(model, n_ctx=128, kv_type="f32", n_seq_max=3)
    samplers = [Sampler(SamplingParams(temperature=0.0)) for _ in range(3)]
    res = decode_parallel(ctx, P1, len(P1) + 6, samplers)
    want = fresh(model, P1, n=6)
    assert res.tokens == [want] * 3
