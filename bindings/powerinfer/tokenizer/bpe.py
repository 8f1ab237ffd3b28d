"""BPE tokenizers built from GGUF metadata alone: byte-level (``tokenizer.ggml.model == "gpt2"``) and Gemma 4's
SentencePiece-style BPE (``"gemma4"``, see `Gemma4Tokenizer`).

Encoding reproduces llama.cpp's BPE tokenizer (``llm_tokenizer_bpe`` in llama-vocab.cpp), which
itself reproduces the Hugging Face ``tokenizers`` ByteLevel BPE models (GPT-2, Llama 3, Qwen2):

1. Special partition: the text of every special token (control and unknown tokens only with
   ``parse_special=True``; user-defined "added" tokens always) is cut out of the text, longest
   token first, and becomes its id; the text between them is tokenized on its own.
2. Pre-tokenization: the regular expressions of the pre-tokenizer named by ``tokenizer.ggml.pre``
   split each piece of text into words (the text between matches is kept as words too).
3. Byte-level encoding: each word's UTF-8 bytes map to printable characters (GPT-2's
   ``bytes_to_unicode``: printable Latin-1 bytes map to themselves, the others to U+0100...).
4. BPE: adjacent symbols merge, lowest merge rank (position in ``tokenizer.ggml.merges``) first,
   leftmost first among equal ranks. With ``ignore_merges`` (the llama-3 pre-tokenizer) a word
   that is itself a vocabulary entry is emitted directly.
5. A final symbol missing from the vocabulary falls back to the tokens of its single characters.

Gemma 4's pre-tokenizer ("gemma4", llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4) is SentencePiece-style: every space
becomes U+2581 first, words are runs of non-newlines and runs of newlines (a newline run that is a vocabulary entry is
taken whole), merges run over the raw UTF-8 characters (no byte-level encoding), missing pieces fall back to the
``<0xXX>`` byte tokens, and decoding turns U+2581 back into spaces.

No dummy-prefix space is added. Decoding maps the byte-level characters back to bytes;
control tokens render as nothing unless ``skip_special=False``; user-defined tokens render as
their text. (llama.cpp's ``clean_spaces`` detokenization option is not applied: decode gives
the concatenated pieces, as streaming does.)

The ``\\p{L}``/``\\p{N}`` classes of the pre-tokenizer expressions need the ``regex`` package
(Python's ``re`` has no Unicode property classes).
"""
from __future__ import annotations

import heapq
from typing import NamedTuple

from .vocab import (TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED, VALID_TYPES, Tokenizer,
                    as_list, as_text, end_of_generation, merge_symbols)

__all__ = ["BPETokenizer", "Gemma4Tokenizer", "PRE_TOKENIZERS", "bytes_to_unicode"]

# --------------------------------------------------------------------------------------------
# pre-tokenizers (llama.cpp's llm_tokenizer_bpe regex_exprs), applied one after another

# GPT-4 style (llama-3): contractions, letters with one leading non-letter, numbers of 1..3 digits,
# punctuation runs with trailing newlines, newline runs, whitespace. (The tokenizer.json form is
# "(?i:'s|'t|...)"; llama.cpp spells the case-insensitivity out, which is the same thing.)
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2: as llama-3 but every digit is its own word
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-2
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# GPT-4o / o200k (gpt-oss): llama.cpp's form of the tokenizer.json expression, whose upper- and lower-case letter
# classes (\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}, \p{Ll}\p{Lm}\p{Lo}\p{M}) it writes as "a letter that is not a-z" / "not A-Z"
# (its engine has no case classes): the same split on ASCII, not on every other script, and llama.cpp is what our
# files are checked against (tests/compat/test_bpe_vs_llama_cpp.py)
_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
          r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
          r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# DeepSeek's (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM, _DEEPSEEK3_LLM, _DEEPSEEK_CODER; its regex_exprs written
