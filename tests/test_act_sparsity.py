"""Activation sparsity of dense SwiGLU / GeGLU files (tools/sparsify.py, CATS thresholds on |act(gate x)|):
the op with the gate given, files made by the tool, their levels, --dense, and errors."""
from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import powerinfer as pi  # noqa: E402
from powerinfer import act_sparsity  # noqa: E402
from powerinfer._ffi import ffi, lib  # noqa: E402
from test_sparse import _tensor, _weight  # noqa: E402
import helpers  # noqa: E402
from helpers import FLOAT_REL_RMS, QUANT_REL_RMS, rel_rms  # noqa: E402

import sparsify  # noqa: E402

DTYPES = ["f32", "f16", "q8_0", "q4_0"]
PROMPT = [1, 17, 200, 45, 3, 99, 128, 7, 300, 12, 64, 250, 31, 5]
# 40 tokens: at the amx level a batch through the sparse kernels gathers its rows on AMX tiles (sparse_ffn.c
# gather_tiles: two whole 16-token tiles) and the 8-token tail through the 8-row kernels
LONG_PROMPT = PROMPT + [2, 40, 77, 310, 150, 9, 11, 260, 33, 120, 180, 6, 71, 90, 210, 15, 48, 99, 280, 3, 66, 140, 8,
                        230, 19, 101]
# every channel through the sparse kernels (threshold 1e-30) against the dense FFN of the same file:
# f32/f16 sources transpose without loss (only the summation order differs); a q8_0 down_t is re-quantized
# from the dequantized matrix, and the dense down matmul quantizes its input h to 8 bits where the sparse
# axpy reads it in f32 (measured 3.2e-7, 2.5e-6, 0.012); q4_0 files run the down step from their own ffn_down
# (pi_sparse_pack's Q4_0C layout, h quantized as the dense path does), equal to dense up to the f32 summation
# order (measured 0: this model's 512 channels are one range, summed in the dense kernel's order)
# the same with the gate through ffn_gate_t (q4_0: ffn_gate's own blocks) too (measured 5.2e-6, 2.5e-6, 0.0125, 0)
GATE_T_REL_RMS = {"f32": 1e-5, "f16": 1e-4, "q8_0": 0.03, "q4_0": FLOAT_REL_RMS}
# bf16 (pi.bf16_dot()): the dense kernels round the activations to bf16 (vdpbf16ps's arithmetic, arch/bf16_dot.c),
# the sparse path's transposed copies add f32 activations times bf16 rows (0.0017 measured)
ALL_CHANNELS_REL_RMS = {"f32": 1e-5, "f16": 1e-4, "bf16": 0.005, "q8_0": 0.03, "q4_0": FLOAT_REL_RMS}


# batches through the sparse kernels, as one token goes (a batch then gives its tokens' bits one at a time); by
# default a batch of more than one token runs the level's selection over the dense kernels (test_batches_*)
GATHER = dict(sparse_gather_max=0)

logits_all = functools.partial(helpers.logits_all, clear=True)
logits_one_by_one = functools.partial(helpers.logits_one_by_one, clear=True)
logits_in_calls = functools.partial(helpers.logits_in_calls, clear=True)


@pytest.fixture(scope="module")
def sparse_files(tmp_path_factory):
    """{dtype: (dense path, gate-sparse path)}: a 2-layer SwiGLU llama per dtype, sparsified at 0.25 and 0.5
    (default 0.5) on data/heldout.txt."""
    from make_test_model import write_model
    d = tmp_path_factory.mktemp("act_sparse")
    out = {}
    for dtype in DTYPES:
        src, dst = d / f"m-{dtype}.gguf", d / f"m-{dtype}.sparse.gguf"
        write_model(src, dtype=dtype, n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, seed=3)
        down = "q4_0" if dtype == "q4_0" else "auto"
        assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.25,0.5", "-o", str(dst),
                              "--calib-tokens", "512", "--ctx", "128", "--eval-chunks", "0", "--down-type", down,
                              "--gate-input-scale", "1"]) == 0
        out[dtype] = (src, dst)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_architectures(tmp_path, arch):
    """qwen2 (biases, tied head), qwen3 (q/k norms) and gemma3 (GeGLU, post norms, sliding window) run sparse too: --dense is the
    input, every channel through the sparse kernels is the dense model up to f32 rounding, a level is sparse
    and its prompt equals token by token."""
    from model_files import write_arch_model
    src, dst = tmp_path / f"{arch}.gguf", tmp_path / f"{arch}.sparse.gguf"
    write_arch_model(src, arch, seed=4)
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(dst),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "0"]) == 0
    prompt = PROMPT[:12]
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), prompt)
    model = pi.Model(dst)
    assert np.array_equal(logits_all(pi.Context(model, n_ctx=64, dense=True), prompt), ref)
    # f32 summation order only, through 3-7 layers (measured 4e-6 llama, 1.1e-5 qwen2 and gemma3)
    every = pi.Context(model, n_ctx=64, sparse_threshold=1e-30, **GATHER)
    assert rel_rms(logits_all(every, prompt), ref) < FLOAT_REL_RMS * 10
    ctx = pi.Context(model, n_ctx=64, **GATHER)
    a = logits_all(ctx, prompt)
    active, total = ctx.sparse_stats()
    assert 0.3 < 1 - active.sum() / (total * len(active)) < 0.7
    assert np.array_equal(a, logits_one_by_one(ctx, prompt))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_architectures_with_attention_inputs(tmp_path, arch):
    """The attention's inputs sparse in qwen2 (q/k/v biases), qwen3 (q/k norms, head_dim != n_embd / n_head) and gemma3 (q/k norms, head_dim != n_embd / n_head,
    sliding window) too, Q4_0 matrices: --dense is the input, every entry read is the dense model up to f32
    rounding, a level reads about its share and its prompt equals token by token."""
    from model_files import write_arch_model
    src, dst = tmp_path / f"{arch}.gguf", tmp_path / f"{arch}.sparse.gguf"
    write_arch_model(src, arch, seed=4, dtype="q4_0")
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(dst),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "0", "--attn-input-scale", "1"]) == 0
    prompt = PROMPT[:12]
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), prompt)
    model = pi.Model(dst)
    n = model.hparams.n_layer
    assert model.attn_input_sparse
    assert np.array_equal(logits_all(pi.Context(model, n_ctx=64, dense=True), prompt), ref)
    ctx = pi.Context(model, n_ctx=64, sparse_threshold=0.0, **GATHER)
    ctx.set_attn_input_thresholds(np.full((2, n), 1e-30))
    assert rel_rms(logits_all(ctx, prompt), ref) < FLOAT_REL_RMS * 10
    ctx = pi.Context(model, n_ctx=64, **GATHER)
    ctx.sparse_stats_reset()
    a = logits_all(ctx, prompt)
    att, att_total = ctx.attn_input_stats()
    assert 0.3 < 1 - att.sum() / (att_total * n) < 0.7
    assert np.array_equal(a, logits_one_by_one(ctx, prompt))


