"""Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2"): small vocabularies built in the test
with known ids, and (when the `tokenizers` package is installed) vocabularies trained with Hugging
Face tokenizers for the gpt-2, llama-3 and qwen2 pre-tokenizers, whose encodings must be identical.
Gemma 4's SentencePiece-style BPE ("gemma4"): a small vocabulary with known ids, and one trained here
(train_gemma4). llama.cpp's own BPE tokenizer is compared on such vocabularies in
tests/compat/test_bpe_vs_llama_cpp.py.
"""
from __future__ import annotations

import json

import pytest

from powerinfer.tokenizer import StreamDecoder, Tokenizer
from powerinfer.tokenizer.bpe import _LLAMA3, _QWEN2, BPETokenizer, bytes_to_unicode

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
B2U = bytes_to_unicode()


def byte_char(s: str) -> str:
    """Byte-level spelling of s (what the vocabulary stores): ' ' -> 'Ġ', '\\n' -> 'Ċ', ..."""
    return "".join(B2U[b] for b in s.encode("utf-8"))


class Vocab:
    """The 256 byte tokens (id = byte value), then merged tokens and added tokens in order."""

    def __init__(self):
        self.tokens = [B2U[b] for b in range(256)]
        self.types = [NORMAL] * 256
        self.merges: list[str] = []

    def id(self, text: str) -> int:
        return self.tokens.index(byte_char(text))

    def merge(self, a: str, b: str) -> int:
        """Add merge rule (a, b) (texts in plain form) with the next rank; returns the new token's id."""
        self.merges.append(f"{byte_char(a)} {byte_char(b)}")
        if byte_char(a + b) not in self.tokens:
            self.tokens.append(byte_char(a + b))
            self.types.append(NORMAL)
        return self.id(a + b)

    def add(self, text: str, kind: int = NORMAL, byte_level: bool = True) -> int:
        self.tokens.append(byte_char(text) if byte_level else text)
        self.types.append(kind)
        return len(self.tokens) - 1

    def tokenizer(self, pre="gpt-2", **kw) -> BPETokenizer:
        return BPETokenizer(self.tokens, self.merges, self.types, pre=pre, **kw)