# with escapes): deepseek-llm (DeepSeek-V2 / V2-Lite) splits newlines, letter runs of the Latin, Greek, Cyrillic,
# Armenian, Georgian, ... scripts with an optional leading space, ASCII / full-width punctuation runs, trailing
# whitespace, CJK and Hangul runs, digit runs; deepseek-v3 (V3 / R1 / Kimi-K2's converters) numbers of 1..3 digits,
# CJK / kana runs, then a GPT-4-like expression; deepseek-coder (Coder-V2) newlines, letters, punctuation, CJK /
# Hangul, single digits.
_DEEPSEEK_LLM = (
    '[\r\n]',
    '\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377'
    '\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-'
    '\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-'
    '\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80'
    '-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4'
    '\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139'
    '\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d'
    '\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a'
    '\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-'
    '\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+',
    '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+',
    '\\s+$',
    '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
    '\\p{N}+',
)
_DEEPSEEK_V3 = (
    '\\p{N}{1,3}',
    '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+',
    '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p'
    '{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+',
)
_DEEPSEEK_CODER = (
    '[\r\n]',
    '\\s?\\p{L}+',
    '\\s?\\p{P}+',
    '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+',
    '\\p{N}',
)


class Pre(NamedTuple):
    """A pre-tokenizer: its regular expressions, ignore_merges (a word that is a vocabulary entry is emitted whole),
    add_bos (the default without tokenizer.ggml.add_bos_token; forced on where spm is set, as llama.cpp does for
    Gemma 4) and spm (SentencePiece-style: spaces as U+2581, raw UTF-8 merges, <0xXX> byte fallback, a newline run
    that is a vocabulary entry emitted whole)."""
    patterns: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False
    spm: bool = False


# tokenizer.ggml.pre -> its pre-tokenizer
PRE_TOKENIZERS: dict[str, Pre] = {}
for _name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
    PRE_TOKENIZERS[_name] = Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
for _name in ("qwen2", "deepseek-r1-qwen", "megrez"):
    PRE_TOKENIZERS[_name] = Pre((_QWEN2,))
# Qwen3.5: Qwen2's with combining marks (\p{M}) in letter runs and not in punctuation runs (llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_QWEN35)
_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS["qwen35"] = Pre((_QWEN35,))
for _name in ("gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de"):
    PRE_TOKENIZERS[_name] = Pre((_GPT2,))
PRE_TOKENIZERS["gpt-4o"] = Pre((_GPT4O,))
# EXAONE 4.0 (llama.cpp: GPT-2's)
PRE_TOKENIZERS["exaone4"] = Pre((_GPT2,))
# Mistral's tekken (Mistral Nemo, Ministral 3, Mistral Small 3.x): GPT-4o's letter classes as llama.cpp writes them,
# every digit a word; words in the vocabulary whole, BOS by default
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
           r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS["tekken"] = Pre((_TEKKEN,), ignore_merges=True, add_bos=True)
# ByteDance Seed-Coder / Seed-OSS: Qwen2's with punctuation runs not taking newlines
_SEED_CODER = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
               r"|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS["seed-coder"] = Pre((_SEED_CODER,))
# Hunyuan dense: numbers of 1..3 digits, then runs of CJK ideographs / kana, then words (an ASCII punctuation mark may
# lead ASCII letters), punctuation / symbol runs with trailing newlines, newline runs, whitespace
PRE_TOKENIZERS["hunyuan-dense"] = Pre((r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                                       r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
                                       r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"
                                       r"|\s+(?!\S)|\s+"))
# Cohere Command-R / R7B, EXAONE 3.5: every digit split off first, then GPT-2's
for _name in ("command-r", "exaone"):
    PRE_TOKENIZERS[_name] = Pre((r"\p{N}", _GPT2))
# the mixture-of-experts families' (moe_archs.py): GLM-4.5 / 4.6 / 4.7 (llama.cpp's CHATGLM4: llama-3's
# expression, words in the vocabulary whole; no BOS unless the file asks), OLMoE (GPT-2's), Hunyuan-A13B (Qwen2's),
# Ling / Ring 2.0 (bailingmoe2: Qwen2's with the contractions after one apostrophe and single newlines)
for _name in ("glm4", "glm5"):
    PRE_TOKENIZERS[_name] = Pre((_LLAMA3,), ignore_merges=True)
