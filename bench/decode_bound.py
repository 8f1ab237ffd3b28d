#!/usr/bin/env python3
"""Decode speed against the memory bandwidth measured in the same minute (issue 15's "decode within 10% of the
bound"): on a shared VM the read bandwidth moves by 2x between runs minutes apart, so each round brackets a tg run
of ours with bandwidth passes (numpy reductions, bench_sparse.stream_pass) and reports their ratio.

    PYTHONPATH=bindings python bench/decode_bound.py -m A.gguf,B.gguf [-n 64] [-r 5] [-t 2]

Two figures per file. "share": the round's decode read rate over the mean of the passes just before and just after
it (each pass one xor and one max reduction, their mean), so both sides are averages over the same stretch of time;
the median over rounds. "best-of share", as this script reported before 2026-12-07: the same decode rate over the
best of the round's four reductions, a maximum set against a mean: on a host whose bandwidth swings within seconds
it rates the decode lower (Gemma 3 270M on a Zen 5, 6 rounds: 75% best-of against 82% of the mean in one run, 90%
against 94% in another).

Bytes per token: every weight matrix a token reads, at the file's size (the interleaved copies keep it): the
file's tensors without token_embd where the file has its own output head (decode reads one row of the table). The
KV cache and activations are not counted (short context).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Ours, run_test  # noqa: E402
from bench_sparse import stream_pass  # noqa: E402


def bytes_per_token(path: str) -> int:
    r = gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    total = 0
    for t in r.tensors:
        if len(t.shape) < 2 or (t.name == "token_embd.weight" and "output.weight" in names):
            continue
        total += int(t.n_bytes)
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="comma list of GGUF files")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--mib", type=int, default=1024, help="bandwidth test size (MiB)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| file | GB per token | round: t/s, GB/s read / bound GB/s (passes before, after) = share "
          "| median share | median best-of share |")
    print("|---|---:|---|---:|---:|")
    buf = np.ones(a.mib * 2**20 // 8, dtype=np.uint64)
    buf[:: 4096 // 8] = 1                                             # touch every page
    for path in a.model.split(","):
        nbytes = bytes_per_token(path)
        ours = Ours(path, n_ctx=a.n_gen + 16, n_batch=512, n_threads=a.threads)
        run_test(ours, 0, 4, 1, rng)   # warm the weights' pages
        cells, shares, best_shares = [], [], []
        after = stream_pass(buf, a.threads)
        for _ in range(a.rounds):
            before = after
            tps = run_test(ours, 0, a.n_gen, 1, rng)[0]
            after = stream_pass(buf, a.threads)
            read = tps * nbytes / 1e9
            bound = (statistics.mean(before) + statistics.mean(after)) / 2
            shares.append(read / bound)
            best_shares.append(read / max(before + after))
            cells.append(f"{tps:.1f}, {read:.1f} / {bound:.1f} ({statistics.mean(before):.1f}, "
                         f"{statistics.mean(after):.1f}) = {read / bound:.0%}")
        del ours
        print(f"| {Path(path).name} | {nbytes / 1e9:.3f} | {'; '.join(cells)} | **{statistics.median(shares):.0%}** "
              f"| {statistics.median(best_shares):.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