# ------------------------------------------------------------------------------------------- the op
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("weighted", [False, True])
def test_op_with_the_gate_given_matches_numpy(dtype, act, weighted):
    """gate.data NULL: the scores are the gate's values; |act(g)| (times act_scale, the channel weights) >= t selects;
    h = act(g) * (up x)."""
    rng = np.random.default_rng(11)
    E, F, T = 64, 96, 6
    up, down_t = (rng.standard_normal((F, E)).astype(np.float32) / 8 for _ in range(2))
    weights = [_weight(up, dtype), _weight(down_t, dtype)]   # (tensor, dequantized, raw buffer): keep alive
    (tu, u, _), (td, d, _) = weights
    x = rng.standard_normal((T, E)).astype(np.float32)
    g = rng.standard_normal((T, F)).astype(np.float32)
    g64 = g.astype(np.float64)
    fn = {"silu": lambda v: v / (1 + np.exp(-v)),
          "gelu": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))}[act]
    threshold = 0.3
    scale = rng.uniform(0.2, 3.0, F).astype(np.float32) if weighted else np.ones(F, np.float32)
    mask = np.abs(fn(g64)) * scale >= threshold
    assert 0.2 < mask.mean() < 0.8
    out = np.zeros((T, E), np.float32)
    w = ffi.new("pi_sparse_ffn_weights *")
    w.up, w.down_t = tu[0], td[0]           # w.gate stays zero: the gate is given
    if weighted:
        w.act_scale = ffi.from_buffer("float[]", scale)
    n_active = ffi.new("int64_t *")
    pi_act = {"silu": lib.PI_ACT_SILU, "gelu": lib.PI_ACT_GELU}[act]
    st = lib.pi_op_sparse_ffn(ffi.NULL, w, pi_act, lib.PI_FFN_PAR, _tensor(x), _tensor(g), threshold, _tensor(out),
                              n_active)
    assert st == 0, ffi.string(lib.pi_last_error())
    assert n_active[0] == mask.sum()
    expected = np.where(mask, fn(g64) * (x.astype(np.float64) @ u.T), 0.0) @ d
    tol = FLOAT_REL_RMS * 10 if dtype in ("f32", "f16") else QUANT_REL_RMS
    assert rel_rms(out, expected) < tol


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_op_as_an_input_sparse_matmul_matches_numpy(dtype):
    """up and gate NULL (mode seq): h is the scores; out = sum over |h_i| >= t of h_i * w_t[i, :]."""
    rng = np.random.default_rng(12)
    n_in, n_out, T = 96, 160, 5
    w_t = rng.standard_normal((n_in, n_out)).astype(np.float32) / 8
    tw, wd, keep = _weight(w_t, dtype)
    h = rng.standard_normal((T, n_in)).astype(np.float32)
    threshold = 0.7
    mask = np.abs(h) >= threshold
    out = np.zeros((T, n_out), np.float32)
    w = ffi.new("pi_sparse_ffn_weights *")
    w.down_t = tw[0]
    n_active = ffi.new("int64_t *")
    st = lib.pi_op_sparse_ffn(ffi.NULL, w, lib.PI_ACT_SILU, lib.PI_FFN_SEQ, _tensor(h), _tensor(h), threshold,
                              _tensor(out), n_active)
    assert st == 0, ffi.string(lib.pi_last_error())
    assert n_active[0] == mask.sum()
    expected = np.where(mask, h.astype(np.float64), 0.0) @ wd
    assert rel_rms(out, expected) < FLOAT_REL_RMS * 10
    w.gate = tw[0]          # a gate with no up: refused
    assert lib.pi_op_sparse_ffn(ffi.NULL, w, lib.PI_ACT_SILU, lib.PI_FFN_SEQ, _tensor(h), _tensor(h), threshold,
                                _tensor(out), n_active) != 0


@pytest.mark.parametrize("act", ["silu", "gelu", None])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_mask_matches_numpy(act, weighted):
    """pi_op_sparse_mask (a level over the dense kernels): dst = src where |act(s)| * w >= t (act -1: |s| >= t), else
    +0, in place too; n_kept and the per-entry counts add the entries kept."""
    rng = np.random.default_rng(13)
    n, T = 300, 5                                   # a row longer than one 256-entry chunk
    s = rng.standard_normal((T, n)).astype(np.float32)
    src = rng.standard_normal((T, n)).astype(np.float32)
    fn = {"silu": lambda v: v / (1 + np.exp(-v)),
          "gelu": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))),
          None: lambda v: v}[act]
    w = rng.uniform(0.2, 3.0, n).astype(np.float32) if weighted else np.ones(n, np.float32)
    threshold = 0.3
    score = np.abs(fn(s.astype(np.float64))) * (w if act else 1.0)
    pi_act = {"silu": lib.PI_ACT_SILU, "gelu": lib.PI_ACT_GELU, None: -1}[act]
    weights = ffi.from_buffer("float[]", w) if weighted else ffi.NULL
    dst, n_kept, counts = np.full((T, n), np.nan, np.float32), ffi.new("int64_t *", 7), np.ones(n, np.int64)
    assert lib.pi_op_sparse_mask(ffi.NULL, _tensor(s), pi_act, weights, threshold, _tensor(src), _tensor(dst), n_kept,
                                 ffi.cast("int64_t *", counts.ctypes.data)) == 0, ffi.string(lib.pi_last_error())
    kept = dst != 0                                 # src has no zeros
    clear = np.abs(score - threshold) > 1e-5 * threshold   # the f32 activation may round the other way at the edge
    assert np.array_equal(kept[clear], (score >= threshold)[clear]) and 0.2 < kept.mean() < 0.8
    assert np.array_equal(dst, np.where(kept, src, np.float32(0))) and not np.signbit(dst[~kept]).any()
    assert n_kept[0] == 7 + kept.sum() and np.array_equal(counts, 1 + kept.sum(axis=0))
    same = src.copy()                               # in place: dst is src
    assert lib.pi_op_sparse_mask(ffi.NULL, _tensor(s), pi_act, weights, threshold, _tensor(same), _tensor(same),
                                 ffi.NULL, ffi.NULL) == 0
    assert np.array_equal(same, dst)
    for bad_act, bad_t in ((3, threshold), (-2, threshold), (pi_act, math.nan)):
        assert lib.pi_op_sparse_mask(ffi.NULL, _tensor(s), bad_act, weights, bad_t, _tensor(src), _tensor(dst),
                                     ffi.NULL, ffi.NULL) != 0
    assert lib.pi_op_sparse_mask(ffi.NULL, _tensor(s), pi_act, weights, threshold, _tensor(src[:, :200].copy()),
                                 _tensor(dst), ffi.NULL, ffi.NULL) != 0