PRE_TOKENIZERS["olmo"] = Pre((_GPT2,))
PRE_TOKENIZERS["hunyuan"] = Pre((_QWEN2,))
for _name in ("bailingmoe", "bailingmoe2", "llada-moe"):
    PRE_TOKENIZERS[_name] = Pre((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",))
PRE_TOKENIZERS["deepseek-llm"] = Pre(_DEEPSEEK_LLM)
PRE_TOKENIZERS["deepseek-v3"] = Pre(_DEEPSEEK_V3)
PRE_TOKENIZERS["deepseek-coder"] = Pre(_DEEPSEEK_CODER)
# Gemma 4 (tokenizer.ggml.model "gemma4" implies it, whatever tokenizer.ggml.pre says)
PRE_TOKENIZERS["gemma4"] = Pre((r"[^\n]+|[\n]+",), add_bos=True, spm=True)
# llama.cpp's default (also used when the key is missing)
PRE_TOKENIZERS["default"] = Pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))


# word cache bounds
_CACHE_MAX_ENTRIES = 65536
_CACHE_MAX_WORD_CHARS = 64


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


SPACE = "\u2581"    # SentencePiece's space
_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
_ENCODE_TABLE = str.maketrans({chr(b): c for b, c in _BYTE_TO_CHAR.items()})   # latin-1 char -> byte char


def _byte_encode(word: str) -> str:
    return word.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)


def _byte_decode(text: str) -> bytes:
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")   # not a byte-level character (malformed vocabulary entry)
        else:
            out.append(b)
    return bytes(out)


def _compile(patterns: tuple[str, ...]):
    try:
        import regex
    except ImportError:  # pragma: no cover - regex is a dependency
        raise ValueError("byte-level BPE tokenizers need the 'regex' package (pip install regex) for the "
                         "Unicode classes of their pre-tokenizer") from None
    return [regex.compile(p) for p in patterns]


