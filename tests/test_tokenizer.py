"""Cross-check powerinfer.tokenizer against the sentencepiece library.

Small BPE models are trained once per session with llama-like settings
(identity normalisation, dummy prefix, no whitespace squeezing, split digits)
and turned into GGUF-style metadata; our pure-Python tokenizer must then give
exactly sentencepiece's ids and decoded text.

Run before the package is installed with:
    PYTHONPATH=bindings python -m pytest tests/test_tokenizer.py -q
"""

from __future__ import annotations

import itertools
import random
import time

import numpy as np
import pytest

spm = pytest.importorskip("sentencepiece")

from powerinfer.tokenizer import StreamDecoder, Tokenizer  # noqa: E402

# ---------------------------------------------------------------- constants

# GGUF tokenizer.ggml.token_type values (same numbering as sentencepiece's proto enum)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2  # sentencepiece trainer defaults
UNK_SURFACE = " \u2047 "  # how sentencepiece decodes <unk>
SPACE_SYMBOL = "\u2581"  # "▁", sentencepiece's escaped space

FOO_BAR = SPACE_SYMBOL + "foo" + SPACE_SYMBOL + "bar"  # "▁foo▁bar": a piece with an interior "▁"
USER_DEFINED_SYMBOLS = ["<ud>", FOO_BAR, "[TOOL]"]
CONTROL_SYMBOLS = ["<|eot_id|>", "<sep>"]
SPECIAL_TEXTS = ["<s>", "</s>", "<unk>", *CONTROL_SYMBOLS]  # what parse_special=True may match

LLAMA_LIKE_TRAIN_ARGS = dict(
    model_type="bpe",
    normalization_rule_name="identity",
    add_dummy_prefix=True,
    remove_extra_whitespaces=False,
    split_digits=True,
    character_coverage=1.0,
    minloglevel=2,  # keep the trainer quiet
)

FUZZ_CASES_PER_MODEL = 400
FUZZ_MAX_LEN = 40
PERF_TEXT_BYTES = 100_000
PERF_BUDGET_S = 3.0  # encode of ~100 KB must finish well within this