def b(s: str) -> list[int]:
    """Ids of the byte tokens of s."""
    return list(s.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# merges
# ---------------------------------------------------------------------------------------------
def test_merge_order_is_by_rank_not_position():
    v = Vocab()
    bc = v.merge("b", "c")          # rank 0
    ab = v.merge("a", "b")          # rank 1: never applies to "abc" because b was taken by rank 0
    tok = v.tokenizer()
    assert tok.encode("abc") == [v.id("a"), bc]
    assert tok.encode("abd") == [ab, v.id("d")]


def test_merges_chain_and_leftmost_wins_ties():
    v = Vocab()
    aa = v.merge("a", "a")
    aaaa = v.merge("aa", "aa")
    tok = v.tokenizer()
    assert tok.encode("aaa") == [aa, v.id("a")]          # the leftmost pair of equal rank first
    assert tok.encode("aaaa") == [aaaa]
    assert tok.encode("aaaaa") == [aaaa, v.id("a")]
    assert tok.encode("a") == [v.id("a")]
    assert tok.encode("") == []


def test_space_is_part_of_the_word():
    v = Vocab()
    sh = v.merge(" ", "h")
    shi = v.merge(" h", "i")
    hi = v.merge("h", "i")
    tok = v.tokenizer()
    assert tok.encode("hi hi") == [hi, shi]
    assert tok.encode("hi  hi") == [hi, v.id(" "), shi]         # \s+(?!\S) keeps one space for the word
    assert tok.encode(" h") == [sh]
    assert tok.decode([hi, v.id(" "), shi]) == "hi  hi"


def test_unicode_and_bytes():
    tok = Vocab().tokenizer()
    for text in ("é", "😀", "中文", "naïve café", "\x00\x01\x7f"):
        assert tok.encode(text) == b(text)
        assert tok.decode(tok.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# pre-tokenizers
# ---------------------------------------------------------------------------------------------
def test_digits_per_pre_tokenizer():
    """llama-3 splits numbers into groups of 3 digits, qwen2 into single digits, gpt-2 not at all;
    the merges then see different words."""
    v = Vocab()
    d34 = v.merge("3", "4")       # rank 0
    d12 = v.merge("1", "2")
    d123 = v.merge("12", "3")
    ids = {pre: v.tokenizer(pre).encode("12345", add_special=False) for pre in ("gpt-2", "llama-bpe", "qwen2")}
    assert ids["gpt-2"] == [d12, d34, v.id("5")]                # one word "12345"
    assert ids["llama-bpe"] == [d123, v.id("4"), v.id("5")]     # "123" "45"
    assert ids["qwen2"] == b("12345")                           # five words
    # the default pre-tokenizer also cuts numbers into 3-digit groups after splitting digit runs off
    assert v.tokenizer("default").encode("12345") == [d123, v.id("4"), v.id("5")]


def test_contractions_and_case():
    v = Vocab()
    qt = v.merge("'", "T")
    qt_lower = v.merge("'", "t")
    llama3, gpt2 = v.tokenizer("llama-bpe", add_bos=False), v.tokenizer("gpt-2")
    assert llama3.encode("DON'T") == b("DON") + [qt]            # llama-3: '[tT] is one word
    assert gpt2.encode("DON'T") == b("DON") + b("'") + b("T")   # gpt-2: only lower-case contractions
    assert gpt2.encode("don't") == b("don") + [qt_lower]
    assert llama3.encode("don't") == b("don") + [qt_lower]


def test_punctuation_and_newlines_llama3():
    v = Vocab()
    dot_nl = v.merge(".", "\n")
    nl_nl = v.merge("\n", "\n")
    tok = v.tokenizer("llama-bpe", add_bos=False)
    assert tok.encode("end.\nNext") == b("end") + [dot_nl] + b("Next")   # ?[^\s\p{L}\p{N}]+[\r\n]*
    assert tok.encode("a\n\nb") == b("a") + [nl_nl] + b("b")             # \s*[\r\n]+


def test_ignore_merges_llama3():
    """llama-3 emits a word that is a vocabulary entry directly, even without merges leading to it."""
    v = Vocab()
    xyz = v.add("xyz")
    assert v.tokenizer("llama-bpe", add_bos=False).encode("xyz") == [xyz]
    assert v.tokenizer("gpt-2").encode("xyz") == b("xyz")


def test_unknown_pre_tokenizer_is_named():
    with pytest.raises(ValueError, match="unknown BPE pre-tokenizer 'made-up'"):
        Vocab().tokenizer("made-up")


# ---------------------------------------------------------------------------------------------
# special and added tokens
# ---------------------------------------------------------------------------------------------
def test_special_tokens():
    v = Vocab()
    eot = v.add("<|im_end|>", CONTROL, byte_level=False)
    start = v.add("<|im_start|>", CONTROL, byte_level=False)
    think = v.add("<think>", USER_DEFINED, byte_level=False)
    eos = v.add("<|endoftext|>", CONTROL, byte_level=False)
    tok = v.tokenizer("qwen2", eos_id=eos)
    text = "<|im_start|>user\nhi<think>x<|im_end|>"
    assert tok.encode(text, parse_special=True) == [start] + b("user\nhi") + [think] + b("x") + [eot]
    # control tokens only with parse_special; user-defined (added) tokens always
    assert tok.encode(text) == b("<|im_start|>user\nhi") + [think] + b("x<|im_end|>")
    assert tok.decode([start, *b("hi"), think, eot]) == "hi<think>"
    assert tok.decode([start, *b("hi"), eot], skip_special=False) == "<|im_start|>hi<|im_end|>"
    assert tok.token_to_piece(eot) == b"" and tok.token_to_piece(think) == b"<think>"
    assert tok.is_eog(eot) and tok.is_eog(eos) and not tok.is_eog(start)


def test_harmony_tokens():
    """gpt-oss's o200k_harmony vocabulary (llama.cpp's llama_vocab::load rules): <|return|> and <|call|> end
    generation, <|end|> does not where both are there (it also ends the reasoning message) and, with the message
    markers, decodes as text (user-defined: matched in any text); a vocabulary without <|call|> keeps <|end|> as an
    end of generation (Phi-3's turns)."""
    v = Vocab()
    ids = {t: v.add(t, CONTROL, byte_level=False)
           for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>")}
    tok = v.tokenizer("gpt-4o", eos_id=ids["<|return|>"])
    assert tok.eog_ids == {ids["<|return|>"], ids["<|call|>"]}
    for t in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"):
        assert tok.token_type(ids[t]) == USER_DEFINED, t
    assert tok.token_type(ids["<|return|>"]) == CONTROL
    reply = [ids["<|channel|>"], *b("analysis"), ids["<|message|>"], *b("x"), ids["<|end|>"], ids["<|start|>"],
             *b("a"), ids["<|return|>"]]
    assert tok.decode(reply) == "<|channel|>analysis<|message|>x<|end|><|start|>a"
    assert tok.encode("<|channel|>final") == [ids["<|channel|>"]] + b("final")
    w = Vocab()
    end = w.add("<|end|>", CONTROL, byte_level=False)
    ret = w.add("<|return|>", CONTROL, byte_level=False)
    phi = w.tokenizer("gpt-4o", eos_id=ret)
    assert phi.eog_ids == {end, ret} and phi.token_type(end) == CONTROL


def test_gpt4o_pre_tokenizer():
    """o200k (gpt-4o): a word is capitals then lower-case letters (camelCase splits), one leading non-letter joins a
    word, digits go in groups of 3, contractions of either case stay with the word, punctuation keeps its newlines."""
    v = Vocab()
    v.merge("1", "2")
    d123 = v.merge("12", "3")
    qt = v.merge("'", "T")
    tok = v.tokenizer("gpt-4o")
    assert tok.encode("12345") == [d123] + b("45")
    assert tok.encode("DON'T") == b("DON") + [qt]
    pieces = _words(tok, "camelCase HTTPServer loads/ok?\n\nX 1234")
    assert pieces == ["camel", "Case", " HTTPServer", " loads", "/ok", "?\n\n", "X", " ", "123", "4"], pieces


def _words(tok, text):
    return [m.group(0) for r in tok._regexes for m in r.finditer(text)]


def test_longest_special_token_first():
    v = Vocab()
    short = v.add("<a>", CONTROL, byte_level=False)
    long_ = v.add("<a><b>", CONTROL, byte_level=False)
    assert v.tokenizer().encode("<a><b><a>", parse_special=True) == [long_, short]


def test_bos_eos_and_gguf_metadata():
    v = Vocab()
    bos = v.add("<|begin_of_text|>", CONTROL, byte_level=False)
    eos = v.add("<|end_of_text|>", CONTROL, byte_level=False)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.tokens": v.tokens,
            "tokenizer.ggml.token_type": v.types, "tokenizer.ggml.merges": v.merges,
            "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.eos_token_id": eos}
    tok = Tokenizer.from_gguf_metadata(meta)
    assert isinstance(tok, BPETokenizer)
    assert tok.encode("hi") == [bos] + b("hi")                # llama-3: BOS by default (as llama.cpp)
    assert tok.encode("hi", add_special=False) == b("hi")
    assert not Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.add_bos_token": False}).add_bos
    qwen = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "qwen2"})
    assert qwen.encode("hi") == b("hi")                         # qwen2: no BOS unless the file says so
    assert Tokenizer.from_gguf_metadata({k: x for k, x in meta.items() if k != "tokenizer.ggml.pre"}).pre == "default"
    with pytest.raises(ValueError, match="merges"):
        Tokenizer.from_gguf_metadata({k: x for k, x in meta.items() if k != "tokenizer.ggml.merges"})
    with pytest.raises(ValueError, match="'nope'"):
        Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "nope"})