class BPETokenizer(Tokenizer, model="gpt2"):
    """A byte-level BPE tokenizer over a GGUF vocabulary (same interface as ``Tokenizer``)."""

    add_space_prefix = False

    def __init__(self, tokens: list[str], merges: list[str], types: list[int] | None = None, *,
                 pre: str = "default", bos_id: int | None = None, eos_id: int | None = None,
                 unk_id: int | None = None, pad_id: int | None = None, eot_id: int | None = None,
                 eom_id: int | None = None, add_bos: bool | None = None, add_eos: bool = False):
        n = len(tokens)
        if n == 0:
            raise ValueError("tokenizer vocabulary is empty")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unknown BPE pre-tokenizer {pre!r} (tokenizer.ggml.pre); supported: "
                             f"{', '.join(sorted(PRE_TOKENIZERS))}")
        if types is not None and len(types) != n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries but there are {n} tokens")
        for name, tid in (("bos", bos_id), ("eos", eos_id), ("unknown", unk_id), ("padding", pad_id),
                          ("eot", eot_id), ("eom", eom_id)):
            if tid is not None and not 0 <= tid < n:
                raise ValueError(f"{name} token id {tid} is out of range for a vocabulary of {n} tokens")
        patterns, self._ignore_merges, default_bos, self._spm = PRE_TOKENIZERS[pre]
        if add_bos is None or self._spm:
            # the pre-tokenizer's default (llama-3: BOS), when there is a BOS token; Gemma 4's whatever the file says
            add_bos = (add_bos or default_bos) and bos_id is not None
        if add_bos and bos_id is None:
            raise ValueError("add_bos is set but the vocabulary has no BOS token id")
        if add_eos and eos_id is None:
            raise ValueError("add_eos is set but the vocabulary has no EOS token id")
        self.pre = pre
        self._regexes = _compile(patterns)
        self._tokens = [str(t) for t in tokens]
        self._types = [TOKEN_NORMAL] * n if types is None else [int(t) for t in types]
        for i, t in enumerate(self._types):
            if t not in VALID_TYPES:
                raise ValueError(f"token {i} ({self._tokens[i]!r}) has unsupported token type {t}")
        self.n_vocab = n
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = bos_id, eos_id, unk_id, pad_id
        self.add_bos, self.add_eos = bool(add_bos), bool(add_eos)

        # text -> id: the last id wins for duplicates (llama.cpp's token_to_id[word] = i)
        self._text_to_id = {t: i for i, t in enumerate(self._tokens)}
        # the end-of-generation set, and llama.cpp's o200k_harmony token types (before the tables below read them)
        self._eog = end_of_generation(self._text_to_id, (eos_id, eot_id, eom_id), self._types)
        # merge ranks: "a b" split at the first space after the first character; the first rank wins
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            m = as_text(m, "tokenizer.ggml.merges")
            pos = m.find(" ", 1)
            if pos < 0:
                continue
            self._ranks.setdefault((m[:pos], m[pos + 1:]), rank)

        # special tokens for the partition step, longest first (llama.cpp's cache_special_tokens)
        special = [i for i, t in enumerate(self._types)
                   if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNKNOWN) and self._tokens[i]]
        special.sort(key=lambda i: -len(self._tokens[i].encode("utf-8")))
        self._special = [(self._tokens[i], i, self._types[i] == TOKEN_USER_DEFINED) for i in special]
        self._cache: dict[str, tuple[int, ...]] = {}

        # decode table
        self._piece_bytes: list[bytes] = []
        for text, t in zip(self._tokens, self._types):
            if t == TOKEN_CONTROL:
                b = b""
            elif t in (TOKEN_USER_DEFINED, TOKEN_UNKNOWN):
                b = text.encode("utf-8", errors="surrogatepass")
            elif t == TOKEN_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                b = bytes([int(text[3:5], 16)])
            elif self._spm:
                b = text.replace(SPACE, " ").encode("utf-8", errors="surrogatepass")
            else:
                b = _byte_decode(text)
            self._piece_bytes.append(b)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_metadata(cls, meta: dict) -> "BPETokenizer":
        """Build from a dict of GGUF keys (``tokenizer.ggml.*``, model "gpt2") to Python values."""
        if "tokenizer.ggml.tokens" not in meta:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
        if "tokenizer.ggml.merges" not in meta:
            raise ValueError("byte-level BPE (gpt2) vocabulary without tokenizer.ggml.merges")
        tokens = [as_text(t, "tokenizer.ggml.tokens")
                  for t in as_list(meta["tokenizer.ggml.tokens"], "tokenizer.ggml.tokens")]
        merges = as_list(meta["tokenizer.ggml.merges"], "tokenizer.ggml.merges")
        types = meta.get("tokenizer.ggml.token_type")
        types = None if types is None else [int(t) for t in as_list(types, "tokenizer.ggml.token_type")]
        pre = meta.get("tokenizer.ggml.pre")
        pre = "default" if pre is None else as_text(pre, "tokenizer.ggml.pre")

        def special(name: str) -> int | None:
            value = meta.get(f"tokenizer.ggml.{name}_token_id")
            return None if value is None else int(value)

        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        return cls(tokens, merges, types, pre=pre,
                   bos_id=special("bos"), eos_id=special("eos"), unk_id=special("unknown"),
                   pad_id=special("padding"), eot_id=special("eot"), eom_id=special("eom"),
                   add_bos=None if add_bos is None else bool(add_bos),
                   add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)))

    # ------------------------------------------------------------------ encoding

    def _encode_text_into(self, text: str, parse_special: bool, ids: list[int]) -> None:
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
            else:
                self._encode_text(frag, ids)

    def _partition(self, text: str, parse_special: bool) -> list:
        """Text pieces (str) and special-token ids (int), longest special token first."""
        frags: list = [text] if text else []
        for tok_text, tid, user_defined in self._special:
            if not (parse_special or user_defined):
                continue
            if not any(isinstance(f, str) and tok_text in f for f in frags):
                continue
            out: list = []
            for f in frags:
                if not isinstance(f, str) or tok_text not in f:
                    out.append(f)
                    continue
                pos = 0
                while True:
                    j = f.find(tok_text, pos)
                    if j < 0:
                        break
                    if j > pos:
                        out.append(f[pos:j])
                    out.append(tid)
                    pos = j + len(tok_text)
                if pos < len(f):
                    out.append(f[pos:])
            frags = out
        return frags

    def _split_words(self, text: str) -> list[str]:
        """The pre-tokenizer: each expression splits the pieces of the previous one (gaps kept)."""
        words = [text]
        for rx in self._regexes:
            out = []
            for w in words:
                pos = 0
                for m in rx.finditer(w):
                    if m.start() > pos:
                        out.append(w[pos:m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(w):
                    out.append(w[pos:])
            words = out
        return words

    def _encode_text(self, text: str, out: list[int]) -> None:
        cache = self._cache
        if self._spm:
            text = text.replace(" ", SPACE)
        for word in self._split_words(text):
            ids = cache.get(word)
            if ids is None:
                ids = tuple(self._bpe(word if self._spm else _byte_encode(word)))
                if len(word) <= _CACHE_MAX_WORD_CHARS:
                    if len(cache) >= _CACHE_MAX_ENTRIES:
                        cache.clear()
                    cache[word] = ids
            out.extend(ids)

    def _bpe(self, word: str) -> list[int]:
        """Ids of one word, byte-encoded (raw with spm) (heap-based merges, as llama.cpp)."""
        lookup = self._text_to_id
        if (self._ignore_merges or (self._spm and not word.strip("\n"))) and word in lookup:
            return [lookup[word]]
        n = len(word)
        piece = list(word)
        if n > 1:
            ranks = self._ranks
            heap: list[tuple[int, int, int, str]] = []

            def push(left: int, right: int) -> None:
                rank = ranks.get((piece[left], piece[right]))
                if rank is not None:
                    heapq.heappush(heap, (rank, left, right, piece[left] + piece[right]))

            merge_symbols(piece, push, heap, lambda entry, a, b, adjacent: adjacent and a + b == entry[3])
        ids: list[int] = []
        for p in piece:
            if not p:
                continue
            tid = lookup.get(p)
            if tid is not None:
                ids.append(tid)
                continue
            # fallback: each byte on its own, byte-level characters or <0xXX> tokens (skipped if absent)
            for ch in ([f"<0x{x:02X}>" for x in p.encode("utf-8")] if self._spm else p):
                tid = lookup.get(ch)
                if tid is not None:
                    ids.append(tid)
        return ids

    # ------------------------------------------------------------------ decoding

    def _render(self, tid: int, at_start: bool, skip_special: bool) -> tuple[bytes, bool]:
        """Bytes of one token in a decoded sequence (StreamDecoder's hook; no leading-space rule)."""
        tid = self._check_id(tid)
        if self._types[tid] == TOKEN_CONTROL and not skip_special:
            return self._tokens[tid].encode("utf-8", errors="surrogatepass"), False
        return self._piece_bytes[tid], False

    def __repr__(self) -> str:
        return (f"BPETokenizer(n_vocab={self.n_vocab}, pre={self.pre!r}, bos_id={self.bos_id}, "
                f"eos_id={self.eos_id}, add_bos={self.add_bos}, add_eos={self.add_eos})")


class Gemma4Tokenizer(BPETokenizer, model="gemma4"):
    """Gemma 4's vocabulary (``tokenizer.ggml.model == "gemma4"``): BPE with the "gemma4" pre-tokenizer."""

    @classmethod
    def from_metadata(cls, meta: dict) -> "BPETokenizer":
        return super().from_metadata({**meta, "tokenizer.ggml.pre": "gemma4"})