TRAIN_CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.
In the beginning there was text, and the text was tokenized into pieces.
Language models read tokens, not characters; the tokenizer decides the pieces.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
It was the best of times, it was the worst of times, it was the age of wisdom.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
for (int i = 0; i < 10; ++i) { total += values[i] * 2; }
if x == {"key": [1, 2, 3]} and not y: print(f"value={x['key'][0]}")
The year 2024 had 366 days; pi is about 3.14159 and e is about 2.71828.
Call 555-0123 or write to 42 Main Street, Springfield, before 10:30 on 07/04.
Café, naïve, résumé, façade, jalapeño, über, crème brûlée, São Paulo.
Привет, мир! Как дела? Сегодня хорошая погода, и мы идём гулять в парк.
日本語のテキストです。東京は日本の首都です。中文文本也在这里，你好世界。
مرحبا بالعالم، كيف حالك اليوم؟ هذا نص عربي قصير.
Emoji time: 😀 😂 👍 🎉 ❤️ 🚀 and a family 👨‍👩‍👧 waving 👋🏽.
Tabs\tand\tmore\ttabs, plus    four spaces and two  spaces.
"""

# characters deliberately absent from TRAIN_CORPUS (byte fallback / unk)
UNSEEN_TEXTS = ["ß Ω ℵ", "한국어 텍스트", "नमस्ते दुनिया", "ภาษาไทย", "Ελληνικά", "🦀🦀", "\u00a0nbsp\u00a0", "\u0000"]

TRICKY_TEXTS = [
    "",
    " ",
    "  ",
    "a",
    " leading space",
    "trailing space ",
    "   three leading, three trailing   ",
    "many     inner      spaces",
    "\t",
    "tab\tseparated\tvalues",
    "\n",
    "\n\n",
    "line one\nline two\n\nline four\r\n",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve résumé façade",
    "日本語のテキスト",
    "中文文本你好世界",
    "Привет, мир!",
    "مرحبا بالعالم",
    "😀👍🎉",
    "👨‍👩‍👧‍👦 family, 👩🏾‍💻 coder, 🏳️‍🌈 flag",
    "1234567890",
    "3.14159 2,718 -42 +7 1e-9 0x1F",
    "def f(x):\n    return [x ** 2 for x in range(10)]\n",
    "{[()]} <>&| ~`!@#$%^*_-=+;:'\",./?\\",
    "    indented(code) {\n        nested;\n    }",
    "supercalifragilisticexpialidocious" * 20,
    "a" * 500,
    "日本" * 200,
    SPACE_SYMBOL + "literal lower-one-eighth-block " + SPACE_SYMBOL * 2,
    "<s> </s> <unk> <0x41> look like specials but are text",
    "x<ud>y <ud> [TOOL]call foo bar foo  bar",
    *UNSEEN_TEXTS,
]


# ---------------------------------------------------------------- sentencepiece model helpers

def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _proto_fields(buf: bytes):
    """Yield (field, wire_type, value, raw_bytes) for each field of a protobuf message."""
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value, buf[start:pos]


# ModelProto.pieces is field 1; SentencePiece.type is field 3 (default NORMAL)
def piece_types(model_proto: bytes) -> list[int]:
    """Token types of every piece, read straight from the serialized ModelProto."""
    types = []
    for field, wire, value, _ in _proto_fields(model_proto):
        if field == 1 and wire == 2:
            t = NORMAL
            for f, w, v, _ in _proto_fields(value):
                if f == 3 and w == 0:
                    t = v
            types.append(t)
    return types


def _rewrite(message: bytes, fn) -> bytes:
    """Re-serialize ``message``, replacing each field by ``fn(field, wire, value, raw)``."""
    return b"".join(fn(*f) for f in _proto_fields(message))


def _set_varint_field(message: bytes, field: int, value: int) -> bytes:
    body = _rewrite(message, lambda f, w, v, raw: b"" if f == field else raw)
    return body + _varint(field << 3) + _varint(value)


def _length_delimited(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def with_piece_type(model_proto: bytes, ids: set[int], new_type: int) -> bytes:
    """Copy of a serialized ModelProto with the pieces ``ids`` set to ``new_type``."""
    index = itertools.count()

    def fix_piece(field, wire, value, raw):
        if field == 1 and wire == 2 and next(index) in ids:  # ModelProto.pieces
            return _length_delimited(1, _set_varint_field(value, 3, new_type))  # SentencePiece.type
        return raw
    return _rewrite(model_proto, fix_piece)


def without_dummy_prefix(model_proto: bytes) -> bytes:
    """Copy of a serialized ModelProto with normalizer_spec.add_dummy_prefix = false."""
    def fix_spec(field, wire, value, raw):
        if field == 3 and wire == 2:  # ModelProto.normalizer_spec; add_dummy_prefix is its field 3
            return _length_delimited(3, _set_varint_field(value, 3, 0))
        return raw
    return _rewrite(model_proto, fix_spec)


def gguf_metadata(sp, **extra) -> dict:
    """GGUF-style tokenizer metadata for a loaded sentencepiece model."""
    types = piece_types(sp.serialized_model_proto())
    n = sp.get_piece_size()
    assert len(types) == n
    for i, t in enumerate(types):  # the proto types agree with sentencepiece's own predicates
        assert sp.is_unknown(i) == (t == UNKNOWN)
        assert sp.is_control(i) == (t == CONTROL)
        assert sp.is_byte(i) == (t == BYTE)
        assert sp.is_unused(i) == (t == UNUSED)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }
    meta.update(extra)
    return meta


def _train(tmp_dir, name: str, **args):
    corpus = tmp_dir / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(TRAIN_CORPUS * 3, encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_dir / name),
                                   **LLAMA_LIKE_TRAIN_ARGS, **args)
    return spm.SentencePieceProcessor(model_file=str(tmp_dir / f"{name}.model"))


class Pair:
    """A sentencepiece processor and the Tokenizer built from its metadata."""

    def __init__(self, sp, **meta_extra):
        self.sp = sp
        self.meta = gguf_metadata(sp, **meta_extra)
        self.tok = Tokenizer.from_gguf_metadata(self.meta)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Pair]:
    tmp = tmp_path_factory.mktemp("spm")
    plain = _train(tmp, "bytefb", vocab_size=600, byte_fallback=True)
    special = _train(tmp, "userdef", vocab_size=700, byte_fallback=True,
                     user_defined_symbols=USER_DEFINED_SYMBOLS, control_symbols=CONTROL_SYMBOLS)
    nofb = _train(tmp, "nofb", vocab_size=350, byte_fallback=False)
    # mark every 5th multi-character normal piece "unused": sentencepiece resegments those
    proto = plain.serialized_model_proto()
    types = piece_types(proto)
    unused = {i for i, t in enumerate(types)
              if t == NORMAL and len(plain.id_to_piece(i)) > 1 and i % 5 == 0}
    unused_sp = spm.SentencePieceProcessor(model_proto=with_piece_type(proto, unused, UNUSED))
    assert sum(unused_sp.is_unused(i) for i in range(unused_sp.get_piece_size())) == len(unused)
    return {"bytefb": Pair(plain), "userdef": Pair(special), "nofb": Pair(nofb), "unused": Pair(unused_sp)}


MODEL_NAMES = ["bytefb", "userdef", "nofb", "unused"]
BYTE_FALLBACK_MODELS = ["bytefb", "userdef", "unused"]


# ---------------------------------------------------------------- encode

@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("text", TRICKY_TEXTS, ids=range(len(TRICKY_TEXTS)))
def test_encode_matches_sentencepiece(models, name, text):
    p = models[name]
    expected = p.sp.encode(text)
    assert p.tok.encode(text, add_special=False) == expected
    assert p.tok.encode(text) == [BOS_ID] + expected
    if not any(special in text for special in SPECIAL_TEXTS):
        assert p.tok.encode(text, add_special=False, parse_special=True) == expected


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_encode_fuzz_matches_sentencepiece(models, name):
    p = models[name]
    rng = random.Random(1234)
    alphabet = list("abcdefghij klmnop  \t\n.,(){}0123456789éПриветмир日本語中文😀👍\u200d\u2581ßΩ한") + [
        "<ud>", "[TOOL]", " foo", " bar", "the ", "<s>", "🦀"]
    for _ in range(FUZZ_CASES_PER_MODEL):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, FUZZ_MAX_LEN)))
        assert p.tok.encode(text, add_special=False) == p.sp.encode(text), repr(text)


def test_user_defined_symbols_are_whole_pieces(models):
    p = models["userdef"]
    ud = {s: p.sp.piece_to_id(s) for s in USER_DEFINED_SYMBOLS}
    assert all(p.tok.token_type(i) == USER_DEFINED for i in ud.values())
    ids = p.tok.encode("x<ud>y[TOOL] foo bar", add_special=False)
    assert ud["<ud>"] in ids and ud["[TOOL]"] in ids and ud[FOO_BAR] in ids
    assert ids == p.sp.encode("x<ud>y[TOOL] foo bar")


def test_no_byte_fallback_gives_one_unk_per_unknown_run(models):
    p = models["nofb"]
    text = "ok 🦀ß ok"
    ids = p.tok.encode(text, add_special=False)
    assert ids == p.sp.encode(text)
    assert ids.count(UNK_ID) == 1  # a run of unknown characters is one unk, as in sentencepiece
    assert p.tok.decode(ids) == p.sp.decode(ids)
    assert UNK_SURFACE in p.tok.decode(ids)


def test_byte_fallback_uses_utf8_bytes(models):
    p = models["bytefb"]
    ids = p.tok.encode("🦀", add_special=False)
    crab = "🦀".encode()
    assert ids[-len(crab):] == [p.sp.piece_to_id(f"<0x{b:02X}>") for b in crab]
    assert all(p.tok.token_type(i) == BYTE for i in ids[-len(crab):])


def test_encode_long_text_is_fast_and_exact(models):
    rng = random.Random(7)
    parts = TRAIN_CORPUS.splitlines() + TRICKY_TEXTS
    chunks, size = [], 0
    while size < PERF_TEXT_BYTES:
        chunk = rng.choice(parts)
        chunks.append(chunk)
        size += len(chunk.encode()) + 1
    text = "\n".join(chunks)
    # "userdef" has a piece with an interior "▁", which forces the whole-text merge path
    for name in ("bytefb", "userdef"):
        p = models[name]
        start = time.perf_counter()
        ids = p.tok.encode(text, add_special=False)
        elapsed = time.perf_counter() - start
        assert elapsed < PERF_BUDGET_S, f"{name}: {elapsed:.2f}s for {size} bytes"
        assert ids == p.sp.encode(text)


# ---------------------------------------------------------------- decode

@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("text", TRICKY_TEXTS, ids=range(len(TRICKY_TEXTS)))
def test_decode_matches_sentencepiece(models, name, text):
    p = models[name]
    ids = p.sp.encode(text)
    assert p.tok.decode(ids) == p.sp.decode(ids)
    assert p.tok.decode([BOS_ID] + ids + [EOS_ID]) == p.sp.decode(ids)  # controls are invisible
    if name in BYTE_FALLBACK_MODELS:
        # identity normalisation: exact round trip, except that a literal "▁" in the
        # input comes back as a space (sentencepiece does the same)
        assert p.tok.decode(ids) == text.replace(SPACE_SYMBOL, " ")


def test_decode_specials_and_unk(models):
    p = models["userdef"]
    hello = p.tok.encode("hello", add_special=False)
    assert p.tok.decode([BOS_ID] + hello) == "hello"
    assert p.tok.decode([BOS_ID] + hello, skip_special=False) == "<s> hello"
    assert p.tok.decode([UNK_ID]) == p.sp.decode([UNK_ID]) == UNK_SURFACE
    assert p.tok.decode([UNK_ID], skip_special=False) == "<unk>"
    assert p.tok.decode(np.array([BOS_ID] + hello, dtype=np.int32)) == "hello"


def test_decode_invalid_utf8_uses_python_replace(models):
    p = models["bytefb"]
    byte_ids = [p.sp.piece_to_id(f"<0x{b:02X}>") for b in b"\xe4\xb8 ok \xff"]
    # Python's maximal-subpart replacement (sentencepiece emits one U+FFFD per byte instead)
    assert p.tok.decode(byte_ids) == b"\xe4\xb8 ok \xff".decode("utf-8", errors="replace")


def test_token_to_piece(models):
    p = models["bytefb"]
    the = p.sp.piece_to_id(SPACE_SYMBOL + "the")
    assert p.sp.id_to_piece(the) == SPACE_SYMBOL + "the"
    assert p.tok.token_to_piece(the) == b" the"
    assert p.tok.token_to_piece(p.sp.piece_to_id("<0x0A>")) == b"\n"
    assert p.tok.token_to_piece(p.sp.piece_to_id("<0xE4>")) == b"\xe4"
    assert p.tok.token_to_piece(BOS_ID) == b"" and p.tok.token_to_piece(EOS_ID) == b""
    assert p.tok.token_to_piece(UNK_ID) == UNK_SURFACE.encode()
    with pytest.raises(ValueError):
        p.tok.token_to_piece(p.tok.n_vocab)


# ---------------------------------------------------------------- streaming

def _stream(tok, ids, **kwargs) -> list[str]:
    dec = StreamDecoder(tok, **kwargs)
    return [dec.push(i) for i in ids] + [dec.flush()]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_stream_decoder_matches_decode(models, name):
    p = models[name]
    for text in TRICKY_TEXTS:
        ids = p.tok.encode(text)
        pieces = _stream(p.tok, ids)
        assert "".join(pieces) == p.tok.decode(ids), repr(text)
        if name in BYTE_FALLBACK_MODELS:
            assert "\ufffd" not in "".join(pieces)  # never emits half a character


def test_stream_decoder_holds_partial_characters(models):
    p = models["bytefb"]
    ids = p.tok.encode("🦀 ok", add_special=False)
    crab_bytes = len("🦀".encode())
    pieces = _stream(p.tok, ids)
    first_crab = next(k for k, i in enumerate(ids) if p.tok.token_type(i) == BYTE)
    assert pieces[first_crab:first_crab + crab_bytes - 1] == [""] * (crab_bytes - 1)
    assert pieces[first_crab + crab_bytes - 1] == "🦀"
    assert "".join(pieces) == "🦀 ok"


def test_stream_decoder_leading_space_and_invalid_bytes(models):
    p = models["bytefb"]
    ids = p.tok.encode("hello world", add_special=False)
    assert "".join(_stream(p.tok, ids)) == "hello world"
    assert "".join(_stream(p.tok, ids, strip_leading_space=False)) == " hello world"
    rng = random.Random(99)
    byte_ids = [p.sp.piece_to_id(f"<0x{b:02X}>") for b in range(256)]
    for _ in range(200):  # random (often invalid) byte sequences mixed with normal pieces
        seq = [rng.choice(byte_ids + ids) for _ in range(rng.randint(0, 12))]
        assert "".join(_stream(p.tok, seq)) == p.tok.decode(seq)


# ---------------------------------------------------------------- specials

def test_parse_special(models):
    p = models["userdef"]
    sp, tok = p.sp, p.tok
    eot = sp.piece_to_id("<|eot_id|>")
    text = "<s>hi</s>"
    assert tok.encode(text) == [BOS_ID] + sp.encode(text)  # plain text: no control ids
    assert BOS_ID not in tok.encode(text, add_special=False)
    # with parse_special every text fragment gets its own dummy prefix (llama.cpp behaviour)
    assert tok.encode(text, parse_special=True) == [BOS_ID, BOS_ID] + sp.encode("hi") + [EOS_ID]
    assert tok.encode("a<|eot_id|>b c", parse_special=True, add_special=False) == (
        sp.encode("a") + [eot] + sp.encode("b c"))
    assert tok.encode("<sep><sep>", parse_special=True, add_special=False) == [sp.piece_to_id("<sep>")] * 2
    assert tok.encode("<unk>", parse_special=True, add_special=False) == [UNK_ID]
    assert tok.encode("x<ud>y", parse_special=True, add_special=False) == sp.encode("x<ud>y")


def test_is_eog(models):
    p = models["userdef"]
    eot = p.sp.piece_to_id("<|eot_id|>")
    assert p.tok.is_eog(EOS_ID) and p.tok.is_eog(eot)
    for not_eog in (BOS_ID, UNK_ID, p.sp.piece_to_id("<sep>")):
        assert not p.tok.is_eog(not_eog)
    assert not models["bytefb"].tok.is_eog(BOS_ID)


@pytest.mark.parametrize("kind", [CONTROL, USER_DEFINED])
def test_end_of_turn_texts_are_eog_whatever_their_type(kind):
    """Phi-3's SentencePiece vocabulary ends a turn with <|end|> (not its EOS): llama.cpp's list of end-of-generation
    texts holds for every vocabulary type and token type."""
    from powerinfer.tokenizer.spm import SPMTokenizer
    tokens = ["<unk>", "<s>", "</s>", "\u2581a", "<|end|>", "<|user|>"]
    types = [UNKNOWN, CONTROL, CONTROL, NORMAL, kind, kind]
    tok = SPMTokenizer(tokens, types=types, bos_id=1, eos_id=2, unk_id=0)
    assert tok.is_eog(2) and tok.is_eog(4) and not tok.is_eog(5) and not tok.is_eog(3)


# ---------------------------------------------------------------- metadata handling

def test_attributes_and_add_eos(models):
    p = models["bytefb"]
    tok = p.tok
    assert (tok.n_vocab, tok.bos_id, tok.eos_id, tok.unk_id) == (p.sp.get_piece_size(), BOS_ID, EOS_ID, UNK_ID)
    assert tok.add_bos and not tok.add_eos
    assert tok.encode("") == [BOS_ID]
    tok2 = Tokenizer.from_gguf_metadata({**p.meta, "tokenizer.ggml.add_eos_token": True,
                                         "tokenizer.ggml.add_bos_token": False})
    assert tok2.encode("hi") == p.sp.encode("hi") + [EOS_ID]
    assert tok2.encode("hi", add_special=False) == p.sp.encode("hi")


def test_no_space_prefix_matches_sentencepiece_without_dummy_prefix(models):
    p = models["bytefb"]
    sp = spm.SentencePieceProcessor(model_proto=without_dummy_prefix(p.sp.serialized_model_proto()))
    assert sp.encode("hello") != p.sp.encode("hello")  # the proto edit took effect
    tok = Tokenizer.from_gguf_metadata({**p.meta, "tokenizer.ggml.add_space_prefix": False})
    for text in TRICKY_TEXTS:
        ids = tok.encode(text, add_special=False)
        assert ids == sp.encode(text), repr(text)
        assert tok.decode(ids) == sp.decode(ids) == text.replace(SPACE_SYMBOL, " ")


def test_numpy_metadata_and_missing_optional_lists(models):
    p = models["bytefb"]
    meta = {**p.meta,
            "tokenizer.ggml.scores": np.asarray(p.meta["tokenizer.ggml.scores"], dtype=np.float32),
            "tokenizer.ggml.token_type": np.asarray(p.meta["tokenizer.ggml.token_type"], dtype=np.int32)}
    text = "numpy metadata 🦀 works"
    assert Tokenizer.from_gguf_metadata(meta).encode(text) == p.tok.encode(text)
    optional_lists = ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    bare = {k: v for k, v in p.meta.items() if k not in optional_lists}
    tok = Tokenizer.from_gguf_metadata(bare)  # types guessed: <0xXX> are bytes, bos/eos control
    assert tok.token_type(p.sp.piece_to_id("<0x41>")) == BYTE and tok.token_type(BOS_ID) == CONTROL
    assert tok.decode(tok.encode("🦀 crab")) == "🦀 crab"


def _meta_error(meta: dict) -> str:
    with pytest.raises(ValueError) as err:
        Tokenizer.from_gguf_metadata(meta)
    return str(err.value)


def test_metadata_errors(models):
    meta = models["bytefb"].meta
    n = len(meta["tokenizer.ggml.tokens"])
    no_model = {k: v for k, v in meta.items() if k != "tokenizer.ggml.model"}
    assert "tokenizer.ggml.model" in _meta_error(no_model)
    msg = _meta_error({**meta, "tokenizer.ggml.model": "gpt2"})   # byte-level BPE needs merges
    assert "gpt2" in msg and "merges" in msg
    msg = _meta_error({**meta, "tokenizer.ggml.model": "t5"})     # UGM: refused by name (bert's WPM: test_encoders)
    assert "t5" in msg and "UGM" in msg
    assert "empty" in _meta_error({**meta, "tokenizer.ggml.tokens": [], "tokenizer.ggml.scores": [],
                                   "tokenizer.ggml.token_type": []})
    assert "scores" in _meta_error({**meta, "tokenizer.ggml.scores": meta["tokenizer.ggml.scores"][:-1]})
    short_types = meta["tokenizer.ggml.token_type"][:-1]
    assert "token_type" in _meta_error({**meta, "tokenizer.ggml.token_type": short_types})
    assert "bos" in _meta_error({**meta, "tokenizer.ggml.bos_token_id": n})
    assert "eos" in _meta_error({**meta, "tokenizer.ggml.eos_token_id": -1})
    assert "unknown" in _meta_error({**meta, "tokenizer.ggml.unknown_token_id": n + 5})
    assert "type" in _meta_error({**meta, "tokenizer.ggml.token_type": [9] * n})
    no_bos = {k: v for k, v in meta.items() if k != "tokenizer.ggml.bos_token_id"}
    no_bos["tokenizer.ggml.tokens"] = ["<S>" if t == "<s>" else t for t in meta["tokenizer.ggml.tokens"]]
    assert "BOS" in _meta_error(no_bos)  # add_bos_token is True but there is no BOS id
    assert not Tokenizer.from_gguf_metadata({**no_bos, "tokenizer.ggml.add_bos_token": False}).add_bos


def test_encode_decode_argument_errors(models):
    tok = models["bytefb"].tok
    with pytest.raises(TypeError):
        tok.encode(b"bytes")
    with pytest.raises(ValueError):
        tok.decode([tok.n_vocab])
    with pytest.raises(ValueError):
        tok.decode([-1])
