#!/usr/bin/env python3
"""Train PowerInfer's per-layer activation predictors for a Hugging Face llama/bamboo
checkpoint (the original project never published its trainer).

    python tools/train_predictor.py MODEL_DIR TEXT_FILE --out PREDICTOR_DIR [--ctx 512]
        [--max-tokens N] [--epochs E] [--rank R | --rank-auto] [--threshold 0.0] [--seed 0]

Data: TEXT_FILE is tokenized with the model's sentencepiece tokenizer; the last 10% of the
tokens are held out for validation (windowed separately, so no window straddles the split).
Windows are [BOS] + ctx-1 tokens, run through ``hf_llama_torch`` in float32. For every
token and layer the pair (ffn_inp, active) is kept: ffn_inp = the residual after attention,
BEFORE ffn_norm (what the engine feeds the predictor, spec 4.1), active[i] = neuron i is
nonzero (relu(gate x) > 0; bamboo: relu(gate x) > 0 and relu(up x) > 0).

Model per layer (spec 4.2): score = fc2(relu(fc1(x))), no biases, fc1: n_embd -> r,
fc2: r -> n_ff; neuron predicted active iff score >= --threshold (default 0.0 = sigmoid 0.5).
Training: BCEWithLogits against the mask, per-neuron pos_weight = sqrt((1-p_i)/p_i) clamped
to [1, 100] (p_i: the neuron's activation rate on the training tokens; the square root leans
toward recall without flooding predictions), Adam, --epochs passes over shuffled minibatches
with a cosine learning-rate decay. Inputs are divided by their per-dimension RMS during
training (llama residuals have a few huge dimensions); the scale is folded into fc1 on
export, so the files take the raw ffn_inp like the engine gives them.
Deterministic: torch.manual_seed / a seeded generator per layer, deterministic algorithms;
the same seed, data, torch version and --threads give the same files.

Rank: --rank R (default min(1024, max(16, n_embd/4))) for every layer, or --rank-auto: for
each layer, train the candidate ranks (--rank-candidates, default n_embd/32, /16, /8, /4, /2,
n_embd, those >= 8) in increasing order and keep the SMALLEST whose validation recall at
--threshold reaches --target-recall (0.9) AND whose precision reaches --target-precision
(0.5; without it "predict every neuron active" would win with recall 1.0); if none does, the
one with the best F1 (harmonic mean of recall and precision). The choice is made on the
validation tokens, so the reported numbers are a little optimistic for auto ranks.

Output: PREDICTOR_DIR/model_{i}.pt = torch.save of {"fc1.weight": [r, n_embd],
"fc2.weight": [n_ff, r]} (float32, or float16 with --dtype f16), and PREDICTOR_DIR/config.json
{"sparse_threshold": thr, "ranks": [...], "recall": [...], "precision": [...], ...}, which
convert.py reads (``sparse_threshold``). Recall = TP/(TP+FN), precision = TP/(TP+FP), over all
(held-out token, neuron) pairs; 1.0 when the denominator is 0.

Memory: the (ffn_inp, mask) data of one layer takes N*(4*n_embd + n_ff/8) bytes for N tokens.
Layers are processed in groups that fit --max-memory-gb (default 8): the model is run once per
group, up to the group's last layer, and the group's data is freed after training. Cap the
data with --max-tokens. Errors are one line on stderr, exit 1. A layer whose validation recall
is below --target-recall gets a warning (config.json: layers_below_target_recall); with --strict
the run then exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hf_llama_torch import (LlamaTorch, ToolError, check_inputs, error_exit,  # noqa: E402
                            load_model, make_windows, prepare_tokens)

PROG = "train_predictor"
VAL_FRACTION = 0.1
POS_WEIGHT_MAX = 100.0


def default_rank(n_embd: int) -> int:
    return min(1024, max(16, n_embd // 4))


def default_rank_candidates(n_embd: int) -> list[int]:
    cands = {n_embd // d for d in (32, 16, 8, 4, 2, 1)}
    return sorted(r for r in cands if r >= 8) or [max(1, n_embd)]


# --------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------

class LayerData:
    """ffn_inp rows (float32 [N, n_embd]) and packed active masks (uint8 [N, ceil(n_ff/8)])
    of one layer; rows [0, n_train) are training tokens, the rest validation."""

    def __init__(self, n_rows: int, n_train: int, n_embd: int, n_ff: int):
        self.x = torch.empty(n_rows, n_embd, dtype=torch.float32)
        self.mask = np.empty((n_rows, (n_ff + 7) // 8), dtype=np.uint8)
        self.n_train, self.n_ff = n_train, n_ff

    def masks(self, rows) -> torch.Tensor:
        """Float 0/1 targets [len(rows), n_ff] for the given row indices (or slice)."""
        bits = np.unpackbits(self.mask[rows], axis=1, count=self.n_ff)
        return torch.from_numpy(bits).to(torch.float32)


def collect(model: LlamaTorch, windows: Sequence[Sequence[int]], n_train: int,
            layers: Sequence[int], progress: bool = True) -> dict[int, LayerData]:
    """Run every window up to max(layers)+1 layers, keeping (ffn_inp, mask) of ``layers``."""
    from tqdm import tqdm
    c = model.config
    n_rows = sum(len(w) for w in windows)
    data = {il: LayerData(n_rows, n_train, c.n_embd, c.n_ff) for il in layers}
    off = 0

    def hook(il, ffn_inp, h, active):
        d = data.get(il)
        if d is not None:
            d.x[off:off + ffn_inp.shape[0]] = ffn_inp
            d.mask[off:off + ffn_inp.shape[0]] = np.packbits(active.numpy(), axis=1)

    desc = f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"
    with tqdm(total=n_rows, unit="tok", desc=f"collect {desc}", file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        for w in windows:
            model.forward(w, ffn_hook=hook, n_layers=max(layers) + 1)
            off += len(w)
            bar.update(len(w))
    return data


# --------------------------------------------------------------------------------------
# predictor
# --------------------------------------------------------------------------------------

def predictor_scores(sd: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """score = fc2 relu(fc1 x) for rows x [N, n_embd] -> [N, n_ff] (engine formula, float32)."""
    return torch.relu(x @ sd["fc1.weight"].float().T) @ sd["fc2.weight"].float().T


def evaluate(sd: dict[str, torch.Tensor], data: LayerData, threshold: float,
             batch: int = 1024) -> tuple[float, float]:
    """(recall, precision) of score >= threshold on the validation rows of ``data``."""
    tp = fp = fn = 0
    for s in range(data.n_train, data.x.shape[0], batch):
        rows = slice(s, min(s + batch, data.x.shape[0]))
        pred = predictor_scores(sd, data.x[rows]) >= threshold
        true = data.masks(rows).bool()
        tp += int((pred & true).sum())
        fp += int((pred & ~true).sum())
        fn += int((~pred & true).sum())
    recall = tp / (tp + fn) if tp + fn else 1.0
    precision = tp / (tp + fp) if tp + fp else 1.0
    return recall, precision


def f1(recall: float, precision: float) -> float:
    return 2 * recall * precision / (recall + precision) if recall + precision else 0.0


def train_layer(data: LayerData, rank: int, epochs: int, seed: int, lr: float = 3e-3,
                batch: int = 256, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Train fc2(relu(fc1 x)) on the training rows; returns the export state_dict."""
    n_train = data.n_train
    x_train = data.x[:n_train]
    n_embd = x_train.shape[1]
    scale = x_train.pow(2).mean(0).sqrt().clamp_min(1e-6)            # per-dim RMS
    rate = torch.zeros(data.n_ff, dtype=torch.float64)
    for s in range(0, n_train, 4096):
        rate += data.masks(slice(s, min(s + 4096, n_train))).sum(0, dtype=torch.float64)
    rate = (rate / max(n_train, 1)).float()
    pos_weight = ((1 - rate) / rate.clamp_min(1e-6)).sqrt().clamp(1.0, POS_WEIGHT_MAX)

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    fc1 = torch.nn.Linear(n_embd, rank, bias=False)
    fc2 = torch.nn.Linear(rank, data.n_ff, bias=False)
    params = list(fc1.parameters()) + list(fc2.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    steps_per_epoch = max(1, math.ceil(n_train / batch))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, epochs * steps_per_epoch))
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    for _ in range(epochs):
        perm = torch.randperm(n_train, generator=gen)
        for s in range(0, n_train, batch):
            idx = perm[s:s + batch]
            xb = x_train[idx] / scale
            yb = data.masks(idx.numpy())
            loss = loss_fn(fc2(torch.relu(fc1(xb))), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        w1 = fc1.weight / scale[None, :]                              # fold the input scale
        return {"fc1.weight": w1.to(dtype).contiguous(),
                "fc2.weight": fc2.weight.detach().to(dtype).contiguous()}


# --------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------

def split_tokens(ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(train ids, validation ids): the last 10% (at least 1 token) are held out."""
    if len(ids) < 2:
        raise ToolError(f"need at least 2 tokens of text, got {len(ids)}")
    n_val = max(1, int(round(len(ids) * VAL_FRACTION)))
    return list(ids[:-n_val]), list(ids[-n_val:])


def layer_groups(n_layer: int, bytes_per_layer: int, max_memory_gb: float) -> list[list[int]]:
    per_group = max(1, int(max_memory_gb * (1 << 30) // max(1, bytes_per_layer)))
    return [list(range(s, min(s + per_group, n_layer))) for s in range(0, n_layer, per_group)]


def train(model_dir: str, text_file: str, out: str, ctx: int = 512,
          max_tokens: Optional[int] = None, epochs: int = 10, rank: Optional[int] = None,
          rank_auto: bool = False, rank_candidates: Optional[Sequence[int]] = None,
          target_recall: float = 0.9, target_precision: float = 0.5, threshold: float = 0.0, seed: int = 0,
          tokenizer: Optional[str] = None, dtype: str = "f32", max_memory_gb: float = 8.0,
          lr: float = 3e-3, batch: int = 256, progress: bool = True, log=None,
          model: Optional[LlamaTorch] = None) -> dict:
    """Train and write all predictors. Returns the config.json dict (plus "candidates")."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    check_inputs(model_dir, text_file)
    if epochs < 1:
        raise ToolError("--epochs must be at least 1")
    if not 0.0 <= target_recall <= 1.0 or not 0.0 <= target_precision <= 1.0:
        raise ToolError("--target-recall and --target-precision must be in [0, 1]")
    if ctx < 2:
        raise ToolError("--ctx must be at least 2")
    if dtype not in ("f32", "f16"):
        raise ToolError("--dtype must be f32 or f16")
    model = model or load_model(model_dir)
    c = model.config
    if rank is not None and rank < 1:
        raise ToolError("--rank must be positive")
    cands = sorted(set(rank_candidates or default_rank_candidates(c.n_embd)))
    if rank_auto and (not cands or cands[0] < 1):
        raise ToolError("--rank-candidates must be positive integers")
    fixed_rank = rank or default_rank(c.n_embd)
    if c.hidden_act != "relu":
        log(f"{PROG}: warning: hidden_act is {c.hidden_act!r}: the model is not ReLU-sparse, "
            f"almost every neuron is active")

    ids, bos = prepare_tokens(model_dir, text_file, tokenizer, max_tokens, c)
    train_ids, val_ids = split_tokens(ids)
    train_windows, val_windows = make_windows(train_ids, ctx, bos), make_windows(val_ids, ctx, bos)
    n_train = sum(len(w) for w in train_windows)
    n_val = sum(len(w) for w in val_windows)
    bytes_per_layer = (n_train + n_val) * (4 * c.n_embd + (c.n_ff + 7) // 8)
    groups = layer_groups(c.n_layer, bytes_per_layer, max_memory_gb)
    log(f"{PROG}: {len(ids)} text tokens -> {n_train} training / {n_val} validation positions "
        f"(BOS included); {bytes_per_layer / 2**20:.1f} MiB of data per layer, "
        f"{len(groups)} pass(es) over the text")

    os.makedirs(out, exist_ok=True)
    tdtype = torch.float16 if dtype == "f16" else torch.float32
    ranks: list[int] = []
    recalls: list[float] = []
    precisions: list[float] = []
    densities: list[float] = []
    tried: list[list[dict]] = []
    for group in groups:
        data = collect(model, train_windows + val_windows, n_train, group, progress)
        for il in group:
            d = data.pop(il)
            t0 = time.time()
            attempts = []
            best = None
            for r in (cands if rank_auto else [fixed_rank]):
                sd = train_layer(d, r, epochs, seed=seed * 100003 + il * 131 + r, lr=lr,
                                 batch=batch, dtype=tdtype)
                rec, prec = evaluate(sd, d, threshold)
                attempts.append({"rank": r, "recall": rec, "precision": prec})
                if best is None or f1(rec, prec) > f1(best[1], best[2]) + 1e-12:
                    best = (sd, rec, prec, r)
                if rank_auto and rec >= target_recall and prec >= target_precision:
                    best = (sd, rec, prec, r)
                    break
            sd, rec, prec, r = best
            density = float(d.masks(slice(d.n_train, d.x.shape[0])).mean()) if n_val else 0.0
            torch.save(sd, os.path.join(out, f"model_{il}.pt"))
            ranks.append(r)
            recalls.append(rec)
            precisions.append(prec)
            densities.append(density)
            tried.append(attempts)
            extra = ("  tried " + ", ".join(f"r={a['rank']}: {a['recall']:.3f}/{a['precision']:.3f}"
                                            for a in attempts)
                     if rank_auto else "")
            log(f"layer {il:3d}: rank {r:5d}  recall {rec:.4f}  precision {prec:.4f}  "
                f"active rate {density:.4f}  ({time.time() - t0:.1f}s){extra}")
        del data

    below = [il for il, rec in enumerate(recalls) if rec < target_recall]
    if below:
        log(f"{PROG}: warning: {len(below)} of {len(recalls)} layer(s) miss the recall target {target_recall} "
            f"on the validation tokens: " + ", ".join(f"layer {il} {recalls[il]:.4f}" for il in below[:8])
            + (", ..." if len(below) > 8 else "") + " (more data, epochs or rank; or a lower --threshold)")
    config = {
        "sparse_threshold": float(threshold),
        "target_recall": float(target_recall),
        "layers_below_target_recall": below,
        "ranks": ranks,
        "recall": recalls,
        "precision": precisions,
        "active_rate": densities,
        "rank_rule": (f"smallest of {cands} with validation recall >= {target_recall} and "
                      f"precision >= {target_precision}, else best F1") if rank_auto
                     else f"fixed {fixed_rank}",
        "n_train_tokens": n_train,
        "n_val_tokens": n_val,
        "ctx": ctx,
        "epochs": epochs,
        "seed": seed,
    }
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return dict(config, candidates=tried)


def _int_list(s: str) -> list[int]:
    try:
        return [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", metavar="MODEL_DIR", help="HF checkpoint directory (config.json + weights)")
    ap.add_argument("text_file", metavar="TEXT_FILE", help="UTF-8 training text")
    ap.add_argument("--out", required=True, metavar="PREDICTOR_DIR", help="output directory")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per window, BOS included (512)")
    ap.add_argument("--max-tokens", type=int, default=None, help="use at most N text tokens")
    ap.add_argument("--epochs", type=int, default=10, help="passes over the training tokens (10)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--rank", type=int, default=None,
                   help="predictor rank for every layer (default min(1024, max(16, n_embd/4)))")
    g.add_argument("--rank-auto", action="store_true",
                   help="per layer: the smallest candidate rank reaching --target-recall "
                        "and --target-precision on the validation tokens")
    ap.add_argument("--rank-candidates", type=_int_list, default=None,
                    help="comma-separated ranks for --rank-auto (default n_embd/32 ... n_embd)")
    ap.add_argument("--target-recall", type=float, default=0.9,
                    help="validation recall every layer should reach: picks ranks with --rank-auto; a layer "
                         "below it is warned about (0.9)")
    ap.add_argument("--strict", action="store_true",
                    help="exit with status 2 when a layer misses --target-recall (the files are still written)")
    ap.add_argument("--target-precision", type=float, default=0.5, help="for --rank-auto (0.5)")
    ap.add_argument("--threshold", type=float, default=0.0,
                    help="score threshold, written as sparse_threshold (0.0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="sentencepiece model (default MODEL_DIR/tokenizer.model)")
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="weights of the files (f32)")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (3e-3)")
    ap.add_argument("--batch", type=int, default=256, help="tokens per minibatch (256)")
    ap.add_argument("--max-memory-gb", type=float, default=8.0,
                    help="RAM for collected data; more layers than fit means more passes (8)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    try:
        cfg = train(args.model_dir, args.text_file, args.out, ctx=args.ctx,
                    max_tokens=args.max_tokens, epochs=args.epochs, rank=args.rank,
                    rank_auto=args.rank_auto, rank_candidates=args.rank_candidates,
                    target_recall=args.target_recall, target_precision=args.target_precision,
                    threshold=args.threshold, seed=args.seed,
                    tokenizer=args.tokenizer, dtype=args.dtype, max_memory_gb=args.max_memory_gb,
                    lr=args.lr, batch=args.batch, progress=not args.no_progress)
    except (ToolError, OSError) as e:
        return error_exit(PROG, e)
    n = len(cfg["ranks"])
    print(f"wrote {n} predictors to {args.out} (sparse_threshold {cfg['sparse_threshold']})")
    if n:
        print(f"mean recall {sum(cfg['recall']) / n:.4f}  mean precision {sum(cfg['precision']) / n:.4f}")
    if cfg["layers_below_target_recall"] and args.strict:
        print(f"{PROG}: error: --strict: layers {cfg['layers_below_target_recall']} are below the recall target "
              f"{args.target_recall}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
