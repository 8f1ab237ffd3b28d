"""-tb / n_threads_batch (llama.cpp's): decode calls of more than one token (prompts) run on n_threads_batch threads,
one-token calls on n_threads, from one pool; the logits do not depend on either (the numeric contract)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from helpers import logits_all

import powerinfer as pi


def worker_ticks() -> dict[int, int]:
    """utime + stime (clock ticks) of this process's threads but the main one."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def test_same_logits_whatever_the_thread_counts(tiny_model):
    model = pi.Model(tiny_model("q8_0", seed=4))
    toks = list(range(1, 120))
    ref = logits_all(pi.Context(model, n_ctx=256, n_threads=1), toks)
    for t, tb in ((1, 2), (2, 1), (2, 3)):
        ctx = pi.Context(model, n_ctx=256, n_threads=t, n_threads_batch=tb)
        assert np.array_equal(logits_all(ctx, toks), ref), (t, tb)
        ctx.kv_clear()
        ctx.decode(toks[:60], pos=range(60))
        for i, tok in enumerate(toks[60:70]):                 # one token at a time: n_threads
            ctx.decode([tok], pos=[60 + i])
            assert np.array_equal(ctx.logits(), ref[60 + i]), (t, tb, i)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads per-thread CPU times from /proc")
def test_prompts_use_the_batch_threads_and_tokens_do_not(tiny_model):
    model = pi.Model(tiny_model("f32", seed=4, n_embd=256, n_ff=640, n_layer=4))
    before = worker_ticks()
    ctx = pi.Context(model, n_ctx=512, n_threads=1, n_threads_batch=2)
    workers = set(worker_ticks()) - set(before)
    assert len(workers) == 1                              # one pool of 2: the caller and one worker
    (w,) = workers
    start = worker_ticks()[w]
    for _ in range(3):                                    # generation: one-token calls, the caller alone
        ctx.kv_clear()
        for p in range(150):
            ctx.decode([1 + p % 200], pos=[p])
    assert worker_ticks()[w] == start
    for _ in range(10):                                   # prompts: both threads
        ctx.kv_clear()
        ctx.decode([1 + i % 300 for i in range(399)], pos=range(399))
    assert worker_ticks()[w] > start
