"""The examples' shared command line, as llama.cpp keeps it in common/arg.cpp: the model, context,
sampling, sparse and GPU flags are defined here once, with the steps every program takes with them
(load the model, make the context, log what was made), so that each example is the program it is about.

Built on cli_args (exact flag matching, llama.cpp's compatibility flags), hub (-m / -hf) and offload
(the GPU flags). Messages go to stderr; a step that fails raises CLIError, which the program prints
as `error: ...` with exit status 1.
"""
from __future__ import annotations

import argparse
import codecs
import signal
import sys
from pathlib import Path

from . import act_sparsity
from ._ffi import PowerInferError
from .cli_args import (
    KV_TYPES,
    ArgumentParser,
    LoadProgress,
    add_llama_compat_args,
    apply_env_defaults,
    apply_llama_compat,
)
from .context import Context
from .gguf_file import ModelLoadError
from .control_vector import load_control_vectors
from .lora import load_adapters
from .hub import HubError, add_model_args, bundled_model, resolve_model
from .model import Model, parse_kv_override
from .offload import add_gpu_args, gpu_kwargs
from .sampling import SamplingParams, parse_samplers
from .speculative import FirstOf, PromptLookup, SpecParams, make_drafter

__all__ = ["CLIError", "Console", "Interrupt", "add_context_args", "add_grammar_args", "add_interactive_args",
           "add_prompt_args", "add_sampling_args", "add_sparse_args", "add_speculative_args", "grammar_of",
           "load_model", "log", "log_prompt_tokens", "make_context", "make_speculative", "parse", "parser",
           "prompt_text", "read_input", "sampling_params", "sparse_report", "unescape"]

YELLOW, GREEN, RESET = "\033[33m", "\033[1;32m", "\033[0m"
_SP = SamplingParams()        # the one set of sampling defaults (the API's and the server's too)


class CLIError(Exception):
    """A failed step: the program prints `error: <message>` and exits with status 1."""


def log(msg: str = "", end: str = "\n") -> None:
    print(msg, file=sys.stderr, end=end, flush=True)


def parser(doc: str, **kwargs) -> ArgumentParser:
    """The program's parser (exact flag names), described by the first paragraph of its docstring,
    with the model flags (-m, -hf, ...; default: the bundled model)."""
    p = ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                       **kwargs)
    add_model_args(p, default=bundled_model())
    return p


def add_context_args(p: argparse.ArgumentParser, *, ctx_size: str | None = None, batch_size: bool = True,
                     sparse_gather_max: int = 1) -> None:
    """-c (when ctx_size, its help), -b, -t, --kv-type, and the sparse model's flags (add_sparse_args)."""
    if ctx_size is not None:
        p.add_argument("-c", "--ctx-size", type=int, default=None, help=ctx_size)
    if batch_size:
        p.add_argument("-b", "--batch-size", type=int, default=512,
                       help="tokens per decode call for prompts (default: %(default)s)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--kv-type", choices=KV_TYPES, default="f16",
                   help="the KV cache's type, K and V (-ctk / -ctv set one) (default: %(default)s)")
    add_sparse_args(p, sparse_gather_max=sparse_gather_max)
    add_rope_args(p)
    add_lora_args(p)


