"""Constrained decoding (powerinfer.grammar, llguidance): GBNF and JSON schemas in the sampler, the
Python API, the server (the official `openai` client, /completion), tools by schema; the samplers we
lack refused with the parameter's name; llama-cpp-python's logits_processor / stopping_criteria /
echo logprobs. The model is the tiny random llama (byte tokens: any text can be spelled), whose
unconstrained output is noise, so a reply that matches its grammar shows the constraint at work.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import powerinfer as pi  # noqa: E402
from powerinfer.grammar import Grammar, GrammarError, GrammarMatcher  # noqa: E402
from powerinfer.sampling import Sampler, SamplingParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
YES_NO = 'root ::= answer "." \nanswer ::= "yes" | "no" | "maybe"'


@pytest.fixture(scope="module")
def model_file(tiny_model):
    return tiny_model("f32", seed=1)


@pytest.fixture(scope="module")
def llm(model_file):
    m = pi.PowerInfer(model_file, n_ctx=512, n_threads=1)
    yield m
    m.close()


# ------------------------------------------------------------------------------------------ sampler
def test_sampler_never_draws_a_banned_token():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=5000).astype(np.float32) * 3
    banned = np.ones(5000, dtype=bool)
    banned[[7, 4000, 4999]] = False
    s = Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    drawn = {s.sample(logits, banned) for _ in range(300)}
    assert drawn == {7, 4000, 4999}
    greedy = Sampler(SamplingParams(temperature=0))
    assert greedy.sample(logits, banned) == max((7, 4000, 4999), key=lambda i: logits[i])
    # a bias that bans every allowed token: the grammar still wins (raw argmax among the allowed)
    biased = Sampler(SamplingParams(temperature=0, logit_bias={7: -np.inf, 4000: -np.inf, 4999: -np.inf}))
    assert biased.sample(logits, banned) == max((7, 4000, 4999), key=lambda i: logits[i])


def test_matcher_mask_follows_the_grammar(model_file):
    m = pi.Model(model_file)
    tok = m.tokenizer
    gm = GrammarMatcher(Grammar.from_gbnf('root ::= "no"'), tok, m.n_vocab)
    text = b""
    while not gm.done:
        allowed = np.flatnonzero(~gm.banned())
        assert allowed.size and all(b"no".startswith(text + tok.token_to_piece(int(t))) for t in allowed)
        gm.accept(int(allowed[0]))
        text += tok.token_to_piece(int(allowed[0]))
    assert text == b"no"
    with pytest.raises(GrammarError):
        gm.accept(int(tok.encode("x", add_special=False)[-1]))


@pytest.mark.parametrize("bad", ['root ::= undefined_rule', 'root ::= "unterminated', ''])
def test_bad_grammars_raise(bad):
    with pytest.raises(GrammarError):
        Grammar.from_gbnf(bad)


def test_bad_schema_raises():
    with pytest.raises(GrammarError):
        Grammar.from_json_schema("{not json")
    with pytest.raises(GrammarError):
        Grammar.from_json_schema([1, 2])


# ------------------------------------------------------------------------------------------ Python API
def test_api_gbnf_constrains_every_seed(llm):
    free = llm.create_completion("Hello", max_tokens=12, temperature=1.0, seed=3)["choices"][0]["text"]
    assert not re.fullmatch(r"(yes|no|maybe)\.", free)       # the model alone writes noise
    for seed in range(6):
        r = llm.create_completion("Hello", max_tokens=12, temperature=1.0, seed=seed, grammar=YES_NO)
        assert re.fullmatch(r"(yes|no|maybe)\.", r["choices"][0]["text"]), r
        assert r["choices"][0]["finish_reason"] == "stop"
    r = llm.create_completion("Hello", max_tokens=12, temperature=0, grammar=Grammar.from_string(YES_NO))
    assert re.fullmatch(r"(yes|no|maybe)\.", r["choices"][0]["text"])


def test_api_json_schema_validates(llm):
    for seed in range(4):
        r = llm.create_chat_completion([{"role": "user", "content": "Describe someone."}], temperature=1.0,
                                       seed=seed, max_tokens=200,
                                       response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}})
        c = r["choices"][0]
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["message"]["content"]), SCHEMA)
    r = llm.create_completion("x", max_tokens=200, seed=1, response_format={"type": "json_object"})
    assert isinstance(json.loads(r["choices"][0]["text"]), dict)


def test_api_refuses_what_it_does_not_do(llm):
    for kw, name in ((dict(typical_p=-0.5), "typical_p"), (dict(mirostat_mode=3), "mirostat"),
                     (dict(tfs_z=0.9), "tfs_z"), (dict(samplers="ki"), "infill"), (dict(dry_base="x"), "dry_base")):
        with pytest.raises(ValueError, match=name):
            llm.create_completion("x", max_tokens=2, **kw)
    llm.create_completion("x", max_tokens=2, typical_p=1.0, mirostat_mode=0, tfs_z=1.0)   # the off values
    llm.create_completion("x", max_tokens=2, typical_p=0.5, mirostat_mode=2, xtc_probability=0.5)   # llama.cpp's
    with pytest.raises(TypeError):
        llm.create_completion("x", max_tokens=2, no_such_parameter=1)
    with pytest.raises(ValueError, match="grammar"):
        llm.create_completion("x", grammar="root ::= nope")
    with pytest.raises(ValueError, match="several"):
        llm.create_completion("x", grammar=YES_NO, response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="response_format"):
        llm.create_completion("x", response_format={"type": "xml"})


def test_logits_processor_and_stopping_criteria(llm):
    base = llm.create_completion("Hello", max_tokens=8, temperature=0)
    first = llm.last_result.tokens[0]
    seen = []

    def ban_first(input_ids, scores):
        seen.append(len(input_ids))
        scores[first] = -np.inf
        return scores
    llm.create_completion("Hello", max_tokens=8, temperature=0, logits_processor=[ban_first])
    assert first not in llm.last_result.tokens
    n_prompt = llm.last_result.n_prompt
    assert seen[:3] == [n_prompt, n_prompt + 1, n_prompt + 2]      # input_ids = prompt + generated so far
    llm.create_completion("Hello", max_tokens=8, temperature=0,
                          stopping_criteria=[lambda ids, logits: len(ids) >= n_prompt + 3])
    assert llm.last_result.n_predicted == 3
    assert base["choices"][0]["finish_reason"] == "length"


def test_echo_logprobs_cover_the_prompt(llm):
    prompt = "Hello world"
    toks = llm.tokenize_prompt(prompt)
    r = llm.create_completion(prompt, max_tokens=3, temperature=0, logprobs=2, echo=True)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(toks) + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    logits = llm.eval_logits(toks).astype(np.float64)
    ref = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    want = [ref[i - 1, toks[i]] for i in range(1, len(toks))]
    np.testing.assert_allclose(lp["token_logprobs"][1:len(toks)], want, rtol=1e-5, atol=1e-5)
    assert r["choices"][0]["text"].startswith(prompt)


def test_tools_by_schema_and_auto(llm):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    auto = llm.create_chat_completion(msgs, tools=tools, max_tokens=8)        # "auto": a reply, text here
    assert auto["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    r = llm.create_chat_completion(msgs, tools=tools, tool_choice="required", max_tokens=120, seed=2)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls", c
    call = c["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), tools[0]["function"]["parameters"])


# ------------------------------------------------------------------------------------------ server
@pytest.fixture(scope="module")
def server(model_file):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    from powerinfer.server.app import ServerState, create_app
    from test_server import InProcessServer, wait_healthy
    m = pi.PowerInfer(model_file, n_ctx=1024, n_parallel=2, n_threads=1)
    srv = InProcessServer(create_app(ServerState(model_path=str(model_file), llm=m)))
    wait_healthy(srv.base)
    yield srv.base
    srv.close()


def test_openai_client_json_schema_validates(server):
    from test_server import client
    c = client(server)
    for seed in range(3):
        r = c.chat.completions.create(model="any", messages=[{"role": "user", "content": "a person"}], seed=seed,
                                      max_tokens=200, temperature=1.0, response_format={
                                          "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    r = c.completions.create(model="any", prompt="x", max_tokens=200, seed=1,
                             extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(r.choices[0].text), dict)


def test_openai_client_tools(server):
    import openai
    from test_server import client
    c = client(server)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}}]
    msgs = [{"role": "user", "content": "1 + 2?"}]
    auto = c.chat.completions.create(model="any", messages=msgs, tools=tools, max_tokens=8)   # "auto": served
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        c.chat.completions.create(model="any", messages=msgs, tools=tools, tool_choice="sometimes")
    r = c.chat.completions.create(model="any", messages=msgs, tools=tools, max_tokens=100, seed=1,
                                  tool_choice={"type": "function", "function": {"name": "add"}})
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), tools[0]["function"]["parameters"])


def test_native_completion_gbnf_and_json_schema(server):
    from test_server import post
    for seed in range(3):
        r = post(server, "/completion", {"prompt": "Hi", "n_predict": 16, "seed": seed, "grammar": YES_NO})
        assert r.status_code == 200, r.text
        assert re.fullmatch(r"(yes|no|maybe)\.", r.json()["content"]), r.json()
        assert r.json()["stop_type"] == "eos"
    r = post(server, "/completion", {"prompt": "Hi", "n_predict": 200, "seed": 1, "json_schema": SCHEMA})
    jsonschema.validate(json.loads(r.json()["content"]), SCHEMA)
    # streamed: the pieces join into a match too
    r = post(server, "/completion", {"prompt": "Hi", "n_predict": 16, "seed": 5, "grammar": YES_NO, "stream": True})
    text = "".join(json.loads(line[6:])["content"] for line in r.text.splitlines() if line.startswith("data: "))
    assert re.fullmatch(r"(yes|no|maybe)\.", text)


@pytest.mark.parametrize("body,param", [
    ({"grammar": "root ::= nope"}, "grammar"),
    ({"json_schema": "{bad"}, "json_schema"),
    ({"grammar": 'root ::= "a"', "json_schema": {}}, "json_schema"),
    ({"typical_p": -1}, "typical_p"),
    ({"mirostat": 3}, "mirostat"),
    ({"dry_multiplier": "x"}, "dry_multiplier"),
    ({"xtc_probability": 2}, "xtc_probability"),
    ({"samplers": "tz"}, "samplers"),          # no sampler z
    ({"samplers": "ti"}, "samplers"),          # infill: not this chain's
    ({"tfs_z": 0.9}, "tfs_z"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
])
def test_server_refuses_with_the_parameter_named(server, body, param):
    from test_server import post
    for path, extra in (("/completion", {"prompt": "x", "n_predict": 2}),
                        ("/v1/completions", {"prompt": "x", "max_tokens": 2})):
        r = post(server, path, {**extra, **body})
        assert r.status_code == 400, (path, body, r.text)
        assert r.json()["error"]["param"] == param, r.json()


def test_server_accepts_the_off_values(server):
    from test_server import post
    off = {"typical_p": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "dry_multiplier": 0.0, "dry_base": 1.75,
           "xtc_probability": 0.0, "xtc_threshold": 0.1, "dynatemp_range": 0.0, "samplers": "edkypmxt",
           "tfs_z": 1.0, "top_n_sigma": -1, "grammar": ""}
    r = post(server, "/completion", {"prompt": "x", "n_predict": 2, **off})
    assert r.status_code == 200, r.text


def test_server_runs_llama_cpp_samplers(server):
    """llama.cpp's other samplers as request fields: applied (seeded runs repeat, settings echoed)."""
    from test_server import post
    body = {"prompt": "x", "n_predict": 12, "seed": 3, "ignore_eos": True, "typical_p": 0.9, "min_keep": 2,
            "top_n_sigma": 2.0, "xtc_probability": 0.5, "xtc_threshold": 0.05, "dynatemp_range": 0.3,
            "dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", "###"], "samplers": "edkypmxt"}
    a = post(server, "/completion", body)
    assert a.status_code == 200, a.text
    assert a.json()["content"] == post(server, "/completion", body).json()["content"]
    gs = a.json()["generation_settings"]
    assert (gs["typical_p"], gs["xtc_probability"], gs["dry_sequence_breakers"]) == (0.9, 0.5, ["\n", "###"])
    assert gs["samplers"] == ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    m = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 8, "mirostat": 2, "mirostat_tau": 3.0,
                                          "seed": 1})
    assert m.status_code == 200, m.text


