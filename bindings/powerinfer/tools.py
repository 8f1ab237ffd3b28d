"""OpenAI tools (function calling) through the chat template, in the model's own call syntax.

The request's `tools` go to the chat template as its `tools` variable (the way llama.cpp's --jinja renders them); a
template that never reads `tools` gets them in a system message instead (llama.cpp's "generic" tool format). The call
syntax is the one the template names (`syntax_of`): Hermes 2 Pro / Qwen2.5 / Qwen3 `<tool_call>{...}</tool_call>` (a
leading `<think>...</think>` the message's reasoning_content), Mistral `[TOOL_CALLS][{...}]`, Llama 3.1+
`<|python_tag|>{"name", "parameters"}` or a bare such object, gpt-oss's harmony (a commentary message
`to=functions.NAME ... <|message|>{arguments}`; its analysis channel the message's reasoning_content, its final
channel the content), Gemma 4's `<|tool_call>call:NAME{key:value,...}<tool_call|>` (values: `<|"|>`-quoted strings,
numbers, true/false/null, and {...} / [...] of them, keys bare; read as JSON arguments the way llama.cpp's gemma4
parser does; its thought channel the message's reasoning_content), and for templates without tools the generic system
message's bare {"name", "arguments"} object. Calls of tools the request has become `message.tool_calls` (finish_reason
"tool_calls"), the text around them `content`; a reply with none is plain content.

tool_choice "auto" (the default when tools are given) lets the model answer or call: the reply is generated
unconstrained and read afterwards (a streamed one streams until a call may begin, harmony's is held to its end, Gemma
4's thought channel and hermes' <think> stream as they come: `live_splitter`). llama.cpp constrains a call once its
start is seen with a lazy grammar; here a malformed call stays text.

tool_choice "required" (any of the tools) and {"type": "function", "function": {"name": N}} constrain the reply to a
call in the same syntax, as llama.cpp's chat code does for "required" (common/chat.cpp, common/parsers/):
`call_grammar` writes an llguidance Lark grammar of the syntax's markers (the vocabulary's special tokens where they
are ones: grammar.lark_literal), the allowed tools' names, their arguments against each tool's parameters schema
(`%json`; Gemma 4's value syntax built from the schema, an object's keys in its order, the required ones always),
the reasoning the format lets come first (`<think>...</think>` where the template has it, harmony's analysis
messages, Gemma 4's thought channel), and with parallel_tool_calls several calls where the syntax has them (hermes,
mistral, gemma4). "none" leaves the tools out.
Templates without a call syntax ("generic") get the bare {"name", "arguments"} object by its JSON schema.
"""
from __future__ import annotations

import json
import re
import uuid

from .grammar import Grammar, GrammarError, lark_json, lark_literal
from .reasoning import Gemma4Splitter, HarmonySplitter, ReasoningSplitter, prompt_opens_reasoning
from .request import RequestError

__all__ = ["ToolCalls", "call_grammar", "parse_tool_calls", "syntax_of", "tools_system_message"]

SYNTAXES = ("hermes", "qwen3_coder", "mistral", "llama3", "harmony", "gemma4", "generic")
# where a call may begin, per syntax: a streamed "auto" reply holds its text back from the first of these (harmony:
# from its first marker, i.e. the whole reply, whose channels are read at its end)
CALL_MARKERS = {"hermes": ("<tool_call>",), "qwen3_coder": ("<tool_call>",),
                "mistral": ("[TOOL_CALLS]",), "llama3": ("<|python_tag|>", "{"),
                "harmony": ("<|",), "gemma4": ("<|tool_call>",), "generic": ("{",)}
_HARMONY_CALL = re.compile(r"to=functions\.([^\s<]+)")
GEMMA4_CALL, GEMMA4_CALL_END, GEMMA4_QUOTE = "<|tool_call>call:", "<tool_call|>", '<|"|>'
_GEMMA4_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")


