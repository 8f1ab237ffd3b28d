"""Command-line conventions shared by examples/main.py, the server, batched.py and perplexity.py.

llama.cpp users bring llama.cpp's flags. Two things keep those from giving misleading errors:

* `ArgumentParser` matches option names exactly. Python's argparse would otherwise read
  `-ngl 99` as `-n gl` ("invalid int value 'gl'"), `-fa` as `-f a`, and `--temp` as any
  unambiguous `--temp...` option; here an unknown flag is reported by its own name.
* `add_llama_compat_args` accepts llama.cpp's common flags that this CPU build has no use
  for (`-fa`, `--jinja`; `--mlock`, `--no-mmap`, `-tb` and `-ub`, which the loaders apply) and the KV cache type flags
  `-ctk/-ctv`; `apply_llama_compat` then says once, on stderr, which of them change nothing,
  and folds `-ctk/-ctv` into `--kv-type` (a (K, V) pair where they differ; a name that is not a
  cache type is an error).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

# the KV cache's types (Context's kv_type): llama.cpp's cache types, with their ggml type ids (llama-cpp-python's
# type_k / type_v; bench.py and tools/kld_vs_reference.py pass them to the peer)
KV_GGML_IDS = {"f16": 1, "f32": 0, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
KV_TYPES = tuple(KV_GGML_IDS)


class ArgumentParser(argparse.ArgumentParser):
    """argparse without prefix matching: no abbreviated long options and no `-xVALUE` splitting of
    single-dash options, so that every option is recognised by its full name or reported by it."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string):
        return []          # exact names only (argparse's '--opt=value' form still works)


# dest -> (flag as shown, why it changes nothing)
_NO_EFFECT = {
    "flash_attn": ("-fa/--flash-attn", "attention is computed by the one CPU kernel this build has"),
    "jinja": ("--jinja", "chat templates are always rendered with Jinja"),
}


def add_llama_compat_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's common flags: accepted; see apply_llama_compat."""
    g = p.add_argument_group("llama.cpp compatibility (accepted; the ones that change nothing say so)")
    g.add_argument("-fa", "--flash-attn", nargs="?", const="on", default=None, choices=["on", "off", "auto"],
                   help="no effect: one attention kernel")
    g.add_argument("--mlock", action="store_true", default=None,
                   help="keep the weights in RAM (locked: never swapped out or dropped from the page cache)")
    g.add_argument("--no-mmap", action="store_true", default=None,
                   help="read the model file into memory instead of mapping it")
    g.add_argument("--jinja", action="store_true", default=None, help="no effect: templates are always Jinja")
    g.add_argument("-tb", "--threads-batch", type=int, default=None,
                   help="threads for prompts (decode calls of more than one token) (default: -t)")
    g.add_argument("-ub", "--ubatch-size", type=int, default=None,
                   help="the most tokens one decode call computes (llama.cpp's physical batch): -b is lowered to it")
    g.add_argument("-ctk", "--cache-type-k", default=None, metavar="TYPE",
                   help=f"the K cache's type ({', '.join(KV_TYPES)}; default: --kv-type's)")
    g.add_argument("-ctv", "--cache-type-v", default=None, metavar="TYPE",
                   help="the V cache's type (as -ctk)")