# ------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_and_every_channel_kept_are_the_input_model_exactly(sparse_files, dtype):
    """--dense, and thresholds that keep every channel (-inf, 0), run the file's dense FFN: the input's bits."""
    src, dst = sparse_files[dtype]
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    model = pi.Model(dst)
    assert model.gate_sparse and not model.sparse
    for kw in (dict(dense=True), dict(sparse_threshold=-math.inf), dict(sparse_threshold=0.0)):
        got = logits_all(pi.Context(model, n_ctx=64, **kw), PROMPT)
        assert np.array_equal(got, ref), kw


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_channel_through_the_sparse_kernels_is_close_to_dense(sparse_files, dtype):
    src, dst = sparse_files[dtype]
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    ctx = pi.Context(pi.Model(dst), n_ctx=64, sparse_threshold=1e-30, **GATHER)
    got = logits_all(ctx, PROMPT)
    active, total = ctx.sparse_stats()
    assert active.sum() == total * len(active)      # every channel (SiLU of a random gate is never 0)
    assert rel_rms(got, ref) < ALL_CHANNELS_REL_RMS[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_gate_input_through_the_sparse_gate_is_close_to_dense(sparse_files, dtype):
    """ffn_gate_t (the gate transposed) with every input entry read, and every channel: close to dense."""
    src, dst = sparse_files[dtype]
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    ctx = pi.Context(pi.Model(dst), n_ctx=64, sparse_threshold=1e-30, **GATHER)
    ctx.set_gate_input_thresholds([1e-30, 1e-30])
    got = logits_all(ctx, PROMPT)
    inp, inp_total = ctx.gate_input_stats()
    assert inp.tolist() == [inp_total, inp_total]
    assert rel_rms(got, ref) < GATE_T_REL_RMS[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_levels_give_their_sparsity(sparse_files, dtype):
    """The stored levels skip about their share of the channels on the calibration text, and more for 0.5."""
    _, dst = sparse_files[dtype]
    model = pi.Model(dst)
    text = (ROOT / "data" / "heldout.txt").read_text()
    tokens = model.tokenizer.encode(text, add_special=False)[:128]
    measured = {}
    for level in (0.25, 0.5, None):        # None: the file's default (0.5)
        ctx = pi.Context(model, n_ctx=128, sparsity=level)
        ctx.decode(tokens, logits="none")
        active, total = ctx.sparse_stats()
        inp, inp_total = ctx.gate_input_stats()
        measured[level] = 1 - active.sum() / (total * len(active))
        measured[f"input {level}"] = 1 - inp.sum() / (inp_total * len(inp))
        assert ctx.sparsity == (0.5 if level is None else level)
    assert abs(measured[0.25] - 0.25) < 0.08 and abs(measured[0.5] - 0.5) < 0.08, measured
    assert abs(measured["input 0.25"] - 0.25) < 0.08 and abs(measured["input 0.5"] - 0.5) < 0.08, measured
    assert measured[None] == measured[0.5]


def test_window_defaults_to_the_training_context(tmp_path, capsys):
    """Without --ctx the calibration and the card use windows of min(512, the model's training context): a model
    trained on 128 positions is measured on 128-token windows, not on positions it never saw; an explicit --ctx
    beyond it is used as asked, with a warning."""
    from make_test_model import write_model
    src = tmp_path / "short.gguf"
    write_model(src, dtype="q4_0", n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, seed=3,
                n_ctx_train=128)
    common = [str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "--calib-tokens", "512",
              "--eval-chunks", "2", "--speed-tokens", "0"]
    assert sparsify.main(common + ["-o", str(tmp_path / "a.gguf")]) == 0
    card = (tmp_path / "a.gguf.card.md").read_text()
    assert "in windows of 128;" in card and "training context" not in capsys.readouterr().err
    assert sparsify.main(common + ["-o", str(tmp_path / "b.gguf"), "--ctx", "256"]) == 0
    assert "in windows of 256;" in (tmp_path / "b.gguf.card.md").read_text()
    assert "--ctx 256 is longer than the model's training context (128)" in capsys.readouterr().err


def test_channel_weights(sparse_files, tmp_path):
    """The tool writes each layer's blk.N.ffn_act_scale (mean |up x| over the layer's mean); weights of 1 give the
    unweighted selection's bits; the loader refuses weights that are NaN, negative or of the wrong shape."""
    import gguf
    src, dst = sparse_files["q4_0"]
    reader = gguf.GGUFReader(dst)
    scales = {t.name: np.array(t.data) for t in reader.tensors if t.name.endswith("ffn_act_scale")}
    assert sorted(scales) == ["blk.0.ffn_act_scale", "blk.1.ffn_act_scale"]
    for v in scales.values():
        assert v.shape == (512,) and v.dtype == np.float32 and abs(v.mean() - 1) < 1e-4 and v.std() > 0.05
    plain = tmp_path / "plain.gguf"
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(plain),
                          "--calib-tokens", "512", "--ctx", "128", "--eval-chunks", "0",
                          "--channel-weighting", "none"]) == 0
    assert not any(t.name.endswith("ffn_act_scale") for t in gguf.GGUFReader(plain).tensors)
    meta = act_sparsity.metadata([0.5], pi.Model(plain).sparsity_levels.thresholds, 0.5)

    def with_scales(path, values):
        sparsify.write_sparse(plain, path, 2, "auto", meta, False, False, act_scale=np.array(values, dtype=np.float32))
        return path
    ones = with_scales(tmp_path / "ones.gguf", np.ones((2, 512)))
    a = logits_all(pi.Context(pi.Model(plain), n_ctx=64), PROMPT)
    assert np.array_equal(a, logits_all(pi.Context(pi.Model(ones), n_ctx=64), PROMPT))
    half = np.ones((2, 512))
    half[:, ::2] = 0.0                     # weight 0: the channel never runs
    ctx = pi.Context(pi.Model(with_scales(tmp_path / "half.gguf", half)), n_ctx=64, sparse_threshold=1e-30, **GATHER)
    ctx.decode(PROMPT, logits="none")
    active, total = ctx.sparse_stats()
    assert np.all(active == total // 2), (active, total)
    for bad, words in ((np.nan, "is nan"), (-1.0, "is -1")):
        values = np.ones((2, 512))
        values[1, 7] = bad
        with pytest.raises(pi.ModelLoadError, match=f"blk.1.ffn_act_scale.*element 7 {words}.*finite"):
            pi.Model(with_scales(tmp_path / "bad.gguf", values))
    with pytest.raises(pi.ModelLoadError, match="ffn_act_scale' has shape \\[256\\], expected \\[512\\]"):
        pi.Model(with_scales(tmp_path / "short.gguf", np.ones((2, 256))))


def test_sparse_batch_equals_token_by_token_and_thread_counts(sparse_files):
    _, dst = sparse_files["q4_0"]
    model = pi.Model(dst)
    a = logits_all(pi.Context(model, n_ctx=64, n_threads=1, **GATHER), LONG_PROMPT)
    b = logits_one_by_one(pi.Context(model, n_ctx=64, n_threads=2, **GATHER), LONG_PROMPT)
    assert np.array_equal(a, b)
    dense = logits_all(pi.Context(model, n_ctx=64, dense=True), LONG_PROMPT)
    assert not np.array_equal(a, dense)      # the sparse level does change the result


@pytest.fixture(scope="module")
def attn_file(sparse_files, tmp_path_factory):
    """The q4_0 model sparsified with attention input thresholds too (TEAL on q/k/v's and wo's inputs)."""
    src, _ = sparse_files["q4_0"]
    dst = tmp_path_factory.mktemp("act_sparse_attn") / "m-q4_0.attn.gguf"
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.25,0.5", "-o", str(dst),
                          "--calib-tokens", "512", "--ctx", "128", "--eval-chunks", "0", "--gate-input-scale", "1",
                          "--attn-input-scale", "1"]) == 0
    return src, dst


def test_attention_inputs_every_entry_read_is_close_to_dense(attn_file):
    """q/k/v and wo by input (the file's Q4_0 quants and scales laid out by input) with every entry read: the dense
    matmuls up to the f32 summation order; thresholds 0 (and --dense, and an explicit channel threshold): the
    file's dense attention exactly."""
    src, dst = attn_file
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    model = pi.Model(dst)
    assert model.attn_input_sparse
    for kw in (dict(dense=True), dict(sparse_threshold=0.0)):
        assert np.array_equal(logits_all(pi.Context(model, n_ctx=64, **kw), PROMPT), ref), kw
    ctx = pi.Context(model, n_ctx=64, sparse_threshold=0.0, **GATHER)
    ctx.set_attn_input_thresholds(np.zeros((2, 2)))
    assert np.array_equal(logits_all(ctx, PROMPT), ref)
    ctx.set_attn_input_thresholds(np.full((2, 2), 1e-30))
    ctx.sparse_stats_reset()
    got = logits_all(ctx, PROMPT)
    att, att_total = ctx.attn_input_stats()
    # every nonzero entry: layer 0's input holds exact zeros (the Q4_0 embedding's zero quants), which add nothing
    assert att_total == len(PROMPT) * (256 + 256) and att[1] == att_total and 0.8 * att_total < att[0] < att_total
    assert rel_rms(got, ref) < FLOAT_REL_RMS   # measured 0: 256 inputs are one range, summed in the dense order
    ctx.set_attn_input_thresholds(np.array([[0.0, 0.0], [1e-30, 1e-30]]))   # wo alone input-sparse
    ctx.sparse_stats_reset()
    logits_all(ctx, PROMPT)
    only_wo, _ = ctx.attn_input_stats()
    assert np.all(only_wo >= len(PROMPT) * 256) and only_wo[1] == att_total, only_wo   # dense q/k/v: all read
    with pytest.raises(ValueError, match="expected \\[2, 2\\]"):
        ctx.set_attn_input_thresholds([0.1, 0.1])
    with pytest.raises(pi.PowerInferError, match="NaN"):
        ctx.set_attn_input_thresholds(np.full((2, 2), np.nan))


def test_attention_levels_give_their_sparsity_and_batches_equal_tokens(attn_file):
    """The stored levels skip about their share of the attention's input and output entries; a prompt's logits are
    its tokens' one by one, at any thread count; the attention inputs change the result."""
    _, dst = attn_file
    model = pi.Model(dst)
    text = (ROOT / "data" / "heldout.txt").read_text()
    tokens = model.tokenizer.encode(text, add_special=False)[:128]
    for level in (0.25, 0.5):
        ctx = pi.Context(model, n_ctx=128, sparsity=level)
        assert ctx.attn_thresholds.shape == (2, 2) and np.all(ctx.attn_thresholds > 0)
        ctx.decode(tokens, logits="none")
        att, att_total = ctx.attn_input_stats()
        assert abs(1 - att.sum() / (att_total * len(att)) - level) < 0.08, (level, att, att_total)
    a = logits_all(pi.Context(model, n_ctx=64, n_threads=1, **GATHER), PROMPT)
    b = logits_one_by_one(pi.Context(model, n_ctx=64, n_threads=2, **GATHER), PROMPT)
    assert np.array_equal(a, b)
    ctx = pi.Context(model, n_ctx=64, **GATHER)
    ctx.set_attn_input_thresholds(None)
    assert not np.array_equal(a, logits_all(ctx, PROMPT))


