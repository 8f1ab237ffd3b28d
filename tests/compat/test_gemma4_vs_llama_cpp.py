"""The tiny random gemma4 files of tests/model_files.py (CONFIGS["gemma4"]: local and global layers of their own
shapes, shared KV layers, global layers without attn_v, proportional rope factors, layer output scales, a final cap;
with experts: GEMMA4_MOE, the tests at the end) run by llama.cpp (llama-cpp-python, f32 KV cache) and by us.

f32 weights: the logits within LLAMA_CPP_REL_RMS (measured 4.0e-4 .. 5.3e-4 at seeds 3, 5, 7: llama.cpp's GELU goes
through a table of f16 values, as for gemma3's 4.5e-4 in test_arch_vs_llama_cpp.py; the float64 reference through that
table, ReferenceModel(gelu_f16=True), is 2.4e-5 .. 1.2e-4 from llama.cpp, and ours 4.4e-7 from the plain reference),
the same argmax at every position and the same 12 greedy tokens. Each piece's absence moves the reference 1.4e-2 ..
0.8 from ours (tests/test_gemma4.py), far beyond these differences: llama.cpp confirms each one as we run it.

Q8_0 / Q4_0 matrices: each engine rounds its own 8-bit activations of values that differ by the GELU table already, so
the logits differ about as much as each differs from the reference of the dequantized weights (measured 1.9e-2 ..
2.3e-2 from llama.cpp, 2.4e-2 .. 2.7e-2 from the reference, seeds 3, 4, 6, 8), and near-ties split the tiny model's
greedy paths: all 12 tokens agree at seeds 3 and 6 (Q8_0), 4 and 8 (Q4_0); the other four runs split after 1 .. 7.

Per-layer embeddings (E2B / E4B; model_files.gemma4_ple_weights, n_pl 32): f32 5.1e-4 .. 8.2e-4 from llama.cpp at
seeds 3, 5, 7 (the reference through the f16 GELU table 6.5e-5 .. 1.5e-4), the same argmax and 12 greedy tokens; a
Q8_0 / Q4_K / Q5_K / Q6_K per-layer token table (n_pl 256, the rest f32: get_rows of the file's rows, no activation
rounding) 5.4e-4 from llama.cpp with its 12 greedy tokens (one near-tie position's argmax differs with the Q8_0
table); every matrix Q8_0 / Q4_0 at seed 3: 2.2e-2 / 2.1e-2 from llama.cpp, 12 greedy tokens (seeds 4 and 6 split
after 2 .. 9 tokens, at 2.3e-2 .. 2.7e-2).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import powerinfer as pi  # noqa: E402
from helpers import QUANT_REL_RMS, greedy_both, llama_cpp_eval, logits_all, rel_rms  # noqa: E402
from model_files import write_arch_model, write_gemma4_moe_model, write_gemma4_ple_model  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

LLAMA_CPP_REL_RMS = 3e-3   # f32 (measured 4.0e-4 .. 5.3e-4)
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]


def ctx_of(model):
    return pi.Context(model, n_ctx=64, kv_type="f32", n_threads=1)


def agrees_with_llama_cpp(path, label: str, quantized: bool = False, greedy: bool = True) -> None:
    """The file run by both engines: f32 weights within LLAMA_CPP_REL_RMS of llama.cpp's logits, the float64 reference
    through llama.cpp's f16 GELU table within 3e-4 of them and the same argmax at every position; quantized ones within
    QUANT_REL_RMS of llama.cpp's and of the reference of the dequantized weights; then (greedy) llama.cpp's 12 greedy
    tokens."""
    ll, theirs = llama_cpp_eval(path, PROMPT)
    model = pi.Model(path)
    ours = logits_all(ctx_of(model), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"gemma4 {label}: relative RMS difference from llama.cpp {err:.2e}")
    if quantized:
        assert err < QUANT_REL_RMS, err
        assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < QUANT_REL_RMS
    else:
        assert err < LLAMA_CPP_REL_RMS, err
        assert rel_rms(ReferenceModel(path, gelu_f16=True).forward(PROMPT), theirs) < 3e-4
        assert np.array_equal(ours.argmax(axis=1), theirs.argmax(axis=1))
    if greedy:
        a, b = greedy_both(ll, model, PROMPT, 12)
        assert a == b, (a, b)


@pytest.mark.parametrize("seed", [3, 5, 7])
def test_f32_logits_agree_with_llama_cpp(tmp_path, seed):
    path = tmp_path / f"tiny-gemma4-{seed}.gguf"
    write_arch_model(path, "gemma4", seed=seed)
    agrees_with_llama_cpp(path, f"f32 seed {seed}")


@pytest.mark.parametrize("dtype, seed", [("q8_0", 3), ("q8_0", 6), ("q4_0", 4), ("q4_0", 8)])
def test_quantized_agrees_with_llama_cpp(tmp_path, dtype, seed):
    """Q8_0 / Q4_0 matrices (n_ff 96 .. 192 and head sizes 32 / 64: rows of whole blocks): the logits within
    QUANT_REL_RMS of llama.cpp's and of the reference of the dequantized weights, and llama.cpp's 12 greedy tokens."""
    path = tmp_path / f"tiny-gemma4-{dtype}.gguf"
    write_arch_model(path, "gemma4", seed=seed, dtype=dtype)
    agrees_with_llama_cpp(path, f"{dtype} seed {seed}", quantized=True)


@pytest.mark.parametrize("seed", [3, 5, 7])
def test_ple_f32_logits_agree_with_llama_cpp(tmp_path, seed):
    """Per-layer embeddings (n_pl 32) with f32 weights: llama.cpp's logits, argmax and 12 greedy tokens."""
    path = tmp_path / f"tiny-gemma4-ple-{seed}.gguf"
    write_gemma4_ple_model(path, seed=seed)
    agrees_with_llama_cpp(path, f"per-layer embeddings f32 seed {seed}")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_ple_quantized_token_table_agrees_with_llama_cpp(tmp_path, qtype):
    """A quantized per-layer token table (the rest f32): llama.cpp's logits within the f32 bound (the rows are read as
    they are, no activation is rounded) and its 12 greedy tokens."""
    from test_gemma4 import quantized_table_files
    path, _ = quantized_table_files(tmp_path, qtype)
    ll, theirs = llama_cpp_eval(path, PROMPT)
    model = pi.Model(path)
    err = rel_rms(logits_all(ctx_of(model), PROMPT), theirs)
    print(f"gemma4 per-layer table {qtype}: relative RMS difference from llama.cpp {err:.2e}")
    assert err < LLAMA_CPP_REL_RMS, err
    a, b = greedy_both(ll, model, PROMPT, 12)
    assert a == b, (a, b)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_ple_quantized_matrices_agree_with_llama_cpp(tmp_path, dtype):
    """Per-layer embeddings with every matrix quantized (seed 3): within QUANT_REL_RMS of llama.cpp and of the
    reference of the dequantized weights, and llama.cpp's 12 greedy tokens."""
    path = tmp_path / f"tiny-gemma4-ple-{dtype}.gguf"
    write_gemma4_ple_model(path, seed=3, dtype=dtype)
    agrees_with_llama_cpp(path, f"per-layer embeddings {dtype}", quantized=True)


