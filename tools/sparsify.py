#!/usr/bin/env python3
"""Make an activation-sparse model from a dense SwiGLU / GeGLU GGUF file, with no retraining.

    python tools/sparsify.py MODEL.gguf corpus.txt --sparsity 0.5 -o MODEL.sparse.gguf
    python tools/sparsify.py MODEL.gguf corpus.txt --sparsity 0.25,0.4,0.5 --default-sparsity 0.5 -o OUT.gguf
    python examples/main.py -m OUT.gguf -p "..."            # runs sparse at the default level
    python examples/main.py -m OUT.gguf --sparsity 0.4 ...  # another stored level; --dense: the exact dense model

Method (CATS, Lee et al. 2024: thresholds on the FFN's activated gate, here weighted per channel; with
--gate-input-scale also TEAL, Liu et al. 2024, on the gate's input). For a gated FFN
down(act(gate x) * up x), channel i contributes nothing when act(gate_i . x) is 0, and little when it
is small. Per layer, a threshold t is chosen so that a fraction s (the sparsity) of the values
|act(gate_i . x)| over the calibration text fall below it; at run time the gate is computed densely,
and the up row and the down column of a channel are read only when |act(gate_i . x)| >= t. On a
memory-bound CPU decode that saves the bytes of those rows: 2/3 of the FFN's weights times s. With
--channel-weighting up (the default) the test is |act(gate_i . x)| w_i >= t, w_i the channel's mean |up_i . x| over
the calibration tokens over its layer's mean (blk.N.ffn_act_scale): an estimate of |h_i| rather than of its gate;
its thresholds come from a second calibration pass over the written file, which counts the weighted values.

1. Calibration: the corpus is evaluated with our engine, dense, in windows of --ctx tokens (at most
   --calib-tokens tokens from the start of the text), and each layer's |act(gate x)| values are
   counted in a histogram (pi_act_histogram: 16 bins per octave); the thresholds are its quantiles,
   interpolated geometrically inside a bin. With --gate-input-scale c the FFN input's |x_j| are counted
   too and the gate reads only the entries above the quantile c * s (an input-sparse matmul over
   ffn_gate_t, the gate transposed).
2. Layout: the down matrix is needed by channel (row i = channel i's output vector). Where ffn_down
   (ffn_gate, for the gate inputs) is Q4_0, Q4_K or Q6_K (the Q4_0 and Q4_K_M files of llama.cpp), the
   loader lays the file's own matrix out by channel (pi_sparse_pack: PI_TYPE_Q4_0C, Q4_KC, Q6_KC), with
   no second rounding, and the tool writes nothing more: the sparse file is the input plus metadata (with
   every channel kept the sparse down step is then the dense product). Elsewhere the file gets
   blk.N.ffn_down_t.weight (ffn_gate_t) beside ffn_down (which stays: --dense is the exact dense model),
   re-quantized from the dequantized weights to --down-type; f32/f16/bf16 sources transpose without loss,
   quantized ones do not (the model card measures what it costs). `convert-dense.py --down-t` writes it
   from the original checkpoint with no second rounding; a file that has it keeps it (unless --down-type
   asks for another type). An explicit --down-type writes the copies for every layer (the loader still
   prefers the column layout; the copies are read with no_repack).
3. The model card (printed, and written to OUT.card.md): for the held-out text (--heldout, else the
   part of the corpus after the calibration tokens), perplexity of the dense model, and for each
   level the measured sparsity, perplexity, KL divergence from the dense model and top-1 agreement,
   plus the cost of the down step's layout alone (every channel through the sparse kernels: about 0 where
   the loader lays the file's own matrix out by channel, the re-quantization's cost where ffn_down_t was
   written), and the decode tokens/s of the dense model and of each level measured on this machine
   (--speed-tokens: whether a level pays here, which the bytes bound alone does not say).

The thresholds of every level are stored (powerinfer.act_sparsity.*, see powerinfer/act_sparsity.py).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings"))

import powerinfer                                                   # noqa: E402
from powerinfer import act_sparsity, quants                       # noqa: E402
from powerinfer.context import Context                              # noqa: E402
from powerinfer.gguf_copy import add_tensor_as_is, write, writer_like   # noqa: E402
from powerinfer.gguf_file import open_gguf                          # noqa: E402
from powerinfer.model import Model                                  # noqa: E402
from powerinfer.perplexity import perplexity                        # noqa: E402

DOWN_TYPES = ("auto", "q4_0", "q8_0", "f16", "bf16", "f32")
GGML = gguf.GGMLQuantizationType


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_levels(text: str) -> list[float]:
    try:
        levels = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"sparsify: --sparsity {text!r}: expected numbers like 0.5 or 0.25,0.4,0.5") from None
    if not levels or any(not (0.0 < v < 1.0) for v in levels):
        raise SystemExit(f"sparsify: --sparsity {text!r}: every level must be in (0, 1)")
    return sorted(set(levels))


# ----------------------------------------------------------------------------------- calibration
def encode_prefix(tokenizer, text: str, n_tokens: int) -> list[int]:
    """At least n_tokens tokens of text (all of it when shorter), tokenizing a growing prefix cut at a
    line end (a 6 MB corpus takes minutes to tokenize whole in Python; a calibration needs a few thousand)."""
    n_chars = 8 * n_tokens
    while True:
        cut = text.find("\n", n_chars)
        prefix = text if cut < 0 else text[:cut]
        tokens = tokenizer.encode(prefix, add_special=False)
        if len(tokens) >= n_tokens or len(prefix) == len(text):
            return tokens
        n_chars *= 2
def calibrate(model: Model, tokens: list[int], n_ctx: int, n_threads: int | None) \
        -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the tokens (dense, windows of n_ctx): the histograms [n_layer, kinds, bins] (kind 0 |act(gate x)|, times
    the file's channel weights where it has them), the bins' edges, and the channels' mean |up x| [n_layer, n_ff]."""
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads, dense=True, act_histogram=True)
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    t0 = time.perf_counter()
    for s in range(0, len(tokens), n_ctx):
        window = tokens[s:s + n_ctx]
        if bos is not None:
            window = [bos] + window[:n_ctx - 1]
        ctx.kv_clear()
        ctx.decode(window, logits="none")
        log(f"sparsify: calibration {min(len(tokens), s + n_ctx)}/{len(tokens)} tokens, "
            f"{time.perf_counter() - t0:.1f} s")
    return (*ctx.act_histogram(), ctx.act_channel_means())