def test_level_runs_apply_their_kinds_of_thresholds(attn_file):
    """act_sparsity.level_runs names a file's runs (dense, L, L+in, L+in+attn per level), level_context applies just
    those thresholds (the bench and the model card's decode column run them), decode_speeds reports each run's read
    shares (no timing asserted)."""
    _, dst = attn_file
    model = pi.Model(dst)
    runs = act_sparsity.level_runs(model.sparsity_levels)
    assert [r.name for r in runs] == ["dense", "0.25", "0.25+in", "0.25+in+attn", "0.5", "0.5+in", "0.5+in+attn"]
    assert [r.name for r in act_sparsity.level_runs(model.sparsity_levels, [0.5])][1:] == ["0.5", "0.5+in",
                                                                                          "0.5+in+attn"]
    with pytest.raises(ValueError, match="not stored"):
        act_sparsity.level_runs(model.sparsity_levels, [0.4])
    ctxs = {r.name: act_sparsity.level_context(model, r, n_ctx=64, n_threads=1) for r in runs[:4]}
    assert not ctxs["dense"].sparse
    assert ctxs["0.25"].input_thresholds is None and ctxs["0.25"].attn_thresholds is None
    assert ctxs["0.25+in"].input_thresholds is not None and ctxs["0.25+in"].attn_thresholds is None
    assert ctxs["0.25+in+attn"].input_thresholds is not None and ctxs["0.25+in+attn"].attn_thresholds is not None
    got = act_sparsity.decode_speeds(ctxs, model.n_vocab, n_gen=4, repeat=1)
    assert list(got) == list(ctxs) and all(med > 0 and len(each) == 1 for med, each, _ in got.values())
    assert got["dense"][2] == (1.0, 1.0, 1.0)
    ch, inp, att = got["0.25"][2]
    assert 0.5 < ch < 0.95 and inp == 1.0 and att == 1.0
    ch, inp, att = got["0.25+in+attn"][2]
    assert 0.5 < ch < 0.95 and 0.5 < inp < 0.95 and 0.5 < att < 0.95


def test_model_card_with_gate_and_attention_inputs(sparse_files, tmp_path):
    """The card's rows for gate inputs and attention inputs, their measured shares, and every level's thresholds
    (the card once crashed on files with gate inputs)."""
    src, _ = sparse_files["q4_0"]
    out = tmp_path / "card.gguf"
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(out),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "2", "--gate-input-scale", "1",
                          "--attn-input-scale", "1"]) == 0
    card = (tmp_path / "card.gguf.card.md").read_text()
    rows = {r.split(" | ")[0][2:]: r.split(" | ") for r in card.splitlines() if r.startswith("| ")}
    both = rows["sparsity 0.5 + gate input + attention inputs"]
    assert abs(float(both[2].rstrip("%")) - 50) < 10 and abs(float(both[3].rstrip("%")) - 50) < 10, both
    assert rows["sparsity 0.5 + gate input"][3] == "0.0%"
    assert "  gate input: " in card and "  attention input: " in card and "  attention output: " in card


def test_sparse_batch_max_runs_prompts_dense(attn_file):
    """sparse_batch_max: decode calls of more tokens run the dense model exactly (FFN, gate and attention), calls
    within it the level; the one-token steps after a dense prompt are sparse."""
    src, dst = attn_file
    dense = pi.Context(pi.Model(src), n_ctx=64)
    ref = logits_all(dense, PROMPT)
    model = pi.Model(dst)
    ctx = pi.Context(model, n_ctx=64, sparse_batch_max=4)
    assert "more than 4 tokens" in act_sparsity.describe(ctx)
    ctx.sparse_stats_reset()
    assert np.array_equal(logits_all(ctx, PROMPT), ref)          # one call of 14 tokens: dense
    att, att_total = ctx.attn_input_stats()
    assert np.all(att == att_total)                              # the dense attention reads every entry
    ctx.decode([PROMPT[0]], logits="last")                        # 1 token after the dense prompt: sparse
    dense.decode([PROMPT[0]], logits="last")
    assert not np.array_equal(ctx.logits(0), dense.logits(0))
    level = logits_all(pi.Context(model, n_ctx=64), PROMPT[:4])  # a call of 4: the level, as without the limit
    assert np.array_equal(logits_all(ctx, PROMPT[:4]), level)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="sparse_batch_max"):
            pi.Context(model, n_ctx=64, sparse_batch_max=bad)


def test_batches_apply_the_level_to_the_dense_kernels(attn_file):
    """A call of more than sparse_gather_max tokens (default 1) zeroes the gate and attention inputs and the channels
    the level leaves out and runs the dense kernels: with every entry kept the dense model's bits; at a level the
    same bits in calls of any size beyond the limit (the dense kernels' order does not depend on the batch), about the
    entries the sparse kernels keep and their logits up to rounding (measured 3e-7: this Q4_0 file's sparse steps
    read its own quants); calls within the limit run the sparse kernels."""
    src, dst = attn_file
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    model = pi.Model(dst)
    ctx = pi.Context(model, n_ctx=64, sparse_threshold=1e-30)
    ctx.set_gate_input_thresholds([1e-30, 1e-30])
    ctx.set_attn_input_thresholds(np.full((2, 2), 1e-30))
    assert np.array_equal(logits_all(ctx, PROMPT), ref)
    masked, gather = (pi.Context(model, n_ctx=64, count_neurons=True, **kw) for kw in ({}, GATHER))
    assert masked.sparse_gather_max == 1
    out, stats = {}, {}
    for name, ctx, n in (("batch", masked, len(PROMPT)), ("pairs", masked, 2), ("gather", gather, len(PROMPT))):
        ctx.sparse_stats_reset()
        out[name] = logits_in_calls(ctx, PROMPT, n)
        stats[name] = np.stack([ctx.sparse_stats()[0], ctx.gate_input_stats()[0], ctx.attn_input_stats()[0]])
    assert np.array_equal(out["batch"], out["pairs"]) and np.array_equal(stats["batch"], stats["pairs"])
    assert np.all(np.abs(stats["batch"] - stats["gather"]) <= 0.01 * stats["gather"]), stats
    counts = masked.neuron_counts(), gather.neuron_counts()     # since the last reset: one PROMPT each
    assert np.abs(counts[0] - counts[1]).sum() <= 0.01 * counts[1].sum() and counts[1].sum() > 0, counts
    assert np.all(stats["batch"] < 0.8 * np.array([[512], [256], [512]]) * len(PROMPT)), stats["batch"]
    assert rel_rms(out["batch"], out["gather"]) < FLOAT_REL_RMS * 10
    assert rel_rms(out["batch"], ref) > 0.01                      # the level does change the result
    ctx = pi.Context(model, n_ctx=64, sparse_gather_max=4)
    assert np.array_equal(logits_all(ctx, PROMPT[:4]), logits_one_by_one(gather, PROMPT[:4]))
    assert np.array_equal(logits_all(ctx, PROMPT[:5]), logits_in_calls(masked, PROMPT[:5], 5))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="sparse_gather_max"):
            pi.Context(model, n_ctx=64, sparse_gather_max=bad)


def test_attention_inputs_need_a_column_layout(sparse_files, tmp_path):
    src, _ = sparse_files["f16"]
    with pytest.raises(SystemExit, match="attn_q.weight has ggml type 1"):
        sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "-o", str(tmp_path / "o.gguf"),
                       "--attn-input-scale", "1"])
    with pytest.raises(SystemExit, match="scale x level < 1"):
        sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "-o", str(tmp_path / "o.gguf"),
                       "--attn-input-scale", "2"])


def every_channel_error(model, ref):
    """rel. RMS of the 2-layer model's logits with every channel and gate input kept, against ref."""
    ctx = pi.Context(model, n_ctx=64, sparse_threshold=1e-30, **GATHER)
    ctx.set_gate_input_thresholds([1e-30, 1e-30])
    return rel_rms(logits_all(ctx, PROMPT), ref)


