"""Command line of the HTTP server (examples/server.py), with llama.cpp server's flag names."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

from .. import act_sparsity
from ..reasoning import FORMATS as REASONING_FORMATS
from ..cli import (
    CLIError,
    add_lora_args,
    control_vector_specs,
    add_rope_args,
    add_sampling_args,
    add_sparse_args,
    add_speculative_args,
    lora_specs,
    make_speculative,
    rope_overrides,
    sampling_params,
)
from ..cli_args import KV_TYPES, ArgumentParser, add_llama_compat_args, apply_env_defaults, apply_llama_compat
from ..model import parse_kv_override
from ..hub import HubError, add_model_args, bundled_model, resolve_model

log = logging.getLogger("powerinfer.server")


from ..offload import add_gpu_args, gpu_kwargs


def make_parser(prog: str = "server.py") -> ArgumentParser:
    """The server's flags; powerinfer.serve adds its own to them."""
    p = ArgumentParser(
        prog=prog,
        description="PowerInfer HTTP server: llama.cpp native routes (/completion, /tokenize, ...) and "
                    "OpenAI-compatible routes (/v1/completions, /v1/chat/completions, /v1/models).")
    add_model_args(p, default=bundled_model())
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: %(default)s)")
    p.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="KV cache size in tokens, shared by the slots: each slot gets ctx-size / parallel "
                        "(0 = the model's training context) (default: 4096, or the training context if smaller)")
    p.add_argument("-np", "--parallel", type=int, default=1,
                   help="number of slots: requests decoded together by continuous batching (default: %(default)s)")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (default: physical cores)")
    p.add_argument("-cram", "--cache-ram", type=int, default=8192, metavar="MIB",
                   help="keep up to this many MiB of slots' prompts in RAM when a request takes their slot, so a "
                        "returning conversation is not evaluated again (-1: no limit, 0: off) (default: %(default)s)")
    p.add_argument("-b", "--batch-size", type=int, default=512,
                   help="most tokens per decode step (prompt chunks + one per generating slot) (default: %(default)s)")
    p.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="server-wide cap on generated tokens per request (-1 = none) (default: %(default)s)")
    p.add_argument("-s", "--seed", type=int, default=-1, help="default RNG seed of requests (-1 = random)")
    p.add_argument("--kv-type", choices=KV_TYPES, default="f16",
                   help="the KV cache's type, K and V (-ctk / -ctv set one) (default: %(default)s)")
    p.add_argument("--api-key", action="append", default=[],
                   help="require 'Authorization: Bearer KEY' (repeatable, or comma-separated; also $LLAMA_API_KEY). "
                        "/health and /v1/models stay public")
    p.add_argument("--api-key-file", default=None, help="file with one API key per line")
    p.add_argument("-a", "--alias", default=None, help="model name reported by the API (default: the file name)")
    p.add_argument("--chat-template", default=None,
                   help="built-in chat format (chatml, llama2, vicuna, gemma) or a Jinja template string; "
                        "default: the model's tokenizer.chat_template, else chatml")
    p.add_argument("--chat-template-file", default=None, help="read a Jinja chat template from this file")
    p.add_argument("-mm", "--mmproj", default=None, metavar="FILE",
                   help="multimodal projector file (llama.cpp's mmproj-*.gguf): image input in chat requests "
                        "(OpenAI image_url parts as data: URLs, Anthropic base64 image blocks); Gemma 3's")
    p.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help="extra variables for every chat template render, a JSON object (a request's "
                        "chat_template_kwargs override them), e.g. '{\"enable_thinking\": false}'")
    p.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="-1: thinking unrestricted (default); 0: off (enable_thinking=false for the chat templates "
                        "that read it, Qwen3's); llama.cpp takes only these two")
    p.add_argument("--reasoning-format", choices=list(REASONING_FORMATS), default="auto",
                   help="a chat reply's <think>...</think> in message.reasoning_content (auto, deepseek: llama.cpp's "
                        "default) or left in content (none); a request's reasoning_format overrides it")
    add_sparse_args(p)
    add_rope_args(p)
    add_lora_args(p, server=True)
    add_gpu_args(p)
    add_speculative_args(p)
    add_sampling_args(p, seed=None)          # the defaults of requests that leave a field out (llama.cpp's)
    g = p.add_argument_group("embeddings, monitoring, web page (llama.cpp's flags)")
    g.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                   help="serve POST /v1/embeddings and /embedding (completions keep working) (default: off: 501)")
    g.add_argument("--pooling", default=None, metavar="{none,mean,cls,last,rank}",
                   help="pooling of the embeddings (default: the file's <arch>.pooling_type, else mean; rank: a "
                        "reranker's scores)")
    g.add_argument("--reranking", "--rerank", action="store_true",
                   help="POST /rerank (/v1/rerank): a reranker model's scores of documents for a query (implies "
                        "--embedding --pooling rank)")
    g.add_argument("--metrics", action="store_true", help="serve GET /metrics, Prometheus text (default: off: 501)")
    g.add_argument("--slots", dest="slots", action="store_true", default=True,
                   help="serve GET /slots (default: on)")
    g.add_argument("--no-slots", dest="slots", action="store_false", help="GET /slots answers 501")
    g.add_argument("--slot-save-path", default=None, metavar="DIR",
                   help="where POST /slots/N?action=save|restore writes and reads slot files (a slot's prompt cache "
                        "and its KV rows; created if missing) (default: none: those actions answer 501; erase works "
                        "without it)")
    g.add_argument("--no-webui", dest="webui", action="store_false", default=True,
                   help="no chat page at GET / (default: served)")
    g = p.add_argument_group("serving (llama.cpp's flags)")
    g.add_argument("--api-prefix", default="", metavar="PREFIX",
                   help="serve every route under this path prefix, e.g. /llm (behind a reverse proxy)")
    g.add_argument("--ssl-key-file", default=None, metavar="FNAME", help="PEM private key: serve HTTPS")
    g.add_argument("--ssl-cert-file", default=None, metavar="FNAME", help="PEM certificate: serve HTTPS")
    g.add_argument("--context-shift", dest="context_shift", action="store_true", default=False,
                   help="when a slot's context is full, drop the older half of its tokens after n_keep and go on "
                        "(default: off: the request ends, truncated)")
    g.add_argument("--no-context-shift", dest="context_shift", action="store_false", help="(the default)")
    g.add_argument("--keep", type=int, default=0, metavar="N",
                   help="with --context-shift: the tokens a request keeps (its n_keep; -1: the whole prompt) "
                        "(default: %(default)s)")
    g.add_argument("-cb", "--cont-batching", action="store_true", default=None,
                   help="(always on: every slot's tokens go into one decode call per step)")
    g.add_argument("-nocb", "--no-cont-batching", action="store_true", default=None,
                   help="not supported: continuous batching is always on (refused)")
    g.add_argument("--threads-http", type=int, default=None, metavar="N",
                   help="no effect: requests are served by one asynchronous event loop")
    g.add_argument("--cpu-moe", action="store_true", default=None,
                   help="(always so: a mixture-of-experts model's experts stay on the CPU)")
    g.add_argument("--n-cpu-moe", type=int, default=None, metavar="N",
                   help="(always all: a mixture-of-experts model's experts stay on the CPU)")
    p.add_argument("-to", "--timeout", type=float, default=600.0,
                   help="seconds to wait for a request body, and idle keep-alive time (default: %(default)s)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--log-disable", action="store_true", help="log warnings and errors only")
    p.add_argument("--log-file", default=None, metavar="FNAME", help="also write the log to this file (appended)")
    add_llama_compat_args(p)
    return p


