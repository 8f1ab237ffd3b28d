"""Constrained decoding: GBNF grammars, JSON schemas, Lark grammars and regular expressions as token
masks, computed by llguidance (the library llama.cpp builds in with LLAMA_LLGUIDANCE).

    g = Grammar.from_gbnf('root ::= "yes" | "no"')      # llama.cpp's GBNF (also Lark: from_lark)
    g = Grammar.from_json_schema({"type": "object", "properties": {...}})
    m = GrammarMatcher(g, tokenizer, n_vocab)            # one per request
    banned = m.banned()                                  # bool [n_vocab]: tokens the grammar forbids now
    m.accept(token)                                      # after sampling; m.done once nothing may follow

Why llguidance (measured in bench/README.md, "Constrained decoding"): it computes a mask over Gemma's
262k-token vocabulary in tens of microseconds, needs no precompilation per schema (xgrammar and
outlines-core compile each grammar against the vocabulary first), reads llama.cpp's GBNF (its own
converter) as well as Lark, and is a single wheel without dependencies.

The mask crosses into numpy as a bitmask (one bit per token, llguidance writes it in place) and is
unpacked in one vectorised call; the sampler sets the banned logits to -inf (sampling.Sampler).
The end-of-generation tokens of the vocabulary are the grammar's end: allowed once the grammar is
complete. A matcher is used by one thread at a time (the engine's).
"""
from __future__ import annotations

import copy
import json
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tokenizer import TOKEN_CONTROL, Tokenizer

__all__ = ["Grammar", "GrammarError", "GrammarMatcher", "grammar_of_response_format", "lark_json", "lark_literal"]


_JSON_SPACE = r"(?: |\n{1,2}[ \t]{0,20})?"


class GrammarError(ValueError):
    """A grammar or schema that cannot be used (syntax error, unsupported construct)."""


def _llg():
    try:
        import llguidance
    except ImportError:      # a dependency of the package; only a broken install lacks it
        raise GrammarError("constrained decoding needs the llguidance package (pip install llguidance)") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A compiled-to-llguidance grammar. kind: gbnf | json_schema | lark | regex; source: what the
    user gave (text, or the schema as JSON text); spec: llguidance's grammar definition."""

    kind: str
    source: str
    spec: str

    @classmethod
    def from_gbnf(cls, text: str) -> "Grammar":
        """llama.cpp's GBNF (`root ::= ...`); Lark text is accepted too, as llama.cpp's llguidance build does."""
        if not isinstance(text, str) or not text.strip():
            raise GrammarError("the grammar must be a non-empty string")
        return cls._compiled("gbnf", text, "failed to parse grammar", lambda llg: llg.grammar_from("gbnf", text))

    # llama-cpp-python's LlamaGrammar names
    from_string = from_gbnf

    @classmethod
    def from_file(cls, path) -> "Grammar":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise GrammarError(f"cannot read grammar file {path}: {e}") from None
        return cls.from_gbnf(text)

    @classmethod
    def from_lark(cls, text: str) -> "Grammar":
        return cls._compiled("lark", text, "failed to parse grammar", lambda llg: llg.LLMatcher.grammar_from_lark(text))

    @classmethod
    def from_regex(cls, pattern: str) -> "Grammar":
        return cls._compiled("regex", pattern, "invalid regular expression",
                             lambda llg: llg.LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def from_json_schema(cls, schema) -> "Grammar":
        """A JSON schema (dict, or its JSON text); {} or True: any JSON value."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        text = json.dumps(schema)
        # whitespace between tokens as llama.cpp's json-schema-to-grammar allows it (its `space` rule):
        # bounded, so that a model cannot pad the object with whitespace until max_tokens
        return cls._compiled("json_schema", text, "unsupported JSON schema",
                             lambda llg: llg.LLMatcher.grammar_from_json_schema(
                                 text, defaults={"whitespace_pattern": _JSON_SPACE}))

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (response_format json_object without a schema)."""
        return cls.from_json_schema({"type": "object"})

    @classmethod
    def _compiled(cls, kind: str, source: str, failure: str, compile_spec) -> "Grammar":
        """compile_spec(llguidance) -> the grammar definition; its exception becomes GrammarError(failure: ...),
        then the definition is validated."""
        llg = _llg()
        try:
            spec = compile_spec(llg)
        except Exception as e:
            raise GrammarError(f"{failure}: {e}") from None
        is_error, msgs = llg.LLMatcher.validate_grammar_with_warnings(spec)
        if is_error:
            what = "JSON schema" if kind == "json_schema" else "grammar"
            raise GrammarError(f"invalid {what}: {msgs[0] if msgs else 'unknown error'}")
        return cls(kind, source, spec)


def grammar_of_response_format(rf) -> Grammar | None:
    """OpenAI's response_format -> a Grammar (None for text): {"type": "json_object"} (llama.cpp's
    optional "schema" too) or {"type": "json_schema", "json_schema": {"schema": ...}}. GrammarError
    for anything else."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise GrammarError("response_format must be an object")
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = rf.get("schema")
        return Grammar.json_object() if schema is None else Grammar.from_json_schema(schema)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise GrammarError("response_format json_schema needs a 'json_schema' object with a 'schema'")
        schema = js.get("schema")
        return Grammar.json_object() if schema is None else Grammar.from_json_schema(schema)
    raise GrammarError(f"response_format type {kind!r} is not supported (text, json_object, json_schema)")


def lark_literal(text: str, tokenizer: Tokenizer | None = None) -> str:
    """`text` as a Lark term: the special token it is in `tokenizer`'s vocabulary (`<[id]>`: a model writes a control
    token, not the characters of its name), else a string literal (which any tokens spelling it match)."""
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and _is_special(tokenizer, ids[0]):
            return f"<[{ids[0]}]>"
    return json.dumps(text, ensure_ascii=False)


def lark_json(schema: dict) -> str:
    """A Lark term for a JSON value that matches `schema`, its whitespace bounded as from_json_schema's."""
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_pattern": _JSON_SPACE}})


