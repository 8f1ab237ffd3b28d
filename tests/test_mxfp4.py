"""MXFP4 (ggml type 39, the OCP microscaling FP4 format: gpt-oss's expert weights).

A block is 17 bytes: one E8M0 byte e (the scale 2^(e - 127), a power of two), then Q4_0's 16 nibble bytes (element
j < 16 the low nibble of byte j, j + 16 its high nibble); a nibble is an E2M1 number, which ggml keeps doubled as the
int8 kvalues_mxfp4 (0, 1, 2, 3, 4, 6, 8, 12 and their negatives) and so halves the scale: value = 2^(e - 128)
kvalues[q] (ggml_e8m0_to_fp32_half; e = 0 and 1 are the subnormals 2^-128 and 2^-127). The core computes it with
IQ4_NL's kernels (the nibble-grid kinds of core/src/quants_k.h), activations quantized to Q8_0 as llama.cpp does.

Here: the traits; dequantization over every scale byte and nibble against gguf-py (bit for bit) and the reference's
own E2M1 decoding; the quantizer against gguf-py (the same bytes); a tiny llama with MXFP4 FFN matrices (and one with
every matrix MXFP4: the embedding's get_rows and the output head too) against the float64 reference and llama.cpp at
every ISA level; MXFP4 experts through core/src/moe.c against both. The kernels themselves, against numpy and across
levels: tests/test_iq_types.py, tests/test_isa.py (MXFP4 is in their lists of types), tests/test_cross_arch.py (the
aarch64 levels).
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from helpers import QUANT_REL_RMS, llama_cpp_logits, logits_all, logits_in_calls, rel_rms
from model_files import write_arch_model
from reference_model import ReferenceModel, dequant_mxfp4
from test_kquants import MXFP4, bits_equal, c_dequantize, c_quantize, np_dequant
from test_moe import PROMPT, write_moe

import powerinfer as pi
from powerinfer._ffi import ffi, lib

QT = gguf.GGMLQuantizationType.MXFP4

# logits against llama.cpp (llama-cpp-python 0.3.36, one thread, f32 KV cache), relative RMS over the 16 positions:
# - the tiny llama with MXFP4 FFN matrices, the rest f32: measured 1.93e-7 .. 1.99e-7 (seeds 0, 1, 2), the f32
#   matmuls' summation orders (a file whose only MXFP4 matrix is output.weight agrees to 0.0: the MXFP4 products and
#   the Q8_0 activations are llama.cpp's bits);
LLAMA_CPP_FFN_REL_RMS = 1e-6
# - every matrix MXFP4 (token_embd through get_rows, attention, FFN, output): 0.0 (seeds 0, 2), 5.7e-3 (seed 1: only
#   from position 8 on, in layer 1 first, with or without llama.cpp's MXFP4 repacking; taken to be a last-bit
#   difference in an f32 step (llama.cpp's final norm output differs from ours by 1 ulp there) that flips a Q8_0
#   activation quant the quantized layers carry on; not traced further; the same greedy tokens). A quantized model's
#   bound, as Q8_0 / Q4_0 files have against llama.cpp;
LLAMA_CPP_ALL_REL_RMS = 2e-2
# - MXFP4 experts (the rest f32): 2.0e-7 (Mixtral's layout), 2.1e-7 (qwen3moe) at seed 3; qwen3moe at seed 4: 4.4e-4
#   (a flipped activation quant again); the rest Q8_0: 7.6e-8, 7.7e-8. The bound of tests/test_moe.py's Q8_0 experts.
LLAMA_CPP_MOE_REL_RMS = 1e-3
# Against the float64 reference (float weights, float activations): QUANT_REL_RMS (3e-2), the bound of the other
# quantized models; measured 8.1e-3 .. 9.0e-3 (MXFP4 FFN), 1.2e-2 .. 1.4e-2 (all MXFP4), 6.7e-3 .. 7.4e-3 (experts).


def levels():
    return [lv for lv in pi.CPU_ISA_LEVELS if pi.cpu_isa_supported(lv)]


@pytest.fixture
def restore_level():
    start = pi.cpu_isa()
    yield
    pi.set_cpu_isa(start)


def every_block() -> np.ndarray:
    """256 x 16 blocks: every scale byte e with every pair of nibbles (block k of e: nibble bytes 16 k .. 16 k + 15,
    so the 16 blocks of e hold each byte value once)."""
    b = np.zeros((256, 16, 17), np.uint8)
    b[:, :, 0] = np.arange(256)[:, None]
    b[:, :, 1:] = np.arange(256).reshape(16, 16)[None]
    return b.reshape(-1, 17)


def test_traits():
    assert lib.PI_TYPE_MXFP4 == MXFP4 == int(QT)
    assert lib.pi_type_supported(MXFP4) == 1 and ffi.string(lib.pi_type_name(MXFP4)) == b"mxfp4"
    assert (lib.pi_type_block_size(MXFP4), lib.pi_type_block_bytes(MXFP4)) == gguf.GGML_QUANT_SIZES[QT] == (32, 17)
    assert lib.pi_row_bytes(MXFP4, 2880) == 90 * 17 and lib.pi_row_bytes(MXFP4, 48) == -1   # gpt-oss's rows: 2880


def test_dequantize_every_scale_and_nibble():
    """Every e (0..255: the subnormal scales 2^-128, 2^-127, 2^127 at e = 255 whose 12 x overflows to inf, as in
    ggml) with every nibble: gguf-py's dequantizer and test_kquants' numpy code bit for bit, and the reference's
    float64 E2M1 decoding (written from the format, not from the doubled table) where the f32 value is finite."""
    raw = every_block()
    got = c_dequantize(MXFP4, raw)
    with np.errstate(over="ignore"):
        theirs = gguf.quants.dequantize(raw.reshape(1, -1), QT).astype(np.float32).ravel()
    assert bits_equal(got, theirs), np.sum(got.view(np.uint32) != theirs.view(np.uint32))
    with np.errstate(over="ignore"):
        assert bits_equal(got, np_dequant(raw, MXFP4))
    ref = dequant_mxfp4(raw)
    finite = np.isfinite(got)
    assert np.array_equal(got[finite].astype(np.float64), ref[finite])
    assert finite.reshape(256, -1)[:253].all() and not finite.reshape(256, -1)[253:].all()   # 12 x 2^125: inf
    per_e = got.reshape(256, 16, 32)
    assert per_e[0, 0, 1] == 2.0 ** -128 and per_e[1, 0, 1] == 2.0 ** -127 and per_e[2, 0, 1] == 2.0 ** -126
    assert per_e[127, 0, 7] == 6.0 and per_e[127, 0, 16 + 1] == 0.0 and per_e[127, 0, 15] == -6.0   # q 7, 8, 15


def test_quantizer_matches_gguf_py():
    """pi_quantize_row(MXFP4) is llama.cpp's quantize_row_mxfp4_ref: the bytes of gguf-py's numpy port, on rows of
    scales from 2^-100 to 2^100, exact powers of two, values on the grid, all-zero blocks and ties between two grid
    values; an all-zero block is e = 0 with zero nibbles."""
    rng = np.random.default_rng(39)
    n = 32 * 4000
    x = (rng.standard_normal(n) * np.repeat(2.0 ** rng.uniform(-100, 100, n // 32), 32)).astype(np.float32)
    x[:32] = 0.0
    x[32:64] = np.exp2(rng.integers(-20, 20, 32)).astype(np.float32)                   # powers of two
    x[64:96] = rng.choice([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -6], 32).astype(np.float32)   # on the grid
    x[96:128] = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0], 32).astype(np.float32)  # ties
    x[96] = 6.0
    ours = c_quantize(MXFP4, x)
    theirs = gguf.quants.quantize(x.reshape(1, -1), QT).ravel()
    assert np.array_equal(ours, theirs), np.sum(ours != theirs)
    assert not ours[:17].any()
    back = c_dequantize(MXFP4, ours)
    assert np.array_equal(back[64:96], x[64:96])   # grid values come back exactly
    # relative RMS error on Gaussian rows: 0.115 .. 0.116 measured (seeds 0-2; the scale is a power of two, values
    # above 1.5 times the block's power of two clip to 6 of it), the bound that + 20%
    g = rng.standard_normal(32 * 2000).astype(np.float32)
    err = np.sqrt(np.mean((c_dequantize(MXFP4, c_quantize(MXFP4, g)) - g) ** 2) / np.mean(g ** 2))
    assert err < 0.14, err


def test_tiny_scales_quantize_to_e_0():
    """Blocks whose largest magnitude is below 2^-125 (where llama.cpp's float -> uint8 conversion of
    floor(log2(amax)) + 125 would go negative) take the smallest scale, e = 0."""
    x = np.full(64, 2.0 ** -140, np.float32)
    x[32:] = -(2.0 ** -126)
    q = c_quantize(MXFP4, x).reshape(2, 17)
    assert q[0, 0] == 0 and q[1, 0] == 0
    assert np.array_equal(c_dequantize(MXFP4, q)[32:], np.full(32, -(2.0 ** -126), np.float32))   # -4 x 2^-128


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mxfp4")
    out = {}
    for what, dtypes in (("ffn", {"ffn_": "mxfp4"}), ("all", None)):
        out[what] = d / f"llama-{what}.gguf"
        write_arch_model(out[what], "llama", seed=0, dtype="f32" if dtypes else "mxfp4", dtypes=dtypes)
    return out


def test_file_types(files):
    r = gguf.GGUFReader(files["ffn"])
    types = {t.name: t.tensor_type for t in r.tensors}
    assert types["blk.0.ffn_up.weight"] == QT and types["blk.2.ffn_down.weight"] == QT
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F32
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(files["all"]).tensors}
    assert types["token_embd.weight"] == QT and types["output.weight"] == QT and types["blk.1.attn_v.weight"] == QT


@pytest.mark.parametrize("what", ["ffn", "all"])
def test_matches_the_reference_at_every_level(files, what, restore_level):
    """Every level gives the scalar level's logits bit for bit (prompt and token by token), within the quantized
    bound of the float64 reference; the file's layout (repack=False) gives the interleaved copies' bits."""
    path = files[what]
    ref = ReferenceModel(path).forward(PROMPT)
    out = {}
    for lv in levels():
        pi.set_cpu_isa(lv)
        model = pi.Model(path)
        ctx = pi.Context(model, n_ctx=64, kv_type="f32", n_threads=2)
        out[lv] = logits_all(ctx, PROMPT)
        assert np.array_equal(logits_in_calls(ctx, PROMPT, 1, clear=True), out[lv]), lv
        flat = logits_all(pi.Context(pi.Model(path, repack=False), n_ctx=64, kv_type="f32", n_threads=2), PROMPT)
        assert np.array_equal(flat, out[lv]), lv
    for lv, o in out.items():
        assert np.array_equal(o, out["scalar"]), f"{what}: {lv} vs scalar"
    err = rel_rms(out["scalar"], ref)
    assert err < QUANT_REL_RMS, err


@pytest.mark.parametrize("what", ["ffn", "all"])
def test_agrees_with_llama_cpp(files, what):
    theirs = llama_cpp_logits(files[what], PROMPT)
    ours = logits_all(pi.Context(pi.Model(files[what]), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"mxfp4 {what}: relative RMS difference from llama.cpp {err:.2e}")
    assert err < (LLAMA_CPP_FFN_REL_RMS if what == "ffn" else LLAMA_CPP_ALL_REL_RMS), err
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.fixture(scope="module", params=["llama", "qwen3moe"])
def moe_file(request, tmp_path_factory):
    """write_moe's experts (ffn_{gate,up,down}_exps, [n_expert, rows, cols]) as MXFP4, the rest f32."""
    return write_moe(tmp_path_factory.mktemp("moe-mxfp4"), request.param,
                     n_ff_exp=64 if request.param == "qwen3moe" else None, dtypes={"_exps": "mxfp4"})


