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

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

import powerinfer as pi
from powerinfer import act_sparsity
from powerinfer.generate import Timings
from powerinfer.cli_args import ArgumentParser, LoadProgress, add_llama_compat_args, apply_llama_compat
from powerinfer.hub import HubError, add_model_args, bundled_model, resolve_model
from powerinfer.offload import add_gpu_args, gpu_kwargs

POSITIONALS = ("prompt", "n_parallel", "n_len", "threads", "vram_budget", "n_gpu_layers")


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] [MODEL] [PROMPT] [PARALLEL] [LEN] [N_THREAD]")
    p.add_argument("positional", nargs="*", metavar="ARG",
                   help="MODEL PROMPT PARALLEL LEN N_THREAD, as the original takes them (MODEL is left out "
                        "when -m or -hf is given), then VRAM_BUDGET (GiB) and NGL as --vram-budget and -ngl")
    add_model_args(p, default=bundled_model())
    p.add_argument("-p", "--prompt", default=None, help='prompt (default: "Hello my name is")')
    p.add_argument("-np", "--parallel", dest="n_parallel", type=int, default=None,
                   help="number of sequences to decode together (default: 1)")
    p.add_argument("-n", "--n-len", dest="n_len", type=int, default=None,
                   help="total length of each sequence, prompt included (default: 32)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("-s", "--seed", type=int, default=1234, help="RNG seed; sequence s uses SEED+s (-1 = random) "
                   "(default: %(default)s)")
    p.add_argument("--temp", type=float, default=0.4, help="temperature (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=40, help="top-k, <= 0 off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=0.9, help="top-p, 1.0 off (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p, 0 off (default: %(default)s)")
    p.add_argument("--greedy", action="store_true", help="argmax sampling (same as --temp 0)")
    p.add_argument("--ignore-eos", action="store_true", help="do not end a sequence at end-of-text")
    p.add_argument("--kv-type", choices=["f16", "f32"], default="f16", help="KV cache type (default: %(default)s)")
    p.add_argument("--sparse-threshold", type=float, default=None,
                   help="predictor threshold for PowerInfer models (default: $LLAMA_SPARSE_PRED_THRESHOLD, "
                        "else the file's value, else 0.0)")
    p.add_argument("--sparsity", type=float, default=None,
                   help="gate-sparse files (tools/sparsify.py): run this stored sparsity level (default: the "
                        "file's default level; --sparse-threshold T instead: every layer at |act(gate)| >= T)")
    p.add_argument("--dense", action="store_true", help="compute every FFN neuron of a PowerInfer model")
    p.add_argument("-nr", "--no-repack", action="store_true",
                   help="keep the file's weight layout: no interleaved copy, slower matmuls")
    add_llama_compat_args(p)
    add_gpu_args(p)
    args = p.parse_intermixed_args(argv)
    apply_llama_compat(p, args, prog="batched")

    pos = list(args.positional)
    if args.model is None and args.hf_repo is None:
        if not pos and not bundled_model():
            p.error("no model: give MODEL, -m MODEL or -hf OWNER/NAME")
        args.model = pos.pop(0) if pos else bundled_model()
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


def log(msg: str = "", end: str = "\n") -> None:
    print(msg, file=sys.stderr, end=end, flush=True)


@dataclass
class BatchedResult:
    tokens: list[list[int]]              # generated tokens of each sequence (the end-of-text token excluded)
    finished_at: list[int]               # n_cur when each sequence ended
    n_decode: int = 0                    # tokens decoded after the prompt (all sequences)
    n_steps: int = 0                     # decode calls after the prompt
    t_gen_s: float = 0.0                 # seconds from the first sample to the end
    timings: Timings = field(default_factory=Timings)


def decode_parallel(ctx: pi.Context, prompt_ids: list[int], n_len: int, samplers: list[pi.Sampler],
                    eog_ids=(), on_token=None, on_finish=None, timings: Timings | None = None) -> BatchedResult:
    """Decode prompt_ids once into sequence 0, share it with sequences 1..N-1 (N = len(samplers)),
    then extend every sequence by one token per step in a single decode call until end-of-text
    or a total length of n_len. on_token(s, token) / on_finish(s, n_cur) are called as it goes."""
    n_parallel = len(samplers)
    n_prompt = len(prompt_ids)
    eog = set(eog_ids)
    timings = timings or Timings()
    res = BatchedResult(tokens=[[] for _ in range(n_parallel)], finished_at=[-1] * n_parallel, timings=timings)

    ctx.kv_clear()
    t0 = time.perf_counter()
    ctx.decode(prompt_ids, pos=range(n_prompt), seq_id=0, logits="last")
    timings.prompt_ms += (time.perf_counter() - t0) * 1e3
    timings.n_prompt += n_prompt
    for s in range(1, n_parallel):
        ctx.kv_seq_cp(0, s)
    for smp in samplers:
        for t in prompt_ids:
            smp.accept(t)

    # row of the decode output holding each sequence's next-token logits (-1: finished)
    row = [n_prompt - 1] * n_parallel
    logits_of = {n_prompt - 1: ctx.logits(n_prompt - 1)}
    n_cur = n_prompt
    t_start = time.perf_counter()
    while n_cur <= n_len:
        batch_tok, batch_seq = [], []
        t_s = time.perf_counter()
        for s in range(n_parallel):
            if row[s] < 0:
                continue
            tok = samplers[s].sample(logits_of[row[s]])
            samplers[s].accept(tok)
            timings.n_sample += 1
            if tok in eog or n_cur == n_len:
                row[s] = -1
                res.finished_at[s] = n_cur
                if on_finish:
                    on_finish(s, n_cur)
                continue
            res.tokens[s].append(tok)
            if on_token:
                on_token(s, tok)
            row[s] = len(batch_tok)
            batch_tok.append(tok)
            batch_seq.append(s)
        timings.sample_ms += (time.perf_counter() - t_s) * 1e3
        if not batch_tok:
            break
        t_d = time.perf_counter()
        ctx.decode(batch_tok, pos=[n_cur] * len(batch_tok), seq_id=batch_seq, logits="all")
        timings.eval_ms += (time.perf_counter() - t_d) * 1e3
        timings.n_eval += len(batch_tok)
        logits_of = {i: ctx.logits(i) for i in range(len(batch_tok))}
        res.n_decode += len(batch_tok)
        res.n_steps += 1
        n_cur += 1
    res.t_gen_s = time.perf_counter() - t_start
    return res


