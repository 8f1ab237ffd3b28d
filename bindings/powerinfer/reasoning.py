"""A chat reply's reasoning apart from its answer, as llama.cpp's server does with `--reasoning-format deepseek`.

Models such as DeepSeek-R1 and Qwen3 write their reasoning between ``<think>`` and ``</think>`` before the answer.
With the format ``deepseek`` (or ``auto``, the default, which is deepseek as in llama.cpp) the reply's text up to
``</think>`` goes to ``message.reasoning_content`` (streamed as ``delta.reasoning_content``) and the rest, its leading
whitespace dropped, to ``message.content``. A reply that does not open with ``<think>`` (after whitespace) is all
content, unless the prompt itself ends inside an opened ``<think>`` (templates that make the model think: the reply
then starts in the reasoning). ``none`` leaves the text whole in ``content``. Streaming and whole responses give
the same strings: the splitter only holds back text that may still be the start of a tag.
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


def splitter_for(fmt: str, prompt: str) -> "ReasoningSplitter | None":
    """The splitter a chat reply to `prompt` (the rendered template) gets under format `fmt` (None: none)."""
    return None if check_format(fmt) == "none" else ReasoningSplitter(prompt_opens_thinking(prompt))


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
