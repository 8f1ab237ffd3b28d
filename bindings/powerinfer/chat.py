"""Chat templates: turn a list of OpenAI-style messages into one prompt string.

A model's own template comes from the GGUF key ``tokenizer.chat_template`` (Jinja2 text copied from
the Hugging Face ``tokenizer_config.json``). It is rendered the way ``transformers`` renders it: in
``jinja2.sandbox.ImmutableSandboxedEnvironment`` (a template cannot touch Python objects or files)
with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, the helpers
``raise_exception(msg)`` and ``strftime_now(fmt)``, a ``tojson`` filter that does not HTML-escape,
and the variables ``messages``, ``bos_token``, ``eos_token`` and ``add_generation_prompt``; a None
prints as nothing (as in llama.cpp's Jinja engine, where Python's prints "None").

Built-in formats (``chat_format=``): ``chatml``, ``llama2`` (alias ``llama-2``), ``vicuna``,
``gemma`` and ``gemma4`` (text turns only; a Gemma 4 file's own template also renders tools).
``ChatFormatter.resolve`` is the one place that picks a model's template, for ``main.py -cnv``, the
server and ``PowerInfer`` alike. Precedence: an explicit ``chat_template``
(Jinja text, or a built-in name as ``--chat-template`` takes) > an explicit ``chat_format`` name >
the file's template > the built-in format whose turn markers the vocabulary has as special tokens
(``<|turn>``: gemma4, ``<start_of_turn>``: gemma, ``<|im_start|>``: chatml; e.g. Gemma files converted
without their template) > ``chatml`` (with a logged warning, as llama.cpp does). A file template that does not
parse falls back the same way, with a warning.

Every template gets ``enable_thinking`` true unless the caller sets it (llama.cpp's default: Gemma 4's template
thinks only when told to). Gemma 4's template (llama.cpp knows it by ``'<|tool_call>call:'``) gets what llama.cpp
gives it: tool-call arguments as objects (it writes them as ``key:value`` pairs, a JSON string as is), content
parts as parts, the model's turn after a turn that ends with ``<turn|>`` where the template adds no generation
prompt (content beside tool calls), and, for its older templates (no role "tool" handling), the tool messages
folded into the assistant's ``tool_responses``. ``ChatFormatter.preserved``: the control tokens a reply must show
as text to be read (Gemma 4's channel and tool-call markers; ``preserved_ids``).

    >>> fmt = ChatFormatter.builtin("chatml")
    >>> fmt.render([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Iterable

log = logging.getLogger("powerinfer")

__all__ = ["BUILTIN_TEMPLATES", "ChatFormatter", "ChatTemplateError", "ChatTurns", "normalize_messages"]

TEMPLATE_KEY = "tokenizer.chat_template"
# variables the renderer passes to every template; chat_template_kwargs cannot replace them
RESERVED_TEMPLATE_VARS = ("messages", "add_generation_prompt", "bos_token", "eos_token")

# --- built-in templates (Jinja, rendered by the same sandbox as file templates) -------------------

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Meta's Llama-2-chat template (as published in the HF tokenizer_config.json).
_LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

# Vicuna v1.1 (llama.cpp's "vicuna"): optional system text, then USER:/ASSISTANT: turns.
_VICUNA = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' + message['content'] + eos_token + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# Gemma: no system role, so (like llama.cpp) a system message is prepended to the first user turn;
# the assistant role is called "model".
_GEMMA = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = ns.system + message['content'] + '\n\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + ns.system + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Gemma 4: what its own template renders for text turns: a system turn (with <|think|> when thinking), the assistant
# role "model", an empty thought channel after the generation prompt when not thinking.
_GEMMA4 = (
    "{{ bos_token }}"
    "{% set loop_messages = messages %}"
    "{% set thinking = enable_thinking is defined and enable_thinking %}"
    "{% if thinking or messages[0]['role'] in ['system', 'developer'] %}"
    "{{ '<|turn>system\n' }}{% if thinking %}{{ '<|think|>\n' }}{% endif %}"
    "{% if messages[0]['role'] in ['system', 'developer'] %}"
    "{{ messages[0]['content'] | trim }}{% set loop_messages = messages[1:] %}"
    "{% endif %}"
    "{{ '<turn|>\n' }}"
    "{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\n' + message['content'] | trim + '<turn|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}"
    "{% if not thinking %}{{ '<|channel>thought\n<channel|>' }}{% endif %}"
    "{% endif %}"
)

BUILTIN_TEMPLATES = {"chatml": _CHATML, "llama2": _LLAMA2, "vicuna": _VICUNA, "gemma": _GEMMA, "gemma4": _GEMMA4}
_ALIASES = {"llama-2": "llama2", "llama_2": "llama2", "chat-ml": "chatml", "vicuna-1.1": "vicuna"}
# Gemma 4's ends of a reply: the end of its turn, and the tool-response opener it writes after its tool calls (the
# caller answers there); llama.cpp knows its template by the call opener
GEMMA4_END_OF_TURN = ["<turn|>", "<|tool_response>"]
_GEMMA4_TEMPLATE_MARK = "'<|tool_call>call:'"
# ... and its current template by the comment of its role "tool" handling (older ones read "tool_responses")
_GEMMA4_OPENAI_TOOLS = "{#- OpenAI Chat Completions:"
# the markers of Gemma 4's thought channel and tool calls (llama.cpp's list, and the string quote of the arguments)
GEMMA4_PRESERVED = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>", '<|"|>']
# text that ends an assistant turn, per built-in format (used as extra stop strings / stop tokens)
_END_OF_TURN = {"chatml": ["<|im_end|>"], "gemma": ["<end_of_turn>"], "llama2": [], "vicuna": [],
                "gemma4": GEMMA4_END_OF_TURN}


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad structure, or the template raised an exception)."""