def channel_weights(means: np.ndarray) -> np.ndarray:
    """[n_layer, n_ff] f32: each channel's mean |up x| over the calibration tokens over its layer's mean (so thresholds
    keep the scale of |act(gate x)|); a layer whose channels never ran gets 1. (Times the norm of the channel's column
    of ffn_down too, an estimate of |h_i| |down_i|: KL -1.4% to -3.5% on our SwiGLU model, +7% to +35% on Gemma 3
    270M; not kept, bench/README.md.)"""
    layer = means.mean(axis=1, keepdims=True)
    return np.where(layer > 0, means / np.where(layer > 0, layer, 1.0), 1.0).astype(np.float32)


def thresholds_from_histogram(hist: np.ndarray, edges: np.ndarray, level: float) -> np.ndarray:
    """hist [n_layer, bins] -> [n_layer] thresholds."""
    if level <= 0:
        return np.zeros(hist.shape[0], dtype=np.float64)
    return _quantiles(hist, edges, level)


def _quantiles(hist: np.ndarray, edges: np.ndarray, level: float) -> np.ndarray:
    """Per layer the value below which a fraction `level` of the counted values lie (geometric interpolation
    inside the bin that holds that quantile; bin 0 (below 2^-24) counts as zero)."""
    out = np.zeros(hist.shape[0], dtype=np.float64)
    for il, h in enumerate(hist):
        cum = np.cumsum(h, dtype=np.float64)
        target = level * cum[-1]
        b = int(np.searchsorted(cum, target, side="left"))
        if b == 0:
            out[il] = edges[1] if len(edges) > 1 else 0.0   # the quantile is (numerically) zero: skip exact zeros
            continue
        lo = float(edges[b])
        hi = float(edges[b + 1]) if b + 1 < len(edges) else lo * 2.0
        below = cum[b - 1]
        frac = (target - below) / h[b] if h[b] else 0.0
        out[il] = lo * (hi / lo) ** frac
    return out


