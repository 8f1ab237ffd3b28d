"""gpt-oss (OpenAI's gpt-oss-20b / 120b; GGUF general.architecture "gpt-oss", llama.cpp's LLM_ARCH_OPENAI_MOE) on a
tiny random f32 file (tests/model_files.py, CONFIGS["gpt-oss"]) against the float64 reference (tests/reference_model.py,
written from llama.cpp's openai-moe.cpp graph): q/k/v and attention output biases, a sink logit per head, NEOX rope
with YaRN (factor 32 over 4096 positions), every other layer local (0 and 2 of 4; a window of 5 under a 16-token
prompt), post_attention_norm as the experts' pre-norm, 4 biased experts (2 used, top-k of the router's biased logits,
weighted by the softmax of the chosen) with the OAI SwiGLU (alpha 1.702, limit 7). llama.cpp itself runs the same
files in tests/compat/test_gptoss_vs_llama_cpp.py. The experts' MXFP4 weights (the released files' type) come from
separate work; these files are f32 (and Q8_0 in the compatibility test).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from helpers import (FLOAT_REL_RMS, KV_F16_REL_RMS, check_level, llama_cpp_logits, logits_all, logits_in_calls,
                     rel_rms)
from model_files import CONFIGS, make_weights, rewrite, write_arch_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer.chat import ChatFormatter, ChatTemplateError
from powerinfer.gguf_file import ModelLoadError

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]   # 16 > the window of 5
C = CONFIGS["gpt-oss"]
# What each feature changes in the tiny model's logits (rel. RMS of the reference without it against ours; measured at
# seeds 3, 5, 7, 11): sinks 0.40 .. 0.66, the SwiGLU's limit 0.32 .. 0.41, plain softmax gating 0.27 .. 0.36, every
# layer global 0.53 .. 0.71, odd layers local instead of even 0.61 .. 0.70, no YaRN 0.52 .. 0.56, no router bias
# 0.73 .. 0.94, no expert biases 0.44 .. 0.59, no attention output bias 0.79 .. 0.97; ours is 4.1e-7 .. 4.4e-7 from the
# reference, llama.cpp 5.2e-7 .. 5.7e-7 from ours (tests/compat/test_gptoss_vs_llama_cpp.py)
FEATURE_MIN = 1e-2


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    path = tmp_path_factory.mktemp("gptoss") / "tiny-gpt-oss.gguf"
    write_arch_model(path, "gpt-oss", seed=3)
    return path


def ctx_of(model, **kw):
    return pi.Context(model, n_ctx=64, kv_type=kw.pop("kv_type", "f32"), **kw)


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_matches_the_reference_at_every_level(gptoss, level):
    """At every ISA level this machine runs: the prompt in one call (attend_block) and token by token (attend) within
    FLOAT_REL_RMS of the float64 reference, and the scalar level's bits (the numeric contract)."""
    check_level(gptoss, level, ReferenceModel(gptoss).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_rows_do_not_depend_on_the_batch(gptoss):
    """The experts run over their routed rows through mul_mat and the attention's blocks give each query its own
    bits: the prompt in one call, 5 at a time, one at a time, and on 1 or 2 threads, the same logits."""
    model = pi.Model(gptoss)
    one = logits_all(ctx_of(model, n_threads=2), PROMPT)
    assert np.array_equal(logits_in_calls(ctx_of(model, n_threads=2), PROMPT, 5), one)
    assert np.array_equal(logits_in_calls(ctx_of(model, n_threads=1), PROMPT, 1), one)


def test_f16_kv_cache(gptoss):
    ours = logits_all(ctx_of(pi.Model(gptoss), kv_type="f16"), PROMPT)
    assert rel_rms(ours, ReferenceModel(gptoss).forward(PROMPT)) < KV_F16_REL_RMS


def _without(path, suffixes):
    """The reference with the given per-layer tensors (short names, e.g. "ffn_gate_inp.bias") left out."""
    ref = ReferenceModel(path)
    for L in ref.layers:
        for s in suffixes:
            del L[s]
    return ref


def test_each_feature_matters(gptoss):
    """The reference without each of gpt-oss's pieces is far from ours (FEATURE_MIN, 2e4 x the tolerance): no sinks,
    no SwiGLU limit, plain softmax gating (the chosen experts' probabilities over all experts, not renormalized),
    every layer global, odd layers local instead of even ones, no YaRN, and without the router's, the experts' or the
    attention output's biases."""
    ours = logits_all(ctx_of(pi.Model(gptoss)), PROMPT)
    assert rel_rms(ours, ReferenceModel(gptoss).forward(PROMPT)) < FLOAT_REL_RMS
    refs = {str(ch): ReferenceModel(gptoss, **ch) for ch in (dict(use_sinks=False), dict(swiglu_limit=1e9),
                                                            dict(expert_gating="softmax"), dict(n_swa=1000),
                                                            dict(yarn=False))}
    refs["odd layers local"] = ReferenceModel(gptoss, local_layers={1, 3})
    refs["router bias"] = _without(gptoss, ["ffn_gate_inp.bias"])
    refs["expert biases"] = _without(gptoss, ["ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"])
    refs["attn_output bias"] = _without(gptoss, ["attn_output.bias"])
    for what, ref in refs.items():
        err = rel_rms(ours, ref.forward(PROMPT))
        print(f"{what}: {err:.2e}")
        assert err > FEATURE_MIN, (what, err)


def test_hparams(gptoss):
    """What model.py makes of the file's keys (llama.cpp's llama_model_openai_moe)."""
    hp = pi.Model(gptoss).hparams
    assert (hp.arch, hp.rope_mode, hp.head_dim, hp.n_rot, hp.ffn_act) == ("gpt-oss", "neox", 64, 64, "swiglu_oai")
    assert hp.qkv_bias and hp.attn_out_bias and hp.attn_sinks and hp.expert_bias and not hp.post_norms
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff) == (C["n_expert"], C["n_expert_used"], C["n_ff_exp"])
    assert hp.n_swa == C["n_swa"] and hp.swa_pattern == 2
    assert [hp.is_swa_layer(i) for i in range(4)] == [True, False, True, False]
    assert (hp.rope_freq_base_swa, hp.rope_freq_scale_swa) == (C["rope_base"], 1 / 32)
    assert (hp.rope_scaling, hp.yarn_ext_factor, hp.yarn_orig_ctx, hp.rope_freq_scale) == ("yarn", 1.0, 4096, 1 / 32)
    assert (hp.swiglu_alpha, hp.swiglu_limit) == (1.702, 7.0) and hp.attn_scale == pytest.approx(1 / 8)


