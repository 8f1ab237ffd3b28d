"""The HTTP server (examples/server.py, powerinfer.server) and the engine behind it.

Drives a real server process with the official `openai` client and with raw HTTP (httpx): OpenAI
and native routes, streaming, error envelopes, API keys, the bit-exactness of continuous batching
(4 concurrent requests through -np 4 equal the same requests run one at a time, logprobs
included), a bounded load test, and cancellation when a client disconnects.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402
from helpers import reaped  # noqa: E402
from powerinfer.server.app import ServerState, create_app  # noqa: E402

SHAPE = dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
KEY = "sk-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, timeout: float = 60.0, proc=None) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{proc.stderr.read()}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError("server did not become healthy")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("srv")
    # f32 weights: no activation quantization to hide last-bit differences (see test_concurrent_equals_alone)
    write_model(d / "tiny-f32.gguf", dtype="f32", **SHAPE)
    write_model(d / "tiny-q8_0.gguf", dtype="q8_0", **SHAPE)
    return d


@pytest.fixture(scope="module")
def server(models):
    """examples/server.py as a subprocess: 4 slots of 512 tokens."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLAMA_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "server.py"), "-m", str(models / "tiny-f32.gguf"), "--port", str(port),
         "-np", "4", "-c", "2048", "-t", "1", "--vram-budget", "2", "-a", "tiny"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc=proc)
        yield base
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        server.stderr = err


class InProcessServer:
    """uvicorn in a thread, on a socket bound here (so the port is known before it starts)."""

    def __init__(self, app):
        import uvicorn
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def serve_model(path, *, pooling=None, **state) -> InProcessServer:
    """An in-process server of the model at path (2 slots of 256 tokens, one thread), ServerState's flags as given."""
    llm = pi.PowerInfer(path, n_ctx=512, n_parallel=2, n_threads=1, pooling=pooling)
    srv = InProcessServer(create_app(ServerState(model_path=str(path), llm=llm, **state)))
    wait_healthy(srv.base)
    return srv


@pytest.fixture(scope="module")
def keyed(models):
    """An in-process server that requires an API key."""
    path = models / "tiny-q8_0.gguf"
    llm = pi.PowerInfer(path, n_ctx=512, n_parallel=2, n_threads=1)
    srv = InProcessServer(create_app(ServerState(model_path=str(path), api_keys=[KEY], llm=llm)))
    wait_healthy(srv.base)
    yield srv.base
    srv.close()


def client(base, key="sk-no-key-required"):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=30)


_HTTP = httpx.Client(limits=httpx.Limits(max_connections=32), timeout=30)   # one pool: clients are costly


def post(base, path, body=None, content=None, **kw):
    return _HTTP.post(base + path, json=body, content=content, **kw)


def get(base, path, **kw):
    return _HTTP.get(base + path, **kw)