def test_packed_down_step_is_the_files_own_down_matrix(sparse_files):
    """At load a Q4_0 file's up rows are packed per channel with its ffn_down laid out by channel (arch/q4_0c.c: the
    file's quants and scales, nothing re-quantized), and ffn_gate for the input-sparse gate: with every channel and
    gate input kept the packed model is the dense one up to f32 summation order, where the file layout (ffn_down_t
    and ffn_gate_t, re-quantized by the tool, added by f32 axpy) is not (measured 0.049 and 0.069)."""
    src, dst = sparse_files["q4_0"]
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    packed, plain = pi.Model(dst), pi.Model(dst, repack=False)
    assert packed.n_packed_ffn == 2 and plain.n_packed_ffn == 0
    errors = [every_channel_error(model, ref) for model in (packed, plain)]
    assert errors[0] < FLOAT_REL_RMS and errors[1] > 0.01, errors
    # at the file's default level both select nearly the same channels
    ca, cb = pi.Context(packed, n_ctx=64, **GATHER), pi.Context(plain, n_ctx=64)
    logits_all(ca, PROMPT), logits_all(cb, PROMPT)
    na, nb = ca.sparse_stats()[0], cb.sparse_stats()[0]
    assert np.abs(na - nb).max() <= 0.02 * nb.max()


def test_packed_down_step_with_the_up_rows_in_the_file(tmp_path):
    """n_embd 192: the up rows have no packed layout (Q4_0R wants a multiple of 256) and stay in the file's, the down
    step and the input-sparse gate (64 is enough) are packed from the file's own matrices: with every channel and
    gate input kept, dense up to f32 summation order (measured 0; the file layout 0.071)."""
    from make_test_model import write_model
    src, dst = tmp_path / "m.gguf", tmp_path / "m.sparse.gguf"
    write_model(src, dtype="q4_0", n_vocab=320, n_embd=192, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, seed=3)
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(dst),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "0", "--down-type", "q4_0",
                          "--gate-input-scale", "1"]) == 0
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    model = pi.Model(dst)
    assert model.n_packed_ffn == 2
    ctx = pi.Context(model, n_ctx=64, sparse_threshold=1e-30, **GATHER)
    ctx.set_gate_input_thresholds([1e-30, 1e-30])
    assert rel_rms(logits_all(ctx, PROMPT), ref) < FLOAT_REL_RMS
    ctx = pi.Context(model, n_ctx=64, **GATHER)
    assert np.array_equal(logits_all(ctx, PROMPT), logits_one_by_one(ctx, PROMPT))


def every_level_gives_the_scalar_bits(path, is_sparse):
    """The file's default level at every ISA level this CPU runs: a batch through the sparse kernels gives the
    one-by-one bits, is_sparse(ctx) holds after it, and every level gives the scalar level's bits, for the batch
    through the dense kernels too."""
    before, out = pi.cpu_isa(), {}
    try:
        for level in [lv for lv in pi.CPU_ISA_LEVELS if pi.cpu_isa_supported(lv)]:
            pi.set_cpu_isa(level)
            model = pi.Model(path)
            ctx = pi.Context(model, n_ctx=64, **GATHER)
            out[level] = logits_all(ctx, LONG_PROMPT)
            assert np.array_equal(out[level], logits_one_by_one(ctx, LONG_PROMPT)), level
            assert is_sparse(ctx), level
            out[level, "masked"] = logits_all(pi.Context(model, n_ctx=64), LONG_PROMPT)
    finally:
        pi.set_cpu_isa(before)
    for key, got in out.items():
        assert np.array_equal(got, out["scalar", "masked"] if "masked" in key else out["scalar"]), key


def _ffn_model(path, type_of):
    """The 2-layer test llama (n_embd 256, n_ff 512) with its FFN matrices in the llama.cpp type type_of(name) (a
    GGMLQuantizationType name, quantized by the core's quantizer), the rest f32."""
    from gguf import GGMLQuantizationType, GGUFReader
    from make_test_model import write_model
    from model_files import rewrite

    def quantized(w, name):
        t = int(GGMLQuantizationType[name])
        w = np.ascontiguousarray(w, np.float32)
        raw = np.zeros((w.shape[0], lib.pi_row_bytes(t, w.shape[1])), np.uint8)
        for r in range(w.shape[0]):
            assert lib.pi_quantize_row(t, ffi.cast("float *", w[r].ctypes.data),
                                       ffi.cast("void *", raw[r].ctypes.data), w.shape[1]) == 0
        return raw, GGMLQuantizationType[name]
    f32 = path.with_suffix(".f32.gguf")
    write_model(f32, dtype="f32", n_vocab=320, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_layer=2, seed=3)
    ffn = {t.name: quantized(np.array(t.data), type_of(t.name)) for t in GGUFReader(f32).tensors
           if t.name.split(".")[-2] in ("ffn_gate", "ffn_up", "ffn_down")}
    return rewrite(f32, path, replace=ffn)


def _q4_k_ffn_model(path):
    """The test llama with its FFN matrices in Q4_K, layer 0's ffn_down in Q6_K: what matters of a llama.cpp Q4_K_M
    file here."""
    return _ffn_model(path, lambda name: "Q6_K" if name == "blk.0.ffn_down.weight" else "Q4_K")


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "BF16"])
def test_ffn_types_run_sparse(tmp_path, qtype):
    """FFN matrices in the types DTYPES and the Q4_K_M test leave out (the tool writes q8_0 ffn_down_t / ffn_gate_t
    for them, bf16 ones for BF16; Q6_K is laid out by channel at load): --dense and every channel kept by threshold are
    the input's bits; every channel and gate input through the sparse kernels is the dense model up to the q8_0
    copies' rounding (measured: Q4_1, Q5_0, Q5_1 0.0087-0.0088, Q2_K 0.0133, Q3_K 0.0118, Q5_K 0.0090; BF16 3e-6 with
    f32 activations, 0.0017 with pi.bf16_dot()'s bf16 ones against the copies' f32 ones; Q6_K 0, laid out by channel); a level gives the scalar level's bits at every
    level and a batch the one-by-one bits."""
    src, dst = _ffn_model(tmp_path / "m.gguf", lambda name: qtype), tmp_path / "m.sparse.gguf"
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(dst),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "0", "--gate-input-scale", "1",
                          "--speed-tokens", "0"]) == 0
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    model = pi.Model(dst)
    for kw in (dict(dense=True), dict(sparse_threshold=-math.inf)):
        assert np.array_equal(logits_all(pi.Context(model, n_ctx=64, **kw), PROMPT), ref), kw
    err = every_channel_error(model, ref)
    bound = {"Q6_K": 0.0, "BF16": ALL_CHANNELS_REL_RMS["bf16" if pi.bf16_dot() else "f16"]}.get(qtype, ALL_CHANNELS_REL_RMS["q8_0"])
    assert err <= bound, err
    def channels_sparse(ctx):
        active, total = ctx.sparse_stats()
        return active.sum() < 0.8 * total * len(active)
    every_level_gives_the_scalar_bits(dst, channels_sparse)