def add_lora_args(p: argparse.ArgumentParser, *, server: bool = False) -> None:
    """llama.cpp's --lora / --lora-scaled (and the server's --lora-init-without-apply)."""
    g = p.add_argument_group("LoRA adapters (llama.cpp's GGUF adapters; convert-lora.py makes one from PEFT)")
    g.add_argument("--lora", action="append", default=[], metavar="FNAME",
                   help="apply a LoRA adapter with scale 1 (repeatable)")
    g.add_argument("--lora-scaled", action="append", nargs=2, default=[], metavar=("FNAME", "SCALE"),
                   help="apply a LoRA adapter with the given scale (repeatable)")
    g.add_argument("--lora-base", default=None, metavar="FNAME",
                   help="accepted for the original's command lines; changes nothing: adapters apply to the loaded "
                        "weights at run time, quantized or not")
    if server:
        g.add_argument("--lora-init-without-apply", action="store_true",
                       help="load the adapters with scale 0 (POST /lora-adapters or a request's `lora` sets them)")
    g = p.add_argument_group("control vectors (llama.cpp's GGUF files of direction.N tensors)")
    g.add_argument("--control-vector", action="append", default=[], metavar="FNAME",
                   help="add a control vector to the residual stream (repeatable: they add up)")
    g.add_argument("--control-vector-scaled", action="append", nargs=2, default=[], metavar=("FNAME", "SCALE"),
                   help="add a control vector times SCALE (repeatable)")
    g.add_argument("--control-vector-layer-range", nargs=2, type=int, default=None, metavar=("START", "END"),
                   help="the layers the control vectors are added after (default: 1 .. n_layer)")


def scaled_files(files: list[str], scaled: list[list[str]], flag: str) -> list[tuple[str, float]]:
    """(path, 1.0) for each of files, then (path, scale) for each [path, scale] of `flag`; CLIError for a scale that
    is not a number."""
    out = [(path, 1.0) for path in files]
    for path, scale in scaled:
        try:
            out.append((path, float(scale)))
        except ValueError:
            raise CLIError(f"{flag} {path} {scale}: the scale must be a number") from None
    return out


def control_vector_specs(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(path, strength) of --control-vector and --control-vector-scaled."""
    return scaled_files(args.control_vector, args.control_vector_scaled, "--control-vector-scaled")


def lora_specs(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(path, scale) of --lora and then --lora-scaled (llama.cpp's order: the adapter ids of /lora-adapters);
    scale 0 for all with --lora-init-without-apply."""
    out = scaled_files(args.lora, args.lora_scaled, "--lora-scaled")
    if getattr(args, "lora_init_without_apply", False):
        out = [(path, 0.0) for path, _ in out]
    if args.lora_base is not None:
        log(f"warning: --lora-base {args.lora_base} changes nothing: adapters apply to the loaded weights at run time")
    return out


def add_rope_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's rope overrides: --rope-scaling, --rope-scale, --rope-freq-base, --rope-freq-scale."""
    g = p.add_argument_group("rope (the file's unless given)")
    g.add_argument("--rope-scaling", choices=["none", "linear", "yarn"], default=None,
                   help="none: no scaling; linear: positions divided by --rope-scale; yarn: YaRN with that factor "
                        "(default: the file's rope.scaling.type)")
    g.add_argument("--rope-scale", type=float, default=0.0, metavar="N",
                   help="context scaling factor: positions are divided by N (linear)")
    g.add_argument("--rope-freq-base", type=float, default=0.0, metavar="N", help="rope base frequency")
    g.add_argument("--rope-freq-scale", type=float, default=0.0, metavar="N",
                   help="rope frequency scale, 1 / the context scaling factor")
    g.add_argument("--yarn-orig-ctx", type=int, default=0, metavar="N",
                   help="YaRN: the model's original context (default: the file's, else its training context)")
    g.add_argument("--yarn-ext-factor", type=float, default=-1.0, metavar="F",
                   help="YaRN: extrapolation mix factor (default: 1 with yarn, else 0; 0: interpolation only)")
    g.add_argument("--yarn-attn-factor", type=float, default=-1.0, metavar="F",
                   help="the cos/sin scale when the extrapolation factor is 0 (as llama.cpp's; default 1)")
    g.add_argument("--yarn-beta-slow", type=float, default=-1.0, metavar="N",
                   help="YaRN: high correction dim (default 1)")
    g.add_argument("--yarn-beta-fast", type=float, default=-1.0, metavar="N",
                   help="YaRN: low correction dim (default 32)")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="read this metadata value instead of the file's (TYPE: int, float, bool, str; repeatable), "
                        "e.g. tokenizer.ggml.add_bos_token=bool:false")