def parse_args(argv=None, parser: ArgumentParser | None = None) -> argparse.Namespace:
    p = parser or make_parser()
    apply_env_defaults(p)
    args = p.parse_args(argv)
    apply_llama_compat(p, args, prog="server")
    if args.parallel < 1 or args.parallel > 64:
        p.error("-np/--parallel must be in [1, 64]")
    if args.ctx_size is not None and args.ctx_size < 0:
        p.error("-c/--ctx-size must be >= 0")
    if args.cache_ram < -1:
        p.error("--cache-ram must be -1 (no limit), 0 (off) or a size in MiB")
    if args.keep < -1:
        p.error("--keep must be -1 (the whole prompt) or >= 0")
    if args.api_prefix and (not args.api_prefix.startswith("/") or args.api_prefix.rstrip("/") == ""):
        p.error(f"--api-prefix {args.api_prefix!r}: a path like /llm")
    if (args.ssl_key_file is None) != (args.ssl_cert_file is None):
        p.error("--ssl-key-file and --ssl-cert-file go together")
    if args.no_cont_batching:
        p.error("-nocb/--no-cont-batching: continuous batching is always on here (each step decodes every slot's "
                "tokens together; results do not depend on it)")
    on_cpu = "a mixture-of-experts model's experts always stay on the CPU"
    for dest, flag, why in (("cont_batching", "-cb/--cont-batching", "continuous batching is always on"),
                            ("threads_http", "--threads-http", "requests are served by one asynchronous event loop"),
                            ("cpu_moe", "--cpu-moe", on_cpu), ("n_cpu_moe", "--n-cpu-moe", on_cpu)):
        if getattr(args, dest) is not None:
            print(f"server: note: {flag} is accepted for llama.cpp compatibility and changes nothing: {why}",
                  file=sys.stderr)
    args.template_kwargs = {}
    if args.chat_template_kwargs is not None:
        try:
            args.template_kwargs = json.loads(args.chat_template_kwargs)
        except json.JSONDecodeError as e:
            p.error(f"--chat-template-kwargs: not JSON ({e})")
        if not isinstance(args.template_kwargs, dict):
            p.error("--chat-template-kwargs: must be a JSON object")
    try:
        args.sampling = sampling_params(args, seed=-1)
        args.rope = rope_overrides(args)
        args.rope["rope_scaling_type"] = args.rope.pop("rope_scaling")     # PowerInfer's (llama-cpp-python's) name
        args.rope["kv_overrides"] = dict(parse_kv_override(o) for o in args.override_kv)
        args.lora_specs = lora_specs(args)
        args.control_vector_specs = control_vector_specs(args)
    except (ValueError, CLIError) as e:
        p.error(str(e))
    if args.reasoning_budget not in (-1, 0):
        p.error("--reasoning-budget: only -1 (unrestricted) and 0 (thinking off) are supported")
    if args.reasoning_budget == 0:
        args.template_kwargs.setdefault("enable_thinking", False)
    if args.reranking:
        if args.pooling not in (None, "rank"):
            p.error(f"--reranking needs --pooling rank (got {args.pooling})")
        args.embedding, args.pooling = True, "rank"
    if args.pooling is not None:
        from ..embedding import check_pooling
        try:
            check_pooling(args.pooling)
        except ValueError as e:
            p.error(f"--pooling: {e}")
        if not args.embedding:
            print("server: note: --pooling changes nothing without --embedding", file=sys.stderr)
    return args


