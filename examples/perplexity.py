#!/usr/bin/env python3
"""perplexity: llama.cpp's perplexity over a text file, and KL divergence between two runs.

    python examples/perplexity.py -m MODEL -f wiki.test.raw [-c 512] [-b 512] [--chunks N]
    # KL divergence of a sparse run against a dense one:
    python examples/perplexity.py -m MODEL.powerinfer.gguf -f wiki.test.raw --dense --kl-divergence-base dense.kld
    python examples/perplexity.py -m MODEL.powerinfer.gguf --kl-divergence-base dense.kld --kl-divergence

Windows of -c tokens (the first one replaced by BOS), evaluated from an empty cache; the second half of
each window is scored. stdout: the running estimate `[1]x.xxxx,[2]...`, then `Final estimate: PPL =
x.xxxx +/- y.yyyyy` (and the KL-divergence statistics with --kl-divergence); stderr: logs and the
`seconds per pass - ETA` line. --kl-divergence-base FILE alone saves this run's scored log-probabilities
(float16, see powerinfer.perplexity) to FILE; with --kl-divergence it compares this run with FILE
(-f is then optional: the base file holds the tokens).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import powerinfer as pi
from powerinfer import cli
from powerinfer.cli import CLIError, log
from powerinfer.perplexity import KLDBase, perplexity


def parse_args(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("-f", "--file", default=None, help="text file to evaluate (e.g. wiki.test.raw)")
    # a gate-sparse file's level is measured as generation runs it: every window through the sparse kernels
    # (--sparse-gather-max 1: through the dense kernels, several times faster, the same inputs and channels kept)
    cli.add_context_args(p, ctx_size="window size in tokens (default: 512, or the base's with --kl-divergence)",
                         sparse_gather_max=0)
    p.add_argument("--chunks", type=int, default=-1, help="evaluate at most this many windows (default: all)")
    p.add_argument("--kl-divergence-base", metavar="FILE", default=None,
                   help="without --kl-divergence: save this run's scored log-probabilities to FILE; "
                        "with it: the saved run to compare against")
    p.add_argument("--kl-divergence", action="store_true",
                   help="compare this run with --kl-divergence-base: mean KL divergence, top-1 agreement, PPL ratio")
    return cli.parse(p, argv, prog="perplexity")


def eta_line(seconds_per_pass: float, n_chunk: int) -> str:
    total = int(seconds_per_pass * n_chunk)
    s = f"perplexity: {seconds_per_pass:.2f} seconds per pass - ETA "
    if total >= 3600:
        s += f"{total // 3600} hours "
        total %= 3600
    return s + f"{total / 60.0:.2f} minutes"


def run(args) -> int:
    if args.kl_divergence and not args.kl_divergence_base:
        log("error: --kl-divergence needs --kl-divergence-base FILE (a run saved with --kl-divergence-base alone)")
        return 1
    comparing = bool(args.kl_divergence)
    if not args.file and not comparing:
        log("error: give the text to evaluate with -f FILE")
        return 1
    base = None
    if comparing:
        try:
            base = KLDBase(args.kl_divergence_base)
        except ValueError as e:
            log(f"error: {e}")
            return 1
        if args.ctx_size is not None and args.ctx_size != base.n_ctx:
            log(f"error: -c {args.ctx_size} differs from the base's window of {base.n_ctx} tokens")
            return 1
        log(f"perplexity: comparing with {args.kl_divergence_base}: {base.n_chunk} windows of {base.n_ctx} tokens "
            f"(base model {Path(base.header.get('model', '?')).name}"
            f"{', sparse' if base.header.get('sparse') else ', dense'})")
    n_ctx = base.n_ctx if base is not None else (512 if args.ctx_size is None else args.ctx_size)

    text = None
    if args.file:
        try:
            text = Path(args.file).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            log(f"error: cannot read {args.file}: {e.strerror or e}")
            return 1
    try:
        model = cli.load_model(args, "perplexity")
        ctx = cli.make_context(args, model, "perplexity", n_ctx=n_ctx)
    except CLIError as e:
        log(f"error: {e}")
        return 1

    tokens = None
    if text is not None:
        log("perplexity: tokenizing the input ..")
        t0 = time.perf_counter()
        tokens = model.tokenizer.encode(text, add_special=True)
        log(f"perplexity: tokenization took {(time.perf_counter() - t0) * 1e3:.3f} ms")
        if len(tokens) < 2 * n_ctx:
            log(f"perplexity: error: you need at least {2 * n_ctx} tokens to evaluate perplexity with a context "
                f"of {n_ctx}; {args.file} tokenizes to only {len(tokens)} tokens")
            return 1
    n_avail = (len(tokens) if tokens is not None else base.n_chunk * n_ctx) // n_ctx
    n_chunk = min(n_avail, args.chunks) if args.chunks > 0 else n_avail
    if base is not None:
        n_chunk = min(n_chunk, base.n_chunk)
    log(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={ctx.n_batch}")
    saving = args.kl_divergence_base if not comparing else None
    if saving:
        size = n_chunk * (n_ctx - 1 - n_ctx // 2) * model.n_vocab * 2
        log(f"perplexity: saving the scored log-probabilities to {saving} ({size / 2**20:.1f} MiB)")

    def progress(i: int, n: int, ppl: float, seconds: float) -> None:
        if i == 1:
            log(eta_line(seconds, n))
        print(f"[{i}]{ppl:.4f},", end="", flush=True)

    try:
        res = perplexity(ctx, tokens, n_ctx=n_ctx, chunks=n_chunk, progress=progress,
                         save_kld=saving, kld_base=base)
    except ValueError as e:
        print()
        log(f"perplexity: error: {e}")
        return 1
    except pi.PowerInferError as e:
        print()
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        print()
        log("Interrupted by user")
        return 130
    print()
    if math.isnan(res.stderr):
        print("Unexpected negative standard deviation of log(prob)")
    else:
        print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.stderr:.5f}")
    if res.kld is not None:
        k = res.kld
        print(f"\n====== KL divergence statistics ({k.n} tokens, base: {args.kl_divergence_base}) ======")
        print(f"PPL(base)             : {k.base_ppl:.4f}")
        print(f"Mean PPL(Q)/PPL(base) : {k.ppl_ratio:.6f} +/- {k.ppl_ratio_stderr:.6f}")
        print(f"Mean ln(PPL(Q)/PPL(base)): {k.ln_ppl_ratio:.6f} +/- {k.ln_ppl_ratio_stderr:.6f}")
        print(f"Mean    KLD           : {k.mean:.6f} +/- {k.stderr:.6f}")
        print(f"Maximum KLD           : {k.max:.6f}")
        print(f"99.0%   KLD           : {k.p99:.6f}")
        print(f"Median  KLD           : {k.median:.6f}")
        print(f"Same top p            : {100 * k.top1:.3f} +/- {100 * k.top1_stderr:.3f} %")
    sys.stdout.flush()
    cli.sparse_report(ctx)
    log(f"perplexity: {res.n_chunks} chunks, {res.n_scored} scored tokens in {res.seconds:.2f} s")
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
