"""Activation sparsity of ordinary (SwiGLU / GeGLU) models: the metadata tools/sparsify.py writes and
the per-layer thresholds a context runs with.

A gate-sparse file is a dense GGUF file with, per layer, ``blk.N.ffn_down_t.weight`` (the down matrix
transposed: row i = channel i's output vector) beside ``ffn_down``, and these keys:

    powerinfer.act_sparsity.method       "cats": a channel runs when |act(gate . x)| >= its layer's threshold
    powerinfer.act_sparsity.levels       f32 [k]          target sparsities (fraction of channels skipped)
    powerinfer.act_sparsity.thresholds   f32 [k * n_layer] level j's thresholds are [j * n_layer, (j + 1) * n_layer)
    powerinfer.act_sparsity.input_thresholds f32 [k * n_layer] optional, with blk.N.ffn_gate_t.weight (the gate
                                         transposed): the gate reads only the FFN input entries with |x_j| >= it
                                         (TEAL on the gate's input; 0: the dense gate)
    powerinfer.act_sparsity.attn_thresholds f32 [2 * k * n_layer] optional (Q4_0 / Q4_K / Q6_K attention): level j's
                                         [j][0][il] on the attention input (q, k and v read the entries with
                                         |x_j| >= it), [j][1][il] on the attention output (wo's input); TEAL
    powerinfer.act_sparsity.default      f32              the level a context uses when none is asked for
    powerinfer.act_sparsity.measured     f32 [k]          sparsity measured with the engine on held-out text

The gate is computed densely; only the up rows and the down_t rows of the selected channels are read.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

PREFIX = "powerinfer.act_sparsity."
METHOD_KEY = PREFIX + "method"
LEVELS_KEY = PREFIX + "levels"
THRESHOLDS_KEY = PREFIX + "thresholds"
INPUT_THRESHOLDS_KEY = PREFIX + "input_thresholds"
ATTN_THRESHOLDS_KEY = PREFIX + "attn_thresholds"
DEFAULT_KEY = PREFIX + "default"
MEASURED_KEY = PREFIX + "measured"
METHOD = "cats"


@dataclass(frozen=True)
class SparsityLevels:
    """The stored levels of a gate-sparse file."""
    levels: np.ndarray        # [k] target sparsities
    thresholds: np.ndarray    # [k, n_layer]
    default: float | None
    measured: np.ndarray | None
    input_thresholds: np.ndarray | None = None   # [k, n_layer] or None
    attn_thresholds: np.ndarray | None = None    # [k, 2, n_layer] (attention input, output) or None

    def index(self, sparsity: float) -> int:
        for j, level in enumerate(self.levels):
            if abs(float(level) - sparsity) < 1e-4:
                return j
        have = ", ".join(f"{float(v):g}" for v in self.levels) or "none"
        raise ValueError(f"sparsity {sparsity:g} is not stored in this file (levels: {have}); "
                         "run tools/sparsify.py with --sparsity to add it, or pass --sparse-threshold")

    def thresholds_for(self, sparsity: float) -> np.ndarray:
        """The channel thresholds [n_layer] of the stored level `sparsity` (ValueError naming the levels otherwise)."""
        return self.thresholds[self.index(sparsity)].astype(np.float32)

    def input_thresholds_for(self, sparsity: float) -> np.ndarray | None:
        """The gate-input thresholds [n_layer] of the level, None when the file has none."""
        j = self.index(sparsity)
        return None if self.input_thresholds is None else self.input_thresholds[j].astype(np.float32)

    def attn_thresholds_for(self, sparsity: float) -> np.ndarray | None:
        """The attention thresholds [2, n_layer] (input, output) of the level, None when the file has none."""
        j = self.index(sparsity)
        return None if self.attn_thresholds is None else self.attn_thresholds[j].astype(np.float32)


def _optional_thresholds(path, meta: dict, key: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """The thresholds under key as an array of this shape, None when the file has none; ValueError when malformed."""
    values = meta.get(key)
    if values is None:
        return None
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size != math.prod(shape) or np.any(np.isnan(values)):
        raise ValueError(f"{path}: {key} must hold {' x '.join(str(n) for n in shape)} numbers")
    return values.reshape(shape)


def read_levels(path, meta: dict, n_layer: int) -> SparsityLevels:
    """The levels in a file's metadata (empty when it has none); ValueError for malformed keys."""
    method = meta.get(METHOD_KEY, METHOD)
    if method != METHOD:
        raise ValueError(f"{path}: {METHOD_KEY} = {method!r}; this build knows {METHOD!r} only")
    levels = np.asarray(meta.get(LEVELS_KEY, []), dtype=np.float64).reshape(-1)
    thr = np.asarray(meta.get(THRESHOLDS_KEY, []), dtype=np.float64).reshape(-1)
    if thr.size != levels.size * n_layer:
        raise ValueError(f"{path}: {THRESHOLDS_KEY} has {thr.size} values, expected {levels.size} levels x "
                         f"{n_layer} layers")
    if not np.all(np.isfinite(levels)) or np.any((levels < 0) | (levels >= 1)):
        raise ValueError(f"{path}: {LEVELS_KEY} must be sparsities in [0, 1)")
    if np.any(np.isnan(thr)):
        raise ValueError(f"{path}: {THRESHOLDS_KEY} holds NaN")
    default = meta.get(DEFAULT_KEY)
    if default is not None:
        if isinstance(default, bool) or not isinstance(default, (int, float)) or not math.isfinite(default):
            raise ValueError(f"{path}: {DEFAULT_KEY} = {default!r} is not a number")
        default = float(default)
    measured = meta.get(MEASURED_KEY)
    measured = None if measured is None else np.asarray(measured, dtype=np.float64).reshape(-1)
    inp = _optional_thresholds(path, meta, INPUT_THRESHOLDS_KEY, (levels.size, n_layer))
    attn = _optional_thresholds(path, meta, ATTN_THRESHOLDS_KEY, (levels.size, 2, n_layer))
    out = SparsityLevels(levels, thr.reshape(levels.size, n_layer), default, measured, inp, attn)
    if default is not None:
        out.thresholds_for(default)   # the default must be one of the levels
    return out


