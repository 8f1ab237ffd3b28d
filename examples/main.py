#!/usr/bin/env python3
"""main: generate text from a prompt, or chat interactively, like llama.cpp's `main`.

    python examples/main.py -m models/tiny-q8_0.gguf -p "Once upon a time" -n 64
    python examples/main.py -m MODEL -i -r "User:" -f chat-prompt.txt
    python examples/main.py -m gemma-3-270m-q4_k_m.gguf -sys "You are a helpful assistant."   # chat (-cnv)

Generated text goes to stdout as it is produced; logs and timings go to stderr.
"""
from __future__ import annotations

import argparse
import codecs
import signal
import sys
from pathlib import Path

import powerinfer as pi
from powerinfer import act_sparsity
from powerinfer.cli_args import (ArgumentParser, LoadProgress, add_llama_compat_args, apply_llama_compat,
                                 threads_in_use)
from powerinfer.generate import ContextFull, Generator, Timings
from powerinfer.hub import HubError, add_model_args, bundled_model, resolve_model
from powerinfer.offload import add_gpu_args, gpu_kwargs

_SP = pi.SamplingParams()        # the one set of sampling defaults (the API's and the server's too)

YELLOW, GREEN, RESET = "\033[33m", "\033[1;32m", "\033[0m"


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, default=bundled_model())
    p.add_argument("-p", "--prompt", default=None, help="prompt to start generation with")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    p.add_argument("-e", "--escape", action="store_true", help="process escapes (\\n, \\t, ...) in the prompt")
    p.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens to predict (-1 = until end of text or a full context, -2 = until the context is full)")
    p.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="context size (0 = from the model) (default: 4096, or the model's training context if smaller)")
    p.add_argument("-b", "--batch-size", type=int, default=512,
                   help="tokens per decode call for prompts (default: %(default)s)")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (default: physical cores)")
    p.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed (-1 = random)")
    p.add_argument("--temp", type=float, default=_SP.temperature,
                   help="temperature, <= 0 for greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=_SP.top_k, help="top-k sampling, <= 0 off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=_SP.top_p, help="top-p sampling, 1.0 off (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=_SP.min_p, help="min-p sampling, 0 off (default: %(default)s)")
    p.add_argument("--repeat-penalty", type=float, default=_SP.repeat_penalty,
                   help="repeat penalty, 1.0 off (default: %(default)s)")
    p.add_argument("--repeat-last-n", type=int, default=_SP.repeat_last_n,
                   help="tokens the penalties look back over, -1 = all (default: %(default)s)")
    p.add_argument("--presence-penalty", type=float, default=_SP.presence_penalty,
                   help="presence penalty (default: %(default)s)")
    p.add_argument("--frequency-penalty", type=float, default=_SP.frequency_penalty,
                   help="frequency penalty (default: %(default)s)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at the end-of-text token")
    p.add_argument("-i", "--interactive", action="store_true", help="interactive mode: hand control to the user")
    p.add_argument("--interactive-first", action="store_true", help="interactive mode, and wait for input first")
    p.add_argument("-r", "--reverse-prompt", action="append", default=[],
                   help="in interactive mode, stop generating at this text and wait for input (repeatable)")
    p.add_argument("-cnv", "--conversation", action="store_true", default=None,
                   help="conversation mode: chat through the model's chat template (-sys: the system message, "
                        "-p: the first user message) (default: on when the model has a chat template)")
    p.add_argument("-no-cnv", "--no-conversation", dest="conversation", action="store_false",
                   help="plain text completion even when the model has a chat template")
    p.add_argument("-sys", "--system-prompt", default=None, help="with -cnv: the system message")
    p.add_argument("-st", "--single-turn", action="store_true",
                   help="with -cnv: answer one message (-p, else the first typed line), then exit")
    p.add_argument("--context-shift", action="store_true",
                   help="when the context is full, drop the older half of the tokens after --keep and go on "
                        "(default: stop, as llama.cpp)")
    p.add_argument("--keep", type=int, default=0,
                   help="with --context-shift: prompt tokens to keep (-1 = the whole prompt) (default: %(default)s)")
    p.add_argument("--chat-template", default=None,
                   help="with -cnv: a built-in template name (chatml, llama2, vicuna, gemma) or Jinja template text "
                        "(default: the file's tokenizer.chat_template)")
    p.add_argument("--in-prefix", default="", help="text added before each user input")
    p.add_argument("--in-suffix", default="", help="text added after each user input")
    p.add_argument("--color", action="store_true", help="colour the prompt and the user input")
    p.add_argument("--verbose-prompt", action="store_true", help="print the prompt's tokens before generating")
    p.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    p.add_argument("--kv-type", choices=["f16", "f32"], default="f16", help="KV cache type (default: %(default)s)")
    p.add_argument("--sparse-threshold", type=float, default=None,
                   help="predictor threshold for PowerInfer models (default: $LLAMA_SPARSE_PRED_THRESHOLD, "
                        "else the file's powerinfer.sparse_threshold, else 0.0)")
    p.add_argument("--sparsity", type=float, default=None,
                   help="gate-sparse files (tools/sparsify.py): run this stored sparsity level (default: the "
                        "file's default level; --sparse-threshold T instead: every layer at |act(gate)| >= T)")
    p.add_argument("-nr", "--no-repack", action="store_true",
                   help="keep the file's weight layout: no interleaved copy, slower matmuls")
    p.add_argument("--dense", action="store_true",
                   help="compute every FFN neuron of a PowerInfer model (no predictor), for comparison")
    add_llama_compat_args(p)
    add_gpu_args(p)
    args = p.parse_args(argv)
    apply_llama_compat(p, args, prog="main")
    if args.keep and not args.context_shift:
        log("main: note: --keep changes nothing without --context-shift (nothing is dropped when the context "
            "is full: generation stops)")
    args.interactive = args.interactive or args.interactive_first
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_prompt(args) -> str:
    if args.file:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"error: cannot read prompt file {args.file}: {e}")
    else:
        text = args.prompt if args.prompt is not None else ("" if args.interactive else "Once upon a time")
    if args.escape:
        text = codecs.decode(text.encode("utf-8"), "unicode_escape").encode("latin-1").decode("utf-8")
    return text


