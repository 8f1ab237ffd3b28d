#!/usr/bin/env python3
"""What a LoRA adapter costs: prompt and generation speed with and without it, ours and llama.cpp's, in paired rounds.

    PYTHONPATH=bindings python bench/bench_lora.py -m BASE.gguf --lora ADAPTER.gguf [-p 512] [-n 64] [-r 8] [-t 2]
        [--peer llama.cpp|none]

Each engine loads the base twice (with and without the adapter, scale 1) and each round runs pp and tg on both, in
turn, so a drift of the machine's speed falls on both sides of a ratio; the table gives the median t/s and the median
of the rounds' ratios (with / without). tools/random_lora.py makes an adapter for any base file.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import LlamaCpp, Ours, run_test  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--lora", required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--peer", choices=["llama.cpp", "none"], default="llama.cpp")
    a = ap.parse_args()
    n_ctx = max(a.n_prompt, a.n_gen) + 8
    engines = [Ours] + ([LlamaCpp] if a.peer == "llama.cpp" else [])
    pairs = {cls.name: (cls(a.model, n_ctx, 512, a.threads), cls(a.model, n_ctx, 512, a.threads, lora=a.lora))
             for cls in engines}
    tests = [("pp", a.n_prompt, 0), ("tg", 0, a.n_gen)]
    ts = {(name, kind, side): [] for name in pairs for kind, _, _ in tests for side in (0, 1)}
    for r in range(a.rounds):
        for name, both in pairs.items():
            for kind, p, n in tests:
                for side, impl in enumerate(both):
                    ts[(name, kind, side)] += run_test(impl, p, n, 1, np.random.default_rng(r))
    print(f"{a.model} + {a.lora}, {a.threads} threads, {a.rounds} paired rounds")
    print("| engine | test | t/s without | t/s with | with / without |")
    print("|---|---|---:|---:|---:|")
    for name in pairs:
        for kind, p, n in tests:
            off, on = ts[(name, kind, 0)], ts[(name, kind, 1)]
            ratio = statistics.median(b / x for x, b in zip(off, on))
            print(f"| {name} | {kind}{p or n} | {statistics.median(off):.1f} | {statistics.median(on):.1f} | "
                  f"{ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
