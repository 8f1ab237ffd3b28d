"""Our byte-level BPE tokenizer against llama.cpp's (llama-cpp-python, vocab_only) on vocabularies
trained with Hugging Face tokenizers (tests/test_tokenizer_bpe.py) and written to GGUF files as
llama.cpp's converter writes them, for the gpt-2, llama-bpe, qwen2, gpt-4o (gpt-oss's o200k), default and the MoE
families' (glm4, olmo, hunyuan, bailingmoe2) pre-tokenizers, with and without special-token parsing. The ids must be
identical. A vocabulary with gpt-oss's harmony
tokens checks llama.cpp's o200k_harmony rules: which tokens end generation, which markers decode as text. A Gemma 4
vocabulary (tokenizer.ggml.model "gemma4", trained in tests/test_tokenizer_bpe.py, and one of real size: Gemma 3
270M's 262k tokens with Gemma 4's markers and merges made from the tokens' splits) checks its SentencePiece-style BPE:
ids, BOS, decoded text and the end-of-generation tokens."""
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
from test_tokenizer_bpe import CHECK, GEMMA4_CHECK, GEMMA4_SPECIAL, gguf_vocab, train_gemma4, train_hf  # noqa: E402

EXTRA = ["<|endoftext|>after", "<|im_start|><|im_start|>", "🦀 crab 🦀", "1\u00002", "x" * 500,
         "abc中文def ひらがなカタカナ,Hello", "!Abc 12345678 a—b",
         # DeepSeek's pre-tokenizers' scripts and punctuation: Greek, Cyrillic, kana, Hangul, full-width, trailing space
         "Ελληνικά и русский текст", "ひらがなとカタカナ 한국어 문장", "全角！？（テスト）。", "“quoted” ‘x’ ok  ",
         "a.b,c;d:e!f?g", "v1.2.3 x86_64 0xFF 10000000", "tail spaces   "]


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
                                         ("default", "gpt-2"), ("gpt-4o", "gpt-2"), ("exaone4", "gpt-2"),
                                         ("tekken", "gpt-2"), ("tekken", "llama-bpe"), ("seed-coder", "qwen2"),
                                         ("hunyuan-dense", "qwen2"), ("command-r", "gpt-2"),
                                         ("exaone", "gpt-2"), ("deepseek-llm", "gpt-2"),
                                         ("deepseek-v3", "gpt-2"), ("deepseek-coder", "gpt-2"),
                                         ("glm4", "llama-bpe"), ("olmo", "gpt-2"), ("hunyuan", "qwen2"),
                                         ("bailingmoe2", "qwen2"), ("qwen35", "qwen2")])
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


def check_gemma4(path, texts):
    """Ours against llama.cpp on a gemma4 vocabulary file: ids with and without special parsing (and BOS), decoded
    text, the end-of-generation set."""
    ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
    vocab = llama_cpp.llama_model_get_vocab(ll.model)
    assert ours.eog_ids == {i for i in range(ours.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    for text in texts:
        for parse_special in (False, True):
            theirs = ll.tokenize(text.encode(), add_bos=True, special=parse_special)
            got = ours.encode(text, parse_special=parse_special)
            assert got == theirs, (parse_special, text, got, theirs)
            # (without the BOS: llama-cpp-python's detokenize drops a space after one)
            assert ours.decode(theirs[1:], skip_special=not parse_special).encode() == \
                ll.detokenize(theirs[1:], special=parse_special), (parse_special, text)


def test_gemma4_vocabulary_matches_llama_cpp(tmp_path):
    """Gemma 4's tokenizer: the file says add_bos_token false and names another pre-tokenizer, llama.cpp adds BOS and
    uses its gemma4 rules anyway."""
    tokens, types, merges = train_gemma4()
    path = tmp_path / "gemma4.gguf"
    write_vocab_gguf(path, tokens, types, merges, "default", eos_text="<eos>", model="gemma4", bos_text="<bos>")
    check_gemma4(path, GEMMA4_CHECK + EXTRA)


def test_gemma4_real_size_vocabulary_matches_llama_cpp(tmp_path, gemma_file):
    """A vocabulary of Gemma 4's size and kind: Gemma 3 270M's 262k SentencePiece tokens (whitespace runs, byte
    tokens, control and user-defined tokens), Gemma 4's markers in its first unused slots, its newline runs normal
    tokens, and as merges every split of a normal token into two tokens (by the merged token's id), none making a
    newline run (those come whole, llama.cpp's Gemma 4 rule); text: GEMMA4_CHECK and the held-out text's
    paragraphs."""
    meta = open_gguf(gemma_file).metadata
    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    unused = [i for i, t in enumerate(tokens) if t.startswith("<unused")]
    for i, t in zip(unused, [t for t in GEMMA4_SPECIAL if t not in tokens]):
        tokens[i], types[i] = t, 3
    for i, t in enumerate(tokens):
        if t and not t.strip("\n"):
            types[i] = 1            # newline runs: normal tokens (Gemma 3's are user-defined)
    ids = {t: i for i, t in enumerate(tokens)}
    merges = [f"{t[:k]} {t[k:]}" for i, t in enumerate(tokens) if types[i] == 1 and t.strip("\n")
              for k in range(1, len(t)) if t[:k] in ids and t[k:] in ids]
    path = tmp_path / "gemma4-262k.gguf"
    write_vocab_gguf(path, tokens, types, merges, "gemma4", eos_text="<eos>", model="gemma4", bos_text="<bos>",
                     add_bos=True)
    heldout = (Path(__file__).resolve().parents[2] / "data" / "heldout.txt").read_text().split("\n\n")
    check_gemma4(path, GEMMA4_CHECK + EXTRA + heldout[:40] + ["\n\n".join(heldout[40:60])])


# combining marks (\p{M}): Devanagari vowel signs, a combining acute, Thai, Arabic harakat
MARKS = ["नमस्ते दुनिया", "e\u0301cole cafe\u0301!", "ภาษาไทย ทดสอบ", "مَرْحَبًا بِكُم", "x\u0301\u0302y ..\u0301",
         "̀ leading mark", "a\u0300.b\u0301,"]


def test_qwen35_marks_match_llama_cpp(tmp_path):
    """Qwen3.5's pre-tokenizer (tokenizer.ggml.pre qwen35: combining marks join letter runs, not punctuation runs): the
    ids of text with marks are llama.cpp's (the tiny vocabulary has no merges across a letter and its mark, so the
    ids equal Qwen2's; the words differ: checked on the expressions)."""
    import regex
    from powerinfer.tokenizer.bpe import PRE_TOKENIZERS
    words = {pre: [regex.findall(PRE_TOKENIZERS[pre].patterns[0], t) for t in MARKS] for pre in ("qwen35", "qwen2")}
    assert words["qwen35"][0] == ["नमस्ते", " दुनिया"] and words["qwen35"] != words["qwen2"]
    tokens, types, merges = gguf_vocab(train_hf("qwen2"))
    for pre in ("qwen35", "qwen2"):
        path = tmp_path / f"vocab-{pre}.gguf"
        write_vocab_gguf(path, tokens, types, merges, pre)
        ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        ours = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
        for text in MARKS:
            theirs = ll.tokenize(text.encode(), add_bos=False, special=False)
            assert ours.encode(text, add_special=False) == theirs, (pre, text)
