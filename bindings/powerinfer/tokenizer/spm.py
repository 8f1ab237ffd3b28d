"""SentencePiece-style ("llama") tokenizer built from GGUF metadata alone.

Encoding reproduces ``sentencepiece``'s BPE model (the kind llama uses):

1. Normalise: prepend a space (the "dummy prefix") and replace every
   U+0020 space with U+2581 ``"▁"``.  No other normalisation is applied
   (llama models use sentencepiece's ``identity`` rule).
2. Split into characters; user-defined pieces found in the text (longest
   match first) become single *frozen* symbols that never merge.
3. Repeatedly merge the adjacent pair whose concatenation is a vocabulary
   piece with the highest score (leftmost first on ties), using a heap.
4. Emit the id of each final symbol; ``unused`` pieces are split back into
   the pieces they were merged from.  A character with no piece becomes the
   byte tokens ``<0xXX>`` of its UTF-8 bytes when the vocabulary has byte
   tokens, else the unknown token (one unk per run of unknown characters,
   as sentencepiece does).

Control tokens (``<s>``, ``</s>``, ...) never come out of plain text; with
``parse_special=True`` their text in the input maps to their ids, and the
text between them is encoded as separate fragments, each with its own dummy
prefix (llama.cpp's behaviour).

Decoding reassembles byte tokens into UTF-8, maps ``"▁"`` back to spaces and
drops the dummy-prefix space from the first piece, as ``sentencepiece``'s
``decode`` does; the unknown token renders as sentencepiece's " ⁇ ".
Invalid UTF-8 is replaced with U+FFFD using Python's ``errors="replace"``
rules (sentencepiece itself emits one U+FFFD per invalid byte).
"""

from __future__ import annotations

import heapq
import re
from .vocab import (EOG_TEXTS, TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNDEFINED, TOKEN_UNKNOWN, TOKEN_UNUSED,
                    TOKEN_USER_DEFINED, VALID_TYPES, Tokenizer, as_list, as_text, merge_symbols)

__all__ = ["SPMTokenizer"]

# pieces that merges may produce (sentencepiece's ``pieces_`` map)
_MERGEABLE_TYPES = frozenset({TOKEN_UNDEFINED, TOKEN_NORMAL, TOKEN_USER_DEFINED, TOKEN_UNUSED})

SPACE_SYMBOL = "\u2581"  # "▁"
UNK_SURFACE = " \u2047 "  # sentencepiece's default rendering of <unk>: " ⁇ "

_BYTE_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPACE_CHUNK_RE = re.compile(SPACE_SYMBOL + "*[^" + SPACE_SYMBOL + "]*")

# chunk cache bounds (see SPMTokenizer._encode_chunks)
_CACHE_MAX_ENTRIES = 65536
_CACHE_MAX_CHUNK_CHARS = 64