def run(args) -> int:
    timings = Timings()
    try:
        model_path = resolve_model(args)
    except HubError as e:
        log(f"error: {e}")
        return 1
    try:
        with LoadProgress("batched"):
            model = pi.Model(model_path, repack=False if args.no_repack else None)
    except (pi.ModelLoadError, OSError) as e:
        log(f"error: failed to load model: {e}")
        return 1
    timings.load_ms = model.load_time_s * 1e3
    tok = model.tokenizer
    log(f"main: loaded {model.describe()}")

    prompt_ids = tok.encode(args.prompt, add_special=True)
    n_prompt = len(prompt_ids)
    if not prompt_ids:
        log("error: the prompt is empty")
        return 1
    if args.n_len <= n_prompt:
        log(f"error: LEN ({args.n_len}) must be greater than the prompt's {n_prompt} tokens")
        return 1
    n_kv_req = n_prompt + (args.n_len - n_prompt) * args.n_parallel
    n_batch = max(args.n_len, args.n_parallel)
    seed = args.seed if args.seed >= 0 else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    try:
        samplers = [pi.Sampler(pi.SamplingParams(
            temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, repeat_penalty=1.0,
            seed=seed + s, ignore_eos=args.ignore_eos), eos_ids=[i for i in (tok.eos_id,) if i is not None])
            for s in range(args.n_parallel)]
        ctx = pi.Context(model, n_ctx=n_kv_req, n_batch=n_batch, n_seq_max=args.n_parallel,
                         n_threads=args.threads or None, kv_type=args.kv_type,
                         sparse_threshold=args.sparse_threshold, dense=args.dense, sparsity=args.sparsity, **gpu_kwargs(args))
        for line in ctx.gpu_log:
            log(line)
    except (ValueError, pi.PowerInferError) as e:
        log(f"error: {e}")
        return 1
    if ctx.n_ctx < n_kv_req:
        log(f"main: error: n_kv_req ({n_kv_req}) > n_ctx ({ctx.n_ctx}), the required KV cache size is not big enough")
        return 1
    log(f"main: n_len = {args.n_len}, n_ctx = {ctx.n_ctx}, n_batch = {ctx.n_batch}, "
        f"n_parallel = {args.n_parallel}, n_kv_req = {n_kv_req}")
    log(f"main: seed = {seed}" + ("" if args.n_parallel == 1 else f" (sequence s uses {seed} + s)")
        + f", temp = {args.temp:.3f}, top_k = {args.top_k}, top_p = {args.top_p:.3f}")
    if model.sparse:
        log("main: PowerInfer model, " + ("every neuron is computed (--dense)" if args.dense else
            f"sparse inference, sparse_pred_threshold = {ctx.sparse_threshold:.2f}"))
    elif model.gate_sparse:
        log(act_sparsity.describe(ctx))
    log("")
    log(args.prompt)
    log("")

    eog = [] if args.ignore_eos else [t for t in range(model.n_vocab) if tok.is_eog(t)]
    decoders = [pi.StreamDecoder(tok, strip_leading_space=False) for _ in range(args.n_parallel)]
    texts = [""] * args.n_parallel
    out = sys.stdout
    if args.n_parallel == 1:
        out.write(args.prompt)
        out.flush()
    else:
        log(f"main: generating {args.n_parallel} sequences ...\n")

    def on_token(s: int, t: int) -> None:
        piece = decoders[s].push(t)
        texts[s] += piece
        if args.n_parallel == 1 and piece:
            out.write(piece)
            out.flush()

    def on_finish(s: int, n_cur: int) -> None:
        if args.n_parallel > 1:
            log(f"main: stream {s} finished at n_cur = {n_cur}")

    try:
        res = decode_parallel(ctx, prompt_ids, args.n_len, samplers, eog, on_token, on_finish, timings)
    except pi.PowerInferError as e:
        log(f"\nerror: {e}")
        return 1
    except KeyboardInterrupt:
        log("\nInterrupted by user")
        return 130
    tails = [d.flush() for d in decoders]
    for s in range(args.n_parallel):
        texts[s] += tails[s]
    if args.n_parallel == 1:
        out.write(tails[0] + "\n")
    else:
        for s in range(args.n_parallel):
            out.write(f"\nsequence {s}:\n\n{args.prompt}{texts[s]}\n")
    out.flush()
    speed = res.n_decode / res.t_gen_s if res.t_gen_s > 0 else 0.0
    log(f"\nmain: decoded {res.n_decode} tokens in {res.t_gen_s:.2f} s, speed: {speed:.2f} t/s")
    if ctx.sparse:
        active, total = ctx.sparse_stats()
        if total:
            log("sparse: neurons computed per layer: " + " ".join(f"{a / total:.1%}" for a in active))
    log("\n" + timings.report())
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