@pytest.mark.parametrize("extra", [None, "ple", "experts", "fused experts"])
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_quantizer_writes_llama_quantizes_file(tmp_path, ftype, extra):
    """powerinfer.quantize on the tiny gemma4 (no attn_v in the global and shared layers, no attn_k in the shared
    ones, per-layer shapes, mostly fallback types at n_embd 128; ple: with per-layer embeddings, n_pl 256; experts:
    the router and the scales left f32, the experts as llama-quantize types them, gate/up separate or fused):
    llama-quantize's file byte for byte, and it runs."""
    import ctypes

    from powerinfer.quant_rules import FTYPE, QuantOptions
    from powerinfer.quantize import quantize_file
    src, ours, theirs = tmp_path / "f32.gguf", tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    if extra == "ple":
        write_gemma4_ple_model(src, seed=3, n_pl=256)
    elif extra:
        write_gemma4_moe_model(src, seed=3, fused=extra == "fused experts")
    else:
        write_arch_model(src, "gemma4", seed=3)
    quantize_file(src, ours, QuantOptions(ftype=FTYPE[ftype]))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = FTYPE[ftype], 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(theirs).encode(), ctypes.byref(p)) == 0
    assert ours.read_bytes() == theirs.read_bytes()
    assert np.isfinite(logits_all(ctx_of(pi.Model(ours)), PROMPT)).all()


