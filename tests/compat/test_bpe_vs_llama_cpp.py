"""Our byte-level BPE tokenizer against llama.cpp's (llama-cpp-python, vocab_only) on vocabularies
trained with Hugging Face tokenizers (tests/test_tokenizer_bpe.py) and written to GGUF files as
llama.cpp's converter writes them, for the gpt-2, llama-bpe, qwen2 and default pre-tokenizers, with
and without special-token parsing. The ids must be identical."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("tokenizers")
import gguf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from powerinfer.tokenizer import Tokenizer  # noqa: E402
from powerinfer.gguf_file import open_gguf  # noqa: E402
from test_tokenizer_bpe import CHECK, gguf_vocab, train_hf  # noqa: E402

EXTRA = ["<|endoftext|>after", "<|im_start|><|im_start|>", "🦀 crab 🦀", "1\u00002", "x" * 500]


def write_vocab_gguf(path, tokens, types, merges, pre):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = tokens.index("<|endoftext|>")
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("pre,trained", [("gpt-2", "gpt-2"), ("llama-bpe", "llama-bpe"), ("qwen2", "qwen2"),
                                         ("default", "gpt-2")])
def test_bpe_ids_match_llama_cpp(tmp_path, pre, trained):
    tokens, types, merges = gguf_vocab(train_hf(trained))
    path = tmp_path / f"vocab-{pre}.gguf"
    write_vocab_gguf(path, tokens, types, merges, pre)
    ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
    for text in CHECK + EXTRA:
        for parse_special in (False, True):
            theirs = ll.tokenize(text.encode(), add_bos=False, special=parse_special)
            got = ours.encode(text, add_special=False, parse_special=parse_special)
            assert got == theirs, (pre, parse_special, text, got, theirs)
        ids = ll.tokenize(text.encode(), add_bos=False, special=False)
        assert ours.decode(ids).encode() == ll.detokenize(ids), (pre, text)