def rope_overrides(args: argparse.Namespace) -> dict:
    """Model's rope keywords (powerinfer.rope) from add_rope_args' flags (0 / negative: the file's)."""
    base, scale, factor = (getattr(args, n, 0.0) for n in ("rope_freq_base", "rope_freq_scale", "rope_scale"))
    for flag, v in (("--rope-freq-base", base), ("--rope-freq-scale", scale), ("--rope-scale", factor)):
        if v < 0:
            raise CLIError(f"{flag} must be > 0 (0: the file's), got {v}")
    if not scale and factor:
        scale = 1.0 / factor
    out = {"rope_freq_base": base, "rope_freq_scale": scale, "rope_scaling": getattr(args, "rope_scaling", None)}
    for name in ("yarn_orig_ctx", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow", "yarn_beta_fast"):
        if hasattr(args, name):
            out[name] = getattr(args, name)
    return out


def add_sparse_args(p: argparse.ArgumentParser, *, sparse_gather_max: int = 1) -> None:
    """--sparse-threshold, --sparsity, --sparse-batch-max, --sparse-gather-max (its default as given), --dense and -nr
    (the programs' and the server's)."""
    p.add_argument("--sparse-threshold", type=float, default=None,
                   help="predictor threshold for PowerInfer models (default: $LLAMA_SPARSE_PRED_THRESHOLD, "
                        "else the file's powerinfer.sparse_threshold, else 0.0)")
    p.add_argument("--sparsity", type=float, default=None,
                   help="gate-sparse files (tools/sparsify.py): run this stored sparsity level (default: the "
                        "file's default level; --sparse-threshold T instead: every layer at |act(gate)| >= T)")
    p.add_argument("--sparse-batch-max", type=int, default=0, metavar="N",
                   help="gate-sparse files: decode calls of more than N tokens (prompts) run the dense model "
                        "exactly; generation stays sparse (default 0: every call runs the level)")
    p.add_argument("--sparse-gather-max", type=int, default=sparse_gather_max, metavar="N",
                   help="gate-sparse files: decode calls of at most N tokens run a level through the sparse kernels "
                        "(only the kept rows read); larger ones (prompts) zero what the level leaves out and run the "
                        f"dense kernels, several times faster (default {sparse_gather_max}; 0: every call through the "
                        "sparse kernels, a prompt's logits then those of its tokens one at a time)")
    p.add_argument("--dense", action="store_true",
                   help="compute every FFN neuron of a PowerInfer model (no predictor), for comparison")
    p.add_argument("-nr", "--no-repack", action="store_true",
                   help="keep the file's weight layout: no interleaved copy, slower matmuls (a gate-sparse "
                        "file's down step is still laid out by channel where the file has no ffn_down_t)")


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    """Speculative decoding's flags, llama.cpp's names: a draft model (-md) and/or draftless n-gram lookup."""
    g = p.add_argument_group("speculative decoding (the same output, faster where drafts hold)")
    g.add_argument("-md", "--model-draft", metavar="FILE", default=None,
                   help="draft model: a smaller model with the same vocabulary, run greedily to propose tokens")
    g.add_argument("--draft-max", "--draft", "--draft-n", dest="draft_max", type=int, default=16, metavar="N",
                   help="tokens drafted per step at most (default: %(default)s)")
    g.add_argument("--draft-min", type=int, default=0, metavar="N",
                   help="drafts shorter than this are not evaluated (default: %(default)s)")
    g.add_argument("--draft-p-min", type=float, default=0.75, metavar="P",
                   help="the draft model stops at a token it gives less than this probability (default: %(default)s)")
    g.add_argument("-cd", "--ctx-size-draft", type=int, default=0, metavar="N",
                   help="the draft model's context (default 0: the same as -c)")
    g.add_argument("-td", "--threads-draft", type=int, default=None, metavar="N",
                   help="the draft model's threads (default: -t)")
    g.add_argument("--spec-type", choices=["none", "ngram-simple"], default="none",
                   help="draftless speculation: ngram-simple drafts the tokens that followed the last earlier "
                        "occurrence of the sequence's last --spec-ngram-size-n tokens; tried before -md "
                        "(default: none)")
    g.add_argument("--spec-ngram-size-n", type=int, default=12, metavar="N",
                   help="ngram-simple: the n-gram looked up (default: %(default)s)")
    g.add_argument("--spec-ngram-size-m", type=int, default=48, metavar="M",
                   help="ngram-simple: tokens drafted after a match at most (default: %(default)s; --draft-max "
                        "caps it too)")


def make_speculative(args: argparse.Namespace, model: Model, prog: str, *, n_ctx: int, n_seq_max: int = 1):
    """(drafter or None, SpecParams) from add_speculative_args' flags: the draft model loaded (its vocabulary
    checked against the target's) into a context of -cd cells (0: n_ctx) and n_seq_max sequences. CLIError on
    failure."""
    spec = SpecParams(args.draft_max, args.draft_min, args.draft_p_min)
    try:
        spec.validate()
        drafters = []
        if args.spec_type == "ngram-simple":
            drafters.append(PromptLookup(args.spec_ngram_size_n, args.spec_ngram_size_n, args.spec_ngram_size_m))
        if args.model_draft:
            try:
                with LoadProgress(prog):
                    draft_model = Model(args.model_draft)
            except (ModelLoadError, OSError) as e:
                raise CLIError(f"failed to load the draft model: {e}") from None
            log(f"{prog}: draft model {draft_model.describe()}")
            drafters.append(make_drafter(
                Context(draft_model, n_ctx=args.ctx_size_draft or n_ctx, n_seq_max=n_seq_max,
                        n_threads=args.threads_draft or args.threads or None),
                target_tokenizer=model.tokenizer, n_ctx=0, p_min=args.draft_p_min))
    except (ValueError, PowerInferError) as e:
        raise CLIError(str(e)) from None
    if not drafters:
        return None, spec
    log(f"{prog}: speculative decoding: " + ", ".join(
        ["ngram-simple n = %d, m = %d" % (args.spec_ngram_size_n, args.spec_ngram_size_m)] * (args.spec_type != "none")
        + [f"draft model, p_min = {args.draft_p_min}"] * bool(args.model_draft))
        + f"; draft-max {spec.n_max}, draft-min {spec.n_min}")
    return (drafters[0] if len(drafters) == 1 else FirstOf(drafters)), spec


def add_sampling_args(p: argparse.ArgumentParser, defaults: SamplingParams = _SP, *, seed: int | None = -1,
                      seed_help: str = "RNG seed (-1 = random)", penalties: bool = True) -> None:
    """-s (unless seed is None: the program has its own), --temp, --top-k, --top-p, --min-p, (penalties)
    --repeat-penalty, --repeat-last-n, --presence-penalty, --frequency-penalty, --ignore-eos, and llama.cpp's other
    samplers' flags; defaults from `defaults`."""
    if seed is not None:
        p.add_argument("-s", "--seed", type=int, default=seed, help=seed_help + " (default: %(default)s)")
    p.add_argument("--temp", type=float, default=defaults.temperature,
                   help="temperature, <= 0 for greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=defaults.top_k, help="top-k sampling, <= 0 off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=defaults.top_p, help="top-p sampling, 1.0 off (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=defaults.min_p, help="min-p sampling, 0 off (default: %(default)s)")
    if penalties:
        p.add_argument("--repeat-penalty", type=float, default=defaults.repeat_penalty,
                       help="repeat penalty, 1.0 off (default: %(default)s)")
        p.add_argument("--repeat-last-n", type=int, default=defaults.repeat_last_n,
                       help="tokens the penalties look back over, -1 = all (default: %(default)s)")
        p.add_argument("--presence-penalty", type=float, default=defaults.presence_penalty,
                       help="presence penalty (default: %(default)s)")
        p.add_argument("--frequency-penalty", type=float, default=defaults.frequency_penalty,
                       help="frequency penalty (default: %(default)s)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop at an end-of-generation token")
    p.add_argument("-l", "--logit-bias", action="append", default=[], metavar="TOKEN_ID(+/-)BIAS",
                   help="add BIAS to a token's logit, e.g. 15043+1 or 15043-inf (never that token); repeatable")
    g = p.add_argument_group("more samplers (llama.cpp's; each off by default)")
    g.add_argument("--samplers", default=None, metavar="LIST",
                   help="the chain's stages in order, ';'-separated (default: "
                        "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)")
    g.add_argument("--sampling-seq", "--sampler-seq", dest="sampling_seq", default=None, metavar="LETTERS",
                   help="the same as letters (default: edskypmxt)")
    g.add_argument("--typical", type=float, default=defaults.typical_p, metavar="P",
                   help="locally typical sampling, 1.0 off (default: %(default)s)")
    g.add_argument("--min-keep", type=int, default=defaults.min_keep, metavar="N",
                   help="tokens top-p, min-p, typical and XTC keep at least (default: %(default)s)")
    g.add_argument("--top-n-sigma", type=float, default=defaults.top_n_sigma, metavar="N",
                   help="keep logits within N standard deviations of the max, <= 0 off (default: %(default)s)")
    g.add_argument("--xtc-probability", type=float, default=defaults.xtc_probability, metavar="P",
                   help="XTC: how often the top choices are excluded, 0 off (default: %(default)s)")
    g.add_argument("--xtc-threshold", type=float, default=defaults.xtc_threshold, metavar="P",
                   help="XTC: tokens at least this likely are top choices, > 0.5 off (default: %(default)s)")
    g.add_argument("--dynatemp-range", type=float, default=defaults.dynatemp_range, metavar="R",
                   help="dynamic temperature in [temp - R, temp + R] by the entropy, 0 off (default: %(default)s)")
    g.add_argument("--dynatemp-exp", type=float, default=defaults.dynatemp_exponent, metavar="E",
                   help="dynamic temperature's exponent (default: %(default)s)")
    g.add_argument("--mirostat", type=int, default=defaults.mirostat, choices=[0, 1, 2],
                   help="mirostat sampling (1, or 2 for 2.0; replaces the other stages, penalties included, as "
                        "llama.cpp) (default: %(default)s)")
    g.add_argument("--mirostat-lr", type=float, default=defaults.mirostat_eta, metavar="ETA",
                   help="mirostat's learning rate eta (default: %(default)s)")
    g.add_argument("--mirostat-ent", type=float, default=defaults.mirostat_tau, metavar="TAU",
                   help="mirostat's target entropy tau (default: %(default)s)")
    g.add_argument("--dry-multiplier", type=float, default=defaults.dry_multiplier, metavar="M",
                   help="DRY repetition penalty multiplier, 0 off (default: %(default)s)")
    g.add_argument("--dry-base", type=float, default=defaults.dry_base, metavar="B",
                   help="DRY's base (default: %(default)s)")
    g.add_argument("--dry-allowed-length", type=int, default=defaults.dry_allowed_length, metavar="N",
                   help="DRY: repeats longer than this are penalised (default: %(default)s)")
    g.add_argument("--dry-penalty-last-n", type=int, default=defaults.dry_penalty_last_n, metavar="N",
                   help="DRY: tokens scanned for repeats, -1 all, 0 off (default: %(default)s)")
    g.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="STR",
                   help="DRY: a string that ends a repeat (repeatable; replaces the defaults \\n : \" *; 'none': "
                        "no breakers)")


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's constrained-output flags: --grammar, --grammar-file, -j/--json-schema, -jf."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--grammar", default=None, help="GBNF grammar the output must match (llama.cpp's syntax)")
    g.add_argument("--grammar-file", default=None, help="file holding a GBNF grammar")
    g.add_argument("-j", "--json-schema", default=None,
                   help="JSON schema the output must match, e.g. '{}' for any JSON value")
    g.add_argument("-jf", "--json-schema-file", default=None, help="file holding a JSON schema")


