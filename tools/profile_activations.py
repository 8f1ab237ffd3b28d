#!/usr/bin/env python3
"""Profile FFN neuron activation frequencies of a Hugging Face llama/bamboo checkpoint and
write PowerInfer's ``activation/activation_{i}.pt`` files (spec 1.6), the input of the
hot-neuron solver (spec 2).

    python tools/profile_activations.py MODEL_DIR TEXT_FILE [--out MODEL_DIR/activation]
        [--ctx 512] [--max-tokens N] [--tokenizer MODEL_DIR/tokenizer.model]

What it does:
  * tokenizes TEXT_FILE with the sentencepiece model (no BOS/EOS inside the text), keeps at
    most --max-tokens ids, and cuts them into windows [BOS] + ctx-1 text tokens (the last one
    may be shorter); every window is an independent sequence (positions from 0);
  * runs each window through ``hf_llama_torch`` (float32) and, for every layer, adds 1 to
    neuron i's count for every token (BOS positions included: the engine runs them too) for
    which the neuron is active: act(gate x)[i] != 0, i.e. relu(gate x)[i] > 0 for ReGLU; for
    bamboo (dReLU) relu(gate x)[i] > 0 and relu(up x)[i] > 0;
  * writes ``activation_{i}.pt`` for i = 0..n_layer-1: ``torch.save`` of a 1-D **float32**
    tensor of length n_ff holding the counts (exact integers up to 2^24 = 16.7M tokens per
    neuron; the solver only uses their order and sums). Counting is done in int64;
  * prints per-layer activation sparsity = 1 - mean over tokens of (active neurons / n_ff).

The original solver needs n_ff % 256 == 0 (it sorts each layer into groups of 256): a
warning is printed when that does not hold, the files are written anyway.
Errors (missing model dir / text / tokenizer, empty text) are one line on stderr, exit 1.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_llama_torch import (LlamaTorch, ToolError, check_inputs, error_exit,  # noqa: E402
                            load_model, make_windows, prepare_tokens)

PROG = "profile_activations"


def profile(model: LlamaTorch, windows: Sequence[Sequence[int]], progress: bool = True):
    """(counts, n_tokens): counts[i] is an int64 tensor [n_ff], how many of the n_tokens
    processed tokens activated each neuron of layer i."""
    import torch
    from tqdm import tqdm

    c = model.config
    counts = [torch.zeros(c.n_ff, dtype=torch.int64) for _ in range(c.n_layer)]

    def hook(il, ffn_inp, h, active):
        counts[il] += active.sum(0)

    total = sum(len(w) for w in windows)
    with tqdm(total=total, unit="tok", desc="profiling", file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        for w in windows:
            model.forward(w, ffn_hook=hook, logits=False)
            bar.update(len(w))
    return counts, total


def write_activations(counts, out_dir: str) -> list[str]:
    """torch.save each layer's counts as a float32 [n_ff] tensor to out_dir/activation_{i}.pt."""
    import torch
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for i, cnt in enumerate(counts):
        path = os.path.join(out_dir, f"activation_{i}.pt")
        torch.save(cnt.to(torch.float32).contiguous(), path)
        paths.append(path)
    return paths


def sparsity(counts, n_tokens: int) -> list[float]:
    """Per layer: fraction of (token, neuron) pairs that are inactive."""
    return [1.0 - float(c.sum()) / (n_tokens * c.numel()) for c in counts]


def run(model_dir: str, text_file: str, out: Optional[str] = None, ctx: int = 512,
        max_tokens: Optional[int] = None, tokenizer: Optional[str] = None,
        progress: bool = True, model: Optional[LlamaTorch] = None) -> dict:
    """Profile and write the files. Returns {"counts", "n_tokens", "sparsity", "paths", "windows"}."""
    check_inputs(model_dir, text_file)
    if ctx < 2:
        raise ToolError("--ctx must be at least 2")
    model = model or load_model(model_dir)
    c = model.config
    if c.n_ff % 256:
        print(f"{PROG}: warning: n_ff = {c.n_ff} is not a multiple of 256; PowerInfer's "
              f"original solver needs that (it cuts each layer into groups of 256)", file=sys.stderr)
    ids, bos = prepare_tokens(model_dir, text_file, tokenizer, max_tokens, c)
    if bos is None:
        print(f"{PROG}: warning: the tokenizer and config have no BOS token; windows start "
              f"without one", file=sys.stderr)
    windows = make_windows(ids, ctx, bos)
    counts, n_tokens = profile(model, windows, progress)
    out = out or os.path.join(model_dir, "activation")
    paths = write_activations(counts, out)
    return {"counts": counts, "n_tokens": n_tokens, "sparsity": sparsity(counts, n_tokens),
            "paths": paths, "windows": windows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", metavar="MODEL_DIR", help="HF checkpoint directory (config.json + weights)")
    ap.add_argument("text_file", metavar="TEXT_FILE", help="UTF-8 text to profile on")
    ap.add_argument("--out", help="output directory (default MODEL_DIR/activation)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per window, BOS included (512)")
    ap.add_argument("--max-tokens", type=int, default=None, help="use at most N text tokens")
    ap.add_argument("--tokenizer", help="sentencepiece model (default MODEL_DIR/tokenizer.model)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.threads > 0:
        import torch
        torch.set_num_threads(args.threads)
    try:
        res = run(args.model_dir, args.text_file, args.out, args.ctx, args.max_tokens,
                  args.tokenizer, progress=not args.no_progress)
    except (ToolError, OSError) as e:
        return error_exit(PROG, e)
    n_ff = res["counts"][0].numel() if res["counts"] else 0
    print(f"profiled {res['n_tokens']} tokens in {len(res['windows'])} windows; "
          f"wrote {len(res['paths'])} files to {os.path.dirname(res['paths'][0]) if res['paths'] else '-'}")
    print("layer  sparsity  active/token")
    for i, s in enumerate(res["sparsity"]):
        print(f"{i:5d}  {s:8.4f}  {(1 - s) * n_ff:12.1f}")
    if res["sparsity"]:
        print(f"mean   {sum(res['sparsity']) / len(res['sparsity']):8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