def test_packed_down_step_from_a_q4_k_m_file(tmp_path):
    """A Q4_K_M-like file's ffn_down (Q4_K, Q6_K) and ffn_gate (the input-sparse gate) are packed at load by channel
    from their own quants and scales (arch/kc.c), h quantized as the dense path quantizes it: with every channel and
    gate input kept, the dense model up to f32 summation order (measured 0). The tool writes no transposed copy of
    them (the sparse file is the input's tensors plus metadata), so no_repack packs them too; asked for q8_0 copies
    (--down-type q8_0) it writes them, and no_repack reads those, which are not the dense model. Every level gives
    the same bits, a batch the one-by-one bits."""
    from gguf import GGUFReader
    src, dst = _q4_k_ffn_model(tmp_path / "m.gguf"), tmp_path / "m.sparse.gguf"
    copies = tmp_path / "m.copies.sparse.gguf"
    for out_path, down in ((dst, "auto"), (copies, "q8_0")):
        assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.5", "-o", str(out_path),
                              "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "0", "--gate-input-scale", "1",
                              "--down-type", down]) == 0
    names = [t.name for t in GGUFReader(dst).tensors]
    assert names == [t.name for t in GGUFReader(src).tensors] + [f"blk.{il}.ffn_act_scale" for il in range(2)]
    # nothing transposed: the input's tensors and the channel weights
    assert sum(t.name.endswith(("ffn_down_t.weight", "ffn_gate_t.weight")) for t in GGUFReader(copies).tensors) == 4
    ref = logits_all(pi.Context(pi.Model(src), n_ctx=64), PROMPT)
    packed, no_repack = pi.Model(dst), pi.Model(dst, repack=False)
    assert packed.gate_input_sparse and packed.n_packed_ffn == 2 and no_repack.n_packed_ffn == 2
    with_copies, plain = pi.Model(copies), pi.Model(copies, repack=False)
    assert with_copies.n_packed_ffn == 2 and plain.n_packed_ffn == 0
    errors = [every_channel_error(model, ref) for model in (packed, no_repack, with_copies, plain)]
    assert errors[:3] == [0, 0, 0] and errors[3] > 0.002, errors
    def gate_input_sparse(ctx):
        read, total = ctx.gate_input_stats()
        return read.sum() < 0.8 * total * 2
    every_level_gives_the_scalar_bits(dst, gate_input_sparse)


def test_isa_levels_give_the_scalar_bits(sparse_files):
    _, dst = sparse_files["q4_0"]
    before = pi.cpu_isa()
    out = {}
    try:
        for level in [lv for lv in pi.CPU_ISA_LEVELS if pi.cpu_isa_supported(lv)]:
            pi.set_cpu_isa(level)
            out[level] = logits_all(pi.Context(pi.Model(dst), n_ctx=64, **GATHER), LONG_PROMPT)
    finally:
        pi.set_cpu_isa(before)
    for level, got in out.items():
        assert np.array_equal(got, out["scalar"]), level


def test_thresholds_per_layer_and_histogram(sparse_files):
    src, dst = sparse_files["f32"]
    model = pi.Model(dst)
    ctx = pi.Context(model, n_ctx=64, dense=True, act_histogram=True)
    ctx.decode(PROMPT, logits="none")
    hist, edges = ctx.act_histogram()
    assert hist.shape == (2, 4, lib.PI_ACT_HIST_BINS)   # per layer: |act(gate)|, FFN input, attention input, output
    assert np.all(hist[:, 0].sum(axis=1) == len(PROMPT) * 512) and np.all(hist[:, 1].sum(axis=1) == len(PROMPT) * 256)
    assert np.all(hist[:, 2].sum(axis=1) == len(PROMPT) * 256) and np.all(hist[:, 3].sum(axis=1) == len(PROMPT) * 256)
    assert edges[0] == 0 and np.all(np.diff(edges) > 0)
    ctx = pi.Context(model, n_ctx=64)
    ctx.set_sparse_thresholds([0.0, 1e9])          # layer 0 dense, layer 1 nothing
    ctx.decode(PROMPT, logits="none")
    active, total = ctx.sparse_stats()
    assert active.tolist() == [total, 0]
    with pytest.raises(pi.PowerInferError, match="NaN"):
        ctx.set_sparse_thresholds([0.1, math.nan])
    with pytest.raises(ValueError, match="layers"):
        ctx.set_sparse_thresholds([0.1])


def test_thresholds_from_histogram():
    edges = np.array([sparsify_edge(b) for b in range(lib.PI_ACT_HIST_BINS)], dtype=np.float32)
    rng = np.random.default_rng(0)
    v = np.abs(rng.standard_normal(200000)).astype(np.float32)
    bins = np.searchsorted(edges, v, side="right") - 1
    hist = np.bincount(bins, minlength=len(edges))[None, :]
    for level in (0.25, 0.5, 0.9):
        t = sparsify.thresholds_from_histogram(hist, edges, level)[0]
        assert abs((v < t).mean() - level) < 0.01
    # --allocation energy: one threshold relative to each layer's RMS, the mean sparsity at the level
    w = np.abs(rng.standard_normal(200000) ** 3).astype(np.float32) * 4     # a heavier-tailed, wider layer
    hist2 = np.stack([hist[0], np.bincount(np.searchsorted(edges, w, side="right") - 1, minlength=len(edges))])
    for level in (0.3, 0.5):
        t = sparsify.thresholds_by_energy(hist2, edges, level)
        skipped = [(v < t[0]).mean(), (w < t[1]).mean()]
        assert abs(np.mean(skipped) - level) < 0.01, skipped
        rms = [np.sqrt(np.mean(a.astype(np.float64) ** 2)) for a in (v, w)]
        assert abs(t[0] / rms[0] - t[1] / rms[1]) < 0.05 * t[0] / rms[0]    # (the rms from the bins: ~1%)


def test_allocation_by_sensitivity():
    """The greedy allocation: the mean sparsity is the level, cheap layers give more, a layer whose cost jumps
    early stays dense, and costs measured non-monotone (noise) are treated as monotone."""
    grid = np.array(sparsify.SENSITIVITY_GRID)
    kl = np.stack([grid ** 2 * 0.01,                 # cheap
                   grid ** 2 * 0.1,                  # ten times dearer
                   np.full_like(grid, 5.0),          # dear from the first step
                   grid ** 2 * 0.01 * np.where(grid == 0.5, 0.5, 1.0)])   # noisy: a dip at 0.5
    for level in (0.1, 0.25, 0.5):
        s = sparsify.allocate_by_sensitivity(kl, level)
        assert abs(s.mean() - level) < 1e-9, s
        assert s[0] >= s[1] and s[2] == 0.0 and np.all((s >= 0) & (s <= grid[-1])), s
    assert sparsify.allocate_by_sensitivity(kl, 0.0).tolist() == [0.0] * 4
    top = sparsify.allocate_by_sensitivity(kl, 1.0)               # beyond the grid: every layer at its top
    assert np.allclose(top, grid[-1])


def test_allocation_by_sensitivity_end_to_end(sparse_files, tmp_path):
    """--allocation sensitivity measures each layer alone and stores thresholds whose mean sparsity is the level."""
    src, _ = sparse_files["f32"]
    out = tmp_path / "sens.gguf"
    heldout = ROOT / "data" / "heldout.txt"
    assert sparsify.main([str(src), str(heldout), "--sparsity", "0.4", "-o", str(out), "--calib-tokens", "256",
                          "--ctx", "64", "--eval-chunks", "0", "--allocation", "sensitivity"]) == 0
    measured = skipped(on_calibration_tokens(out).sparse_stats)
    assert abs(measured - 0.4) < 0.05, measured   # the calibration tokens: their own quantiles
    assert np.allclose(pi.Model(out).sparsity_levels.levels, [0.4])


def on_calibration_tokens(path) -> pi.Context:
    """A context of the file at its default level that has decoded the 256 calibration tokens (windows of 64)."""
    model = pi.Model(path)
    ctx = pi.Context(model, n_ctx=64, n_threads=1)
    toks = model.tokenizer.encode((ROOT / "data" / "heldout.txt").read_text(), add_special=False)[:256]
    for s in range(0, 256, 64):
        ctx.kv_clear()
        ctx.decode(toks[s:s + 64], logits="none")
    return ctx


def skipped(stats) -> float:
    """The share skipped from a (active[n_layer], total) statistic."""
    active, total = stats()
    return 1.0 - float(active.sum()) / (total * len(active))


