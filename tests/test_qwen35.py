"""qwen35 / qwen35moe / qwen3next (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): gated delta net layers over a per-sequence
recurrent state and full-attention layers with an output gate, against the float64 reference (reference_qwen35.py),
and the recurrent state's rules (recurrent.c): what can and cannot be removed, copied, saved and restored.

The tiny files: model_files.QWEN35 (5 layers: 0, 2, 4 gated delta nets of 2 key and 4 value heads of 32, a conv of 4;
1 and 3 full attention, 4 heads of 32, 2 KV heads, rope over 8 dims; dense FFN 96, or 4 experts of 32 (2 per token)
and a gated shared expert of 64). Measured (seed 0): ours 4.4e-7 (qwen35), 7.2e-7 (qwen35moe, qwen3next) from the
reference in f32; each piece's absence moves the reference 1e-2 .. 0.6 from ours (test_each_piece_matters prints it)."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOAT_REL_RMS, check_level, emulated_offload, logits_all, logits_one_by_one, rel_rms
from model_files import QWEN35, rewrite, write_qwen35_model
from reference_model import ReferenceModel

import powerinfer as pi
from powerinfer._ffi import PowerInferError, ffi, lib
from powerinfer.gguf_file import ModelLoadError

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 5]
# Q8_0 / Q4_0 weights: 2.7e-2 .. 5.7e-2 from the reference, as llama.cpp is (its logits 0 .. 1.0e-2 from ours,
# tests/compat/test_qwen35_vs_llama_cpp.py): the 8-bit activations' rounding grows through the recurrence
QWEN35_QUANT_REL_RMS = 8e-2


@pytest.fixture(scope="module", params=ARCHS)
def q35(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("q35") / f"tiny-{request.param}.gguf"
    write_qwen35_model(path, request.param)
    return path


@pytest.mark.parametrize("level", ["scalar", "avx2", "avx512", "amx"])
def test_matches_the_reference_at_every_level(q35, level):
    """The prompt in one call and token by token (the recurrence one token per call) within FLOAT_REL_RMS of the
    reference at every ISA level, with the scalar level's bits."""
    check_level(q35, level, ReferenceModel(q35).forward(PROMPT), PROMPT, FLOAT_REL_RMS)


def test_hparams(q35):
    hp = pi.Model(q35).hparams
    assert [g.recurrent for g in hp.layer_geom] == [True, False, True, False, True]
    assert (hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank, hp.ssm_d_conv) == (32, 2, 4, 4)
    assert hp.attn_output_gate and hp.rope_mode == "neox" and hp.ssm_head_interleave == (hp.arch == "qwen3next")
    assert pi.Model(q35).recurrent


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized(tmp_path, dtype):
    for arch in ARCHS:
        f = tmp_path / f"{arch}-{dtype}.gguf"
        write_qwen35_model(f, arch, dtype=dtype)
        ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
        assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < QWEN35_QUANT_REL_RMS


def test_f16_kv_cache_and_calls_of_any_size(tmp_path):
    """The default f16 cache: within the f16 bound; the prompt in calls of 5 tokens gives the one-call logits'
    neighbourhood (the recurrence carries the state across calls)."""
    f = tmp_path / "q35.gguf"
    write_qwen35_model(f, "qwen35", seed=1)
    ref = ReferenceModel(f).forward(PROMPT)
    ctx = pi.Context(pi.Model(f), n_ctx=64, n_batch=5)
    assert rel_rms(logits_all(ctx, PROMPT), ref) < 3e-3


