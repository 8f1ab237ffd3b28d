"""Sanity tests of tools/make_test_model.py and tests/reference_model.py (no engine needed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "tools"))
sys.path.insert(0, str(_ROOT / "tests"))

import make_test_model as mtm  # noqa: E402
import reference_model as ref  # noqa: E402

TINY = dict(n_vocab=300, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, n_layer=2)
FP16_REL = 2.0 ** -11          # max relative error of float32 -> fp16 rounding (normal range)


def _random_f32(rng, n_blocks, bs=32):
    x = rng.standard_normal((n_blocks, bs)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 3, size=(n_blocks, 1))).astype(np.float32)   # varied block scales
    x[0] = 0.0                                                                # all-zero block
    x[1, :] = 0.0
    x[1, 5] = -3.0                                                            # single negative max
    return x


def _random_quant_blocks(rng, n_blocks, block_bytes):
    b = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d = (rng.standard_normal(n_blocks) * np.exp(rng.uniform(-8, 2, n_blocks))).astype(np.float16)
    d[:4] = np.array([0.0, -0.0, 6.0e-8, -6.1e-5], dtype=np.float16)        # zero, subnormals
    b[:, :2] = d.view(np.uint8).reshape(n_blocks, 2)
    return b


# ---------------------------------------------------------------------------------------
# quantizers / dequantizers
# ---------------------------------------------------------------------------------------
def test_q8_0_roundtrip_error_bound():
    rng = np.random.default_rng(1)
    x = _random_f32(rng, 2000)
    raw = mtm.quantize_q8_0(x.reshape(-1, 64))
    assert raw.shape == (1000, 2 * 34)
    y = ref.dequant_q8_0(raw).reshape(-1, 32)
    d32 = np.abs(x).max(axis=1).astype(np.float64) / 127
    d16 = np.abs(ref._fp16_to_f64(raw.reshape(-1, 34)[:, :2]))
    err = np.abs(y - x.astype(np.float64))
    # rounding error <= d/2 (d = float32 scale used to quantize) plus the fp16 rounding of d
    # applied to |q| <= 127:  |x - q*d16| <= d/2 + |q| * |d - d16|
    q = np.abs(raw.reshape(-1, 34)[:, 2:].view(np.int8).astype(np.float64))
    bound = d32[:, None] * 0.5 * (1 + 1e-6) + q * np.abs(d32 - d16)[:, None] + 1e-30
    assert np.all(err <= bound)
    # and in terms of the stored scale (normal-range fp16 d): <= d16/2 + 127*2^-11*d16 (~0.562 d)
    normal = d16 >= 2.0 ** -14
    assert normal.sum() > 1000
    assert np.all(err[normal] <= d16[normal, None] * (0.5 + 127 * FP16_REL * 1.01))
    assert np.all(y[0] == 0) and abs(y[1, 5] + 3.0) <= 3.0 * FP16_REL


def test_q4_0_roundtrip_error_bound():
    rng = np.random.default_rng(2)
    x = _random_f32(rng, 2000)
    raw = mtm.quantize_q4_0(x.reshape(-1, 64))
    assert raw.shape == (1000, 2 * 18)
    y = ref.dequant_q4_0(raw).reshape(-1, 32)
    blocks = raw.reshape(-1, 18)
    d16 = np.abs(ref._fp16_to_f64(blocks[:, :2]))[:, None]
    xd = x.astype(np.float64)
    err = np.abs(y - xd)
    nib = np.concatenate([blocks[:, 2:] & 15, blocks[:, 2:] >> 4], axis=1)
    # element with the largest |x| is reproduced up to fp16 rounding of d (-8*d = max)
    imax = np.abs(x).argmax(axis=1)
    mx = xd[np.arange(len(x)), imax]
    assert np.all(np.abs(y[np.arange(len(x)), imax] - mx) <= np.abs(mx) * FP16_REL * 1.01)
    # unclipped elements (nibble < 15): rounding error <= d/2 (+ fp16 rounding of d, |q-8| <= 8)
    unclipped = nib < 15
    tol_half = d16 * (0.5 + 8 * FP16_REL * 1.01) + 1e-30
    assert np.all(err[unclipped] <= np.broadcast_to(tol_half, err.shape)[unclipped])
    # clipped at 15 (x*id in [6.5, 8]): error <= d (the +8 side is not representable)
    tol_full = d16 * (1.0 + 8 * FP16_REL * 1.01) + 1e-30
    assert np.all(err <= tol_full)
    assert np.all(y[0] == 0) and y[1, 5] == -3.0


def test_bf16_matches_gguf_and_rounds_to_nearest_even():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-20, 20, 4096))).astype(np.float32)
    mine = mtm.float_to_bf16(x)
    theirs = gguf.quants.quantize(x, QT.BF16).view(np.uint16)
    assert np.array_equal(mine, theirs)
    # exact ties: 1 + 2^-8 (halfway between 1 and 1+2^-7) -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6
    t = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8)], dtype=np.float32)
    back = ref.dequant_bf16(mtm.float_to_bf16(t).view(np.uint8))
    assert back.tolist() == [1.0, 1 + 2 ** -6, -1.0]
    y = ref.dequant_bf16(mine.view(np.uint8))
    assert np.all(np.abs(y - x) <= np.abs(x) * 2.0 ** -8)


@pytest.mark.parametrize("qt", ["q8_0", "q4_0"])
def test_quantizers_match_gguf_bit_exact(qt):
    rng = np.random.default_rng(4)
    x = _random_f32(rng, 4096).reshape(-1, 128)
    mine = mtm.quantize_q8_0(x) if qt == "q8_0" else mtm.quantize_q4_0(x)
    theirs = gguf.quants.quantize(x, QT.Q8_0 if qt == "q8_0" else QT.Q4_0)
    assert mine.shape == theirs.shape and np.array_equal(mine, theirs)


@pytest.mark.parametrize("qt,bb,fn", [
    (QT.Q8_0, 34, ref.dequant_q8_0),
    (QT.Q4_0, 18, ref.dequant_q4_0),
])
def test_dequantizers_match_gguf_bit_exact(qt, bb, fn):
    rng = np.random.default_rng(5)
    blocks = _random_quant_blocks(rng, 4096, bb)
    mine = fn(blocks)
    theirs = gguf.quants.dequantize(blocks.reshape(64, -1), qt).reshape(-1).astype(np.float64)
    assert mine.shape == theirs.shape
    assert np.array_equal(mine, theirs)           # products are exact in float32 as well


def test_float_dequantizers_match_numpy():
    rng = np.random.default_rng(6)
    u16 = np.arange(65536, dtype=np.uint16)          # every half / bf16 bit pattern
    h = u16.view(np.float16)
    mine = ref.dequant_f16(u16.view(np.uint8))
    theirs = h.astype(np.float64)
    fin = np.isfinite(theirs)
    assert np.array_equal(mine[fin], theirs[fin])
    assert np.array_equal(np.isnan(mine), np.isnan(theirs))
    assert np.array_equal(mine[np.isinf(theirs)], theirs[np.isinf(theirs)])
    mine_bf = ref.dequant_bf16(u16.view(np.uint8))
    with np.errstate(invalid="ignore"):
        theirs_bf = gguf.quants.dequantize(u16.view(np.uint8), QT.BF16).astype(np.float64)
    fin = np.isfinite(theirs_bf)
    assert np.array_equal(mine_bf[fin], theirs_bf[fin])
    f = rng.standard_normal(1000).astype(np.float32)
    assert np.array_equal(ref.dequant_f32(f.view(np.uint8)), f.astype(np.float64))


# ---------------------------------------------------------------------------------------
# writer + reader
# ---------------------------------------------------------------------------------------
_TYPE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}


def _expected_tensors(n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer, tied=False):
    gqa = n_embd * n_head_kv // n_head
    exp = {"token_embd.weight": [n_embd, n_vocab], "output_norm.weight": [n_embd]}
    if not tied:
        exp["output.weight"] = [n_embd, n_vocab]
    for i in range(n_layer):
        p = f"blk.{i}."
        exp.update({p + "attn_norm.weight": [n_embd], p + "attn_q.weight": [n_embd, n_embd],
                    p + "attn_k.weight": [n_embd, gqa], p + "attn_v.weight": [n_embd, gqa],
                    p + "attn_output.weight": [n_embd, n_embd], p + "ffn_norm.weight": [n_embd],
                    p + "ffn_gate.weight": [n_embd, n_ff], p + "ffn_up.weight": [n_embd, n_ff],
                    p + "ffn_down.weight": [n_ff, n_embd]})
    return exp


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_written_file_roundtrips_through_ggufreader(tmp_path, dtype):
    p = tmp_path / f"m_{dtype}.gguf"
    s = mtm.write_model(p, dtype=dtype, **TINY)
    assert s["file_size"] == p.stat().st_size
    r = gguf.GGUFReader(p)
    f = {k: v.contents() for k, v in r.fields.items()}
    assert f["general.architecture"] == "llama"
    assert f["general.file_type"] == mtm.DTYPES[dtype][1]
    assert f["llama.embedding_length"] == 64 and f["llama.feed_forward_length"] == 96
    assert f["llama.attention.head_count"] == 4 and f["llama.attention.head_count_kv"] == 2
    assert f["llama.block_count"] == 2 and f["llama.context_length"] == 512
    assert f["llama.rope.dimension_count"] == 16
    assert f["llama.rope.freq_base"] == 10000.0
    assert f["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert "llama.rope.scaling.type" not in f and "powerinfer.ffn_activation" not in f
    assert f["tokenizer.ggml.model"] == "llama"
    toks = f["tokenizer.ggml.tokens"]
    assert len(toks) == 300 and len(set(toks)) == 300
    assert toks[:3] == ["<unk>", "<s>", "</s>"] and toks[3] == "<0x00>" and toks[258] == "<0xFF>"
    types = f["tokenizer.ggml.token_type"]
    assert types[:4] == [2, 3, 3, 6] and types[258] == 6 and set(types[259:]) == {1}
    scores = f["tokenizer.ggml.scores"]
    assert len(scores) == 300 and all(a > b for a, b in zip(scores[259:], scores[260:]))
    assert toks[259] == "\u2581"
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"],
            f["tokenizer.ggml.unknown_token_id"]) == (1, 2, 0)
    assert f["tokenizer.ggml.add_bos_token"] is True and f["tokenizer.ggml.add_eos_token"] is False

    exp = _expected_tensors(300, 64, 96, 4, 2, 2)
    got = {t.name: t for t in r.tensors}
    assert list(got) == list(exp)
    for name, ne in exp.items():
        t = got[name]
        assert t.shape.tolist() == ne, name
        want = QT.F32 if name.endswith("norm.weight") else _TYPE[dtype]
        assert t.tensor_type == want, name
        assert t.data_offset % 32 == 0


def test_same_seed_same_float_weights_across_dtypes(tmp_path):
    m32 = ref.ReferenceModel(mtm.write_model(tmp_path / "a.gguf", dtype="f32", **TINY)["path"])
    m8 = ref.ReferenceModel(mtm.write_model(tmp_path / "b.gguf", dtype="q8_0", **TINY)["path"])
    m4 = ref.ReferenceModel(mtm.write_model(tmp_path / "c.gguf", dtype="q4_0", **TINY)["path"])
    w = m32.layers[1]["ffn_down"]
    assert np.std(w) == pytest.approx(1 / np.sqrt(96), rel=0.1)
    assert np.max(np.abs(m8.layers[1]["ffn_down"] - w)) <= np.max(np.abs(w)) / 127 * 0.6
    toks = [1, 300 - 1, 17, 42, 259, 5]
    l32, l8, l4 = m32.forward(toks), m8.forward(toks), m4.forward(toks)
    for l in (l32, l8, l4):
        assert l.shape == (6, 300) and np.all(np.isfinite(l))
    scale = np.std(l32)
    assert 0.3 < scale < 30
    assert np.max(np.abs(l8 - l32)) < 0.05 * scale
    assert np.max(np.abs(l4 - l32)) < 1.5 * scale
    assert np.corrcoef(l4.ravel(), l32.ravel())[0, 1] > 0.9
    # different seeds -> different weights
    m32b = ref.ReferenceModel(mtm.write_model(tmp_path / "d.gguf", dtype="f32", seed=1, **TINY)["path"])
    assert not np.allclose(m32b.forward(toks), l32)


def test_reference_forward_properties(tmp_path):
    m = ref.ReferenceModel(mtm.write_model(tmp_path / "m.gguf", dtype="f32", **TINY)["path"])
    toks = [1, 100, 200, 290, 7, 8, 9, 300 - 1]
    full = m.forward(toks)
    assert full.shape == (8, 300) and full.dtype == np.float64 and np.all(np.isfinite(full))
    # causality: prefix logits don't depend on later tokens
    assert np.allclose(m.forward(toks[:4]), full[:4], rtol=0, atol=1e-10)
    # incremental (KV cache) == full sequence
    c = m.new_cache()
    inc = np.concatenate([m.forward(toks[:3], cache=c), m.forward(toks[3:5], cache=c),
                          m.forward(toks[5:6], cache=c), m.forward(toks[6:], cache=c)])
    assert np.allclose(inc, full, rtol=0, atol=1e-10)
    # greedy == repeated argmax of the full forward
    g = m.greedy(toks[:3], 5)
    seq = list(toks[:3])
    for _ in range(5):
        seq.append(int(np.argmax(m.forward(seq)[-1])))
    assert g == seq[3:]
    # RoPE is relative: shifting all positions leaves logits unchanged (up to rounding)
    assert np.allclose(m.forward(toks, positions=np.arange(8) + 37), full, rtol=0, atol=1e-8)
    # a single token at position 0: attention output = Wo v exactly (no rope effect on v)
    one = m.forward([5])
    assert np.allclose(one, m.forward([5], positions=[9]), atol=1e-10)


def test_rope_matches_definition():
    m = ref.ReferenceModel.__new__(ref.ReferenceModel)
    m.n_rot, m.rope_base, m.freq_scale = 8, 10000.0, 0.5
    x = np.random.default_rng(0).standard_normal((3, 2, 8))
    pos = np.array([0, 1, 7])
    y = m.rope(x, pos)
    for t in range(3):
        for h in range(2):
            for i in range(4):
                th = pos[t] * 0.5 * 10000.0 ** (-2 * i / 8)
                x0, x1 = x[t, h, 2 * i], x[t, h, 2 * i + 1]
                assert y[t, h, 2 * i] == pytest.approx(x0 * np.cos(th) - x1 * np.sin(th))
                assert y[t, h, 2 * i + 1] == pytest.approx(x0 * np.sin(th) + x1 * np.cos(th))


def test_variants_metadata_and_reference(tmp_path):
    p = tmp_path / "v.gguf"
    mtm.write_model(p, dtype="q8_0", arch="bamboo", ffn_act="gelu", tied_output=True,
                    rope_freq_base=500000.0, rope_scale_linear=4.0, norm_eps=1e-6, n_ctx_train=2048,
                    n_vocab=260, n_embd=64, n_ff=64, n_head=2, n_head_kv=1, n_layer=1)
    f = {k: v.contents() for k, v in gguf.GGUFReader(p).fields.items()}
    assert f["general.architecture"] == "bamboo"
    assert f["bamboo.rope.scaling.type"] == "linear" and f["bamboo.rope.scaling.factor"] == 4.0
    assert f["bamboo.rope.freq_base"] == 500000.0 and f["bamboo.context_length"] == 2048
    assert f["powerinfer.ffn_activation"] == "gelu"
    m = ref.ReferenceModel(p)
    assert "output.weight" not in m.tensor_types and m.output is m.tok_embd
    assert m.arch == "bamboo" and m.ffn_act == "gelu" and m.freq_scale == 0.25
    assert m.eps == pytest.approx(1e-6) and m.n_head_kv == 1
    assert np.all(np.isfinite(m.forward([1, 2, 3, 259])))
    # bamboo default activation is relu; llama default silu
    mtm.write_model(tmp_path / "b.gguf", dtype="f16", arch="bamboo", **TINY)
    mb = ref.ReferenceModel(tmp_path / "b.gguf")
    assert mb.ffn_act == "relu"
    L = mb.layers[0]
    g = np.random.default_rng(0).standard_normal((3, 64))
    want = (np.maximum(g @ L["ffn_gate"].T, 0) * np.maximum(g @ L["ffn_up"].T, 0)) @ L["ffn_down"].T
    assert np.allclose(mb.ffn(L, g), want)


def test_pwri_magic(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.pwri"
    mtm.write_model(a, dtype="q4_0", **TINY)
    mtm.write_model(b, dtype="q4_0", magic="PWRI", **TINY)
    ra, rb = a.read_bytes(), b.read_bytes()
    assert ra[:4] == b"GGUF" and rb[:4] == b"PWRI" and ra[4:] == rb[4:]
    with pytest.raises(ValueError):
        gguf.GGUFReader(b)
    toks = [1, 50, 60, 70]
    assert np.array_equal(ref.ReferenceModel(b).forward(toks), ref.ReferenceModel(a).forward(toks))


def test_custom_vocab(tmp_path):
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581a", "\u2581b", "c"]
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0]
    types = [2, 3, 3] + [6] * 256 + [1, 1, 1]
    p = tmp_path / "v.gguf"
    s = mtm.write_model(p, dtype="f16", vocab=(toks, scores, types), n_vocab=0,
                        n_embd=32, n_ff=64, n_head=2, n_head_kv=2, n_layer=1)
    assert s["n_vocab"] == 262
    m = ref.ReferenceModel(p)
    assert m.n_vocab == 262 and m.tokens == toks


@pytest.mark.parametrize("dtype", ["q4_0", "q8_0", "bf16"])
def test_random_blocks_mode(tmp_path, dtype):
    p = tmp_path / "rb.gguf"
    s = mtm.write_model(p, dtype=dtype, random_blocks=True, n_vocab=400, n_embd=128, n_ff=352,
                        n_head=4, n_head_kv=4, n_layer=2)
    r = gguf.GGUFReader(p)
    assert len(r.tensors) == s["n_tensors"] == 2 + 1 + 2 * 9
    for t in r.tensors:
        want = QT.F32 if t.name.endswith("norm.weight") else _TYPE[dtype]
        assert t.tensor_type == want
    m = ref.ReferenceModel(p)
    w = m.layers[0]["ffn_gate"]
    assert np.all(np.isfinite(w)) and 0.3 / np.sqrt(128) < np.std(w) < 3 / np.sqrt(128)
    logits = m.forward([1, 2, 300, 399])
    assert np.all(np.isfinite(logits)) and np.std(logits) > 0
    # deterministic
    p2 = tmp_path / "rb2.gguf"
    mtm.write_model(p2, dtype=dtype, random_blocks=True, n_vocab=400, n_embd=128, n_ff=352,
                    n_head=4, n_head_kv=4, n_layer=2)
    assert p.read_bytes() == p2.read_bytes()


def test_row_length_must_be_block_multiple(tmp_path):
    with pytest.raises(ValueError):
        mtm.write_model(tmp_path / "x.gguf", dtype="q4_0", n_vocab=300, n_embd=64, n_ff=100,
                        n_head=4, n_head_kv=4, n_layer=1)


def test_cli(tmp_path):
    out = tmp_path / "cli.gguf"
    res = subprocess.run([sys.executable, str(_ROOT / "tools" / "make_test_model.py"), str(out),
                          "--dtype", "q8_0", "--n-layer", "1", "--ffn-act", "relu"],
                         capture_output=True, text=True, check=True)
    assert "wrote" in res.stdout and out.exists()
    m = ref.ReferenceModel(out)
    assert m.n_layer == 1 and m.ffn_act == "relu" and m.n_embd == 64