def grammar_of(args: argparse.Namespace):
    """The Grammar of add_grammar_args' flags, or None; CLIError for a bad grammar or file."""
    from .grammar import Grammar, GrammarError
    try:
        if args.grammar is not None:
            return Grammar.from_gbnf(args.grammar)
        if args.grammar_file is not None:
            return Grammar.from_file(args.grammar_file)
        if args.json_schema is not None:
            return Grammar.from_json_schema(args.json_schema)
        if args.json_schema_file is not None:
            try:
                text = open(args.json_schema_file, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError) as e:
                raise GrammarError(f"cannot read JSON schema file {args.json_schema_file}: {e}") from None
            return Grammar.from_json_schema(text)
    except GrammarError as e:
        raise CLIError(str(e)) from None
    return None


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    """-p, -f, -e (read by prompt_text)."""
    p.add_argument("-p", "--prompt", default=None, help="prompt to start generation with")
    p.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    p.add_argument("-e", "--escape", action="store_true", help="process escapes (\\n, \\t, ...) in the prompt")


def unescape(text: str) -> str:
    """-e: the escapes (\\n, \\t, \\xNN, ...) of text processed."""
    return codecs.decode(text.encode("utf-8"), "unicode_escape").encode("latin-1").decode("utf-8")


def prompt_text(args: argparse.Namespace, default: str) -> str:
    """The prompt of -f or -p (else default), unescaped with -e; CLIError if the file cannot be read."""
    if args.file:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"cannot read prompt file {args.file}: {e}") from None
    else:
        text = args.prompt if args.prompt is not None else default
    return unescape(text) if args.escape else text