def metadata(levels, thresholds, default: float, measured=None, input_thresholds=None, attn_thresholds=None) -> dict:
    """The keys for a file: levels [k], thresholds [k, n_layer], input_thresholds [k, n_layer] or None,
    attn_thresholds [k, 2, n_layer] or None."""
    levels = [float(v) for v in levels]
    flat = lambda a: [float(v) for v in np.asarray(a, dtype=np.float64).reshape(-1)]   # noqa: E731
    meta = {METHOD_KEY: METHOD, LEVELS_KEY: levels, DEFAULT_KEY: float(default), THRESHOLDS_KEY: flat(thresholds)}
    if input_thresholds is not None:
        meta[INPUT_THRESHOLDS_KEY] = flat(input_thresholds)
    if attn_thresholds is not None:
        meta[ATTN_THRESHOLDS_KEY] = flat(attn_thresholds)
    if measured is not None:
        meta[MEASURED_KEY] = [float(v) for v in measured]
    return meta


def describe(ctx) -> str:
    """One log line: how a context runs a gate-sparse file."""
    if not ctx.sparse:
        return "gate-sparse file, every channel computed (--dense): the exact dense model"
    gather = ctx.sparse_gather_max
    batches = (f"; calls of more than {gather} token{'s' if gather > 1 else ''} over the dense kernels" if gather > 0
               else "; every call through the sparse kernels")
    if ctx.sparse_batch_max > 0:
        batches += f"; calls of more than {ctx.sparse_batch_max} tokens (prompts) run the dense model"
    if ctx.sparsity is not None:
        t = ctx.layer_thresholds
        gate = "" if ctx.input_thresholds is None else ", the gate over the input entries above their thresholds"
        attn = "" if ctx.attn_thresholds is None else ", q/k/v and wo over the attention's entries above theirs"
        return (f"activation-sparse inference at the stored level {ctx.sparsity:g} "
                f"(|act(gate)| thresholds {float(t.min()):.4g}..{float(t.max()):.4g}{gate}{attn}){batches}")
    return f"activation-sparse inference, |act(gate)| >= {ctx.sparse_threshold:g} in every layer{batches}"


# The column-block layouts the loader packs a file's own Q4_0 / Q4_K / Q6_K ffn_down (and, for gate inputs, ffn_gate)
# into instead of reading the tool's re-quantized ffn_down_t / ffn_gate_t (core/src/repack.c): ggml type id -> (inputs
# per unit, bits per quant, bytes of scales per unit and output, read in full for every unit with a kept channel).
_COLS = {2: (32, 4, 2), 12: (256, 4, 20), 14: (256, 6, 18)}   # Q4_0 -> Q4_0C, Q4_K -> Q4_KC, Q6_K -> Q6_KC


