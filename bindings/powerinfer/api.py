"""PowerInfer: the object a Python user reaches for (load, tokenize, generate, logits), with an
OpenAI-shaped completion API in the spirit of llama-cpp-python's `Llama`.

`create_completion` / `create_chat_completion` run through the same engine (slots, continuous
batching; `powerinfer.engine`) and the same response shaping (`CompletionShaper`) as the
HTTP server's OpenAI routes.
"""
from __future__ import annotations

import logging
import os
import re
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .cli_args import KV_GGML_IDS, KV_TYPES
from .context import Context, kv_types
from .engine import Engine
from .grammar import Grammar, GrammarError, grammar_of_response_format
from .control_vector import load_control_vectors
from .embedding import POOLING_IDS
from .lora import load_adapters, scaled_adapters
from .prompt_cache import PromptCache
from .model import Model
from .reasoning import check_format as check_reasoning_format
from .reasoning import splitter_for
from .request import RequestError, Result, Task, TaskEvents, common_prefix
from .sampling import EXTRA_NUMBERS, SamplingParams
from .speculative import SpecParams, make_drafter
from .token_loop import TokenLoop

log = logging.getLogger("powerinfer")

__all__ = ["CompletionShaper", "PowerInfer", "PowerInferState", "check_unimplemented", "resolve_grammar"]

# Sampling parameters of llama.cpp, llama-cpp-python and OpenAI that the sampler does not implement, each
# with the test for the value that switches it off. Any other value is refused (400 / ValueError naming
# the parameter), so a request never gets a sampler it did not ask for without a word.
UNIMPLEMENTED = {
    "tfs_z": lambda v: v >= 1.0,               # tail-free sampling: llama.cpp removed it too
    "penalize_nl": lambda v: v is True,        # the penalties apply to newlines as to every token
    "post_sampling_probs": lambda v: v is False,
    "t_max_predict_ms": lambda v: v <= 0,
    "grammar_lazy": lambda v: v is False,
}


# SamplingParams' fields a request may set beyond the classic ones (make_task's sampler_options)
_SAMPLER_OPTIONS = frozenset(EXTRA_NUMBERS + ("dry_sequence_breakers", "samplers"))


def check_unimplemented(values: dict) -> None:
    """RequestError (400) naming the first parameter of `values` that asks for a sampler we lack."""
    for name, off in UNIMPLEMENTED.items():
        v = values.get(name)
        if v is None:
            continue
        try:
            ok = off(v)
        except TypeError:
            ok = False
        if not ok:
            raise RequestError(f"'{name}' = {v!r} is not implemented by this server's sampler (only the value "
                               "that turns it off is accepted)", param=name, code="not_supported")


def resolve_grammar(grammar=None, json_schema=None, response_format=None) -> Grammar | None:
    """The one Grammar of a request: `grammar` (GBNF text or a Grammar), `json_schema` (llama.cpp's
    /completion), `response_format` (OpenAI); RequestError if it is invalid or more than one is given."""
    if isinstance(grammar, str) and not grammar.strip():
        grammar = None                   # llama.cpp's web UI and many clients send "grammar": "" for none
    given = [n for n, v in (("grammar", grammar), ("json_schema", json_schema)) if v is not None]
    rf = grammar_of_response_format_or_error(response_format)
    if rf is not None:
        given.append("response_format")
    if len(given) > 1:
        raise RequestError(f"give one of {', '.join(given)}, not several", param=given[1])
    try:
        if grammar is not None:
            if isinstance(grammar, Grammar):
                return grammar
            if not isinstance(grammar, str):
                raise RequestError("'grammar' must be a GBNF string", param="grammar")
            return Grammar.from_gbnf(grammar)
        if json_schema is not None:
            return Grammar.from_json_schema(json_schema)
    except GrammarError as e:
        raise RequestError(str(e), param=given[0], code="invalid_grammar") from None
    return rf


def grammar_of_response_format_or_error(rf) -> Grammar | None:
    try:
        return grammar_of_response_format(rf)
    except GrammarError as e:
        raise RequestError(str(e), param="response_format", code="invalid_grammar") from None


def _as_stop_list(stop, param: str = "stop") -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise RequestError(f"'{param}' must be a string or an array of strings", param=param)


