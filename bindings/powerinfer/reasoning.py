"""A chat reply's reasoning apart from its answer, as llama.cpp's server does with `--reasoning-format deepseek`.

Models such as DeepSeek-R1 and Qwen3 write their reasoning between ``<think>`` and ``</think>`` before the answer.
With the format ``deepseek`` (or ``auto``, the default, which is deepseek as in llama.cpp) the reply's text up to
``</think>`` goes to ``message.reasoning_content`` (streamed as ``delta.reasoning_content``) and the rest, its leading
whitespace dropped, to ``message.content``. A reply that does not open with ``<think>`` (after whitespace) is all
content, unless the prompt itself ends inside an opened ``<think>`` (templates that make the model think: the reply
then starts in the reasoning). ``none`` leaves the text whole in ``content``. Streaming and whole responses give
the same strings: the splitter only holds back text that may still be the start of a tag.

gpt-oss writes OpenAI's harmony format instead: messages ``<|channel|>NAME<|message|>TEXT<|end|>``, each after
``<|start|>assistant``: the ``analysis`` channel's text goes to ``reasoning_content``, the ``final`` (and
``commentary``) channels' to ``content``, and the markers to neither (llama.cpp's gpt-oss parser; its tool calls on
the commentary channel are not read here).

Gemma 4 thinks in a channel: ``<|channel>thought``, whitespace, the reasoning, ``<channel|>``, then the answer
(llama.cpp's gemma4 parser): the reasoning goes to ``reasoning_content``, the rest to ``content``. A reply may hold
several such channels (an empty one often follows the answer); a ``<|channel>`` not followed by ``thought`` and a
``<channel|>`` outside a channel are dropped. A Gemma 4 prompt (its ``<|turn>`` markers) gets this splitter; a
prompt that turns thinking off ends with an empty channel, and the reply is then all content.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("auto", "deepseek", "none")


def check_format(fmt) -> str:
    if fmt not in FORMATS:
        from .request import RequestError
        raise RequestError(f"reasoning_format must be one of {', '.join(FORMATS)}, not {fmt!r}",
                           param="reasoning_format")
    return fmt


def splitter_for(fmt: str, prompt: str) -> "ReasoningSplitter | HarmonySplitter | Gemma4Splitter | None":
    """The splitter a chat reply to `prompt` (the rendered template) gets under format `fmt` (None: none): OpenAI's
    harmony channels where the prompt asks for an assistant message in that format (gpt-oss), Gemma 4's thought
    channel in a Gemma 4 conversation, else <think>."""
    if check_format(fmt) == "none":
        return None
    if prompt.rstrip().endswith(HARMONY_START):
        return HarmonySplitter()
    if GEMMA4_TURN in prompt and GEMMA4_TURN_END in prompt:
        return Gemma4Splitter(prompt_opens_reasoning(prompt, "gemma4"))
    return ReasoningSplitter(prompt_opens_reasoning(prompt, "hermes"))


def prompt_opens_reasoning(prompt: str, syntax: str) -> bool:
    """Whether a rendered chat prompt ends inside the reasoning of a tool-call syntax (powerinfer.tools): hermes'
    <think> (Qwen3-Thinking's template opens it), Gemma 4's thought channel."""
    if syntax in ("hermes", "qwen3_coder"):     # (qwen3_coder: Qwen3.5's XML calls, its <think> hermes')
        return prompt_opens_thinking(prompt)
    return syntax == "gemma4" and prompt.rstrip().endswith(GEMMA4_OPEN + GEMMA4_THOUGHT)


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an opened <think> (the reply continues the reasoning)."""
    tail = prompt.rstrip()
    return tail.endswith(OPEN)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of text that is a proper start of tag (0 if none)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """feed(text) -> (reasoning, content) released so far; finish() -> what was held back."""

    def __init__(self, in_think: bool = False):
        self.state = "think" if in_think else "start"   # start -> think -> after -> content, or start -> content
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(OPEN):
                    self.buf, self.state = s[len(OPEN):], "think"
                    continue
                if OPEN.startswith(s):            # whitespace, or a start of <think>: undecided
                    return reasoning, content
                self.state = "content"
            elif self.state == "think":
                i = self.buf.find(CLOSE)
                if i >= 0:
                    reasoning += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(CLOSE):], "after"
                    continue
                keep = _partial_suffix(self.buf, CLOSE)
                reasoning += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content
            elif self.state == "after":           # the answer's leading whitespace is dropped
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return reasoning, content
                self.state = "content"
            else:
                content += self.buf
                self.buf = ""
                return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The text held back at the end of the reply: an unclosed reasoning's tail, or the undecided start."""
        buf, self.buf = self.buf, ""
        if self.state == "think":
            return buf, ""
        if self.state == "after":
            return "", ""
        return "", buf