# ------------------------------------------------------------------------------------------ llama-cpp-python parity
def test_llama_keywords_aliases_and_refusals(model_file):
    m = pi.PowerInfer(model_file, n_ctx=128, n_threads=1, verbose=False, type_k=0, type_v=0, pooling_type=3,
                      n_threads_batch=1, n_ubatch=512)
    assert m._kv_type == "f32" and m.pooling == "last"
    m.close()
    m = pi.PowerInfer(model_file, n_ctx=128, n_batch=64, n_threads=1, verbose=False, n_ubatch=16)
    assert m.ctx.n_batch == 16                   # n_ubatch: the most tokens one decode call computes
    m.close()
    m = pi.PowerInfer(model_file, n_ctx=128, n_threads=1, verbose=False, type_k=0, type_v="bf16")
    assert m._kv_type == ("f32", "bf16") and (m.ctx.type_k, m.ctx.type_v) == ("f32", "bf16")
    m.close()
    for kw, name in ((dict(chat_handler=object()), "chat_handler"), (dict(lora_path="a.gguf"), "LoRA adapter"),
                     (dict(type_k=12), "type_k"), (dict(type_v="q6_K"), "type_v"),
                     (dict(pooling_type=5), "pooling_type"),
                     (dict(rope_freq_base=-1.0), "rope_freq_base"), (dict(yarn_orig_ctx=-5), "yarn_orig_ctx")):
        with pytest.raises(ValueError, match=name):
            pi.PowerInfer(model_file, n_ctx=128, n_threads=1, **kw)


