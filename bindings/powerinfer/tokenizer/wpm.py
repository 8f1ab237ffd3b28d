"""BERT's WordPiece (tokenizer.ggml.model "bert"), as llama.cpp's WPM tokenizer: ids equal to llama.cpp's.

The vocabulary is the converter's "phantom space" form: a word-initial piece is stored as "▁piece", a continuation
("##piece" in the Hugging Face vocabulary) as "piece"; control tokens ([CLS], [SEP], ...) as they are.

Encoding (llama.cpp's llm_tokenizer_wpm_session):
  1. special-token texts are split out first (control and unknown ones with parse_special, user-defined ones always;
     longest first, as llama.cpp's partition);
  2. each remaining fragment is normalized code point by code point: with strip_accents (tokenizer.ggml.normalizer.
     strip_accents, default: lowercase) a code point becomes the first code point of its NFD form and marks (Unicode
     category M) are dropped; whitespace ends a word; NUL, U+FFFD and control code points (categories Cc, Cf, Co, Cs)
     are dropped; with lowercase (tokenizer.ggml.normalizer.lowercase, default true) the simple lowercase mapping
     applies; punctuation (P*), ASCII symbols (S* below U+007F) and CJK ideographs are words of their own;
  3. each word, with "▁" in front, is cut greedily into the longest vocabulary entries from the left (over UTF-8
     bytes, at most the longest entry's length); a word with a piece that matches nothing is one [UNK].
add_special puts [CLS] (the BOS id, 101 without a key) in front and [SEP] (the separator id, 102) at the end, whatever
add_bos says, as llama.cpp does.
"""
from __future__ import annotations

import unicodedata

from .vocab import (TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED, VALID_TYPES, Tokenizer, as_list,
                    as_text, end_of_generation)

__all__ = ["WPMTokenizer"]

SPACE = "\u2581"
# llama.cpp's whitespace set (Unicode's White_Space property)
_WHITESPACE = frozenset([*range(0x09, 0x0E), *range(0x2000, 0x200B), 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029,
                         0x202F, 0x205F, 0x3000])
_CONTROL_CATEGORIES = frozenset(("Cc", "Cf", "Co", "Cs"))
_CACHE_MAX_ENTRIES = 65536