def test_each_piece_matters(tmp_path):
    """The reference without each piece is far from ours: the conv, the l2 norms of q and k, the decay, beta, the
    gated norm's RMS norm and its z gate, the attention's output gate; and with qwen35's tiled head map in a
    qwen3next file (and the other way round)."""
    for arch in ("qwen35", "qwen3next"):
        f = tmp_path / f"{arch}.gguf"
        write_qwen35_model(f, arch)
        ours = logits_all(pi.Context(pi.Model(f), n_ctx=64, kv_type="f32"), PROMPT)
        assert rel_rms(ours, ReferenceModel(f).forward(PROMPT)) < FLOAT_REL_RMS
        for piece in ("conv", "l2", "decay", "beta", "gate_norm", "z", "q_gate"):
            ref = ReferenceModel(f)
            ref.qwen35_drop = (piece,)
            err = rel_rms(ours, ref.forward(PROMPT))
            print(f"{arch} without {piece}: {err:.2e}")
            assert err > 1e-3, piece
        other = ReferenceModel(f)
        other.arch = "qwen35" if arch == "qwen3next" else "qwen3next"   # the other head map
        err = rel_rms(ours, other.forward(PROMPT))
        print(f"{arch} with the other head map: {err:.2e}")
        assert err > 1e-3


def test_two_sequences_in_one_batch(tmp_path):
    """Two prompts decoded together (their tokens interleaved in one batch, then a step of both): each sequence's
    logits are the reference's of its prompt alone (each its own recurrent state)."""
    for arch in ARCHS:
        f = tmp_path / f"{arch}.gguf"
        write_qwen35_model(f, arch, seed=2)
        a, b = PROMPT[:7], PROMPT[5:]
        ctx = pi.Context(pi.Model(f), n_ctx=64, kv_type="f32", n_seq_max=2)
        ctx.decode([t for pair in zip(a, b) for t in pair], pos=[p for i in range(7) for p in (i, i)],
                   seq_id=[0, 1] * 7, logits="all")
        got_a, got_b = (np.stack([ctx.logits(2 * i + s) for i in range(7)]) for s in (0, 1))
        ctx.decode([5, 6], pos=[7, 7], seq_id=[0, 1], logits="all")
        ref = ReferenceModel(f)
        assert rel_rms(np.vstack([got_a, ctx.logits(0)]), ref.forward(a + [5])) < FLOAT_REL_RMS
        assert rel_rms(np.vstack([got_b, ctx.logits(1)]), ref.forward(b + [6])) < FLOAT_REL_RMS
        solo = pi.Context(pi.Model(f), n_ctx=64, kv_type="f32")
        assert np.array_equal(logits_all(solo, b + [6])[-1], ctx.logits(1))   # the same bits as alone


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("q35s") / "tiny-qwen35.gguf"
    write_qwen35_model(path, "qwen35", seed=4)
    return path


def test_seq_rm_of_an_absorbed_tail_is_refused(tiny):
    """Removing a tail the recurrent state has absorbed raises and changes nothing; removing past the last position,
    or the whole sequence, works (the whole: the state is empty again and the sequence decodes from scratch)."""
    ctx = pi.Context(pi.Model(tiny), n_ctx=64, kv_type="f32")
    first = logits_all(ctx, PROMPT)
    assert ctx.recurrent_pos(0) == len(PROMPT) - 1
    with pytest.raises(PowerInferError, match="recurrent state has absorbed"):
        ctx.kv_seq_rm(0, 5, -1)
    with pytest.raises(PowerInferError, match="recurrent state"):
        ctx.kv_seq_rm(0, 0, 3)
    assert ctx.seq_pos_max(0) == len(PROMPT) - 1 and ctx.recurrent_pos(0) == len(PROMPT) - 1
    ctx.kv_seq_rm(0, len(PROMPT), -1)          # nothing absorbed there
    ctx.kv_seq_rm(0, 0, -1)
    assert ctx.recurrent_pos(0) == -1 and ctx.kv_used == 0
    assert np.array_equal(logits_all(ctx, PROMPT), first)
    ctx.kv_clear()
    assert ctx.recurrent_pos(0) == -1
    assert np.array_equal(logits_all(ctx, PROMPT), first)


def test_decoding_an_absorbed_position_is_refused(tiny):
    ctx = pi.Context(pi.Model(tiny), n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT)
    with pytest.raises(PowerInferError, match="absorbed"):
        ctx.decode([5], pos=[3])
    with pytest.raises(PowerInferError, match="absorbed"):   # within one batch: positions must ascend per sequence
        ctx.decode([5, 6], pos=[20, 20])
    assert ctx.recurrent_pos(0) == len(PROMPT) - 1 and ctx.seq_pos_max(0) == len(PROMPT) - 1


