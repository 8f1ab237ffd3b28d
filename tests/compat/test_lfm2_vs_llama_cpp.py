"""The tiny random lfm2 files of tests/model_files.py (LFM2: three short conv layers of kernel 3 and two attention
layers of 4 heads of 16 with 2 KV heads, q/k norms; SwiGLU FFN 96; the output tied to token_embd) run by llama.cpp
(llama-cpp-python, f32 KV cache) and by us.

Measured: f32 4.8e-7 (seed 0), 4.3e-7 (seed 3), 2.7e-7 (an untied output) from llama.cpp, the same argmax at every
position and the same 12 greedy tokens; Q8_0 6.5e-8, Q4_0 0 (its bits: both round the same 8-bit activations), the
same greedy tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
import helpers  # noqa: E402
from helpers import QUANT_REL_RMS  # noqa: E402
from model_files import write_lfm2_model  # noqa: E402

LLAMA_CPP_REL_RMS = 1e-5   # f32 (measured 2.7e-7 .. 4.8e-7)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


def agrees_with_llama_cpp(path, bound: float, same_argmax: bool = False) -> float:
    """Our logits of PROMPT within bound of llama.cpp's, the same 12 greedy tokens (helpers.agrees_with_llama_cpp)."""
    return helpers.agrees_with_llama_cpp(path, PROMPT, bound, same_argmax=same_argmax)


@pytest.mark.parametrize("seed", [0, 3])
def test_f32(tmp_path, seed):
    f = tmp_path / f"lfm2-{seed}.gguf"
    write_lfm2_model(f, seed=seed)
    agrees_with_llama_cpp(f, LLAMA_CPP_REL_RMS, same_argmax=True)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized(tmp_path, dtype):
    f = tmp_path / f"lfm2-{dtype}.gguf"
    write_lfm2_model(f, dtype=dtype)
    agrees_with_llama_cpp(f, QUANT_REL_RMS)


def test_separate_output(tmp_path):
    """An untied output.weight (the loader's other branch) read the same way by both."""
    from model_files import lfm2_weights
    w = lfm2_weights(1)
    w["output.weight"] = (np.random.default_rng(5).standard_normal((320, 64)) / 8).astype(np.float32)
    f = tmp_path / "lfm2-output.gguf"
    write_lfm2_model(f, weights=w)
    agrees_with_llama_cpp(f, LLAMA_CPP_REL_RMS)


def test_lfm2_pre_tokenizer_ids(tmp_path):
    """tokenizer.ggml.pre "lfm2" (llama.cpp: LLAMA3's expressions, whole-word vocabulary entries, BOS by default): the
    ids of a vocabulary trained as llama-bpe, with and without special-token parsing and BOS, are llama.cpp's."""
    pytest.importorskip("tokenizers")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_bpe_vs_llama_cpp import CHECK, EXTRA, gguf_vocab, train_hf, write_vocab_gguf

    from powerinfer.gguf_file import open_gguf
    from powerinfer.tokenizer import Tokenizer
    tokens, types, merges = gguf_vocab(train_hf("llama-bpe"))
    path = tmp_path / "vocab-lfm2.gguf"
    write_vocab_gguf(path, tokens, types, merges, "lfm2", add_bos=True)
    ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
    for text in CHECK + EXTRA:
        for parse_special in (False, True):
            theirs = ll.tokenize(text.encode(), add_bos=True, special=parse_special)
            assert ours.encode(text, add_special=True, parse_special=parse_special) == theirs, (parse_special, text)


@pytest.mark.parametrize("dtype,gating", [("f32", 2), ("f32", 1), ("q8_0", 2), ("q4_0", 2)])
def test_lfm2moe(tmp_path, dtype, gating):
    """lfm2moe (model_files.LFM2MOE: layer 0 dense, then 4 experts of 32, 2 per token, a selection bias): sigmoid
    (expert_gating_func 2) and softmax (1) routing, renormalized, as llama.cpp's. Measured: f32 4.6e-7, Q8_0 6.9e-8."""
    from model_files import write_lfm2moe_model
    f = tmp_path / f"lfm2moe-{dtype}-{gating}.gguf"
    write_lfm2moe_model(f, dtype=dtype, meta={"expert_gating_func": gating})
    hp = pi.Model(f).hparams
    assert hp.n_expert == 4 and hp.expert_sigmoid == (gating == 2) and hp.n_ff_exp == 32
    agrees_with_llama_cpp(f, LLAMA_CPP_REL_RMS if dtype == "f32" else QUANT_REL_RMS)