def syntax_of(template_source: str | None) -> str:
    """The tool-call syntax a chat template's model writes (its template names the markers)."""
    src = template_source or ""
    if "<|channel|>" in src and "functions." in src:     # OpenAI's harmony (gpt-oss): to=functions.NAME
        return "harmony"
    if GEMMA4_CALL in src:
        return "gemma4"
    if "<tool_call>" in src and "<function=" in src and "<parameter=" in src:   # Qwen3.5, Qwen3-Coder (XML)
        return "qwen3_coder"
    if "<tool_call>" in src:
        return "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or "ipython" in src:
        return "llama3"
    return "generic"


def _objects(text: str, start: int = 0):
    """(start, end, value) of each JSON value that begins at a '{' or '[' of text from `start` (not nested in an
    earlier one)."""
    dec = json.JSONDecoder()
    i = start
    while True:
        candidates = [j for j in (text.find("{", i), text.find("[", i)) if j >= 0]
        if not candidates:
            return
        j = min(candidates)
        try:
            value, end = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        yield j, end, value
        i = end


def _gemma4_value(text: str, i: int):
    """(value, end) of the Gemma 4 value at text[i:] (whitespace before it skipped); ValueError if there is none."""
    while i < len(text) and text[i].isspace():
        i += 1
    if text.startswith(GEMMA4_QUOTE, i):
        j = text.find(GEMMA4_QUOTE, i + len(GEMMA4_QUOTE))
        if j < 0:
            raise ValueError("unterminated string")
        return text[i + len(GEMMA4_QUOTE):j], j + len(GEMMA4_QUOTE)
    if text.startswith(("{", "["), i):
        close, out = ("}", {}) if text[i] == "{" else ("]", [])
        i += 1
        while True:
            while i < len(text) and text[i].isspace():
                i += 1
            if text.startswith(close, i):
                return out, i + 1
            if out and text.startswith(",", i):
                i += 1
            elif out:
                raise ValueError("expected ',' or " + close)
            if close == "}":
                j = i
                while j < len(text) and text[j] not in ":}":
                    j += 1
                key = text[i:j].strip().removeprefix(GEMMA4_QUOTE).removesuffix(GEMMA4_QUOTE)
                if not text.startswith(":", j) or not key:
                    raise ValueError("expected key:")
                out[key], i = _gemma4_value(text, j + 1)
            else:
                value, i = _gemma4_value(text, i)
                out.append(value)
    m = _GEMMA4_SCALAR.match(text, i)
    if m is None:
        raise ValueError("expected a value")
    return json.loads(m.group()), m.end()