def test_stream_decoder():
    v = Vocab()
    tok = v.tokenizer()
    text = "añ😀 b中"
    ids = tok.encode(text)
    dec = StreamDecoder(tok)
    out = "".join(dec.push(i) for i in ids) + dec.flush()
    assert out == text == tok.decode(ids)
    assert dec.push(ids[text.encode().index("😀".encode()[0])]) == ""   # a partial character waits


# ---------------------------------------------------------------------------------------------
# against Hugging Face tokenizers (trained here)
# ---------------------------------------------------------------------------------------------
TRAIN = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see 12345 numbers!",
    "def main():\n    print('hello, world')\n    return 42\n", "Ünïcödé text — with dashes… and “quotes”.",
    "中文文本，日本語のテキスト。한국어 텍스트", "emoji 😀🎉 👍🏽", "I'm, you're, they've, he'd, she'll, don't",
    "   indented\n\n\nlines\t\ttabs",
] * 20
CHECK = [
    "Hello world!", "The lazy dog's 1234567 numbers, 3.14159", "  leading and trailing  ", "\n\n\nnewlines\r\n",
    "tabs\t\there", "I'M SHOUTING, YOU'RE LOUD", "def f(x):\n    return x**2  # ok\n", "中文和日本語",
    "😀🎉👍🏽👨‍👩‍👧", "<|im_start|>user\nhi<|im_end|>\n", "text<think>reason</think>more", "unseen: zyxwvut qqq",
    "a" * 100 + " " * 30 + "b", "numbers 1 12 123 1234 12345", "mixed1a2b3c", "   \n   \n", "é vs e\u0301",
    "¡Hola! ¿Qué tal?", "x\u00a0y", "",
]


