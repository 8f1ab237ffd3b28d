"""Replicas of the HTTP server under Ray Serve: one model per replica process, Serve's proxy in front.

Each replica runs the server's own Starlette app (`powerinfer.server.app.create_app`: the same routes,
streaming, API keys); Serve balances requests over the replicas, restarts dead ones, and scales
between --min-replicas and --max-replicas when asked. Needs the ray extra: pip install '.[ray]'.

    python -m powerinfer.serve -m MODEL -np 4 -t 2 --num-replicas 2 --port 8000      # Ray started here

or, on a Ray cluster (`ray start --head`, and `ray start --address HEAD:6379` on the other machines):

    serve run powerinfer.serve:build_app model=/abs/MODEL parallel=4 threads=2 num_replicas=2
    serve deploy examples/serve.yaml                      # the same, as a Serve config (args: the flags)

A replica is one Ray actor: `num_cpus` = -t (its thread count), `num_gpus` = --num-gpus, its -np slots;
Serve sends it at most --max-ongoing-requests requests at a time (default -np) and queues the rest.
The model loads in the replica's constructor, so Serve routes nothing to a replica until it has loaded;
Serve's periodic health check is the server's readiness (`ServerState.readiness`, also /health): a
replica whose engine stopped is replaced. Responses carry `x-powerinfer-replica` (Serve's replica id)
and `x-powerinfer-pid`.

Flags that belong to Serve under `serve run` / `serve deploy`: the proxy's host, port and keep-alive are
the config's `http_options` (given as args they are an error); the deployment's own settings in the
config's `deployments:` section (num_replicas, autoscaling_config, ...) override the ones made from args.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

from .cli_args import threads_in_use
from .server.cli import make_parser, make_state, parse_args as parse_server_args

log = logging.getLogger("powerinfer.serve")

DEPLOYMENT = "PowerInferServer"
APP_NAME = "powerinfer"
REPLICA_HEADER = b"x-powerinfer-replica"
PID_HEADER = b"x-powerinfer-pid"


# ------------------------------------------------------------------------------------------ flags
def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve")
    g.add_argument("--num-replicas", type=int, default=None,
                   help="replicas of the server, each one process with its model (default: 1)")
    g.add_argument("--min-replicas", type=int, default=None,
                   help="autoscale: at least this many replicas (with --max-replicas)")
    g.add_argument("--max-replicas", type=int, default=None,
                   help="autoscale: at most this many replicas; Serve adds replicas while they average "
                        "more than --target-ongoing-requests")
    g.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscale: requests per replica to aim for (default: -np)")
    g.add_argument("--max-ongoing-requests", type=int, default=None,
                   help="most requests Serve sends one replica at a time; more wait in Serve's queue (default: -np)")
    g.add_argument("--num-gpus", type=float, default=0.0,
                   help="GPUs Ray reserves per replica and shows it in CUDA_VISIBLE_DEVICES (default: %(default)s: "
                        "none reserved; a replica sees every GPU of its machine)")
    g.add_argument("--address", default=None,
                   help="python -m powerinfer.serve only: the Ray cluster to use (default: $RAY_ADDRESS, a "
                        "cluster started on this machine with `ray start`, else a new local one)")


class _ArgsError(ValueError):
    pass


def parse_args(argv=None, *, for_builder: bool = False) -> argparse.Namespace:
    """The server's flags plus add_serve_args'. for_builder: errors raise ValueError (not exit), and
    the flags that are Serve's config under `serve run`/`serve deploy` are refused."""
    p = make_parser(prog="python -m powerinfer.serve")
    add_serve_args(p)
    if for_builder:
        def error(message):
            raise _ArgsError(message)
        p.error = error
    given = set(argv or [])
    args = parse_server_args(argv, p)
    if for_builder:
        for flag, where in (("--host", "http_options.host"), ("--port", "http_options.port"),
                            ("--address", "`serve run --address` / `serve deploy --address`")):
            if flag in given or any(a.startswith(flag + "=") for a in given):
                p.error(f"'{flag[2:]}' is Serve's setting here: set {where} (not an application arg)")
        if "-to" in given or "--timeout" in given:
            log.warning("timeout: used for reading request bodies; idle keep-alive is Serve's "
                        "http_options.keep_alive_timeout_s")
    autoscale = args.min_replicas is not None or args.max_replicas is not None
    if autoscale and args.num_replicas is not None:
        p.error("--num-replicas is a fixed count; --min-replicas/--max-replicas autoscale: give one or the other")
    if autoscale and (args.min_replicas is None or args.max_replicas is None):
        p.error("autoscaling needs both --min-replicas and --max-replicas")
    if autoscale and not 0 <= args.min_replicas <= args.max_replicas or autoscale and args.max_replicas < 1:
        p.error(f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, "
                f"got {args.min_replicas} and {args.max_replicas}")
    if not autoscale and args.target_ongoing_requests is not None:
        p.error("--target-ongoing-requests is an autoscaling setting: give --min-replicas and --max-replicas too")
    if args.num_replicas is not None and args.num_replicas < 1:
        p.error(f"--num-replicas must be >= 1, got {args.num_replicas}")
    if args.max_ongoing_requests is not None and args.max_ongoing_requests < 1:
        p.error(f"--max-ongoing-requests must be >= 1, got {args.max_ongoing_requests}")
    if args.target_ongoing_requests is not None and not args.target_ongoing_requests > 0:
        p.error(f"--target-ongoing-requests must be > 0, got {args.target_ongoing_requests}")
    if not args.num_gpus >= 0:
        p.error(f"--num-gpus must be >= 0, got {args.num_gpus}")
    if args.threads < 0:
        p.error(f"-t/--threads must be >= 0, got {args.threads}")
    if args.threads == 0:
        # Ray needs the count up front (num_cpus): the physical cores of the machine that builds the app
        args.threads = threads_in_use(0) or 1
        log.info("-t not given: %d threads (and num_cpus) per replica, this machine's physical cores", args.threads)
    if args.num_gpus == 0 and (args.vram_budget is not None or args.n_gpu_layers not in (None, 0)):
        log.warning("--vram-budget/-ngl without --num-gpus: Ray reserves no GPU for the replicas; replicas on "
                    "one machine share its GPUs, each within its own --vram-budget")
    return args