def add_interactive_args(p: argparse.ArgumentParser) -> None:
    """Interactive and conversation mode (-i, -r, -cnv, -sys, ...), context shift, prompt display."""
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
    p.add_argument("-sysf", "--system-prompt-file", default=None, metavar="FNAME",
                   help="with -cnv: the system message from a file")
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
    p.add_argument("--chat-template-file", default=None, metavar="FNAME",
                   help="with -cnv: a Jinja chat template from a file")
    p.add_argument("--in-prefix", default="", help="text added before each user input")
    p.add_argument("--in-suffix", default="", help="text added after each user input")
    p.add_argument("--color", action="store_true", help="colour the prompt and the user input")
    p.add_argument("--verbose-prompt", action="store_true", help="print the prompt's tokens before generating")
    p.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")


def parse(p: argparse.ArgumentParser, argv, *, prog: str, intermixed: bool = False) -> argparse.Namespace:
    """Add llama.cpp's compatibility flags and the GPU flags, parse, and apply the compatibility flags
    (and, with add_interactive_args, --interactive-first's -i and the note on a --keep without effect)."""
    add_llama_compat_args(p)
    add_gpu_args(p)
    apply_env_defaults(p)
    args = p.parse_intermixed_args(argv) if intermixed else p.parse_args(argv)
    apply_llama_compat(p, args, prog=prog)
    if hasattr(args, "interactive_first"):
        args.interactive = args.interactive or args.interactive_first
        if args.keep and not args.context_shift:
            log(f"{prog}: note: --keep changes nothing without --context-shift (nothing is dropped when the "
                "context is full: generation stops)")
    return args


