"""The vocabulary side every tokenizer shares: token types, per-id lookups, decoding, streaming.

`Tokenizer` is the base class of the SentencePiece (`spm.SPMTokenizer`) and BPE (`bpe.BPETokenizer`, byte-level,
and its Gemma 4 kind `bpe.Gemma4Tokenizer`) tokenizers; `powerinfer.tokenizer.load(metadata)` picks one from the GGUF
keys.
A subclass sets n_vocab, bos_id, eos_id, unk_id, pad_id, add_bos, add_eos, add_space_prefix,
_tokens, _types, _piece_bytes, _eog and implements encode() and _render(tid, at_start, skip_special).
"""
from __future__ import annotations

import codecs
import heapq
from typing import Iterable

__all__ = ["StreamDecoder", "Tokenizer"]

# tokenizer.ggml.token_type values
TOKEN_UNDEFINED = 0
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6
VALID_TYPES = frozenset(range(TOKEN_UNDEFINED, TOKEN_BYTE + 1))

# end-of-generation tokens recognised by their text, in every vocabulary type (llama.cpp's list in llama_vocab::load:
# Phi-3's SentencePiece vocabulary ends its turns with <|end|>, ChatML's with <|im_end|>, gpt-oss's o200k_harmony
# with <|return|> (the final answer) and <|call|> (a tool call), Gemma 4's with <turn|> (and <|tool_response>, after a
# tool call, where the caller's answer goes), ...)
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>",
             "<｜end▁of▁sentence｜>", "<eos>", "<turn|>", "<|tool_response>")
# o200k_harmony's message markers, which llama.cpp makes user-defined tokens (rendered in decoded text, matched in any
# text) so that a reply's channels stay readable: <|channel|>analysis<|message|>...<|end|><|start|>assistant...
HARMONY_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def end_of_generation(text_to_id: dict, base_ids, types: list) -> set[int]:
    """The end-of-generation ids: base_ids (EOS / EOT / EOM where the vocabulary names them) and the EOG_TEXTS tokens;
    with llama.cpp's two o200k_harmony workarounds (llama_vocab::load) applied to types in place: where <|return|>,
    <|call|> and <|end|> all end generation, <|end|> does not (in harmony it ends a message, the reasoning channel's
    among them, not the reply) and becomes user-defined, as do the HARMONY_RENDERED markers."""
    eog = {tid for tid in base_ids if tid is not None}
    eog.update(text_to_id[text] for text in EOG_TEXTS if text in text_to_id)
    ret, call, end = (text_to_id.get(t) for t in ("<|return|>", "<|call|>", "<|end|>"))
    if ret in eog and call in eog and end in eog:
        eog.discard(end)
        types[end] = TOKEN_USER_DEFINED
    for text in HARMONY_RENDERED:
        if text in text_to_id:
            types[text_to_id[text]] = TOKEN_USER_DEFINED
    return eog