def test_local_rope_base(tmp_path, gptoss):
    """rope.freq_base_swa (llama.cpp's optional key) ropes the local layers with their own base: without YaRN, ours
    against the reference, which reads the same key; with YaRN, refused (the core's YaRN divisors are the global
    base's), naming the reason."""
    path = rewrite(gptoss, tmp_path / "swa-base.gguf", meta={"gpt-oss.rope.scaling.type": ("none", VT.STRING),
                                                               "gpt-oss.rope.freq_base_swa": (10000.0, VT.FLOAT32)})
    model = pi.Model(path)
    assert (model.hparams.rope_freq_base_swa, model.hparams.rope_freq_scale) == (10000.0, 1.0)
    ours = logits_all(ctx_of(model), PROMPT)
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < FLOAT_REL_RMS
    assert rel_rms(ours, ReferenceModel(path, rope_base_swa=C["rope_base"]).forward(PROMPT)) > FEATURE_MIN
    yarn = rewrite(gptoss, tmp_path / "swa-base-yarn.gguf", meta={"gpt-oss.rope.freq_base_swa": (10000.0, VT.FLOAT32)})
    with pytest.raises(ValueError, match="YaRN with a local-layer rope"):
        pi.Model(yarn)


@pytest.mark.parametrize("name,data,words", [
    ("blk.1.attn_sinks.weight", np.zeros(C["n_head"] + 1, np.float32), ["blk.1.attn_sinks.weight", "shape"]),
    ("blk.0.attn_sinks.weight", np.zeros(C["n_head"], np.float16), ["blk.0.attn_sinks.weight", "f32"]),
    ("blk.2.ffn_up_exps.bias", np.zeros((C["n_expert"], C["n_ff_exp"] + 1), np.float32),
     ["blk.2.ffn_up_exps.bias", "shape"]),
    ("blk.3.ffn_gate_inp.bias", np.zeros(C["n_expert"] + 1, np.float32), ["blk.3.ffn_gate_inp.bias", "shape"]),
    ("blk.0.attn_output.bias", np.zeros(C["n_embd"] - 1, np.float32), ["blk.0.attn_output.bias", "shape"]),
    ("blk.1.ffn_down_exps.bias", np.zeros((C["n_expert"], C["n_ff_exp"]), np.float32),
     ["blk.1.ffn_down_exps.bias", "shape"]),
])
def test_a_wrong_tensor_is_named(tmp_path, gptoss, name, data, words):
    """A tensor of the wrong shape or type: ModelLoadError (the core's PI_ERR_BAD_MODEL) naming it."""
    from gguf import GGMLQuantizationType as Q
    bad = rewrite(gptoss, tmp_path / "bad.gguf",
                  replace={name: (data, Q.F16 if data.dtype == np.float16 else Q.F32)})
    with pytest.raises(ModelLoadError) as e:
        pi.Model(bad)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("name", ["blk.2.attn_sinks.weight", "blk.0.ffn_down_exps.bias", "blk.3.attn_output.bias",
                                  "blk.1.attn_v.bias", "blk.1.post_attention_norm.weight"])
