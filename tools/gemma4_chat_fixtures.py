#!/usr/bin/env python3
"""Write tests/fixtures/gemma4_chat_llama_cpp.json: what llama.cpp's chat code makes of Gemma 4 conversations and
replies, for tests/test_gemma4_chat.py to hold powerinfer's chat template sandbox, reasoning splitter and tool-call
reader to.

Each case goes through tools/llama_chat (llama.cpp's common/chat.cpp built against llama-cpp-python's libllama:
the template rendered by llama.cpp's own Jinja engine with its Gemma 4 adjustments, a reply parsed by its Gemma 4 PEG
parser) with the template data/google-gemma-4-31B-it.jinja (llama.cpp's models/templates copy):

    sh tools/llama_chat/build.sh            # -> /tmp/llama_chat/llama-chat
    python tools/gemma4_chat_fixtures.py [/tmp/llama_chat/llama-chat]

The reply cases are the Gemma 4 cases of llama.cpp's tests/test-chat.cpp (tool_choice "auto" ones) and a few more.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = {"gemma4": ROOT / "data" / "google-gemma-4-31B-it.jinja",
             "gemma4-interleaved": ROOT / "data" / "google-gemma-4-31B-it-interleaved.jinja"}
OUT = ROOT / "tests" / "fixtures" / "gemma4_chat_llama_cpp.json"


def fn(name, properties=None, required=None, description=""):
    params = {"type": "object", "properties": properties or {}}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description or f"The {name} tool.",
                                             "parameters": params}}


STR, INT, NUM, BOOL = ({"type": t} for t in ("string", "integer", "number", "boolean"))
TOOLS = [
    fn("get_time", {"city": STR}, ["city"], "Get the current time in a city."),
    fn("get_weather", {"city": {**STR, "description": "The city name"},
                       "units": {**STR, "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    fn("empty_args"),
    fn("special_function", {"arg1": INT}, ["arg1"]),
    fn("amount", {"orig": NUM}, ["orig"]),
    fn("toggle", {"enabled": BOOL}, ["enabled"]),
    fn("set_nullable", {"value": {"type": "string", "nullable": True}}, ["value"]),
    fn("todo_list", {"todos": {"type": "array", "items": STR}}, ["todos"]),
    fn("set_config", {"config": {"type": "object", "properties": {"theme": STR, "count": INT},
                                 "required": ["theme"]}}, ["config"]),
]

USER = {"role": "user", "content": "Hey there!"}
SYSTEM = {"role": "system", "content": "  You are a helpful assistant.\n"}


def call(name, args, cid="c0"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def tool(content, cid="c0"):
    return {"role": "tool", "tool_call_id": cid, "content": content}


WEATHER_CALL = {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Paris"})]}
RENDER = {
    "user": {"messages": [USER]},
    "user_no_thinking": {"messages": [USER], "enable_thinking": False},
    "system_user": {"messages": [SYSTEM, USER]},
    "developer_user_no_thinking": {"messages": [{"role": "developer", "content": "Be brief."}, USER],
                                   "enable_thinking": False},
    "multi_turn": {"messages": [SYSTEM, USER, {"role": "assistant", "content": " Hello! How can I help? "},
                                {"role": "user", "content": "Tell me a joke.\n"}], "enable_thinking": False},
    "assistant_thought_stripped": {"messages": [USER, {"role": "assistant", "content":
                                                       "<|channel>thought\nThe user greets.<channel|>Hi!"},
                                                {"role": "user", "content": "Again"}]},
    "content_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                                {"type": "text", "text": "Part two."}]}]},
    "tools": {"messages": [SYSTEM, USER], "tools": TOOLS},
    "tools_no_thinking": {"messages": [USER], "tools": TOOLS[:2], "enable_thinking": False},
    "tool_call_and_response": {"messages": [USER, WEATHER_CALL, tool('{"temperature": 21, "sky": "clear"}')],
                               "tools": TOOLS[:2]},
    "tool_call_nested_args": {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        call("set_config", {"config": {"theme": "dark", "count": 3, "tags": ["a", "b c"], "on": True,
                                       "none": None, "x": 1.5}})]}, tool("ok")], "tools": TOOLS},
    "tool_call_with_content": {"messages": [USER, {**WEATHER_CALL, "content": "Let me check."},
                                            tool('{"r": "ok"}')], "tools": TOOLS[:2]},
    "parallel_calls_then_answer": {"messages": [
        USER, {"role": "assistant", "content": None, "tool_calls": [call("get_time", {"city": "London"}, "a"),
                                                                     call("get_weather", {"city": "Oslo"}, "b")]},
        tool("12:00", "a"), tool('{"sky": "rain"}', "b"),
        {"role": "assistant", "content": "It is noon in London and rainy in Oslo."},
        {"role": "user", "content": "Thanks!"}], "tools": TOOLS[:2]},
    "reasoning_kept_between_calls": {"messages": [
        USER, {"role": "assistant", "content": None, "reasoning_content": "I need the weather.",
               "tool_calls": [call("get_weather", {"city": "Paris"})]}, tool("sunny")], "tools": TOOLS[:2]},
    "call_without_response": {"messages": [USER, WEATHER_CALL], "tools": TOOLS[:2],
                              "add_generation_prompt": False},
    "no_generation_prompt": {"messages": [USER, WEATHER_CALL, tool("sunny")], "tools": TOOLS[:2],
                             "add_generation_prompt": False},
}

Q = '<|"|>'
TIME, WEATHER = ["get_time"], ["get_time", "get_weather"]
PARSE = {   # name: (reply, tool names, reasoning_format)
    "plain": ("Hello, world!", None, "auto"),
    "thought": ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?", None, "auto"),
    "empty_thought": ("<|channel>thought<channel|>Hello, world!\nWhat's up?", None, "auto"),
    "thought_format_none": ("<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?", None, "none"),
    "trailing_close": ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>", None, "auto"),
    "trailing_empty_thought": ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n<channel|>",
                               None, "auto"),
    "trailing_empty_thought_close": ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<|channel>thought\n"
                                     "<channel|><channel|>", None, "auto"),
    "double_open": ("<|channel><|channel>thought\n<channel|>Hello, world!\nWhat's up?", None, "auto"),
    "call_string": (f"<|tool_call>call:get_time{{city:{Q}London{Q}}}<tool_call|>", TIME, "auto"),
    "call_string_space": (f"<|tool_call>call:get_time{{city:{Q}San Francisco{Q}}}<tool_call|>", TIME, "auto"),
    "call_empty_args": ("<|tool_call>call:empty_args{}<tool_call|>", ["empty_args"], "auto"),
    "content_and_call": (f"Hello, world!\nWhat's up?<|tool_call>call:get_time{{city:{Q}Paris{Q}}}<tool_call|>", TIME,
                         "auto"),
    "thought_and_call": (f"<|channel>thought\nI'm\nthinking<channel|><|tool_call>call:get_time{{city:{Q}Paris{Q}}}"
                         "<tool_call|>", TIME, "auto"),
    "parallel_calls": (f"<|tool_call>call:get_time{{city:{Q}London{Q}}}<tool_call|>"
                       f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>", WEATHER, "auto"),
    "call_integer": ("<|tool_call>call:special_function{arg1:42}<tool_call|>", ["special_function"], "auto"),
    "call_negative": ("<|tool_call>call:special_function{arg1:-7}<tool_call|>", ["special_function"], "auto"),
    "call_decimal": ("<|tool_call>call:amount{orig:3.14}<tool_call|>", ["amount"], "auto"),
    "call_true": ("<|tool_call>call:toggle{enabled:true}<tool_call|>", ["toggle"], "auto"),
    "call_false": ("<|tool_call>call:toggle{enabled:false}<tool_call|>", ["toggle"], "auto"),
    "call_null": ("<|tool_call>call:set_nullable{value:null}<tool_call|>", ["set_nullable"], "auto"),
    "call_array": (f"<|tool_call>call:todo_list{{todos:[{Q}buy milk{Q},{Q}walk dog{Q}]}}<tool_call|>", ["todo_list"],
                   "auto"),
    "call_dict": (f"<|tool_call>call:set_config{{config:{{theme:{Q}dark{Q},count:3}}}}<tool_call|>", ["set_config"],
                  "auto"),
    "call_empty_array": ("<|tool_call>call:todo_list{todos:[]}<tool_call|>", ["todo_list"], "auto"),
    "call_empty_dict": ("<|tool_call>call:set_config{config:{}}<tool_call|>", ["set_config"], "auto"),
    "call_exponent": ("<|tool_call>call:amount{orig:1.5e10}<tool_call|>", ["amount"], "auto"),
    # more than llama.cpp's tests
    "thought_content_call": (f"<|channel>thought\nCheck the time.<channel|>One moment.<|tool_call>call:get_time"
                             f"{{city:{Q}Rome{Q}}}<tool_call|>", TIME, "auto"),
    "tools_but_answer": ("<|channel>thought\nNo tool needed.<channel|>It is fine.", WEATHER, "auto"),
    "call_spaces": (f"<|tool_call>call:set_config{{config:{{ theme: {Q}a, b{Q}, count: 2 }}}}<tool_call|>",
                    ["set_config"], "auto"),
    "call_quotes_in_string": (f'<|tool_call>call:get_time{{city:{Q}say "hi"\nnow{Q}}}<tool_call|>', TIME, "auto"),
    "unicode": ("<|channel>thought\nDenke… 🤔<channel|>Grüße, 世界!", None, "auto"),
}


def requests():
    for name, req in RENDER.items():
        yield "render", name, req
    for name, (text, names, fmt) in PARSE.items():
        tools = [t for t in TOOLS if t["function"]["name"] in (names or [])]
        yield "parse", name, {"messages": [USER], **({"tools": tools} if tools else {}), "reasoning_format": fmt,
                              "text": text}


def main(driver: str = "/tmp/llama_chat/llama-chat") -> None:
    cases = []
    for tname, template in TEMPLATES.items():
        reqs = [(kind, name, req) for kind, name, req in requests() if kind == "render" or tname == "gemma4"]
        lines = "".join(json.dumps(req) + "\n" for _, _, req in reqs)
        out = subprocess.run([driver, str(template)], input=lines, capture_output=True, text=True, check=True)
        for (kind, name, req), line in zip(reqs, out.stdout.splitlines()):
            got = json.loads(line)
            if "error" in got:
                raise SystemExit(f"{tname} {name}: {got['error']}")
            case = {"kind": kind, "name": name, "template": tname, "request": req, "prompt": got["prompt"]}
            if kind == "parse":
                case["message"] = got["message"]
            cases.append(case)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"source": "llama.cpp common/chat.cpp as vendored in llama-cpp-python 0.3.36 "
                                         "(tools/llama_chat)", "cases": cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:])
