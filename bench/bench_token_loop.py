#!/usr/bin/env python3
"""What llama-cpp-python's token loop costs here: `Llama.generate(tokens)` code run unchanged on llama-cpp-python's
`Llama` and on our `PowerInfer` (powerinfer.token_loop), and, for scale, our engine's own completion of the same
prompt, in paired rounds.

    PYTHONPATH=bindings python bench/bench_token_loop.py -m MODEL.gguf [-p 64] [-n 64] [-r 5] [-t 2]

Each round runs every side in turn (greedy, the same prompt of p tokens, n tokens generated); the table gives the
median generation rate in tokens/s (prompt evaluation excluded: timed from the first token yielded) and the median of
the rounds' ratios against llama-cpp-python.
"""
from __future__ import annotations

import argparse
import statistics
import time


def loop_rate(llm, prompt: list[int], n: int) -> float:
    """tokens/s of the tokens after the first, through llm.generate(tokens) (llama-cpp-python's signature)."""
    if hasattr(llm, "reset"):
        llm.reset()
    t0, count = 0.0, 0
    for tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        count += 1
        if count == 1:
            t0 = time.perf_counter()
        if count == n:
            break
    return (n - 1) / (time.perf_counter() - t0)


def engine_rate(llm, prompt: list[int], n: int) -> float:
    """tokens/s of our engine's completion (create_completion's streaming path), after the first token."""
    t0, count = 0.0, 0
    for _ in llm.create_completion(prompt, max_tokens=n, temperature=0.0, stream=True, ignore_eos=True):
        count += 1
        if count == 1:
            t0 = time.perf_counter()
    return (count - 1) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    import llama_cpp

    import powerinfer as pi
    n_ctx = a.n_prompt + a.n_gen + 8
    ours = pi.PowerInfer(a.model, n_ctx=n_ctx, n_threads=a.threads, verbose=False)
    theirs = llama_cpp.Llama(a.model, n_ctx=n_ctx, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    prompt = (ours.tokenize("The quick brown fox jumps over the lazy dog. " * 40))[:a.n_prompt]
    sides = {"llama-cpp-python Llama.generate": lambda: loop_rate(theirs, prompt, a.n_gen),
             "ours PowerInfer.generate(tokens)": lambda: loop_rate(ours, prompt, a.n_gen),
             "ours create_completion (engine)": lambda: engine_rate(ours, prompt, a.n_gen)}
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(a.rounds):
        for k, f in sides.items():
            rates[k].append(f())
    base = rates["llama-cpp-python Llama.generate"]
    print(f"| side | tg{a.n_gen} t/s (median of {a.rounds}) | x llama-cpp-python (median of the rounds' ratios) |")
    print("|---|---:|---:|")
    for k, v in rates.items():
        ratio = statistics.median(x / b for x, b in zip(v, base))
        print(f"| {k} | {statistics.median(v):.1f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