def test_aborted_decode_leaves_the_state(tiny):
    """A decode stopped by the abort callback (between layers: some recurrent layers done) leaves every state as it
    was: the next decode gives the uninterrupted logits."""
    model = pi.Model(tiny)
    want = logits_all(pi.Context(model, n_ctx=64, kv_type="f32"), PROMPT)
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT[:6])
    calls = []
    ctx.set_abort_callback(lambda: len(calls) > 3 or calls.append(1) or False)
    with pytest.raises(PowerInferError):
        ctx.decode(PROMPT[6:], logits="all")
    ctx.set_abort_callback(None)
    assert ctx.recurrent_pos(0) == 5
    ctx.decode(PROMPT[6:], logits="all")
    assert np.array_equal(np.stack([ctx.logits(i) for i in range(6)]), want[6:])


def test_seq_cp_copies_the_state(tiny):
    """A prompt decoded once and copied to sequence 1 continues there as it does in sequence 0 (the same bits); a
    partial copy is refused."""
    ctx = pi.Context(pi.Model(tiny), n_ctx=64, kv_type="f32", n_seq_max=2)
    ctx.decode(PROMPT)
    with pytest.raises(PowerInferError, match="whole"):
        ctx.kv_seq_cp(0, 1, 0, 4)
    ctx.kv_seq_cp(0, 1)
    assert ctx.recurrent_pos(1) == len(PROMPT) - 1
    with pytest.raises(PowerInferError, match="remove it first"):   # a destination with a state of its own
        ctx.kv_seq_cp(1, 0)
    n = len(PROMPT)
    ctx.decode([7, 7], pos=[n, n], seq_id=[0, 1], logits="all")
    assert np.array_equal(ctx.logits(0), ctx.logits(1))
    solo = pi.Context(pi.Model(tiny), n_ctx=64, kv_type="f32")
    assert np.array_equal(logits_all(solo, PROMPT + [7])[-1], ctx.logits(1))


def test_sequence_state_round_trip(tiny):
    """pi_kv_seq_state_get / _set carry the recurrent state: restored into another context (another sequence id), the
    continuation's logits are the uninterrupted run's bits; a partial state is refused; a restore into a sequence
    with state replaces it."""
    model = pi.Model(tiny)
    run = pi.Context(model, n_ctx=64, kv_type="f32")
    run.decode(PROMPT)
    want = logits_one_by_one(run, [9])[0]
    ctx = pi.Context(model, n_ctx=64, kv_type="f32")
    ctx.decode(PROMPT)
    with pytest.raises(PowerInferError, match="whole sequence"):
        ctx.kv_seq_state(0, 0, 5)
    state = ctx.kv_seq_state(0)
    assert list(pi.Context.kv_state_positions(state)) == list(range(len(PROMPT)))
    other = pi.Context(model, n_ctx=64, kv_type="f32", n_seq_max=2)
    other.kv_seq_set_state(1, state)
    assert other.recurrent_pos(1) == len(PROMPT) - 1 and other.seq_pos_max(1) == len(PROMPT) - 1
    other.decode([9], seq_id=1)
    assert np.array_equal(other.logits(0), want)
    other.decode([3, 4, 5], seq_id=0)           # a sequence with a state of its own: the restore replaces it
    other.kv_seq_set_state(0, state)             # (other cells than the first run's: within f32 rounding)
    assert other.recurrent_pos(0) == len(PROMPT) - 1 and other.seq_pos_max(0) == len(PROMPT) - 1
    other.decode([9], seq_id=0)
    assert rel_rms(other.logits(0), want) < FLOAT_REL_RMS
    with pytest.raises(PowerInferError):
        other.kv_seq_set_state(0, state[:-4])      # truncated: its recurrent part is short
    assert other.recurrent_pos(0) == len(PROMPT)    # (checked before anything changed)