class CompletionShaper:
    """Builds OpenAI response objects (`text_completion` / `chat.completion` and their chunks)
    from engine events. One instance per request; shared by the Python API and the server."""

    def __init__(self, kind: str, model: str, *, prefix: str = "", logprobs: int | None = None,
                 tokenizer=None, tools=None, reasoning=None):
        assert kind in ("text", "chat")
        self.tools = tools              # powerinfer.tools.ToolCalls: the reply is a call
        # powerinfer.reasoning.ReasoningSplitter: <think>...</think> to reasoning_content (chat replies without tools)
        self.reasoning = reasoning if kind == "chat" and tools is None else None
        self.reasoning_text = ""
        self.kind = kind
        self.model = model
        self.id = ("cmpl-" if kind == "text" else "chatcmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.prefix = prefix            # echo: the prompt text, sent first
        self.logprobs = logprobs        # None: no logprobs; else the number of top alternatives
        self.tokenizer = tokenizer
        self.text = ""
        self._streamed = ""             # tools "auto": the content streamed so far (the reply's text before a call)
        # tools "auto" in a syntax whose reasoning channel streams apart (Gemma 4): its splitter, the content it let
        # through, the reasoning streamed so far
        self._live = tools.live_splitter() if tools is not None and tools.auto else None
        self._live_content = self._live_reasoning = ""
        self._lp: list = []             # per token: (piece, logprob, top [(id, lp)])
        self._offset = len(prefix)

    # ---- pieces
    def _piece(self, tid: int) -> str:
        return self.tokenizer.token_to_piece(tid).decode("utf-8", errors="replace")

    def _logprob_entry(self, info) -> Any:
        piece = info.get("piece", "")
        if info.get("logprob") is None:      # the prompt's first token (echo): nothing before it
            return (piece, None, None)
        if self.kind == "chat":
            top = [{"token": self._piece(t), "logprob": lp, "bytes": list(self.tokenizer.token_to_piece(t))}
                   for t, lp in info["top"][:self.logprobs]]
            return {"token": piece, "logprob": info["logprob"], "bytes": list(piece.encode()), "top_logprobs": top}
        return (piece, info["logprob"], {self._piece(t): lp for t, lp in info["top"][:max(self.logprobs, 1)]})

    def _text_logprobs(self, entries) -> dict:
        out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
        for piece, lp, top in entries:
            out["tokens"].append(piece)
            out["text_offset"].append(self._offset)
            self._offset += len(piece)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(top)
        return out

    def _lp_field(self, entries):
        if self.logprobs is None:
            return None
        if self.kind == "chat":
            return {"content": list(entries)}
        return self._text_logprobs(entries)

    # ---- streaming
    def _chunk(self, choice: dict, usage=None) -> dict:
        obj = "text_completion" if self.kind == "text" else "chat.completion.chunk"
        c = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
             "choices": [choice] if choice is not None else []}
        if self.kind == "chat":
            c["system_fingerprint"] = None
        if usage is not None:
            c["usage"] = usage
        return c

    def start_chunks(self) -> list[dict]:
        if self.kind == "chat":
            return [self._chunk({"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None})]
        if self.prefix:
            self.text += self.prefix
            return [self._chunk({"text": self.prefix, "index": 0, "logprobs": None, "finish_reason": None})]
        return []

    def token_chunk(self, text: str, info) -> dict | None:
        """The chunk for a ("token", text, info) event (None if there is nothing to send)."""
        if self.tools is not None:           # a call is sent whole, at the end
            self.text += text
            if not self.tools.auto:
                return None
            # "auto": the text streams until a call may begin (and without the whitespace at its ends, which the
            # message's content drops): what may be a call is held back for final_chunks; a live splitter's reasoning
            # streams as it comes
            delta, shown = {}, self.text
            if self._live is not None:
                reasoning, content = self._live.feed(text)
                self._live_content += content
                self._live_reasoning += reasoning
                delta, shown = ({"reasoning_content": reasoning} if reasoning else {}), self._live_content
            visible = shown[:self.tools.hold_from(shown)].strip()
            if visible[len(self._streamed):]:
                delta["content"] = visible[len(self._streamed):]
                self._streamed = visible
            if not delta:
                return None
            return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})
        wanted = self.logprobs is not None and info is not None and "top" in info
        entry = self._logprob_entry(info) if wanted else None
        if not text and entry is None:
            return None
        lp = self._lp_field([entry]) if entry is not None else None
        if self.reasoning is not None:
            delta = self._split(*self.reasoning.feed(text))
            if not delta and entry is None:
                return None
            return self._chunk({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": None})
        self.text += text
        if self.kind == "chat":
            return self._chunk({"index": 0, "delta": {"content": text}, "logprobs": lp, "finish_reason": None})
        return self._chunk({"text": text, "index": 0, "logprobs": lp, "finish_reason": None})

    def _split(self, reasoning: str, content: str) -> dict:
        """Accumulates a (reasoning, content) pair of the splitter; the delta that carries it."""
        self.reasoning_text += reasoning
        self.text += content
        return {k: v for k, v in (("reasoning_content", reasoning), ("content", content)) if v}

    def final_chunks(self, res: Result, include_usage: bool = False) -> list[dict]:
        msg = self._tool_message(res)
        held = self._split(*self.reasoning.finish()) if self.reasoning is not None else {}
        if self.tools is not None:
            # the reasoning (a channel syntax's, held back with the rest), the content not streamed yet ("auto"
            # streamed what came before a possible call), then the calls
            if msg is not None:
                reasoning, content = msg.get("reasoning_content", ""), msg["content"] or ""
            else:
                reasoning, content = self.tools.plain(self.text) if self.tools.auto else ("", self.text)
            rest = content[len(self._streamed):] if content.startswith(self._streamed) else content
            reasoning = reasoning[len(self._live_reasoning):] if reasoning.startswith(self._live_reasoning) \
                else reasoning
            out = [self._chunk({"index": 0, "delta": {key: text}, "logprobs": None, "finish_reason": None})
                   for key, text in (("reasoning_content", reasoning), ("content", rest)) if text]
            if msg is not None:
                calls = [dict(c, index=i) for i, c in enumerate(msg["tool_calls"])]
                out.append(self._chunk({"index": 0, "delta": {"tool_calls": calls}, "logprobs": None,
                                        "finish_reason": None}))
            out.append(self._chunk({"index": 0, "delta": {}, "logprobs": None,
                                    "finish_reason": "tool_calls" if msg is not None else res.finish_reason}))
        elif self.kind == "chat":            # first what the reasoning splitter held back (a partial tag)
            out = [self._chunk({"index": 0, "delta": held, "logprobs": None, "finish_reason": None})] if held else []
            out.append(self._chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": res.finish_reason}))
        else:
            out = [self._chunk({"text": "", "index": 0, "logprobs": None, "finish_reason": res.finish_reason})]
        if include_usage:
            out.append(self._chunk(None, usage=self.usage(res)))
        return out

    # ---- whole responses
    @staticmethod
    def usage(res: Result) -> dict:
        return {"prompt_tokens": res.n_prompt, "completion_tokens": res.n_predicted,
                "total_tokens": res.n_prompt + res.n_predicted}

    def add(self, text: str, info) -> None:
        """Non-streaming: accumulate one token event."""
        if self.reasoning is not None:
            self._split(*self.reasoning.feed(text))
        else:
            self.text += text
        if self.logprobs is not None and info is not None and "top" in info:
            self._lp.append(self._logprob_entry(info))

    def _tool_message(self, res: Result) -> dict | None:
        """The reply's calls: a constrained call once complete; "auto" calls wherever the reply ended."""
        if self.tools is None or (res.stop_type != "eos" and not self.tools.auto):
            return None
        return self.tools.message(self.text)

    def response(self, res: Result) -> dict:
        if self.kind == "chat":
            call = self._tool_message(res)
            if self.reasoning is not None:
                self._split(*self.reasoning.finish())
            if call is None and self.tools is not None and self.tools.auto:    # an answer, not a call
                reasoning, content = self.tools.plain(self.text)
                self.reasoning_text += reasoning
                msg = {"role": "assistant", "content": content}
            else:
                msg = call or {"role": "assistant", "content": self.text}
            if call is None and self.reasoning_text:
                msg["reasoning_content"] = self.reasoning_text
            choice = {"index": 0, "message": msg,
                      "logprobs": self._lp_field(self._lp),
                      "finish_reason": "tool_calls" if call is not None else res.finish_reason}
            obj = "chat.completion"
        else:
            lp = self._lp
            if res.prompt_probs and self.logprobs is not None:   # echo: the prompt's tokens first, offsets from 0
                self._offset = 0
                lp = [self._logprob_entry(dict(i, piece=self._piece(i["id"]))) for i in res.prompt_probs] + lp
            choice = {"text": self.prefix + self.text, "index": 0, "logprobs": self._lp_field(lp),
                      "finish_reason": res.finish_reason}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage(res)}


_GGML_KV_NAMES = {i: name for name, i in KV_GGML_IDS.items()}   # llama-cpp-python passes type_k / type_v as ids


def _llama_aliases(kv_type, pooling, *, type_k, type_v, pooling_type):
    """llama-cpp-python's type_k / type_v (ggml type ids, e.g. 1 = f16, 8 = q8_0, or names) and pooling_type
    (-1 = the file's, 0 none, 1 mean, 2 cls, 3 last, 4 rank) -> kv_type (a (K, V) pair where they differ), pooling."""
    k, v = kv_types(kv_type)
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        if t is None:
            continue
        t = _GGML_KV_NAMES.get(t, t)
        if t not in KV_TYPES:
            raise ValueError(f"{name}={t!r}: the KV cache is one of {', '.join(KV_TYPES)} (or their ggml type ids "
                             f"{', '.join(str(i) for i in _GGML_KV_NAMES)}) here")
        if name == "type_k":
            k = t
        else:
            v = t
    kv_type = k if k == v else (k, v)
    if pooling_type is not None:
        table = {-1: None, **POOLING_IDS}
        if pooling_type not in table:
            raise ValueError(f"pooling_type={pooling_type!r}: -1 (the file's), 0 none, 1 mean, 2 cls, 3 last or "
                             "4 rank")
        pooling = table[pooling_type]
    return kv_type, pooling


@dataclass
class PowerInferState:
    """PowerInfer.save_state(): each slot's cached tokens, with what they must be restored into."""
    model_path: str
    n_ctx: int
    n_slots: int
    slots: list
    seed: int
    n_tokens: int = 0                   # the token loop's (eval / generate(tokens)): its evaluated tokens
    input_ids: list = field(default_factory=list)
    scores: np.ndarray | None = None    # [n_tokens or 1, n_vocab] its logits (every position's with logits_all)


class PowerInfer:
    """A model with one context, in the spirit of llama-cpp-python's `Llama`.

    >>> llm = PowerInfer("models/tiny-q8_0.gguf", n_ctx=256)
    >>> for piece in llm.generate("Once upon a time", max_tokens=16, stream=True):
    ...     print(piece, end="")
    >>> llm.create_completion("Once upon a time", max_tokens=16)["choices"][0]["text"]
    >>> llm.create_chat_completion([{"role": "user", "content": "Hi"}])["choices"][0]["message"]

    n_ctx None: 4096 tokens, or the model's training context if smaller (llama.cpp's default); 0: the
    training context. n_parallel > 1 splits the context into that many slots (n_ctx / n_parallel tokens each) that
    the completion engine decodes together (what the server's -np does).
    """

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int | None = None, n_batch: int = 512,
                 n_threads: int | None = None, seed: int = -1, kv_type: str | tuple[str, str] = "f16",
                 n_parallel: int = 1,
                 chat_format: str | None = None, chat_template: str | None = None,
                 sparse_threshold: float | None = None, dense: bool = False, model_alias: str | None = None,
                 repack: bool | None = None, vram_budget: int | None = None, reset_gpu_index: bool = False,
                 disable_gpu_index: bool = False, n_gpu_layers: int | None = None, pooling: str | None = None,
                 sparsity: float | None = None, verbose: bool = True, n_threads_batch: int | None = None,
                 n_ubatch: int | None = None, type_k=None, type_v=None, pooling_type: int | None = None,
                 flash_attn: bool = False, use_mmap: bool = True, use_mlock: bool = False, logits_all: bool = False,
                 embedding: bool = False, offload_kqv: bool = True, last_n_tokens_size: int = 64,
                 numa=False, main_gpu: int = 0, sparse_batch_max: int = 0, sparse_gather_max: int = 1,
                 reasoning_format: str = "auto", draft_model=None, draft_max: int = 16, draft_min: int = 0,
                 draft_p_min: float = 0.75, rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0,
                 rope_scaling_type: int | str | None = -1, yarn_ext_factor: float = -1.0,
                 yarn_attn_factor: float = -1.0, yarn_beta_fast: float = -1.0, yarn_beta_slow: float = -1.0,
                 yarn_orig_ctx: int = 0, kv_overrides: dict | None = None, lora_path: str | None = None,
                 lora_scale: float = 1.0, lora_base: str | None = None, lora=(), control_vectors=(),
                 control_vector_layer_range: tuple[int, int] | None = None, cache_ram_mib: int = 0, **unsupported):
        """pooling: of embed() / create_embedding() (powerinfer.embedding; None: the file's, else mean).
        reasoning_format: the default of create_chat_completion's (powerinfer.reasoning: auto / deepseek put a
        reply's <think>...</think> in message.reasoning_content, none leaves it in content; llama.cpp's server flag).
        sparsity: a stored level of a gate-sparse file (tools/sparsify.py); sparse_batch_max: decode calls of more
        tokens (prompts) run such a file's dense model (0: every call runs the level); sparse_gather_max: calls of
        more tokens run the level over the dense kernels (0: every call through the sparse kernels; Context).
        vram_budget (bytes; None: free GPU memory - 256 MiB when there is a GPU), reset_gpu_index and
        disable_gpu_index place a PowerInfer file on the GPU; n_gpu_layers (llama-cpp-python's name; -1: all)
        a dense GGUF file. See powerinfer.offload.
        draft_model: speculative decoding (powerinfer.speculative; the same output, faster where drafts hold): a
        draft model's GGUF path (same vocabulary; run greedily, drafts stop below draft_p_min), a Drafter such
        as PromptLookup(), or llama-cpp-python's LlamaDraftModel (a callable: input_ids -> draft ids);
        draft_max / draft_min: tokens drafted per step at most / at least (llama.cpp's --draft-max / --draft-min).
        lora_path / lora_scale (llama-cpp-python's): a LoRA adapter (llama.cpp's GGUF adapter; convert-lora.py makes
        one from a PEFT directory) applied with that scale; lora: more (path, scale) pairs (llama.cpp's --lora-scaled),
        after lora_path's. lora_base changes nothing (llama.cpp applies adapters to the loaded weights, quantized or
        not). A request's adapters: create_completion(..., lora=[(i, scale), ...]) (powerinfer.lora).
        control_vectors: (path, strength) pairs of llama.cpp control vector files, added up, after the layers of
        control_vector_layer_range (start, end; default 1 .. n_layer) (powerinfer.control_vector).
        cache_ram_mib: keep up to this many MiB of slots' prompts in RAM beyond their slots (llama.cpp's --cache-ram;
        -1: no limit, 0: off; powerinfer.prompt_cache).

        llama-cpp-python's `Llama` keywords: verbose (False: no load report), n_threads_batch (the threads of
        prompts: decode calls of more than one token; None: n_threads), n_ubatch (the most tokens one decode call
        computes, llama.cpp's physical batch: n_batch is lowered to it), type_k/type_v
        (the K and V caches' types, as kv_type's names or ggml's type ids: 1 f16, 0 f32, 8 q8_0, 2 q4_0, ...),
        pooling_type (ggml's -1..4 = file's, none, mean, cls, last, rank), main_gpu 0;
        use_mlock keeps the weights in RAM (Model.mlock; a warning where the system refuses); use_mmap=False reads
        the file into memory instead of mapping it;
        logits_all keeps every position's logits in `scores` of the token loop (eval / generate(tokens): powerinfer
        .token_loop; otherwise the last position's); last_n_tokens_size is the penalty window of the token loop
        and the default repeat_last_n of completions; flash_attn, embedding, offload_kqv, numa change nothing
        here (said once when set); rope_freq_base, rope_freq_scale, rope_scaling_type (-1 the file's, 0 none, 1
        linear, 2 yarn, or those names), yarn_* (0 / negative: the file's) and kv_overrides ({key: value} read instead
        of the file's metadata) as llama.cpp's (powerinfer.rope). Anything else of Llama's raises ValueError
        naming it."""
        kv_type, pooling = _llama_aliases(kv_type, pooling, type_k=type_k, type_v=type_v, pooling_type=pooling_type)
        if unsupported:
            raise ValueError(f"PowerInfer(): {', '.join(sorted(unsupported))} not supported (llama-cpp-python's "
                             "Llama keywords this engine does not implement)")
        if n_ubatch is not None:
            if isinstance(n_ubatch, bool) or not isinstance(n_ubatch, int) or n_ubatch < 1:
                raise ValueError(f"n_ubatch must be an int >= 1, got {n_ubatch!r}")
            n_batch = min(n_batch, n_ubatch) if n_batch > 0 else n_ubatch
        if isinstance(last_n_tokens_size, bool) or not isinstance(last_n_tokens_size, int) or last_n_tokens_size < -1:
            raise ValueError(f"last_n_tokens_size must be an int >= -1 (-1: all), got {last_n_tokens_size!r}")
        self.last_n_tokens_size = last_n_tokens_size
        if main_gpu != 0:
            raise ValueError("main_gpu: only device 0 is used")
        noop = [n for n, v, d in (("flash_attn", flash_attn, False),
                                  ("embedding", embedding, False),
                                  ("offload_kqv", offload_kqv, True), ("numa", numa, False),
                                  ("lora_base", lora_base, None)) if v != d]
        if noop and verbose:
            log.warning("PowerInfer(): %s change nothing here (llama-cpp-python keywords: one attention kernel, "
                        "logits and embeddings always available, the KV cache follows the offload policy)",
                        ", ".join(noop))
        self.verbose = verbose
        t0 = time.perf_counter()
        scaling = {-1: None, 0: "none", 1: "linear", 2: "yarn", None: None}.get(rope_scaling_type, rope_scaling_type)
        self.model = Model(model_path, repack=repack, kv_overrides=kv_overrides, use_mmap=use_mmap,
                           rope_freq_base=rope_freq_base,
                           rope_freq_scale=rope_freq_scale, rope_scaling=scaling, yarn_ext_factor=yarn_ext_factor,
                           yarn_attn_factor=yarn_attn_factor, yarn_beta_fast=yarn_beta_fast,
                           yarn_beta_slow=yarn_beta_slow, yarn_orig_ctx=yarn_orig_ctx)
        if use_mlock:
            warning = self.model.mlock()
            if warning:
                log.warning("PowerInfer(use_mlock=True): %s", warning)
        self.model_path = str(model_path)
        self.tokenizer = self.model.tokenizer
        self._fim = None   # the FIM tokens (fim), looked up on first use
        self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_parallel, n_threads=n_threads,
                           n_threads_batch=n_threads_batch,
                           kv_type=kv_type, sparse_threshold=sparse_threshold, dense=dense, vram_budget=vram_budget,
                           reset_gpu_index=reset_gpu_index, disable_gpu_index=disable_gpu_index,
                           n_gpu_layers=n_gpu_layers, sparsity=sparsity, sparse_batch_max=sparse_batch_max,
                           sparse_gather_max=sparse_gather_max)
        self.ctx.set_lora(load_adapters(self.model, ([(lora_path, lora_scale)] if lora_path else []) + list(lora)))
        if control_vectors:
            self.ctx.set_control_vector(load_control_vectors(self.model, control_vectors),
                                        *(control_vector_layer_range or (1, None)))
        spec = SpecParams(draft_max, draft_min, draft_p_min)
        spec.validate()
        drafter = make_drafter(draft_model, target_tokenizer=self.tokenizer, n_ctx=self.ctx.n_ctx,
                               n_seq_max=n_parallel, n_threads=n_threads, p_min=draft_p_min, n_batch=n_batch)
        if isinstance(cache_ram_mib, bool) or not isinstance(cache_ram_mib, int) or cache_ram_mib < -1:
            raise ValueError(f"cache_ram_mib must be -1 (no limit), 0 (off) or a size in MiB, got {cache_ram_mib!r}")
        prompt_cache = PromptCache(max(cache_ram_mib, 0) << 20) if cache_ram_mib else None
        self.engine = Engine(self.ctx, self.tokenizer, n_parallel, drafter=drafter, spec=spec,
                             prompt_cache=prompt_cache)
        self.seed = seed
        owner = weakref.ref(self)     # no reference cycle: the context (device memory) goes with the last reference
        self.token_loop = TokenLoop(self.engine, self.model.n_vocab, logits_all=bool(logits_all),
                                    last_n_tokens_size=last_n_tokens_size, seed=lambda: owner().seed,
                                    eog_ids=self.tokenizer.eog_ids, tokenizer=self.tokenizer)
        self.model_name = model_alias or Path(model_path).name
        self.chat_format = chat_format
        self.reasoning_format = check_reasoning_format(reasoning_format)
        self.chat_template = chat_template
        self._chat = None
        self.last_result: Result | None = None     # how the last create_* request ended
        self.pooling, self._kv_type, self._embedder = pooling, kv_type, None
        self._init_kwargs = dict(n_ctx=n_ctx, n_parallel=n_parallel)
        if verbose:
            log.info("PowerInfer: %s loaded in %.2f s: n_ctx %d (%d slot%s), n_batch %d, %d threads, %s%s",
                     self.model_name, time.perf_counter() - t0, self.ctx.n_ctx, n_parallel,
                     "s" if n_parallel > 1 else "", self.ctx.n_batch, self.ctx.n_threads,
                     "sparse" if self.ctx.sparse else "dense", f", {n_gpu_layers} GPU layers" if n_gpu_layers else "")

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, *, revision: str | None = None,
                        cache_dir=None, **kwargs) -> "PowerInfer":
        """A model from the Hugging Face Hub (llama-cpp-python's Llama.from_pretrained): filename is the
        file's name or a glob ("*Q4_K_M.gguf"), None: the repository's one .gguf (a PowerInfer file
        first); downloaded once into the Hugging Face cache, with the activation/ folder (powerinfer.hub)."""
        from .hub import HubError, resolve_hf
        try:
            path = resolve_hf(repo_id, filename, revision=revision, cache_dir=cache_dir,
                              log=(lambda m: log.info("%s", m)))
        except HubError as e:
            raise ValueError(str(e)) from None
        return cls(path, **kwargs)

    # ---- state (llama-cpp-python's save_state / load_state) ----
    def save_state(self) -> "PowerInferState":
        """What the KV cache holds: each slot's cached tokens (no request may be in flight)."""
        loop = self.token_loop
        return PowerInferState(model_path=self.model_path, n_ctx=self.ctx.n_ctx, n_slots=self.engine.n_slots,
                               slots=self.engine.snapshot(), seed=self.seed, n_tokens=loop.n_tokens,
                               input_ids=loop.eval_tokens, scores=loop._scores.copy())

    def load_state(self, state: "PowerInferState") -> None:
        """Restore a save_state() of the same model and context: the KV cache holds those tokens again
        (evaluated again: the same KV bits), so a completion whose prompt starts with them reuses them.
        The seed comes back too."""
        if not isinstance(state, PowerInferState):
            raise ValueError("load_state takes a PowerInferState (from save_state)")
        if state.n_ctx != self.ctx.n_ctx or state.n_slots != self.engine.n_slots:
            raise ValueError(f"the state is of n_ctx {state.n_ctx} / {state.n_slots} slots, this model has "
                             f"{self.ctx.n_ctx} / {self.engine.n_slots}")
        self.engine.restore(state.slots)
        self.seed = state.seed
        self.token_loop.restore(state.input_ids[:state.n_tokens], state.scores)

    # ---- tokens ----
    def tokenize(self, text: str | bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return self.tokenizer.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens) -> str:
        return self.tokenizer.decode(tokens)

    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def n_vocab(self) -> int:
        return self.model.n_vocab

    def token_eos(self) -> int | None:
        return self.tokenizer.eos_id

    def token_bos(self) -> int | None:
        return self.tokenizer.bos_id

    def token_nl(self) -> int:
        """The token of "\n" (llama-cpp-python's token_nl)."""
        return self.tokenizer.encode("\n", add_special=False)[-1]

    def n_embd(self) -> int:
        return self.model.hparams.n_embd

    def pooling_type(self) -> int:
        """The embeddings' pooling as llama.cpp's id (0 none, 1 mean, 2 cls, 3 last, 4 rank)."""
        return next(i for i, name in POOLING_IDS.items() if name == self.embedder.pooling)

    def set_seed(self, seed: int) -> None:
        """The seed of the requests that give none (llama-cpp-python's set_seed)."""
        self.seed = seed

    def set_cache(self, cache) -> None:
        """llama-cpp-python's set_cache(LlamaRAMCache() / LlamaDiskCache()): accepted and changes nothing: the slots
        keep their prompts' KV and a request reuses the longest matching prefix (save_state / load_state, and the
        server's --slot-save-path, keep it across runs)."""
        log.info("PowerInfer.set_cache: changes nothing here (the slots keep their prompts' KV cache)")

    @staticmethod
    def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
        """log-softmax of logits along axis (llama-cpp-python's), in float32."""
        x = np.asarray(logits, dtype=np.float64)
        m = np.max(x, axis=axis, keepdims=True)
        return (x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))).astype(np.float32)

    @staticmethod
    def longest_token_prefix(a, b) -> int:
        """How many leading tokens a and b share (llama-cpp-python's)."""
        return common_prefix(list(a), list(b))

    @property
    def metadata(self) -> dict:
        return self.model.metadata

    # ---- logits ----
    def eval_logits(self, tokens) -> np.ndarray:
        """[len(tokens), n_vocab] logits of every position, from an empty cache."""
        self.engine.invalidate()
        self.ctx.kv_clear()
        self.ctx.set_lora(self.engine.lora)          # the last step may have run a request's own scales
        self.ctx.decode(tokens, pos=range(len(tokens)), logits="all")
        out = np.stack([self.ctx.logits(i) for i in range(len(tokens))])
        self.ctx.kv_clear()
        return out

    # ---- embeddings (powerinfer.embedding: a context of their own, so they never touch the slots) ----
    @property
    def embedder(self):
        """The Embedder behind embed() (its own CPU context of one slot's size), made on first use."""
        if self._embedder is None:
            from .embedding import Embedder
            self._embedder = Embedder(self.model, n_ctx=self.engine.n_ctx_slot, n_batch=self.ctx.n_batch,
                                      n_threads=self.ctx.n_threads, kv_type=self._kv_type,
                                      sparse_threshold=self.ctx.sparse_threshold,
                                      dense=self.model.sparse and not self.ctx.sparse, pooling=self.pooling)
        self._embedder.ctx.set_lora(self.engine.lora)   # the adapters' current scales (set_lora_scales)
        return self._embedder

    def embed(self, input, normalize: bool = True, truncate: bool = True, return_count: bool = False,
              pooling: str | None = None):
        """Pooled final hidden state(s) of a string, token list, or list of those (L2-normalized unless
        normalize=False; llama-cpp-python's default is False); see powerinfer.embedding.embed."""
        from .embedding import embed
        return embed(self, input, normalize=normalize, truncate=truncate, return_count=return_count,
                     pooling=pooling)

    def rerank(self, query: str, documents: list[str], top_n: int | None = None) -> list[dict]:
        """A reranker model's (pooling "rank": Qwen3-Reranker and the like, as llama.cpp converts them) relevance of
        each document to the query: [{"index", "relevance_score"}] best first, at most top_n (llama.cpp's /rerank).
        ValueError for a model without a classifier head or bad arguments."""
        from .embedding import rerank
        return rerank(self, query, documents, top_n=top_n)[0]

    def create_embedding(self, input, model: str | None = None, normalize: bool = True, pooling: str | None = None):
        """OpenAI-shaped embeddings response (llama-cpp-python's create_embedding)."""
        from .embedding import create_embedding
        return create_embedding(self, input, model, normalize=normalize, pooling=pooling)

    # ---- generation ----
    def generate_tokens(self, prompt_tokens, sampling: SamplingParams, max_tokens: int = -1) -> Iterator[int]:
        """Stream token ids (end-of-generation token excluded) through the engine."""
        sampling.validate()
        task = Task(prompt_tokens, sampling, n_predict=max_tokens, want_ids=True)
        self.engine.check(task)
        for kind, _, info in self._events(task):
            if kind == "token" and info is not None:
                yield info["id"]

    def generate(self, prompt, *args, **kwargs):
        """Text in, text out (generate_text) -- or, given token ids, llama-cpp-python's Llama.generate(tokens, top_k,
        top_p, min_p, typical_p, temp, repeat_penalty, reset, ...): a generator of sampled token ids
        (powerinfer.token_loop, with eval, sample, reset, n_tokens, input_ids and scores)."""
        if isinstance(prompt, (str, bytes)):
            return self.generate_text(prompt.decode() if isinstance(prompt, bytes) else prompt, *args, **kwargs)
        return self.token_loop.generate(prompt, *args, **kwargs)

    # ---- llama-cpp-python's token loop (powerinfer.token_loop)
    def eval(self, tokens) -> None:
        """Evaluate tokens after the first n_tokens (llama-cpp-python's Llama.eval)."""
        self.token_loop.eval(tokens)

    def sample(self, *args, **kwargs) -> int:
        """A token sampled from the logits after position idx (default: the last evaluated; Llama.sample)."""
        return self.token_loop.sample(*args, **kwargs)

    def reset(self) -> None:
        """Forget the token loop's tokens (n_tokens = 0; Llama.reset); their KV stays as slot 0's prompt cache."""
        self.token_loop.reset()

    @property
    def n_tokens(self) -> int:
        return self.token_loop.n_tokens

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self.token_loop.n_tokens:
            raise ValueError(f"n_tokens can be lowered to 0..{self.token_loop.n_tokens}, got {n!r}")
        self.token_loop.n_tokens = int(n)

    @property
    def input_ids(self) -> np.ndarray:
        return self.token_loop.input_ids

    @property
    def scores(self) -> np.ndarray:
        return self.token_loop.scores

    @property
    def _input_ids(self) -> np.ndarray:
        return self.token_loop._input_ids

    @property
    def _scores(self) -> np.ndarray:
        return self.token_loop._scores

    @property
    def eval_tokens(self) -> list[int]:
        return self.token_loop.eval_tokens

    def generate_text(self, prompt: str, max_tokens: int = 128, *, temperature: float = 0.8, top_k: int = 40,
                      top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                      repeat_last_n: int | None = None, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                      seed: int | None = None, stop: list[str] | str | None = None, ignore_eos: bool = False,
                      stream: bool = False, **sampler_options) -> str | Iterator[str]:
        """Complete `prompt`. stream=True returns an iterator of text pieces; stop strings end the
        text and are not included. sampler_options: SamplingParams' other fields (typical_p, mirostat, dry_*...)."""
        task = self.make_task(self.tokenize(prompt), max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                              top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              seed=seed, stop=stop, ignore_eos=ignore_eos, **sampler_options)
        pieces = (text for kind, text, _ in self._events(task) if kind == "token" and text)
        return pieces if stream else "".join(pieces)

    def _events(self, task: Task) -> Iterator[tuple]:
        """("token", text, info) events of a task as the engine runs it; its Result in last_result."""
        events = self.engine.events(task)
        try:
            for ev in events:
                if ev[0] == "error":
                    raise ev[1]
                if ev[0] == "done":
                    self.last_result = ev[1]
                    return
                yield ev
        finally:
            events.close()

    # ---- OpenAI-style completions (shared with the server) ----
    def check_model_name(self, name) -> None:
        """`model` of a request: None or any string (one model is served, whatever the name: many
        OpenAI apps hard-code one); RequestError for other types."""
        if name is not None and not isinstance(name, str):
            raise RequestError("'model' must be a string", param="model")

    def tokenize_prompt(self, prompt, *, param: str = "prompt") -> list[int]:
        """str -> tokens (BOS added per the model, special tokens parsed); a token list is used as is."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special=True, parse_special=True)
        if isinstance(prompt, (list, tuple)) and len(prompt) == 1 and isinstance(prompt[0], str):
            return self.tokenize_prompt(prompt[0], param=param)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [int(t) for t in prompt]
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, str) for t in prompt):
            raise RequestError("only one prompt per request is supported", param=param)
        raise RequestError(f"'{param}' must be a string or an array of token ids", param=param)

    @property
    def fim(self):
        """The model's fill-in-the-middle tokens (powerinfer.infill.FimTokens), looked up once."""
        if self._fim is None:
            from .infill import fim_tokens
            self._fim = fim_tokens(self.model.metadata, self.tokenizer)
        return self._fim

    def infill_prompt(self, prefix: str, suffix: str, extra: list | None = None, prompt: str = "",
                      max_tokens: int | None = None, param: str = "input_suffix") -> list[int]:
        """The FIM prompt's tokens (powerinfer.infill) within a slot's context less max_tokens (less half of it where
        max_tokens is None or <= 0); RequestError 501 where the model has no FIM tokens, 400 where it cannot fit."""
        from .infill import InfillError, infill_tokens
        if not self.fim.usable:
            raise RequestError("this model has no fill-in-the-middle tokens (FIM prefix, suffix and middle); infill "
                               "needs a code model trained for it", code="not_supported", param=param, status=501,
                               type="not_supported_error")
        n_ctx = self.ctx.n_ctx // self.engine.n_slots
        reserve = n_ctx // 2 if max_tokens is None or max_tokens <= 0 else min(max_tokens, n_ctx // 2)
        try:
            return infill_tokens(self.tokenizer, self.fim, prefix, suffix, extra, prompt, budget=n_ctx - reserve)
        except InfillError as e:
            raise RequestError(str(e), param=param) from None

    def _logit_bias(self, logit_bias) -> dict[int, float]:
        """OpenAI {"token_id": bias} (bias <= -100 bans the token) or llama.cpp [[id|text, bias|false]]."""
        if logit_bias is None:
            return {}
        out: dict[int, float] = {}

        def put(key, bias):
            if bias is False:
                bias = float("-inf")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)):
                raise RequestError("logit_bias values must be numbers (or false to ban a token)", param="logit_bias")
            bias = float("-inf") if bias <= -100 else float(bias)
            if isinstance(key, str) and re.fullmatch(r"\s*-?[0-9]+\s*", key):   # ASCII digits only: "²" is a text key
                key = int(key)
            if isinstance(key, int) and not isinstance(key, bool):
                if not 0 <= key < self.model.n_vocab:
                    raise RequestError(f"logit_bias token {key} is out of range [0, {self.model.n_vocab})",
                                       param="logit_bias")
                out[key] = bias
            elif isinstance(key, str):
                for t in self.tokenizer.encode(key, add_special=False):
                    out[t] = bias
            else:
                raise RequestError("logit_bias keys must be token ids or strings", param="logit_bias")

        if isinstance(logit_bias, dict):
            for k, v in logit_bias.items():
                put(k, v)
        elif isinstance(logit_bias, list):
            for pair in logit_bias:
                if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                    raise RequestError("logit_bias entries must be [token, bias] pairs", param="logit_bias")
                put(pair[0], pair[1])
        else:
            raise RequestError("logit_bias must be an object or an array of pairs", param="logit_bias")
        return out

    def make_task(self, prompt_tokens: list[int], *, max_tokens: int | None = -1, temperature: float = 0.8,
                  top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, stop=None, seed: int | None = None,
                  repeat_penalty: float = 1.0, repeat_last_n: int | None = None, presence_penalty: float = 0.0,
                  frequency_penalty: float = 0.0, logit_bias=None, ignore_eos: bool = False,
                  cache_prompt: bool = True, n_probs: int = 0, stop_token_ids=(), grammar: Grammar | None = None,
                  logits_processor=None, stopping_criteria=None, prompt_logprobs: bool = False,
                  speculative: SpecParams | None = None, lora=None, context_shift: bool = False, n_keep: int = 0,
                  preserved_ids=(), **sampler_options) -> Task:
        """A validated engine Task (RequestError on bad arguments). max_tokens None or < 0: until
        the end of text or a full slot context; 0: evaluate the prompt only. speculative: this request's draft
        settings (None: the engine's; they change the speed only). lora: this request's adapter scales, llama.cpp's
        [{"id": i, "scale": s}, ...] or (i, s) pairs over self.lora_adapters (those left out: 0; None or []: the
        current ones, set_lora_scales). context_shift: a full slot keeps the first n_keep tokens (-1: the whole
        prompt), drops the older half of the others and goes on (llama.cpp's --context-shift; otherwise the request
        ends, truncated). preserved_ids: control tokens the output shows (a chat reply's: chat_preserved_ids).
        sampler_options: SamplingParams' other fields
        (typical_p, min_keep, top_n_sigma, xtc_*, dynatemp_*, mirostat*, dry_*, samplers)."""
        if seed is None or seed == -1:
            seed = self.seed
        if repeat_last_n is None:
            repeat_last_n = self.last_n_tokens_size
        if isinstance(seed, int) and not isinstance(seed, bool) and seed > 0xFFFFFFFF:
            seed &= 0xFFFFFFFF
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                seed=seed, ignore_eos=ignore_eos, logit_bias=self._logit_bias(logit_bias))
        for name, value in sampler_options.items():
            if name not in _SAMPLER_OPTIONS:
                raise TypeError(f"unexpected keyword argument {name!r} (not a sampling parameter)")
            if value is not None:
                setattr(params, name, tuple(value) if isinstance(value, list) else value)
        try:
            params.validate()
            if params.dry_on:
                from .sampling_dry import DryBreakers     # processed here, in the caller's thread, not the engine's
                DryBreakers.of(self.tokenizer, tuple(params.dry_sequence_breakers))
        except ValueError as e:       # the messages start with the field's name
            name = str(e).split(" ", 1)[0].rstrip(":")
            raise RequestError(str(e), param=name if name in SamplingParams.__dataclass_fields__ else None) from None
        n_predict = -1 if max_tokens is None or max_tokens < 0 else int(max_tokens)
        for name, fns in (("logits_processor", logits_processor), ("stopping_criteria", stopping_criteria)):
            if fns is not None and not all(callable(f) for f in fns):
                raise RequestError(f"{name} must be a list of callables", param=name)
        task = Task(prompt_tokens, params, n_predict=n_predict, stop=_as_stop_list(stop),
                    stop_token_ids=stop_token_ids, cache_prompt=cache_prompt, n_probs=n_probs, grammar=grammar,
                    logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                    prompt_logprobs=prompt_logprobs, speculative=speculative,
                    lora=self._lora_request(lora), context_shift=context_shift,
                    n_keep=len(prompt_tokens) if n_keep == -1 else n_keep, preserved_ids=preserved_ids)
        self.engine.check(task)
        return task

    def _lora_request(self, spec) -> tuple | None:
        try:
            return scaled_adapters(self.lora_adapters, spec) if spec else None
        except ValueError as e:
            raise RequestError(str(e), param="lora") from None

    def set_lora_scales(self, spec) -> None:
        """The adapters' scales of the requests that give none (llama.cpp's POST /lora-adapters): [{"id": i, "scale":
        s}, ...] or (i, s) pairs, the adapters left out at 0. ValueError for an unknown id or a bad scale."""
        self.engine.lora = scaled_adapters(self.lora_adapters, spec)

    @property
    def lora_adapters(self) -> tuple:
        """The loaded LoRA adapters with the scales of the requests that give none: (LoraAdapter, scale) pairs, in
        the order of their ids (the engine's; set_lora_scales changes the scales)."""
        return self.engine.lora

    @property
    def chat_formatter(self):
        """The ChatFormatter in use (resolved on first use; see powerinfer.chat)."""
        if self._chat is None:
            from .chat import ChatFormatter
            self._chat = ChatFormatter.resolve(self.model.metadata, chat_format=self.chat_format,
                                               chat_template=self.chat_template, tokenizer=self.tokenizer)
        return self._chat

    def chat_prompt(self, messages, /, **template_kwargs) -> tuple[str, list[int], list[str], list[int]]:
        """(prompt text, prompt tokens, extra stop strings, stop token ids) for chat messages;
        template_kwargs are extra template variables (chat_template_kwargs), never the template's own."""
        from .chat import RESERVED_TEMPLATE_VARS, ChatTemplateError, control_token
        clash = sorted(set(template_kwargs) & set(RESERVED_TEMPLATE_VARS))
        if clash:
            raise RequestError(f"chat_template_kwargs may not set {', '.join(repr(k) for k in clash)}: the server "
                               "sets it", param="chat_template_kwargs")
        fmt = self.chat_formatter
        try:
            text = fmt.render(messages, add_generation_prompt=True, **template_kwargs)
        except ChatTemplateError as e:
            raise RequestError(str(e), param="messages") from None
        tok = self.tokenizer
        bos = fmt.bos_token
        add_bos = not (bos and text.startswith(bos))
        tokens = tok.encode(text, add_special=add_bos, parse_special=True)
        stops, stop_ids = [], []
        for marker in fmt.end_of_turn:
            tid = control_token(tok, marker)
            if tid is not None:
                stop_ids.append(tid)          # rendered as "" by the detokenizer: stop on the id
            else:
                stops.append(marker)
        return text, tokens, stops, stop_ids

    @property
    def chat_preserved_ids(self) -> frozenset[int]:
        """The control tokens a chat reply shows as text (powerinfer.chat.preserved_ids)."""
        from .chat import preserved_ids
        return preserved_ids(self.chat_formatter, self.tokenizer)

    def tool_calls(self, tools, tool_choice, parallel_tool_calls=None):
        """The request's ToolCalls (powerinfer.tools; None without tools), in this model's template's call syntax
        ("auto" read in it, "required" / named constrained to it, with this vocabulary's special tokens): the one place
        the API and the server make them. parallel_tool_calls (default false, as llama.cpp's): several constrained
        calls."""
        from .tools import ToolCalls
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise RequestError("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
        return ToolCalls.of_request(tools, tool_choice, self.chat_formatter.source, self.tokenizer,
                                    parallel=bool(parallel_tool_calls))

    def tool_messages(self, messages, tc, template_kwargs: dict):
        """The tools to the template (its `tools` variable) or, when it does not read them, into the
        system message (powerinfer.tools)."""
        from .tools import tools_system_message
        if "tools" in (self.chat_formatter.source or ""):
            template_kwargs.setdefault("tools", tc.tools)
            return messages
        sys_msg = tools_system_message(tc.tools, auto=tc.auto)
        if isinstance(messages, list) and messages and isinstance(messages[0], dict) \
                and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
            first = dict(messages[0], content=messages[0]["content"] + "\n\n" + sys_msg["content"])
            return [first] + list(messages[1:])
        return [sys_msg] + list(messages or [])

    def _run(self, task: Task, shaper: CompletionShaper, stream: bool, include_usage: bool = False):
        events = self.engine.events(task)
        if stream:
            return self._stream_chunks(events, shaper, include_usage)
        try:
            for ev in events:
                if ev[0] == "token":
                    shaper.add(ev[1], ev[2])
                elif ev[0] == "error":
                    raise ev[1]
                else:
                    self.last_result = ev[1]
                    return shaper.response(ev[1])
        finally:
            events.close()

    def _stream_chunks(self, events: TaskEvents, shaper: CompletionShaper, include_usage: bool):
        try:
            yield from shaper.start_chunks()
            for ev in events:
                if ev[0] == "token":
                    c = shaper.token_chunk(ev[1], ev[2])
                    if c is not None:
                        yield c
                elif ev[0] == "error":
                    raise ev[1]
                else:
                    self.last_result = ev[1]
                    yield from shaper.final_chunks(ev[1], include_usage)
        finally:
            events.close()

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          typical_p: float = 1.0, logprobs: int | None = None, echo: bool = False,
                          stop: str | list[str] | None = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: int | None = None, tfs_z: float = 1.0, mirostat_mode: int = 0,
                          mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                          stopping_criteria=None, logits_processor=None, grammar: Grammar | str | None = None,
                          logit_bias: dict | None = None, repeat_last_n: int | None = None, ignore_eos: bool = False,
                          stream_options: dict | None = None, response_format: dict | None = None,
                          **sampler_options):
        """OpenAI `text_completion` dict for `prompt`, or an iterator of chunk dicts with stream=True.

        llama-cpp-python's signature: max_tokens None or <= 0 generates until the end of text or a full
        context; stop strings are not included in the text; grammar (a Grammar or GBNF text) or
        response_format ({"type": "json_object" | "json_schema", ...}) constrain the output;
        logits_processor / stopping_criteria are lists of llama-cpp-python's callables; echo with
        logprobs reports the prompt's tokens too (the first with logprob None). typical_p and mirostat_mode /
        _tau / _eta are llama.cpp's samplers; sampler_options: the others, by SamplingParams' names (min_keep,
        top_n_sigma, xtc_probability, xtc_threshold, dynatemp_range, dynatemp_exponent, dry_multiplier, dry_base,
        dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers, samplers). tfs_z (tail-free sampling, gone from
        llama.cpp too) must stay 1.0.
        `suffix` makes it an infill (a string prompt is the code before the cursor, suffix the code after it) through
        the model's fill-in-the-middle tokens (infill_prompt; RequestError where the model has none).
        """
        check_unimplemented({"tfs_z": tfs_z})
        self.check_model_name(model)
        if suffix:
            if not isinstance(prompt, str):
                raise RequestError("with a suffix the prompt must be a string (the code before it)", param="prompt")
            tokens = self.infill_prompt(prompt, suffix, max_tokens=max_tokens, param="suffix")
        else:
            tokens = self.tokenize_prompt(prompt)
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= 20):
            raise RequestError("logprobs must be an integer in [0, 20]", param="logprobs")
        prompt_lp = bool(echo and logprobs is not None)
        if prompt_lp and stream:
            raise RequestError("echo with logprobs is not supported with stream=True", param="echo")
        task = self.make_task(tokens, max_tokens=None if max_tokens is None or max_tokens <= 0 else max_tokens,
                              temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, stop=stop, seed=seed,
                              repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                              logit_bias=logit_bias, ignore_eos=ignore_eos,
                              n_probs=0 if logprobs is None else max(logprobs, 1),
                              grammar=resolve_grammar(grammar, response_format=response_format),
                              logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                              prompt_logprobs=prompt_lp, typical_p=typical_p, mirostat=mirostat_mode,
                              mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, **sampler_options)
        prefix = (prompt if isinstance(prompt, str) else self.detokenize(tokens)) if echo else ""
        shaper = CompletionShaper("text", self.model_name, prefix=prefix, logprobs=logprobs, tokenizer=self.tokenizer)
        include_usage = bool((stream_options or {}).get("include_usage"))
        return self._run(task, shaper, stream, include_usage)

    __call__ = create_completion

    def create_chat_completion_openai_v1(self, *args, **kwargs):
        """create_chat_completion's result as the `openai` package's types (ChatCompletion, or an iterator of
        ChatCompletionChunk with stream=True), as llama-cpp-python's."""
        from openai.types.chat import ChatCompletion, ChatCompletionChunk
        out = self.create_chat_completion(*args, **kwargs)
        if kwargs.get("stream"):
            return (ChatCompletionChunk(**chunk) for chunk in out)
        return ChatCompletion(**out)

    def create_chat_completion(self, messages: list[dict], functions: list | None = None, function_call=None,
                               tools: list | None = None, tool_choice: Any = None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05, typical_p: float = 1.0,
                               stream: bool = False, stop: str | list[str] | None = None, seed: int | None = None,
                               response_format: dict | None = None, max_tokens: int | None = None,
                               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                               repeat_penalty: float = 1.0, tfs_z: float = 1.0, mirostat_mode: int = 0,
                               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, model: str | None = None,
                               logits_processor=None, grammar: Grammar | str | None = None,
                               logit_bias: dict | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, repeat_last_n: int | None = None,
                               ignore_eos: bool = False,
                               stream_options: dict | None = None, chat_template_kwargs: dict | None = None,
                               stopping_criteria=None, reasoning_format: str | None = None,
                               parallel_tool_calls: bool | None = None, **sampler_options):
        """OpenAI `chat.completion` dict, or an iterator of `chat.completion.chunk` dicts with
        stream=True (first delta {"role": "assistant"}, then {"content": ...}, then an empty delta
        with finish_reason). The prompt is rendered with the model's chat template; response_format
        json_object / json_schema or grammar constrain the reply (llama-cpp-python's signature).
        tools: see powerinfer.tools (tool_choice "auto", the default: the model answers or calls, in its template's
        call syntax; "required" or a named function: a call constrained to that syntax, several with
        parallel_tool_calls where the syntax has them).
        reasoning_format (default: the constructor's): see powerinfer.reasoning; with tools the reply is the call.
        Samplers: as create_completion's."""
        check_unimplemented({"tfs_z": tfs_z})
        if functions or function_call is not None:
            raise RequestError("the legacy 'functions' / 'function_call' are not supported; use 'tools'",
                               param="functions", code="not_supported")
        self.check_model_name(model)
        if logprobs is not None and not isinstance(logprobs, bool):
            raise RequestError("logprobs must be a boolean", param="logprobs")
        if top_logprobs is not None and (isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int)
                                         or not 0 <= top_logprobs <= 20):
            raise RequestError("top_logprobs must be an integer in [0, 20]", param="top_logprobs")
        g = resolve_grammar(grammar, response_format=response_format)
        tc = self.tool_calls(tools, tool_choice, parallel_tool_calls)
        if tc is not None:
            if g is not None:
                raise RequestError("tools and a grammar / response_format cannot be combined", param="tools")
        kwargs = dict(chat_template_kwargs or {})
        if tc is not None:
            messages = self.tool_messages(messages, tc, kwargs)
        prompt_text, tokens, extra_stops, stop_ids = self.chat_prompt(messages, **kwargs)
        if tc is not None:
            tc.after_prompt(prompt_text)
            g = tc.grammar            # None for tool_choice "auto": read afterwards (powerinfer.tools)
        reasoning = splitter_for(reasoning_format or self.reasoning_format, prompt_text)
        n_lp = (top_logprobs or 0) if logprobs else None
        task = self.make_task(tokens, max_tokens=None if max_tokens is None or max_tokens <= 0 else max_tokens,
                              temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                              stop=_as_stop_list(stop) + extra_stops, seed=seed, repeat_penalty=repeat_penalty,
                              repeat_last_n=repeat_last_n, presence_penalty=presence_penalty,
                              frequency_penalty=frequency_penalty, logit_bias=logit_bias, ignore_eos=ignore_eos,
                              n_probs=0 if n_lp is None else max(n_lp, 1), stop_token_ids=stop_ids, grammar=g,
                              preserved_ids=self.chat_preserved_ids,
                              logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                              typical_p=typical_p, mirostat=mirostat_mode, mirostat_tau=mirostat_tau,
                              mirostat_eta=mirostat_eta, **sampler_options)
        shaper = CompletionShaper("chat", self.model_name, logprobs=n_lp, tokenizer=self.tokenizer, tools=tc,
                                  reasoning=reasoning)
        include_usage = bool((stream_options or {}).get("include_usage"))
        return self._run(task, shaper, stream, include_usage)

    def close(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.stop()
        self.engine = None
        self.ctx = None
        self.model = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
