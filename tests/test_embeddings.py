"""Embeddings: the final hidden state from C (pi_set_outputs / pi_get_embeddings) against the float64
numpy reference, pooling and normalization against numpy formulas, and the Python API's shapes.

Tolerances are relative to the RMS of the reference hidden states (as tests/test_model.py does for
logits): float weights differ only by float32 arithmetic in C.
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
from powerinfer._ffi import ffi, lib  # noqa: E402
from powerinfer.embedding import Embedder, normalize  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402
from helpers import FLOAT_REL_RMS, rel_rms  # noqa: E402

HIDDEN_REL_RMS = FLOAT_REL_RMS     # float32 accumulation vs float64 (f32 weights, f32 KV cache)
PACKED_ABS = 1e-6         # one sequence alone vs packed with others in one decode (float32 noise at most)
TINY = dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("emb") / "tiny-f32.gguf"
    write_model(path, dtype="f32", seed=3, **TINY)
    return path


@pytest.fixture(scope="module")
def reference(f32_file):
    return ReferenceModel(f32_file)


def test_hidden_states_match_reference(f32_file, reference):
    ctx = pi.Context(pi.Model(f32_file), n_ctx=64, kv_type="f32")
    ctx.set_outputs(logits=False, embeddings=True)
    ctx.decode(PROMPT, logits="all")
    ours = np.stack([ctx.embeddings(i) for i in range(len(PROMPT))])
    ref = reference.forward(PROMPT, hidden=True)
    assert ours.shape == (len(PROMPT), TINY["n_embd"])
    assert rel_rms(ours, ref) < HIDDEN_REL_RMS
    with pytest.raises(pi.PowerInferError, match="embeddings only"):
        ctx.logits()


def test_both_outputs_give_the_same_bits_as_each_alone(f32_file):
    model = pi.Model(f32_file)
    only_logits, only_embd, both = (pi.Context(model, n_ctx=64) for _ in range(3))
    only_embd.set_outputs(logits=False, embeddings=True)
    both.set_outputs(logits=True, embeddings=True)
    for c in (only_logits, only_embd, both):
        c.decode(PROMPT, logits="all")
    for i in range(len(PROMPT)):
        assert np.array_equal(both.logits(i), only_logits.logits(i))
        assert np.array_equal(both.embeddings(i), only_embd.embeddings(i))
    with pytest.raises(pi.PowerInferError, match="logits only"):
        only_logits.embeddings(0)


def test_c_api_errors(f32_file):
    ctx = pi.Context(pi.Model(f32_file), n_ctx=64)
    for bad in (0, 4, -1):
        assert lib.pi_set_outputs(ctx._ptr, bad) == lib.PI_ERR_INVALID_ARG
    assert lib.pi_set_outputs(ffi.NULL, lib.PI_OUTPUT_EMBD) == lib.PI_ERR_INVALID_ARG
    ctx.decode(PROMPT[:4])
    assert lib.pi_get_embeddings(ctx._ptr, 3) == ffi.NULL          # logits only
    assert b"does not output embeddings" in ffi.string(lib.pi_last_error())
    assert lib.pi_set_outputs(ctx._ptr, lib.PI_OUTPUT_EMBD) == lib.PI_OK
    assert lib.pi_get_embeddings(ctx._ptr, 3) == ffi.NULL          # the last decode's outputs are dropped
    ctx.set_outputs(logits=False, embeddings=True)                 # (the same call, and Context knows)
    ctx.decode(PROMPT[:4], pos=range(4, 8))
    assert lib.pi_get_embeddings(ctx._ptr, 3) != ffi.NULL
    assert lib.pi_get_embeddings(ctx._ptr, 2) == ffi.NULL          # only the last row was asked for
    assert lib.pi_get_embeddings(ctx._ptr, 4) == ffi.NULL
    assert lib.pi_get_logits(ctx._ptr, 3) == ffi.NULL
    assert lib.pi_get_embeddings(ffi.NULL, 0) == ffi.NULL


def test_pooling_and_packing_against_reference(f32_file, reference):
    inputs = [PROMPT[:5], PROMPT[3:14], PROMPT, [1, 2], PROMPT[:1]]
    refs = [reference.forward(t, hidden=True) for t in inputs]
    # n_batch 8: short inputs are packed into shared decodes, the 11 and 16 token ones are chunked
    emb = Embedder(pi.Model(f32_file), n_ctx=32, n_batch=8, n_seq_max=4, kv_type="f32")
    alone = Embedder(pi.Model(f32_file), n_ctx=32, n_batch=32, n_seq_max=1, kv_type="f32")
    got = emb.embed_tokens(inputs, pooling="none", embd_normalize=-1)
    for g, r, a in zip(got, refs, alone.embed_tokens(inputs, pooling="none", embd_normalize=-1)):
        assert g.shape == r.shape and rel_rms(g, r) < HIDDEN_REL_RMS
        assert np.abs(g - a).max() <= PACKED_ABS
    pooled = {p: emb.embed_tokens(inputs, pooling=p, embd_normalize=-1) for p in ("mean", "cls", "last")}
    for i, r in enumerate(refs):
        assert rel_rms(pooled["mean"][i], r.mean(0)) < HIDDEN_REL_RMS
        assert rel_rms(pooled["cls"][i], r[0]) < HIDDEN_REL_RMS
        assert rel_rms(pooled["last"][i], r[-1]) < HIDDEN_REL_RMS
    # a causal model's first token sees only itself: cls pooling gives one vector for every input
    assert np.array_equal(pooled["cls"][0], pooled["cls"][2]) and np.array_equal(pooled["cls"][0], pooled["cls"][4])
    l2 = emb.embed_tokens(inputs, pooling="mean")           # default: embd_normalize 2
    for v, m in zip(l2, pooled["mean"]):
        assert abs(np.linalg.norm(v) - 1.0) < 1e-6 and rel_rms(v, m / np.linalg.norm(m)) < 1e-6


def test_normalize_is_llama_cpps():
    v = np.array([[3.0, -4.0, 0.0], [0.0, 0.0, 0.0]])
    assert np.allclose(normalize(v, 2), [[0.6, -0.8, 0.0], [0, 0, 0]])
    assert np.allclose(normalize(v, 1), [[3 / 7, -4 / 7, 0.0], [0, 0, 0]])
    assert np.allclose(normalize(v, 0), [[3 * 32760 / 4, -32760, 0.0], [0, 0, 0]])
    assert np.allclose(normalize(v, 3), v / np.cbrt(27 + 64))
    assert np.array_equal(normalize(v, -1), v.astype(np.float32))


def test_embedder_rejects_bad_inputs(f32_file):
    emb = Embedder(pi.Model(f32_file), n_ctx=16, n_batch=8)
    for bad, msg in (([[]], "no tokens"), ([[1, 400]], "out of range"), ([list(range(17))], "more than")):
        with pytest.raises(ValueError, match=msg):
            emb.embed_tokens(bad)
    with pytest.raises(ValueError, match="rerank"):
        emb.embed_tokens([[1]], pooling="rank")
    with pytest.raises(ValueError, match="pooling must be"):
        Embedder(pi.Model(f32_file), pooling="max")


def test_api_embed_and_create_embedding(f32_file):
    llm = pi.PowerInfer(f32_file, n_ctx=256, n_threads=1)
    one = llm.embed("hello world")
    assert isinstance(one, list) and len(one) == TINY["n_embd"] and isinstance(one[0], float)
    many, n = llm.embed(["hello world", "hello world", "the cat sat on the mat"], return_count=True)
    a, b, c = (np.array(v) for v in many)
    assert n == 2 * len(llm.tokenize("hello world")) + len(llm.tokenize("the cat sat on the mat"))
    assert abs(a @ b - 1.0) < 1e-6 and a @ c < 0.999 and np.allclose(a, one)
    raw = np.array(llm.embed("hello world", normalize=False))
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3 and np.allclose(raw / np.linalg.norm(raw), a, atol=1e-6)
    per_token = llm.embed("hello world", pooling="none")
    assert np.array(per_token).shape == (len(llm.tokenize("hello world")), TINY["n_embd"])
    assert np.allclose(llm.embed(llm.tokenize("hello world")), one)         # token ids as input
    r = llm.create_embedding(["hello world", [1, 2, 3]], model="whatever")
    assert r["object"] == "list" and r["model"] == llm.model_name
    assert [d["index"] for d in r["data"]] == [0, 1] and all(d["object"] == "embedding" for d in r["data"])
    assert r["usage"] == {"prompt_tokens": len(llm.tokenize("hello world")) + 3,
                          "total_tokens": len(llm.tokenize("hello world")) + 3}
    long = list(range(1, 300))
    assert len(llm.embed(long)) == TINY["n_embd"]                          # truncated to the context
    with pytest.raises(ValueError, match="more than"):
        llm.embed(long, truncate=False)
    with pytest.raises(TypeError):
        llm.embed([])
    # the embedder has its own context: a completion afterwards is unchanged by it
    before = llm.create_completion("hello", max_tokens=6, temperature=0)["choices"][0]["text"]
    llm.embed(["x", "y z"])
    assert llm.create_completion("hello", max_tokens=6, temperature=0)["choices"][0]["text"] == before


def test_embeddings_from_the_device_output_head(f32_file):
    """-ngl 99 on the emulated device: the output norm runs there, its rows are copied back; the same bits."""
    import os
    import subprocess
    code = f"""
import numpy as np, powerinfer as pi
m = pi.Model({str(f32_file)!r})
cpu, dev = pi.Context(m, n_ctx=64), pi.Context(m, n_ctx=64, n_gpu_layers=-1)
assert dev.offload is not None and dev.offload.output
for c in (cpu, dev):
    c.set_outputs(logits=True, embeddings=True)
    c.decode({PROMPT!r}, logits="all")
for i in range({len(PROMPT)}):
    assert np.array_equal(cpu.embeddings(i), dev.embeddings(i)) and np.array_equal(cpu.logits(i), dev.logits(i))
print("ok")
"""
    env = {**os.environ, "POWERINFER_EMULATED_GPU_MIB": "1024"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