class Interrupt:
    """Ctrl-C: in interactive mode the first press during generation hands control to the user;
    otherwise (a second press, or at the input prompt) it ends the run."""

    def __init__(self, interactive: bool):
        self.interactive = interactive
        self.requested = False
        self.reading = False
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame):
        if self.interactive and not self.requested and not self.reading:
            self.requested = True
            return
        raise KeyboardInterrupt

    def begin_input(self) -> None:
        """From here until readline() returns, Ctrl-C exits: call it before showing the input prompt."""
        self.requested = False
        self.reading = True

    def readline(self) -> str:
        """A line of user input; Ctrl-C here exits (a plain handler return would resume the read)."""
        self.reading = True
        try:
            return sys.stdin.readline()
        finally:
            self.reading = False


def n_keep(args, prompt_ids: list[int], tok) -> int:
    """--keep as llama.cpp counts it: prompt tokens after the BOS (-1: the whole prompt); BOS is kept."""
    bos = 1 if prompt_ids and tok.bos_id is not None and prompt_ids[0] == tok.bos_id else 0
    if args.keep < 0 or args.keep + bos > len(prompt_ids):
        return len(prompt_ids)
    return args.keep + bos


def run(args) -> int:
    timings = Timings()
    try:
        prompt = read_prompt(args)       # a missing -f file fails before the model loads
    except SystemExit as e:
        log(str(e))
        return 1
    try:
        args.model = str(resolve_model(args))
    except HubError as e:
        log(f"error: {e}")
        return 1
    try:
        with LoadProgress("main"):
            model = pi.Model(args.model, repack=False if args.no_repack else None)
    except pi.ModelLoadError as e:
        log(f"error: failed to load model: {e}")
        return 1
    timings.load_ms = model.load_time_s * 1e3
    tok = model.tokenizer
    log(f"main: loaded {model.describe()}")
    log(f"system_info: n_threads = {threads_in_use(args.threads)} | {pi.system_info()}")

    params = pi.SamplingParams(
        temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=args.seed, ignore_eos=args.ignore_eos)
    try:
        params.validate()
        ctx = pi.Context(model, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads or None,
                         kv_type=args.kv_type, sparse_threshold=args.sparse_threshold, dense=args.dense, sparsity=args.sparsity,
                         **gpu_kwargs(args))
        for line in ctx.gpu_log:
            log(line)
    except (ValueError, pi.PowerInferError) as e:
        log(f"error: {e}")
        return 1
    eog_ids = [] if args.ignore_eos else [i for i in (tok.eos_id,) if i is not None]
    sampler = pi.Sampler(params, eos_ids=[i for i in (tok.eos_id,) if i is not None])
    log(f"sampling: seed = {sampler.seed}, temp = {args.temp:.3f}, top_k = {args.top_k}, top_p = {args.top_p:.3f}, "
        f"min_p = {args.min_p:.3f}, repeat_last_n = {args.repeat_last_n}, repeat_penalty = {args.repeat_penalty:.3f}")
    log(f"generate: n_ctx = {ctx.n_ctx}, n_batch = {ctx.n_batch}, n_predict = {args.n_predict}")
    if model.sparse:
        log("PowerInfer model loaded. " + ("Every neuron is computed (--dense)." if args.dense else
            f"Sparse inference will be used. sparse_pred_threshold = {ctx.sparse_threshold:.2f}"))

    elif model.gate_sparse:
        log(act_sparsity.describe(ctx))
    if args.conversation is None:        # llama.cpp: a chat template switches conversation mode on
        args.conversation = bool(model.metadata.get("tokenizer.chat_template")) and not args.interactive
        if args.conversation:
            log("main: the model has a chat template: conversation mode is on (-no-cnv for plain completion)")
    if args.conversation:
        first = prompt if (args.prompt is not None or args.file) else None
        return run_conversation(args, model, ctx, sampler, timings, first)
    if args.system_prompt is not None or args.single_turn:
        log("main: note: -sys and -st apply to conversation mode (-cnv) only; ignored")
    prompt_ids = tok.encode(prompt, add_special=True)
    if len(prompt_ids) > ctx.n_ctx - 4 and not args.interactive and not args.context_shift:
        log(f"error: prompt is too long ({len(prompt_ids)} tokens, max {ctx.n_ctx - 4})")
        return 1
    if args.verbose_prompt:
        log(f"\nmain: prompt: '{prompt}'\nmain: number of tokens in prompt = {len(prompt_ids)}")
        for t in prompt_ids:
            log(f"{t:6d} -> '{tok.id_to_text(t)}'")
        log("")

    gen = Generator(ctx, sampler, timings=timings, context_shift=args.context_shift,
                    n_keep=n_keep(args, prompt_ids, tok))
    interrupt = Interrupt(args.interactive)
    out = sys.stdout
    color = args.color and out.isatty() or args.color
    if args.interactive:
        log("== Running in interactive mode. ==\n - Press Ctrl+C to interject at any time.\n"
            " - Press Return to return control to LLaMa.\n - If you want to submit another line, end your input with '\\'.\n")

    shown = [""]        # the last text written, to know whether a line is open

    def emit(text: str, colour: str | None = None) -> None:
        out.write(f"{colour}{text}{RESET}" if colour and color and text else text)
        out.flush()
        shown[0] = text or shown[0]

    n_predict = args.n_predict if args.n_predict >= 0 else -1
    try:
        if not args.no_display_prompt:
            emit(prompt, YELLOW)
        gen.feed(prompt_ids)
        waiting_for_user = args.interactive_first
        while True:
            if not waiting_for_user:
                decoder = pi.StreamDecoder(tok, strip_leading_space=False)
                recent = ""
                hit_eog = False
                for t in gen.generate(n_predict, eog_ids=eog_ids):
                    if t in eog_ids:
                        hit_eog = True
                        break
                    piece = decoder.push(t)
                    emit(piece)
                    recent = (recent + piece)[-256:]
                    if args.interactive and (interrupt.requested or any(recent.endswith(r) for r in args.reverse_prompt)):
                        break
                else:
                    emit(decoder.flush())
                if gen.context_full:
                    log("\nmain: context is full, stopping (--context-shift goes on instead)")
                    break
                if not args.interactive:
                    if hit_eog:
                        log(" [end of text]")
                    break
                at_reverse_prompt = any(recent.endswith(r) for r in args.reverse_prompt)
            else:
                at_reverse_prompt = any(prompt.endswith(r) for r in args.reverse_prompt)
            waiting_for_user = False
            interrupt.begin_input()
            if not at_reverse_prompt:     # the user's text starts on a line of its own, not glued to the model's
                emit("> " if shown[0] in ("", "\n") or shown[0].endswith("\n") else "\n> ")
            lines = []
            while True:
                if color:
                    out.write(GREEN)
                    out.flush()
                line = interrupt.readline()
                if color:
                    out.write(RESET)
                    out.flush()
                if not line:
                    log("EOF by user")
                    raise EOFError
                if line.endswith("\\\n"):
                    lines.append(line[:-2] + "\n")
                    continue
                lines.append(line)
                break
            text = args.in_prefix + "".join(lines) + args.in_suffix
            emit(args.in_suffix) if args.in_suffix else None
            gen.feed(tok.encode(text, add_special=False))
    except EOFError:
        pass
    except ContextFull as e:
        log(f"\nmain: {e}")
    except KeyboardInterrupt:
        log("\nInterrupted by user")
        log(timings.report())
        return 130
    except pi.PowerInferError as e:
        log(f"\nerror: {e}")
        return 1
    if ctx.sparse:
        active, total = ctx.sparse_stats()
        if total:
            log("\nsparse: neurons computed per layer: " + " ".join(f"{a / total:.1%}" for a in active))
    log("\n" + timings.report())
    return 0