def _api_keys(args) -> list[str]:
    keys = []
    for k in args.api_key + [os.environ.get("LLAMA_API_KEY", "")]:
        keys += [x.strip() for x in k.split(",") if x.strip()]
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return keys


def _prefault(model, out=sys.stderr) -> None:
    """Touch every page of the weights once (the first request would otherwise pay for it), with a
    progress bar on a terminal and llama.cpp-style dots otherwise."""
    tensors = list(model.file.tensors.values())
    total = sum(t.data.nbytes for t in tensors) or 1
    tty = out.isatty()
    done, shown, t0 = 0, -1, time.perf_counter()
    if not tty:
        out.write("load: ")
    for t in tensors:
        data = t.data
        for s in range(0, data.nbytes, 64 << 20):
            int(data[s:s + (64 << 20):4096].sum())
            done += min(64 << 20, data.nbytes - s)
            pct = done * 100 // total
            if tty and pct != shown:
                bar = "#" * (pct // 4)
                out.write(f"\rload: [{bar:<25}] {pct:3d}% {done / 2**20:8.1f} / {total / 2**20:.1f} MiB")
                out.flush()
            elif not tty and pct // 5 != shown // 5:
                out.write(".")
                out.flush()
            shown = pct
    out.write(f" done ({time.perf_counter() - t0:.2f} s)\n" if not tty else f"  ({time.perf_counter() - t0:.2f} s)\n")
    out.flush()


def make_loader(args):
    def load():
        import powerinfer as pi
        template = args.chat_template
        chat_format = None
        if args.chat_template_file:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        elif template and ("{%" not in template and "{{" not in template):
            chat_format, template = template, None
        t0 = time.perf_counter()
        log.info("loading model '%s'", args.model)
        llm = pi.PowerInfer(args.model, n_ctx=args.ctx_size, n_batch=args.batch_size,
                            n_threads=args.threads or None, n_threads_batch=args.threads_batch,
                            seed=args.seed, kv_type=args.kv_type,
                            n_parallel=args.parallel, chat_format=chat_format, chat_template=template,
                            sparse_threshold=args.sparse_threshold, dense=args.dense, sparsity=args.sparsity,
                            sparse_batch_max=args.sparse_batch_max, sparse_gather_max=args.sparse_gather_max,
                            model_alias=args.alias, repack=False if args.no_repack else None, pooling=args.pooling,
                            reasoning_format=args.reasoning_format, lora=args.lora_specs, use_mlock=bool(args.mlock),
                            cache_ram_mib=args.cache_ram,
                            use_mmap=not args.no_mmap,
                            control_vectors=args.control_vector_specs,
                            control_vector_layer_range=args.control_vector_layer_range, **args.rope,
                            **gpu_kwargs(args))
        log.info("model: %s", llm.model.describe())
        if args.mmproj:
            from ..vision import VisionError
            try:
                llm.set_projector(args.mmproj, n_threads=args.threads or None)
            except VisionError as e:
                raise ValueError(f"--mmproj: {e}") from None
            log.info("multimodal projector: %s (%s, %d tokens per image)", args.mmproj, llm.projector.hp.proj_type,
                     llm.projector.n_image_tokens)
        try:
            llm.engine.drafter, llm.engine.spec = make_speculative(args, llm.model, "server", n_ctx=llm.ctx.n_ctx,
                                                                   n_seq_max=args.parallel)
        except CLIError as e:
            raise ValueError(str(e)) from None
        _prefault(llm.model)
        ctx = llm.ctx
        log.info("context: n_ctx = %d, %d slot(s) of %d tokens, n_batch = %d, threads = %s, kv = K %s, V %s",
                 ctx.n_ctx, llm.engine.n_slots, llm.engine.n_ctx_slot, ctx.n_batch, ctx.n_threads or "auto",
                 ctx.type_k, ctx.type_v)
        if llm.model.sparse:
            log.info("PowerInfer model: %s", "every neuron computed (--dense)" if args.dense else
                     f"sparse inference, sparse_pred_threshold = {ctx.sparse_threshold:.2f}")
        elif llm.model.gate_sparse:
            log.info("%s", act_sparsity.describe(ctx))
        log.info("chat template: %s", llm.chat_formatter.name)
        if args.embedding:      # made now: a bad --pooling or too little memory fails at startup, not later
            log.info("embeddings: pooling %s, up to %d tokens per input", llm.embedder.pooling, llm.embedder.n_ctx)
        log.info("system_info: %s", pi.system_info())
        log.info("model loaded in %.2f s", time.perf_counter() - t0)
        return llm
    return load


def make_state(args):
    """The server's state for parsed flags (the model resolved, not loaded yet: `state.loader` does
    that). ValueError with the message to show when the model or the key file is not there."""
    from .app import ServerState
    try:
        args.model = str(resolve_model(args))
    except HubError as e:
        raise ValueError(str(e)) from None
    if not os.path.isfile(args.model):
        raise ValueError(f"failed to load model: {args.model}: no such model file")
    try:
        keys = _api_keys(args)
    except OSError as e:
        raise ValueError(f"cannot read --api-key-file: {e}") from None
    if args.slot_save_path is not None:
        try:   # created where missing, as llama.cpp does
            os.makedirs(args.slot_save_path, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--slot-save-path {args.slot_save_path}: {e.strerror}") from None
    return ServerState(model_path=args.model, alias=args.alias, api_keys=keys, n_predict_max=args.n_predict,
                       timeout=args.timeout, loader=make_loader(args), embedding=args.embedding,
                       metrics=args.metrics, slots=args.slots, webui=args.webui, template_kwargs=args.template_kwargs,
                       slot_save_path=args.slot_save_path, sampling=args.sampling, api_prefix=args.api_prefix,
                       context_shift=args.context_shift, n_keep=args.keep)


def main(argv=None) -> int:
    args = parse_args(argv)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if args.log_file:
        try:
            handlers.append(logging.FileHandler(args.log_file, encoding="utf-8"))
        except OSError as e:
            print(f"error: --log-file {args.log_file}: {e.strerror}", file=sys.stderr)
            return 1
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING if args.log_disable else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as e:
        print(f"error: the server needs starlette, uvicorn and jinja2 (pip install 'powerinfer-py[server]'): {e}",
              file=sys.stderr)
        return 1
    try:
        state = make_state(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    keys = state.api_keys
    app = create_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, access_log=False, log_config=None,
                            timeout_keep_alive=max(1, int(args.timeout)), timeout_graceful_shutdown=5,
                            log_level="debug" if args.verbose else "info", ssl_keyfile=args.ssl_key_file,
                            ssl_certfile=args.ssl_cert_file)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # end in-flight requests now (their streams finish cleanly) instead of waiting for them;
            # from a thread, since a signal handler must not wait for the engine's locks
            if state.llm is not None:
                threading.Thread(target=state.llm.engine.cancel_all, daemon=True).start()
            super().handle_exit(sig, frame)

    server = Server(config)

    def exit_on_load_error():
        state.ready.wait()
        if state.load_error:
            server.should_exit = True
    threading.Thread(target=exit_on_load_error, daemon=True).start()
    log.info("server: listening on %s://%s:%d%s (%s)%s", "https" if args.ssl_cert_file else "http", args.host,
             args.port, args.api_prefix, "API key required" if keys else "no API key",
             f"; chat page at {args.api_prefix}/" if args.webui else "")
    try:
        server.run()
    except KeyboardInterrupt:     # uvicorn re-raises the SIGINT it shut down for: Ctrl+C is a clean exit
        pass
    if state.load_error:
        print(f"error: failed to load model: {state.load_error}", file=sys.stderr)
        return 1
    return 0
