#!/usr/bin/env python3
"""Decode speed of a gate-sparse file (tools/sparsify.py) at each stored level against its own dense model,
in one process, with the bytes-read bound of each.

    PYTHONPATH=bindings python bench/bench_act_sparse.py MODEL.sparse.gguf -t 2 -n 32 -r 3

Runs: ``dense`` (dense=True: the file's dense FFN, exactly the input model) and per stored level ``L``
(channels by |act(gate)|, the gate dense: CATS) and, when the file has gate-input thresholds
(ffn_gate_t), ``L+in`` (the gate over the input entries above their thresholds too: TEAL on the gate),
and when it has attention thresholds ``L+in+attn`` (q/k/v and wo over their input entries above their thresholds
too: TEAL on every linear input but the FFN's channels' own; ``L`` and ``L+in`` then run with dense attention),
interleaved token by token (act_sparsity.decode_speeds: every run's token i before any run's token i + 1) so that
the machine's drift hits them alike. Each run clears the KV cache, decodes a fixed 8-token prompt as one batch and then
-n fixed pseudo-random tokens one at a time; tokens/s is over those -n tokens, the median over -r rounds, and "vs
dense" the median over the rounds of each round's ratio to the dense run (the rounds are paired).

The bytes bound: the weights a token reads (attention, the output head, the FFN: dense gate + up + down,
sparse gate (or the measured fraction of ffn_gate_t's rows) + the measured fraction of up and down_t rows,
from ctx.sparse_stats / ctx.gate_input_stats over the timed tokens)
divided by the memory read bandwidth (bench_sparse.measure_bandwidth, or --bandwidth GB/s). The ratio
dense_bytes / sparse_bytes is the speed-up bound when decode is memory-bound.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np


_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "bindings"))
sys.path.insert(0, str(_ROOT / "bench"))

import powerinfer  # noqa: E402
from powerinfer import act_sparsity  # noqa: E402
from bench_sparse import measure_bandwidth  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--repeat", type=int, default=3)
    ap.add_argument("--levels", default=None, help="comma list of stored levels (default: all); a level runs as L and, "
                    "where the file has gate-input thresholds, L+in (so 0.5 and 0.5+in name the same runs)")
    ap.add_argument("--bandwidth", type=float, default=None, help="GB/s (default: measured)")
    ap.add_argument("-p", "--prompt", type=int, default=0, metavar="N",
                    help="also time a prompt of N tokens (one call) per run, interleaved, median of -r (0: none)")
    ap.add_argument("--sparse-gather-max", type=int, default=1, metavar="N",
                    help="the contexts' sparse_gather_max: calls of more tokens run a level over the dense kernels "
                         "(default 1, the library's; 0: prompts through the sparse kernels too)")
    a = ap.parse_args(argv)
    model = powerinfer.Model(a.model)
    if not model.gate_sparse:
        raise SystemExit(f"{a.model}: not a gate-sparse file (tools/sparsify.py)")
    try:
        levels = (sorted({float(v.strip().removesuffix("+in")) for v in a.levels.split(",")}) if a.levels else
                  [float(v) for v in model.sparsity_levels.levels])
    except ValueError:
        raise SystemExit(f"--levels {a.levels!r}: expected a comma list of levels such as 0.25,0.5 (or 0.5+in)")
    try:
        runs = act_sparsity.level_runs(model.sparsity_levels, levels)
    except ValueError as e:
        raise SystemExit(f"--levels {a.levels!r}: {e}")
    n_ctx = max(256, a.prompt)
    ctxs = {r.name: act_sparsity.level_context(model, r, n_ctx=n_ctx, n_batch=n_ctx, n_threads=a.threads,
                                               sparse_gather_max=a.sparse_gather_max) for r in runs}
    prompts = prompt_speeds(ctxs, model.n_vocab, a.prompt, a.repeat) if a.prompt > 0 else None
    results = act_sparsity.decode_speeds(ctxs, model.n_vocab, n_gen=a.n_gen, repeat=a.repeat)
    bw = a.bandwidth or measure_bandwidth(n_threads=a.threads)[a.threads]
    parts = act_sparsity.decode_bytes(model.file.tensors)
    dense_bytes = act_sparsity.dense_bytes(parts)
    cpu = powerinfer.cpu_name()
    hp = model.hparams
    print(f"# {a.model.name}: {hp.n_layer} layers, n_embd {hp.n_embd}, n_ff {hp.n_ff}; "
          f"CPU {cpu}, ISA {powerinfer.cpu_isa()}, {a.threads} threads; bandwidth {bw:.1f} GB/s; "
          f"tg{a.n_gen}, median of {a.repeat}")
    print("| run | channels computed | gate inputs read | attention inputs read | tokens/s | vs dense | bytes/token "
          "| bound t/s | bound ratio | of bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base_runs = results["dense"][1]
    gate_inputs = model.sparsity_levels.input_thresholds is not None
    for run in runs:
        name = run.name
        med, each, (frac, inp, att) = results[name]
        ratio = statistics.median(v / b for v, b in zip(each, base_runs))   # the runs are paired token by token
        if run.level is None:
            nbytes = dense_bytes
        else:   # the attention's measured share read applies to q/k/v and wo alike
            nbytes = act_sparsity.level_bytes(parts, frac, inp if gate_inputs and run.reads != "channels" else None,
                                              (att, att) if run.reads == "attn" else None)
        bound = bw * 1e9 / nbytes
        print(f"| {name} | {frac:.1%} | {inp:.1%} | {att:.1%} | {med:.2f} | {ratio:.3f}x | "
              f"{nbytes / 2**20:.1f} MiB | {bound:.2f} | {dense_bytes / nbytes:.3f}x | {med / bound:.0%} |")
    if prompts:
        print(f"\n# pp{a.prompt} (one call of {a.prompt} tokens, sparse_gather_max {a.sparse_gather_max}), "
              f"median of {a.repeat}")
        print("| run | prompt tokens/s | vs dense |")
        print("|---|---|---|")
        for run in runs:
            print(f"| {run.name} | {prompts[run.name]:.1f} | {prompts[run.name] / prompts['dense']:.3f}x |")
    return 0


def prompt_speeds(ctxs: dict, n_vocab: int, n_prompt: int, repeat: int) -> dict:
    """{name: median tokens/s of one call of n_prompt fixed pseudo-random tokens}, the contexts interleaved."""
    tokens = np.random.default_rng(1).integers(3, n_vocab, n_prompt).tolist()
    speeds = {name: [] for name in ctxs}
    for _ in range(repeat):
        for name, ctx in ctxs.items():
            ctx.kv_clear()
            t0 = time.perf_counter()
            ctx.decode(tokens, logits="last")
            speeds[name].append(n_prompt / (time.perf_counter() - t0))
    return {name: statistics.median(s) for name, s in speeds.items()}


if __name__ == "__main__":
    sys.exit(main())