def test_ssm_conv_op_against_float64():
    """pi_op_ssm_conv: the causal conv over [state; x] and the state's update, against float64, at every level."""
    rng = np.random.default_rng(0)
    T, C, K = 5, 24, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    for level in ("scalar", "avx2", "avx512"):
        if not pi.cpu_isa_supported(level):
            continue
        start = pi.cpu_isa()
        pi.set_cpu_isa(level)
        try:
            state = rng.standard_normal((K - 1, C)).astype(np.float32)
            xin = np.concatenate([state, x]).astype(np.float64)
            want = np.stack([(xin[t:t + K] * w.T).sum(0) for t in range(T)])
            out = np.zeros((T, C), np.float32)
            f = ffi.from_buffer
            assert lib.pi_op_ssm_conv(ffi.cast("float *", f(x)), T, C, K, ffi.cast("float *", f(w)),
                                      ffi.cast("float *", f(state)), ffi.cast("float *", f(out))) == 0
            assert rel_rms(out, want) < FLOAT_REL_RMS
            assert np.array_equal(state, xin[-(K - 1):].astype(np.float32))
        finally:
            pi.set_cpu_isa(start)


@pytest.mark.parametrize("interleave", [0, 1])
def test_gated_delta_net_op_against_float64(interleave):
    """pi_op_gated_delta_net over T tokens (state in place) against the recurrence in float64, the same bits at every
    level; H_v = 2 H_k so the head map matters."""
    rng = np.random.default_rng(interleave)
    T, Hk, Hv, S = 6, 2, 4, 32
    q = rng.standard_normal((T, Hk, S)).astype(np.float32) / np.float32(5)
    k = rng.standard_normal((T, Hk, S)).astype(np.float32) / np.float32(5)
    v = rng.standard_normal((T, Hv, S)).astype(np.float32)
    g = -rng.uniform(0, 1, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, Hv)).astype(np.float32)
    s0 = rng.standard_normal((Hv, S, S)).astype(np.float32)
    st = s0.astype(np.float64).transpose(0, 2, 1).copy()      # st[h][i][j] = S_h[i][j] (i over k)
    want = np.empty((T, Hv, S))
    for t in range(T):
        for h in range(Hv):
            kh = h // (Hv // Hk) if interleave else h % Hk
            st[h] *= np.exp(g[t, h])
            d = beta[t, h] * (v[t, h] - st[h].T @ k[t, kh])
            st[h] += np.outer(k[t, kh], d)
            want[t, h] = st[h].T @ q[t, kh] / np.sqrt(S)
    results = []
    for level in ("scalar", "avx2", "avx512"):
        if not pi.cpu_isa_supported(level):
            continue
        start = pi.cpu_isa()
        pi.set_cpu_isa(level)
        try:
            state, out = s0.copy(), np.zeros((T, Hv, S), np.float32)
            c = [ffi.cast("float *", ffi.from_buffer(a)) for a in (q, k, v, g, beta, state, out)]
            pool = ffi.new("pi_threadpool **")
            assert lib.pi_threadpool_create(2, pool) == 0
            try:
                assert lib.pi_op_gated_delta_net(pool[0], *c[:5], T, Hk, Hv, S, interleave, c[5], c[6]) == 0
            finally:
                lib.pi_threadpool_free(pool[0])
            assert rel_rms(out, want) < FLOAT_REL_RMS
            assert rel_rms(state.transpose(0, 2, 1), st) < FLOAT_REL_RMS
            results.append(out)
        finally:
            pi.set_cpu_isa(start)
    assert all(np.array_equal(r, results[0]) for r in results)
    assert lib.pi_op_gated_delta_net(ffi.NULL, *c[:5], T, 3, Hv, S, 0, c[5], c[6]) == lib.PI_ERR_INVALID_ARG


def _meta(arch, **kv):
    return {f"{arch}.{k}": v for k, v in kv.items()}