def run_conversation(args, model, ctx, sampler, timings, first_message: str | None = None) -> int:
    """-cnv: each user line becomes a message; the chat template renders the conversation and only the
    new text (the rendering of all messages minus that of the previous ones) is fed; the reply ends at an
    end-of-generation token or the template's end-of-turn marker and joins the conversation.
    As llama.cpp: -sys is the system message, -p (`first_message`) the first user message, -st ends after one
    reply; an empty line is not a message (it quits nothing); Ctrl+C at the prompt or end of input exits."""
    from powerinfer.chat import ChatFormatter, ChatTemplateError
    tok = model.tokenizer
    try:       # the same resolution as the server and PowerInfer (Gemma files without a template: gemma)
        fmt = ChatFormatter.resolve(model.metadata, chat_template=args.chat_template, tokenizer=tok)
    except (ChatTemplateError, ValueError) as e:
        log(f"error: {e}")
        return 1
    log(f"main: chat template: {fmt.name}")
    eog_ids = {i for i in range(tok.n_vocab) if tok.is_eog(i)}
    for marker in fmt.end_of_turn:       # e.g. <end_of_turn>, <|im_end|> as single tokens
        ids = tok.encode(marker, add_special=False, parse_special=True)
        if len(ids) == 1:
            eog_ids.add(ids[0])
    def new_generator():
        return Generator(ctx, sampler, timings=timings, context_shift=args.context_shift)
    gen = new_generator()
    interrupt = Interrupt(True)
    out = sys.stdout
    color = args.color

    def emit(text: str, colour: str | None = None) -> None:
        out.write(f"{colour}{text}{RESET}" if colour and color and text else text)
        out.flush()

    system = args.system_prompt or ""
    if args.escape and system:
        system = codecs.decode(system.encode("utf-8"), "unicode_escape").encode("latin-1").decode("utf-8")
    messages = [{"role": "system", "content": system}] if system else []
    rendered = ""          # what has been fed so far, as text
    log("== Running in conversation mode. ==\n - Press Ctrl+C to interject at any time; at the prompt, to quit.\n"
        " - End of input (Ctrl+D) quits. End a line with '\\' to continue it on the next.\n")
    turns = 0
    try:
        while True:
            if args.single_turn and turns:
                break
            if first_message is not None and not turns:
                user = first_message
                if color:
                    out.write(GREEN)
                out.write(f"> {user}\n")
                if color:
                    out.write(RESET)
                out.flush()
            else:
                interrupt.begin_input()
                if color:
                    out.write(GREEN)
                out.write("> ")
                out.flush()
                lines = []
                while True:
                    line = interrupt.readline()
                    if not line:
                        raise EOFError
                    if line.endswith("\\\n"):
                        lines.append(line[:-2] + "\n")
                        continue
                    lines.append(line)
                    break
                if color:
                    out.write(RESET)
                    out.flush()
                user = "".join(lines).rstrip("\n")
                if not user.strip():
                    continue            # an empty line is no message (llama.cpp asks again)
            turns += 1
            messages.append({"role": "user", "content": user})
            try:
                text = fmt.render(messages, add_generation_prompt=True)
            except ChatTemplateError as e:
                log(f"error: {e}")
                messages.pop()
                continue
            delta = text[len(rendered):] if text.startswith(rendered) else text
            first = not rendered
            # BOS once: from the template's own text (parsed as a special token) or added here
            add_bos = first and not (fmt.bos_token and text.startswith(fmt.bos_token))
            ids = tok.encode(delta, add_special=add_bos, parse_special=True)
            gen.feed(ids)
            if first:            # --keep counts the tokens of the first rendering (system + first message)
                gen.n_keep = n_keep(args, ids, tok)
            rendered = text
            decoder = pi.StreamDecoder(tok, strip_leading_space=False)
            reply = ""
            interrupt.requested = False
            for t in gen.generate(args.n_predict if args.n_predict >= 0 else -1, eog_ids=eog_ids):
                if t in eog_ids:
                    break
                piece = decoder.push(t)
                reply += piece
                emit(piece)
                if interrupt.requested or any(m and m in reply for m in fmt.end_of_turn):
                    break
            reply += decoder.flush()
            emit("\n")
            if gen.context_full:
                log("main: context is full, stopping (--context-shift goes on instead)")
                break
            for m in fmt.end_of_turn:
                reply = reply.split(m)[0] if m else reply
            reply = reply.strip()
            messages.append({"role": "assistant", "content": reply})
            # The cache now holds `text` + the reply's tokens. Feed the rest of the template's rendering
            # of the finished turn (its end-of-turn marker), so that the next delta continues from it.
            after = fmt.render(messages, add_generation_prompt=False)
            if after.startswith(text) and after[len(text):].startswith(reply):
                tail = after[len(text) + len(reply):]
                if tail:
                    gen.feed(tok.encode(tail, add_special=False, parse_special=True))
                rendered = after
            else:                    # the template rewrites earlier turns: re-feed everything next time
                ctx.kv_clear()
                gen = new_generator()
                rendered = ""
    except EOFError:
        pass
    except ContextFull as e:
        log(f"\nmain: {e}")
    except KeyboardInterrupt:
        log("\nInterrupted by user")
        log(timings.report())
        return 130
    except pi.PowerInferError as e:
        log(f"\nerror: {e}")
        return 1
    log("\n" + timings.report())
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
