"""Our byte-level BPE tokenizer against llama.cpp's (llama-cpp-python, vocab_only) on vocabularies
trained with Hugging Face tokenizers (tests/test_tokenizer_bpe.py) and written to GGUF files as
llama.cpp's converter writes them, for the gpt-2, llama-bpe, qwen2, gpt-4o (gpt-oss's o200k) and default
pre-tokenizers, with and without special-token parsing. The ids must be identical. A vocabulary with gpt-oss's harmony
tokens checks llama.cpp's o200k_harmony rules: which tokens end generation, which markers decode as text. A Gemma 4
vocabulary (tokenizer.ggml.model "gemma4", trained in tests/test_tokenizer_bpe.py) checks its SentencePiece-style
BPE: ids, BOS, decoded text and the end-of-generation tokens."""
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
from test_tokenizer_bpe import CHECK, GEMMA4_CHECK, gguf_vocab, train_gemma4, train_hf  # noqa: E402

EXTRA = ["<|endoftext|>after", "<|im_start|><|im_start|>", "🦀 crab 🦀", "1\u00002", "x" * 500]


def write_vocab_gguf(path, tokens, types, merges, pre, eos_text="<|endoftext|>", model="gpt2", bos_text=None,
                     add_bos=False):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = tokens.index(eos_text)
    w.add_bos_token_id(tokens.index(bos_text or eos_text))
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("pre,trained", [("gpt-2", "gpt-2"), ("llama-bpe", "llama-bpe"), ("qwen2", "qwen2"),
                                         ("default", "gpt-2"), ("gpt-4o", "gpt-2")])
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


HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
HARMONY_TEXT = ["<|start|>assistant<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final"
                "<|message|>Hello!<|return|>",
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
                "plain <|end|> text <|return|>"]


def test_harmony_vocabulary_matches_llama_cpp(tmp_path):
    """gpt-oss's o200k_harmony special tokens (control tokens in the file, EOS <|return|>): llama.cpp ends generation at
    <|return|> and <|call|> but not <|end|> (it ends the reasoning message too), and decodes <|end|> and the message
    markers as text (user-defined); the ids of harmony text with and without special parsing and the decoded text
    are llama.cpp's."""
    tokens, types, merges = gguf_vocab(train_hf("gpt-2"))
    tokens, types = tokens + HARMONY, types + [3] * len(HARMONY)      # control tokens, as the converter writes them
    path = tmp_path / "harmony.gguf"
    write_vocab_gguf(path, tokens, types, merges, "gpt-4o", eos_text="<|return|>")
    ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
    vocab = llama_cpp.llama_model_get_vocab(ll.model)
    theirs_eog = {i for i in range(len(tokens)) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert ours.eog_ids == theirs_eog
    ids = {t: tokens.index(t) for t in HARMONY}
    assert ids["<|return|>"] in ours.eog_ids and ids["<|call|>"] in ours.eog_ids
    assert ids["<|end|>"] not in ours.eog_ids and tokens.index("<|endoftext|>") in ours.eog_ids
    for text in HARMONY_TEXT + CHECK[:6]:
        for parse_special in (False, True):
            theirs = ll.tokenize(text.encode(), add_bos=False, special=parse_special)
            got = ours.encode(text, add_special=False, parse_special=parse_special)
            assert got == theirs, (parse_special, text, got, theirs)
        ids_t = ll.tokenize(text.encode(), add_bos=False, special=True)
        assert ours.decode(ids_t).encode() == ll.detokenize(ids_t), text
    reply = ll.tokenize(HARMONY_TEXT[0].encode(), add_bos=False, special=True)
    assert ours.decode(reply) == HARMONY_TEXT[0].removesuffix("<|return|>")   # the markers stay readable


def test_gemma4_vocabulary_matches_llama_cpp(tmp_path):
    """Gemma 4's tokenizer: the file says add_bos_token false and names another pre-tokenizer, llama.cpp adds BOS and
    uses its gemma4 rules anyway; ids with and without special parsing and BOS, decoded text, end-of-generation set."""
    tokens, types, merges = train_gemma4()
    path = tmp_path / "gemma4.gguf"
    write_vocab_gguf(path, tokens, types, merges, "default", eos_text="<eos>", model="gemma4", bos_text="<bos>")
    ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
    vocab = llama_cpp.llama_model_get_vocab(ll.model)
    assert ours.eog_ids == {i for i in range(len(tokens)) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    for text in GEMMA4_CHECK + EXTRA:
        for parse_special in (False, True):
            theirs = ll.tokenize(text.encode(), add_bos=True, special=parse_special)
            got = ours.encode(text, parse_special=parse_special)
            assert got == theirs, (parse_special, text, got, theirs)
            # (without the BOS: llama-cpp-python's detokenize drops a space after one)
            assert ours.decode(theirs[1:], skip_special=not parse_special).encode() == \
                ll.detokenize(theirs[1:], special=parse_special), (parse_special, text)