def train_hf(kind: str):
    tk = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    if kind == "gpt-2":
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pre = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3 if kind == "llama-bpe" else _QWEN2), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf = tk.Tokenizer(models.BPE(ignore_merges=kind == "llama-bpe"))
    hf.pre_tokenizer = pre
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False)
    hf.train_from_iterator(TRAIN, trainer)
    hf.add_tokens([tk.AddedToken("<think>", special=False, normalized=False)])
    return hf


def gguf_vocab(hf):
    """tokens, token types and merges as llama.cpp's converter writes them."""
    j = json.loads(hf.to_str())
    vocab = j["model"]["vocab"]
    n = 1 + max(max(vocab.values()), max(a["id"] for a in j["added_tokens"]))
    tokens, types = [""] * n, [NORMAL] * n
    for t, i in vocab.items():
        tokens[i] = t
    for a in j["added_tokens"]:
        tokens[a["id"]], types[a["id"]] = a["content"], CONTROL if a["special"] else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, types, merges


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_matches_hf_tokenizers(pre):
    hf = train_hf(pre)
    tokens, types, merges = gguf_vocab(hf)
    ours = BPETokenizer(tokens, merges, types, pre=pre, eos_id=tokens.index("<|endoftext|>"), add_bos=False)
    assert len(merges) > 50
    for text in CHECK:
        expect = hf.encode(text, add_special_tokens=False).ids     # HF matches every added token
        got = ours.encode(text, add_special=False, parse_special=True)
        assert got == expect, (pre, text, got, expect)
        assert ours.decode(got, skip_special=False) == hf.decode(expect, skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------
# Gemma 4 (tokenizer.ggml.model "gemma4")
# ---------------------------------------------------------------------------------------------
BYTE = 6
GEMMA4_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>",
                  "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>', "<|think|>", "<|tool>", "<tool|>"]
GEMMA4_BYTES = [f"<0x{i:02X}>" for i in range(256)]


def gemma4_meta(tokens, types, merges, **extra) -> dict:
    return {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0, **extra}


def gemma4_types(tokens) -> list[int]:
    """Gemma 4's token types: control specials, <unk> unknown, <0xXX> byte tokens, the rest normal."""
    kinds = {t: CONTROL for t in GEMMA4_SPECIAL} | {"<unk>": 2} | {t: BYTE for t in GEMMA4_BYTES}
    return [kinds.get(t, NORMAL) for t in tokens]


def test_gemma4_spm_style_bpe():
    """Spaces are U+2581 and merge over raw characters (no byte-level encoding), a newline run that is a
    vocabulary entry is one token, missing characters fall back to <0xXX>, BOS is added whatever the file says,
    the file's pre-tokenizer name is ignored, and decoding gives the spaces back."""
    words = ["▁", "a", "b", "▁a", "ab", "\n", "\n\n", "x"]
    tokens = GEMMA4_SPECIAL + GEMMA4_BYTES + words
    tok = Tokenizer.from_gguf_metadata(gemma4_meta(tokens, gemma4_types(tokens), ["▁ a", "a b"],
                                                   **{"tokenizer.ggml.add_bos_token": False,
                                                      "tokenizer.ggml.pre": "llama-bpe"}))
    w = {t: tokens.index(t) for t in words}
    assert tok.add_bos and tok.pre == "gemma4"
    assert tok.encode("a ab") == [2, w["a"], w["▁a"], w["b"]]           # "▁ a" (rank 0) takes the a before "a b"
    assert tok.encode("ab  a", add_special=False) == [w["ab"], w["▁"], w["▁a"]]
    assert tok.encode("\n\n", add_special=False) == [w["\n\n"]]          # the newline run whole
    assert tok.encode("x\n\n\nx", add_special=False) == [w["x"], w["\n"], w["\n"], w["\n"], w["x"]]
    e_acute = [tokens.index("<0xC3>"), tokens.index("<0xA9>")]
    assert tok.encode("é", add_special=False) == e_acute                  # byte fallback
    text = "<|turn>user\na é<turn|>"
    ids = tok.encode(text, add_special=False, parse_special=True)
    assert ids == [4, *tok.encode("user\na é", add_special=False), 5]
    assert tok.decode(ids, skip_special=False) == text and tok.decode(ids) == "user\na é"
    assert tok.token_to_piece(w["▁a"]) == b" a"
    assert {1, 5, 10} <= tok.eog_ids and 4 not in tok.eog_ids           # <eos>, <turn|>, <|tool_response>


def train_gemma4():
    """A Gemma 4-style vocabulary learned over data/heldout.txt and TRAIN (Hugging Face tokenizers, BPE with byte
    fallback over U+2581-escaped text split into newline and non-newline runs): tokens, token types and merges as
    llama.cpp's converter writes them, the specials first, plus a newline-run token no merge reaches."""
    tk = pytest.importorskip("tokenizers")
    from pathlib import Path

    from tokenizers import Regex, models, normalizers, pre_tokenizers, trainers
    hf = tk.Tokenizer(models.BPE(byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.pre_tokenizer = pre_tokenizers.Split(Regex("[^\n]+|[\n]+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=GEMMA4_SPECIAL + GEMMA4_BYTES, limit_alphabet=120,
                                  show_progress=False)
    heldout = Path(__file__).resolve().parents[1] / "data" / "heldout.txt"
    hf.train_from_iterator(heldout.read_text().splitlines(keepends=True) + TRAIN, trainer)
    j = json.loads(hf.to_str())
    tokens = sorted(j["model"]["vocab"], key=j["model"]["vocab"].get) + ["\n" * 5]
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, gemma4_types(tokens), merges


GEMMA4_CHECK = CHECK + [
    "a  b   c    d", " leading", "trailing ", "\n\n\n\n\n", "x\n\n\n\n\ny\n", "\r\n\r\n", "\u2581 literal",
    "<0x41> literal", "<|turn>user\nHi there<turn|>\n<|turn>model\n", '<|tool_call>call:f{a:<|"|>x y<|"|>}<tool_call|>',
    "<|channel>thought\nhmm<channel|>ok", "🦀 Привет ß ∑ 𝔘", "I'm fine.\tTabs\t\tand  spaces", "x" * 300,
    "<bos><eos>", "1\u00002",
]


def test_gemma4_trained_vocabulary_round_trips():
    tokens, types, merges = train_gemma4()
    tok = Tokenizer.from_gguf_metadata(gemma4_meta(tokens, types, merges))
    assert len(merges) > 500
    for text in GEMMA4_CHECK:
        if "\u2581" in text:
            continue    # a U+2581 of the text decodes as a space (as in llama.cpp)
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids) == text, text
        dec = StreamDecoder(tok, strip_leading_space=False)
        assert "".join(dec.push(i) for i in ids) + dec.flush() == text