HARMONY_START = "<|start|>assistant"
_CHANNEL, _MESSAGE, _END = "<|channel|>", "<|message|>", "<|end|>"
_BODY_ENDS = (_END, "<|start|>", _CHANNEL)


class HarmonySplitter:
    """feed(text) -> (reasoning, content) released so far; finish() -> what was held back. Harmony messages: a
    header <|channel|>NAME ... <|message|>, a body that ends at <|end|> (or the next <|start|> / <|channel|>)."""

    def __init__(self):
        self.state, self.channel, self.buf = "between", "final", ""

    def _out(self, text: str) -> tuple[str, str]:
        return (text, "") if self.channel == "analysis" else ("", text)

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "between":          # before a message: its <|start|>assistant and header
                if self.buf.startswith(HARMONY_START):
                    self.buf = self.buf[len(HARMONY_START):]
                    continue
                if self.buf.startswith(_CHANNEL):
                    self.buf, self.state = self.buf[len(_CHANNEL):], "header"
                    continue
                if not self.buf or HARMONY_START.startswith(self.buf) or _CHANNEL.startswith(self.buf):
                    return reasoning, content
                self.state, self.channel = "body", "final"   # text without a header: the answer
            elif self.state == "header":
                i = self.buf.find(_MESSAGE)
                if i < 0:
                    return reasoning, content
                words = self.buf[:i].split()
                self.channel = words[0] if words else "final"
                self.buf, self.state = self.buf[i + len(_MESSAGE):], "body"
            else:
                ends = [i for i in (self.buf.find(t) for t in _BODY_ENDS) if i >= 0]
                if ends:
                    i = min(ends)
                    r, c = self._out(self.buf[:i])
                    reasoning, content = reasoning + r, content + c
                    rest = self.buf[i:]
                    self.buf, self.state = (rest[len(_END):] if rest.startswith(_END) else rest), "between"
                    continue
                keep = max(_partial_suffix(self.buf, t) for t in _BODY_ENDS)
                r, c = self._out(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning + r, content + c

    def finish(self) -> tuple[str, str]:
        """The text held back at the end of the reply (a body's tail; an unfinished header is dropped)."""
        buf, self.buf = self.buf, ""
        if self.state == "body":
            return self._out(buf)
        return ("", "") if self.state == "header" or HARMONY_START.startswith(buf) or _CHANNEL.startswith(buf) \
            else ("", buf)


GEMMA4_TURN, GEMMA4_TURN_END = "<|turn>", "<turn|>"
GEMMA4_OPEN, GEMMA4_CLOSE, GEMMA4_THOUGHT = "<|channel>", "<channel|>", "thought"


class Gemma4Splitter:
    """feed(text) -> (reasoning, content) released so far; finish() -> what was held back. States: content, open
    (after <|channel>: "thought" opens the reasoning, anything else drops the marker), lead (the reasoning's leading
    whitespace, skipped), think."""

    def __init__(self, in_thought: bool = False):
        self.state, self.buf = ("lead" if in_thought else "content"), ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "content":
                found = [(i, t) for t in (GEMMA4_OPEN, GEMMA4_CLOSE) if (i := self.buf.find(t)) >= 0]
                if found:
                    i, tag = min(found)
                    content += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(tag):], ("open" if tag == GEMMA4_OPEN else "content")
                    continue
                keep = max(_partial_suffix(self.buf, GEMMA4_OPEN), _partial_suffix(self.buf, GEMMA4_CLOSE))
                content += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content
            if self.state == "open":
                if self.buf.startswith(GEMMA4_THOUGHT):
                    self.buf, self.state = self.buf[len(GEMMA4_THOUGHT):], "lead"
                    continue
                if GEMMA4_THOUGHT.startswith(self.buf):      # undecided (or nothing yet)
                    return reasoning, content
                self.state = "content"
            elif self.state == "lead":
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return reasoning, content
                self.state = "think"
            else:
                i = self.buf.find(GEMMA4_CLOSE)
                if i >= 0:
                    reasoning += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(GEMMA4_CLOSE):], "content"
                    continue
                keep = _partial_suffix(self.buf, GEMMA4_CLOSE)
                reasoning += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The text held back at the end of the reply: an unclosed reasoning's tail, or a partial marker (content)."""
        buf, self.buf = self.buf, ""
        return (buf, "") if self.state in ("lead", "think") else ("", buf)