def _raise_exception(message):
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' filter: no HTML escaping (Jinja's built-in tojson escapes <, >, &, ').
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


_ENV = None


def _environment():
    global _ENV
    if _ENV is None:
        try:
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:  # pragma: no cover - jinja2 is a dependency of the server extra
            raise ImportError("chat templates need jinja2: pip install 'powerinfer-py[server]' (or jinja2)") from e
        # finalize: None prints as nothing, as in llama.cpp's Jinja engine (Python's prints "None")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols],
                                            finalize=lambda x: "" if x is None else x)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        _ENV = env
    return _ENV


def normalize_messages(messages, keep_parts: bool = False) -> list[dict]:
    """Check OpenAI-style messages and flatten content parts.

    Each message must be a dict with a string ``role``; ``content`` may be a string, None, or a
    list of ``{"type": "text", "text": ...}`` parts (joined with no separator; with keep_parts, for
    templates that read the parts, left a list of such parts). Other keys (name, tool_calls, ...) are
    kept for templates that use them. Raises ChatTemplateError.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("'messages' must be a non-empty array of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if isinstance(part, str):
                    parts.append(part)
                elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                else:
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ChatTemplateError(f"messages[{i}].content[{j}]: content parts of type {kind!r} are not "
                                            "supported (text only)")
            content = [{"type": "text", "text": p} for p in parts] if keep_parts else "".join(parts)
        elif not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string or an array of text parts")
        out.append({**m, "role": role, "content": content})
    return out


class ChatFormatter:
    """A compiled chat template plus the special-token strings it is rendered with."""

    def __init__(self, template: str, *, name: str = "custom", bos_token: str = "", eos_token: str = "",
                 end_of_turn: Iterable[str] = ()):
        from jinja2.exceptions import TemplateError
        self.source = template
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.end_of_turn = list(end_of_turn)
        self.gemma4 = _GEMMA4_TEMPLATE_MARK in template
        # control tokens a reply must show as text to be read (llama.cpp's preserved tokens)
        self.preserved = list(GEMMA4_PRESERVED) if "<|channel>" in template else []
        try:
            self._template = _environment().from_string(template)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template {name!r} does not parse: {e}") from None

    @classmethod
    def builtin(cls, name: str, *, bos_token: str = "<s>", eos_token: str = "</s>") -> "ChatFormatter":
        key = _ALIASES.get(name.lower(), name.lower())
        if key not in BUILTIN_TEMPLATES:
            raise ValueError(f"unknown chat format {name!r} (built-in: {', '.join(BUILTIN_TEMPLATES)})")
        return cls(BUILTIN_TEMPLATES[key], name=key, bos_token=bos_token, eos_token=eos_token,
                   end_of_turn=_END_OF_TURN[key])

    @classmethod
    def resolve(cls, metadata: dict | None = None, *, chat_format: str | None = None,
                chat_template: str | None = None, bos_token: str | None = None, eos_token: str | None = None,
                tokenizer=None) -> "ChatFormatter":
        """Pick the template: chat_template (Jinja text or a built-in name) > chat_format > GGUF
        tokenizer.chat_template > the built-in format the tokenizer's special tokens name > chatml
        (warned). bos/eos tokens: as given, else the tokenizer's, else <s> and </s>."""
        if tokenizer is not None:
            def text(tid):
                return tokenizer.id_to_text(tid) if tid is not None else ""
            bos_token = text(tokenizer.bos_id) if bos_token is None else bos_token
            eos_token = text(tokenizer.eos_id) if eos_token is None else eos_token
        bos_token = "<s>" if bos_token is None else bos_token
        eos_token = "</s>" if eos_token is None else eos_token
        if chat_template and _ALIASES.get(chat_template.lower(), chat_template.lower()) in BUILTIN_TEMPLATES:
            chat_format, chat_template = chat_template, None
        if chat_template:
            return cls(chat_template, name="custom", bos_token=bos_token, eos_token=eos_token,
                       end_of_turn=_guess_end_of_turn(chat_template))
        if chat_format:
            return cls.builtin(chat_format, bos_token=bos_token, eos_token=eos_token)
        source = (metadata or {}).get(TEMPLATE_KEY)
        if isinstance(source, str) and source.strip():
            try:
                fmt = cls(source, name="gguf", bos_token=bos_token, eos_token=eos_token,
                          end_of_turn=_guess_end_of_turn(source))
                log.info("chat: using the model's chat template (%s)", TEMPLATE_KEY)
                return fmt
            except ChatTemplateError as e:
                log.warning("chat: %s; falling back to a built-in template", e)
        guess = _format_from_vocab(tokenizer) if tokenizer is not None else None
        if guess is not None:
            log.info("chat: no usable %s; the vocabulary has %s's turn markers: using the %s template",
                     TEMPLATE_KEY, guess, guess)
            return cls.builtin(guess, bos_token=bos_token, eos_token=eos_token)
        if isinstance(source, str) and source.strip():
            log.warning("chat: using the chatml template")
        else:
            log.warning("chat: the model file has no %s; using the chatml template", TEMPLATE_KEY)
        return cls.builtin("chatml", bos_token=bos_token, eos_token=eos_token)

    def render(self, messages, /, *, add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for messages. Raises ChatTemplateError for bad messages or template errors
        (extra variables may not replace the template's own, RESERVED_TEMPLATE_VARS)."""
        from jinja2.exceptions import TemplateError
        clash = sorted(set(extra) & set(RESERVED_TEMPLATE_VARS))
        if clash:
            raise ChatTemplateError(f"template variables {clash} are set by the renderer, not by the caller")
        msgs = normalize_messages(messages, keep_parts=self.gemma4)
        extra.setdefault("enable_thinking", True)
        if self.gemma4:
            msgs = [_object_arguments(m) for m in msgs]
            if _GEMMA4_OPENAI_TOOLS not in self.source:
                msgs = _gemma4_tool_responses(msgs)
        try:
            text = self._template.render(messages=msgs, bos_token=self.bos_token, eos_token=self.eos_token,
                                         add_generation_prompt=add_generation_prompt, **extra)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None
        if self.gemma4 and add_generation_prompt and text.endswith("<turn|>\n"):
            text += "<|turn>model\n"
        return text

    def __repr__(self) -> str:
        return f"ChatFormatter(name={self.name!r})"


def control_token(tokenizer, marker: str) -> int | None:
    """The id of the control token whose text marker is (None: marker is not one such token)."""
    from .tokenizer import TOKEN_CONTROL
    ids = tokenizer.encode(marker, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 and tokenizer.token_type(ids[0]) == TOKEN_CONTROL else None


def preserved_ids(fmt: "ChatFormatter", tokenizer) -> frozenset[int]:
    """The control tokens a reply in fmt's format shows as text: the markers its reasoning and tool calls are read by
    (ChatFormatter.preserved; llama.cpp's preserved tokens)."""
    ids = (control_token(tokenizer, marker) for marker in fmt.preserved)
    return frozenset(tid for tid in ids if tid is not None)


def _object_arguments(message: dict) -> dict:
    """The message with its tool calls' JSON-text arguments as objects (llama.cpp's func_args_not_string)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                call = {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
            except ValueError:
                pass
        out.append(call)
    return {**message, "tool_calls": out}


def _gemma4_tool_responses(messages: list[dict]) -> list[dict]:
    """llama.cpp's convert_tool_responses_gemma4, for the older Gemma 4 templates that read an assistant message's
    "tool_responses" instead of role "tool" messages: an assistant message with tool calls takes the tool messages
    after it as its tool_responses ({name: its call's, response: the content, as JSON where it parses}) and the plain
    answer after those as its content (its own content is dropped, as llama.cpp does)."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m["role"] != "assistant" or not m.get("tool_calls"):
            out.append(m)
            continue
        calls, responses = m["tool_calls"], []
        while i < len(messages) and messages[i]["role"] == "tool":
            content = messages[i]["content"]
            try:
                response = json.loads(content) if isinstance(content, str) else content
            except ValueError:
                response = content
            k = len(responses)
            fn = calls[k].get("function") if k < len(calls) and isinstance(calls[k], dict) else None
            name = (fn.get("name") if isinstance(fn, dict) else "") or messages[i].get("tool_call_id", "")
            responses.append({"name": name, "response": response})
            i += 1
        msg = {"role": "assistant", "tool_calls": calls}
        if responses:
            msg["tool_responses"] = responses
        if i < len(messages) and messages[i]["role"] == "assistant" and not messages[i].get("tool_calls") \
                and messages[i]["content"]:
            msg["content"] = messages[i]["content"]
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        out.append(msg)
    return out


# built-in formats whose turn marker, when the vocabulary has it as one special token, names the format
_VOCAB_MARKERS = (("<|turn>", "gemma4"), ("<start_of_turn>", "gemma"), ("<|im_start|>", "chatml"))


def _format_from_vocab(tokenizer) -> str | None:
    for marker, name in _VOCAB_MARKERS:
        ids = tokenizer.encode(marker, add_special=False, parse_special=True)
        if len(ids) == 1 and ids != tokenizer.encode(marker, add_special=False, parse_special=False):
            return name
    return None


def _guess_end_of_turn(source: str) -> list[str]:
    """End-of-turn markers a template uses, so generation can stop at them. gpt-oss's harmony template (llama.cpp
    knows it by <|start|> and <|channel|>) ends a reply with <|return|> or <|call|>: its <|end|> ends every message,
    the reasoning channel's too, and a reply goes on after it (the vocabulary does not end generation there either).
    Gemma 4's (<|turn>ROLE ... <turn|>) ends a reply with <turn|>, or with <|tool_response> after its tool calls."""
    if "<|start|>" in source and "<|channel|>" in source:
        return ["<|return|>", "<|call|>"]
    if "<|turn>" in source and "<turn|>" in source:
        return list(GEMMA4_END_OF_TURN)
    return [m for m in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>") if m in source]


class ChatTurns:
    """A conversation fed turn by turn into one sequence (main.py -cnv): the template renders all the
    messages, and only the new text -- that rendering minus the one fed before -- is tokenized."""

    def __init__(self, fmt: ChatFormatter, tokenizer, system: str = ""):
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.messages = [{"role": "system", "content": system}] if system else []
        self.rendered = ""          # what has been fed so far, as text

    def user(self, content: str) -> list[int]:
        """Add a user message: the ids of the new text, up to the assistant's turn (ChatTemplateError:
        the message is not added)."""
        self.messages.append({"role": "user", "content": content})
        try:
            text = self.fmt.render(self.messages, add_generation_prompt=True)
        except ChatTemplateError:
            self.messages.pop()
            raise
        delta = text[len(self.rendered):] if text.startswith(self.rendered) else text
        # BOS once: from the template's own text (parsed as a special token) or added here
        bos = not self.rendered and not (self.fmt.bos_token and text.startswith(self.fmt.bos_token))
        self.rendered = text
        return self.tokenizer.encode(delta, add_special=bos, parse_special=True)

    def assistant(self, reply: str) -> list[int] | None:
        """Add the reply (cut at an end-of-turn marker, stripped): the ids of the rest of the template's
        rendering of the finished turn (its end-of-turn marker), so that the next user() continues from
        it; None when the template rewrites earlier turns: the sequence must start over, and the next
        user() renders every message again."""
        for m in self.fmt.end_of_turn:
            reply = reply.split(m)[0] if m else reply
        reply = reply.strip()
        self.messages.append({"role": "assistant", "content": reply})
        before, after = self.rendered, self.fmt.render(self.messages, add_generation_prompt=False)
        if not (after.startswith(before) and after[len(before):].startswith(reply)):
            self.rendered = ""
            return None
        self.rendered = after
        tail = after[len(before) + len(reply):]
        return self.tokenizer.encode(tail, add_special=False, parse_special=True) if tail else []