def test_llama_helper_methods(model_file):
    """llama-cpp-python's small methods: token_nl, n_embd, pooling_type, set_seed, set_cache (changes nothing),
    logits_to_logprobs, longest_token_prefix, create_chat_completion_openai_v1 (the openai package's types)."""
    m = pi.PowerInfer(model_file, n_ctx=128, n_threads=1, verbose=False, pooling_type=3)
    assert m.detokenize([m.token_nl()]) == "\n" and m.n_embd() == m.model.hparams.n_embd
    assert m.pooling_type() == 3
    m.set_seed(7)
    a = m("Once", max_tokens=6, temperature=1.0)["choices"][0]["text"]
    m.set_seed(7)
    assert m("Once", max_tokens=6, temperature=1.0)["choices"][0]["text"] == a
    m.set_cache(object())
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    lp = m.logits_to_logprobs(x)
    assert np.allclose(np.exp(lp).sum(axis=-1), 1.0) and np.allclose(lp[1], -np.log(3))
    assert m.longest_token_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and m.longest_token_prefix([], [1]) == 0
    openai = pytest.importorskip("openai")
    msgs = [{"role": "user", "content": "hi"}]
    out = m.create_chat_completion_openai_v1(messages=msgs, max_tokens=4, temperature=0)
    assert isinstance(out, openai.types.chat.ChatCompletion)
    assert out.choices[0].message.content == m.create_chat_completion(msgs, max_tokens=4, temperature=0)[
        "choices"][0]["message"]["content"]
    chunks = list(m.create_chat_completion_openai_v1(messages=msgs, max_tokens=4, temperature=0, stream=True))
    assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content
    m.close()


