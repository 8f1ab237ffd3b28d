"""Chat templates (powerinfer.chat): built-in renderings, GGUF templates in the Jinja sandbox,
fallbacks, and PowerInfer.create_chat_completion's shapes."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("jinja2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402
from powerinfer.chat import ChatFormatter, ChatTemplateError  # noqa: E402

CONV = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "U2"},
]


def test_chatml():
    f = ChatFormatter.builtin("chatml")
    assert f.render(CONV) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
                              "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
                              "<|im_start|>assistant\n")
    assert f.render(CONV[:2], add_generation_prompt=False) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
    assert f.end_of_turn == ["<|im_end|>"]


def test_llama2():
    f = ChatFormatter.builtin("llama-2", bos_token="<s>", eos_token="</s>")
    assert f.name == "llama2"
    assert f.render(CONV) == "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]"
    assert f.render([{"role": "user", "content": " hi "}]) == "<s>[INST] hi [/INST]"
    with pytest.raises(ChatTemplateError, match="alternate"):
        f.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_vicuna():
    f = ChatFormatter.builtin("vicuna", eos_token="</s>")
    assert f.render(CONV) == "S\n\nUSER: U1\nASSISTANT: A1</s>\nUSER: U2\nASSISTANT:"


def test_gemma():
    f = ChatFormatter.builtin("gemma", bos_token="<bos>", eos_token="<eos>")
    assert f.render(CONV) == ("<bos><start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
                              "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n")


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown chat format"):
        ChatFormatter.builtin("nope")


ZEPHYR_LIKE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('bad role ' + message['role']) }}{% endif %}"
    "{% if loop.index0 > 2 %}{% break %}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_gguf_template_is_used_with_helpers():
    meta = {"tokenizer.chat_template": ZEPHYR_LIKE}
    f = ChatFormatter.resolve(meta, bos_token="<s>", eos_token="</s>")
    assert f.name == "gguf"
    # loopcontrols ({% break %}): only the first three messages
    assert f.render(CONV) == "<|system|>\nS</s>\n<|user|>\nU1</s>\n<|assistant|>\nA1</s>\n<|assistant|>\n"
    with pytest.raises(ChatTemplateError, match="bad role tool"):
        f.render([{"role": "tool", "content": "x"}])
    f2 = ChatFormatter("{{ strftime_now('%Y') }}|{{ messages[0] | tojson }}|{{ bos_token }}", bos_token="<s>")
    out = f2.render([{"role": "user", "content": "é<b>"}])
    year, js, bos = out.split("|")
    assert len(year) == 4 and year.isdigit() and bos == "<s>"
    assert js == '{"role": "user", "content": "é<b>"}'      # no HTML escaping, no ASCII escaping


def test_explicit_choices_win_over_the_file():
    meta = {"tokenizer.chat_template": ZEPHYR_LIKE}
    assert ChatFormatter.resolve(meta, chat_format="vicuna").name == "vicuna"
    assert ChatFormatter.resolve(meta, chat_format="chatml", chat_template="{{ 'x' }}").render(CONV) == "x"


def test_missing_or_broken_template_falls_back_to_chatml(caplog):
    with caplog.at_level(logging.WARNING, logger="powerinfer"):
        f = ChatFormatter.resolve({})
    assert f.name == "chatml" and "no tokenizer.chat_template" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="powerinfer"):
        f = ChatFormatter.resolve({"tokenizer.chat_template": "{% for m in messages %}"})
    assert f.name == "chatml" and "does not parse" in caplog.text


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.append(1) }}",                       # immutable sandbox: no mutation
    "{{ cycler.__init__.__globals__ }}",
])
def test_sandbox_blocks_unsafe_templates(source):
    with pytest.raises(ChatTemplateError):
        ChatFormatter(source).render([{"role": "user", "content": "x"}])


def test_message_validation_and_text_parts():
    f = ChatFormatter.builtin("chatml")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert f.render(parts, add_generation_prompt=False) == "<|im_start|>user\nab<|im_end|>\n"
    for bad in ([], "hi", [{"content": "x"}], [{"role": "user", "content": 5}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]):
        with pytest.raises(ChatTemplateError):
            f.render(bad)


# ---- through PowerInfer ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "tiny.gguf"
    write_model(path, dtype="q8_0", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
    return path


def test_chat_prompt_tokens_have_one_bos(model_path):
    for fmt in ("chatml", "llama2", "vicuna"):
        llm = pi.PowerInfer(model_path, n_ctx=256, n_threads=1, chat_format=fmt)
        text, toks, _, _ = llm.chat_prompt(CONV)
        assert toks[0] == llm.token_bos() and toks.count(llm.token_bos()) == (2 if fmt == "llama2" else 1)
        assert text == llm.chat_formatter.render(CONV)


def test_create_chat_completion_shapes(model_path):
    llm = pi.PowerInfer(model_path, n_ctx=256, n_threads=1, chat_format="chatml", model_alias="tiny")
    msgs = [{"role": "user", "content": "hello there"}]
    r = llm.create_chat_completion(msgs, max_tokens=6, temperature=0, ignore_eos=True)
    assert r["object"] == "chat.completion" and r["model"] == "tiny" and r["id"].startswith("chatcmpl-")
    (choice,) = r["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert choice["logprobs"] is None and choice["index"] == 0
    u = r["usage"]
    assert u["completion_tokens"] == 6 and u["total_tokens"] == u["prompt_tokens"] + 6
    chunks = list(llm.create_chat_completion(msgs, max_tokens=6, temperature=0, ignore_eos=True, stream=True))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == choice["message"]["content"]
