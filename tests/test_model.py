"""The C forward pass against the float64 numpy reference (tests/reference_model.py).

Tolerances are relative to the RMS of the reference logits:
- float weights (f32/f16/bf16): the reference dequantizes the same stored values, so the only
  difference is float32 arithmetic in C;
- q8_0/q4_0 weights: the core quantizes activations to 8 bits (Q8_0) before each matmul, like
  llama.cpp, which adds about 1% relative noise on these random models.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402
from helpers import FLOAT_REL_RMS, KV_F16_REL_RMS, QUANT_REL_RMS, rel_rms  # noqa: E402
from helpers import logits_all as all_logits  # noqa: E402
from helpers import logits_one_by_one  # noqa: E402

TINY = dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2)
DTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    files = {}
    for dt in DTYPES:
        files[dt] = d / f"tiny-{dt}.gguf"
        write_model(files[dt], dtype=dt, seed=3, **TINY)
    return files


PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_match_reference(model_files, dtype):
    model = pi.Model(model_files[dtype])
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ours = all_logits(ctx, PROMPT)
    ref = ReferenceModel(model_files[dtype]).forward(PROMPT)
    tol = FLOAT_REL_RMS if dtype in ("f32", "f16", "bf16") else QUANT_REL_RMS
    assert rel_rms(ours, ref) < tol
    if dtype in ("f32", "f16", "bf16"):
        assert (ours.argmax(1) == ref.argmax(1)).all()


def test_f16_kv_cache_close_to_reference(model_files):
    ctx = pi.Context(pi.Model(model_files["f32"]), n_ctx=64, kv_type="f16")
    ours = all_logits(ctx, PROMPT)
    assert rel_rms(ours, ReferenceModel(model_files["f32"]).forward(PROMPT)) < KV_F16_REL_RMS


def test_greedy_32_tokens_match_reference_exactly(model_files):
    model = pi.Model(model_files["f32"])
    ctx = pi.Context(model, n_ctx=128, kv_type="f32")
    prompt = PROMPT[:6]
    expected = ReferenceModel(model_files["f32"]).greedy(prompt, 32)
    ctx.decode(prompt)
    got = []
    for i in range(32):
        tok = int(np.argmax(ctx.logits()))
        got.append(tok)
        ctx.decode([tok])
    assert got == expected


@pytest.mark.parametrize("dtype", ["f32", "q4_0"])
def test_batch_equals_token_by_token(model_files, dtype):
    model = pi.Model(model_files[dtype])
    batched = all_logits(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    single = logits_one_by_one(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    # same math, one row at a time: equal up to float32 summation order in attention
    np.testing.assert_allclose(single, batched, rtol=0, atol=1e-5)


def test_small_n_batch_splits_prompt(model_files):
    model = pi.Model(model_files["q8_0"])
    full = all_logits(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    split = all_logits(pi.Context(model, n_ctx=64, n_batch=5, kv_type="f32"), PROMPT)
    np.testing.assert_allclose(split, full, rtol=0, atol=1e-5)


def test_thread_counts_give_identical_logits(model_files):
    model = pi.Model(model_files["q4_0"])
    outs = [all_logits(pi.Context(model, n_ctx=64, n_threads=n, kv_type="f32"), PROMPT) for n in (1, 2, 3)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_sequences_share_a_prompt_and_decode_together(model_files):
    """seq_cp shares cached cells; two sequences decoded in one batch equal separate runs."""
    model = pi.Model(model_files["f32"])
    ctx = pi.Context(model, n_ctx=64, n_seq_max=2, kv_type="f32")
    ctx.decode(PROMPT[:8], seq_id=0)
    ctx.kv_seq_cp(0, 1)
    ctx.decode([10, 20], pos=[8, 8], seq_id=[0, 1], logits="all")
    together = [ctx.logits(0), ctx.logits(1)]
    for i, tok in enumerate([10, 20]):
        solo = pi.Context(model, n_ctx=64, kv_type="f32")
        solo.decode(PROMPT[:8] + [tok])
        np.testing.assert_allclose(together[i], solo.logits(), rtol=0, atol=1e-5)


def test_kv_seq_rm_rewinds(model_files):
    model = pi.Model(model_files["f32"])
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT[:10])
    ctx.kv_seq_rm(0, 6, -1)
    assert ctx.seq_pos_max(0) == 5 and ctx.kv_used == 6
    ctx.decode(PROMPT[6:10])
    fresh = pi.Context(model, n_ctx=64, kv_type="f32")
    fresh.decode(PROMPT[:10])
    np.testing.assert_allclose(ctx.logits(), fresh.logits(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", [
    dict(arch="bamboo"),
    dict(ffn_act="relu"),
    dict(ffn_act="gelu"),
    dict(tied_output=True),
    dict(rope_scale_linear=4.0, rope_freq_base=500000.0),
    dict(n_head_kv=4),
    dict(n_head_kv=1),
])
def test_model_variants_match_reference(tmp_path, variant):
    kw = {**TINY, **variant}
    path = tmp_path / "variant.gguf"
    write_model(path, dtype="f32", seed=5, **kw)
    ours = all_logits(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32"), PROMPT)
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < FLOAT_REL_RMS


def test_abort_callback_stops_decode_and_keeps_cache(model_files):
    ctx = pi.Context(pi.Model(model_files["f32"]), n_ctx=64, kv_type="f32")
    ctx.set_abort_callback(lambda: True)
    with pytest.raises(pi.PowerInferError, match="abort"):
        ctx.decode(PROMPT)
    assert ctx.kv_used == 0
    ctx.set_abort_callback(None)
    ctx.decode(PROMPT)
    assert ctx.kv_used == len(PROMPT)


def test_failed_chunked_decode_leaves_cache_unchanged(model_files):
    """A decode longer than n_batch runs in chunks; if a later chunk fails, the earlier ones are undone."""
    ctx = pi.Context(pi.Model(model_files["f32"]), n_ctx=12, n_batch=4, kv_type="f32")
    ctx.decode(PROMPT[:2])
    with pytest.raises(pi.PowerInferError, match="KV cache full"):
        ctx.decode(PROMPT[2:14])          # 12 more tokens: the first chunks fit, the third does not
    assert ctx.kv_used == 2 and ctx.seq_pos_max(0) == 1


def test_one_token_fast_path_matches_the_general_path(model_files):
    """decode([t]) / decode([t], pos=[p]) skip numpy (the generation loops' call); they must behave like
    decode(np.array([t])): same logits, same cache positions, same errors."""
    model = pi.Model(model_files["q4_0"])
    fast, slow = pi.Context(model, n_ctx=32, n_seq_max=2), pi.Context(model, n_ctx=32, n_seq_max=2)
    for ctx, conv in ((fast, list), (slow, np.array)):
        ctx.decode(conv([1, 17, 200]))
        ctx.decode(conv([45]))
        ctx.decode(conv([3]), pos=conv([3]))
        ctx.decode(conv([9]), seq_id=1)
    assert np.array_equal(fast.logits(), slow.logits())
    assert [fast.seq_pos_max(s) for s in (0, 1)] == [slow.seq_pos_max(s) for s in (0, 1)] == [3, 0]
    for ctx in (fast, slow):
        with pytest.raises(ValueError, match="sequence id 5"):
            ctx.decode([1], seq_id=5)
        with pytest.raises(pi.PowerInferError, match="token 320"):
            ctx.decode([320])


def test_two_threads_sharing_a_context_are_serialised(model_files):
    """Two threads decoding into one Context (their own sequences, and kv_seq_rm between rounds) used
    to interleave inside the C core: a corrupt KV cache and, under ASan, a heap-use-after-free. Each
    call now holds ctx.lock, so both threads get exactly what they get alone; `with ctx.lock` makes a
    decode and its logits() one step."""
    import threading
    model = pi.Model(model_files["f32"])
    rounds = 12
    prompts = {0: PROMPT[:8], 1: PROMPT[8:]}
    expected = {}
    for seq, prompt in prompts.items():
        solo = pi.Context(model, n_ctx=64, kv_type="f32")
        solo.decode(prompt)
        expected[seq] = solo.logits()
    ctx = pi.Context(model, n_ctx=64, n_seq_max=2, kv_type="f32", n_threads=2)
    got: dict[int, list] = {0: [], 1: []}
    errors: list = []
    start = threading.Barrier(2)

    def worker(seq):
        try:
            start.wait()
            for _ in range(rounds):
                with ctx.lock:
                    ctx.decode(prompts[seq], seq_id=seq, pos=range(len(prompts[seq])))
                    got[seq].append(ctx.logits())
                ctx.kv_seq_rm(seq)          # alone, outside the block: serialised all the same
                ctx.kv_used
        except Exception as e:              # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for seq in prompts:
        assert len(got[seq]) == rounds
        for logits in got[seq]:
            np.testing.assert_allclose(logits, expected[seq], rtol=0, atol=1e-5)
    assert ctx.kv_used == 0