def test_a_missing_tensor_is_named(tmp_path, gptoss, name):
    with pytest.raises(ModelLoadError, match=name.replace("post_attention_norm", "ffn_norm").replace(".", r"\.")):
        pi.Model(rewrite(gptoss, tmp_path / "missing.gguf", drop=(name,)))


@pytest.mark.parametrize("key,words", [("gpt-oss.attention.sliding_window", ["gpt-oss.attention.sliding_window"]),
                                       ("gpt-oss.expert_count", ["gpt-oss.expert_count"])])
def test_a_missing_key_is_named(tmp_path, gptoss, key, words):
    with pytest.raises(ModelLoadError) as e:
        pi.Model(rewrite(gptoss, tmp_path / "nokey.gguf", meta={key: None}))
    for w in words:
        assert w in str(e.value)


def test_greedy_tokens_and_the_api(gptoss):
    """24 greedy tokens (past the window and the prompt: the KV cache's local layers) are the reference's; the API
    generates."""
    ctx = ctx_of(pi.Model(gptoss))
    ctx.decode(PROMPT[:4])
    ours = []
    for _ in range(24):
        ours.append(int(np.argmax(ctx.logits())))
        ctx.decode([ours[-1]])
    assert ours == ReferenceModel(gptoss).greedy(PROMPT[:4], 24)
    llm = pi.PowerInfer(gptoss, n_ctx=128, n_threads=1, verbose=False)
    out = llm.create_completion([1, 5, 9], max_tokens=8, temperature=0)
    assert llm.last_result.n_predicted == 8 or out["choices"][0]["finish_reason"] == "stop"


def test_seeds_match_the_reference(tmp_path):
    """Two more random files (other sinks, routings and clamped values) within the tolerance."""
    for seed in (5, 7):
        path = tmp_path / f"seed{seed}.gguf"
        write_arch_model(path, "gpt-oss", weights=make_weights("gpt-oss", seed))
        ours = logits_all(ctx_of(pi.Model(path)), PROMPT)
        assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < FLOAT_REL_RMS


HARMONY_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "openai-gpt-oss-120b.jinja"
CONV = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