def has_column_layout(ggml_type: int, ne) -> bool:
    """Whether the loader lays a matrix of this type and ne [n_in, n_out] out by input (core/src/repack.c cols_type):
    then a gate-sparse file needs no transposed copy of it."""
    return ggml_type in _COLS and len(ne) == 2 and int(ne[1]) % 64 == 0 and int(ne[0]) % _COLS[ggml_type][0] == 0


def _cols_bytes(t) -> tuple[int, int] | None:
    """(quant bytes, scale bytes) of the column layout the loader makes of matrix t [n_in, n_out], None if none."""
    if t is None or not has_column_layout(t.type, t.ne):
        return None
    unit, bits, aux = _COLS[t.type]
    n_in, n_out = int(t.ne[0]), int(t.ne[1])
    return n_in * n_out * bits // 8, n_in // unit * n_out * aux


def decode_bytes(tensors) -> dict[str, int]:
    """Weight bytes one decoded token reads, by part, from a file's tensors (name -> TensorInfo): attn, out (the
    output head; token_embd when the head is tied), gate, up, down, and a gate-sparse file's down_t and gate_t (what a
    level reads instead of down and, with gate inputs, of gate: the loader's column layout of the file's Q4_0 / Q4_K /
    Q6_K matrix where it makes one, its quants in down_t / gate_t and its scales, read in full, in down_aux /
    gate_aux; else the file's transposed copy)."""
    parts = {"attn": 0, "out": 0, "gate": 0, "up": 0, "down": 0, "down_t": 0, "gate_t": 0, "down_aux": 0,
             "gate_aux": 0, "qkv": 0, "qkv_t": 0, "qkv_aux": 0, "wo": 0, "wo_t": 0, "wo_aux": 0}
    for name, t in tensors.items():
        n = int(t.data.nbytes)
        if name.startswith("output.") and name.endswith("weight") and t.data.ndim >= 1 and "norm" not in name:
            parts["out"] += n
        elif ".attn_" in name and "norm" not in name:
            parts["attn"] += n
            # the input-sparse attention (attn_thresholds): q, k, v and wo by input, where the loader lays them out
            part = "wo" if name.endswith(".attn_output.weight") else "qkv" if name.endswith(
                (".attn_q.weight", ".attn_k.weight", ".attn_v.weight")) else None
            cols = _cols_bytes(t) if part else None
            if cols is not None:
                parts[part] += n
                parts[f"{part}_t"] += cols[0]
                parts[f"{part}_aux"] += cols[1]
        else:
            for part in ("gate", "up", "down"):
                if name.endswith(f".ffn_{part}.weight"):
                    parts[part] += n
            for part in ("down", "gate"):   # a level's down step / input-sparse gate: the column layout, else _t
                cols = _cols_bytes(t) if name.endswith(f".ffn_{part}.weight") else None
                if cols is not None:
                    parts[f"{part}_t"] += cols[0]
                    parts[f"{part}_aux"] += cols[1]
                elif name.endswith(f".ffn_{part}_t.weight") and \
                        _cols_bytes(tensors.get(name.replace(f"ffn_{part}_t", f"ffn_{part}"))) is None:
                    parts[f"{part}_t"] += n
    if parts["out"] == 0 and "token_embd.weight" in tensors:   # tied head: the output matmul reads all of it
        parts["out"] = int(tensors["token_embd.weight"].data.nbytes)
    return parts


def dense_bytes(parts: dict[str, int]) -> int:
    """What a dense token reads (decode_bytes' parts)."""
    return sum(parts[k] for k in ("attn", "out", "gate", "up", "down"))


def level_bytes(parts: dict[str, int], channels: float, inputs: float | None = None,
                attn: tuple[float, float] | None = None) -> int:
    """What a token reads at a level: attention and the head, the gate (dense; with gate inputs the fraction
    `inputs` of gate_t's rows and gate_aux), the fraction `channels` of the up and down_t rows, and down_aux;
    with attn = (fraction of the attention input read, of its output read) q/k/v and wo by input likewise.
    dense_bytes / this is the speed-up bound of memory-bound decode."""
    gate = parts["gate"] if inputs is None else inputs * parts["gate_t"] + parts.get("gate_aux", 0)
    att = parts["attn"]
    if attn is not None:
        att += (attn[0] * parts["qkv_t"] + parts["qkv_aux"] - parts["qkv"] +
                attn[1] * parts["wo_t"] + parts["wo_aux"] - parts["wo"])
    return int(att + parts["out"] + gate + channels * (parts["up"] + parts["down_t"]) +
               parts.get("down_aux", 0))