def _is_cjk(cp: int) -> bool:
    """llama.cpp's is_chinese_char (the ranges of Hugging Face's BertPreTokenizer, its 0x2B920 start included)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _simple_lower(ch: str) -> str:
    """The simple (one code point) lowercase mapping of UnicodeData.txt, llama.cpp's unicode_tolower: str.lower()'s
    full mapping where it is one code point; U+0130 (whose full mapping adds a combining dot) becomes "i"."""
    low = ch.lower()
    return low if len(low) == 1 else low[0]


class _Normalizer(dict):
    """str.translate's table for one (lowercase, strip_accents) setting, filled per code point on first sight: the
    text a code point becomes (" " for whitespace, " x " for a word of its own, "" when dropped)."""

    def __init__(self, lowercase: bool, strip_accents: bool):
        super().__init__()
        self.lowercase, self.strip_accents = lowercase, strip_accents

    def __missing__(self, cp: int) -> str:
        ch = chr(cp)
        if self.strip_accents:
            nfd = unicodedata.normalize("NFD", ch)
            ch = nfd[0] if nfd else ch
        c = ord(ch)
        cat = unicodedata.category(ch)
        if c in _WHITESPACE:
            out = " "
        elif c == 0 or c == 0xFFFD or cat in _CONTROL_CATEGORIES or (self.strip_accents and cat[0] == "M"):
            out = ""
        else:
            s = _simple_lower(ch) if self.lowercase else ch
            out = f" {s} " if cat[0] == "P" or (c < 0x7F and cat[0] == "S") or _is_cjk(c) else s
        self[cp] = out
        return out


class WPMTokenizer(Tokenizer, model="bert"):
    """A BERT WordPiece tokenizer over a GGUF vocabulary (llama.cpp's WPM)."""

    def __init__(self, tokens: list[str], types: list[int] | None = None, *, bos_id: int = 101, sep_id: int = 102,
                 unk_id: int = 100, pad_id: int | None = 0, eos_id: int | None = None, lowercase: bool = True,
                 strip_accents: bool | None = None, add_sep: bool = True):
        n = len(tokens)
        if n == 0:
            raise ValueError("tokenizer vocabulary is empty")
        if types is not None and len(types) != n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries but there are {n} tokens")
        for name, tid in (("BOS ([CLS])", bos_id), ("separator ([SEP])", sep_id), ("unknown", unk_id),
                          ("padding", pad_id), ("eos", eos_id)):
            if tid is not None and not 0 <= tid < n:
                raise ValueError(f"{name} token id {tid} is out of range for a vocabulary of {n} tokens")
        self._tokens = [str(t) for t in tokens]
        self._types = [int(t) for t in types] if types is not None else [TOKEN_NORMAL] * n
        for i, t in enumerate(self._types):
            if t not in VALID_TYPES:
                raise ValueError(f"token {i} ({self._tokens[i]!r}) has unsupported token type {t}")
        self.n_vocab = n
        self.bos_id, self.sep_id, self.unk_id, self.pad_id, self.eos_id = bos_id, sep_id, unk_id, pad_id, eos_id
        self.add_bos, self.add_eos, self.add_sep = True, False, bool(add_sep)
        self.add_space_prefix = False
        self.lowercase = bool(lowercase)
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        self._normalizer = _Normalizer(self.lowercase, self.strip_accents)
        self._to_id = {t.encode("utf-8"): i for i, t in enumerate(self._tokens)}   # the last of duplicates wins
        self._max_len = max(len(t) for t in self._to_id)
        specials = [(t, i) for i, t in enumerate(self._tokens)
                    if t and self._types[i] in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED)]
        specials.sort(key=lambda p: -len(p[0].encode("utf-8")))
        self._specials = specials
        self._piece_bytes = [b"" if self._types[i] == TOKEN_CONTROL else
                             t.encode("utf-8") if self._types[i] in (TOKEN_UNKNOWN, TOKEN_USER_DEFINED) else
                             t.replace(SPACE, " ").encode("utf-8") for i, t in enumerate(self._tokens)]
        text_to_id = {t: i for i, t in enumerate(self._tokens)}
        self._eog = end_of_generation(text_to_id, [i for i in (eos_id,) if i is not None], self._types)
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_metadata(cls, meta: dict) -> "WPMTokenizer":
        if "tokenizer.ggml.tokens" not in meta:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
        tokens = [as_text(t, "tokenizer.ggml.tokens")
                  for t in as_list(meta["tokenizer.ggml.tokens"], "tokenizer.ggml.tokens")]
        types = meta.get("tokenizer.ggml.token_type")
        types = None if types is None else [int(t) for t in as_list(types, "tokenizer.ggml.token_type")]

        def special(name: str, default: int | None) -> int | None:
            v = meta.get(f"tokenizer.ggml.{name}_token_id")
            return default if v is None else int(v)
        lower = meta.get("tokenizer.ggml.normalizer.lowercase")
        strip = meta.get("tokenizer.ggml.normalizer.strip_accents")
        return cls(tokens, types, bos_id=special("bos", 101), sep_id=special("seperator", 102),
                   unk_id=special("unknown", 100), pad_id=special("padding", 0), eos_id=special("eos", None),
                   lowercase=True if lower is None else bool(lower),
                   strip_accents=None if strip is None else bool(strip),
                   add_sep=bool(meta.get("tokenizer.ggml.add_sep_token", True)))

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text; add_special: [CLS] ... [SEP] (llama.cpp adds both for WPM whatever add_bos says)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        ids: list[int] = [self.bos_id] if add_special else []
        self._encode_text_into(text, parse_special, ids)
        if add_special:
            ids.append(self.sep_id)
        return ids

    def _encode_text_into(self, text: str, parse_special: bool, ids: list[int]) -> None:
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
            else:
                for word in frag.translate(self._normalizer).split(" "):
                    if word:
                        ids.extend(self._word(word))

    def _partition(self, text: str, parse_special: bool) -> list:
        """text split around the special tokens' texts: str fragments and int ids (llama.cpp's st_partition)."""
        frags: list = [text]
        for piece, tid in self._specials:
            if not parse_special and self._types[tid] != TOKEN_USER_DEFINED:
                continue
            out: list = []
            for f in frags:
                if isinstance(f, int) or piece not in f:
                    out.append(f)
                    continue
                parts = f.split(piece)
                for k, part in enumerate(parts):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def _word(self, word: str) -> tuple[int, ...]:
        """The greedy longest-match pieces of one normalized word ("▁" in front), or (unk,)."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        b = (SPACE + word).encode("utf-8")
        n, i, out, to_id, longest = len(b), 0, [], self._to_id, self._max_len
        while i < n:
            for j in range(min(n, i + longest), i, -1):
                tid = to_id.get(b[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:
                out = []
                break
        res = tuple(out) if out else (self.unk_id,)
        if len(self._cache) < _CACHE_MAX_ENTRIES:
            self._cache[word] = res
        return res

    # ------------------------------------------------------------------ decoding

    def _render(self, tid: int, at_start: bool, skip_special: bool) -> tuple[bytes, bool]:
        tid = self._check_id(tid)
        if self._types[tid] == TOKEN_CONTROL:
            return (b"" if skip_special else self._tokens[tid].encode("utf-8")), at_start
        piece = self._piece_bytes[tid]
        if at_start and piece.startswith(b" "):
            piece = piece[1:]
        return piece, False
