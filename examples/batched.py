#!/usr/bin/env python3
"""batched: N continuations of one prompt, decoded together in one batch per step (llama.cpp's `batched`).

    python examples/batched.py MODEL [PROMPT="Hello my name is"] [PARALLEL=1] [LEN=32] [N_THREAD]
    python examples/batched.py -m MODEL -p "Hello my name is" -np 4 -n 32
    python examples/batched.py -hf OWNER/NAME -np 4 --greedy

LEN is the total length of each sequence, prompt included. The prompt is decoded once into
sequence 0 and its KV cells are shared with sequences 1..N-1 (kv_seq_cp, nothing recomputed),
so the context needs n_kv_req = n_prompt + (LEN - n_prompt) * N cells. Every step then decodes the
next token of every unfinished sequence in ONE decode call; a sequence ends at end-of-text or LEN.
Sequence s samples with its own sampler seeded SEED + s (top-k 40 -> top-p 0.9 -> temperature 0.4 by
default, like the original), so it equals a single-sequence run with seed SEED + s.

Sequences go to stdout; logs, the speed line and the timings go to stderr.
"""
from __future__ import annotations

import os
import sys

import powerinfer as pi
from powerinfer import cli
from powerinfer.cli import CLIError, log
from powerinfer.engine import Timings
from powerinfer.generator import decode_parallel

POSITIONALS = ("prompt", "n_parallel", "n_len", "threads", "vram_budget", "n_gpu_layers")
# the original's sampling: top-k 40 -> top-p 0.9 -> temperature 0.4, no min-p, no penalties
DEFAULTS = pi.SamplingParams(temperature=0.4, top_k=40, top_p=0.9, min_p=0.0)


def parse_args(argv=None):
    p = cli.parser(__doc__, usage="%(prog)s [options] [MODEL] [PROMPT] [PARALLEL] [LEN] [N_THREAD]")
    p.add_argument("positional", nargs="*", metavar="ARG",
                   help="MODEL PROMPT PARALLEL LEN N_THREAD, as the original takes them (MODEL is left out "
                        "when -m or -hf is given), then VRAM_BUDGET (GiB) and NGL as --vram-budget and -ngl")
    p.add_argument("-p", "--prompt", default=None, help='prompt (default: "Hello my name is")')
    p.add_argument("-np", "--parallel", dest="n_parallel", type=int, default=None,
                   help="number of sequences to decode together (default: 1)")
    p.add_argument("-n", "--n-len", dest="n_len", type=int, default=None,
                   help="total length of each sequence, prompt included (default: 32)")
    cli.add_context_args(p, batch_size=False)
    cli.add_sampling_args(p, DEFAULTS, seed=1234, seed_help="RNG seed; sequence s uses SEED+s (-1 = random)",
                          penalties=False)
    p.add_argument("--greedy", action="store_true", help="argmax sampling (same as --temp 0)")
    args = cli.parse(p, argv, prog="batched", intermixed=True)

    pos = list(args.positional)
    if args.model is None and args.hf_repo is None:
        if not pos and not cli.bundled_model():
            p.error("no model: give MODEL, -m MODEL or -hf OWNER/NAME")
        args.model = pos.pop(0) if pos else cli.bundled_model()
    if len(pos) > len(POSITIONALS):
        p.error(f"too many positional arguments: {pos[len(POSITIONALS):]}")
    for name, value in zip(POSITIONALS, pos):
        if getattr(args, name, None) is not None:
            p.error(f"{name.upper()} is given both as a positional argument and as an option")
        try:
            setattr(args, name, value if name == "prompt" else (float(value) if name == "vram_budget" else int(value)))
        except ValueError:
            p.error(f"{name.upper()} must be a number, got {value!r}")
    args.prompt = "Hello my name is" if args.prompt is None else args.prompt
    args.n_parallel = 1 if args.n_parallel is None else args.n_parallel
    args.n_len = 32 if args.n_len is None else args.n_len
    if args.n_parallel < 1:
        p.error(f"PARALLEL must be >= 1, got {args.n_parallel}")
    if args.greedy:
        args.temp = 0.0
    return args


def run(args) -> int:
    timings = Timings()
    try:
        model = cli.load_model(args, "main")
        timings.load_ms = model.load_time_s * 1e3
        tok = model.tokenizer
        prompt_ids = tok.encode(args.prompt, add_special=True)
        n_prompt = len(prompt_ids)
        if not prompt_ids:
            raise CLIError("the prompt is empty")
        if args.n_len <= n_prompt:
            raise CLIError(f"LEN ({args.n_len}) must be greater than the prompt's {n_prompt} tokens")
        n_kv_req = n_prompt + (args.n_len - n_prompt) * args.n_parallel
        seed = args.seed if args.seed >= 0 else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        samplers = [pi.Sampler(cli.sampling_params(args, seed=seed + s), eos_ids=tok.eog_ids, tokenizer=tok)
                    for s in range(args.n_parallel)]
        ctx = cli.make_context(args, model, "main", n_ctx=n_kv_req, n_batch=max(args.n_len, args.n_parallel),
                               n_seq_max=args.n_parallel)
    except (CLIError, ValueError) as e:
        log(f"error: {e}")
        return 1
    if ctx.n_ctx < n_kv_req:
        log(f"main: error: n_kv_req ({n_kv_req}) > n_ctx ({ctx.n_ctx}), the required KV cache size is not big enough")
        return 1
    log(f"main: n_len = {args.n_len}, n_ctx = {ctx.n_ctx}, n_batch = {ctx.n_batch}, "
        f"n_parallel = {args.n_parallel}, n_kv_req = {n_kv_req}")
    log(f"main: seed = {seed}" + ("" if args.n_parallel == 1 else f" (sequence s uses {seed} + s)")
        + f", temp = {args.temp:.3f}, top_k = {args.top_k}, top_p = {args.top_p:.3f}")
    log("")
    log(args.prompt)
    log("")

    out, shown = sys.stdout, []
    if args.n_parallel == 1:
        out.write(args.prompt)
        out.flush()
    else:
        log(f"main: generating {args.n_parallel} sequences ...\n")

    def on_token(s: int, t: int, piece: str) -> None:
        if args.n_parallel == 1 and piece:
            shown.append(piece)
            out.write(piece)
            out.flush()

    def on_finish(s: int, n_cur: int) -> None:
        if args.n_parallel > 1:
            log(f"main: stream {s} finished at n_cur = {n_cur}")

    try:
        res = decode_parallel(ctx, prompt_ids, args.n_len, samplers, on_token=on_token, on_finish=on_finish,
                              timings=timings)
    except pi.PowerInferError as e:
        log(f"\nerror: {e}")
        return 1
    except KeyboardInterrupt:
        log("\nInterrupted by user")
        return 130
    if args.n_parallel == 1:
        out.write(res.texts[0][len("".join(shown)):] + "\n")     # the decoder's pending bytes
    else:
        for s, text in enumerate(res.texts):
            out.write(f"\nsequence {s}:\n\n{args.prompt}{text}\n")
    out.flush()
    speed = res.n_decode / res.t_gen_s if res.t_gen_s > 0 else 0.0
    log(f"\nmain: decoded {res.n_decode} tokens in {res.t_gen_s:.2f} s, speed: {speed:.2f} t/s")
    cli.sparse_report(ctx)
    log("\n" + timings.report())
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
