"""PowerInfer: the object a Python user reaches for (load, tokenize, generate, logits)."""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from .context import Context
from .generate import Generator, Timings
from .model import Model
from .sampling import Sampler, SamplingParams
from .tokenizer import StreamDecoder


class PowerInfer:
    """A model with one context, in the spirit of llama-cpp-python's `Llama`.

    >>> llm = PowerInfer("models/tiny-q8_0.gguf", n_ctx=256)
    >>> for piece in llm.generate("Once upon a time", max_tokens=16, stream=True):
    ...     print(piece, end="")
    """

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 512, n_batch: int = 512,
                 n_threads: int | None = None, seed: int = -1, kv_type: str = "f16"):
        self.model = Model(model_path)
        self.tokenizer = self.model.tokenizer
        self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, kv_type=kv_type)
        self.seed = seed
        self.last_timings: Timings | None = None

    # ---- tokens ----
    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return self.tokenizer.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens) -> str:
        return self.tokenizer.decode(tokens)

    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def token_eos(self) -> int | None:
        return self.tokenizer.eos_id

    # ---- logits ----
    def eval_logits(self, tokens) -> np.ndarray:
        """[len(tokens), n_vocab] logits of every position, from an empty cache."""
        self.ctx.kv_clear()
        self.ctx.decode(tokens, pos=range(len(tokens)), logits="all")
        out = np.stack([self.ctx.logits(i) for i in range(len(tokens))])
        self.ctx.kv_clear()
        return out

    # ---- generation ----
    def generate_tokens(self, prompt_tokens, sampling: SamplingParams, max_tokens: int = -1) -> Iterator[int]:
        """Stream token ids (end-of-generation token excluded), starting from an empty cache."""
        self.ctx.kv_clear()
        sampling.validate()
        eos = [self.tokenizer.eos_id] if self.tokenizer.eos_id is not None else []
        gen = Generator(self.ctx, Sampler(sampling, eos_ids=eos))
        self.last_timings = gen.timings
        gen.feed(prompt_tokens)
        eog = [] if sampling.ignore_eos else eos
        for tok in gen.generate(max_tokens, eog_ids=eog):
            if tok in eog:
                return
            yield tok

    def generate(self, prompt: str, max_tokens: int = 128, *, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, seed: int | None = None,
                 stop: list[str] | str | None = None, ignore_eos: bool = False,
                 stream: bool = False) -> str | Iterator[str]:
        """Complete `prompt`. stream=True returns an iterator of text pieces; stop strings end the
        text and are not included."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                seed=self.seed if seed is None else seed, ignore_eos=ignore_eos)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        pieces = self._stream_text(self.tokenize(prompt), params, max_tokens, stops)
        return pieces if stream else "".join(pieces)

    def _stream_text(self, prompt_tokens, params, max_tokens, stops) -> Iterator[str]:
        decoder = StreamDecoder(self.tokenizer, strip_leading_space=False)
        keep = max((len(s) - 1 for s in stops), default=0)   # tail that could begin a stop string
        held = ""
        for tok in self.generate_tokens(prompt_tokens, params, max_tokens):
            held += decoder.push(tok)
            cut = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                if cut:
                    yield held[:cut]
                return
            if len(held) > keep:
                yield held[:len(held) - keep]
                held = held[len(held) - keep:]
        held += decoder.flush()
        cut = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
        held = held[:cut] if cut >= 0 else held
        if held:
            yield held

    def close(self) -> None:
        self.ctx = None
        self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
