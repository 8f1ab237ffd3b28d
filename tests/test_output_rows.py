"""The last layer's FFN over the output rows only (context.c prune_last_ffn, as llama.cpp does): a dense model's
logits and embeddings for the rows that ask for them are bit-identical to those of a decode that computes every row
through the last layer, for every weight type's kernels (the FFN of one row runs the decode kernels, of all rows the
prompt kernels: the numeric contract makes them agree), and a decode that asks for no outputs leaves the cache as a
full one does."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import powerinfer as pi  # noqa: E402
from model_files import write_arch_model  # noqa: E402
from test_ops import assert_bit_equal  # noqa: E402

PROMPT = [(7 * i + 3) % 300 + 1 for i in range(40)]   # 40 tokens: prompt kernels (24-token f16 calls, 16+ tiles)
PICKED = [0, 5, 17, 39]                                # a mask of output rows, the last among them


@pytest.fixture(scope="module", params=["f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "gemma2", "gemma3", "qwen2",
                                        "qwen3"])
def model(request, tmp_path_factory):
    from make_test_model import write_model
    path = tmp_path_factory.mktemp("rows") / f"{request.param}.gguf"
    if request.param in ("gemma2", "gemma3", "qwen2", "qwen3"):   # soft caps, post norms, biases, q/k norms
        write_arch_model(path, request.param, seed=3, dtype="q4_0")
    else:
        write_model(path, dtype=request.param, n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2,
                    seed=7)
    return pi.Model(path)


def all_rows(model, outputs=None):
    ctx = pi.Context(model, n_ctx=128)
    if outputs:
        ctx.set_outputs(**outputs)
    ctx.decode(PROMPT, logits="all")
    return ctx


def test_last_row_equals_all_rows(model):
    full = all_rows(model)
    ctx = pi.Context(model, n_ctx=128)
    ctx.decode(PROMPT, logits="last")
    assert_bit_equal(ctx.logits(-1), full.logits(len(PROMPT) - 1), "last row vs every row")
    with pytest.raises(pi.PowerInferError):
        ctx.logits(0)                                  # only the last row has logits


def test_picked_rows_equal_all_rows(model):
    full = all_rows(model)
    mask = np.zeros(len(PROMPT), dtype=bool)
    mask[PICKED] = True
    ctx = pi.Context(model, n_ctx=128)
    ctx.decode(PROMPT, logits=mask)
    for t in PICKED:
        assert_bit_equal(ctx.logits(t), full.logits(t), f"row {t}")


@pytest.mark.parametrize("logits", [True, False], ids=["with-logits", "alone"])
def test_embeddings_of_the_last_row(model, logits):
    full = all_rows(model, dict(logits=logits, embeddings=True))
    ctx = pi.Context(model, n_ctx=128)
    ctx.set_outputs(logits=logits, embeddings=True)
    ctx.decode(PROMPT, logits="last")
    assert_bit_equal(ctx.embeddings(-1), full.embeddings(len(PROMPT) - 1), "embeddings")
    if logits:
        assert_bit_equal(ctx.logits(-1), full.logits(len(PROMPT) - 1), "logits beside embeddings")


def test_no_outputs_then_decode(model):
    """A prompt decoded without outputs (its last FFN skipped) leaves the same cache: the next tokens' logits agree."""
    full = all_rows(model)
    ctx = pi.Context(model, n_ctx=128)
    ctx.decode(PROMPT, logits="none")
    for tok in (5, 9):
        full.decode([tok])
        ctx.decode([tok])
        assert_bit_equal(ctx.logits(), full.logits(), f"token {tok} after a prompt without outputs")


def test_one_token_outputs_read_on_demand(model):
    """The one-token decode copies its logits out of the C context when logits() asks (context.py _read_pending):
    an array logits() returned keeps its values through later decodes, a later logits() has the later token's, and a
    decode that fails leaves none (not the previous token's)."""
    full = all_rows(model)
    ctx = pi.Context(model, n_ctx=128)
    ctx.decode(PROMPT[:-2], logits="none")
    ctx.decode([PROMPT[-2]])
    first = ctx.logits()
    kept = first.copy()
    ctx.decode([PROMPT[-1]])                            # not read before the next decode
    assert_bit_equal(first, kept, "an array logits() returned, after the next decode")
    assert_bit_equal(first, full.logits(len(PROMPT) - 2), "token -2")
    assert_bit_equal(ctx.logits(), full.logits(len(PROMPT) - 1), "token -1, read after the decode")
    assert ctx.logits() is ctx.logits()                 # read once
    with pytest.raises(pi.PowerInferError):
        ctx.decode([model.n_vocab + 5])                 # an out-of-vocabulary token fails in the library
    with pytest.raises(pi.PowerInferError, match="asked for none"):
        ctx.logits()
    emb = pi.Context(model, n_ctx=128)
    emb.set_outputs(logits=False, embeddings=True)
    emb.decode(PROMPT[:-1], logits="none")
    emb.decode([PROMPT[-1]])
    reference = all_rows(model, dict(logits=False, embeddings=True))
    assert_bit_equal(emb.embeddings(), reference.embeddings(len(PROMPT) - 1), "one token's embeddings")
