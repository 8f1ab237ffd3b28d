"""OpenAI tools (function calling) through the chat template and constrained output.

The request's `tools` go to the chat template as its `tools` variable (the way llama.cpp's --jinja
renders them); a template that never reads `tools` gets them in a system message instead
(llama.cpp's "generic" tool format). The reply is constrained by a JSON schema to one call,
{"name": <a tool's name>, "arguments": <that tool's parameters schema>}, and returned as
`message.tool_calls` with finish_reason "tool_calls".

tool_choice "required" (any of the tools) and {"type": "function", "function": {"name": N}} are
served; "none" leaves the tools out; "auto" (the default when tools are given) would need the model's
own call syntax and a grammar that starts only when a call does (llama.cpp's lazy grammars): it is
refused with a 400 until then.
"""
from __future__ import annotations

import json
import uuid

from .grammar import Grammar, GrammarError
from .request import RequestError

__all__ = ["ToolCalls", "tools_system_message"]


def _tool_name(t, i: int) -> tuple[str, dict]:
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", param="tools")
    fn = t["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(f"tools[{i}].function.name must be a non-empty string", param="tools")
    params = fn.get("parameters", {"type": "object"})
    if not isinstance(params, dict):
        raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
    return name, params


class ToolCalls:
    """The tools of one request and the grammar of its reply."""

    def __init__(self, tools: list, names: list[str], grammar: Grammar):
        self.tools = tools
        self.names = names
        self.grammar = grammar

    @classmethod
    def of_request(cls, tools, tool_choice) -> "ToolCalls | None":
        """None when the request has no tools (or tool_choice "none"); RequestError when it cannot be served."""
        if tools is None or tools == []:
            if tool_choice not in (None, "none", "auto"):
                raise RequestError("tool_choice needs tools", param="tool_choice")
            return None
        if not isinstance(tools, list):
            raise RequestError("'tools' must be an array", param="tools")
        if tool_choice == "none":
            return None
        schemas = dict(_tool_name(t, i) for i, t in enumerate(tools))
        if tool_choice is None or tool_choice == "auto":
            raise RequestError("tool_choice 'auto' is not supported yet (it needs the model's own tool-call syntax); "
                               "pass tool_choice 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}} "
                               "to get a call, or 'none'", param="tool_choice", code="not_supported")
        if tool_choice == "required":
            names = list(schemas)
        elif isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
            name = tool_choice["function"].get("name")
            if name not in schemas:
                raise RequestError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
            names = [name]
        else:
            raise RequestError("tool_choice must be 'none', 'required' or {\"type\": \"function\", \"function\": "
                               "{\"name\": ...}}", param="tool_choice")
        one = [{"type": "object", "properties": {"name": {"const": n}, "arguments": schemas[n]},
                "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        try:
            g = Grammar.from_json_schema(one[0] if len(one) == 1 else {"anyOf": one})
        except GrammarError as e:
            raise RequestError(f"a tool's parameters schema is not usable: {e}", param="tools") from None
        return cls(tools, names, g)

    def message(self, text: str) -> dict | None:
        """The assistant message of a complete reply (None if the text is no call: a cut-off reply)."""
        try:
            call = json.loads(text)
        except ValueError:
            return None
        if not isinstance(call, dict) or call.get("name") not in self.names:
            return None
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}}]}


def tools_system_message(tools: list) -> dict:
    """The system message that describes the tools to a template that does not render them."""
    return {"role": "system", "content": "You can call these tools. Reply with one JSON object "
            "{\"name\": <tool name>, \"arguments\": {...}} and nothing else.\nTools:\n" + json.dumps(tools)}