def test_allocation_by_sensitivity_of_every_kind(sparse_files, tmp_path):
    """With gate and attention inputs, --allocation sensitivity allocates each kind per layer (its own measurements):
    each kind's mean sparsity on the calibration tokens is its level."""
    src, _ = sparse_files["q4_0"]
    out = tmp_path / "sens.gguf"
    heldout = ROOT / "data" / "heldout.txt"
    assert sparsify.main([str(src), str(heldout), "--sparsity", "0.4", "-o", str(out), "--calib-tokens", "256",
                          "--ctx", "64", "--eval-chunks", "0", "--allocation", "sensitivity", "--gate-input-scale", "1",
                          "--attn-input-scale", "0.5"]) == 0
    ctx = on_calibration_tokens(out)
    for stats, level in ((ctx.sparse_stats, 0.4), (ctx.gate_input_stats, 0.4), (ctx.attn_input_stats, 0.2)):
        assert abs(skipped(stats) - level) < 0.06, (stats.__name__, skipped(stats), level)
    uniform = tmp_path / "uniform.gguf"   # the same levels, the same share in every layer
    assert sparsify.main([str(src), str(heldout), "--sparsity", "0.4", "-o", str(uniform), "--calib-tokens", "256",
                          "--ctx", "64", "--eval-chunks", "0", "--gate-input-scale", "1",
                          "--attn-input-scale", "0.5"]) == 0
    a, b = pi.Model(out).sparsity_levels, pi.Model(uniform).sparsity_levels
    assert not np.allclose(a.input_thresholds_for(0.4), b.input_thresholds_for(0.4))   # here 0.35 / 0.45


def sparsify_edge(b):
    return lib.pi_act_histogram_edge(b)


def test_model_card_with_one_window(sparse_files, tmp_path):
    """--eval-chunks 1: the levels are scored on the dense run's one window (its KL base; they once needed two and
    the tool died with a traceback after writing the file)."""
    src, _ = sparse_files["f32"]
    out = tmp_path / "one.gguf"
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.3", "-o", str(out),
                          "--calib-tokens", "256", "--ctx", "64", "--eval-chunks", "1", "--speed-tokens", "0"]) == 0
    rows = [line for line in (tmp_path / "one.gguf.card.md").read_text().splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows][-1] == "| sparsity 0.3"


def test_model_card(sparse_files, tmp_path, capsys):
    """The tool's evaluation: dense PPL equal to perplexity() of the input, every level's row, the card file."""
    from powerinfer.perplexity import perplexity
    src, _ = sparse_files["f32"]
    out = tmp_path / "card.gguf"
    heldout = ROOT / "data" / "heldout.txt"
    assert sparsify.main([str(src), str(heldout), "--sparsity", "0.3", "-o", str(out), "--calib-tokens", "256",
                          "--ctx", "64", "--eval-chunks", "2"]) == 0
    card = (tmp_path / "card.gguf.card.md").read_text()
    assert card in capsys.readouterr().out
    rows = [line for line in card.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == [
        "| dense (input file)", "| every channel through the sparse kernels (the down step's layout alone)",
        "| sparsity 0.3"]
    held = pi.Model(src).tokenizer.encode(heldout.read_text(), add_special=False)[256:]
    dense = perplexity(pi.Model(src), held, n_ctx=64, chunks=2)
    assert f"| {dense.ppl:.4f} |" in rows[0]
    assert "| 0.0% |" in rows[1]                 # f32: down_t is exact, every channel runs
    measured = float(rows[2].split(" | ")[1].rstrip("%")) / 100
    assert 0.2 < measured < 0.4
    # the decode-bytes column: the dense bytes, and each level's from its measured share of channels
    parts = act_sparsity.decode_bytes(pi.Model(out).file.tensors)
    assert min(parts[k] for k in ("attn", "out", "gate", "up", "down", "down_t")) > 0 and parts["gate_t"] == 0
    dense_b = act_sparsity.dense_bytes(parts)
    assert f"| {dense_b / 2**20:.1f} MiB (1x) |" in rows[0]
    level_b = act_sparsity.level_bytes(parts, 1.0 - measured)   # measured as printed: rounded to 0.1%
    bound = float(rows[2].split(" | ")[8].rsplit("(", 1)[1].split("x)")[0])
    assert bound == pytest.approx(dense_b / level_b, abs=0.005)
    assert 1.0 < bound < dense_b / (parts["attn"] + parts["out"] + parts["gate"])
    # the decode t/s column: measured for the dense model and the level (x dense: their ratio), not for the layout row
    speeds = [r.rstrip(" |").split(" | ")[-1] for r in rows]
    assert speeds[1] == "-"
    (dense_tps, one), (level_tps, ratio) = [(float(v.split(" (")[0]), float(v.split(" (")[1].rstrip("x)")))
                                            for v in (speeds[0], speeds[2])]
    assert dense_tps > 0 and level_tps > 0 and one == 1.0
    assert ratio == pytest.approx(level_tps / dense_tps, abs=0.001 + 0.005 * ratio)
    assert f"Decode t/s: measured on this machine right after the evaluation ({pi.cpu_name()}, kernel level " \
           f"{pi.cpu_isa()}, " in card and "then 32 tokens one at a time" in card


def test_model_card_without_speed(sparse_files, tmp_path):
    """--speed-tokens 0: no decode timing; the column says "-" and the card has no paragraph about it."""
    src, _ = sparse_files["f32"]
    out = tmp_path / "card.gguf"
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.3", "-o", str(out),
                          "--calib-tokens", "128", "--ctx", "64", "--eval-chunks", "2", "--speed-tokens", "0"]) == 0
    card = (tmp_path / "card.gguf.card.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| ")][1:]
    assert all(r.endswith("| - |") for r in rows[1:]) and "Decode t/s" not in card
    for bad in ("-1", "1025"):
        with pytest.raises(SystemExit, match="speed-tokens"):
            sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "-o", str(out), "--speed-tokens", bad])


def test_card_timing_sees_other_processes():
    """The card's decode timing measures what other processes ran meanwhile (sparsify.other_load, /proc/stat less this
    process's own CPU time) and warns from BUSY_OTHERS cores on: a busy child process counts."""
    import subprocess
    import time
    if sparsify._busy_seconds() is None:
        pytest.skip("no /proc/stat on this system: the card's timing carries no load figure")
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)   # the child is running
        _, others = sparsify.other_load(lambda: time.sleep(1.0))
    finally:
        child.kill()
        child.wait()
    assert others >= 0.5 > sparsify.BUSY_OTHERS, others   # (what else runs only adds to it)


def test_card_timing_subtracts_its_own_cpu_time(monkeypatch):
    """other_load's arithmetic on fixed readings: 3 CPU seconds busy machine-wide over 2 s of wall time, 1 of them this
    process's own -> 1 core of other processes; no /proc/stat -> no figure."""
    from types import SimpleNamespace
    busy, own, clock = iter([100.0, 103.0]), iter([0.25, 1.25]), iter([5.0, 7.0])
    monkeypatch.setattr(sparsify, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(sparsify.os, "times", lambda: SimpleNamespace(user=next(own), system=0.0))
    monkeypatch.setattr(sparsify.time, "perf_counter", lambda: next(clock))
    assert sparsify.other_load(lambda: "done") == ("done", 1.0)
    monkeypatch.setattr(sparsify, "_busy_seconds", lambda: None)
    monkeypatch.setattr(sparsify.time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(sparsify.os, "times", lambda: SimpleNamespace(user=0.0, system=0.0))
    assert sparsify.other_load(lambda: 1) == (1, None)


def test_card_timing_warns_when_others_ran(sparse_files, monkeypatch):
    """The card's timing paragraph carries a warning (in bold) where other processes kept BUSY_OTHERS cores or more
    busy during the timing, and none below that."""
    _, dst = sparse_files["f32"]
    monkeypatch.setattr(sparsify, "other_load", lambda fn: (fn(), 1.5))
    speeds, setup = sparsify.decode_speeds(dst, 4, 1)
    assert speeds["dense"] > 0 and "**other processes kept 1.5 CPU cores busy on average meanwhile" in setup
    monkeypatch.setattr(sparsify, "other_load", lambda fn: (fn(), sparsify.BUSY_OTHERS / 2))
    assert "other processes" not in sparsify.decode_speeds(dst, 4, 1)[1]


def test_card_warns_when_the_default_level_is_slower():
    """Where the run a context makes of the file by default (its default level, with the stored input thresholds)
    decoded slower than the dense model, sparsify says so and how to run dense; not where it was faster or untimed."""
    tps = {"dense": 10.0, "0.25": 11.0, "0.25+in": 9.0, "0.5": 12.0, "0.5+in": 8.0}
    slow = sparsify.slower_than_dense(tps, 0.5, inputs=True, attn=False)
    assert "default level (0.5+in) decoded at 0.80x" in slow and "faster: 0.25, 0.5;" in slow and "--dense" in slow
    assert sparsify.slower_than_dense(tps, 0.5, inputs=False, attn=False) is None          # 0.5 alone: 1.2x
    assert sparsify.slower_than_dense({"dense": 10.0, "0.5+attn": 9.9}, 0.5, False, True).startswith(
        "on this machine the default level (0.5+attn) decoded at 0.99x")
    assert sparsify.slower_than_dense({"dense": 10.0}, 0.5, False, False) is None          # not timed


def test_model_card_warns_when_the_default_level_is_slower(sparse_files, tmp_path, monkeypatch, capsys):
    """The warning goes to the log and, in bold, into the card (the timing replaced by fixed speeds)."""
    src, _ = sparse_files["f32"]
    out = tmp_path / "slow.gguf"
    monkeypatch.setattr(sparsify, "decode_speeds", lambda *a: ({"dense": 10.0, "0.3": 7.0}, "fixed"))
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.3", "-o", str(out),
                          "--calib-tokens", "128", "--ctx", "64", "--eval-chunks", "2", "--speed-tokens", "4"]) == 0
    card = (tmp_path / "slow.gguf.card.md").read_text()
    assert "**Warning: on this machine the default level (0.3) decoded at 0.70x the dense model's speed" in card
    assert "sparsify: warning: on this machine the default level (0.3)" in capsys.readouterr().err
    monkeypatch.setattr(sparsify, "decode_speeds", lambda *a: ({"dense": 10.0, "0.3": 12.0}, "fixed"))
    assert sparsify.main([str(src), str(ROOT / "data" / "heldout.txt"), "--sparsity", "0.3", "-o", str(out),
                          "--calib-tokens", "128", "--ctx", "64", "--eval-chunks", "2", "--speed-tokens", "4"]) == 0
    assert "Warning" not in (tmp_path / "slow.gguf.card.md").read_text()