def read_file_flags(args: argparse.Namespace) -> None:
    """-sysf / --chat-template-file: their files' text into args.system_prompt / args.chat_template (a flag and its
    file form together are an error); CLIError for a file that cannot be read."""
    for flag, path_attr, attr in (("-sysf", "system_prompt_file", "system_prompt"),
                                  ("--chat-template-file", "chat_template_file", "chat_template")):
        path = getattr(args, path_attr, None)
        if path is None:
            continue
        if getattr(args, attr, None) is not None:
            raise CLIError(f"give {flag} or its text flag, not both")
        try:
            setattr(args, attr, Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise CLIError(f"{flag} {path}: {getattr(e, 'strerror', None) or e}") from None


def log_prompt_tokens(prompt: str, ids: list[int], tokenizer) -> None:
    """--verbose-prompt: the prompt, its length in tokens and each token."""
    log(f"\nmain: prompt: '{prompt}'\nmain: number of tokens in prompt = {len(ids)}")
    for t in ids:
        log(f"{t:6d} -> '{tokenizer.id_to_text(t)}'")
    log("")


def parse_logit_bias(text: str) -> tuple[int, float]:
    """llama.cpp's -l TOKEN_ID(+/-)BIAS -> (token, bias); ValueError."""
    for i, ch in enumerate(text):
        if i and ch in "+-":
            try:
                return int(text[:i]), float(text[i:])
            except ValueError:
                break
    raise ValueError(f"--logit-bias {text!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf")


def sampling_params(args: argparse.Namespace, **overrides) -> SamplingParams:
    """SamplingParams from the flags of add_sampling_args (validated; ValueError if out of range)."""
    kw = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
              ignore_eos=args.ignore_eos)
    for name in ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "min_keep",
                 "top_n_sigma", "xtc_probability", "xtc_threshold", "dynatemp_range", "mirostat", "dry_multiplier",
                 "dry_base", "dry_allowed_length", "dry_penalty_last_n"):
        if hasattr(args, name):
            kw[name] = getattr(args, name)
    for name, flag in (("typical_p", "typical"), ("dynatemp_exponent", "dynatemp_exp"), ("mirostat_eta", "mirostat_lr"),
                       ("mirostat_tau", "mirostat_ent")):
        if hasattr(args, flag):
            kw[name] = getattr(args, flag)
    if getattr(args, "logit_bias", None):
        kw["logit_bias"] = dict(parse_logit_bias(b) for b in args.logit_bias)
    breakers = getattr(args, "dry_sequence_breaker", None)
    if breakers is not None:
        kw["dry_sequence_breakers"] = () if breakers == ["none"] else tuple(unescape(b) for b in breakers)
    if getattr(args, "samplers", None) is not None or getattr(args, "sampling_seq", None) is not None:
        if args.samplers is not None and args.sampling_seq is not None:
            raise ValueError("give --samplers or --sampling-seq, not both")
        kw["samplers"] = parse_samplers(args.samplers.split(";") if args.samplers is not None
                                        else list(args.sampling_seq))
    params = SamplingParams(**{**kw, **overrides})
    params.validate()
    return params


