#!/usr/bin/env python3
"""Numbers and plot for the bundled model's card (models/README.md).

    PYTHONPATH=bindings python tools/model_card_stats.py [--hf models/tinyrelu-hf]
        [--pred models/tinyrelu-hf/predictor] [--dir models/tinyrelu] [--name tinyrelu]
        [--text data/heldout.txt] [--sweep -2,-1,-0.5,0,0.5] [--out models/tinyrelu/stats.json]
        [--plot models/tinyrelu/firing_rates.png]

On the held-out text (windows of 256 tokens, [BOS] + 255, like the profiler):
  * per layer, the activation sparsity of the torch checkpoint (1 - mean fraction of neurons
    with relu(gate x) > 0) and every neuron's firing rate; the plot shows the sorted firing
    rates of each layer on a log scale (the hot/cold power law);
  * per layer, the predictor's recall and precision at the threshold written in the
    predictor config (true = neuron active, predicted = fc2(relu(fc1 ffn_inp)) >= threshold);
  * with the engine (tools/eval_perplexity.py): perplexity of the dense GGUF, of the F16 and
    Q4_0 PowerInfer files at their default threshold (and of the F16 one in dense mode), the
    fraction of neurons the sparse FFN computed per layer, and, with --sweep, the F16 sparse
    perplexity at other thresholds.
Writes --out (JSON) and --plot (PNG) and prints a markdown summary.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def torch_stats(hf: str, pred: str, text: str, ctx: int, threshold: float):
    import torch
    from hf_llama_torch import load_model, make_windows, prepare_tokens

    model = load_model(hf)
    c = model.config
    ids, bos = prepare_tokens(hf, text, None, None, c)
    windows = make_windows(ids, ctx, bos)
    preds = []
    for il in range(c.n_layer):
        sd = torch.load(os.path.join(pred, f"model_{il}.pt"), map_location="cpu", weights_only=True)
        preds.append((sd["fc1.weight"].float(), sd["fc2.weight"].float()))
    fire = [torch.zeros(c.n_ff, dtype=torch.float64) for _ in range(c.n_layer)]
    tp = [0] * c.n_layer
    fn = [0] * c.n_layer
    fp = [0] * c.n_layer
    n_tok = 0

    def hook(il, ffn_inp, h, active):
        fire[il] += active.sum(0).double()
        fc1, fc2 = preds[il]
        score = torch.relu(ffn_inp @ fc1.T) @ fc2.T
        p = score >= threshold
        tp[il] += int((p & active).sum())
        fn[il] += int((~p & active).sum())
        fp[il] += int((p & ~active).sum())

    for w in windows:
        model.forward(w, ffn_hook=hook, logits=False)
        n_tok += len(w)
    rates = [(f / n_tok).tolist() for f in fire]
    return {
        "n_tokens": n_tok,
        "sparsity": [1.0 - sum(r) / len(r) for r in rates],
        "recall": [tp[i] / max(1, tp[i] + fn[i]) for i in range(c.n_layer)],
        "precision": [tp[i] / max(1, tp[i] + fp[i]) for i in range(c.n_layer)],
        "predicted_fraction": [(tp[i] + fp[i]) / (n_tok * c.n_ff) for i in range(c.n_layer)],
        "firing_rates": rates,
        "n_params": sum(t.numel() for t in [model.embed, model.norm] + ([] if model.lm_head is model.embed else [model.lm_head]))
        + sum(sum(v.numel() for v in L.values() if v is not None) for L in model.layers),
    }


def plot(rates, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for il, r in enumerate(rates):
        s = np.sort(np.asarray(r))[::-1]
        x = np.arange(1, len(s) + 1)
        ax[0].plot(x, np.maximum(s, 1e-6), label=f"layer {il}")
        cum = np.cumsum(s) / max(s.sum(), 1e-12)
        ax[1].plot(x / len(s) * 100, cum * 100, label=f"layer {il}")
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    ax[0].set_xlabel("neuron rank (sorted by firing rate)")
    ax[0].set_ylabel("firing rate (fraction of tokens)")
    ax[0].set_title("per-neuron firing rate, sorted")
    ax[0].grid(True, which="both", alpha=0.3)
    ax[0].legend()
    ax[1].set_xlabel("% of neurons (hottest first)")
    ax[1].set_ylabel("% of all activations")
    ax[1].set_title("cumulative share of activations")
    ax[1].grid(True, alpha=0.3)
    ax[1].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf", default="models/tinyrelu-hf")
    ap.add_argument("--pred", default=None, help="predictor dir (default HF/predictor)")
    ap.add_argument("--dir", default="models/tinyrelu")
    ap.add_argument("--name", default="tinyrelu")
    ap.add_argument("--text", default="data/heldout.txt")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--sweep", default="", help="comma-separated extra thresholds for the F16 file")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--no-engine", action="store_true")
    a = ap.parse_args(argv)
    pred = a.pred or os.path.join(a.hf, "predictor")
    out = a.out or os.path.join(a.dir, "stats.json")
    png = a.plot or os.path.join(a.dir, "firing_rates.png")
    with open(os.path.join(pred, "config.json"), encoding="utf-8") as f:
        pcfg = json.load(f)
    thr = float(pcfg.get("sparse_threshold", 0.0))

    st = torch_stats(a.hf, pred, a.text, a.ctx, thr)
    plot(st["firing_rates"], png, f"{a.name}: FFN neuron firing rates on the held-out text "
                                  f"({st['n_tokens']} tokens)")
    res = {"threshold": thr, "predictor_ranks": pcfg.get("ranks"),
           "predictor_val_recall": pcfg.get("recall"), "predictor_val_precision": pcfg.get("precision"),
           **{k: v for k, v in st.items() if k != "firing_rates"}}
    rates = st["firing_rates"]
    res["hot_share"] = []
    for r in rates:
        s = sorted(r, reverse=True)
        tot = sum(s) or 1.0
        res["hot_share"].append({f"top{p}%": sum(s[:max(1, len(s) * p // 100)]) / tot for p in (5, 10, 20)})
    if not a.no_engine:
        from eval_perplexity import perplexity
        with open(a.text, encoding="utf-8") as f:
            text = f.read()
        runs = {
            "dense_gguf": (f"{a.name}.dense.gguf", None, False),
            "f16_sparse": (f"{a.name}.powerinfer.gguf", None, False),
            "f16_all_neurons": (f"{a.name}.powerinfer.gguf", None, True),
            "q4_0_sparse": (f"{a.name}.q4_0.powerinfer.gguf", None, False),
            "q4_0_all_neurons": (f"{a.name}.q4_0.powerinfer.gguf", None, True),
        }
        for t in [float(x) for x in a.sweep.split(",") if x.strip()]:
            runs[f"f16_sparse@{t:g}"] = (f"{a.name}.powerinfer.gguf", t, False)
        res["perplexity"] = {}
        for key, (fname, t, dense) in runs.items():
            r = perplexity(os.path.join(a.dir, fname), text, a.ctx, threshold=t, dense=dense)
            res["perplexity"][key] = r
            af = r["active_fraction"]
            print(f"{key:22s} ppl {r['ppl']:.4f}" + (f"  computed {' '.join(f'{x:.3f}' for x in af)}"
                                                      if af and not dense else ""), flush=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
        f.write("\n")

    print("\n| layer | activation sparsity | predictor rank | recall | precision | predicted active |"
          " top 10% neurons' share |")
    print("|---|---|---|---|---|---|---|")
    for i in range(len(rates)):
        rk = (pcfg.get("ranks") or ["?"] * len(rates))[i]
        print(f"| {i} | {st['sparsity'][i] * 100:.1f}% | {rk} | {st['recall'][i]:.3f} | "
              f"{st['precision'][i]:.3f} | {st['predicted_fraction'][i] * 100:.1f}% | "
              f"{res['hot_share'][i]['top10%'] * 100:.1f}% |")
    if "perplexity" in res:
        d = res["perplexity"]["dense_gguf"]["ppl"]
        for k, r in res["perplexity"].items():
            print(f"{k}: {r['ppl']:.4f} ({(r['ppl'] / d - 1) * 100:+.2f}% vs dense)")
    print(f"wrote {out} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
