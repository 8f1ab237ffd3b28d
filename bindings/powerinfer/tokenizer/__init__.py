"""Tokenizers built from GGUF metadata alone: the vocabulary side every kind shares (vocab.py),
SentencePiece BPE (spm.py, tokenizer.ggml.model "llama"), byte-level BPE (bpe.py, "gpt2"), Gemma 4's
SentencePiece-style BPE (bpe.py, "gemma4") and BERT's WordPiece (wpm.py, "bert").
`load(metadata)` picks one; every kind is a `Tokenizer` (encode/decode/token_to_piece/is_eog/...,
usable with StreamDecoder)."""
from __future__ import annotations

from .bpe import BPETokenizer, Gemma4Tokenizer
from .spm import SPMTokenizer
from .wpm import WPMTokenizer
from .vocab import (TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNDEFINED, TOKEN_UNKNOWN, TOKEN_UNUSED,
                    TOKEN_USER_DEFINED, StreamDecoder, Tokenizer)

__all__ = ["BPETokenizer", "Gemma4Tokenizer", "SPMTokenizer", "WPMTokenizer", "StreamDecoder", "Tokenizer", "load",
           "TOKEN_BYTE",
           "TOKEN_CONTROL", "TOKEN_NORMAL", "TOKEN_UNDEFINED", "TOKEN_UNKNOWN", "TOKEN_UNUSED", "TOKEN_USER_DEFINED"]

load = Tokenizer.from_gguf_metadata     # (both modules above have registered their model names)
