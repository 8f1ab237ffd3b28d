#!/usr/bin/env python3
"""Held-out perplexity of a GGUF / PowerInfer model with the engine (llama.cpp's perplexity
method), plus the per-layer fraction of FFN neurons the sparse path computed.

    PYTHONPATH=bindings python tools/eval_perplexity.py MODEL [--text data/heldout.txt]
        [--ctx 256] [--max-bytes N] [--threshold T | --dense] [--threads N] [--json]

Method (llama.cpp ``perplexity``): the whole text is tokenized at once with BOS in front; it
is cut into n_chunk = len // ctx windows of ctx tokens; the first token of every window is
replaced by BOS; each window is evaluated from an empty KV cache and only the second half is
scored: the logits at positions ctx/2 .. ctx-2 against the tokens at ctx/2+1 .. ctx-1
(ctx/2 - 1 scored tokens per window). Perplexity = exp(mean negative log-likelihood).

For a PowerInfer file the sparse path runs at the file's threshold (or --threshold), or every
neuron with --dense. The report includes, per layer, the fraction of (token, neuron) pairs
the FFN actually computed (ctx.sparse_stats()).

Library use: ``perplexity(model_path, text, ctx=256, threshold=None, dense=False)`` returns a
dict {"ppl", "nll", "n_tokens", "n_chunks", "active_fraction": [...] | None}.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys


def _import_powerinfer():
    try:
        import powerinfer
        return powerinfer
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                        "bindings"))
        import powerinfer
        return powerinfer


def log_softmax_nll(logits, target: int) -> float:
    import numpy as np
    x = logits.astype(np.float64)
    m = x.max()
    return float(m + math.log(np.exp(x - m).sum()) - x[target])


def perplexity(model_or_path, text: str, ctx: int = 256, threshold: float | None = None,
               dense: bool = False, n_threads: int | None = None, max_chunks: int | None = None) -> dict:
    pi = _import_powerinfer()
    model = model_or_path if isinstance(model_or_path, pi.Model) else pi.Model(model_or_path)
    tok = model.tokenizer
    ids = tok.encode(text, add_special=False)
    bos = tok.bos_id
    ids = [bos] + list(ids)
    n_chunks = len(ids) // ctx
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1:
        raise ValueError(f"need at least {ctx} tokens, the text has {len(ids)}")
    c = pi.Context(model, n_ctx=ctx, n_batch=ctx, n_threads=n_threads, sparse_threshold=threshold,
                   dense=dense)
    first = ctx // 2
    nll, count = 0.0, 0
    for k in range(n_chunks):
        w = ids[k * ctx:(k + 1) * ctx]
        w[0] = bos
        c.kv_clear()
        mask = [0] * ctx
        for j in range(first, ctx - 1):
            mask[j] = 1
        c.decode(w, pos=list(range(ctx)), logits=mask)
        for j in range(first, ctx - 1):
            nll += log_softmax_nll(c.logits(j), w[j + 1])
            count += 1
    active = None
    if model.sparse:
        a, total = c.sparse_stats()
        active = [float(x) / total if total else 1.0 for x in a]
    mean = nll / count
    return {"ppl": math.exp(mean), "nll": mean, "n_tokens": count, "n_chunks": n_chunks,
            "active_fraction": active, "threshold": c.sparse_threshold if model.sparse else None,
            "dense": dense or not model.sparse}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--text", default="data/heldout.txt")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--max-bytes", type=int, default=None, help="use only the first N bytes")
    ap.add_argument("--max-chunks", type=int, default=None)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--threshold", type=float, default=None)
    g.add_argument("--dense", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    a = ap.parse_args(argv)
    try:
        with open(a.text, "rb") as f:
            raw = f.read() if a.max_bytes is None else f.read(a.max_bytes)
        text = raw.decode("utf-8", errors="ignore")
        r = perplexity(a.model, text, a.ctx, a.threshold, a.dense, a.threads, a.max_chunks)
    except (OSError, ValueError) as e:
        print(f"eval_perplexity: error: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(r))
    else:
        mode = "dense" if r["dense"] else f"sparse (threshold {r['threshold']:g})"
        print(f"{os.path.basename(a.model)} {mode}: ppl {r['ppl']:.4f} over {r['n_tokens']} tokens "
              f"({r['n_chunks']} windows of {a.ctx})")
        if r["active_fraction"] is not None:
            print("computed neuron fraction per layer: "
                  + " ".join(f"{x:.3f}" for x in r["active_fraction"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
