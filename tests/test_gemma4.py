"""gemma4 (Google's Gemma 4 dense text models; GGUF general.architecture "gemma4" as llama.cpp's converter writes it) on
a tiny random file (tests/model_files.py, CONFIGS["gemma4"]) against the float64 reference (tests/reference_model.py,
written from llama.cpp's gemma4.cpp graph) and llama.cpp itself: layers of two shapes (local: 2 KV heads of 32, rope
over 32 dims with base 10000; global: 1 KV head of 64, proportional rope factors over base 1e6), an FFN width per
layer, V normed per head (V = the K projection in the global layers, which have no attn_v), attention scale 1, the last
2 layers reading the KV caches of layers 3 and 4, a scale of each layer's output and a final cap; the same model with
per-layer embeddings (E2B / E4B: model_files.gemma4_ple_weights), f32 and with quantized per-layer token tables; and
with experts (the 26B-A4B's layout: model_files.GEMMA4_MOE, the test_moe_* tests). llama.cpp runs the same files in
tests/compat/test_gemma4_vs_llama_cpp.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import FLOAT_REL_RMS, KV_F16_REL_RMS, QUANT_REL_RMS, check_level, logits_all, logits_in_calls, rel_rms
from model_files import (CONFIGS, GEMMA4_MOE, gemma4_moe_weights, gemma4_ple_weights, gemma4_weights, make_weights,
                         rewrite, write_arch_model, write_gemma4_model, write_gemma4_moe_model, write_gemma4_ple_model)
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer.gguf_file import ModelLoadError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from random_lora import LORA_ALL_LINEAR, write_lora  # noqa: E402

PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5, 250, 33, 81, 190]   # 16 > the window of 5
C = CONFIGS["gemma4"]
# What each piece changes in the tiny model's logits (rel. RMS of the reference without it against ours, seed 3): no V
# norm 0.21, q scaled by 1/sqrt(head_dim) 0.70, no rope factors 1.4e-2 (the global layers' base of 1e6 turns the
# unrotated pairs little over 16 positions), no layer output scale 0.16, no final cap 4.0e-2, every layer global 0.81,
# earlier KV sources 0.50; ours is 4.4e-7 from the reference
FEATURE_MIN = 1e-2


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4") / "tiny-gemma4.gguf"
    write_arch_model(path, "gemma4", seed=3)
    return path


def ctx_of(model, **kw):
    return pi.Context(model, n_ctx=64, kv_type=kw.pop("kv_type", "f32"), **kw)


def test_hparams(gemma4):
    """What model.py makes of the keys: the fields hold the global layers' shape (the widest FFN), layer_geom each
    layer's (llama.cpp's n_embd_head_k(il), n_head_kv(il), n_rot(il), n_ff(il), is_swa(il) and its KV reuse)."""
    hp = pi.Model(gemma4).hparams
    assert (hp.arch, hp.rope_mode, hp.head_dim, hp.n_rot, hp.n_head_kv, hp.n_ff) == ("gemma4", "neox", 64, 64, 1, 192)
    assert hp.qk_norm and hp.post_norms and hp.v_norm and hp.rope_freqs_global and hp.attn_scale == 1.0
    assert (hp.rope_freq_base, hp.rope_freq_base_swa, hp.final_softcap, hp.n_swa) == (1e6, 1e4, 3.0, 5)
    geo = [(g.head_dim, g.n_head_kv, g.n_rot, g.n_ff, g.is_local, g.kv_source) for g in hp.layers()]
    assert geo == [(32, 2, 32, 96, True, 0), (32, 2, 32, 128, True, 1), (64, 1, 64, 160, False, 2),
                   (32, 2, 32, 96, True, 3), (64, 1, 64, 128, False, 4), (32, 2, 32, 192, True, 3),
                   (64, 1, 64, 160, False, 4)]
    assert [hp.is_swa_layer(i) for i in range(7)] == [bool(v) for v in C["local"]]


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_matches_the_reference_at_every_level(gemma4, level):
    """At every ISA level this machine runs: the prompt in one call and token by token (decode steps over the KV cache:
    the shared layers read their sources' cells) within FLOAT_REL_RMS of the float64 reference, and the scalar
    level's bits."""
    check_level(gemma4, level, ReferenceModel(gemma4).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


@pytest.mark.parametrize("name", ["gemma4", "gemma4_moe"])
def test_rows_do_not_depend_on_the_batch(request, name):
    """The prompt in one call, 5 at a time and one at a time, on 1 or 2 threads: the same logits (with experts too:
    each expert's tokens gathered per call)."""
    model = pi.Model(request.getfixturevalue(name))
    one = logits_all(ctx_of(model, n_threads=2), PROMPT)
    assert np.array_equal(logits_in_calls(ctx_of(model, n_threads=2), PROMPT, 5), one)
    assert np.array_equal(logits_in_calls(ctx_of(model, n_threads=1), PROMPT, 1), one)


def test_f16_kv_cache(gemma4):
    ours = logits_all(ctx_of(pi.Model(gemma4), kv_type="f16"), PROMPT)
    assert rel_rms(ours, ReferenceModel(gemma4).forward(PROMPT)) < KV_F16_REL_RMS


def _earlier_sources(path):
    """The reference whose shared layers read earlier caches of their kind: layer 5 (local) layer 1's instead of
    layer 3's (llama.cpp's n_kv - 2), layer 6 (global) layer 2's instead of layer 4's (n_kv - 1)."""
    ref = ReferenceModel(path)
    ref.layer_geom[5]["kv_source"], ref.layer_geom[6]["kv_source"] = 1, 2
    return ref


def test_each_piece_matters(gemma4):
    """The reference without each of gemma4's pieces is far from ours (FEATURE_MIN, 1e3 x the tolerance): no V norm,
    q scaled by 1/sqrt(head_dim), no rope factors (the global layers rotating every pair), no layer output scale, no
    final cap, every layer global, and the shared layers reading earlier caches of their kind (_earlier_sources)."""
    ours = logits_all(ctx_of(pi.Model(gemma4)), PROMPT)
    assert rel_rms(ours, ReferenceModel(gemma4).forward(PROMPT)) < FLOAT_REL_RMS
    refs = {str(ch): ReferenceModel(gemma4, **ch) for ch in (dict(v_norm=False), dict(attn_scale=None),
                                                            dict(rope_freqs=None), dict(use_out_scale=False),
                                                            dict(final_softcap=0.0), dict(n_swa=1000))}
    refs["earlier KV sources"] = _earlier_sources(gemma4)
    for what, ref in refs.items():
        err = rel_rms(ours, ref.forward(PROMPT))
        print(f"{what}: {err:.2e}")
        assert err > FEATURE_MIN, (what, err)


@pytest.mark.parametrize("kv_type, tol", [("f32", FLOAT_REL_RMS), ("f16", KV_F16_REL_RMS)])
def test_released_head_sizes(tmp_path, kv_type, tol):
    """The released models' head sizes (31B: 256 local, 512 global, rope factors over 64 of 256 pairs) at 2 heads:
    the attention's large-head paths against the reference."""
    c = dict(C, head_dim=512, head_dim_swa=256, n_head=2, n_rot_pairs=64)
    write_gemma4_model(tmp_path / "big.gguf", gemma4_weights(c, 3), c)
    ours = logits_all(ctx_of(pi.Model(tmp_path / "big.gguf"), kv_type=kv_type), PROMPT)
    assert rel_rms(ours, ReferenceModel(tmp_path / "big.gguf").forward(PROMPT)) < tol


def test_unused_kv_weights_of_shared_layers(gemma4, tmp_path):
    """A file whose shared layers carry attn_k / attn_v / attn_k_norm anyway (llama.cpp's TENSOR_NOT_REQUIRED there):
    they are not read, the logits are the same."""
    rng = np.random.default_rng(0)
    extra = {"blk.5.attn_k.weight": (rng.standard_normal((64, 128)).astype(np.float32), 0),
             "blk.5.attn_v.weight": (rng.standard_normal((64, 128)).astype(np.float32), 0),
             "blk.6.attn_k_norm.weight": (np.ones(64, np.float32), 0)}
    path = rewrite(gemma4, tmp_path / "extra.gguf", extra=extra)
    assert np.array_equal(logits_all(ctx_of(pi.Model(path)), PROMPT), logits_all(ctx_of(pi.Model(gemma4)), PROMPT))


@pytest.mark.parametrize("name", ["gemma4", "gemma4_moe", "gemma4_ple"])
def test_two_sequences_in_one_batch(request, name):
    """Two prompts decoded together (their tokens interleaved in one batch, then a step of both): each sequence's
    logits are the reference's of its prompt alone, the shared layers reading only their sequence's cells (with
    per-layer embeddings: each token its own rows of the per-layer inputs)."""
    gemma4 = request.getfixturevalue(name)
    a, b = PROMPT[:9], PROMPT[7:]
    ctx = pi.Context(pi.Model(gemma4), n_ctx=64, kv_type="f32", n_seq_max=2)
    toks = [t for pair in zip(a, b) for t in pair]
    pos = [p for i in range(9) for p in (i, i)]
    ctx.decode(toks, pos=pos, seq_id=[0, 1] * 9, logits="all")
    got_a = np.stack([ctx.logits(2 * i) for i in range(9)])
    got_b = np.stack([ctx.logits(2 * i + 1) for i in range(9)])
    ctx.decode([5, 6], pos=[9, 9], seq_id=[0, 1], logits="all")
    ref = ReferenceModel(gemma4)
    assert rel_rms(np.vstack([got_a, ctx.logits(0)]), ref.forward(a + [5])) < FLOAT_REL_RMS
    assert rel_rms(np.vstack([got_b, ctx.logits(1)]), ref.forward(b + [6])) < FLOAT_REL_RMS


def test_api_greedy_tokens(gemma4):
    """The llama-cpp-python API (PowerInfer.generate over token ids, temperature 0): the reference's greedy tokens."""
    from itertools import islice
    llm = pi.PowerInfer(str(gemma4), n_ctx=64, n_threads=1, verbose=False)
    got = list(islice(llm.generate(PROMPT, temp=0.0), 8))
    assert got == ReferenceModel(gemma4).greedy(PROMPT, 8)


def test_kv_cache_of_the_cached_layers(gemma4, tmp_path):
    """The KV cache holds the 5 layers with their own cache at their sizes (Context.kv_cache_bytes), a sequence's
    state their rows alone; the state restored into another context (other cells) continues with the first's logits;
    a state of another model is refused (gemma3's of 7 layers of 64 K/V values: gemma4's cached layers each hold 64
    too, so the header agrees and the size does not)."""
    model = pi.Model(gemma4)
    a = ctx_of(model, n_seq_max=2)
    cached = [C["n_head_kv"][il] * (C["head_dim_swa"] if C["local"][il] else C["head_dim"]) for il in range(5)]
    assert a.kv_cache_bytes == (sum(cached) * 4 * 64, sum(cached) * 4 * 64)       # f32, 64 cells
    a.decode(PROMPT[:10], logits="last")
    state = a.kv_seq_state(0)
    assert len(state) == 56 + 10 * 4 + 10 * 2 * 4 * sum(cached)
    a.decode(PROMPT[10:14], logits="all")
    want = np.stack([a.logits(i) for i in range(4)])
    assert rel_rms(want, ReferenceModel(gemma4).forward(PROMPT[:14])[10:]) < FLOAT_REL_RMS
    b = ctx_of(model, n_seq_max=2)
    b.decode([7, 8, 9], seq_id=1, logits="last")            # another sequence in cells 0-2
    b.kv_seq_set_state(0, state)
    b.decode(PROMPT[10:14], logits="all")
    np.testing.assert_allclose(np.stack([b.logits(i) for i in range(4)]), want, rtol=1e-5, atol=1e-5)
    write_arch_model(tmp_path / "g3.gguf", "gemma3", seed=3)
    with pytest.raises(pi.PowerInferError, match="takes 35936 bytes, not 25696"):   # 7 cached layers, 5
        ctx_of(pi.Model(tmp_path / "g3.gguf")).kv_seq_set_state(0, state)


def test_lora_and_control_vector(gemma4, tmp_path):
    """A LoRA adapter of every linear weight the layers have (no attn_k / attn_v in the shared layers, no attn_v in
    the global ones: V = the adapted K) and a control vector, against the reference of the merged weights."""
    from test_lora import PROMPT as LORA_PROMPT
    from test_lora import reference

    from powerinfer.lora import LoraAdapter
    pairs = write_lora(tmp_path / "a.gguf", gemma4, targets=LORA_ALL_LINEAR, rank=4, seed=2)
    model = pi.Model(gemma4)
    ctx = ctx_of(model)
    ctx.set_lora([(LoraAdapter(tmp_path / "a.gguf", model), 1.0)])
    got = logits_all(ctx, LORA_PROMPT)
    assert rel_rms(got, reference(gemma4, [(pairs, 1.0, 16.0)])) < FLOAT_REL_RMS
    cvec = np.random.default_rng(1).standard_normal((C["n_layer"], C["n_embd"])).astype(np.float32) * 0.3
    ctx = ctx_of(model)
    ctx.set_control_vector(cvec, 1, 5)
    want = ReferenceModel(gemma4, control_vector=np.where(
        ((np.arange(C["n_layer"]) >= 1) & (np.arange(C["n_layer"]) <= 5))[:, None], cvec, 0.0)).forward(PROMPT)
    assert rel_rms(logits_all(ctx, PROMPT), want) < FLOAT_REL_RMS


def test_refused(tmp_path, gemma4):
    """Per-layer embedding tensors without their width key and inconsistent per-layer keys give a ModelLoadError
    naming the cause (the core's checks as PI errors), never an abort (experts: test_moe_refused)."""
    w = make_weights("gemma4", seed=3)
    cases = {
        "missing tensor 'per_layer_token_embd.weight'": dict(meta={"embedding_length_per_layer_input": 64}),
        "has 6 values for 7 layers": dict(meta={"attention.head_count_kv": [2] * 6}),
        "not a multiple of n_head_kv = 3": dict(meta={"attention.head_count_kv": [3] * 7}),
        "must be a flag per layer": dict(meta={"attention.sliding_window_pattern": 6}),
        "rope dimension 34": dict(meta={"rope.dimension_count_swa": 34}),
        "kv_source": dict(meta={"attention.shared_kv_layers": 3}),     # layer 4 (global) would read layer 3 (local)
        "fewer than 2": dict(meta={"attention.shared_kv_layers": 6}),
        "value_length_swa": dict(meta={"attention.value_length_swa": 64}),
    }
    for i, (what, kw) in enumerate(cases.items()):
        write_gemma4_model(tmp_path / f"bad{i}.gguf", w, C, **kw)
        with pytest.raises(ModelLoadError, match=what):
            pi.Model(tmp_path / f"bad{i}.gguf")
    ple = rewrite(gemma4, tmp_path / "ple.gguf", extra={"per_layer_token_embd.weight": (np.zeros((320, 8),
                                                                                               np.float32), 0)})
    with pytest.raises(ModelLoadError, match="without gemma4.embedding_length_per_layer_input"):
        pi.Model(ple)
    missing = rewrite(gemma4, tmp_path / "no-k.gguf", drop=("blk.2.attn_k.weight",))
    with pytest.raises(ModelLoadError, match="blk.2.attn_k.weight"):
        pi.Model(missing)
    bad_scale = rewrite(gemma4, tmp_path / "scale.gguf", replace={"blk.0.layer_output_scale.weight":
                                                                  (np.ones(2, np.float32), 0)})
    with pytest.raises(ModelLoadError, match="layer_output_scale"):
        pi.Model(bad_scale)


_OFFLOAD_SCRIPT = """
import sys, numpy as np, powerinfer as pi
m = pi.Model(sys.argv[1])
prompt = [int(t) for t in sys.argv[2].split(",")]
def run(**kw):
    c = pi.Context(m, n_ctx=64, kv_type="f32", **kw)
    c.decode(prompt, logits="all")
    rows = [np.array(c.logits(i)) for i in range(len(prompt))]
    for t in (5, 6, 7):                    # decode steps over the device's caches
        c.decode([t], logits="last")
        rows.append(np.array(c.logits()))
    return c, np.stack(rows)
c0, cpu = run()
for ngl in (-1, 4, 3, 1):
    c, got = run(n_gpu_layers=ngl)
    st = c.offload
    print(ngl, st.n_attn_layers if st else 0, st.kv_bytes if st else 0, bool(np.array_equal(got, cpu)),
          c.kv_seq_state(0) == c0.kv_seq_state(0), "|".join(c.gpu_warnings + c.gpu_log).replace(" ", "_"))
"""


def _offload_rows(path):
    """{ngl: the _OFFLOAD_SCRIPT's line} for path on an emulated device."""
    env = dict(os.environ, POWERINFER_EMULATED_GPU_MIB="256")
    out = subprocess.run([sys.executable, "-c", _OFFLOAD_SCRIPT, str(path), ",".join(map(str, PROMPT))], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return {int(r.split()[0]): r.split() for r in out.stdout.splitlines()}


def test_offload_on_the_emulated_device(gemma4):
    """On the emulated device (its ops the CPU's kernels): every layer placed (-ngl -1) or the last 4 (the shared
    layers with their sources 3 and 4) give the CPU's bits over a prompt and decode steps, the device holding the 5
    cached layers' (3 and 4's) KV caches, read back as the CPU's sequence state; where -ngl leaves a shared layer's
    source on the CPU (-ngl 3: layer 5 on the device, its source 3 not; -ngl 1: layer 6, its source 4), the source's
    attention and cache go to the device with it (its FFN stays on the CPU), with the same bits."""
    rows = _offload_rows(gemma4)
    cached = [C["n_head_kv"][il] * (C["head_dim_swa"] if C["local"][il] else C["head_dim"]) for il in range(5)]
    pad = lambda n: -(-n // 256) * 256  # noqa: E731
    kv = lambda layers: sum(2 * pad(64 * 4 * cached[il]) for il in layers)  # noqa: E731
    assert rows[-1][1:5] == ["7", str(kv(range(5))), "True", "True"], rows[-1]
    assert rows[4][1:5] == ["4", str(kv((3, 4))), "True", "True"], rows[4]
    assert rows[3][1:5] == ["4", str(kv((3, 4))), "True", "True"] and "layer(s)_3_on" in rows[3][5], rows[3]
    assert rows[1][1:5] == ["2", str(kv((4,))), "True", "True"] and "layer(s)_4_on" in rows[1][5], rows[1]


# ------------------------------------------------------------------ per-layer embeddings (E2B / E4B)
# What each piece of the per-layer embeddings changes in the tiny model's logits (rel. RMS of the reference without it
# against ours, seed 3, n_pl 32): no per-layer embeddings 1.0, no token table 0.85, no projection 0.78, no sqrt(n_pl)
# on the table 0.73, no GELU on the gate 0.74, no post_norm 0.87, no per_layer_proj_norm weights 7.1e-2. The two other
# scales are followed by RMS norms, so they reach the logits only through the norms' eps: no 1/sqrt(2) 6.5e-7, no
# 1/sqrt(n_embd) 1.4e-4 (no test of the logits can tell whether the first is there). Ours is 5.4e-7 from the reference.
PLE_PIECES = ("all", "tok", "proj", "tok_scale", "gate_act", "post_norm", "proj_norm")
PLE_TABLE_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def gemma4_ple(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4") / "tiny-gemma4-ple.gguf"
    write_gemma4_ple_model(path, seed=3, n_pl=32)
    return path


def quantized_table_files(tmp_path, qtype: str, seed: int = 3, n_pl: int = 256) -> tuple[Path, Path]:
    """A gemma4 file with per-layer embeddings whose per_layer_token_embd is qtype (the core's quantizer; n_pl 256:
    rows of 7 x 256 values, whole K-quant blocks), the rest f32, and its twin with that table dequantized (gguf-py's
    dequantizer) to f32: (quantized file, twin)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from powerinfer._ffi import ffi, lib
    w = gemma4_ple_weights(C, seed, n_pl)
    name, t = "per_layer_token_embd.weight", int(GGMLQuantizationType[qtype])
    table = np.ascontiguousarray(w[name], np.float32)
    raw = np.zeros((table.shape[0], lib.pi_row_bytes(t, table.shape[1])), np.uint8)
    for r in range(table.shape[0]):
        assert lib.pi_quantize_row(t, ffi.cast("float *", table[r].ctypes.data),
                                   ffi.cast("void *", raw[r].ctypes.data), table.shape[1]) == 0
    twin = tmp_path / f"ple-{qtype}-twin.gguf"
    write_gemma4_ple_model(twin, n_pl=n_pl, weights=dict(w, **{name: dequantize(raw, GGMLQuantizationType[qtype])}))
    return rewrite(twin, tmp_path / f"ple-{qtype}.gguf", replace={name: (raw, GGMLQuantizationType[qtype])}), twin


def test_ple_hparams(gemma4_ple, gemma4):
    """embedding_length_per_layer_input is HParams.n_embd_per_layer; the layers' geometry is gemma4's without it."""
    hp = pi.Model(gemma4_ple).hparams
    assert hp.n_embd_per_layer == 32 and hp.layers() == pi.Model(gemma4).hparams.layers()
    assert pi.Model(gemma4).hparams.n_embd_per_layer == 0


@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_ple_matches_the_reference_at_every_level(gemma4_ple, level):
    """Per-layer embeddings (with the shared KV layers and the two layer shapes): the prompt in one call and token by
    token within FLOAT_REL_RMS of the float64 reference at every ISA level, and the scalar level's bits."""
    check_level(gemma4_ple, level, ReferenceModel(gemma4_ple).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_ple_each_piece_matters(gemma4_ple):
    """The reference without each piece of the per-layer embeddings that the logits can see (PLE_PIECES) is far from
    ours; the two scales before RMS norms (1/sqrt(2), 1/sqrt(n_embd)) change them by the norms' eps alone."""
    ours = logits_all(ctx_of(pi.Model(gemma4_ple)), PROMPT)
    assert rel_rms(ours, ReferenceModel(gemma4_ple).forward(PROMPT)) < FLOAT_REL_RMS
    for piece in PLE_PIECES:
        err = rel_rms(ours, ReferenceModel(gemma4_ple, ple_drop=(piece,)).forward(PROMPT))
        print(f"without {piece}: {err:.2e}")
        assert err > FEATURE_MIN, (piece, err)
    for piece in ("input_scale", "proj_scale"):
        assert rel_rms(ours, ReferenceModel(gemma4_ple, ple_drop=(piece,)).forward(PROMPT)) < 1e-3


def test_ple_batches_outputs_and_decode_steps(gemma4_ple):
    """The prompt in one call, 5 at a time and one at a time give the same bits; a call asking for the last row only
    (the last layer's FFN and per-layer embedding over that row: its rows of the per-layer inputs) its bits; then
    decode steps over the cache match the reference of the longer sequence."""
    model = pi.Model(gemma4_ple)
    one = logits_all(ctx_of(model, n_threads=2), PROMPT)
    assert np.array_equal(logits_in_calls(ctx_of(model, n_threads=2), PROMPT, 5), one)
    assert np.array_equal(logits_in_calls(ctx_of(model, n_threads=1), PROMPT, 1), one)
    ctx = ctx_of(model, n_threads=2)
    ctx.decode(PROMPT, logits="last")
    assert np.array_equal(np.array(ctx.logits()), one[-1])
    ctx.decode(PROMPT[:3], pos=[16, 17, 18], logits=[True, False, True])   # two output rows of three
    steps = np.stack([ctx.logits(0), ctx.logits(2)])
    for t in (5, 6):
        ctx.decode([t], logits="last")
        steps = np.vstack([steps, ctx.logits()])
    want = ReferenceModel(gemma4_ple).forward(PROMPT + PROMPT[:3] + [5, 6])[[16, 18, 19, 20]]
    assert rel_rms(steps, want) < FLOAT_REL_RMS


@pytest.mark.parametrize("qtype", PLE_TABLE_TYPES)
def test_ple_quantized_token_table(tmp_path, qtype):
    """A quantized per-layer token table (the rest f32) is read row by row as it is in the file (never dequantized as a
    whole): the logits within FLOAT_REL_RMS of the reference of its dequantized twin, and the API's greedy tokens
    the reference's."""
    from itertools import islice
    path, twin = quantized_table_files(tmp_path, qtype)
    ref = ReferenceModel(twin)
    assert rel_rms(logits_all(ctx_of(pi.Model(path)), PROMPT), ref.forward(PROMPT)) < FLOAT_REL_RMS
    llm = pi.PowerInfer(str(path), n_ctx=64, n_threads=1, verbose=False)
    assert list(islice(llm.generate(PROMPT, temp=0.0), 6)) == ref.greedy(PROMPT, 6)


def test_ple_lora_and_control_vector(gemma4_ple, tmp_path):
    """LoRA on every linear weight of the layers, the per-layer gate (inp_gate) and projection (proj) included
    (llama.cpp runs both through build_lora_mm), and a control vector (added after the per-layer embedding and the
    output scale), against the reference of the merged weights."""
    from test_lora import PROMPT as LORA_PROMPT
    from test_lora import reference

    from powerinfer.lora import LoraAdapter
    pairs = write_lora(tmp_path / "a.gguf", gemma4_ple, targets=LORA_ALL_LINEAR + ("inp_gate", "proj"), rank=4, seed=2)
    assert "blk.6.proj.weight" in pairs and "blk.0.inp_gate.weight" in pairs
    model = pi.Model(gemma4_ple)
    ctx = ctx_of(model)
    ctx.set_lora([(LoraAdapter(tmp_path / "a.gguf", model), 1.0)])
    assert rel_rms(logits_all(ctx, LORA_PROMPT), reference(gemma4_ple, [(pairs, 1.0, 16.0)])) < FLOAT_REL_RMS
    only_ple = {k: v for k, v in pairs.items() if k.endswith(("inp_gate.weight", "proj.weight"))}
    assert rel_rms(reference(gemma4_ple, [(only_ple, 1.0, 16.0)]), reference(gemma4_ple, [])) > FEATURE_MIN
    cvec = np.random.default_rng(1).standard_normal((C["n_layer"], C["n_embd"])).astype(np.float32) * 0.3
    ctx = ctx_of(model)
    ctx.set_control_vector(cvec, 0, 6)
    assert rel_rms(logits_all(ctx, PROMPT), ReferenceModel(gemma4_ple, control_vector=cvec).forward(PROMPT)) < \
        FLOAT_REL_RMS


def test_ple_embeddings(gemma4_ple):
    """The final hidden states (pi_get_embeddings) of a file with per-layer embeddings: the reference's."""
    ctx = ctx_of(pi.Model(gemma4_ple))
    ctx.set_outputs(logits=True, embeddings=True)
    ctx.decode(PROMPT, logits="all")
    got = np.stack([ctx.embeddings(i) for i in range(len(PROMPT))])
    assert rel_rms(got, ReferenceModel(gemma4_ple).forward(PROMPT, hidden=True)) < FLOAT_REL_RMS


def test_ple_bad_files(gemma4_ple, tmp_path):
    """Per-layer tensors of the wrong shape, missing ones, and a width that does not match them give a ModelLoadError
    naming the tensor (the core's PI_ERR_BAD_MODEL), never a crash."""
    z = lambda *shape: (np.zeros(shape, np.float32), 0)  # noqa: E731
    cases = {
        "embd.weight' has shape \\[224, 319\\]": dict(replace={"per_layer_token_embd.weight": z(319, 224)}),
        "embd.weight' has shape \\[200, 320\\]": dict(replace={"per_layer_token_embd.weight": z(320, 200)}),
        "per_layer_model_proj.weight' has shape": dict(replace={"per_layer_model_proj.weight": z(224, 64)}),
        "per_layer_proj_norm.weight' has shape": dict(replace={"per_layer_proj_norm.weight": (np.ones(16, np.float32),
                                                                                              0)}),
        "blk.3.inp_gate.weight' has shape": dict(replace={"blk.3.inp_gate.weight": z(16, 128)}),
        "blk.0.proj.weight' has shape": dict(replace={"blk.0.proj.weight": z(32, 128)}),
        "missing tensor 'blk.6.post_norm.weight'": dict(drop=("blk.6.post_norm.weight",)),
        "missing tensor 'per_layer_model_proj.weight'": dict(drop=("per_layer_model_proj.weight",)),
        "per_layer_token_embd.weight' has shape \\[224, 320\\], expected \\[448, 320\\]": dict(
            meta={"gemma4.embedding_length_per_layer_input": (64, 4)}),
    }
    for i, (what, kw) in enumerate(cases.items()):
        path = rewrite(gemma4_ple, tmp_path / f"bad{i}.gguf", **kw)
        with pytest.raises(ModelLoadError, match=what):
            pi.Model(path)


def test_ple_offload_on_the_emulated_device(gemma4_ple):
    """On the emulated device: every layer placed (-ngl -1) or the last 4 give the CPU's bits over a prompt and decode
    steps (the per-layer inputs computed on the CPU and copied to the device, each layer's per-layer block run where
    its FFN runs), the shared layers' sources placed with them as without per-layer embeddings."""
    rows = _offload_rows(gemma4_ple)
    for ngl, n_attn in ((-1, 7), (4, 4), (3, 4), (1, 2)):
        assert rows[ngl][1:5] == [str(n_attn), rows[ngl][2], "True", "True"], rows[ngl]


# ---- experts (the 26B-A4B's layout): GEMMA4_MOE's layers 0, 2, 3 (own KV), 5, 6 (shared KV) with 4 experts of 64
# (2 per token) beside their dense FFN, layers 1 and 4 dense. What each piece changes (rel. RMS of the reference without
# it against ours, seed 3): printed by test_moe_each_piece_matters; ours is 6.9e-7 from the reference.
@pytest.fixture(scope="module")
def gemma4_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4moe") / "tiny-gemma4-moe.gguf"
    write_gemma4_moe_model(path, seed=3)
    return path


@pytest.fixture(scope="module")
def gemma4_moe_fused(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4moe") / "tiny-gemma4-moe-fused.gguf"
    write_gemma4_moe_model(path, seed=3, fused=True)
    return path


def test_moe_hparams(gemma4_moe):
    """The experts' keys (expert_count, expert_used_count, expert_feed_forward_length) beside the dense FFNs' widths;
    the core's geometry marks the layers with ffn_gate_inp."""
    model = pi.Model(gemma4_moe)
    hp = model.hparams
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff) == (4, 2, 64, 192)
    assert hp.moe_router_norm and hp.moe_dense_ffn
    from powerinfer._ffi import ffi, lib
    g = ffi.new("pi_layer_geom *")
    moe = []
    for il in range(C["n_layer"]):
        assert lib.pi_model_layer_geom(model._ptr, il, g) == 0
        moe.append(g.moe)
    assert moe == [int(il in GEMMA4_MOE["layers"]) for il in range(C["n_layer"])]


@pytest.mark.parametrize("fused", [False, True], ids=["gate_up", "fused"])
@pytest.mark.parametrize("level", pi.CPU_ISA_LEVELS)
def test_moe_matches_the_reference_at_every_level(gemma4_moe, gemma4_moe_fused, level, fused):
    """At every ISA level: the prompt in one call and token by token within FLOAT_REL_RMS of the float64 reference,
    and the scalar level's bits; ffn_gate_exps + ffn_up_exps or one ffn_gate_up_exps (the same weights: the same
    logits)."""
    path = gemma4_moe_fused if fused else gemma4_moe
    check_level(path, level, ReferenceModel(path).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_moe_fused_gives_the_same_bits(gemma4_moe, gemma4_moe_fused):
    ours = logits_all(ctx_of(pi.Model(gemma4_moe)), PROMPT)
    assert np.array_equal(logits_all(ctx_of(pi.Model(gemma4_moe_fused)), PROMPT), ours)


def _moe_ref(path, drop=(), swap=False, **overrides):
    """The reference with `drop` removed from every layer with experts (a norm: left out; a scale: 1) and (swap) the
    fused experts' gate and up halves exchanged."""
    ref = ReferenceModel(path, **overrides)
    for L in ref.layers:
        if "ffn_gate_inp" not in L:
            continue
        for k in drop:
            L.pop(k)
        if swap:
            gu = L["ffn_gate_up_exps"]
            L["ffn_gate_up_exps"] = np.concatenate([gu[:, gu.shape[1] // 2:], gu[:, :gu.shape[1] // 2]], axis=1)
    return ref


def test_moe_each_piece_matters(gemma4_moe_fused):
    """The reference without each piece of gemma4's experts is far from ours (FEATURE_MIN): the router's scale, the
    router reading the experts' normed input instead of the residual stream, the per-expert scale, each of the four
    norms around the branches (pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2, post_ffw_norm of their sum) and the
    fused tensor's halves (gate first) swapped. (Whether the chosen weights are renormalized does not show: a factor per
    token, which post_ffw_norm_2 takes out; 7.5e-7.)"""
    path = gemma4_moe_fused
    ours = logits_all(ctx_of(pi.Model(path)), PROMPT)
    assert rel_rms(ours, ReferenceModel(path).forward(PROMPT)) < FLOAT_REL_RMS
    refs = {k: _moe_ref(path, drop=(k,)) for k in ("ffn_gate_inp.scale", "ffn_down_exps.scale", "pre_ffw_norm_2",
                                                   "post_ffw_norm_1", "post_ffw_norm_2", "post_ffw_norm")}
    refs["router of the experts' input"] = _moe_ref(path, router_of_x=False)
    refs["up first"] = _moe_ref(path, swap=True)
    for what, ref in refs.items():
        err = rel_rms(ours, ref.forward(PROMPT))
        print(f"{what}: {err:.2e}")
        assert err > FEATURE_MIN, (what, err)


@pytest.mark.parametrize("dtype, fused", [("q8_0", False), ("q8_0", True), ("q4_0", False), ("q4_0", True)])
def test_moe_quantized_experts(tmp_path, dtype, fused):
    """Q8_0 / Q4_0 experts (the rest f32): within QUANT_REL_RMS of the reference of the dequantized weights (seed 3:
    no token's route flips between the engines' roundings; measured 1.4e-2 at both types)."""
    path = tmp_path / f"moe-{dtype}.gguf"
    write_gemma4_moe_model(path, seed=3, fused=fused, dtypes={"_exps": dtype})
    ours = logits_all(ctx_of(pi.Model(path)), PROMPT)
    err = rel_rms(ours, ReferenceModel(path).forward(PROMPT))
    print(f"gemma4 experts {dtype} fused={fused}: {err:.2e} from the reference")
    assert err < QUANT_REL_RMS, err


def test_moe_offload_on_the_emulated_device(gemma4_moe):
    """On the emulated device the attention goes there (every layer's, or the last 4) and every FFN stays on the CPU
    (experts run on the CPU only; a warning says so): the CPU's bits over a prompt and decode steps."""
    rows = _offload_rows(gemma4_moe)
    for ngl, n_attn in ((-1, "7"), (4, "4")):
        assert rows[ngl][1] == n_attn and rows[ngl][3:5] == ["True", "True"], rows[ngl]
        assert "experts_run_on_the_CPU" in rows[ngl][5], rows[ngl]


def test_moe_refused(tmp_path, gemma4_moe, gemma4_moe_fused):
    """Inconsistent expert keys and tensors give a ModelLoadError naming the cause (the core's checks as PI errors)."""
    w = gemma4_moe_weights(3)
    cases = {
        "expert_count is 4 and 0 layers": dict(weights=make_weights("gemma4", seed=3)),
        "expert_count is 0 and 5 layers": dict(meta={"expert_count": None}),
        "expert_feed_forward_length": dict(meta={"expert_feed_forward_length": None}),
        "expert_used_count": dict(meta={"expert_used_count": None}),
        "n_expert_used = 5": dict(meta={"expert_used_count": 5}),
        "ffn_gate_exps.weight' has shape": dict(meta={"expert_feed_forward_length": 32}),   # the experts' width
    }
    for i, (what, kw) in enumerate(cases.items()):
        write_gemma4_moe_model(tmp_path / f"bad{i}.gguf", **{"weights": w, **kw})
        with pytest.raises(ModelLoadError, match=what):
            pi.Model(tmp_path / f"bad{i}.gguf")
    for name in ("blk.2.post_ffw_norm_2.weight", "blk.3.ffn_gate_inp.scale", "blk.0.ffn_up_exps.weight",
                 "blk.5.pre_ffw_norm_2.weight", "blk.6.ffn_gate.weight"):
        with pytest.raises(ModelLoadError, match=name):
            pi.Model(rewrite(gemma4_moe, tmp_path / "drop.gguf", drop=(name,)))
    bad = {"blk.0.ffn_down_exps.scale": (np.ones(3, np.float32), 0),
           "blk.2.ffn_gate_inp.scale": (np.ones(64, np.float32), 0)}
    for name, value in bad.items():
        with pytest.raises(ModelLoadError, match=name.removesuffix(".scale")):
            pi.Model(rewrite(gemma4_moe, tmp_path / "shape.gguf", replace={name: value}))
    for name in ("blk.1.ffn_gate_exps.scale", "blk.0.attn_q.scale"):   # llama.cpp applies these; the core does not
        with pytest.raises(ModelLoadError, match=f"per-tensor scales \\({name}"):
            pi.Model(rewrite(gemma4_moe, tmp_path / "scale.gguf", extra={name: (np.ones(4, np.float32), 0)}))
    with pytest.raises(ModelLoadError, match="ffn_gate_up_exps"):
        pi.Model(rewrite(gemma4_moe_fused, tmp_path / "fused.gguf", replace={
            "blk.0.ffn_gate_up_exps.weight": (np.zeros((4, 64, 128), np.float32), 0)}))
