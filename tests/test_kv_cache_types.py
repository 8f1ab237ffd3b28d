"""The KV cache's types (llama.cpp's -ctk / -ctv): f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, K and V each.

The attention op over each type is tested against numpy in tests/test_ops.py (test_attention_quantized_cache) and
each ISA level against scalar in tests/test_isa.py; here a model runs with them end to end.

Tolerance (logits against the same model with an f32 cache): this random test model's attention is sharp, so the
f16 cache alone moves its logits by 1.2% (relative RMS), bf16 and q8_0 by 1.3-1.5%, q5_0 / q5_1 by 3.3-3.6%, q4_0 /
q4_1 by 6.5-7.0% (measured on this model, 40 tokens). The bounds are 2.5x those (KV_TOL), and each type must move
the logits away from the f16 cache's (the type is in use, not dropped on the way)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import powerinfer as pi  # noqa: E402
from helpers import rel_rms  # noqa: E402
from make_test_model import write_model  # noqa: E402

KV_TOL = {"f16": 0.03, "bf16": 0.035, "q8_0": 0.04, "q5_0": 0.09, "q5_1": 0.09, "q4_0": 0.18, "q4_1": 0.18,
          "iq4_nl": 0.18}
BLOCK_BYTES = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
               "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18)}   # (values, bytes) of a block
TOKENS = [int(t) for t in np.random.default_rng(0).integers(1, 320, 40)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kvtypes") / "llama-q8_0.gguf"   # heads of 32 values: every type's blocks fit
    write_model(path, dtype="q8_0", n_vocab=320, n_embd=128, n_ff=320, n_head=4, n_head_kv=2, n_layer=2, seed=3)
    return path


@pytest.fixture(scope="module")
def model(model_path):
    return pi.Model(model_path)


def logits(model, kv_type, one_by_one=False) -> np.ndarray:
    ctx = pi.Context(model, n_ctx=64, kv_type=kv_type)
    if not one_by_one:
        ctx.decode(TOKENS, logits="all")
        return np.array([ctx.logits(i) for i in range(len(TOKENS))])
    out = []
    for t in TOKENS:
        ctx.decode([t])
        out.append(ctx.logits(-1))
    return np.array(out)


@pytest.fixture(scope="module")
def f32_logits(model):
    return logits(model, "f32")


@pytest.mark.parametrize("kv_type", ["f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl", ("q8_0", "f16"),
                                     ("f16", "q4_0"), ("q4_1", "q8_0")], ids=str)
def test_cache_type_logits(model, f32_logits, kv_type):
    """Each type (and pairs of K and V types) within its bound of the f32 cache; a prompt's logits the bits of the
    same tokens one at a time (the attention's prompt path keeps the one-token path's bits for every type)."""
    k, v = (kv_type, kv_type) if isinstance(kv_type, str) else kv_type
    got = logits(model, kv_type)
    err = rel_rms(got, f32_logits)
    assert err <= max(KV_TOL[k], KV_TOL[v]), f"{kv_type}: relative RMS {err:.4f} from the f32 cache"
    if kv_type != "f16":
        assert not np.array_equal(got, logits(model, "f16")), f"{kv_type}: the logits of an f16 cache"
    assert np.array_equal(got, logits(model, kv_type, one_by_one=True)), f"{kv_type}: prompt vs one by one"


@pytest.mark.parametrize("kv_type", ["q8_0", ("q4_0", "bf16"), ("iq4_nl", "q5_1")], ids=str)
def test_state_holds_the_cache_rows(model, kv_type):
    """A sequence's state is the cache's own rows: its size follows the K and V types (q8_0: 34 bytes per 32 values,
    about half of f16's), and it restores into a context of the same types."""
    k, v = (kv_type, kv_type) if isinstance(kv_type, str) else kv_type
    hp = model.hparams
    n_embd_kv = hp.n_embd // hp.n_head * hp.n_head_kv

    def row(t):
        vals, nbytes = BLOCK_BYTES[t]
        return n_embd_kv // vals * nbytes

    a = pi.Context(model, n_ctx=64, kv_type=kv_type)
    a.decode(TOKENS[:20])
    state = a.kv_seq_state(0)
    assert len(state) == 56 + 20 * 4 + hp.n_layer * 20 * (row(k) + row(v))
    a.decode([TOKENS[20]], pos=[20])
    want = np.array(a.logits(-1))
    b = pi.Context(model, n_ctx=64, kv_type=kv_type)
    b.kv_seq_set_state(0, state)
    b.decode([TOKENS[20]], pos=[20])
    assert np.array_equal(np.array(b.logits(-1)), want)


def test_head_size_not_whole_blocks(tmp_path):
    """A model whose heads are 16 values cannot hold 32-value blocks per head: a clear error naming the sizes."""
    path = tmp_path / "hd16.gguf"
    write_model(path, dtype="f32", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=1, seed=1)
    m = pi.Model(path)
    with pytest.raises(pi.PowerInferError, match="V cache type q5_0: the model's head size 16 is not a multiple of its "
                                                 "blocks of 32"):
        pi.Context(m, kv_type=("bf16", "q5_0"))
    assert pi.Context(m, kv_type=("bf16", "f32")).type_v == "f32"   # the float types take any head size


def run_main(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "bindings"),
                                                                   os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, str(ROOT / "examples" / "main.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_main_cache_type_flags(model_path, tmp_path):
    """examples/main.py with llama.cpp's -ctk / -ctv: the run uses those types (its greedy text is the API's with
    them); a type the model's heads cannot hold is an error with exit status 1, not a traceback."""
    common = ["-m", model_path, "-p", "the cat", "-n", 8, "--temp", 0, "-t", 1, "--no-display-prompt", "-c", 64]
    r = run_main(*common, "-ctk", "q8_0", "-ctv", "q4_0")
    assert r.returncode == 0, r.stderr
    # 2 layers x 64 cells x 64 values: K 2 x 64 x 68 bytes, V 2 x 64 x 36
    assert "KV self size = 0.01 MiB, K (q8_0): 0.01 MiB, V (q4_0): 0.00 MiB" in r.stderr, r.stderr
    llm = pi.PowerInfer(model_path, n_ctx=64, n_threads=1, verbose=False, type_k=8, type_v=2)
    want = llm.create_completion("the cat", max_tokens=8, temperature=0)["choices"][0]["text"]
    llm.close()
    assert r.stdout.strip() == want.strip()
    path = tmp_path / "hd16.gguf"
    write_model(path, dtype="f32", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=1, seed=1)
    r = run_main("-m", path, "-p", "x", "-n", 2, "-ctk", "q8_0")
    assert r.returncode == 1 and "K cache type q8_0: the model's head size 16" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_server_cache_type_flags(model_path):
    """The server with -ctk / -ctv: the loaded context holds those types and answers a completion with the text the
    API gives for them."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    from powerinfer.server.app import create_app
    from powerinfer.server.cli import make_state, parse_args
    from test_server import InProcessServer, post, wait_healthy
    args = parse_args(["-m", str(model_path), "-c", "128", "-t", "1", "-ctk", "q8_0", "-ctv", "q4_0"])
    state = make_state(args)
    state.llm = state.loader()
    state.ready.set()
    assert (state.llm.ctx.type_k, state.llm.ctx.type_v) == ("q8_0", "q4_0")
    srv = InProcessServer(create_app(state))
    try:
        wait_healthy(srv.base, timeout=30)
        r = post(srv.base, "/completion", {"prompt": "the cat", "n_predict": 6, "temperature": 0})
        assert r.status_code == 200, r.text
        got = r.json()["content"]
    finally:
        srv.close()
        state.llm.close()
    llm = pi.PowerInfer(model_path, n_ctx=128, n_threads=1, verbose=False, kv_type=("q8_0", "q4_0"))
    assert got == llm.create_completion("the cat", max_tokens=6, temperature=0)["choices"][0]["text"]
    llm.close()