# ----------------------------------------------------------------------------------------- errors
def test_errors(sparse_files, tmp_path, capsys):
    src, dst = sparse_files["f32"]
    corpus = str(ROOT / "data" / "heldout.txt")
    with pytest.raises(ValueError, match="not stored"):
        pi.Context(pi.Model(dst), n_ctx=64, sparsity=0.4)
    with pytest.raises(ValueError, match="not both"):
        pi.Context(pi.Model(dst), n_ctx=64, sparsity=0.5, sparse_threshold=0.1)
    with pytest.raises(ValueError, match="gate-sparse"):
        pi.Context(pi.Model(src), n_ctx=64, sparsity=0.5)
    for args, message in ((["--sparsity", "1.5"], "in \\(0, 1\\)"), (["--sparsity", "x"], "expected numbers"),
                          (["--default-sparsity", "0.3"], "not one of the levels"),
                          (["--gate-input-scale", "2"], "scale x level < 1")):
        with pytest.raises(SystemExit, match=message):
            sparsify.main([str(src), corpus, "-o", str(tmp_path / "o.gguf"), *args])
    pwri = ROOT / "models" / "tinyrelu" / "tinyrelu.q4_0.powerinfer.gguf"
    with pytest.raises(SystemExit, match="PowerInfer"):
        sparsify.main([str(pwri), corpus, "-o", str(tmp_path / "o.gguf")])
    with pytest.raises(SystemExit, match="overwrite"):
        sparsify.main([str(src), corpus, "-o", str(src)])
    with pytest.raises(SystemExit, match="no such model file"):
        sparsify.main([str(tmp_path / "missing.gguf"), corpus, "-o", str(tmp_path / "o.gguf")])


@pytest.mark.parametrize("meta,words", [
    ({"powerinfer.act_sparsity.levels": [0.5], "powerinfer.act_sparsity.thresholds": [0.1]},
     ["thresholds", "2 layers"]),
    ({"powerinfer.act_sparsity.levels": [1.5], "powerinfer.act_sparsity.thresholds": [0.1, 0.1]}, ["levels"]),
    ({"powerinfer.act_sparsity.levels": [0.5], "powerinfer.act_sparsity.thresholds": [0.1, float("nan")]}, ["NaN"]),
    ({"powerinfer.act_sparsity.levels": [0.5], "powerinfer.act_sparsity.thresholds": [0.1, 0.1],
      "powerinfer.act_sparsity.default": 0.25}, ["not stored"]),
    ({"powerinfer.act_sparsity.method": "teal"}, ["method"]),
    ({"powerinfer.act_sparsity.levels": [0.5], "powerinfer.act_sparsity.thresholds": [0.1, 0.1],
      "powerinfer.act_sparsity.attn_thresholds": [0.1, 0.1]}, ["attn_thresholds", "1 x 2 x 2"]),
])
def test_malformed_metadata_is_refused(sparse_files, tmp_path, meta, words):
    """A file whose act_sparsity keys are inconsistent does not load (one line naming the key), nothing runs."""
    import gguf
    from powerinfer.gguf_copy import add_tensor_as_is, write, writer_like
    _, dst = sparse_files["f32"]
    r = gguf.GGUFReader(str(dst))
    bad = tmp_path / "bad.gguf"
    w = writer_like(r, str(bad), skip=lambda name: name.startswith("powerinfer.act_sparsity."))
    for k, v in meta.items():
        if isinstance(v, list):
            w.add_key_value(k, v, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
        else:
            w.add_key_value(k, v, gguf.GGUFValueType.STRING if isinstance(v, str) else gguf.GGUFValueType.FLOAT32)
    for t in r.tensors:
        add_tensor_as_is(w, t)
    write(w)
    with pytest.raises(pi.ModelLoadError) as e:
        pi.Model(bad)
    for word in words:
        assert word in str(e.value), str(e.value)


def test_api_and_server_flags_take_a_level(sparse_files):
    """PowerInfer(sparsity=) and the shared CLI's --sparsity reach the context; a level the file lacks is refused."""
    from powerinfer import cli
    from powerinfer.server.cli import parse_args as server_args
    _, dst = sparse_files["q4_0"]
    llm = pi.PowerInfer(str(dst), n_ctx=64, sparsity=0.25)
    try:
        assert llm.ctx.sparsity == 0.25 and llm.ctx.sparse
        out = llm.create_completion("The function returns", max_tokens=4, temperature=0)
        assert out["choices"][0]["text"] is not None
    finally:
        llm.close()
    with pytest.raises(ValueError, match="not stored"):
        pi.PowerInfer(str(dst), n_ctx=64, sparsity=0.3)
    llm = pi.PowerInfer(str(dst), n_ctx=64, sparse_gather_max=3)
    try:
        assert llm.ctx.sparse_gather_max == 3
    finally:
        llm.close()
    p = cli.parser("x")
    cli.add_context_args(p, ctx_size="c")
    assert p.parse_args(["--sparsity", "0.5"]).sparsity == 0.5
    assert p.parse_args([]).sparse_gather_max == 1 and p.parse_args(["--sparse-gather-max", "0"]).sparse_gather_max == 0
    assert server_args(["-m", str(dst), "--sparsity", "0.25"]).sparsity == 0.25
    assert server_args(["-m", str(dst), "--sparse-gather-max", "4"]).sparse_gather_max == 4
    import importlib.util                         # perplexity measures a level as generation runs it, unless asked
    spec = importlib.util.spec_from_file_location("examples_perplexity", ROOT / "examples" / "perplexity.py")
    perplexity_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perplexity_cli)
    assert perplexity_cli.parse_args(["-m", str(dst)]).sparse_gather_max == 0


@pytest.mark.parametrize("part", ["ffn_down_t", "ffn_gate_t"])
def test_a_layer_without_its_transposed_copy_or_a_column_layout_is_refused(sparse_files, tmp_path, part):
    """A q8_0 file's ffn_down / ffn_gate have no column layout: the tool writes ffn_down_t / ffn_gate_t, and a file
    without one of them is refused at load with a message naming the tensor (not a crash, nor a silent dense run)."""
    from model_files import rewrite
    _, dst = sparse_files["q8_0"]
    bad = rewrite(dst, tmp_path / "bad.gguf", drop=(f"blk.1.{part}.weight",))
    with pytest.raises(pi.ModelLoadError, match=f"gate-sparse layer 1: .*no 'blk.1.{part}.weight'"):
        pi.Model(bad)