# ---- experts (the 26B-A4B's layout, model_files.GEMMA4_MOE: layers 0, 2, 3, 5, 6 with 4 experts of 64, 2 per token,
# beside their dense FFN; 1 and 4 dense). f32: measured 4.3e-4 .. 7.4e-4 from llama.cpp at seeds 3 .. 8 (the GELU
# table again; the reference through it 2.4e-5 .. 1.8e-4 from llama.cpp). Quantized: the router stays f32 as
# llama-quantize keeps ffn_gate_inp; a token whose second and third router logits nearly tie can take other experts in
# the two engines (their activations rounded differently), which moves its logits by 0.1 .. 0.2: Q8_0 / Q4_0 experts
# alone (the rest f32) are 6.3e-3 .. 1.5e-2 from llama.cpp over seeds 3 .. 8 (5.7e-2 at Q4_0 seed 4: one token's
# route), the 12 greedy tokens the same but at Q4_0 seeds 3 and 8; every matrix Q8_0 / Q4_0 2.1e-2 .. 5.0e-2 over seeds
# 3 .. 8, where the greedy tokens agree at the seeds below and split at others.
@pytest.mark.parametrize("seed, fused", [(3, False), (5, True), (7, False)])
def test_moe_f32_logits_agree_with_llama_cpp(tmp_path, seed, fused):
    path = tmp_path / f"tiny-gemma4-moe-{seed}.gguf"
    write_gemma4_moe_model(path, seed=seed, fused=fused)
    agrees_with_llama_cpp(path, f"experts f32 seed {seed} fused={fused}")


@pytest.mark.parametrize("dtype, seed, fused", [("q8_0", 3, False), ("q8_0", 4, True), ("q4_0", 6, True),
                                                ("q4_0", 7, False)])
def test_moe_quantized_experts_agree_with_llama_cpp(tmp_path, dtype, seed, fused):
    """Q8_0 / Q4_0 experts (the rest f32): within QUANT_REL_RMS of llama.cpp and of the reference of the dequantized
    weights, and llama.cpp's 12 greedy tokens."""
    path = tmp_path / f"tiny-gemma4-moe-{dtype}.gguf"
    write_gemma4_moe_model(path, seed=seed, fused=fused, dtypes={"_exps": dtype})
    agrees_with_llama_cpp(path, f"{dtype} experts seed {seed}", quantized=True)


@pytest.mark.parametrize("dtype, seed", [("q8_0", 6), ("q8_0", 8), ("q4_0", 3), ("q4_0", 6)])
def test_moe_quantized_greedy_tokens(tmp_path, dtype, seed):
    """Every matrix Q8_0 / Q4_0 but the router (f32, as llama-quantize leaves it), fused gate/up at the even seeds:
    llama.cpp's 12 greedy tokens."""
    path = tmp_path / f"tiny-gemma4-moe-all-{dtype}.gguf"
    write_gemma4_moe_model(path, seed=seed, fused=seed % 2 == 0, dtype=dtype, dtypes={"ffn_gate_inp": "f32"})
    ll, _ = llama_cpp_eval(path, PROMPT)
    a, b = greedy_both(ll, pi.Model(path), PROMPT, 12)
    assert a == b, (a, b)
