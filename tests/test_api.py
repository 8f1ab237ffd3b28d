"""The high-level PowerInfer object and the generation loop."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "tiny.gguf"
    write_model(path, dtype="q8_0", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
    return pi.PowerInfer(path, n_ctx=128)


def test_same_seed_same_text(llm):
    a = llm.generate("Once upon a time", max_tokens=24, seed=42, ignore_eos=True)
    b = llm.generate("Once upon a time", max_tokens=24, seed=42, ignore_eos=True)
    c = llm.generate("Once upon a time", max_tokens=24, seed=43, ignore_eos=True)
    assert a == b and a != c


def test_stream_equals_full_text(llm):
    full = llm.generate("Hello", max_tokens=20, seed=7, ignore_eos=True)
    assert "".join(llm.generate("Hello", max_tokens=20, seed=7, ignore_eos=True, stream=True)) == full


def test_greedy_equals_argmax_of_eval_logits(llm):
    prompt = llm.tokenize("the cat")
    toks = list(llm.generate_tokens(prompt, pi.SamplingParams(temperature=0, ignore_eos=True), max_tokens=8))
    seq = list(prompt)
    for t in toks:
        assert t == int(np.argmax(llm.eval_logits(seq)[-1]))
        seq.append(t)


def test_stop_string_is_excluded(llm):
    full = llm.generate("Hello", max_tokens=30, seed=3, ignore_eos=True)
    stop = full[5:8]
    assert stop and llm.generate("Hello", max_tokens=30, seed=3, ignore_eos=True, stop=[stop]) == full[:full.find(stop)]


def test_max_tokens_counts_tokens(llm):
    sp = pi.SamplingParams(temperature=0, ignore_eos=True)
    assert len(list(llm.generate_tokens(llm.tokenize("a"), sp, max_tokens=11))) == 11


def test_context_full_stops_generation(llm):
    sp = pi.SamplingParams(temperature=0, ignore_eos=True)
    prompt = llm.tokenize("a b c")
    out = list(llm.generate_tokens(prompt, sp, max_tokens=-1))
    assert len(prompt) + len(out) == llm.n_ctx() + 1   # the last sampled token is not evaluated