def argv_of(config: dict) -> list[str]:
    """`serve run ... key=value` / a Serve config's `args:` as server flags: keys are flag names
    without dashes (`parallel`, `np`, `num_replicas`, `num-replicas`); booleans switch a flag on or
    off; a list repeats a flag (api_key: [a, b])."""
    p = make_parser()
    add_serve_args(p)
    actions = p._option_string_actions
    argv: list[str] = []
    for key, value in config.items():
        name = str(key)
        flag = next((f for f in ("--" + name, "--" + name.replace("_", "-"), "-" + name) if f in actions), None)
        if flag is None:
            raise ValueError(f"unknown application arg '{key}' (the names are the server's flags, e.g. "
                             "model, parallel, threads, ctx_size, num_replicas)")
        if actions[flag].nargs == 0:       # store_true
            on = {True: True, False: False, "true": True, "false": False, "1": True, "0": False,
                  "yes": True, "no": False, "on": True, "off": False}.get(
                      value.lower() if isinstance(value, str) else value)
            if on is None:
                raise ValueError(f"application arg '{key}' is a switch: true or false, got {value!r}")
            if on:
                argv.append(flag)
            continue
        for v in value if isinstance(value, list) else [value]:
            argv += [flag, str(v)]
    return argv


# ------------------------------------------------------------------------------------------ deployment
class _ReplicaHeaders:
    """ASGI wrapper: every response says which replica (and process) answered."""

    def __init__(self, app, replica_id: str):
        self.app = app
        self.headers = [(REPLICA_HEADER, replica_id.encode()), (PID_HEADER, str(os.getpid()).encode())]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_(msg):
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), *self.headers]}
            await send(msg)
        await self.app(scope, receive, send_)


def _deployment_class():
    """The Serve deployment (built on first use, so that importing this module needs no ray)."""
    from ray import serve

    @serve.ingress()
    class PowerInferServer:
        async def __init__(self, args: argparse.Namespace):
            level = logging.DEBUG if args.verbose else logging.WARNING if args.log_disable else logging.INFO
            pkg = logging.getLogger("powerinfer")
            pkg.setLevel(level)
            if not pkg.handlers:       # the replica's stderr is its Ray log file
                h = logging.StreamHandler(sys.stderr)
                h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
                pkg.addHandler(h)
            try:
                self.state = make_state(args)
            except ValueError as e:
                raise RuntimeError(str(e)) from None
            # in the constructor, so Serve routes nothing here before the model is ready
            self.state.llm = await asyncio.to_thread(self.state.loader)
            self.state.ready.set()
            self.replica_id = serve.get_replica_context().replica_id.unique_id

        def __serve_build_asgi_app__(self):
            from .server.app import create_app
            return _ReplicaHeaders(create_app(self.state), self.replica_id)

        async def check_health(self):
            status, body = self.state.readiness()
            if status != 200:
                raise RuntimeError(f"replica not ready (/health {status}): {body}")

    return PowerInferServer


def deployment_options(args: argparse.Namespace) -> dict:
    """Serve's deployment options for parsed flags (see parse_args)."""
    np_ = args.parallel
    opts: dict = dict(name=DEPLOYMENT, max_ongoing_requests=args.max_ongoing_requests or np_,
                      ray_actor_options={"num_cpus": args.threads, "num_gpus": args.num_gpus})
    if args.max_replicas is not None:
        opts["autoscaling_config"] = {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
                                      "target_ongoing_requests": args.target_ongoing_requests or np_}
    else:
        opts["num_replicas"] = args.num_replicas or 1
    return opts


def application(args: argparse.Namespace):
    """The Serve application for parsed flags: one deployment, each replica the server of `args`."""
    from ray import serve
    return serve.deployment(_deployment_class()).options(**deployment_options(args)).bind(args)


def build_app(config: dict):
    """Application builder for `serve run powerinfer.serve:build_app key=value ...` and Serve configs
    (`import_path: powerinfer.serve:build_app`, `args: {...}`)."""
    args = parse_args(argv_of(config or {}), for_builder=True)
    if not args.hf_repo and args.model and not os.path.isfile(args.model):
        raise ValueError(f"model '{args.model}': no such file (seen from {os.getcwd()}; every node needs the "
                         "file at this path: give an absolute one)")
    return application(args)


# ------------------------------------------------------------------------------------------ launcher
def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.log_disable else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import ray
        from ray import serve
    except ImportError as e:
        print(f"error: powerinfer.serve needs Ray Serve (pip install 'powerinfer-py[ray]'): {e}", file=sys.stderr)
        return 1
    if not args.hf_repo and args.model and not os.path.isfile(args.model):
        print(f"error: failed to load model: {args.model}: no such model file", file=sys.stderr)
        return 1
    app = application(args)

    def on_term(sig, frame):      # `kill`, a service manager: shut Serve down as Ctrl+C does
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    ray.init(address=args.address)
    serve.start(http_options={"host": args.host, "port": args.port,
                              "keep_alive_timeout_s": max(1, int(args.timeout))})
    try:
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        log.info("serving on http://%s:%d (%s)", args.host, args.port, "Ctrl+C stops")
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        pass
    except Exception as e:     # a deploy that failed (the replicas' error is in the message)
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