class SPMTokenizer(Tokenizer, model="llama"):
    """A llama/SentencePiece BPE tokenizer over a GGUF vocabulary."""

    def __init__(self, tokens: list[str], scores: list[float] | None = None,
                 types: list[int] | None = None, *, bos_id: int | None = None,
                 eos_id: int | None = None, unk_id: int | None = None,
                 pad_id: int | None = None, eot_id: int | None = None,
                 add_bos: bool = True, add_eos: bool = False,
                 add_space_prefix: bool = True):
        n = len(tokens)
        if n == 0:
            raise ValueError("tokenizer vocabulary is empty")
        if scores is None:
            scores = [0.0] * n
        if len(scores) != n:
            raise ValueError(f"tokenizer.ggml.scores has {len(scores)} entries but there are {n} tokens")
        if types is not None and len(types) != n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries but there are {n} tokens")
        for name, tid in (("bos", bos_id), ("eos", eos_id), ("unknown", unk_id),
                          ("padding", pad_id), ("eot", eot_id)):
            if tid is not None and not 0 <= tid < n:
                raise ValueError(f"{name} token id {tid} is out of range for a vocabulary of {n} tokens")

        self._tokens = [str(t) for t in tokens]
        self._scores = [float(s) for s in scores]
        if types is None:
            types = self._guess_types(self._tokens, bos_id, eos_id, unk_id, eot_id)
        self._types = [int(t) for t in types]
        for i, t in enumerate(self._types):
            if t not in VALID_TYPES:
                raise ValueError(f"token {i} ({self._tokens[i]!r}) has unsupported token type {t}")

        if unk_id is None:
            unk_id = next((i for i, t in enumerate(self._types) if t == TOKEN_UNKNOWN), None)
        if add_bos and bos_id is None:
            raise ValueError("add_bos is set but the vocabulary has no BOS token id")
        if add_eos and eos_id is None:
            raise ValueError("add_eos is set but the vocabulary has no EOS token id")

        self.n_vocab: int = n
        self.bos_id: int | None = bos_id
        self.eos_id: int | None = eos_id
        self.unk_id: int | None = unk_id
        self.pad_id: int | None = pad_id
        self.add_bos: bool = bool(add_bos)
        self.add_eos: bool = bool(add_eos)
        self.add_space_prefix: bool = bool(add_space_prefix)
        self._build_tables(eot_id)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_metadata(cls, meta: dict) -> "SPMTokenizer":
        """Build from a dict of GGUF keys (``tokenizer.ggml.*``, model "llama") to Python values."""
        if "tokenizer.ggml.tokens" not in meta:
            raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
        tokens = [as_text(t, "tokenizer.ggml.tokens")
                  for t in as_list(meta["tokenizer.ggml.tokens"], "tokenizer.ggml.tokens")]
        scores = meta.get("tokenizer.ggml.scores")
        types = meta.get("tokenizer.ggml.token_type")
        scores = None if scores is None else [float(s) for s in as_list(scores, "tokenizer.ggml.scores")]
        types = None if types is None else [int(t) for t in as_list(types, "tokenizer.ggml.token_type")]

        def special(name: str, fallback_text: str | None = None) -> int | None:
            value = meta.get(f"tokenizer.ggml.{name}_token_id")
            if value is not None:
                return int(value)
            if fallback_text is not None and fallback_text in tokens:
                return tokens.index(fallback_text)
            return None

        bos_id = special("bos", "<s>")
        eos_id = special("eos", "</s>")
        add_bos = meta.get("tokenizer.ggml.add_bos_token")
        add_bos = (bos_id is not None) if add_bos is None else bool(add_bos)
        return cls(tokens, scores, types,
                   bos_id=bos_id, eos_id=eos_id, unk_id=special("unknown"),
                   pad_id=special("padding"), eot_id=special("eot"),
                   add_bos=add_bos,
                   add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
                   add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)))

    @staticmethod
    def _guess_types(tokens, bos_id, eos_id, unk_id, eot_id) -> list[int]:
        """Token types for a vocabulary without tokenizer.ggml.token_type."""
        types = [TOKEN_BYTE if _BYTE_RE.fullmatch(t) else TOKEN_NORMAL for t in tokens]
        for tid in (bos_id, eos_id, eot_id):
            if tid is not None:
                types[tid] = TOKEN_CONTROL
        if unk_id is not None:
            types[unk_id] = TOKEN_UNKNOWN
        return types

    def _build_tables(self, eot_id: int | None) -> None:
        """Precompute the lookup dicts used by encode/decode."""
        tokens, types = self._tokens, self._types
        # sentencepiece's PieceToId: reserved pieces (control/unknown/byte) win over normal ones;
        # among duplicates the first id wins.
        self._piece_to_id: dict[str, int] = {}
        self._merge_score: dict[str, float] = {}  # pieces a merge may produce -> score
        self._byte_to_id: dict[int, int] = {}
        self._unused: set[str] = set()
        self._user_alias: dict[str, int] = {}
        user_defined, specials = [], {}
        for i, (text, t) in enumerate(zip(tokens, types)):
            if t in _MERGEABLE_TYPES:
                self._merge_score.setdefault(text, self._scores[i])
                if t == TOKEN_UNUSED:
                    self._unused.add(text)
                if t == TOKEN_USER_DEFINED and text:
                    user_defined.append((i, text))
                continue
            self._piece_to_id.setdefault(text, i)
            if t == TOKEN_BYTE:
                m = _BYTE_RE.fullmatch(text)
                if m is None:
                    raise ValueError(f"byte token {i} has malformed text {text!r} (expected '<0xXX>')")
                self._byte_to_id.setdefault(int(m.group(1), 16), i)
            elif text and (t == TOKEN_CONTROL or t == TOKEN_UNKNOWN):
                specials.setdefault(text, i)
        for i, (text, t) in enumerate(zip(tokens, types)):
            if t in _MERGEABLE_TYPES:
                self._piece_to_id.setdefault(text, i)
        self._unused = {p for p in self._unused if self._types[self._piece_to_id[p]] == TOKEN_UNUSED}

        # User-defined pieces are matched in the normalised text. Gemma's GGUF stores its whitespace-run
        # pieces with plain spaces ("  "), which llama.cpp matches in the raw text before the spaces
        # become "▁": match them as "▁▁" here, and let that text map to the user-defined id.
        user_texts = []
        for i, text in user_defined:
            if " " in text:
                norm = text.replace(" ", SPACE_SYMBOL)
                if norm not in self._user_alias:
                    self._user_alias[norm] = i
                    self._piece_to_id[norm] = i
                text = norm
            user_texts.append(text)
        self._user_matcher = _PieceMatcher.build(user_texts)
        self._special_matcher = _PieceMatcher.build(list(specials))
        self._special_ids = specials

        # Merges can never cross the boundary in front of a run of "▁" when no mergeable
        # piece has a "▁" right after another character; the text then splits into
        # independent chunks ("▁▁word") that can be cached.  Unused pieces need the
        # whole-text merge history for resegmentation, so they disable chunking too.
        crossing = re.compile("[^" + SPACE_SYMBOL + "]" + SPACE_SYMBOL)
        self._chunked = not self._unused and not any(crossing.search(p) for p in self._merge_score)
        self._cache: dict[str, tuple[int, ...]] = {}

        # decode tables
        self._piece_bytes: list[bytes] = []
        self._lead_space: list[bool] = []
        for i, (text, t) in enumerate(zip(tokens, types)):
            if t == TOKEN_CONTROL:
                b = b""
            elif t == TOKEN_UNKNOWN:
                b = UNK_SURFACE.encode()
            elif t == TOKEN_BYTE:
                b = bytes([int(_BYTE_RE.fullmatch(text).group(1), 16)])
            else:
                b = text.replace(SPACE_SYMBOL, " ").encode("utf-8", errors="surrogatepass")
            self._piece_bytes.append(b)
            self._lead_space.append(t not in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_BYTE)
                                    and text.startswith(SPACE_SYMBOL))

        self._eog: set[int] = {tid for tid in (self.eos_id, eot_id) if tid is not None}
        for text in EOG_TEXTS:     # whatever their type (llama.cpp makes them control tokens)
            tid = specials.get(text, self._piece_to_id.get(text))
            if tid is not None:
                self._eog.add(tid)

    # ------------------------------------------------------------------ encoding

    def _encode_text_into(self, text: str, parse_special: bool, ids: list[int]) -> None:
        if parse_special and self._special_matcher is not None:
            pos = 0
            for begin, end, special in self._special_matcher.finditer(text):
                self._encode_fragment(text[pos:begin], ids)
                ids.append(self._special_ids[special])
                pos = end
            self._encode_fragment(text[pos:], ids)
        else:
            self._encode_fragment(text, ids)

    def _encode_fragment(self, text: str, out: list[int]) -> None:
        """Encode plain text (no control tokens) into ``out``."""
        if not text:
            return
        if self.add_space_prefix:
            text = " " + text
        norm = text.replace(" ", SPACE_SYMBOL)
        start = len(out)
        if not self._chunked:
            self._emit(self._merge(self._split_symbols(norm)), out, start)
            return
        pos = 0
        if self._user_matcher is not None:
            for begin, end, piece in self._user_matcher.finditer(norm):
                self._encode_chunks(norm[pos:begin], out, start)
                out.append(self._piece_to_id[piece])
                pos = end
        self._encode_chunks(norm[pos:], out, start)

    def _encode_chunks(self, norm: str, out: list[int], start: int) -> None:
        """Encode normalised text without user-defined pieces, chunk by chunk (cached).

        ``start`` is where the current fragment begins in ``out`` (for unk-run merging).
        """
        cache = self._cache
        for chunk in _SPACE_CHUNK_RE.findall(norm):
            if not chunk:
                continue
            ids = cache.get(chunk)
            if ids is None:
                buf: list[int] = []
                self._emit(self._merge([(c, False) for c in chunk]), buf, 0)
                ids = tuple(buf)
                if len(chunk) <= _CACHE_MAX_CHUNK_CHARS:
                    if len(cache) >= _CACHE_MAX_ENTRIES:
                        cache.clear()
                    cache[chunk] = ids
            if self._continues_unk_run(ids[0], out, start):
                ids = ids[1:]
            out.extend(ids)

    def _split_symbols(self, norm: str) -> list[tuple[str, bool]]:
        """Characters of ``norm``, with user-defined pieces as frozen single symbols."""
        if self._user_matcher is None:
            return [(c, False) for c in norm]
        symbols, pos = [], 0
        for begin, end, piece in self._user_matcher.finditer(norm):
            symbols.extend((c, False) for c in norm[pos:begin])
            symbols.append((piece, True))
            pos = end
        symbols.extend((c, False) for c in norm[pos:])
        return symbols

    def _merge(self, symbols: list[tuple[str, bool]]) -> list[str]:
        """Heap-based BPE merge (sentencepiece's bpe_model.cc), then unused-piece resegmentation."""
        n = len(symbols)
        piece = [s for s, _ in symbols]
        if n < 2:
            return piece
        frozen = [f for _, f in symbols]
        scores, unused = self._merge_score, self._unused
        rev_merge: dict[str, tuple[str, str]] = {}
        heap: list[tuple[float, int, int, int]] = []

        def candidate(left: int, right: int) -> None:
            if frozen[left] or frozen[right]:
                return
            a, b = piece[left], piece[right]
            score = scores.get(a + b)
            if score is None:
                return
            heapq.heappush(heap, (-score, left, right, len(a) + len(b)))
            if unused and a + b in unused:
                rev_merge[a + b] = (a, b)

        merge_symbols(piece, candidate, heap, lambda entry, a, b, adjacent: len(a) + len(b) == entry[3])
        result: list[str] = []
        for p in piece:
            if p:
                self._resegment(p, rev_merge, result)
        return result

    def _resegment(self, w: str, rev_merge: dict, out: list[str]) -> None:
        """Split merged ``unused`` pieces back into their parts (sentencepiece does this)."""
        if w in self._unused and w in rev_merge:
            a, b = rev_merge[w]
            self._resegment(a, rev_merge, out)
            self._resegment(b, rev_merge, out)
        else:
            out.append(w)

    def _emit(self, pieces: list[str], out: list[int], start: int) -> None:
        """Append ids of final pieces, falling back to byte tokens / unk for unknown ones.

        Without byte fallback a run of unknown pieces becomes a single unk, as in
        sentencepiece; ``start`` is where the current fragment begins in ``out``.
        """
        lookup, types = self._piece_to_id, self._types
        for w in pieces:
            tid = lookup.get(w)
            if tid is not None and types[tid] != TOKEN_UNKNOWN:
                out.append(tid)
                continue
            if self._byte_to_id:
                for byte in w.encode("utf-8"):
                    bid = self._byte_to_id.get(byte)
                    out.append(self._require_unk(w) if bid is None else bid)
            else:
                unk = self._require_unk(w)
                if not self._continues_unk_run(unk, out, start):
                    out.append(unk)

    def _continues_unk_run(self, tid: int, out: list[int], start: int) -> bool:
        """True if ``tid`` is an unk that extends an unk run already at the end of ``out``."""
        return (not self._byte_to_id and tid == self.unk_id
                and len(out) > start and out[-1] == tid)

    def _require_unk(self, w: str) -> int:
        if self.unk_id is None:
            raise ValueError(f"cannot encode {w!r}: not in the vocabulary and there is no unknown token")
        return self.unk_id

    # ------------------------------------------------------------------ decoding

    def _render(self, tid: int, at_start: bool, skip_special: bool) -> tuple[bytes, bool]:
        """Bytes of one token in a decoded sequence and the new "at start" state."""
        tid = self._check_id(tid)
        t = self._types[tid]
        if t == TOKEN_CONTROL:
            if skip_special:
                return b"", at_start  # invisible: does not consume the leading space
            return self._tokens[tid].encode(), False
        if t == TOKEN_UNKNOWN and not skip_special:
            return self._tokens[tid].encode(), False
        piece = self._piece_bytes[tid]
        if at_start and self.add_space_prefix and self._lead_space[tid]:
            piece = piece[1:]
        return piece, False

    def __repr__(self) -> str:
        return (f"Tokenizer(n_vocab={self.n_vocab}, bos_id={self.bos_id}, eos_id={self.eos_id}, "
                f"unk_id={self.unk_id}, add_bos={self.add_bos}, add_eos={self.add_eos})")


