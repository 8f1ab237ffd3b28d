#!/usr/bin/env python3
"""Requests/s and tokens/s of the server alone vs. 1 and 2 Ray Serve replicas (powerinfer.serve).

    python bench/serve_replicas.py [-m MODEL] [-n 100] [--clients 8] [--max-tokens 64] [--cores 2]

The runs get the same cores and slots: the server alone (-t CORES and -t CORES/2, -np 4), 1 replica
with -t CORES -np 4, 2 replicas with -t CORES/2 -np 2 each. Half the requests stream. On a machine with no more cores
than that the replicas share them, so the comparison shows what Serve's proxy and a second process
cost, not scaling; scaling needs machines (or cores) per replica.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_serve_ray import PROMPTS, Client, _spec  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(base: str, n: int, clients: int, max_tokens: int) -> dict:
    c = Client(base)
    for i in range(2 * clients):        # warm-up: every replica, both kinds
        c.request(_spec(i, 4))
    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as ex:
        res = list(ex.map(c.request, [_spec(i, max_tokens) for i in range(n)]))
    wall = time.monotonic() - t0
    lat = sorted(r["t_end"] - r["t_start"] for r in res)
    return {"ok": sum(r["ok"] for r in res), "wall": wall, "req_s": n / wall,
            "p50": lat[len(lat) // 2], "replicas": len({r["replica"] for r in res})}


def wait_healthy(base: str, timeout: float = 120) -> None:
    import httpx
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(base)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=str(ROOT / "models/tinyrelu/tinyrelu.powerinfer.gguf"))
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cores", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for t in sorted({a.cores, max(1, a.cores // 2)}, reverse=True):
        port = free_port()
        srv = subprocess.Popen([sys.executable, str(ROOT / "examples/server.py"), "-m", a.model, "--port", str(port),
                                "-np", "4", "-c", "1024", "-t", str(t), "--log-disable"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(f"http://127.0.0.1:{port}")
            rows.append(("server alone", f"-t {t} -np 4", load(f"http://127.0.0.1:{port}", a.n, a.clients,
                                                                a.max_tokens)))
        finally:
            srv.terminate()
            srv.wait(30)

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray import serve

    import powerinfer.serve as ps
    ray.init(include_dashboard=False, num_cpus=a.cores, _temp_dir=tempfile.mkdtemp(prefix="pi-ray-"),
             log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        for n_rep, flags in ((1, {"threads": a.cores, "parallel": 4, "ctx_size": 1024}),
                             (2, {"threads": max(1, a.cores // 2), "parallel": 2, "ctx_size": 512})):
            serve.run(ps.build_app({"model": a.model, "num_replicas": n_rep, "log_disable": True, **flags}),
                      name=ps.APP_NAME, route_prefix="/")
            rows.append((f"Serve, {n_rep} replica(s)", f"-t {flags['threads']} -np {flags['parallel']} each",
                         load(f"http://127.0.0.1:{port}", a.n, a.clients, a.max_tokens)))
            serve.delete(ps.APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"{a.n} requests ({len(PROMPTS)} prompts, chat and text, half streamed, max_tokens {a.max_tokens}), "
          f"{a.clients} clients, {os.cpu_count()} CPUs")
    print(f"{'setup':<24} {'flags':<22} {'ok':>4} {'wall s':>7} {'req/s':>7} {'p50 s':>6} {'replicas':>8}")
    for name, flags, r in rows:
        print(f"{name:<24} {flags:<22} {r['ok']:>4} {r['wall']:>7.2f} {r['req_s']:>7.1f} {r['p50']:>6.3f} "
              f"{r['replicas']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