def parse_tool_calls(text: str, syntax: str, names, opened: bool = False) -> tuple[list[dict], str]:
    """([{"name", "arguments": dict}], the text outside the calls) of a reply in `syntax`; a call whose tool is
    not among `names` or whose JSON does not parse stays in the text. names: the tools' names, or {name: parameters
    schema} (qwen3_coder's XML values are typed by it). opened: the prompt opened the reasoning (the reply begins
    inside it: `prompt_opens_reasoning`)."""
    names_schemas = names if isinstance(names, dict) else {n: {} for n in names}
    names = set(names)
    calls: list[dict] = []
    spans: list[tuple[int, int]] = []

    def take(obj, key="arguments") -> bool:
        if isinstance(obj, dict) and obj.get("name") in names:
            args = obj.get(key, obj.get("arguments", obj.get("parameters", {})))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    return False
            if isinstance(args, dict):
                calls.append({"name": obj["name"], "arguments": args})
                return True
        return False

    if syntax == "qwen3_coder":
        _qwen3_coder_calls(text, names_schemas, calls, spans)
    elif syntax == "hermes":
        pos = 0
        while (a := text.find("<tool_call>", pos)) >= 0:
            b = text.find("</tool_call>", a)
            end = len(text) if b < 0 else b + len("</tool_call>")
            body = text[a + len("<tool_call>"):b if b >= 0 else len(text)].strip()
            try:
                ok = take(json.loads(body))
            except ValueError:
                ok = False
            if ok:
                spans.append((a, end))
            pos = end
    elif syntax == "harmony":      # a commentary message "to=functions.NAME ... <|message|>{arguments}"
        dec = json.JSONDecoder()
        for m in _HARMONY_CALL.finditer(text):
            body = text.find("<|message|>", m.end())
            if body < 0:
                continue
            j = body + len("<|message|>")
            try:
                args, end = dec.raw_decode(text, j + len(text[j:]) - len(text[j:].lstrip()))
            except ValueError:
                continue
            if take({"name": m.group(1), "arguments": args}):
                start = max(text.rfind("<|start|>", 0, m.start()), text.rfind("<|channel|>", 0, m.start()))
                for tail in ("<|call|>", "<|end|>"):
                    end += len(tail) if text.startswith(tail, end) else 0
                spans.append((start if start >= 0 else m.start(), end))
    elif syntax == "gemma4":       # <|tool_call>call:NAME{args}<tool_call|>
        pos = 0
        while (a := text.find(GEMMA4_CALL, pos)) >= 0:
            pos = a + len(GEMMA4_CALL)
            brace = text.find("{", pos)
            if brace < 0:
                break
            try:
                args, end = _gemma4_value(text, brace)
            except ValueError:
                continue
            if text.startswith(GEMMA4_CALL_END, end) and take({"name": text[pos:brace], "arguments": args}):
                pos = end + len(GEMMA4_CALL_END)
                spans.append((a, pos))
    elif syntax == "mistral":
        a = text.find("[TOOL_CALLS]")
        if a >= 0:
            for j, end, value in _objects(text, a + len("[TOOL_CALLS]")):
                items = value if isinstance(value, list) else [value]
                if items and all(take(v) for v in items):
                    spans.append((a, end))
                break
    else:                                          # llama3, generic: JSON objects, <|python_tag|> before them
        key = "parameters" if syntax == "llama3" else "arguments"
        for j, end, value in _objects(text):
            if take(value, key):
                tag = text.rfind("<|python_tag|>", 0, j)
                spans.append((tag if tag >= 0 and not text[tag + 14:j].strip() else j, end))
    content, pos = "", 0
    for a, b in spans:
        content += text[pos:a]
        pos = b
    content += text[pos:]
    if syntax in _CHANNELS:        # the rest's answer (its reasoning: ToolCalls.plain)
        content = _channels_split(content, syntax, opened)[1]
    return calls, content.strip()


# syntaxes whose replies carry their reasoning apart (channels, or Qwen3's <think>...</think> before a hermes call): the
# splitter that takes them apart
_CHANNELS = {"harmony": HarmonySplitter, "gemma4": Gemma4Splitter, "hermes": ReasoningSplitter,
             "qwen3_coder": ReasoningSplitter}
# those whose reasoning a prompt may open, the reply then beginning inside it (reasoning.prompt_opens_reasoning)
_OPENABLE = ("hermes", "gemma4", "qwen3_coder")