class _PieceMatcher:
    """Leftmost-longest matching of a fixed set of strings (sentencepiece's PrefixMatcher).

    A character trie walked from each position whose character can start a piece, so
    the cost does not grow with the number of pieces.
    """

    _END = ""  # trie key marking "a piece ends here" (never a real character)

    def __init__(self, pieces: list[str]):
        self._trie: dict = {}
        for piece in pieces:
            node = self._trie
            for ch in piece:
                node = node.setdefault(ch, {})
            node[self._END] = piece
        self._first = re.compile("[" + "".join(re.escape(ch) for ch in self._trie) + "]")

    @classmethod
    def build(cls, pieces: list[str]) -> "_PieceMatcher | None":
        pieces = [p for p in pieces if p]
        return cls(pieces) if pieces else None

    def finditer(self, text: str):
        """Yield (begin, end, piece) for non-overlapping matches, left to right."""
        pos, n = 0, len(text)
        while True:
            m = self._first.search(text, pos)
            if m is None:
                return
            begin = m.start()
            node, j, found = self._trie, begin, None
            while j < n:
                node = node.get(text[j])
                if node is None:
                    break
                j += 1
                if self._END in node:
                    found = (j, node[self._END])
            if found is None:
                pos = begin + 1
                continue
            yield begin, found[0], found[1]
            pos = found[0]