def apply_llama_compat(p: argparse.ArgumentParser, args: argparse.Namespace, *, prog: str,
                       log: Callable[[str], None] | None = None) -> None:
    """After parse_args: one stderr line per given flag that changes nothing, -ctk/-ctv folded
    into args.kv_type (the type of both, or a (K, V) pair where they differ; the one not given keeps
    --kv-type's), -ub lowering args.batch_size to it. p.error, exit status 2, for a name that is not a cache type
    or an -ub below 1."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    for dest, (flag, why) in _NO_EFFECT.items():
        if getattr(args, dest, None) is not None:
            log(f"{prog}: note: {flag} is accepted for llama.cpp compatibility and changes nothing: {why}")
    ub = getattr(args, "ubatch_size", None)
    if ub is not None:
        if ub < 1:
            p.error(f"-ub/--ubatch-size must be >= 1, got {ub}")
        if getattr(args, "batch_size", None) is not None:
            args.batch_size = min(args.batch_size, ub)
    types = {flag: getattr(args, dest, None) for flag, dest in (("-ctk", "cache_type_k"), ("-ctv", "cache_type_v"))}
    given = {flag: t.lower() for flag, t in types.items() if t is not None}
    for flag, t in given.items():
        if t not in KV_TYPES:
            p.error(f"{flag} {t}: not a KV cache type (the types: {', '.join(KV_TYPES)})")
    if given:
        both = getattr(args, "kv_type", None) or "f16"
        k, v = given.get("-ctk", both), given.get("-ctv", both)
        args.kv_type = k if k == v else (k, v)


# llama.cpp's environment variables (common/arg.cpp's set_env) -> the flag each sets: a flag given on the command line
# wins; the ones this build has no flag for are not read (LLAMA_API_KEY: the server reads it itself)
LLAMA_ENV = {
    "LLAMA_ARG_MODEL": "--model", "LLAMA_ARG_HF_REPO": "--hf-repo", "LLAMA_ARG_HF_FILE": "--hf-file",
    "LLAMA_ARG_ALIAS": "--alias", "LLAMA_ARG_HOST": "--host", "LLAMA_ARG_PORT": "--port",
    "LLAMA_ARG_THREADS": "--threads", "LLAMA_ARG_CTX_SIZE": "--ctx-size", "LLAMA_ARG_N_PREDICT": "--n-predict",
    "LLAMA_ARG_BATCH": "--batch-size", "LLAMA_ARG_UBATCH": "--ubatch-size", "LLAMA_ARG_N_PARALLEL": "--parallel",
    "LLAMA_ARG_CACHE_RAM": "--cache-ram", "LLAMA_ARG_CACHE_TYPE_K": "--cache-type-k",
    "LLAMA_ARG_CACHE_TYPE_V": "--cache-type-v", "LLAMA_ARG_FLASH_ATTN": "--flash-attn",
    "LLAMA_ARG_N_GPU_LAYERS": "--gpu-layers", "LLAMA_ARG_TEMPERATURE": "--temp", "LLAMA_ARG_TOP_K": "--top-k",
    "LLAMA_ARG_TOP_P": "--top-p", "LLAMA_ARG_MIN_P": "--min-p", "LLAMA_ARG_REPEAT_PENALTY": "--repeat-penalty",
    "LLAMA_ARG_PRESENCE_PENALTY": "--presence-penalty", "LLAMA_ARG_FREQUENCY_PENALTY": "--frequency-penalty",
    "LLAMA_ARG_POOLING": "--pooling", "LLAMA_ARG_ROPE_SCALING_TYPE": "--rope-scaling",
    "LLAMA_ARG_ROPE_SCALE": "--rope-scale", "LLAMA_ARG_ROPE_FREQ_BASE": "--rope-freq-base",
    "LLAMA_ARG_ROPE_FREQ_SCALE": "--rope-freq-scale", "LLAMA_ARG_YARN_ORIG_CTX": "--yarn-orig-ctx",
    "LLAMA_ARG_YARN_EXT_FACTOR": "--yarn-ext-factor", "LLAMA_ARG_YARN_ATTN_FACTOR": "--yarn-attn-factor",
    "LLAMA_ARG_YARN_BETA_SLOW": "--yarn-beta-slow", "LLAMA_ARG_YARN_BETA_FAST": "--yarn-beta-fast",
    "LLAMA_ARG_EMBEDDINGS": "--embedding", "LLAMA_ARG_RERANKING": "--rerank",
    "LLAMA_ARG_API_KEY_FILE": "--api-key-file", "LLAMA_ARG_CHAT_TEMPLATE_KWARGS": "--chat-template-kwargs",
    "LLAMA_ARG_TIMEOUT": "--timeout", "LLAMA_ARG_LOG_FILE": "--log-file", "LLAMA_ARG_ENDPOINT_METRICS": "--metrics",
    "LLAMA_ARG_ENDPOINT_SLOTS": "--slots",
    "LLAMA_ARG_JINJA": "--jinja", "LLAMA_ARG_THINK": "--reasoning-format",
    "LLAMA_ARG_THINK_BUDGET": "--reasoning-budget",
    "LLAMA_ARG_CHAT_TEMPLATE": "--chat-template", "LLAMA_ARG_CHAT_TEMPLATE_FILE": "--chat-template-file",
    "LLAMA_ARG_SPEC_DRAFT_MODEL": "--model-draft", "LLAMA_ARG_SPEC_DRAFT_P_MIN": "--draft-p-min",
    "LLAMA_ARG_SPEC_TYPE": "--spec-type", "LLAMA_ARG_DRAFT_MAX": "--draft", "LLAMA_ARG_DRAFT_MIN": "--draft-min",
}
_TRUE, _FALSE = ("1", "true", "on", "enabled", "yes"), ("0", "false", "off", "disabled", "no")


def apply_env_defaults(p: argparse.ArgumentParser, environ=None) -> None:
    """llama.cpp's LLAMA_ARG_* variables as the defaults of the flags they name (LLAMA_ENV; the command line wins):
    what its Docker images and compose files set. p.error (exit status 2) for a value the flag would refuse."""
    import os
    environ = os.environ if environ is None else environ
    for env, flag in LLAMA_ENV.items():
        value = environ.get(env)
        action = p._option_string_actions.get(flag)
        if value is None or action is None:
            continue
        if action.nargs == 0:                          # store_true / store_false
            v = value.strip().lower()
            if v not in _TRUE + _FALSE:
                p.error(f"{env}={value!r}: expected one of {', '.join(_TRUE + _FALSE)}")
            on = v in _TRUE
            default = on if action.const is True else (not on if action.const is False else action.const if on
                                                           else action.default)
        elif action.nargs not in (None, "?"):
            continue                                   # several values: not from one variable
        else:
            try:
                default = action.type(value) if action.type else value
            except (TypeError, ValueError):
                p.error(f"{env}={value!r}: not a valid value for {flag}")
            if action.choices is not None and default not in action.choices:
                p.error(f"{env}={value!r}: {flag} takes one of {', '.join(map(str, action.choices))}")
        if isinstance(action, argparse._AppendAction):
            default = [default]
        p.set_defaults(**{action.dest: default})


def threads_in_use(n_threads: int | None) -> int:
    """The thread count a context made with n_threads runs (<= 0 or None: the physical cores)."""
    if n_threads and n_threads > 0:
        return int(n_threads)
    from ._ffi import ffi, lib
    out = ffi.new("pi_threadpool **")
    if lib.pi_threadpool_create(0, out) != lib.PI_OK:
        return 0
    try:
        return int(lib.pi_threadpool_size(out[0]))
    finally:
        lib.pi_threadpool_free(out[0])


class LoadProgress:
    """`with LoadProgress(): model = Model(...)`: if loading takes more than `after` seconds, dots
    on stderr as llama.cpp prints them (one per `every` seconds), then the time it took."""

    def __init__(self, label: str = "load", *, after: float = 1.0, every: float = 0.25, out=None):
        import threading
        self.label, self.after, self.every = label, after, every
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="powerinfer-load-progress", daemon=True)
        self.shown = False

    def _run(self) -> None:
        import time
        self.t0 = time.perf_counter()
        if self._stop.wait(self.after):
            return
        self.shown = True
        self.out.write(f"{self.label}: loading ")
        self.out.flush()
        while not self._stop.wait(self.every):
            self.out.write(".")
            self.out.flush()

    def __enter__(self):
        import time
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        import time
        self._stop.set()
        self._thread.join()
        if self.shown:
            self.out.write(f" {'done' if exc[0] is None else 'failed'} ({time.perf_counter() - self.t0:.2f} s)\n")
            self.out.flush()
        return False