def test_moe_experts_match_the_reference(moe_file, restore_level):
    """MXFP4 experts through moe.c's mul_mat over each expert's view: every level the scalar bits, a prompt's
    chunking neutral, within the quantized bound of the float64 reference."""
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(moe_file).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == QT and types["blk.0.ffn_gate_inp.weight"] != QT
    out = {}
    for lv in levels():
        pi.set_cpu_isa(lv)
        ctx = pi.Context(pi.Model(moe_file), n_ctx=64, kv_type="f32", n_threads=2)
        out[lv] = logits_all(ctx, PROMPT)
        assert np.array_equal(logits_in_calls(ctx, PROMPT, 5, clear=True), out[lv]), lv
    for lv, o in out.items():
        assert np.array_equal(o, out["scalar"]), f"moe {lv} vs scalar"
    err = rel_rms(out["scalar"], ReferenceModel(moe_file).forward(PROMPT))
    assert err < QUANT_REL_RMS, err


def moe_vs_llama_cpp(f, what: str) -> None:
    theirs = llama_cpp_logits(f, PROMPT)
    ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_threads=1), PROMPT)
    err = rel_rms(ours, theirs)
    print(f"mxfp4 experts, {what}: relative RMS difference from llama.cpp {err:.2e}")
    assert err < LLAMA_CPP_MOE_REL_RMS, err


def test_moe_experts_agree_with_llama_cpp(moe_file):
    moe_vs_llama_cpp(moe_file, moe_file.stem)


def test_moe_experts_among_q8_0_agree_with_llama_cpp(tmp_path):
    """The router and attention Q8_0 (the experts' activations Q8_0 on both sides too)."""
    moe_vs_llama_cpp(write_moe(tmp_path, "llama", dtype="q8_0", dtypes={"_exps": "mxfp4"}), "the rest q8_0")
