"""Server features next to completions: embeddings (/v1/embeddings through the official `openai`
client, /embedding), /metrics, /slots, any `model` name, the chat template a Gemma-like vocabulary
gets, and the flags that switch them (--embedding, --pooling, --metrics, --no-slots, --no-webui).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import powerinfer as pi  # noqa: E402
from make_test_model import synthetic_vocab, write_model  # noqa: E402
from powerinfer.server.app import ServerState, create_app  # noqa: E402
from test_server import InProcessServer, client, free_port, get, post, serve_model, wait_healthy  # noqa: E402

SHAPE = dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
N_EMBD = SHAPE["n_embd"]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("feat") / "tiny-f32.gguf"
    write_model(path, dtype="f32", **SHAPE)
    return path


@pytest.fixture(scope="module")
def full(model_file):
    """--embedding --metrics (slots and the web page are on by default)."""
    srv = serve_model(model_file, embedding=True, metrics=True)
    yield srv.base
    srv.close()


@pytest.fixture(scope="module")
def plain(model_file):
    """The defaults: no embeddings, no metrics."""
    srv = serve_model(model_file)
    yield srv.base
    srv.close()


def cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ---------------------------------------------------------------------------------------------- embeddings
def test_openai_client_embeddings(full):
    c = client(full)
    texts = ["the cat sat on the mat", "the cat sat on the mat", "hello world, a different text"]
    r = c.embeddings.create(model="text-embedding-3-small", input=texts)      # the client asks for base64
    assert r.object == "list" and r.model == "tiny-f32.gguf" and [d.index for d in r.data] == [0, 1, 2]
    v = [d.embedding for d in r.data]
    assert all(len(x) == N_EMBD for x in v)
    assert abs(cos(v[0], v[1]) - 1.0) < 1e-6 and cos(v[0], v[2]) < 0.999
    assert all(abs(np.linalg.norm(x) - 1.0) < 1e-5 for x in v)                 # L2-normalized
    n_tokens = sum(len(get_tokens(full, t)) for t in texts)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens
    f = c.embeddings.create(model="x", input=texts[0], encoding_format="float")
    assert np.allclose(f.data[0].embedding, v[0], atol=1e-7)
    toks = get_tokens(full, texts[0])
    t = c.embeddings.create(model="x", input=toks)                            # token ids
    tt = c.embeddings.create(model="x", input=[toks, get_tokens(full, texts[2])])
    assert np.allclose(t.data[0].embedding, v[0], atol=1e-6) and np.allclose(tt.data[1].embedding, v[2], atol=1e-6)


def get_tokens(base, text) -> list[int]:
    return post(base, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]


def test_native_embedding_shape(full):
    r = post(full, "/embedding", {"content": "the cat"})
    assert r.status_code == 200, r.text
    (entry,) = r.json()
    assert entry["index"] == 0 and np.asarray(entry["embedding"]).shape == (1, N_EMBD)
    oai = post(full, "/v1/embeddings", {"input": "the cat", "encoding_format": "float"}).json()
    assert np.allclose(entry["embedding"][0], oai["data"][0]["embedding"])
    raw = post(full, "/embedding", {"content": ["the cat", "a dog"], "embd_normalize": -1}).json()
    assert len(raw) == 2 and abs(np.linalg.norm(raw[0]["embedding"][0]) - 1.0) > 1e-3
    assert cos(raw[0]["embedding"][0], entry["embedding"][0]) > 1 - 1e-6


def test_pooling_none_and_last(model_file):
    srv = serve_model(model_file, embedding=True, pooling="none")
    try:
        r = post(srv.base, "/embedding", {"content": "the cat sat"})
        n = len(get_tokens(srv.base, "the cat sat"))
        assert np.asarray(r.json()[0]["embedding"]).shape == (n, N_EMBD)
        r = post(srv.base, "/v1/embeddings", {"input": "the cat"})
        assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]
    finally:
        srv.close()
    llm = pi.PowerInfer(model_file, n_ctx=512, n_threads=1, pooling="last")
    assert llm.embedder.pooling == "last"
    states = llm.embedder.hidden_states([get_tokens_local(llm, "the cat sat")])[0]
    assert np.allclose(llm.embed("the cat sat", normalize=False), states[-1])


def get_tokens_local(llm, text):
    return llm.tokenize(text, add_bos=True, special=True)


EMBED_ERRORS = [
    ({"input": []}, 400, None),
    ({"input": ""}, 400, None),
    ({"input": 5}, 400, None),
    ({"input": ["ok", 5]}, 400, None),
    ({"input": [[1, 2], [1, "x"]]}, 400, None),
    ({"input": [[1, 99999]]}, 400, None),
    ({"input": [1] * 300}, 400, "context_length_exceeded"),      # a slot holds 256 tokens
    ({}, 400, None),
    ({"input": "x", "encoding_format": "int8"}, 400, None),
    ({"input": "x", "dimensions": 32}, 400, None),
    ({"input": "x", "embd_normalize": -2}, 400, None),
    ({"input": ["x"] * 2049}, 400, None),
]


@pytest.mark.parametrize("body,status,code", EMBED_ERRORS)
def test_embedding_errors(full, body, status, code):
    r = post(full, "/v1/embeddings", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    if code:
        assert err["code"] == code
    assert post(full, "/v1/embeddings", {"input": "x", "dimensions": N_EMBD}).status_code == 200


def test_embeddings_off_by_default_say_so(plain):
    for path, body in (("/v1/embeddings", {"input": "x"}), ("/embedding", {"content": "x"})):
        r = post(plain, path, body)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert "--embeddings" in r.json()["error"]["message"]
    with pytest.raises(openai.APIStatusError) as e:
        client(plain).embeddings.create(model="x", input="x")
    assert e.value.status_code == 501


# ---------------------------------------------------------------------------------------------- model names
def test_any_model_name_is_served(full):
    c = client(full)
    assert [m.id for m in c.models.list().data] == ["tiny-f32.gguf"]
    for name in ("gpt-4o", "gpt-3.5-turbo", "llama3", ""):
        r = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert r.model == "tiny-f32.gguf"
        assert c.completions.create(model=name, prompt="x", max_tokens=2).model == "tiny-f32.gguf"
    r = post(full, "/v1/chat/completions", {"model": ["gpt-4"], "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


# ---------------------------------------------------------------------------------------------- metrics / slots
METRIC_RE = re.compile(r"^(llamacpp|powerinfer):(\w+) (\S+)$")


def metrics(base) -> dict[str, float]:
    r = get(base, "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            assert line.startswith(("# HELP ", "# TYPE "))
            continue
        m = METRIC_RE.match(line)
        assert m, line
        out[m.group(2)] = float(m.group(3))
    return out


def test_metrics_count_tokens(full):
    before = metrics(full)
    for k in ("prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_total",
              "tokens_predicted_seconds_total", "n_decode_total", "prompt_tokens_seconds",
              "predicted_tokens_seconds", "requests_processing", "requests_deferred", "requests_total"):
        assert k in before
    prompt = "metrics counting prompt, uncached 17"
    r = post(full, "/completion", {"prompt": prompt, "n_predict": 7, "ignore_eos": True, "cache_prompt": False}).json()
    after = metrics(full)
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == 7
    evaluated = r["tokens_evaluated"] - r["timings"]["cache_n"]
    assert evaluated > 0 and after["prompt_tokens_total"] - before["prompt_tokens_total"] == evaluated
    assert after["requests_total"] - before["requests_total"] == 1
    assert after["n_decode_total"] > before["n_decode_total"] and after["predicted_tokens_seconds"] > 0
    post(full, "/v1/embeddings", {"input": [[1, 2, 3], [4, 5]]})
    assert metrics(full)["prompt_tokens_total"] - after["prompt_tokens_total"] == 5


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """--metrics over a model large enough (14M f32 weights, a few ms a token) that 200 tokens outlast the requests
    made while they are generated: with the tiny model they were sometimes all done before the client left."""
    path = tmp_path_factory.mktemp("feat_slow") / "small-f32.gguf"
    write_model(path, dtype="f32", n_vocab=320, n_embd=512, n_ff=1536, n_head=8, n_head_kv=8, n_layer=4, seed=1)
    srv = serve_model(path, metrics=True)
    yield srv.base
    srv.close()


def test_slots_and_metrics_while_generating(slow):
    with httpx.stream("POST", slow + "/completion", json={"prompt": "busy", "n_predict": 200, "ignore_eos": True,
                                                           "stream": True, "temperature": 0.5, "top_k": 7},
                      timeout=30) as resp:
        it = resp.iter_lines()
        next(line for line in it if line.startswith("data: "))
        assert metrics(slow)["requests_processing"] == 1
        slots = get(slow, "/slots").json()
        busy = [s for s in slots if s["is_processing"]]
        assert len(slots) == 2 and len(busy) == 1
        s = busy[0]
        for k in ("id", "id_task", "n_ctx", "speculative", "is_processing", "params", "next_token", "prompt",
                  "n_past", "n_cached"):
            assert k in s
        assert s["n_ctx"] == 256 and s["params"]["top_k"] == 7 and s["params"]["temperature"] == 0.5
        assert s["params"]["n_predict"] == 200 and s["next_token"]["has_next_token"]
        assert get(slow, "/slots?fail_on_no_slot=1").status_code == 200       # one slot is still idle
    t0 = time.time()          # the client left: the server cancels the request on its next step
    while time.time() - t0 < 10:
        idle = [s for s in get(slow, "/slots").json() if s["id"] == busy[0]["id"]][0]
        if not idle["is_processing"]:
            break
        time.sleep(0.02)
    assert not idle["next_token"]["has_next_token"] and idle["id_task"] == busy[0]["id_task"]
    assert idle["next_token"]["n_decoded"] < 200


def test_metrics_off_and_no_slots(plain, model_file):
    r = get(plain, "/metrics")
    assert r.status_code == 501 and "--metrics" in r.json()["error"]["message"]
    post(plain, "/completion", {"prompt": "x", "n_predict": 3, "top_k": 9})
    last = [s for s in get(plain, "/slots").json() if "params" in s]        # the finished request, without --metrics
    assert len(last) == 1 and last[0]["params"]["top_k"] == 9 and not last[0]["is_processing"]
    srv = serve_model(model_file, slots=False, webui=False)
    try:
        r = get(srv.base, "/slots")
        assert r.status_code == 501 and "--slots" in r.json()["error"]["message"]
        assert get(srv.base, "/").status_code == 404
    finally:
        srv.close()


def test_server_flags_end_to_end(model_file, tmp_path):
    """examples/server.py parses and applies --embedding --pooling --metrics --no-slots --log-file."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLAMA_API_KEY", None)
    cmd = [sys.executable, str(ROOT / "examples" / "server.py"), "-m", str(model_file), "--port", str(port), "-t", "1",
           "-c", "512"]
    bad = subprocess.run(cmd + ["--pooling", "max"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "pooling must be" in bad.stderr
    bad = subprocess.run(cmd + ["--reranking"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1 and "needs a reranker model" in bad.stderr      # no classifier head in this file
    proc = subprocess.Popen(cmd + ["--embedding", "--pooling", "last", "--metrics", "--no-slots", "--log-file",
                                   str(tmp_path / "server.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc=proc)
        assert get(base, "/slots").status_code == 501 and get(base, "/metrics").status_code == 200
        got = post(base, "/v1/embeddings", {"input": "the cat", "encoding_format": "float"}).json()["data"][0]
        llm = pi.PowerInfer(model_file, n_ctx=512, n_threads=1)
        want = llm.embed("the cat", pooling="last")
        assert np.allclose(got["embedding"], want, atol=1e-5)
        assert cos(got["embedding"], llm.embed("the cat", pooling="mean")) < 0.999
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "embeddings: pooling last" in err
    assert "embeddings: pooling last" in (tmp_path / "server.log").read_text()


# ---------------------------------------------------------------------------------------------- serving flags
def test_api_prefix(model_file):
    """--api-prefix: every route under the prefix (the OpenAI client, the native routes), nothing outside it."""
    llm = pi.PowerInfer(model_file, n_ctx=512, n_parallel=2, n_threads=1)
    srv = InProcessServer(create_app(ServerState(model_path=str(model_file), llm=llm, api_prefix="/llm")))
    try:
        wait_healthy(srv.base + "/llm")
        assert get(srv.base, "/llm/health").json()["status"] == "ok"
        r = client(srv.base + "/llm").completions.create(model="x", prompt="the cat", max_tokens=3, temperature=0)
        assert r.usage.completion_tokens <= 3
        assert post(srv.base, "/llm/tokenize", {"content": "the cat"}).json()["tokens"]
        for path in ("/health", "/v1/models", "/llmx/health"):
            r = get(srv.base, path)
            assert r.status_code == 404 and "/llm" in r.json()["error"]["message"]
    finally:
        srv.close()


def test_context_shift(model_file):
    """--context-shift / --keep and a request's n_keep: a full slot (256 tokens here) drops the older half of its
    tokens and generation goes on; without it the request ends, truncated."""
    body = {"prompt": "the cat sat", "n_predict": 300, "temperature": 0, "ignore_eos": True}
    srv = serve_model(model_file)
    try:
        r = post(srv.base, "/completion", body).json()
        assert r["truncated"] and r["tokens_predicted"] < 256 and r["generation_settings"]["context_shift"] is False
    finally:
        srv.close()
    srv = serve_model(model_file, context_shift=True, n_keep=2)
    try:
        r = post(srv.base, "/completion", body).json()
        assert r["tokens_predicted"] == 300 and not r["truncated"] and r["generation_settings"]["n_keep"] == 2
        r = post(srv.base, "/completion", {**body, "n_keep": -1}).json()
        assert r["tokens_predicted"] == 300 and r["generation_settings"]["n_keep"] == -1
        bad = post(srv.base, "/completion", {**body, "n_keep": -2})
        assert bad.status_code == 400 and "n_keep" in bad.json()["error"]["message"]
    finally:
        srv.close()


def test_serving_flags_on_the_command_line(model_file, tmp_path):
    """examples/server.py: HTTPS with --ssl-key-file / --ssl-cert-file under an --api-prefix; -nocb refused; the
    flags that change nothing say so."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True, timeout=60)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLAMA_API_KEY", None)
    cmd = [sys.executable, str(ROOT / "examples" / "server.py"), "-m", str(model_file), "--port", str(port), "-t", "1",
           "-c", "512"]
    for extra, want in ((["-nocb"], "continuous batching is always on"), (["--ssl-key-file", str(key)], "go together"),
                        (["--api-prefix", "llm"], "a path like /llm"), (["--keep", "-2"], "--keep must be")):
        bad = subprocess.run(cmd + extra, capture_output=True, text=True, env=env, timeout=60)
        assert bad.returncode == 2 and want in bad.stderr, (extra, bad.stderr)
    proc = subprocess.Popen(cmd + ["--ssl-key-file", str(key), "--ssl-cert-file", str(cert), "--api-prefix", "/llm",
                                   "-cb", "--threads-http", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    base = f"https://127.0.0.1:{port}/llm"
    try:
        t0 = time.time()
        while time.time() - t0 < 60:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(base + "/health", verify=False, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(base + "/completion", json={"prompt": "the cat", "n_predict": 2}, verify=False, timeout=30)
        assert r.status_code == 200 and r.json()["tokens_predicted"] <= 2
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "-cb/--cont-batching is accepted for llama.cpp compatibility and changes nothing" in err
    assert "--threads-http is accepted" in err and "https://127.0.0.1" in err


# ---------------------------------------------------------------------------------------------- chat template
@pytest.fixture(scope="module")
def gemma_like(tmp_path_factory):
    """A vocabulary with Gemma's turn markers as control tokens and no tokenizer.chat_template (like the
    gemma-3-270m Q4_K_M file): every entry point must pick the gemma template, not chatml."""
    tokens, scores, types = synthetic_vocab(SHAPE["n_vocab"])
    tokens[-2:], types[-2:] = ["<start_of_turn>", "<end_of_turn>"], [3, 3]
    path = tmp_path_factory.mktemp("gemma") / "gemma-like.gguf"
    write_model(path, dtype="f32", vocab=(tokens, scores, types), **{k: v for k, v in SHAPE.items() if k != "n_vocab"},
                n_vocab=len(tokens))
    return path


def test_one_template_everywhere_for_a_gemma_vocabulary(gemma_like):
    llm = pi.PowerInfer(gemma_like, n_ctx=256, n_threads=1)
    assert llm.chat_formatter.name == "gemma"
    text, _, stops, stop_ids = llm.chat_prompt([{"role": "user", "content": "hi"}])
    assert text.startswith("<s><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")
    assert stop_ids == [SHAPE["n_vocab"] - 1] and "<|im_end|>" not in stops
    srv = InProcessServer(create_app(ServerState(model_path=str(gemma_like), llm=llm)))
    try:
        wait_healthy(srv.base)
        assert get(srv.base, "/props").json()["chat_format"] == "gemma"
        # /apply-template: the same text, no inference
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                    {"role": "user", "content": "again"}]
        r = post(srv.base, "/apply-template", {"messages": messages})
        assert r.status_code == 200 and r.json() == {"prompt": llm.chat_prompt(messages)[0]}, r.text
        assert r.json()["prompt"].endswith("again<end_of_turn>\n<start_of_turn>model\n")
        for bad in ({}, {"messages": "hi"}, {"messages": [{"role": "user", "content": "x"}],
                                             "chat_template_kwargs": {"messages": []}}):
            r = post(srv.base, "/apply-template", bad)
            assert r.status_code == 400 and "error" in r.json(), r.text
    finally:
        srv.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "main.py"), "-m", str(gemma_like), "-cnv", "-st",
                        "-p", "hi", "-n", "2", "-t", "1", "-c", "256"], capture_output=True, text=True, env=env,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert "chat template: gemma" in r.stderr
    # an explicit choice still wins, by name or Jinja text
    assert pi.PowerInfer(gemma_like, n_ctx=64, chat_format="chatml").chat_formatter.name == "chatml"
    assert pi.PowerInfer(gemma_like, n_ctx=64, chat_template="chatml").chat_formatter.name == "chatml"


def test_real_gemma_file_gets_gemma_everywhere(gemma_file):
    path = gemma_file
    llm = pi.PowerInfer(path, n_ctx=256, n_threads=2)
    assert "tokenizer.chat_template" not in llm.metadata and llm.chat_formatter.name == "gemma"
    r = llm.create_chat_completion([{"role": "user", "content": "Say hi"}], max_tokens=16, temperature=0)
    assert "<|im_end|>" not in r["choices"][0]["message"]["content"]
    assert len(llm.embed("hello")) == llm.model.hparams.n_embd



def test_llama_arg_environment_variables(model_file, monkeypatch):
    """llama.cpp's LLAMA_ARG_* variables (what its Docker images are configured with) set the flags they name; the
    command line wins; a bad value is an error naming the variable."""
    from powerinfer.server.cli import parse_args
    for k in [k for k in os.environ if k.startswith("LLAMA_ARG_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("LLAMA_ARG_MODEL", str(model_file))
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "1024")
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "2")
    monkeypatch.setenv("LLAMA_ARG_PORT", "9123")
    monkeypatch.setenv("LLAMA_ARG_EMBEDDINGS", "true")
    monkeypatch.setenv("LLAMA_ARG_ENDPOINT_SLOTS", "0")
    monkeypatch.setenv("LLAMA_ARG_TEMPERATURE", "0.25")
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q8_0")
    a = parse_args([])
    assert (a.model, a.ctx_size, a.parallel, a.port) == (str(model_file), 1024, 2, 9123)
    assert a.embedding is True and a.slots is False and a.sampling.temperature == 0.25
    assert a.kv_type == ("q8_0", "f16")
    b = parse_args(["-c", "256", "--temp", "0.9"])             # the command line wins
    assert b.ctx_size == 256 and b.sampling.temperature == 0.9 and b.parallel == 2
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "big")
    with pytest.raises(SystemExit) as e:
        parse_args([])
    assert e.value.code == 2
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "1024")
    monkeypatch.setenv("LLAMA_ARG_EMBEDDINGS", "maybe")
    with pytest.raises(SystemExit):
        parse_args([])