def _fraction_below(hist: np.ndarray, edges: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per layer the fraction of the counted values below t[layer] (the inverse of _quantiles)."""
    out = np.zeros(hist.shape[0], dtype=np.float64)
    for il, h in enumerate(hist):
        total = float(h.sum())
        b = int(np.searchsorted(edges, t[il], side="right")) - 1      # the bin holding t
        if b <= 0:
            out[il] = h[0] / total if t[il] > 0 else 0.0
            continue
        lo = float(edges[b])
        hi = float(edges[b + 1]) if b + 1 < len(edges) else lo * 2.0
        frac = math.log(t[il] / lo) / math.log(hi / lo)
        out[il] = (float(h[:b].sum()) + min(1.0, frac) * h[b]) / total
    return out


def thresholds_by_energy(hist: np.ndarray, edges: np.ndarray, level: float) -> np.ndarray:
    """Thresholds t_l = c * rms_l (rms_l: layer l's RMS of |act(gate x)|), c chosen so that the layers skip a
    fraction `level` of the channels on average. Dropping the channels below t costs about their share of
    the activation energy; with the same t / rms everywhere the marginal cost of one more skipped channel is
    the same in every layer, which minimises the total for a given mean sparsity (layers whose activations
    are spread out give more channels, layers with a few large ones fewer)."""
    if level <= 0:
        return np.zeros(hist.shape[0], dtype=np.float64)
    centers = np.sqrt(edges[1:] * edges[:-1])
    centers = np.concatenate([centers, [edges[-1] * 1.5]])               # the open last bin
    centers[0] = 0.0
    rms = np.sqrt((hist * centers ** 2).sum(axis=1) / hist.sum(axis=1))
    lo, hi = 0.0, 64.0
    for _ in range(60):                                                  # bisection on c
        c = 0.5 * (lo + hi)
        if _fraction_below(hist, edges, c * rms).mean() < level:
            lo = c
        else:
            hi = c
    return 0.5 * (lo + hi) * rms


SENSITIVITY_GRID = (0.2, 0.35, 0.5, 0.65, 0.8)


KINDS = ("channels", "gate input", "attention input", "attention output")   # the calibration histogram's kinds


def layer_sensitivity(ctx: Context, base: str, kind: int, hist: np.ndarray, edges: np.ndarray, n_ctx: int,
                      windows: int) -> np.ndarray:
    """kl [n_layer, len(SENSITIVITY_GRID)]: the mean KL divergence from the dense model (base: its saved KLD file over
    `windows` windows of calibration tokens) when layer l alone skips the fraction SENSITIVITY_GRID[k] of one kind's
    values (KINDS[kind]; hist: that kind's histogram) and everything else is dense. For the channels the other layers
    run their dense FFN; for the inputs every channel is kept (threshold 1e-30: the input thresholds act only in a
    sparse layer), the other inputs read in full. ctx: a context of the sparse file (its thresholds are set here) with
    the default sparse_gather_max, so that its windows run the selection over the dense kernels, at about dense speed
    (a ranking of the layers, not the card's figures)."""
    n_layer = hist.shape[0]
    kl = np.zeros((n_layer, len(SENSITIVITY_GRID)))
    ctx.set_gate_input_thresholds(None)
    if ctx.model.attn_input_sparse:
        ctx.set_attn_input_thresholds(None)
    if kind > 0:
        ctx.set_sparse_thresholds(np.full(n_layer, 1e-30))   # every channel kept
    t0 = time.perf_counter()
    for k, level in enumerate(SENSITIVITY_GRID):
        q = _quantiles(hist, edges, level)
        for il in range(n_layer):
            t = np.zeros(n_layer)            # threshold 0: the layer's exact dense FFN, or its dense matmul
            t[il] = q[il]
            if kind == 0:
                ctx.set_sparse_thresholds(t)
            elif kind == 1:
                ctx.set_gate_input_thresholds(t)
            else:                            # [the attention input's, the attention output's]
                pair = np.zeros((2, n_layer))
                pair[kind - 2] = t
                ctx.set_attn_input_thresholds(pair)
            kl[il, k] = perplexity(ctx, None, n_ctx=n_ctx, chunks=windows, kld_base=base).kld.mean
        log(f"sparsify: sensitivity of the {KINDS[kind]} at {level:g} measured for every layer, "
            f"{time.perf_counter() - t0:.0f} s")
    return kl


def allocate_by_sensitivity(kl: np.ndarray, level: float) -> np.ndarray:
    """Per-layer sparsities with mean `level` that keep the sum of the layers' KL costs low (TEAL's greedy
    allocation, on costs measured one layer at a time, kl [n_layer, grid]): every layer starts dense; the step
    to a layer's next grid point with the least KL per unit of sparsity is taken until the mean reaches the
    level; the last step is taken only as far as needed."""
    n_layer = kl.shape[0]
    grid = np.array((0.0,) + SENSITIVITY_GRID)
    cost = np.concatenate([np.zeros((n_layer, 1)), np.maximum.accumulate(kl, axis=1)], axis=1)   # monotone
    at = np.zeros(n_layer, dtype=int)
    s = np.zeros(n_layer)
    while s.mean() < level - 1e-12:
        best, best_rate = -1, math.inf
        for il in range(n_layer):
            if at[il] + 1 < len(grid):
                rate = (cost[il, at[il] + 1] - cost[il, at[il]]) / (grid[at[il] + 1] - grid[at[il]])
                if rate < best_rate:
                    best, best_rate = il, rate
        if best < 0:
            break                                # every layer at the grid's top
        step = grid[at[best] + 1] - grid[at[best]]
        need = (level - s.mean()) * n_layer
        s[best] += min(step, need)
        at[best] += 1
    return s


def thresholds_for(hist: np.ndarray, edges: np.ndarray, sparsities: np.ndarray) -> np.ndarray:
    """Per layer the threshold that skips the fraction sparsities[l] of its calibration values (0: dense)."""
    return np.array([_quantiles(hist[il:il + 1], edges, float(v))[0] if v > 0 else 0.0
                     for il, v in enumerate(sparsities)])


# ------------------------------------------------------------------------------------------ layout
def down_t_type(src_type: int, n_embd: int, choice: str) -> str:
    if choice != "auto":
        return choice
    lossless = {GGML.F32: "f32", GGML.F16: "f16", GGML.BF16: "bf16"}
    if src_type in lossless:
        return lossless[src_type]
    # quantized sources are re-quantized: q8_0 adds the least error of the types rows of any n_embd take
    return "q8_0" if n_embd % 32 == 0 else "f16"


def transposed(t, type_name: str) -> tuple[np.ndarray, int]:
    """A matrix [rows of n] -> its transpose [n rows] in type_name: (raw bytes, ggml type). ffn_down
    [n_embd rows of n_ff] -> ffn_down_t [n_ff rows of n_embd]; ffn_gate [n_ff rows of n_embd] -> ffn_gate_t."""
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    wt = np.ascontiguousarray(w.T)
    if not quants.can_quantize(type_name, wt.shape[1]):
        raise SystemExit(f"sparsify: {type_name} cannot hold rows of {wt.shape[1]} values (--down-type)")
    return quants.quantize(wt, type_name), getattr(GGML, type_name.upper())


def write_sparse(src: Path, dst: Path, n_layer: int, down_type: str, meta: dict, gate_t: bool,
                 keep_down_t: bool, act_scale: np.ndarray | None = None, keep_act_scale: bool = False) -> dict:
    """Copy of src with ffn_down_t (and, with gate_t, ffn_gate_t) per layer where the loader cannot lay the file's
    matrix out by channel, the channel weights (act_scale [n_layer, n_ff] as blk.N.ffn_act_scale, or with
    keep_act_scale src's own; neither: none) and the act_sparsity keys; returns {name: type} of the transposed
    tensors."""
    if act_scale is not None and keep_act_scale:
        raise ValueError("write_sparse: act_scale and keep_act_scale exclude each other")
    r = gguf.GGUFReader(str(src))
    w = writer_like(r, str(dst), skip=lambda name: name.startswith(act_sparsity.PREFIX))
    for k, v in meta.items():
        w.add_key_value(k, v, gguf.GGUFValueType.ARRAY if isinstance(v, list) else
                        gguf.GGUFValueType.STRING if isinstance(v, str) else gguf.GGUFValueType.FLOAT32,
                        sub_type=gguf.GGUFValueType.FLOAT32 if isinstance(v, list) else None)
    types, n_down = {}, 0
    for t in r.tensors:
        base = t.name[:-len(".weight")]
        n_down += t.name.endswith(".ffn_down.weight")
        if t.name.endswith(".ffn_down_t.weight") and keep_down_t:
            add_tensor_as_is(w, t)       # written from the checkpoint (convert-dense.py --down-t): no second rounding
            types[base] = f"{gguf.GGMLQuantizationType(t.tensor_type).name.lower()} (kept)"
            continue
        if t.name.endswith(".ffn_act_scale") and keep_act_scale:
            add_tensor_as_is(w, t)
            continue
        if t.name.endswith((".ffn_down_t.weight", ".ffn_gate_t.weight", ".ffn_act_scale")):
            continue                     # re-sparsifying a sparse file: made anew below
        add_tensor_as_is(w, t)
        if (t.name.endswith(".ffn_down.weight") and not keep_down_t) or \
                (gate_t and t.name.endswith(".ffn_gate.weight")):
            if down_type == "auto" and act_sparsity.has_column_layout(int(t.tensor_type), t.shape):
                src_type = gguf.GGMLQuantizationType(t.tensor_type).name.lower()
                types[base + "_t"] = f"none ({src_type}: by channel at load)"
                continue
            type_name = down_t_type(t.tensor_type, int(t.shape[1]), down_type)   # shape[1]: the new row length
            raw, ggml_type = transposed(t, type_name)
            w.add_tensor(base + "_t.weight", raw, raw_dtype=ggml_type)   # raw: [rows, row bytes]
            types[base + "_t"] = type_name
    if n_down != n_layer:
        raise SystemExit(f"sparsify: {src}: found ffn_down in {n_down} of {n_layer} layers")
    if act_scale is not None:
        for il in range(n_layer):
            w.add_tensor(f"blk.{il}.ffn_act_scale", np.ascontiguousarray(act_scale[il], dtype=np.float32))
    write(w)
    return types


# ------------------------------------------------------------------------------------- model card
def run_label(run: act_sparsity.LevelRun, levels: act_sparsity.SparsityLevels) -> str:
    """The model card's name of a run: "sparsity 0.5", "... + gate input", "... + gate input + attention inputs"."""
    label = f"sparsity {run.level:g}"
    if run.reads in ("gate", "attn") and levels.input_thresholds is not None:
        label += " + gate input"
    return label + (" + attention inputs" if run.reads == "attn" else "")


def evaluate(src: Path, out: Path, levels: list[float], heldout: list[int], n_ctx: int, chunks: int,
             n_threads: int | None) -> list[dict]:
    """Dense vs each level on the held-out tokens: PPL, KL, top-1, measured sparsity."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "dense.kld")
        dense = perplexity(Model(src), heldout, n_ctx=n_ctx, chunks=chunks, n_threads=n_threads, save_kld=base)
        rows.append({"name": "dense (input file)", "ppl": dense.ppl, "sparsity": 0.0})
        model = Model(out)

        # one context at a time: (label, run name, which inputs it reads sparsely, its context); the windows go
        # through the sparse kernels (sparse_gather_max 0), so the card measures what generation runs
        kw = dict(n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads, sparse_gather_max=0)

        def runs():
            yield ("every channel through the sparse kernels (the down step's layout alone)", None, "channels",
                   Context(model, sparse_threshold=1e-30, **kw))
            for run in act_sparsity.level_runs(model.sparsity_levels)[1:]:   # after dense
                yield (run_label(run, model.sparsity_levels), run.name, run.reads,
                       act_sparsity.level_context(model, run, **kw))
        for label, key, reads, ctx in runs():
            r = perplexity(ctx, None, n_ctx=n_ctx, chunks=chunks, kld_base=base)
            active, total = ctx.sparse_stats()
            inp, inp_total = ctx.gate_input_stats()
            att, att_total = ctx.attn_input_stats()
            rows.append({"name": label, "run": key, "reads": reads, "ppl": r.ppl,
                         "sparsity": 1.0 - float(active.sum()) / (total * len(active)),
                         "input": 1.0 - float(inp.sum()) / (inp_total * len(inp)),
                         "attn": 1.0 - float(att.sum()) / (att_total * len(att)) if reads == "attn" else 0.0,
                         "kld": r.kld.mean, "kld_p99": r.kld.p99, "top1": r.kld.top1, "n": r.kld.n})
            del ctx
    return rows


def _busy_seconds() -> float | None:
    """CPU seconds every process of this machine has run (Linux /proc/stat), None where that is not readable."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:8]]   # user nice system idle iowait irq softirq
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def other_load(fn):
    """(fn(), the CPU cores that other processes kept busy on average while it ran, or None where unknown)."""
    busy0, own0, t0 = _busy_seconds(), os.times(), time.perf_counter()
    result = fn()
    busy1, own1, wall = _busy_seconds(), os.times(), time.perf_counter() - t0
    if busy0 is None or busy1 is None or wall <= 0:
        return result, None
    own = (own1.user + own1.system) - (own0.user + own0.system)
    return result, max(0.0, (busy1 - busy0 - own) / wall)


# other processes' load (cores, averaged over the timing) from which the card says its speeds may be low
BUSY_OTHERS = 0.25


def decode_speeds(out: Path, n_gen: int, n_threads: int | None) -> tuple[dict, str]:
    """The median decode tokens/s of the sparse file's dense model and of each run on this machine ({run name: t/s}),
    and how they were measured, in words (with a warning where other processes kept the CPU busy meanwhile)."""
    model = Model(out)
    ctxs = {r.name: act_sparsity.level_context(model, r, n_ctx=16 + n_gen, n_threads=n_threads)
            for r in act_sparsity.level_runs(model.sparsity_levels)}
    n = ctxs["dense"].n_threads
    speeds, others = other_load(lambda: act_sparsity.decode_speeds(ctxs, model.n_vocab, n_gen=n_gen))
    setup = (f"{powerinfer.cpu_name()}, kernel level {powerinfer.cpu_isa()}, "
             f"{f'{n} threads' if n else 'a thread per physical core'}; an 8-token prompt, then {n_gen} tokens one "
             "at a time, every run's tokens interleaved with the others', median of 3")
    if others is not None and others >= BUSY_OTHERS:
        warning = (f"other processes kept {others:.1f} CPU cores busy on average meanwhile, so these speeds may be "
                   "low and their ratios off: rerun on a quiet machine (bench/bench_act_sparse.py)")
        log(f"sparsify: warning: {warning}")
        setup += f"; **{warning}**"
    return {name: v[0] for name, v in speeds.items()}, setup


def slower_than_dense(tps: dict, default: float, inputs: bool, attn: bool) -> str | None:
    """A warning where the run a context makes of the file by default (its default level, with the input thresholds
    the file stores) decoded slower than the dense model in the timing: the level then saves bytes but not time on
    this machine. None where it was not timed or is not slower."""
    key = f"{default:g}" + ("+in" if inputs else "") + ("+attn" if attn else "")   # act_sparsity.level_runs' names
    if "dense" not in tps or key not in tps or tps[key] >= tps["dense"]:
        return None
    faster = [k for k, v in tps.items() if k != "dense" and v > tps["dense"]]
    return (f"on this machine the default level ({key}) decoded at {tps[key] / tps['dense']:.2f}x the dense model's "
            "speed: it reads fewer bytes but takes longer here (bench/README.md says where the sparse kernels trail "
            "the dense ones); " + (f"levels that were faster: {', '.join(faster)}; " if faster else "")
            + "run the exact dense model with --dense (main.py, server.py) or choose a level with --sparsity")


def card(src: Path, out: Path, levels, thresholds, inputs, types: dict, rows: list[dict], n_calib: int,
         n_ctx: int, fmt_bytes, attn=None, weighted: bool = False, speeds: tuple[dict, str] | None = None,
         slow: str | None = None) -> str:
    rule = ("|act(gate x)| w >= t runs, w the channel's weight (blk.N.ffn_act_scale)" if weighted
            else "|act(gate x)| >= t runs")
    lines = [f"# {out.name}", "",
             f"Activation-sparse (CATS) copy of `{src.name}` made by tools/sparsify.py: {n_calib} calibration "
             f"tokens in windows of {n_ctx}; transposed copies: "
             f"{', '.join(sorted({n.split('.')[-1] + ' ' + v for n, v in types.items()}))}; "
             f"file {fmt_bytes(out.stat().st_size)} (input {fmt_bytes(src.stat().st_size)}).", "",
             "| run | channels skipped (measured) | gate inputs skipped | attention inputs skipped | PPL | KL mean "
             "| KL p99 | top-1 agreement | decode bytes (bound) | decode t/s (x dense) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    parts = act_sparsity.decode_bytes(open_gguf(out).tensors)   # sizes only: no model to load
    dense = act_sparsity.dense_bytes(parts)

    tps, setup = speeds if speeds else ({}, "")

    def speed(key: str) -> str:
        return f"{tps[key]:.2f} ({tps[key] / tps['dense']:.3f}x)" if key in tps else "-"
    for r in rows:
        if "kld" in r:
            gate_read = r["reads"] in ("gate", "attn") and inputs is not None   # the gate over its input entries
            read = 1.0 - r["input"] if gate_read else None
            att = (1.0 - r["attn"],) * 2 if r["reads"] == "attn" else None   # the measured share, both parts
            n = act_sparsity.level_bytes(parts, 1.0 - r["sparsity"], read, att)
            lines.append(f"| {r['name']} | {r['sparsity']:.1%} | {r['input']:.1%} | {r['attn']:.1%} | {r['ppl']:.4f} | "
                         f"{r['kld']:.5f} | {r['kld_p99']:.4f} | {r['top1']:.2%} | {fmt_bytes(n)} ({dense / n:.3f}x) | "
                         f"{speed(r['run'])} |")
        else:
            lines.append(f"| {r['name']} | - | - | - | {r['ppl']:.4f} | - | - | - | {fmt_bytes(dense)} (1x) | "
                         f"{speed('dense')} |")
    lines += ["", "Decode bytes: the weights one token reads at that level (attention, the head, the gate, the "
              "measured share of up and down_t rows); dense bytes / level bytes is the speed-up bound of "
              "memory-bound CPU decode, which the sparse kernels reach only in part (bench/README.md).", "",
              *([f"Decode t/s: measured on this machine right after the evaluation ({setup}; "
                 "tools/sparsify.py --speed-tokens); the dense row is the sparse file with every channel computed "
                 "(--dense), exactly the input model.", ""] if speeds else []),
              *([f"**Warning: {slow}.**", ""] if slow else []),
              f"Held-out: {rows[-1].get('n', 0)} scored positions. Thresholds per layer "
              f"({rule}; gate input: |x_j| >= t is read):", ""]
    for j, (lv, t) in enumerate(zip(levels, thresholds)):
        lines.append(f"- {lv:g}: " + " ".join(f"{v:.4g}" for v in t))
        if inputs is not None:
            lines.append("  gate input: " + " ".join(f"{v:.4g}" for v in inputs[j]))
        if attn is not None:
            lines.append("  attention input: " + " ".join(f"{v:.4g}" for v in attn[j][0]))
            lines.append("  attention output: " + " ".join(f"{v:.4g}" for v in attn[j][1]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("model", type=Path, help="dense GGUF file (llama / qwen2 / qwen3 / gemma3 family, gated FFN)")
    ap.add_argument("corpus", type=Path, help="calibration text (UTF-8)")
    ap.add_argument("--sparsity", default="0.5", help="target sparsity, or a comma list of levels to store "
                    "(default 0.5)")
    ap.add_argument("--default-sparsity", type=float, default=None,
                    help="the level used when none is asked for (default: the largest stored)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--down-type", choices=DOWN_TYPES, default="auto",
                    help="type of ffn_down_t / ffn_gate_t (auto: none where ffn_down / ffn_gate is Q4_0, Q4_K or "
                         "Q6_K, which the loader lays out by channel; the source's type for f32/f16/bf16; else "
                         "q8_0). Another choice writes the copies for every layer (read with --no-repack only "
                         "where the column layout exists)")
    ap.add_argument("--gate-input-scale", type=float, default=0.0,
                    help="TEAL on the gate's input: at level s, skip the fraction scale * s of the FFN input's "
                         "entries in the gate (writes ffn_gate_t, the gate transposed); 0: the dense gate (default). "
                         "At scale 1 the gate's inputs cost more quality than they save time (a higher channel level "
                         "alone reaches the same quality faster); at about 0.45 they come out ahead on a Q4_0 file "
                         "(7B shape on an AMD Zen 3: level 0.7 with 0.46 and --allocation sensitivity skips 58%% of "
                         "the FFN's weights at 1.25-1.37x dense (median 1.32x), with 91%% top-1 on our SwiGLU model, "
                         "where level 0.75 alone skips 50%% at 1.28-1.32x with 89.5%%), and on K-quant files they slow "
                         "decode down (Gemma 3 270M: 0.73x dense against 0.95x); bench/README.md")
    ap.add_argument("--attn-input-scale", type=float, default=0.0,
                    help="TEAL on the attention's inputs: at level s, q/k/v skip the fraction scale * s of the "
                         "attention input's entries and wo of the attention output's (the matrices must be Q4_0, "
                         "Q4_K or Q6_K, which the loader lays out by input); 0: dense attention (default)")
    ap.add_argument("--allocation", choices=["uniform", "energy", "sensitivity"], default="uniform",
                    help="per-layer sparsity: uniform (every layer skips the level's fraction), energy (the same "
                         "threshold relative to each layer's RMS activation, the mean sparsity at the level) or "
                         "sensitivity (each layer's KL cost measured alone at 0.2..0.8 on calibration windows, then "
                         "the greedy allocation of TEAL with the level as the mean; n_layer x 5 short runs per kind: "
                         "the channels and, with --gate-input-scale / --attn-input-scale, the gate's inputs and the "
                         "attention's input and output, each with its scaled level as the mean)")
    ap.add_argument("--channel-weighting", choices=["up", "none"], default="up",
                    help="which channels a level keeps: up (default: |act(gate x)| times the channel's mean |up x| "
                         "over the calibration tokens, stored as blk.N.ffn_act_scale; a second calibration pass) or "
                         "none (|act(gate x)| alone, CATS). On Gemma 3 270M at 0.5 the weights cut the KL divergence "
                         "by 41%% (bench/README.md)")
    ap.add_argument("--sensitivity-windows", type=int, default=2,
                    help="--allocation sensitivity: calibration windows per measurement (default 2, the least "
                         "perplexity scores)")
    ap.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens (default 8192)")
    ap.add_argument("--ctx", type=int, default=None,
                    help="calibration / evaluation window (default 512, or the model's training context where that "
                         "is shorter: positions past it are ones the model never saw in training)")
    ap.add_argument("--heldout", type=Path, default=None, help="evaluation text (default: the corpus after "
                    "the calibration tokens)")
    ap.add_argument("--eval-chunks", type=int, default=4, help="evaluation windows (default 4; 0: no model card)")
    ap.add_argument("--speed-tokens", type=int, default=32,
                    help="model card: decode tokens/s of the dense model and of each run on this machine, over this "
                         "many tokens one at a time (median of 3, interleaved; default 32, at most 1024; 0: not "
                         "measured)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    a = ap.parse_args(argv)
    levels = parse_levels(a.sparsity)
    default = a.default_sparsity if a.default_sparsity is not None else max(levels)
    if all(abs(default - v) > 1e-4 for v in levels):
        raise SystemExit(f"sparsify: --default-sparsity {default:g} is not one of the levels {levels}")
    if a.output.resolve() == a.model.resolve():
        raise SystemExit("sparsify: the output would overwrite the input")
    if not (0 <= a.gate_input_scale and a.gate_input_scale * max(levels) < 1):
        raise SystemExit(f"sparsify: --gate-input-scale must be in [0, {1 / max(levels):g}) (scale x level < 1)")
    if not (0 <= a.attn_input_scale and a.attn_input_scale * max(levels) < 1):
        raise SystemExit(f"sparsify: --attn-input-scale must be in [0, {1 / max(levels):g}) (scale x level < 1)")
    if a.allocation == "sensitivity" and a.sensitivity_windows < 2:
        raise SystemExit("sparsify: --sensitivity-windows must be at least 2")
    if not 0 <= a.speed_tokens <= 1024:
        raise SystemExit("sparsify: --speed-tokens must be in [0, 1024]")
    try:
        model = Model(a.model)
        text = a.corpus.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"sparsify: {e}") from None
    except Exception as e:   # ModelLoadError and the like: one line, no traceback
        raise SystemExit(f"sparsify: {e}") from None
    hp = model.hparams
    if a.ctx is None:
        a.ctx = min(512, hp.n_ctx_train)
    elif a.ctx > hp.n_ctx_train:
        log(f"sparsify: warning: --ctx {a.ctx} is longer than the model's training context ({hp.n_ctx_train}): "
            "the calibration and the model card measure positions the model was not trained on")
    if a.calib_tokens < a.ctx or a.ctx < 16:
        raise SystemExit(f"sparsify: --calib-tokens must be at least the window ({a.ctx} tokens: --ctx, else the "
                         "model's training context up to 512), and the window at least 16")
    if model.sparse:
        raise SystemExit(f"sparsify: {a.model} is a PowerInfer (PWRI) file, sparse already; give a dense file")
    if hp.ffn_gate == "seq":
        raise SystemExit(f"sparsify: {a.model}: the {hp.arch} FFN has no gate; CATS needs a gated FFN")
    n_eval = 0 if a.heldout else a.ctx * max(2, a.eval_chunks)   # the held-out part after the calibration
    tokens = encode_prefix(model.tokenizer, text, a.calib_tokens + n_eval)
    n_calib = min(a.calib_tokens, len(tokens)) // a.ctx * a.ctx
    if n_calib < a.ctx:
        raise SystemExit(f"sparsify: the corpus has {len(tokens)} tokens, fewer than one window of {a.ctx}")
    if a.allocation == "sensitivity" and n_calib < a.sensitivity_windows * a.ctx:
        raise SystemExit(f"sparsify: --allocation sensitivity measures on {a.sensitivity_windows} windows of "
                         f"{a.ctx} calibration tokens; there are {n_calib}")
    if a.attn_input_scale > 0:
        for name, t in model.file.tensors.items():
            if name.endswith((".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight")) and \
                    not act_sparsity.has_column_layout(t.type, t.ne):
                raise SystemExit(f"sparsify: --attn-input-scale: {name} has ggml type {t.type}; the input-sparse "
                                 "attention reads Q4_0, Q4_K or Q6_K matrices (with a multiple of 64 rows) only")
    log(f"sparsify: {a.model.name}: {hp.arch}, {hp.n_layer} layers, n_ff {hp.n_ff}, act {hp.ffn_act}; "
        f"calibrating on {n_calib} tokens")
    hist, edges, means = calibrate(model, tokens[:n_calib], a.ctx, a.threads)
    act_scale = channel_weights(means) if a.channel_weighting == "up" else None
    by = thresholds_by_energy if a.allocation == "energy" else thresholds_from_histogram
    thresholds = np.stack([by(hist[:, 0], edges, lv) for lv in levels])
    gate_t = a.gate_input_scale > 0
    inputs = (np.stack([thresholds_from_histogram(hist[:, 1], edges, lv * a.gate_input_scale) for lv in levels])
              if gate_t else None)
    attn = (np.stack([[thresholds_from_histogram(hist[:, k], edges, lv * a.attn_input_scale) for k in (2, 3)]
                      for lv in levels]) if a.attn_input_scale > 0 else None)   # [k, 2, n_layer]
    meta = act_sparsity.metadata(levels, thresholds, default, input_thresholds=inputs, attn_thresholds=attn)
    model_names = set(model.file.tensors)
    del model
    t0 = time.perf_counter()
    keep = a.down_type == "auto" and all(f"blk.{il}.ffn_down_t.weight" in model_names for il in range(hp.n_layer))
    if keep:
        log("sparsify: keeping the file's ffn_down_t (no re-quantization)")
    types = write_sparse(a.model, a.output, hp.n_layer, a.down_type, meta, gate_t, keep, act_scale=act_scale)
    log(f"sparsify: wrote {a.output} in {time.perf_counter() - t0:.1f} s")

    def rewrite(meta: dict) -> None:   # the file with new thresholds (it is read while it is rewritten)
        with tempfile.TemporaryDirectory(dir=a.output.parent) as tmp:
            staged = Path(tmp) / a.output.name
            os.replace(a.output, staged)
            write_sparse(staged, a.output, hp.n_layer, a.down_type, meta, gate_t, True,
                         keep_act_scale=True)   # types: as written

    if act_scale is not None:   # the channels' thresholds on the weighted |act(gate x)|: a second pass, on the file
        log("sparsify: calibrating the weighted channel selection")
        hist[:, 0] = calibrate(Model(a.output), tokens[:n_calib], a.ctx, a.threads)[0][:, 0]
        thresholds = np.stack([by(hist[:, 0], edges, lv) for lv in levels])
        meta = act_sparsity.metadata(levels, thresholds, default, input_thresholds=inputs, attn_thresholds=attn)
        rewrite(meta)
    if a.allocation == "sensitivity":   # each kind the file sparsifies, its mean sparsity the kind's level
        kinds = [(0, 1.0)] + ([(1, a.gate_input_scale)] if gate_t else []) + \
            ([(2, a.attn_input_scale), (3, a.attn_input_scale)] if attn is not None else [])
        allocated = {}   # kind -> per level: per-layer sparsities
        with tempfile.TemporaryDirectory() as tmp:   # the dense model's KLD base once, one context for every kind
            base = os.path.join(tmp, "dense.kld")
            windows = a.sensitivity_windows
            perplexity(Model(a.model), tokens[:windows * a.ctx], n_ctx=a.ctx, chunks=windows, n_threads=a.threads,
                       save_kld=base)
            ctx = Context(Model(a.output), n_ctx=a.ctx, n_batch=a.ctx, n_threads=a.threads)
            for kind, scale in kinds:
                kl = layer_sensitivity(ctx, base, kind, hist[:, kind], edges, a.ctx, windows)
                allocated[kind] = [allocate_by_sensitivity(kl, lv * scale) for lv in levels]
            del ctx   # before the file is rewritten
        by_kind = {kind: np.stack([thresholds_for(hist[:, kind], edges, s) for s in allocated[kind]])
                   for kind, _ in kinds}
        thresholds = by_kind[0]
        inputs = by_kind.get(1, inputs)
        if attn is not None:
            attn = np.stack([by_kind[2], by_kind[3]], axis=1)   # [k, 2, n_layer]
        rewrite(act_sparsity.metadata(levels, thresholds, default, input_thresholds=inputs, attn_thresholds=attn))
        for kind, _ in kinds:
            log(f"sparsify: per-layer sparsity of the {KINDS[kind]} by sensitivity: " + "; ".join(
                f"{lv:g}: " + " ".join(f"{v:.2f}" for v in s) for lv, s in zip(levels, allocated[kind])))
    if a.eval_chunks <= 0:
        return 0
    if a.heldout is not None:
        held = encode_prefix(Model(a.output).tokenizer, a.heldout.read_text(encoding="utf-8"),
                             2 * a.ctx * max(2, a.eval_chunks))
    else:
        held = tokens[n_calib:]
    if len(held) < 2 * a.ctx:
        log(f"sparsify: {len(held)} held-out tokens, fewer than 2 windows of {a.ctx}: no model card "
            "(give --heldout or a longer corpus)")
        return 0
    rows = evaluate(a.model, a.output, levels, held, a.ctx, a.eval_chunks, a.threads)
    speeds, slow = None, None
    if a.speed_tokens > 0:
        log(f"sparsify: timing decode (tg{a.speed_tokens}) of the dense model and of each run")
        speeds = decode_speeds(a.output, a.speed_tokens, a.threads)
        slow = slower_than_dense(speeds[0], default, inputs is not None, attn is not None)
        if slow:
            log(f"sparsify: warning: {slow}")
    fmt = lambda b: f"{b / 2**20:.1f} MiB"   # noqa: E731
    text = card(a.model, a.output, levels, thresholds, inputs, types, rows, n_calib, a.ctx, fmt, attn,
                weighted=act_scale is not None, speeds=speeds, slow=slow)
    card_path = a.output.with_name(a.output.name + ".card.md")
    card_path.write_text(text, encoding="utf-8")
    print(text)
    log(f"sparsify: model card in {card_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