def load_model(args: argparse.Namespace, prog: str) -> Model:
    """The model of -m / -hf (dots on stderr while a slow load runs); CLIError if it cannot load."""
    try:
        path = resolve_model(args)
    except HubError as e:
        raise CLIError(str(e)) from None
    rope = rope_overrides(args)
    try:
        overrides = dict(parse_kv_override(o) for o in getattr(args, "override_kv", []))
    except ValueError as e:
        raise CLIError(str(e)) from None
    try:
        with LoadProgress(prog):
            model = Model(path, repack=False if args.no_repack else None, kv_overrides=overrides,
                          use_mmap=not getattr(args, "no_mmap", None), **rope)
    except (ModelLoadError, OSError, ValueError) as e:
        raise CLIError(f"failed to load model: {e}") from None
    log(f"{prog}: loaded {model.describe()}")
    if getattr(args, "mlock", None):
        warning = model.mlock()
        log(f"{prog}: warning: {warning}" if warning else f"{prog}: weights locked in RAM (--mlock)")
    return model


def make_context(args: argparse.Namespace, model: Model, prog: str, **kwargs) -> Context:
    """A Context with the flags of add_context_args and the GPU flags (kwargs: n_ctx, n_batch,
    n_seq_max... override them); logs the GPU placement and the sparse mode. CLIError on failure."""
    kw = dict(n_ctx=getattr(args, "ctx_size", None), n_batch=getattr(args, "batch_size", 512),
              n_threads=args.threads or None, n_threads_batch=getattr(args, "threads_batch", None),
              kv_type=args.kv_type, sparse_threshold=args.sparse_threshold,
              dense=args.dense, sparsity=getattr(args, "sparsity", None),
              sparse_batch_max=getattr(args, "sparse_batch_max", 0),
              sparse_gather_max=getattr(args, "sparse_gather_max", 1), **gpu_kwargs(args))
    try:
        ctx = Context(model, **{**kw, **kwargs})
        adapters = load_adapters(model, lora_specs(args)) if getattr(args, "lora", None) is not None else []
        ctx.set_lora(adapters)
        cvecs = control_vector_specs(args) if getattr(args, "control_vector", None) is not None else []
        if cvecs:
            ctx.set_control_vector(load_control_vectors(model, cvecs), *(args.control_vector_layer_range or (1, None)))
    except (ValueError, PowerInferError) as e:
        raise CLIError(str(e)) from None
    for line in ctx.gpu_log:
        log(line)
    for ad, scale in adapters:
        log(f"{prog}: LoRA adapter {ad.path} (alpha {ad.alpha:g}, {ad.n_weights} weights), scale {scale:g}")
    for path, strength in cvecs:
        log(f"{prog}: control vector {path}, strength {strength:g}")
    if model.sparse:
        log(f"{prog}: PowerInfer model, " + ("every neuron is computed (--dense)" if args.dense else
            f"sparse inference, sparse_pred_threshold = {ctx.sparse_threshold:.2f}"))
    elif model.gate_sparse:
        log(f"{prog}: {act_sparsity.describe(ctx)}")
    return ctx


