"""examples/batched.py: N sequences sharing one prompt, decoded together in one batch per step."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import powerinfer as pi  # noqa: E402
from powerinfer.generator import Generator  # noqa: E402

_spec = importlib.util.spec_from_file_location("examples_batched", ROOT / "examples" / "batched.py")
batched = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = batched
_spec.loader.exec_module(batched)

PROMPT = "Hello my name is"


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("q8_0", seed=1)


@pytest.fixture(scope="module")
def model(model_path):
    return pi.Model(model_path)


def _sampler(model, temp, seed, **kw):
    params = pi.SamplingParams(temperature=temp, top_k=40, top_p=0.9, min_p=0.0, repeat_penalty=1.0, seed=seed,
                               ignore_eos=True, **kw)
    return pi.Sampler(params, eos_ids=[model.tokenizer.eos_id])


def _single_run(model, prompt_ids, n_len, sampler):
    ctx = pi.Context(model, n_ctx=n_len, n_batch=n_len, n_threads=1)
    gen = Generator(ctx, sampler)
    gen.feed(prompt_ids)
    return list(gen.generate(n_len - len(prompt_ids)))


def _batched_run(model, prompt_ids, n_len, samplers, **kw):
    n = len(samplers)
    ctx = pi.Context(model, n_ctx=len(prompt_ids) + (n_len - len(prompt_ids)) * n, n_batch=max(n_len, n),
                     n_seq_max=n, n_threads=1)
    return ctx, batched.decode_parallel(ctx, prompt_ids, n_len, samplers, **kw)


@pytest.mark.parametrize("temp", [0.0, 0.4, 1.0])
def test_each_sequence_equals_a_single_run(model, temp):
    """greedy: every sequence is the single-sequence greedy run; sampling: sequence s is the single run
    with seed SEED+s (token for token)."""
    prompt = model.tokenizer.encode(PROMPT, add_special=True)
    n_len, n, seed = len(prompt) + 20, 4, 1234
    _, res = _batched_run(model, prompt, n_len, [_sampler(model, temp, seed + s) for s in range(n)])
    for s in range(n):
        assert res.tokens[s] == _single_run(model, prompt, n_len, _sampler(model, temp, seed + s)), f"sequence {s}"
        assert len(res.tokens[s]) == n_len - len(prompt) and res.finished_at[s] == n_len
    if temp > 0.5:
        assert len({tuple(t) for t in res.tokens}) > 1      # the seeds really differ


class _Spy:
    """A Context that records the decode and kv_seq_cp calls."""

    def __init__(self, ctx):
        self.ctx, self.calls = ctx, []

    def decode(self, tokens, pos=None, seq_id=0, logits="last"):
        self.calls.append(("decode", list(tokens), list(pos), seq_id if isinstance(seq_id, int) else list(seq_id)))
        return self.ctx.decode(tokens, pos=pos, seq_id=seq_id, logits=logits)

    def kv_seq_cp(self, src, dst, p0=0, p1=-1):
        self.calls.append(("cp", src, dst))
        return self.ctx.kv_seq_cp(src, dst, p0, p1)

    def __getattr__(self, name):
        return getattr(self.ctx, name)


def test_prompt_decoded_once_then_one_decode_per_step(model):
    prompt = model.tokenizer.encode(PROMPT, add_special=True)
    n_prompt, n, n_len = len(prompt), 3, len(prompt) + 6
    ctx = pi.Context(model, n_ctx=n_prompt + (n_len - n_prompt) * n, n_batch=n_len, n_seq_max=n, n_threads=1)
    spy = _Spy(ctx)
    # sequence 1 is forced to end-of-text at once (it then drops out of every batch)
    eos = model.tokenizer.eos_id
    samplers = [_sampler(model, 0.4, 7), _sampler(model, 0.4, 8, logit_bias={eos: 1e4}), _sampler(model, 0.4, 9)]
    samplers[1].params.ignore_eos = False
    res = batched.decode_parallel(spy, prompt, n_len, samplers, eog_ids=[eos])
    assert spy.calls[0] == ("decode", prompt, list(range(n_prompt)), 0)
    assert spy.calls[1:n] == [("cp", 0, s) for s in range(1, n)]
    steps = spy.calls[n:]
    assert all(c[0] == "decode" for c in steps) and len(steps) == res.n_steps == n_len - n_prompt
    for k, (_, toks, pos, seqs) in enumerate(steps):
        assert seqs == [0, 2] and pos == [n_prompt + k] * 2
        assert toks == [res.tokens[0][k], res.tokens[2][k]]
    assert res.tokens[1] == [] and res.finished_at[1] == n_prompt
    assert res.n_decode == 2 * (n_len - n_prompt)
    # the prompt's cells are shared, not copied: the cache holds the prompt once plus the new tokens
    assert ctx.kv_used == n_prompt + res.n_decode


def _run_cli(*args, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "batched.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_positional_interface(model, model_path):
    prompt = model.tokenizer.encode(PROMPT, add_special=True)
    n_len = len(prompt) + 10
    r = _run_cli(model_path, PROMPT, 3, n_len, 1, "--greedy", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    blocks = re.findall(r"sequence (\d+):\n\n(.*?)\n(?=\nsequence|\Z)", r.stdout, re.S)
    assert [b[0] for b in blocks] == ["0", "1", "2"]
    single = _single_run(model, prompt, n_len, _sampler(model, 0.0, 0))
    dec = pi.StreamDecoder(model.tokenizer, strip_leading_space=False)
    expect = PROMPT + "".join(dec.push(t) for t in single) + dec.flush()
    assert all(b[1] == expect for b in blocks)
    m = re.search(r"^main: decoded (\d+) tokens in \d+\.\d\d s, speed: \d+\.\d\d t/s$", r.stderr, re.M)
    assert m and int(m.group(1)) == 3 * (n_len - len(prompt))
    assert f"n_parallel = 3, n_kv_req = {len(prompt) + 3 * (n_len - len(prompt))}" in r.stderr
    assert "sequence 0:" not in r.stderr and "decoded" not in r.stdout


def test_cli_flags_equal_positionals(model_path):
    a = _run_cli(model_path, "the cat", 2, 30, 1, "-s", 99)
    b = _run_cli("-m", model_path, "-p", "the cat", "-np", 2, "-n", 30, "-t", 1, "--seed", 99)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and "sequence 1:" in a.stdout
    bad = _run_cli(model_path, "the cat", 2, 3)             # LEN not above the prompt's length
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("error: LEN")
    twice = _run_cli(model_path, "the cat", "-p", "again")
    assert twice.returncode == 2 and "both" in twice.stderr
