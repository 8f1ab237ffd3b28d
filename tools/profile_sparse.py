#!/usr/bin/env python3
"""Activation statistics of a PowerInfer GGUF, measured by this engine: how many tokens computed each
FFN neuron, written as PowerInfer's ``activation/activation_N.pt`` files (spec 1.6).

    python tools/profile_sparse.py MODEL.powerinfer.gguf TEXT_FILE [--out DIR] [--ctx 512]
        [--max-tokens N] [-t THREADS]
    python tools/profile_sparse.py MODEL.powerinfer.gguf --random N [--seed S] [--out DIR]

tools/profile_activations.py counts activations of the original Hugging Face checkpoint with torch;
this tool needs only the GGUF file: it runs the model with its predictors (the file's threshold) and
counts, per layer and neuron, the tokens for which the FFN computed the neuron
(``Context(count_neurons=True)``): the neurons the engine actually reads, which is what the GPU split
(bindings/powerinfer/gpu_split/) needs to put the hottest on the GPU, with no Hugging Face
checkpoint at hand.

Input: the text is tokenized with the model's tokenizer and cut into windows of --ctx tokens (BOS
first), each an independent sequence; --random N decodes N uniformly random token ids instead (for
synthetic benchmark models, whose predictors were built for random inputs). Output: one
``torch.save``d 1-D float32 tensor of counts per layer (exact up to 2^24 tokens) in --out (default:
the ``activation`` directory next to the model, where the GPU split looks), and a
per-layer summary: the fraction of neurons computed and the share of the computations that the
hottest 10% of neurons account for. Errors are one line on stderr, exit 1.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import powerinfer as pi  # noqa: E402

PROG = "profile_sparse"


def token_windows(model: pi.Model, args) -> list[list[int]]:
    """The sequences to decode: windows of the text (BOS first), or one sequence of random ids."""
    if args.random:
        rng = np.random.default_rng(args.seed)
        ids = rng.integers(0, model.n_vocab, size=args.random).tolist()
        return [ids[i:i + args.ctx] for i in range(0, len(ids), args.ctx)]
    text = Path(args.text).read_text(encoding="utf-8", errors="replace")
    ids = model.tokenizer.encode(text, add_special=False)
    if args.max_tokens:
        ids = ids[:args.max_tokens]
    if not ids:
        raise ValueError(f"'{args.text}' has no tokens")
    head = [] if model.tokenizer.bos_id is None else [model.tokenizer.bos_id]
    step = args.ctx - len(head)
    return [head + ids[i:i + step] for i in range(0, len(ids), step)]


def profile(model: pi.Model, windows: list[list[int]], n_threads: int | None, n_batch: int) -> np.ndarray:
    """[n_layer, n_ff] tokens per neuron over all windows."""
    n_ctx = max(len(w) for w in windows)
    ctx = pi.Context(model, n_ctx=n_ctx, n_batch=min(n_batch, n_ctx), n_threads=n_threads, count_neurons=True)
    for w in windows:
        ctx.kv_clear()
        ctx.decode(w, logits="none")
    return ctx.neuron_counts()


def summary(counts: np.ndarray, n_tokens: int) -> str:
    lines = ["layer  computed  hottest 10% share"]
    for il, c in enumerate(counts):
        top = np.sort(c)[::-1][:max(1, len(c) // 10)].sum()
        lines.append(f"{il:5d}  {c.sum() / (n_tokens * len(c)):8.3f}  {top / max(1, c.sum()):17.3f}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a PowerInfer GGUF (*.powerinfer.gguf)")
    ap.add_argument("text", nargs="?", help="a UTF-8 text file to profile on")
    ap.add_argument("--random", type=int, default=0, metavar="N", help="decode N random token ids instead of a text")
    ap.add_argument("--seed", type=int, default=0, help="--random's seed")
    ap.add_argument("--out", help="output directory (default: activation/ next to the model)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per sequence (default 512)")
    ap.add_argument("--max-tokens", type=int, default=0, help="use at most this many tokens of the text")
    ap.add_argument("-b", "--batch", type=int, default=512, help="tokens per decode call (default 512)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    return ap


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        if (a.text is None) == (a.random <= 0):
            raise ValueError("give either a TEXT_FILE or --random N (N > 0)")
        if a.ctx < 2 or a.batch < 1:
            raise ValueError("--ctx must be >= 2 and --batch >= 1")
        if a.text is not None and not os.path.isfile(a.text):
            raise ValueError(f"text file '{a.text}' not found")
        model = pi.Model(a.model)
        if not model.sparse:
            raise ValueError(f"'{a.model}' is not a PowerInfer (PWRI) file: it has no predictors to profile")
        windows = token_windows(model, a)
        counts = profile(model, windows, a.threads, a.batch)
        out = Path(a.out) if a.out else Path(model.path).parent / "activation"
        import torch   # an offline tool: torch writes the .pt files, as profile_activations.py does
        from profile_activations import write_activations
        write_activations([torch.from_numpy(c) for c in counts], str(out))
    except (ValueError, OSError, pi.ModelLoadError, pi.PowerInferError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    n_tokens = sum(len(w) for w in windows)
    print(summary(counts, n_tokens))
    print(f"{PROG}: {n_tokens} tokens in {len(windows)} sequences -> {out}/activation_0..{len(counts) - 1}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
