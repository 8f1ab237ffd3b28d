#!/usr/bin/env python3
"""main: generate text from a prompt, or chat interactively, like llama.cpp's `main`.

    python examples/main.py -m models/tiny-q8_0.gguf -p "Once upon a time" -n 64
    python examples/main.py -m MODEL -i -r "User:" -f chat-prompt.txt
    python examples/main.py -m gemma-3-270m-q4_k_m.gguf -sys "You are a helpful assistant."   # chat (-cnv)

Generated text goes to stdout as it is produced; logs and timings go to stderr.
"""
from __future__ import annotations

import sys
from pathlib import Path

import powerinfer as pi
from powerinfer import cli
from powerinfer.chat import ChatFormatter, ChatTemplateError, ChatTurns, preserved_ids
from powerinfer.cli import GREEN, YELLOW, CLIError, Console, Interrupt, log
from powerinfer.cli_args import threads_in_use
from powerinfer.engine import ContextFull, Timings
from powerinfer.encoder import refuse_generation
from powerinfer.generator import Generator
from powerinfer.request import common_prefix
from powerinfer.state_file import read_state_file, write_state_file


def parse_args(argv=None):
    p = cli.parser(__doc__)
    cli.add_prompt_args(p)
    p.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens to predict (-1 = until end of text or a full context, -2 = until the context is full)")
    cli.add_context_args(p, ctx_size="context size (0 = from the model) (default: 4096, or the model's training "
                                     "context if smaller)")
    cli.add_sampling_args(p)
    cli.add_grammar_args(p)
    cli.add_interactive_args(p)
    cli.add_speculative_args(p)
    g = p.add_argument_group("prompt cache (plain completion)")
    g.add_argument("--prompt-cache", metavar="FNAME", default=None,
                   help="the prompt's KV state in a file: when it exists, the prompt's prefix that matches it is not "
                        "evaluated again; written after generation")
    g.add_argument("--prompt-cache-all", action="store_true",
                   help="with --prompt-cache: save the generated tokens too (not in interactive mode)")
    g.add_argument("--prompt-cache-ro", action="store_true", help="with --prompt-cache: read it, do not update it")
    g = p.add_argument_group("images (llama.cpp's llama-mtmd-cli)")
    g.add_argument("-mm", "--mmproj", metavar="FILE", default=None,
                   help="multimodal projector file (mmproj-*.gguf, Gemma 3's) for --image")
    g.add_argument("--image", metavar="FILE", action="append", default=[],
                   help="an image for the prompt (repeatable; JPEG, PNG, WebP... through Pillow): where the prompt "
                        "says <__media__>, else before the prompt, one marker per image")
    return cli.parse(p, argv, prog="main")