def test_harmony_chat_template(tmp_path):
    """gpt-oss files carry OpenAI's harmony template (data/openai-gpt-oss-120b.jinja): our Jinja chat path renders it
    (system text as the developer's instructions, earlier answers in the final channel, reasoning_effort and tools
    through chat_template_kwargs), a reply ends at <|return|> or <|call|> (not at <|end|>, which also closes the
    reasoning message), and a chat request on a tiny gpt-oss file with it runs; its reply's analysis channel becomes
    reasoning_content and its final channel content (powerinfer.reasoning.HarmonySplitter), whole and streamed. An
    assistant message in harmony markup is refused by the template itself."""
    pytest.importorskip("jinja2")
    src = HARMONY_TEMPLATE.read_text()
    fmt = ChatFormatter.resolve({"tokenizer.chat_template": src}, bos_token="<|startoftext|>", eos_token="<|return|>")
    assert fmt.end_of_turn == ["<|return|>", "<|call|>"]
    text = fmt.render(CONV, reasoning_effort="high")
    assert text.startswith("<|start|>system<|message|>You are ChatGPT") and "Reasoning: high" in text
    assert "<|start|>developer<|message|># Instructions\n\nYou are terse." in text
    assert "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|end|>" in text
    assert text.endswith("<|start|>user<|message|>2+2?<|end|><|start|>assistant")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    assert "type get_weather = (_: {\ncity: string,\n}) => any;" in fmt.render(CONV[1:2], tools=tools)
    with pytest.raises(ChatTemplateError):
        fmt.render([{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "<|channel|>final<|message|>Hello!"}])
    path = tmp_path / "chat.gguf"
    write_arch_model(path, "gpt-oss", seed=3, chat_template=src)
    llm = pi.PowerInfer(path, n_ctx=2048, n_threads=1, verbose=False)
    assert llm.chat_formatter.end_of_turn == ["<|return|>", "<|call|>"]
    out = llm.create_chat_completion(CONV, max_tokens=4, temperature=0)
    assert out["choices"][0]["message"]["role"] == "assistant" and out["usage"]["prompt_tokens"] > 50
    g = ('root ::= "<|channel|>analysis<|message|>the user greets<|end|><|start|>assistant<|channel|>final'
         '<|message|>" ("hello" | "hi")')
    msg = llm.create_chat_completion(CONV[1:2], max_tokens=400, temperature=0, grammar=g)["choices"][0]["message"]
    assert msg["reasoning_content"] == "the user greets" and msg["content"] in ("hello", "hi")
    chunks = list(llm.create_chat_completion(CONV[1:2], max_tokens=400, temperature=0, grammar=g, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]


def test_mxfp4_experts_agree_with_llama_cpp(tmp_path):
    """The released files' layout: MXFP4 experts (powerinfer's MXFP4 kernels), Q8_0 attention and router: llama.cpp's
    logits (measured 7.7e-8: both quantize the activations to Q8_0 the same way) and the same top tokens."""
    path = tmp_path / "gpt-oss-mxfp4.gguf"
    write_arch_model(path, "gpt-oss", seed=3, dtype="q8_0", dtypes={"_exps": "mxfp4"})
    theirs = llama_cpp_logits(path, PROMPT)
    ours = logits_all(pi.Context(pi.Model(path), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    assert rel_rms(ours, theirs) < 1e-6, rel_rms(ours, theirs)
    assert np.array_equal(ours.argmax(axis=1), theirs.argmax(axis=1))


@pytest.mark.parametrize("stream", [False, True])
def test_harmony_tool_call_end_to_end(tmp_path, stream):
    """tool_choice "auto" on a gpt-oss file: a reply that calls a tool in harmony (the analysis, then a commentary
    message to=functions.NAME) is message.tool_calls with its analysis in reasoning_content; streamed, the same
    (the reply is held until its end: its channels are read there)."""
    pytest.importorskip("jinja2")
    from test_tools_auto import Force
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    path = tmp_path / "tools.gguf"
    write_arch_model(path, "gpt-oss", seed=3, chat_template=HARMONY_TEMPLATE.read_text())
    llm = pi.PowerInfer(path, n_ctx=2048, n_threads=1, verbose=False)
    reply = ('<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary '
             'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')
    ids = llm.tokenize(reply, add_bos=False, special=True)
    assert llm.tool_calls(tools, None).syntax == "harmony"
    r = llm.create_chat_completion([{"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=300,
                                   logits_processor=[Force(ids, llm.token_eos())], stream=stream, temperature=0)
    if stream:
        chunks = list(r)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        content = "".join(d.get("content") or "" for d in deltas) or None
        calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    else:
        msg = r["choices"][0]["message"]
        content, calls, finish = msg["content"], msg["tool_calls"], r["choices"][0]["finish_reason"]
        assert msg["reasoning_content"] == "Need it."
    assert finish == "tool_calls" and content is None
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