def _is_special(tok: Tokenizer, i: int) -> bool:
    """A token llguidance sees as special (0xFF + its name): a control token, or one whose piece starts with 0xFF."""
    return tok.token_type(i) == TOKEN_CONTROL or tok.token_to_piece(i).startswith(b"\xff")


# one LLTokenizer per (tokenizer, n_vocab): building it walks the whole vocabulary (~0.3 s for 262k tokens)
_TOKENIZERS: "weakref.WeakKeyDictionary[Tokenizer, dict]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _ll_tokenizer(tok: Tokenizer, n_vocab: int):
    with _LOCK:
        per = _TOKENIZERS.setdefault(tok, {})
        if n_vocab not in per:
            per[n_vocab] = _build_ll_tokenizer(tok, n_vocab)
        return per[n_vocab]


class _Vocab:
    """What llguidance's TokenizerWrapper reads: the bytes of every token (control tokens as
    0xFF + their name, llguidance's marking of special tokens), EOS, and a tokenize function."""

    def __init__(self, tok: Tokenizer, n_vocab: int):
        tokens = []
        for i in range(tok.n_vocab):
            if _is_special(tok, i):     # (a raw 0xFF byte token too: a leading 0xFF is llguidance's special mark)
                tokens.append(b"\xff" + tok.id_to_text(i).encode("utf-8"))
            else:
                tokens.append(tok.token_to_piece(i))
        tokens += [b""] * (n_vocab - len(tokens))      # output rows past the vocabulary: never allowed
        self.tokens = tokens
        self.bos_token_id = tok.bos_id
        eog = sorted(tok.eog_ids)
        self.eos_token_id = eog[0] if eog else (tok.eos_id if tok.eos_id is not None else 0)
        # llguidance tokenizes text the grammar forces, mid-output: no SentencePiece dummy-prefix space there
        self._tok = copy.copy(tok)
        if getattr(tok, "add_space_prefix", False):
            self._tok.add_space_prefix = False

    def __call__(self, s: bytes) -> list[int]:
        return self._tok.encode(s.decode("utf-8", errors="replace"), add_special=False)


def _build_ll_tokenizer(tok: Tokenizer, n_vocab: int):
    llg = _llg()
    v = _Vocab(tok, n_vocab)
    eog = sorted(tok.eog_ids) or [v.eos_token_id]
    return llg.LLTokenizer(llg.TokenizerWrapper(v), n_vocab=n_vocab, eos_token=eog)


class GrammarMatcher:
    """The state of one grammar over one generation: banned() before sampling, accept() after."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer, n_vocab: int | None = None):
        llg = _llg()
        self.n_vocab = int(n_vocab or tokenizer.n_vocab)
        self._m = llg.LLMatcher(_ll_tokenizer(tokenizer, self.n_vocab), grammar.spec, log_level=0)
        if self._m.is_error():
            raise GrammarError(f"invalid grammar: {self._m.get_error()}")
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)

    def banned(self) -> np.ndarray:
        """bool [n_vocab], True where the grammar forbids the token now (a fresh array)."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._m.is_error():
            raise GrammarError(f"grammar matcher failed: {self._m.get_error()}")
        inv = np.invert(self._bits).view(np.uint8)
        return np.unpackbits(inv, count=self.n_vocab, bitorder="little").view(np.bool_)

    def accept(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise GrammarError(f"token {token} does not fit the grammar: {self._m.get_error()}")

    @property
    def done(self) -> bool:
        """Nothing but end of generation may follow (the grammar is complete)."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """The text so far is a complete match (more may follow)."""
        return self._m.is_accepting()