# ---------------------------------------------------------------------------- running and timing the levels
@dataclass(frozen=True)
class LevelRun:
    """One way to run a gate-sparse file: `name` ("dense", "0.5", "0.5+in", "0.5+in+attn"), the stored level
    (None: dense), and which thresholds of it apply: "channels" (CATS, the gate dense), "gate" (the gate's input
    too: TEAL on the gate), "attn" (every kind the file stores, the attention's inputs too)."""
    name: str
    level: float | None
    reads: str = "channels"


def level_runs(levels: SparsityLevels, which=None) -> list[LevelRun]:
    """The runs of a file, dense first: per stored level (or per level of `which`) the channels alone, and with
    the gate's input and the attention's inputs where the file stores thresholds for them."""
    runs = [LevelRun("dense", None)]
    for lv in (levels.levels if which is None else which):
        lv = float(levels.levels[levels.index(float(lv))])
        runs.append(LevelRun(f"{lv:g}", lv, "channels"))
        if levels.input_thresholds is not None:
            runs.append(LevelRun(f"{lv:g}+in", lv, "gate"))
        if levels.attn_thresholds is not None:
            runs.append(LevelRun(f"{lv:g}+in+attn" if levels.input_thresholds is not None else f"{lv:g}+attn",
                                 lv, "attn"))
    return runs


def level_context(model, run: LevelRun, **kw):
    """A Context that runs `run` on a gate-sparse model (kw: Context's arguments). Dense: dense=True, exactly
    the input model."""
    from .context import Context
    if run.level is None:
        return Context(model, dense=True, **kw)
    ctx = Context(model, sparsity=run.level, **kw)
    if run.reads == "channels" and ctx.input_thresholds is not None:
        ctx.set_gate_input_thresholds(None)
    if run.reads != "attn" and ctx.attn_thresholds is not None:
        ctx.set_attn_input_thresholds(None)
    return ctx


def read_shares(ctx) -> tuple[float, float, float]:
    """(channels computed, gate inputs read, attention inputs read) since the stats' last reset, as fractions
    (1.0 for what the context reads densely)."""
    def share(stats) -> float:
        active, total = stats()
        return float(active.sum()) / (total * len(active)) if total else 1.0
    if not ctx.sparse:
        return 1.0, 1.0, 1.0
    return (share(ctx.sparse_stats), share(ctx.gate_input_stats) if ctx.input_thresholds is not None else 1.0,
            share(ctx.attn_input_stats) if ctx.attn_thresholds is not None else 1.0)


def decode_speeds(ctxs: dict, n_vocab: int, n_gen: int = 32, repeat: int = 3, seed: int = 0) -> dict:
    """Decode tokens/s of each context ({name: ctx}), interleaved token by token: each run clears every KV cache and
    decodes a fixed 8-token prompt as one batch in each context, then the n_gen fixed pseudo-random tokens one at a
    time, every context its token i before any its token i + 1 (starting with a different context each token), each
    call timed alone; a context's tokens/s is n_gen over the sum of its calls. So every context sees the same phases
    of a shared machine's memory bandwidth (which on our VMs swings by 10-20% within seconds: runs of 24 tokens one
    context after the other put 1.14x-1.43x between the same two levels). -r runs, median. A warm-up of 4 tokens
    each first (pages the file in for every path). Returns {name: (median tokens/s, [each run's], read_shares over
    the last run)}."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(3, n_vocab, 8).tolist()
    tokens = rng.integers(3, n_vocab, n_gen).tolist()
    names = list(ctxs)

    def run(toks) -> dict:
        spent = dict.fromkeys(names, 0.0)
        for ctx in ctxs.values():
            ctx.kv_clear()
            ctx.decode(prompt, logits="last")
            if ctx.sparse:
                ctx.sparse_stats_reset()
        for i, t in enumerate(toks):
            for j in range(len(names)):
                name = names[(i + j) % len(names)]
                t0 = time.perf_counter()
                ctxs[name].decode([t])
                spent[name] += time.perf_counter() - t0
        return {name: len(toks) / spent[name] for name in names}

    run(tokens[:4])
    speeds = {name: [] for name in ctxs}
    for _ in range(repeat):
        for name, v in run(tokens).items():
            speeds[name].append(v)
    return {name: (statistics.median(s), s, read_shares(ctxs[name])) for name, s in speeds.items()}
