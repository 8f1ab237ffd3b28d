#!/usr/bin/env python3
"""Speculative decoding: generation speed with and without drafts, on one prompt, greedy.

    PYTHONPATH=bindings python bench/bench_speculative.py -m TARGET.gguf [-md DRAFT.gguf] [--lookup N]
        [--prompt copy|continue|FILE] [-n 128] [-r 3] [--draft-max 16] [--draft-p-min 0.75] [--temp 0 [--seed 1]]
        [--peer llama.cpp|none]

For each configuration (plain; -md: a draft model; --lookup N: prompt lookup with n-grams of N down to 1) the
same prompt is completed -n tokens (greedily, or --temp T with --seed S), -r times (the fastest kept); the table
gives generation t/s (the wall time from the first sampled token to the end, as the server's
predicted_per_second), the draft tokens kept and evaluated, and whether the text equals the plain run's (it must:
drafts change the speed only; the exit status is 1 otherwise).
Prompts: `copy` = a passage of data/heldout.txt, then "Again, word for word:" and its first words (output
that repeats the input, where prompt lookup pays); `continue` = the passage alone; or a file's text.
With --peer llama.cpp (llama-cpp-python installed) llama.cpp runs the same prompt plain and with its prompt
lookup (LlamaPromptLookupDecoding, num_pred_tokens = --draft-max), in the same process.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bindings"))
from powerinfer import PowerInfer  # noqa: E402
from powerinfer.speculative import PromptLookup  # noqa: E402


def make_prompt(kind: str) -> str:
    text = (ROOT / "data" / "heldout.txt").read_text(encoding="utf-8")
    passage = text[:1200].rsplit("\n", 1)[0]
    if kind == "copy":
        return f"{passage}\n\nAgain, word for word:\n\n{passage[:60]}"
    if kind == "continue":
        return passage
    return Path(kind).read_text(encoding="utf-8")


def run_ours(llm: PowerInfer, prompt: str, n: int, reps: int, temp: float, seed: int) -> tuple[float, str, int, int]:
    best, text = None, ""
    for _ in range(reps):
        out = llm.create_completion(prompt, max_tokens=n, temperature=temp, seed=seed)
        res = llm.last_result
        if res.n_predicted != n:
            print(f"note: generation ended after {res.n_predicted} tokens ({res.stop_type})", file=sys.stderr)
        tps = res.n_predicted / (res.predicted_ms / 1e3) if res.predicted_ms > 0 else 0.0
        if best is None or tps > best[0]:
            best = (tps, res.n_drafted, res.n_draft_accepted)
        text = out["choices"][0]["text"]
    return best[0], text, best[1], best[2]


def run_peer(path: str, prompt: str, n: int, reps: int, n_ctx: int, threads: int, lookup: int | None):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    kw = {"draft_model": LlamaPromptLookupDecoding(num_pred_tokens=lookup)} if lookup else {}
    llm = Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False, **kw)
    best, text = 0.0, ""
    for _ in range(reps):
        toks = llm.tokenize(prompt.encode())
        llm.reset()
        t_first, n_out = None, 0
        pieces = []
        for tok in llm.generate(toks, temp=0.0, top_k=1, reset=True):
            if t_first is None:
                t_first = time.perf_counter()
            n_out += 1
            pieces.append(tok)
            if n_out >= n:
                break
        dt = time.perf_counter() - t_first
        best = max(best, (n_out - 1) / dt if dt > 0 else 0.0)
        text = llm.detokenize(pieces).decode("utf-8", "replace")
    del llm
    return best, text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", help="a draft model (same vocabulary)")
    ap.add_argument("--lookup", type=int, default=0, help="prompt lookup with n-grams of N down to 1 (0: off)")
    ap.add_argument("--prompt", default="copy")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-c", type=int, default=2048)
    ap.add_argument("-t", type=int, default=None)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--draft-p-min", type=float, default=0.75)
    ap.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy; the peer stays greedy)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--peer", default="none", choices=["llama.cpp", "none"])
    a = ap.parse_args(argv)
    prompt = make_prompt(a.prompt)
    configs = [("plain", None)]
    if a.model_draft:
        configs.append((f"draft model {Path(a.model_draft).name}", a.model_draft))
    if a.lookup:
        configs.append((f"prompt lookup n-gram {a.lookup}..1", PromptLookup(a.lookup, 1, a.draft_max)))
    rows, plain_text, plain_tps = [], None, None
    for name, draft in configs:
        llm = PowerInfer(a.model, n_ctx=a.c, n_threads=a.t, verbose=False, draft_model=draft,
                         draft_max=a.draft_max, draft_p_min=a.draft_p_min)
        llm.create_completion(prompt, max_tokens=4, temperature=0.0)        # warmup
        tps, text, nd, na = run_ours(llm, prompt, a.n, a.r, a.temp, a.seed)
        llm.close()
        if plain_text is None:
            plain_text, plain_tps = text, tps
        rows.append((f"ours: {name}", tps, tps / plain_tps, f"{na}/{nd}" if nd else "-",
                     "yes" if text == plain_text else "NO"))
    if a.peer == "llama.cpp":
        threads = a.t or os.cpu_count()
        peer_plain = None
        for name, lk in (("plain", None), (f"prompt lookup {a.draft_max}", a.draft_max)):
            tps, text = run_peer(a.model, prompt, a.n, a.r, a.c, threads, lk)
            peer_plain = peer_plain or tps
            rows.append((f"llama.cpp: {name}", tps, tps / peer_plain, "-", "-"))
    how = "greedy" if a.temp <= 0 else f"temp {a.temp} seed {a.seed}"
    print(f"model {Path(a.model).name}, prompt '{a.prompt}' ({len(prompt)} chars), -n {a.n}, {how}, "
          f"best of {a.r}, draft-max {a.draft_max}, draft-p-min {a.draft_p_min}")
    print("| run | gen t/s | vs its plain | drafts kept/evaluated | text = plain |")
    print("|---|---:|---:|---:|:-:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.2f}x | {r[3]} | {r[4]} |")
    return 0 if all(r[4] != "NO" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