# ---------------------------------------------------------------------------------------------- basics
def test_startup_health_models(server):
    r = get(server, "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["slots_idle"] == 4
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    props = get(server, "/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 512


def test_openai_chat(server):
    c = client(server)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0)
    ch = r.choices[0]
    assert r.object == "chat.completion" and r.model == "tiny" and ch.message.role == "assistant"
    assert ch.finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens <= 8
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(k.choices[0].delta.content or "" for k in chunks if k.choices)
    assert text == ch.message.content
    finals = [k for k in chunks if k.choices and k.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == ch.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert len({k.id for k in chunks}) == 1


def test_openai_completions(server):
    c = client(server)
    r = c.completions.create(model="tiny-f32.gguf", prompt="Once upon a time", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 10
    text = "".join(k.choices[0].text for k in c.completions.create(model="tiny", prompt="Once upon a time",
                                                                  max_tokens=10, temperature=0, stream=True))
    assert text == r.choices[0].text
    # the raw stream ends with [DONE]
    with _HTTP.stream("POST", server + "/v1/completions", json={"prompt": "a", "max_tokens": 3, "stream": True},
                      timeout=30) as s:
        events = [line for line in s.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    e = c.completions.create(model="tiny", prompt="the cat", max_tokens=4, temperature=0, echo=True, logprobs=2,
                             extra_body={"ignore_eos": True})
    # echo: the prompt's tokens come first (the first has no logprob), as llama-cpp-python returns them
    lp = e.choices[0].logprobs.token_logprobs
    assert e.choices[0].text.startswith("the cat") and len(lp) == e.usage.prompt_tokens + 4
    assert lp[0] is None and all(isinstance(x, float) for x in lp[1:])


def test_native_completion(server):
    body = {"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "ignore_eos": True}
    r = post(server, "/completion", body)
    assert r.status_code == 200
    j = r.json()
    for k in ("content", "stop", "model", "tokens_predicted", "tokens_evaluated", "generation_settings", "prompt",
              "stopped_eos", "stopped_word", "stopped_limit", "stopping_word", "tokens_cached", "timings"):
        assert k in j, k
    assert j["stop"] is True and j["stopped_limit"] and j["tokens_predicted"] == 12 and j["model"] == "tiny"
    assert j["prompt"] == "Once upon a time" and j["generation_settings"]["n_predict"] == 12
    for k in ("prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
              "predicted_per_token_ms", "predicted_per_second"):
        assert k in j["timings"], k
    assert j["timings"]["predicted_n"] == 12
    with _HTTP.stream("POST", server + "/completion", json={**body, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        raw = s.read().decode()
    events = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == j["content"]
    assert events[-1]["timings"]["predicted_n"] == 12 and "[DONE]" not in raw
    # a token-array prompt, a stop word, n_predict 0
    toks = post(server, "/tokenize", {"content": "Once upon a time", "add_special": True}).json()["tokens"]
    assert post(server, "/completion", {**body, "prompt": toks}).json()["content"] == j["content"]
    if len(j["content"]) > 4:
        w = j["content"][2:4]
        r2 = post(server, "/completion", {**body, "stop": [w]}).json()
        assert r2["stopped_word"] and r2["stopping_word"] == w and r2["content"] == j["content"][:j["content"].find(w)]
    r0 = post(server, "/completion", {**body, "n_predict": 0}).json()
    assert r0["content"] == "" and r0["tokens_predicted"] == 0


def test_tokenize_detokenize(server):
    t = post(server, "/tokenize", {"content": "hello world"}).json()["tokens"]
    assert t and all(isinstance(x, int) for x in t)
    assert post(server, "/detokenize", {"tokens": t}).json()["content"] == "hello world"
    pieces = post(server, "/tokenize", {"content": "hello", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == post(server, "/tokenize", {"content": "hello"}).json()["tokens"]


# ---------------------------------------------------------------------------------------------- errors
LONG = " ".join(["the"] * 600)     # > 512 tokens: longer than a slot's context

ERRORS = [
    ("/v1/completions", None, b"{not json", 400, "invalid_json"),
    ("/v1/chat/completions", None, b"[1, 2]", 400, "invalid_json"),
    ("/completion", None, "{\"prompt\": \"\u00e9\"".encode(), 400, "invalid_json"),
    ("/completion", None, b"\xff\xfe{}", 400, "invalid_json"),
    ("/completion", None, b"[" * 100000 + b"]" * 100000, 400, "invalid_json"),
    ("/completion", None, b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", 400, "invalid_json"),
    ("/completion", {"prompt": "x", "temperature": None, "top_k": 1.5}, None, 400, None),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, None, 400, None),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, None, 400, None),
    ("/v1/completions", {"prompt": 5}, None, 400, None),
    ("/v1/completions", {}, None, 400, None),
    ("/v1/chat/completions", {"messages": "hi"}, None, 400, None),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, None, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, None, 400, None),
    ("/completion", {"prompt": "x", "stop": 5}, None, 400, None),
    ("/completion", {"prompt": "x", "n_predict": -5}, None, 400, None),
    ("/completion", {"prompt": [1, 99999]}, None, 400, None),
    ("/completion", {"prompt": "x", "top_p": -1}, None, 400, None),
    ("/completion", {"prompt": LONG}, None, 400, "context_length_exceeded"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, None, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, None, 400, None),
    ("/v1/completions", {"prompt": "x", "max_tokens": -3}, None, 400, None),
    ("/v1/completions", {"prompt": "x", "n": 0}, None, 400, None),
    ("/v1/completions", {"model": 7, "prompt": "x"}, None, 400, None),      # any name is fine, not any type
    ("/detokenize", {"tokens": [1, "a"]}, None, 400, None),
    ("/detokenize", {"tokens": [-1]}, None, 400, None),
    ("/tokenize", {"content": 3}, None, 400, None),
    ("/no/such/route", {}, None, 404, None),
    # lone UTF-16 surrogates are valid JSON but not text: 400 from whichever field holds one
    ("/completion", {"prompt": "\ud800"}, None, 400, "invalid_json"),
    ("/completion", {"prompt": "\ud800", "stream": True}, None, 400, "invalid_json"),
    ("/completion", {"prompt": "x", "stop": ["ok", "\udfff"]}, None, 400, "invalid_json"),
    ("/v1/completions", {"model": "\ud800", "prompt": "x"}, None, 400, "invalid_json"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\udc00b"}]}, None, 400, "invalid_json"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True,
                              "stop": "\ud83d"}, None, 400, "invalid_json"),
    ("/tokenize", {"content": "\ud800"}, None, 400, "invalid_json"),
    ("/completion", None, b'{"prompt": "x", "\\ud800": 1}', 400, "invalid_json"),
    # chat_template_kwargs may add variables, not replace the renderer's own
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template_kwargs": {"add_generation_prompt": False}}, None, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template_kwargs": {"messages": []}}, None, 400, None),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template_kwargs": {"bos_token": "<x>"}}, None, 400, None),
]


@pytest.mark.parametrize("path,body,raw,status,code", ERRORS)
def test_bad_requests_get_4xx_envelopes(server, path, body, raw, status, code):
    if body is not None:        # json.dumps escapes lone surrogates (\ud800); httpx's own encoder cannot
        raw = json.dumps(body).encode()
    r = post(server, path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str) and "code" in err
    if code:
        assert err["code"] == code
    assert get(server, "/health").json()["status"] == "ok"


def test_openai_client_errors(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt=LONG, max_tokens=4)
    assert e.value.code == "context_length_exceeded"


# ---------------------------------------------------------------------------------------------- API key
def test_api_key(keyed):
    assert get(keyed, "/health").status_code == 200          # public
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        client(keyed, "wrong").chat.completions.create(model="tiny-q8_0.gguf", messages=msgs, max_tokens=2)
    r = post(keyed, "/completion", {"prompt": "x", "n_predict": 2})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    ok = client(keyed, KEY)
    r = ok.chat.completions.create(model="tiny-q8_0", messages=msgs, max_tokens=2, temperature=0)
    assert r.choices[0].message.role == "assistant"
    chunks = list(ok.chat.completions.create(model="tiny-q8_0.gguf", messages=msgs, max_tokens=2, stream=True,
                                             temperature=0))
    assert "".join(k.choices[0].delta.content or "" for k in chunks) == r.choices[0].message.content
    assert ok.completions.create(model="tiny-q8_0.gguf", prompt="a", max_tokens=2).usage.completion_tokens <= 2
    # no max_tokens: until the end of text or a full slot (256 tokens here)
    r = ok.chat.completions.create(model="tiny-q8_0", messages=msgs, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == 256 + 1
    r = post(keyed, "/completion", {"prompt": "x", "n_predict": 2}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    # CORS: preflight without a key, and CORS headers on responses
    pre = _HTTP.options(keyed + "/v1/chat/completions", headers={
        "Origin": "http://example.com", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] in ("*", "http://example.com")
    assert get(keyed, "/health", headers={"Origin": "http://x.org"}).headers["access-control-allow-origin"] == "*"


def test_health_503_while_loading(models):
    release = threading.Event()
    path = models / "tiny-q8_0.gguf"

    def loader():
        release.wait(10)
        return pi.PowerInfer(path, n_ctx=256, n_threads=1)
    srv = InProcessServer(create_app(ServerState(model_path=str(path), loader=loader)))
    try:
        for _ in range(100):
            try:
                r = get(srv.base, "/health")
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        assert r.status_code == 503 and r.json()["status"] == "loading model"
        r = post(srv.base, "/v1/completions", {"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        assert get(srv.base, "/v1/models").json()["data"][0]["id"] == "tiny-q8_0.gguf"
        release.set()
        wait_healthy(srv.base, timeout=20)
        assert post(srv.base, "/completion", {"prompt": "x", "n_predict": 2}).status_code == 200
    finally:
        release.set()
        srv.close()


# ---------------------------------------------------------------------------------------------- batching
PROMPTS = [
    ("Once upon a time there was", 40),
    ("the cat", 25),
    ("hello world, this is a much longer prompt that takes a few more tokens to process", 33),
    ("a", 47),
]


def _native(base, prompt, n, **kw):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "n_probs": 2, **kw}
    r = post(base, "/completion", body)
    assert r.status_code == 200, r.text
    j = r.json()
    return j["content"], j["completion_probabilities"]


def test_concurrent_equals_alone(server):
    """Greedy outputs (text and logprobs, bit for bit) of 4 concurrent requests through -np 4 equal
    the same requests run one at a time. The lengths differ, so requests finish at different times
    and later tokens of the others are decoded in batches of changing composition."""
    alone = [_native(server, p, n, cache_prompt=False) for p, n in PROMPTS]
    before = get(server, "/props").json()["engine"]["max_batch_slots"]
    with ThreadPoolExecutor(4) as ex:
        for _ in range(2):
            together = list(ex.map(lambda pn: _native(server, *pn), PROMPTS))
            assert [t for t, _ in together] == [t for t, _ in alone]
            assert together == alone
    seeded = [dict(temperature=0.9, seed=7 + i) for i in range(4)]
    alone_s = [_native(server, p, n, **s) for (p, n), s in zip(PROMPTS, seeded)]
    with ThreadPoolExecutor(4) as ex:
        assert list(ex.map(lambda a: _native(server, *a[0], **a[1]), zip(PROMPTS, seeded))) == alone_s
    after = get(server, "/props").json()["engine"]["max_batch_slots"]
    assert after >= 2, (before, after)     # requests really were decoded together


def test_load_200_requests_16_clients(server):
    def one(i):
        kind = i % 4
        try:
            if kind == 0:
                r = post(server, "/completion", {"prompt": f"request {i}", "n_predict": 4})
                return r.status_code == 200 and r.json()["stop"] is True
            if kind == 1:
                r = post(server, "/v1/completions", {"model": "tiny", "prompt": f"number {i}", "max_tokens": 4})
                return r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
            if kind == 2:
                r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": f"hi {i}"}],
                                                          "max_tokens": 4})
                return r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
            with _HTTP.stream("POST", server + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": f"yo {i}"}], "max_tokens": 4, "stream": True}) as s:
                lines = [x for x in s.iter_lines() if x]
            return s.status_code == 200 and lines[-1] == "data: [DONE]"
        except Exception as e:  # noqa: BLE001 - counted as a failure
            return repr(e)

    t0 = time.time()
    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(200)))
    failed = [r for r in results if r is not True]
    assert not failed, failed[:5]
    assert time.time() - t0 < 40
    h = get(server, "/health").json()
    assert h["status"] == "ok"


def test_disconnect_frees_the_slot(server):
    body = {"prompt": "Once upon a time", "n_predict": -1, "ignore_eos": True, "stream": True, "cache_prompt": False}
    with _HTTP.stream("POST", server + "/completion", json=body) as s:
        it = s.iter_lines()
        got = 0
        for line in it:
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
        busy = [x for x in get(server, "/slots").json() if x["is_processing"]]
        assert len(busy) == 1
    # the client is gone: the slot is released long before its 512-token context would fill up
    t0 = time.time()
    while time.time() - t0 < 10:
        slots = get(server, "/slots").json()
        if not any(x["is_processing"] for x in slots):
            break
        time.sleep(0.02)
    slot = next(x for x in slots if x["id"] == busy[0]["id"])
    assert not slot["is_processing"] and slot["n_cached"] < 500
    assert get(server, "/health").json()["slots_idle"] == 4


# ---------------------------------------------------------------------------------------------- engine / API
def test_api_completion_shapes_and_inline_batching(models):
    llm = pi.PowerInfer(models / "tiny-f32.gguf", n_ctx=512, n_parallel=2, n_threads=1)
    r = llm("Once upon a time", max_tokens=7, temperature=0, ignore_eos=True)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and isinstance(r["created"], int)
    (c,) = r["choices"]
    assert c["finish_reason"] == "length" and c["logprobs"] is None and r["usage"]["completion_tokens"] == 7
    assert c["text"] == llm.generate("Once upon a time", max_tokens=7, temperature=0, ignore_eos=True)
    chunks = list(llm.create_completion("Once upon a time", max_tokens=7, temperature=0, ignore_eos=True, stream=True))
    assert "".join(k["choices"][0]["text"] for k in chunks) == c["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # two streams consumed alternately share decode steps in the inline engine
    a = llm.create_completion("the cat", max_tokens=9, temperature=0, ignore_eos=True, stream=True)
    b = llm.create_completion("a dog", max_tokens=9, temperature=0, ignore_eos=True, stream=True)
    ta = tb = ""
    for ca, cb in zip(a, b):
        ta += ca["choices"][0]["text"]
        tb += cb["choices"][0]["text"]
    ta += "".join(k["choices"][0]["text"] for k in a)
    tb += "".join(k["choices"][0]["text"] for k in b)
    assert llm.engine.max_batch_slots == 2
    assert ta == llm("the cat", max_tokens=9, temperature=0, ignore_eos=True)["choices"][0]["text"]
    assert tb == llm("a dog", max_tokens=9, temperature=0, ignore_eos=True)["choices"][0]["text"]
    # an abandoned stream releases its slot
    s = llm.create_completion("x", max_tokens=50, stream=True)
    next(s)
    s.close()
    assert not llm.engine.busy()
    with pytest.raises(ValueError, match="context"):
        llm.create_completion(LONG)


def test_inline_engine_is_bit_exact_with_staggered_requests(models):
    """Requests of different lengths start and finish at different times, so slots are reused while
    others run and lower regions get filled on demand: every request still equals a solo run,
    logprobs included (f32 weights show any change in summation order)."""
    path = models / "tiny-f32.gguf"
    solo = pi.PowerInfer(path, n_ctx=128, n_threads=1)
    llm = pi.PowerInfer(path, n_ctx=384, n_parallel=3, n_threads=1)
    jobs = [("Once upon a time", 30), ("the", 5), ("hello world and more words here", 12), ("a b c", 20),
            ("story time", 9), ("x", 25)]

    def run(m, p, n):
        return m.create_completion(p, max_tokens=n, temperature=0, ignore_eos=True, logprobs=1, stream=True)

    def collect(chunks):
        return [(c["choices"][0]["text"], c["choices"][0]["logprobs"]) for c in chunks]
    want = [collect(run(solo, p, n)) for p, n in jobs]
    queue, live, got = list(enumerate(jobs)), {}, {}
    while queue or live:
        while queue and len(live) < 3:
            i, (p, n) = queue.pop(0)
            live[i] = (run(llm, p, n), [])
        for i in list(live):
            it, acc = live[i]
            c = next(it, None)
            if c is None:
                got[i] = acc
                del live[i]
            else:
                acc.append((c["choices"][0]["text"], c["choices"][0]["logprobs"]))
    assert [got[i] for i in range(len(jobs))] == want
    assert llm.engine.max_batch_slots == 3 and llm.engine.n_filler_tokens > 0


def test_logit_bias_non_ascii_digit_keys_are_text(server):
    """"²" and "٣" pass str.isdigit() but are not token ids: they are text keys (tokenized), not a 500."""
    for key in ("\u00b2", "\u0663", "12\u00b2"):
        r = post(server, "/completion", {"prompt": "x", "n_predict": 1, "logit_bias": {key: 1.0}})
        assert r.status_code == 200, r.text
        r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1, "logit_bias": [[key, 2.0]]})
        assert r.status_code == 200, r.text


def test_large_tokenize_bodies_are_handled_off_the_event_loop(models, monkeypatch):
    """Parsing a large body, tokenizing, detokenizing and rendering the answer run in worker
    threads, so one 2 MB request does not stall /health (checked by thread, not by timing)."""
    import powerinfer.server.protocol as protocol     # the request-body reader of every route
    path = models / "tiny-q8_0.gguf"
    llm = pi.PowerInfer(path, n_ctx=256, n_threads=1)
    seen: dict[str, set] = {"parse": set(), "encode": set(), "detokenize": set()}
    parse, encode, detok = protocol._parse_body, llm.tokenizer.encode, llm.detokenize

    def spy(kind, fn):
        def wrapped(*a, **kw):
            seen[kind].add(threading.current_thread().name)
            return fn(*a, **kw)
        return wrapped
    monkeypatch.setattr(protocol, "_parse_body", spy("parse", parse))
    llm.tokenizer.encode = spy("encode", encode)
    llm.detokenize = spy("detokenize", detok)
    srv = InProcessServer(create_app(ServerState(model_path=str(path), llm=llm)))
    try:
        wait_healthy(srv.base)
        text = "the cat sat on the mat. " * 4000        # ~100 KB: parsed off the loop too
        r = post(srv.base, "/tokenize", {"content": text, "with_pieces": True})
        assert r.status_code == 200, r.text
        toks = [t["id"] for t in r.json()["tokens"]]
        r = post(srv.base, "/detokenize", {"tokens": toks})
        assert r.status_code == 200 and r.json()["content"].strip() == text.strip()
        r = post(srv.base, "/detokenize", {"tokens": toks + [10**9]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    finally:
        srv.close()
    loop_thread = srv.thread.name
    for kind, threads in seen.items():
        assert threads and loop_thread not in threads, (kind, threads, loop_thread)


def test_sigint_exits_cleanly(models):
    """Ctrl+C (SIGINT) stops the server with status 0 and no traceback."""
    import signal
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bindings"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "server.py"), "-m", str(models / "tiny-q8_0.gguf"),
                             "--port", str(port), "-t", "1", "-c", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with reaped(proc):
        wait_healthy(f"http://127.0.0.1:{port}", proc=proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