def sparse_report(ctx: Context) -> None:
    """The share of FFN neurons each layer computed (sparse models; gate-sparse: and the gate's and the attention's
    inputs), on stderr."""
    if ctx.sparse:
        active, total = ctx.sparse_stats()
        if total:
            log("sparse: neurons computed per layer: " + " ".join(f"{a / total:.1%}" for a in active))
        if ctx.input_thresholds is not None:
            active, total = ctx.gate_input_stats()
            if total:
                log("sparse: gate inputs read per layer: " + " ".join(f"{a / total:.1%}" for a in active))
        if ctx.attn_thresholds is not None:
            active, total = ctx.attn_input_stats()
            if total:
                log("sparse: attention inputs read per layer: " + " ".join(f"{a / total:.1%}" for a in active))


def read_input(readline) -> str | None:
    """One user input from readline(): a line ending in a backslash continues on the next (the
    backslash becomes a newline). None at end of input."""
    lines = []
    while True:
        line = readline()
        if not line:
            return None
        if line.endswith("\\\n"):
            lines.append(line[:-2] + "\n")
            continue
        lines.append(line)
        return "".join(lines)


# ------------------------------------------------------------------ the terminal (llama.cpp's common/console)
class Interrupt:
    """Ctrl-C: in interactive mode the first press during generation hands control to the user;
    otherwise (a second press, or at the input prompt) it ends the run."""

    def __init__(self, interactive: bool):
        self.interactive, self.requested, self.reading = interactive, False, False
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame):
        if self.interactive and not self.requested and not self.reading:
            self.requested = True
            return
        raise KeyboardInterrupt

    def begin_input(self) -> None:
        """From here until readline() returns, Ctrl-C exits: call it before showing the input prompt."""
        self.requested, self.reading = False, True

    def readline(self) -> str:
        """A line of user input; Ctrl-C here exits (a plain handler return would resume the read)."""
        self.reading = True
        try:
            return sys.stdin.readline()
        finally:
            self.reading = False


class Console:
    """stdout, coloured with --color; remembers whether the last text written ended its line."""

    def __init__(self, color: bool):
        self.color, self.line_open = color, False

    def write(self, text: str, colour: str | None = None) -> None:
        sys.stdout.write(f"{colour}{text}{RESET}" if colour and self.color and text else text)
        sys.stdout.flush()
        self.line_open = (not text.endswith("\n")) if text else self.line_open

    def read(self, interrupt: Interrupt, prompt: str) -> str:
        """The user's next input, after `prompt`; EOFError at the end of input."""
        interrupt.begin_input()
        self.write(prompt + (GREEN if self.color else ""))
        text = read_input(interrupt.readline)
        self.write(RESET if self.color else "")
        if text is None:
            raise EOFError
        self.line_open = False
        return text
