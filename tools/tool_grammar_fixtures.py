#!/usr/bin/env python3
"""Write tests/fixtures/tool_grammars_llama_cpp.json: the grammars llama.cpp's chat code builds for tool_choice
"required" (common/chat.cpp, common/parsers/*.cpp), for tests/test_tools_required.py to compare powerinfer's
call grammars (powerinfer.tools.call_grammar) with: which replies each accepts.

Each case goes through tools/llama_chat (llama.cpp's chat code against llama-cpp-python's libllama) with a template of
the syntax: Qwen3 (hermes <tool_call>), Gemma 4, gpt-oss (harmony), Mistral Nemo ([TOOL_CALLS]), Llama 3.1:

    sh tools/llama_chat/build.sh            # -> /tmp/llama_chat/llama-chat
    python tools/tool_grammar_fixtures.py [/tmp/llama_chat/llama-chat [LLAMA_CPP_SRC]]

(the driver built from this checkout's driver.cpp, which prints the grammar; build.sh caches objects by source path,
so two checkouts building into one OUT_DIR link two drivers: give each its own, `build.sh SRC /tmp/llama_chat_tools`).

Stored per case: the request, llama.cpp's format name, its grammar (GBNF; matched against the generation prompt and the
reply together), whether it is lazy, and the generation prompt.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "tool_grammars_llama_cpp.json"
SRC = "/tmp/lcp_src/llama_cpp_python-0.3.36/vendor/llama.cpp"
# syntax -> the template (under the llama.cpp source's models/templates, or this repository's data/)
TEMPLATES = {"hermes": "models/templates/Qwen-Qwen3-0.6B.jinja", "gemma4": "data/google-gemma-4-31B-it.jinja",
             "harmony": "data/openai-gpt-oss-120b.jinja",
             "mistral": "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
             "llama3": "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
             "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
             "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
             "required": ["a", "b"]}}}]


def main(driver: str = "/tmp/llama_chat/llama-chat", src: str = SRC) -> None:
    cases = []
    for syntax, rel in TEMPLATES.items():
        template = Path(src) / rel if rel.startswith("models/") else ROOT / rel
        for parallel in (False, True):
            req = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
                   "tool_choice": "required", "parallel_tool_calls": parallel}
            out = subprocess.run([driver, str(template)], input=json.dumps(req) + "\n", capture_output=True,
                                 text=True, check=True)
            got = json.loads(out.stdout)
            if "error" in got:
                raise SystemExit(f"{syntax}: {got['error']}")
            cases.append({"syntax": syntax, "template": Path(rel).name, "request": req, "format": got["format"],
                          "grammar": got["grammar"], "grammar_lazy": got["grammar_lazy"],
                          "generation_prompt": got["generation_prompt"]})
    OUT.write_text(json.dumps({"source": "llama.cpp common/chat.cpp as vendored in llama-cpp-python 0.3.36 "
                                         "(tools/tool_grammar_fixtures.py)", "cases": cases}, indent=1) + "\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main(*sys.argv[1:])