def _channels_split(text: str, syntax: str, opened: bool = False) -> tuple[str, str]:
    s = _CHANNELS[syntax](opened) if syntax in _OPENABLE else _CHANNELS[syntax]()
    r, c = s.feed(text)
    r2, c2 = s.finish()
    return r + r2, c + c2


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

    def __init__(self, tools: list, names: list[str], grammar: Grammar | None, syntax: str = "generic",
                 schemas: dict | None = None, tokenizer=None, parallel: bool = False):
        self.tools = tools
        self.names = names
        self.grammar = grammar          # None: tool_choice "auto" (the reply is read afterwards, in `syntax`)
        self.syntax = syntax
        self.opened = False             # the rendered prompt opened the reasoning (`after_prompt`)
        self._remake = (schemas, tokenizer, parallel)

    @property
    def auto(self) -> bool:
        return self.grammar is None

    def after_prompt(self, prompt: str) -> None:
        """Takes the rendered prompt: where it ends inside the reasoning (`prompt_opens_reasoning`) the reply is read
        from inside it and a constrained reply continues the reasoning to its close before the call."""
        self.opened = prompt_opens_reasoning(prompt, self.syntax)
        schemas, tokenizer, parallel = self._remake
        if self.opened and not self.auto:
            self.grammar = call_grammar(self.syntax, schemas, tokenizer, parallel=parallel, opened=True)

    def hold_from(self, text: str) -> int:
        """Where a call may begin in a reply so far: the first marker of the syntax, or a tail that may grow into one
        (len(text) when neither)."""
        markers = CALL_MARKERS[self.syntax]
        at = min((i for i in (text.find(m) for m in markers) if i >= 0), default=len(text))
        for m in markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    at = min(at, len(text) - k)
                    break
        return at

    @classmethod
    def of_request(cls, tools, tool_choice, template_source: str | None = None, tokenizer=None,
                   parallel: bool = False) -> "ToolCalls | None":
        """None when the request has no tools (or tool_choice "none"); RequestError when it cannot be served.
        tokenizer: the model's (a constrained call's markers are its special tokens); parallel: parallel_tool_calls
        (a constrained reply may hold several calls where the syntax has them)."""
        if tools is None or tools == []:
            if tool_choice not in (None, "none", "auto"):
                raise RequestError("tool_choice needs tools", param="tool_choice")
            return None
        if not isinstance(tools, list):
            raise RequestError("'tools' must be an array", param="tools")
        if tool_choice == "none":
            return None
        schemas = dict(_tool_name(t, i) for i, t in enumerate(tools))
        syntax = syntax_of(template_source) if template_source and "tools" in template_source else "generic"
        if tool_choice is None or tool_choice == "auto":
            return cls(tools, list(schemas), None, syntax)
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
        think = "<think>" in (template_source or "")
        try:
            g = call_grammar(syntax, {n: schemas[n] for n in names}, tokenizer, parallel=parallel, think=think)
        except GrammarError as e:
            raise RequestError(f"a tool's parameters schema is not usable: {e}", param="tools") from None
        return cls(tools, names, g, syntax, {n: schemas[n] for n in names}, tokenizer, parallel)

    def live_splitter(self):
        """A splitter the reasoning of a streamed "auto" reply goes through as it comes, its content then held where a
        call may begin (Gemma 4's thought channel, hermes' <think>; None: the whole reply is held from its first
        marker)."""
        return _CHANNELS[self.syntax](self.opened) if self.syntax in _OPENABLE else None

    def plain(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of an "auto" reply that holds no call: harmony's / Gemma 4's channels apart, else the
        text."""
        if self.syntax in _CHANNELS:
            r, c = _channels_split(text, self.syntax, self.opened)
            return r, c.strip()
        return "", text.strip()

    def message(self, text: str) -> dict | None:
        """The assistant message of a reply (None if the text holds no call: a cut-off constrained reply, or an
        "auto" reply that answers in text)."""
        schemas = {n: s for n, s in (_tool_name(t, i) for i, t in enumerate(self.tools)) if n in self.names}
        calls, content = parse_tool_calls(text, self.syntax, schemas, self.opened)
        if not calls:
            return None
        msg = {"role": "assistant", "content": content or None, "tool_calls": [{
            "id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in calls]}
        reasoning = self.plain(text)[0] if self.syntax in _CHANNELS else ""
        if reasoning:
            msg["reasoning_content"] = reasoning
        return msg


class _LarkRules:
    """The rules of a Lark grammar (llguidance's: powerinfer.grammar) being written, over one vocabulary."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.rules: dict[str, str] = {"WS": r"/[ \t\r\n]{1,4}/"}

    def lit(self, text: str) -> str:
        return lark_literal(text, self.tokenizer)

    def until(self, end: str) -> str:
        """Any text, then `end` (its first occurrence): a special token ends a text lexeme by itself, a text end is
        the end of a lazy one."""
        term = self.lit(end)
        if term.startswith("<["):
            self.rules["TEXT"] = "/(?s:.+)/"
            return "TEXT? " + term
        name = f"until_{len(self.rules)}[lazy]"
        self.rules[name] = "/(?s:.*)" + re.sub(r"([\\.+*?()|\[\]{}^$/#&~-])", r"\\\1", end) + "/"
        return name.split("[")[0]

    def grammar(self, start: str) -> Grammar:
        return Grammar.from_lark("\n".join([f"start: {start}"] + [f"{k}: {v}" for k, v in self.rules.items()]))


def _call_schema(name: str, params: dict, key: str = "arguments", **extra) -> dict:
    """The JSON schema of a call object {"name": name, key: <params>} (extra: more optional properties, after)."""
    return {"type": "object", "properties": {"name": {"const": name}, key: params, **extra},
            "required": ["name", key], "additionalProperties": False}


def _any_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _gemma4_term(r: _LarkRules, schema) -> str:
    """A Lark term for a Gemma 4 value matching `schema` where its form is known (typed scalars, string enums, arrays,
    objects with properties: those keys, in the schema's order when all are required, else any of them in any order),
    else any Gemma 4 value."""
    schema = schema if isinstance(schema, dict) else {}
    kind, enum = schema.get("type"), schema.get("enum")
    q = r.lit(GEMMA4_QUOTE)
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "(" + " | ".join(f"{q} {json.dumps(v, ensure_ascii=False)} {q}" for v in enum) + ")"
    simple = {"string": "g4_string", "integer": "G4_INT", "number": "G4_NUMBER", "boolean": '("true" | "false")',
              "null": '"null"'}
    if kind in simple:
        return simple[kind]
    if kind == "array":
        item = _gemma4_term(r, schema.get("items"))
        return f'"[" ({item} ("," {item})*)? "]"'
    props = schema.get("properties")
    if kind == "object" and isinstance(props, dict) and props:
        pairs = [f"{json.dumps(k + ':', ensure_ascii=False)} {_gemma4_term(r, v)}" for k, v in props.items()]
        return '"{" ' + _ordered_keys(r, pairs, [k in (schema.get("required") or []) for k in props]) + ' "}"'
    return "g4_dict" if kind == "object" else "g4_value"


def _ordered_keys(r: _LarkRules, pairs: list[str], required: list[bool]) -> str:
    """A Lark term for the comma-separated key:value pairs of an object in the schema's order, every required one
    present and each optional one present or not (as llama.cpp's JSON-schema grammars order properties). Two rules
    per pair: from pair i on with nothing written yet (`first`) and after a pair (`rest`, a comma before each)."""
    base = f"g4_obj{len(r.rules)}"
    first, rest = "", ""                    # from past the last pair: nothing (first: no pair left to start with)
    for i in range(len(pairs) - 1, -1, -1):
        f, n = f"{base}_f{i}", f"{base}_n{i}"
        r.rules[f] = f"{pairs[i]} {rest}".strip() + ("" if required[i] or not first else f" | {first}")
        r.rules[n] = (f'"," {pairs[i]}' if required[i] else f'("," {pairs[i]})?') + f" {rest}".rstrip()
        first, rest = f, n
    return f"{first}?" if not any(required) else first


def call_grammar(syntax: str, schemas: dict, tokenizer=None, parallel: bool = False, think: bool = False,
                 opened: bool = False) -> Grammar:
    """The grammar of a reply that calls one of the tools {name: parameters schema} in `syntax` (the model's own
    call syntax, as llama.cpp's tool_choice "required" grammars: common/chat.cpp, common/parsers/), its markers the
    special tokens of `tokenizer`'s vocabulary where they are ones; parallel: one or more calls where the syntax has
    several (hermes, mistral, gemma4); think: a <think>...</think> may come first (hermes; harmony's analysis and
    Gemma 4's thought channel always may); opened: the prompt opened the reasoning (hermes' <think>, Gemma 4's thought
    channel), the reply continues it to its close, then the call."""
    r = _LarkRules(tokenizer)
    many = "+" if parallel else ""
    names = list(schemas)
    if syntax == "hermes":
        body = lark_json(_any_of([_call_schema(n, schemas[n]) for n in names]))
        r.rules["call"] = f"WS? {r.lit('<tool_call>')} WS? {body} WS? {r.lit('</tool_call>')}"
        start = f"call{many}"
        if opened:
            return r.grammar(f"{r.until('</think>')} WS? {start}")
        if think:
            r.rules["think"] = f"WS? {r.lit('<think>')} {r.until('</think>')} WS?"
            start = "think? " + start
        return r.grammar(start)
    if syntax == "qwen3_coder":
        return _qwen3_coder_grammar(r, schemas, many, think, opened)
    if syntax == "mistral":
        item = _any_of([_call_schema(n, schemas[n], id={"type": ["string", "number"]}) for n in names])
        array = {"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return r.grammar(f"{r.lit('[TOOL_CALLS]')} {lark_json(array)}")
    if syntax == "llama3":
        calls = [_call_schema(n, schemas[n], key="parameters") for n in names]    # "type": "function" may lead
        return r.grammar(lark_json(_any_of([dict(c, properties={"type": {"const": "function"}, **c["properties"]})
                                            for c in calls])))
    if syntax == "harmony":     # messages of the analysis or commentary channels, then the call (a commentary message)
        ch, msg, tail = r.lit("<|channel|>"), r.lit("<|message|>"), r.lit("<|start|>") + ' "assistant"'
        r.rules["message"] = f'{ch} ("analysis" | "commentary") {msg} {r.until("<|end|>")} {tail}'
        r.rules["constrain"] = f'WS? {r.lit("<|constrain|>")}? /[A-Za-z0-9_-]{{1,16}}/'      # "json"; bounded
        for i, n in enumerate(names):
            to = json.dumps(" to=functions." + n, ensure_ascii=False)
            r.rules[f"tool_{i}"] = (f'({ch} ("commentary" | "analysis") {to} | {to} {ch} ("commentary" | "analysis")) '
                                    f"constrain? {msg} {lark_json(schemas[n])}")
        return r.grammar("message* (" + " | ".join(f"tool_{i}" for i in range(len(names))) + ")")
    if syntax == "gemma4":      # the thought channel, then <|tool_call>call:NAME{key:value,...}<tool_call|>
        q = r.lit(GEMMA4_QUOTE)
        r.rules.update({
            "g4_value": 'g4_string | g4_dict | g4_array | G4_NUMBER | "true" | "false" | "null"',
            "g4_string": f"{q} {r.until(GEMMA4_QUOTE)}",
            "g4_dict": '"{" (g4_pair ("," g4_pair)*)? "}"', "g4_pair": 'G4_KEY ":" g4_value',
            "g4_array": '"[" (g4_value ("," g4_value)*)? "]"', "G4_KEY": r"/[^:{}\[\],<>]+/",
            # numbers bounded as llama.cpp's JSON ones (16 digits a part), so that a model cannot write digits forever
            "G4_INT": "/-?(0|[1-9][0-9]{0,15})/",
            "G4_NUMBER": r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?/"})
        r.rules["thought"] = f'{r.lit("<|channel>")} "thought" {r.until("<channel|>")}'
        terms = {n: _gemma4_term(r, schemas[n]) for n in names}       # the arguments are an object, whatever the schema
        tools = " | ".join(f"{json.dumps(n, ensure_ascii=False)} {'g4_dict' if t == 'g4_value' else t}"
                           for n, t in terms.items())
        r.rules["call"] = f'{r.lit("<|tool_call>")} "call:" ({tools}) {r.lit(GEMMA4_CALL_END)}'
        return r.grammar(f"{r.until('<channel|>') if opened else 'thought?'} call{many}")
    # generic: the bare {"name", "arguments"} object the system message asks for
    return Grammar.from_json_schema(_any_of([_call_schema(n, schemas[n]) for n in names]))


# Qwen3.5 / Qwen3-Coder's XML calls (llama.cpp's common/parsers/qwen3-coder.cpp):
#   <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
# a value is the text itself where the parameter's schema is a string, else JSON (both allowed: JSON first)
_Q3C_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>\s*</tool_call>", re.S)
_Q3C_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def _param_types(schema: dict) -> set:
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return set(t)
    subs = [x for k in ("anyOf", "oneOf") for x in (schema.get(k) or [])] if isinstance(schema, dict) else []
    return set().union(*(_param_types(x) for x in subs)) if subs else set()


def _qwen3_coder_value(text: str, schema: dict):
    types = _param_types(schema)
    if types == {"string"}:
        return text
    try:
        return json.loads(text)
    except ValueError:
        if types and "string" not in types:
            raise
        return text


def _qwen3_coder_calls(text: str, schemas: dict, calls: list, spans: list) -> None:
    for m in _Q3C_CALL.finditer(text):
        name = m.group(1).strip()
        if name not in schemas:
            continue
        props = (schemas[name] or {}).get("properties", {}) if isinstance(schemas[name], dict) else {}
        try:
            args = {p.group(1).strip(): _qwen3_coder_value(p.group(2), props.get(p.group(1).strip(), {}))
                    for p in _Q3C_PARAM.finditer(m.group(2))}
        except ValueError:
            continue
        calls.append({"name": name, "arguments": args})
        spans.append((m.start(), m.end()))


def _qwen3_coder_grammar(r: "_LarkRules", schemas: dict, many: str, think: bool, opened: bool = False) -> Grammar:
    """tool_choice required / named in the XML syntax: the required parameters in the schema's order, then any
    optional ones; a string parameter's value is any text up to its closing tag, another's JSON by its schema."""
    close = "\n</parameter>\n"
    tools = []
    for i, (name, schema) in enumerate(schemas.items()):
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        required = [k for k in schema.get("required", []) if k in props] if isinstance(schema, dict) else []
        parts = {}
        for j, (key, ps) in enumerate(props.items()):
            head = json.dumps(f"<parameter={key}>\n", ensure_ascii=False)
            value = (r.until(close) if _param_types(ps) in ({"string"}, set()) or "string" in _param_types(ps)
                     else f"{lark_json(ps)} {json.dumps(close)}")
            r.rules[f"q3c_{i}_{j}"] = f"{head} {value}"
            parts[key] = f"q3c_{i}_{j}"
        optional = [parts[k] for k in props if k not in required]
        seq = " ".join(parts[k] for k in required)
        if optional:
            seq += " (" + " | ".join(optional) + ")*"
        opener = json.dumps(f"<function={name}>\n", ensure_ascii=False)
        r.rules[f"q3c_tool_{i}"] = f'{opener} {seq} "</function>\\n"'
        tools.append(f"q3c_tool_{i}")
    r.rules["call"] = f'{r.lit("<tool_call>")} "\\n" ({" | ".join(tools)}) {r.lit("</tool_call>")} WS?'
    start = f"call{many}"
    if opened:                 # the prompt opened <think>: the reply continues it to its close, then the call
        return r.grammar(f"{r.until('</think>')} WS? {start}")
    if think:
        r.rules["think"] = f"WS? {r.lit('<think>')} {r.until('</think>')} WS?"
        start = "think? " + start
    return r.grammar(start)


def tools_system_message(tools: list, auto: bool = False) -> dict:
    """The system message that describes the tools to a template that does not render them."""
    how = ("To call one, reply with only a JSON object {\"name\": <tool name>, \"arguments\": {...}}; otherwise "
           "answer in text." if auto else
           "Reply with one JSON object {\"name\": <tool name>, \"arguments\": {...}} and nothing else.")
    return {"role": "system", "content": "You can call these tools. " + how + "\nTools:\n" + json.dumps(tools)}