def load_images(args, model):
    """--mmproj / --image: (projector, [(hash, embeddings)]) or (None, []); CLIError for a bad file or image."""
    if not args.image:
        if args.mmproj:
            log("main: note: --mmproj without --image: no image to read")
        return None, []
    if not args.mmproj:
        raise CLIError("--image needs --mmproj (the model's multimodal projector file)")
    if args.prompt_cache:
        raise CLIError("--prompt-cache cannot save a prompt holding images")
    from powerinfer.multimodal import encode_images
    from powerinfer.vision import ImageError, VisionError, VisionProjector
    try:
        proj = VisionProjector(args.mmproj, n_threads=args.threads or None)
        proj.check_text_model(model)
        log(f"main: multimodal projector {args.mmproj}: {proj.hp.proj_type}, {proj.n_image_tokens} tokens per image")
        import time
        t0 = time.perf_counter()
        encoded = encode_images(proj, args.image)
        log(f"main: {len(encoded)} image(s) encoded in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    except (VisionError, ImageError) as e:
        raise CLIError(str(e)) from None
    return proj, encoded


def with_markers(text: str, n: int) -> str:
    """mtmd-cli: a prompt without a media marker gets one per image in front of it."""
    from powerinfer.vision import MEDIA_MARKER
    return text if MEDIA_MARKER in text or n == 0 else MEDIA_MARKER * n + text


def load_prompt_cache(args, model, gen: Generator, prompt_ids: list[int]) -> int:
    """--prompt-cache: the sequence starts with the file's tokens that match the prompt (at least the prompt's last
    token is evaluated again, for its logits); returns how many. A missing file is created later."""
    path = Path(args.prompt_cache)
    log(f"main: attempting to load saved session from '{path}'")
    if not path.exists():
        log("main: session file does not exist, will create.")
        return 0
    try:
        tokens, state, _ = read_state_file(path, model)
        n = common_prefix(tokens, prompt_ids)
        gen.load_state(tokens, state, keep=min(n, len(prompt_ids) - 1))
    except (OSError, ValueError, pi.PowerInferError) as e:
        raise CLIError(f"--prompt-cache {path}: {e}") from None
    log(f"main: loaded a session with prompt size of {len(tokens)} tokens")
    if n == len(prompt_ids):
        log("main: session file has exact match for prompt!")
    elif n < len(prompt_ids) / 2:
        log(f"main: warning: session file has low similarity to prompt ({n} / {len(prompt_ids)} tokens); will "
            "mostly be reevaluated")
    else:
        log(f"main: session file matches {n} / {len(prompt_ids)} tokens of prompt")
    return len(gen.tokens)


def save_prompt_cache(args, model, gen: Generator, prompt_ids: list[int]) -> None:
    """--prompt-cache (unless -ro): the prompt's tokens and KV state (--prompt-cache-all: every evaluated token)."""
    if not args.prompt_cache or args.prompt_cache_ro:
        return
    # --prompt-cache-all: everything evaluated; else the prompt's positions still cached (a context shift drops some)
    n = len(gen.tokens) if args.prompt_cache_all else common_prefix(gen.tokens, prompt_ids)
    tokens, state = gen.state(n)
    try:
        write_state_file(Path(args.prompt_cache), model, tokens, state)
    except OSError as e:
        log(f"main: error: cannot write --prompt-cache {args.prompt_cache}: {e.strerror}")
        return
    log(f"\nmain: saved session to '{args.prompt_cache}' ({len(tokens)} tokens)")


def reply(gen: Generator, tok, n_predict: int, stops, interrupt: Interrupt, out: Console, *, stop_token_ids=(),
          show_tail: bool = True, grammar=None, preserved=()) -> str:
    """Generate and show text until an end-of-generation token, a stop string, Ctrl-C, n_predict tokens,
    a full context or the end of `grammar` (--grammar, -j: each reply matches it). The text returned
    ends with the decoder's pending bytes, which are shown (show_tail) only when generation ran to its end.
    preserved: control tokens shown as text (a chat format's markers, e.g. Gemma 4's thought channel)."""
    decoder = pi.StreamDecoder(tok, strip_leading_space=False, preserved=preserved)
    text, interrupted = "", False
    tokens = gen.generate(n_predict, stop=stops, stop_token_ids=stop_token_ids, grammar=grammar)
    for t in tokens:
        piece = decoder.push(t)
        text += piece
        out.write(piece)
        if interrupt.requested:
            interrupted = True
            break
    tokens.close()                 # ends the generation if it was interrupted
    tail = decoder.flush()
    if show_tail and not (interrupted or gen.hit_eog or gen.stop_word):
        out.write(tail)
    return text + tail


def run(args) -> int:
    timings = Timings()
    try:
        # a missing -f (-sysf, --chat-template-file) file fails before the model loads
        prompt = cli.prompt_text(args, "" if args.interactive else "Once upon a time")
        cli.read_file_flags(args)
        model = cli.load_model(args, "main")
        refuse_generation(model)      # an encoder has no output head (ValueError: the error below, exit 1)
        timings.load_ms = model.load_time_s * 1e3
        log(f"system_info: n_threads = {threads_in_use(args.threads)} | {pi.system_info()}")
        params = cli.sampling_params(args)
        bad = [t for t in params.logit_bias if t >= model.n_vocab]
        if bad:
            raise CLIError(f"--logit-bias: token {bad[0]} is out of range [0, {model.n_vocab})")
        args.grammar_obj = cli.grammar_of(args)
        ctx = cli.make_context(args, model, "main")
        drafter, spec = cli.make_speculative(args, model, "main", n_ctx=ctx.n_ctx)
        args.projector, args.encoded = load_images(args, model)
    except (CLIError, ValueError) as e:
        log(f"error: {e}")
        return 1
    tok = model.tokenizer
    sampler = pi.Sampler(params, eos_ids=tok.eog_ids, tokenizer=tok)
    log(f"sampling: seed = {sampler.seed}, temp = {args.temp:.3f}, top_k = {args.top_k}, top_p = {args.top_p:.3f}, "
        f"min_p = {args.min_p:.3f}, repeat_last_n = {args.repeat_last_n}, repeat_penalty = {args.repeat_penalty:.3f}")
    k_bytes, v_bytes = ctx.kv_cache_bytes
    log(f"llama_kv_cache_init: KV self size = {(k_bytes + v_bytes) / 2**20:.2f} MiB, K ({ctx.type_k}): "
        f"{k_bytes / 2**20:.2f} MiB, V ({ctx.type_v}): {v_bytes / 2**20:.2f} MiB")
    log(f"generate: n_ctx = {ctx.n_ctx}, n_batch = {ctx.n_batch}, n_predict = {args.n_predict}")
    if args.conversation is None:        # llama.cpp: a chat template switches conversation mode on
        args.conversation = bool(model.metadata.get("tokenizer.chat_template")) and not args.interactive
        if args.conversation:
            log("main: the model has a chat template: conversation mode is on (-no-cnv for plain completion)")
    if drafter is not None and ctx.exact_batch_max == 1:
        log("main: note: a gate-sparse level with --sparse-gather-max 1 runs batches of several tokens through other "
            "kernels, so drafts would change the output: none are made (--sparse-gather-max 17 allows 16)")
    gen = Generator(ctx, sampler, timings=timings, context_shift=args.context_shift, drafter=drafter, spec=spec)
    out = Console(args.color)
    n_predict = args.n_predict if args.n_predict >= 0 else -1
    try:
        if args.conversation:
            first = prompt if (args.prompt is not None or args.file) else None
            status = conversation(args, model, gen, first, out, n_predict)
        else:
            status = completion(args, model, gen, prompt, out, n_predict)
    except ContextFull as e:
        log(f"\nmain: {e}")
        status = 0
    except KeyboardInterrupt:
        log("\nInterrupted by user")
        log(timings.report())
        return 130
    except pi.PowerInferError as e:
        log(f"\nerror: {e}")
        return 1
    if status == 0:
        if ctx.sparse:
            log("")           # the generated text ends without a newline
        cli.sparse_report(ctx)
        log("\n" + timings.report())
        if drafter is not None:
            e = gen.engine
            log(f"speculative: n_drafted = {e.n_drafted}, n_accept = {e.n_draft_accepted}, accept = "
                f"{100 * e.n_draft_accepted / max(e.n_drafted, 1):.1f}%, draft time = {e.draft_ms:.2f} ms")
    return status


def completion(args, model, gen: Generator, prompt: str, out: Console, n_predict: int) -> int:
    """Plain text completion; -i: hand control to the user at a reverse prompt, Ctrl-C or the end."""
    tok = model.tokenizer
    if args.system_prompt is not None or args.single_turn:
        log("main: note: -sys and -st apply to conversation mode (-cnv) only; ignored")
    if args.encoded:
        from powerinfer.multimodal import build_prompt
        from powerinfer.vision import ImageError
        try:
            prompt_ids, gen.images = build_prompt(tok, args.projector, with_markers(prompt, len(args.encoded)),
                                                  encoded=args.encoded)
        except ImageError as e:
            log(f"error: {e}")
            return 1
    else:
        prompt_ids = tok.encode(prompt, add_special=True)
    if len(prompt_ids) > gen.ctx.n_ctx - 4 and not args.interactive and not args.context_shift:
        log(f"error: prompt is too long ({len(prompt_ids)} tokens, max {gen.ctx.n_ctx - 4})")
        return 1
    if args.verbose_prompt:
        cli.log_prompt_tokens(prompt, prompt_ids, tok)
    if args.prompt_cache_all and args.interactive:
        log("error: --prompt-cache-all is not supported in interactive mode")
        return 1
    n_cached = 0
    if args.prompt_cache:
        try:
            n_cached = load_prompt_cache(args, model, gen, prompt_ids)
        except CLIError as e:
            log(f"error: {e}")
            return 1
    gen.keep_prompt(prompt_ids, args.keep)
    interrupt = Interrupt(args.interactive)
    if args.interactive:
        log("== Running in interactive mode. ==\n - Press Ctrl+C to interject at any time.\n"
            " - Press Return to return control to LLaMa.\n"
            " - If you want to submit another line, end your input with '\\'.\n")
    if not args.no_display_prompt:
        out.write(prompt, YELLOW)
    gen.feed(prompt_ids[n_cached:])
    at_reverse_prompt = any(prompt.endswith(r) for r in args.reverse_prompt)
    waiting_for_user = args.interactive_first
    try:
        status = completion_loop(args, gen, tok, out, n_predict, interrupt, at_reverse_prompt, waiting_for_user)
    except KeyboardInterrupt:            # what was evaluated is valid: keep it (not after a failed decode)
        save_prompt_cache(args, model, gen, prompt_ids)
        raise
    save_prompt_cache(args, model, gen, prompt_ids)
    return status


def completion_loop(args, gen: Generator, tok, out: Console, n_predict: int, interrupt: Interrupt,
                    at_reverse_prompt: bool, waiting_for_user: bool) -> int:
    """completion()'s generation and, with -i, the user's turns."""
    try:
        while True:
            if not waiting_for_user:
                reply(gen, tok, n_predict, args.reverse_prompt if args.interactive else (), interrupt, out,
                      grammar=args.grammar_obj)
                if gen.context_full:
                    log("\nmain: context is full, stopping (--context-shift goes on instead)")
                    return 0
                if not args.interactive:
                    if gen.hit_eog:
                        log(" [end of text]")
                    return 0
                at_reverse_prompt = gen.stop_word is not None
            waiting_for_user = False
            # the user's text starts on a line of its own, not glued to the model's
            text = out.read(interrupt, "" if at_reverse_prompt else ("\n> " if out.line_open else "> "))
            out.write(args.in_suffix)
            gen.feed(tok.encode(args.in_prefix + text + args.in_suffix, add_special=False))
    except EOFError:
        log("EOF by user")
        return 0


def conversation(args, model, gen: Generator, first_message: str | None, out: Console, n_predict: int) -> int:
    """-cnv: each user line becomes a message; the chat template renders the conversation and only the
    new text (the rendering of all messages minus that of the previous ones) is fed; the reply ends at an
    end-of-generation token or the template's end-of-turn marker and joins the conversation.
    As llama.cpp: -sys is the system message, -p (`first_message`) the first user message, -st ends after one
    reply; an empty line is not a message (it quits nothing); Ctrl+C at the prompt or end of input exits."""
    tok = model.tokenizer
    if args.prompt_cache:
        log("main: note: --prompt-cache applies to plain completion (-no-cnv); ignored in conversation mode")
    try:       # the same resolution as the server and PowerInfer (Gemma files without a template: gemma)
        fmt = ChatFormatter.resolve(model.metadata, chat_template=args.chat_template, tokenizer=tok)
    except (ChatTemplateError, ValueError) as e:
        log(f"error: {e}")
        return 1
    log(f"main: chat template: {fmt.name}")
    markers = [tok.encode(m, add_special=False, parse_special=True) for m in fmt.end_of_turn]
    marker_ids = [i[0] for i in markers if len(i) == 1]
    interrupt = Interrupt(True)
    system = cli.unescape(args.system_prompt) if args.escape and args.system_prompt else (args.system_prompt or "")
    chat = ChatTurns(fmt, tok, system)
    log("== Running in conversation mode. ==\n - Press Ctrl+C to interject at any time; at the prompt, to quit.\n"
        " - End of input (Ctrl+D) quits. End a line with '\\' to continue it on the next.\n")
    turns = 0
    try:
        while not (args.single_turn and turns):
            if first_message is not None and not turns:
                user = first_message
                out.write(f"> {user}\n", GREEN)
            else:
                user = out.read(interrupt, "> ").rstrip("\n")
                if not user.strip():
                    continue            # an empty line is no message (llama.cpp asks again)
            turns += 1
            first = not chat.rendered
            images = args.encoded if turns == 1 else []
            try:
                ids = chat.user(with_markers(user, len(images)))
                if images:   # the first rendering again, with the images' rows where their markers are
                    from powerinfer.multimodal import build_prompt
                    bos = not (fmt.bos_token and chat.rendered.startswith(fmt.bos_token))
                    ids, gen.images = build_prompt(tok, args.projector, chat.rendered, encoded=images, add_bos=bos)
            except ChatTemplateError as e:
                log(f"error: {e}")
                if args.single_turn:      # the one turn asked for cannot be answered
                    return 1
                continue
            gen.feed(ids)
            if first:     # --keep counts the tokens of the first rendering (system + first message)
                gen.keep_prompt(ids, args.keep)
            interrupt.requested = False
            answer = reply(gen, tok, n_predict, fmt.end_of_turn, interrupt, out, stop_token_ids=marker_ids,
                           show_tail=False, grammar=args.grammar_obj, preserved=preserved_ids(fmt, tok))
            out.write("\n")
            if gen.context_full:
                log("main: context is full, stopping (--context-shift goes on instead)")
                break
            # the cache holds the rendering + the reply: feed the rest of the finished turn (its end-of-turn
            # marker), or start over when the template rewrites earlier turns
            tail = chat.assistant(answer)
            if tail is None:
                gen.restart()
            elif tail:
                gen.feed(tail)
    except EOFError:
        pass
    return 0


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