def merge_symbols(piece: list[str], candidate, heap: list, fresh) -> None:
    """The heap-driven BPE merge both tokenizers run (sentencepiece's bpe_model.cc, llama.cpp's
    llm_tokenizer_bpe), in place: piece[i] is a symbol of a linked list ("" once merged into its left
    neighbour). candidate(left, right) pushes a pair worth merging onto heap as (order, left, right, x),
    best first; a popped pair merges when both symbols are still there and fresh(entry, a, b, adjacent)
    says the entry was queued for the symbols a and b that stand there now (adjacent: still neighbours)."""
    n = len(piece)
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    for i in range(n - 1):
        candidate(i, i + 1)
    while heap:
        entry = heapq.heappop(heap)
        left, right = entry[1], entry[2]
        a, b = piece[left], piece[right]
        if not a or not b or not fresh(entry, a, b, nxt[left] == right):
            continue   # stale: one side was merged since this pair was queued
        piece[left] = a + b
        piece[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prev[after] = left
        if prev[left] >= 0:
            candidate(prev[left], left)
        if after >= 0:
            candidate(left, after)


_UNSUPPORTED_MODELS = {
    "t5": "SentencePiece unigram (UGM: T5, XLM-RoBERTa: bge-m3, bge-reranker-v2-m3, multilingual-e5)",
    "rwkv": "RWKV trie",
    "no_vocab": "no vocabulary",
}


def as_list(value, key: str) -> list:
    try:
        return list(value)
    except TypeError:
        raise ValueError(f"{key} must be a sequence, got {type(value).__name__}") from None


def as_text(value, key: str) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    raise ValueError(f"{key} entries must be strings, got {type(value).__name__}")


class Tokenizer:
    """A GGUF vocabulary's tokenizer: encode (text -> ids), decode, per-id lookups (see the module doc)."""

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_space_prefix: bool

    _kinds: dict[str, type] = {}     # tokenizer.ggml.model -> the subclass for it (each registers itself)

    def __init_subclass__(cls, model: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if model is not None:
            Tokenizer._kinds[model] = cls

    @staticmethod
    def from_gguf_metadata(meta: dict) -> "Tokenizer":
        """The tokenizer that a dict of GGUF keys (``tokenizer.ggml.*``) to Python values describes."""
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise ValueError("GGUF metadata has no tokenizer.ggml.model; cannot build a tokenizer")
        model = as_text(model, "tokenizer.ggml.model")
        if model not in Tokenizer._kinds:
            kind = _UNSUPPORTED_MODELS.get(model, "unknown tokenizer model")
            raise ValueError(f"tokenizer model {model!r} ({kind}) is not supported yet; "
                             "supported: 'llama' (SentencePiece BPE), 'gpt2' (byte-level BPE), 'gemma4' and "
                             "'bert' (WordPiece)")
        return Tokenizer._kinds[model].from_metadata(meta)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids for ``text``; ``add_special`` adds BOS/EOS per add_bos/add_eos."""
        if not isinstance(text, str):
            raise TypeError(f"encode() expects str, got {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        self._encode_text_into(text, parse_special, ids)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def _encode_text_into(self, text: str, parse_special: bool, ids: list[int]) -> None:
        """Appends the ids of ``text`` (special-token texts become their ids with parse_special) to ids."""
        raise NotImplementedError

    def _render(self, tid: int, at_start: bool, skip_special: bool) -> tuple[bytes, bool]:
        raise NotImplementedError

    def token_to_piece(self, id: int) -> bytes:
        """Raw bytes of one token as it appears in text (control tokens: b"")."""
        return self._piece_bytes[self._check_id(id)]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (SentencePiece: the dummy-prefix space of the first piece is dropped)."""
        out = bytearray()
        at_start = True
        for tid in ids:
            piece, at_start = self._render(tid, at_start, skip_special)
            out += piece
        return out.decode("utf-8", errors="replace")

    def _check_id(self, tid) -> int:
        tid = int(tid)
        if not 0 <= tid < self.n_vocab:
            raise ValueError(f"token id {tid} is out of range for a vocabulary of {self.n_vocab} tokens")
        return tid

    # ------------------------------------------------------------------ misc

    @property
    def eog_ids(self) -> frozenset[int]:
        """The end-of-generation tokens (what is_eog is true for)."""
        return frozenset(self._eog)

    def is_eog(self, id: int) -> bool:
        """True for end-of-generation tokens: EOS, and EOT/EOM/end-of-turn where the vocabulary has them."""
        return int(id) in self._eog

    def id_to_text(self, id: int) -> str:
        """The vocabulary entry of ``id`` as stored (e.g. "▁the", "<0x0A>", "<s>", "Ġthe")."""
        return self._tokens[self._check_id(id)]

    def token_type(self, id: int) -> int:
        """The tokenizer.ggml.token_type value of ``id``."""
        return self._types[self._check_id(id)]


class StreamDecoder:
    """Incremental, UTF-8-safe detokenizer: concatenated output equals ``Tokenizer.decode``."""

    def __init__(self, tokenizer: Tokenizer, strip_leading_space: bool = True, preserved=()):
        """preserved: control token ids rendered as their text (what decode(skip_special=False) gives)."""
        self._tokenizer = tokenizer
        self._at_start = strip_leading_space
        self._preserved = frozenset(preserved)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        """Add one token; return the text completed by it ("" while a character is partial)."""
        piece, self._at_start = self._tokenizer._render(id, self._at_start, id not in self._preserved)
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """Return any pending incomplete bytes (as U+FFFD) and reset the byte buffer."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
