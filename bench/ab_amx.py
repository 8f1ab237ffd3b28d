"""A/B of two CPU kernel levels on pi_op_mul_mat, in one process, alternating (pi_cpu_isa_set between
calls): what the amx level's tile kernel is worth against avx512 at prompt batch sizes, without the
run-to-run drift of a shared VM. Random Q4_0 weights, repacked to the interleaved layout as the model
loader does; the results of the two levels are also checked bit for bit.

    PYTHONPATH=bindings python bench/ab_amx.py                       # 4096x4096, 11008x4096; T 16..512
    PYTHONPATH=bindings python bench/ab_amx.py --shapes 4096x4096 -T 128,512 -r 7 --levels avx512,amx
    PYTHONPATH=bindings python bench/ab_amx.py --model /tmp/bench_7b_q4_0.gguf -T 128 -r 2   # whole prompts

With --model, each round decodes one prompt of T random tokens on a cleared cache at each level (the model
is loaded, and repacked, once: the layout is the same at every level) and the last logits are compared.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings"))
import powerinfer as pi  # noqa: E402
from powerinfer._ffi import check, ffi, lib  # noqa: E402

Q4_0 = 2


def tensor(t: int, data: np.ndarray, ne0: int, ne1: int, row_bytes: int):
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t, 2
    for i, (ne, nb) in enumerate([(ne0, row_bytes if t == 0 else 18), (ne1, row_bytes), (1, row_bytes * ne1),
                                  (1, row_bytes * ne1)]):
        p.ne[i], p.nb[i] = ne, nb
    if t == 0:
        p.nb[0] = 4
    p.data = ffi.cast("void *", data.ctypes.data)
    return p


def q4_0_weight(N: int, K: int, seed: int):
    """[N, K] Q4_0 from random floats (the core's quantizer), then its interleaved copy."""
    w = (np.random.default_rng(seed).standard_normal(N * K) / 20).astype(np.float32)
    raw = np.zeros(N * K // 32 * 18, np.uint8)
    check(lib.pi_quantize_row(Q4_0, ffi.cast("float *", w.ctypes.data), ffi.cast("void *", raw.ctypes.data), N * K))
    wt = tensor(Q4_0, raw, K, N, K // 32 * 18)
    n = lib.pi_repack_bytes(wt)
    buf = np.zeros(n, np.uint8)
    rt = ffi.new("pi_tensor *")
    check(lib.pi_repack(wt, ffi.cast("void *", buf.ctypes.data), n, rt))
    return rt, (raw, buf)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096,11008x4096", help="NxK (rows x K) list")
    ap.add_argument("-T", "--tokens", default="16,32,64,128,512")
    ap.add_argument("--levels", default="avx512,amx")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--model", help="a GGUF file: time whole prompt decodes instead of single ops")
    ap.add_argument("--cpu-time", action="store_true",
                    help="-t 1 only: time the calling thread's CPU time, not the wall clock (less noise from "
                         "other processes on a shared machine)")
    a = ap.parse_args(argv)
    levels = a.levels.split(",")
    if a.cpu_time and a.threads != 1:
        ap.error("--cpu-time needs -t 1 (the pool's caller is its only thread)")
    clock = time.thread_time if a.cpu_time else time.perf_counter
    for lv in levels:
        if not pi.cpu_isa_supported(lv):
            print(f"{lv}: not supported here ({pi.system_info()})")
            return 1
    if a.model:
        return model_ab(a, levels)
    pp = ffi.new("pi_threadpool **")
    check(lib.pi_threadpool_create(a.threads, pp))
    pool = pp[0]
    start = pi.cpu_isa()
    print(f"# {pi.system_info()}\n# threads {a.threads}, median of {a.rounds} alternating rounds"
          f"{', CPU time' if a.cpu_time else ''}")
    for shape in a.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        w, keep = q4_0_weight(N, K, N + K)
        for T in (int(v) for v in a.tokens.split(",")):
            x = np.random.default_rng(T).standard_normal((T, K)).astype(np.float32)
            xt = tensor(0, x, K, T, K * 4)
            ys = {lv: np.zeros((T, N), np.float32) for lv in levels}
            yt = {lv: tensor(0, ys[lv], N, T, N * 4) for lv in levels}
            times = {lv: [] for lv in levels}
            for _ in range(a.rounds):
                for lv in levels:
                    pi.set_cpu_isa(lv)
                    t0 = clock()
                    check(lib.pi_op_mul_mat(pool, w, xt, yt[lv]))
                    times[lv].append(clock() - t0)
            same = all(np.array_equal(ys[lv].view(np.uint32), ys[levels[0]].view(np.uint32)) for lv in levels)
            med = {lv: statistics.median(times[lv]) for lv in levels}
            cols = "  ".join(f"{lv} {1e3 * med[lv]:8.2f} ms ({2 * N * K * T / med[lv] / 1e9:6.0f} GOP/s)" for lv in levels)
            print(f"{N}x{K} T={T:4d}  {cols}  {levels[0]}/{levels[-1]} = {med[levels[0]] / med[levels[-1]]:.2f}x"
                  f"  bits {'equal' if same else 'DIFFER'}")
    pi.set_cpu_isa(start)
    lib.pi_threadpool_free(pool)
    return 0


def model_ab(a, levels) -> int:
    start = pi.cpu_isa()
    model = pi.Model(a.model)
    ctx = pi.Context(model, n_ctx=max(int(v) for v in a.tokens.split(",")) + 8, n_threads=a.threads)
    print(f"# {pi.system_info()}\n# {a.model}, threads {a.threads}, median of {a.rounds} alternating rounds")
    for T in (int(v) for v in a.tokens.split(",")):
        prompt = [int(v) for v in np.random.default_rng(T).integers(1, 32000, T)]
        times = {lv: [] for lv in levels}
        last = {}
        for _ in range(a.rounds):
            for lv in levels:
                pi.set_cpu_isa(lv)
                ctx.kv_clear()
                t0 = time.perf_counter()
                ctx.decode(prompt)
                times[lv].append(time.perf_counter() - t0)
                last[lv] = ctx.logits().copy()
        same = all(np.array_equal(last[lv].view(np.uint32), last[levels[0]].view(np.uint32)) for lv in levels)
        med = {lv: statistics.median(times[lv]) for lv in levels}
        cols = "  ".join(f"{lv} {T / med[lv]:7.2f} t/s" for lv in levels)
        print(f"pp{T}  {cols}  {levels[-1]}/{levels[0]} = {med[levels[0]] / med[levels[-1]]:.2f}x"
              f"  logits {'equal' if same else 'DIFFER'}")
    pi.set_cpu_isa(start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