def test_save_and_load_state(model_file):
    import pickle
    m = pi.PowerInfer(model_file, n_ctx=256, n_parallel=2, n_threads=1, verbose=False)
    a = m.create_completion("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"]
    st = pickle.loads(pickle.dumps(m.save_state()))
    assert [len(c) for c in st.slots] == [m.last_result.n_past, 0]
    m.eval_logits(m.tokenize("x"))                       # clears the KV cache
    m.load_state(st)
    b = m.create_completion("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"]
    assert a == b and m.last_result.n_cached == m.last_result.n_prompt - 1     # the restored KV was reused
    other = pi.PowerInfer(model_file, n_ctx=128, n_threads=1, verbose=False)
    with pytest.raises(ValueError, match="n_ctx"):
        other.load_state(st)
    other.close()
    m.close()


def test_from_pretrained_glob_picks_one_file():
    from powerinfer.hub import HubError, pick_model_file
    files = ["a/model-Q4_K_M.gguf", "a/model-Q8_0.gguf", "README.md"]
    assert pick_model_file(files, "*Q4_K_M.gguf") == "a/model-Q4_K_M.gguf"
    with pytest.raises(HubError, match="2 files"):
        pick_model_file(files, "*.gguf")
    assert callable(pi.PowerInfer.from_pretrained)
