"""Qwen3.5's (and Qwen3-Coder's) XML tool calls, as llama.cpp's common/parsers/qwen3-coder.cpp reads and constrains
them: <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>,
a value the text itself where its parameter is a string, else JSON; a <think>...</think> before it the reasoning.
The syntax is the template's (it names <tool_call>, <function= and <parameter=)."""
from __future__ import annotations

import pytest
from test_tools_required import SCHEMAS, TOOLS, matches, tok  # noqa: F401  (the vocabulary with Qwen's markers)

from powerinfer.tools import ToolCalls, call_grammar, parse_tool_calls, syntax_of

QWEN35_TEMPLATE_PART = ("{%- if tools %}<tools>{{ tools | tojson }}</tools> ... <tool_call>\n<function=example_name>\n"
                        "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>{%- endif %}")

W = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n</function>\n</tool_call>"
A = ("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n</function>\n"
     "</tool_call>")


def test_syntax_of_the_template():
    assert syntax_of(QWEN35_TEMPLATE_PART) == "qwen3_coder"
    assert syntax_of("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"


@pytest.mark.parametrize("text,calls,content", [
    (W, [("get_weather", {"city": "New York"})], ""),
    ("<think>\nSum them.\n</think>\n\n" + A, [("add", {"a": 1, "b": 2.5})], ""),
    ("Checking.\n" + W + "\n" + A, [("get_weather", {"city": "New York"}), ("add", {"a": 1, "b": 2.5})], "Checking."),
    # a string parameter keeps text that looks like JSON as text; a multi-line value stays whole
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>", [("get_weather", {"city": "123", "days": 3})], ""),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nline one\nline two\n</parameter>\n</function>\n"
     "</tool_call>", [("get_weather", {"city": "line one\nline two"})], ""),
    ("<tool_call>\n<function=nope>\n</function>\n</tool_call>", [], None),                   # unknown tool
    ("<tool_call>\n<function=add>\n<parameter=a>\none\n</parameter>\n</function>\n</tool_call>", [], None),  # not JSON
])
def test_parse(text, calls, content):
    got, rest = parse_tool_calls(text, "qwen3_coder", SCHEMAS)
    assert [(c["name"], c["arguments"]) for c in got] == calls
    assert rest == (content if content is not None else text.strip())


def test_auto_message_reads_the_reasoning_apart():
    tc = ToolCalls.of_request(TOOLS, "auto", QWEN35_TEMPLATE_PART)
    assert tc.syntax == "qwen3_coder"
    msg = tc.message("<think>\nSum them.\n</think>\n\n" + A)
    assert msg["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2.5}'}
    assert msg["reasoning_content"].strip() == "Sum them." and msg["content"] is None


@pytest.mark.parametrize("reply,ours", [
    (W, (1, 1)),
    ("<think>\nThe weather.\n</think>\n\n" + W, (1, 1)),
    (A, (1, 1)),
    (W + "\n" + A, (0, 1)),                                   # two calls: parallel_tool_calls only
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>", (1, 1)),                     # an optional parameter after the required one
    ("<tool_call>\n<function=add>\n<parameter=a>\none\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>\n"
     "</tool_call>", (0, 0)),                                  # a number parameter's value must be JSON
    ("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>", (0, 0)),  # b missing
    ("<tool_call>\n<function=nope>\n</function>\n</tool_call>", (0, 0)),
    ("<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n</function>", (0, 0)),
])
def test_required_grammar(tok, reply, ours):  # noqa: F811
    for parallel in (False, True):
        g = call_grammar("qwen3_coder", SCHEMAS, tok, parallel=parallel, think=True)
        assert matches(g, tok, reply) == bool(ours[parallel]), parallel
    if any(ours):
        assert parse_tool_calls(reply, "qwen3_coder", SCHEMAS)[0]


def test_a_prompt_that_opens_the_reasoning(tok):  # noqa: F811
    """Qwen3.5's template ends its generation prompt with <think> when thinking: the reply is read from inside the
    reasoning, and a constrained one continues it to </think> before the call."""
    tc = ToolCalls.of_request(TOOLS, "required", QWEN35_TEMPLATE_PART + "<think>", tokenizer=tok)
    tc.after_prompt("<|im_start|>assistant\n<think>\n")
    assert tc.opened
    assert matches(tc.grammar, tok, "The weather.\n</think>\n\n" + W)
    assert tc.message("The weather.\n</think>\n\n" + W)["reasoning_content"].strip() == "The weather."
