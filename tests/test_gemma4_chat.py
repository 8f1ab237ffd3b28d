"""Gemma 4's chat format against llama.cpp: tests/fixtures/gemma4_chat_llama_cpp.json holds what llama.cpp's chat code
(common/chat.cpp: its Jinja engine, its Gemma 4 template adjustments and PEG parser; written by
tools/gemma4_chat_fixtures.py through tools/llama_chat) makes of Gemma 4 conversations (the prompt) and replies (the
OpenAI message), with the current template and an older one (data/google-gemma-4-31B-it*.jinja). Here: our sandbox
renders the same prompts; the built-in gemma4 template of files without one renders the text conversations alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerinfer.chat import ChatFormatter

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = {"gemma4": (ROOT / "data" / "google-gemma-4-31B-it.jinja").read_text(),
             "gemma4-interleaved": (ROOT / "data" / "google-gemma-4-31B-it-interleaved.jinja").read_text()}
CASES = json.loads((ROOT / "tests" / "fixtures" / "gemma4_chat_llama_cpp.json").read_text())["cases"]
RENDER = [c for c in CASES if c["kind"] == "render"]


def case_id(c):
    return f"{c['template']}-{c['name']}"


def render(fmt: ChatFormatter, req: dict) -> str:
    """The prompt as the server makes it: tools as the template's `tools`, enable_thinking where the request says."""
    kwargs = {k: req[k] for k in ("tools", "enable_thinking") if k in req}
    return fmt.render(req["messages"], add_generation_prompt=req.get("add_generation_prompt", True), **kwargs)


@pytest.mark.parametrize("case", RENDER, ids=case_id)
def test_template_renders_as_llama_cpp(case):
    fmt = ChatFormatter.resolve({"tokenizer.chat_template": TEMPLATES[case["template"]]}, bos_token="<bos>",
                                eos_token="<eos>")
    assert fmt.gemma4 and fmt.end_of_turn == ["<turn|>", "<|tool_response>"]
    assert render(fmt, case["request"]) == case["prompt"]


TEXT_ONLY = [c for c in RENDER if c["template"] == "gemma4" and "tools" not in c["request"]
             and c["name"] not in ("assistant_thought_stripped", "content_parts")]


@pytest.mark.parametrize("case", TEXT_ONLY, ids=case_id)
def test_builtin_template_renders_text_turns_as_llama_cpp(case):
    """Files without a template get the built-in gemma4 one: the official template's text turns."""
    assert render(ChatFormatter.builtin("gemma4", bos_token="<bos>"), case["request"]) == case["prompt"]