def test_bad_files(tmp_path):
    from gguf import GGUFValueType as VT
    src = tmp_path / "q35.gguf"
    write_qwen35_model(src, "qwen35")
    cases = {
        "mtp": ({"qwen35.nextn_predict_layers": (1, VT.UINT32)}, (), "MTP"),
        "no_state": ({"qwen35.ssm.state_size": None}, (), "ssm.state_size"),
        "bad_inner": ({"qwen35.ssm.inner_size": (100, VT.UINT32)}, (), "ssm_d_inner"),
        "no_conv": ({}, ("blk.0.ssm_conv1d.weight",), "ssm_conv1d"),
        "no_attention": ({"qwen35.full_attention_interval": (9, VT.UINT32)}, (), "without a full-attention layer"),
        "vision_rope": ({"qwen35.rope.dimension_sections": ([2, 0, 0, 2], VT.ARRAY, VT.INT32)}, (), "fourth"),
    }
    for name, (meta, drop, msg) in cases.items():
        dst = rewrite(src, tmp_path / f"{name}.gguf", meta=meta, drop=drop)
        with pytest.raises(ModelLoadError, match=msg):
            pi.Model(dst)
    legacy = rewrite(src, tmp_path / "legacy.gguf", extra={"blk.0.ssm_in.weight": (np.zeros((2, 64), np.float32), 0)})
    with pytest.raises(ModelLoadError, match="in_proj_qkvz"):
        pi.Model(legacy)
    assert QWEN35["n_layer"] == 5


def test_offload_is_refused_with_a_message(tmp_path):
    """-ngl on the emulated device: the context says these models run on the CPU only, and runs there with the CPU's
    bits."""
    f = tmp_path / "q35.gguf"
    write_qwen35_model(f, "qwen35moe")
    offloaded, same_bits, warnings = emulated_offload(f, PROMPT)
    assert not offloaded and same_bits
    assert "qwen35 / qwen35moe / qwen3next models run on the CPU only" in warnings, warnings


def test_bad_arguments(tiny):
    """The public functions of the recurrent state and the delta net's ops: NULL pointers and bad shapes are
    PI_ERR_INVALID_ARG with a message, on and off a pool; pi_recurrent_pos of nothing is -1."""
    buf = np.zeros(4096, np.float32)
    f = ffi.cast("float *", ffi.from_buffer(buf))
    n = ffi.NULL
    assert lib.pi_op_ssm_conv(n, 1, 4, 4, f, f, f) == lib.PI_ERR_INVALID_ARG
    assert lib.pi_op_ssm_conv(f, 0, 4, 4, f, f, f) == lib.PI_ERR_INVALID_ARG
    assert lib.pi_op_ssm_conv(f, 1, 4, 0, f, n, f) == lib.PI_ERR_INVALID_ARG
    assert b"pi_op_ssm_conv" in ffi.string(lib.pi_last_error())
    assert lib.pi_op_ssm_conv(f, 2, 4, 4, f, n, f) == lib.PI_OK           # no state: zeros before x
    pool = ffi.new("pi_threadpool **")
    assert lib.pi_threadpool_create(2, pool) == 0
    try:
        for p in (ffi.NULL, pool[0]):
            for i in range(7):
                args = [f] * 7
                args[i] = n
                assert lib.pi_op_gated_delta_net(p, *args[:5], 1, 1, 2, 4, 0, *args[5:]) == lib.PI_ERR_INVALID_ARG
            for shape in ((0, 1, 2, 4, 0), (1, 0, 2, 4, 0), (1, 2, 3, 4, 0), (1, 1, 2, 0, 0), (1, 1, 2, 4, 2)):
                assert lib.pi_op_gated_delta_net(p, f, f, f, f, f, *shape, f, f) == lib.PI_ERR_INVALID_ARG
            assert b"pi_op_gated_delta_net" in ffi.string(lib.pi_last_error())
    finally:
        lib.pi_threadpool_free(pool[0])
    assert lib.pi_recurrent_pos(ffi.NULL, 0) == -1
    ctx = pi.Context(pi.Model(tiny), n_ctx=16)
    assert ctx.recurrent_pos(0) == -1 and lib.pi_recurrent_pos(ctx._ptr, 5) == -1 and lib.pi_recurrent_pos(
        ctx._ptr, -1) == -1
