"""One op at two or more CPU kernel levels of the same library, alternating in one process: what a
level's kernels are worth without the run-to-run drift of a shared VM.

    PYTHONPATH=bindings python bench/ab_isa.py --type q4_0 -K 4096 -N 4096 -T 1,8,128 --levels avx2,avx512
    PYTHONPATH=bindings python bench/ab_isa.py --model /tmp/bench_7b_q4_0.gguf -T 128,512 -r 3 --levels avx512,amx
    PYTHONPATH=bindings python bench/ab_isa.py --type f16 -K 2048 -N 5632 -T 1,512 --layouts   # file vs repacked
    PYTHONPATH=bindings python bench/ab_isa.py --model /tmp/m1b_f16.gguf -T 8 --gen 64 -r 5     # tg64, paired

Weights are random rows quantized by the core (repacked as the model loader would), activations
random; each round runs every level once per T. Prints the median time per call and GFLOP/s
(2 K N T / t) per level, the ratio to the first level, and whether the levels' outputs are bit-equal
(the numeric contract). With --layouts, the two variants are the load-time interleaved copy (pi_repack) and
the file's row layout, at the first level. With --model, each round decodes one prompt of T random tokens on
a cleared cache at each level instead (the model is loaded and repacked once: the layout is the same at
every level) and the last logits are compared; with --gen N, the prompt is not timed and each round times N
more tokens decoded one at a time (bench.py's tg N, paired).
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

TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
         "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13, "q6_K": 14}


def f32_tensor(a: np.ndarray):
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = 0, 2
    ne = [a.shape[1], a.shape[0], 1, 1]
    nb = [4, a.strides[0], a.strides[0] * a.shape[0], a.strides[0] * a.shape[0]]
    for i in range(4):
        p.ne[i], p.nb[i] = ne[i], nb[i]
    p.data = ffi.cast("void *", a.ctypes.data)
    return p


def weight(t: int, N: int, K: int, keep: list):
    row = lib.pi_row_bytes(t, K)
    raw = np.zeros((N, row), np.uint8)
    rng = np.random.default_rng(0)
    for r in range(N):
        src = (rng.standard_normal(K) / 64).astype(np.float32)
        check(lib.pi_quantize_row(t, ffi.cast("float *", src.ctypes.data), ffi.cast("void *", raw[r].ctypes.data), K))
    w = ffi.new("pi_tensor *")
    w.type, w.n_dims = t, 2
    ne, nb = [K, N, 1, 1], [lib.pi_type_block_bytes(t), row, row * N, row * N]
    for i in range(4):
        w.ne[i], w.nb[i] = ne[i], nb[i]
    w.data = ffi.cast("void *", raw.ctypes.data)
    keep.append(raw)
    nbytes = lib.pi_repack_bytes(w)
    if nbytes:
        buf = np.zeros(nbytes, np.uint8)
        out = ffi.new("pi_tensor *")
        check(lib.pi_repack(w, ffi.cast("void *", buf.ctypes.data), nbytes, out))
        keep.append(buf)
        return out, w
    return w, w


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="q4_0", choices=list(TYPES))
    ap.add_argument("-K", type=int, default=4096)
    ap.add_argument("-N", type=int, default=4096)
    ap.add_argument("-T", default="1,8,128", help="comma list of token counts")
    ap.add_argument("--levels", default="avx2,avx512")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=7)
    ap.add_argument("--layouts", action="store_true",
                    help="compare the file's layout with the repacked copy (at the first level) instead of levels")
    ap.add_argument("--model", help="a GGUF file: time whole prompt decodes instead of one op")
    ap.add_argument("--gen", type=int, default=0,
                    help="with --model: after each prompt of T tokens, time N tokens decoded one at a time "
                         "(tg N, the cache growing as in bench.py) instead of the prompt")
    ap.add_argument("--cpu-time", action="store_true",
                    help="-t 1 only: time the calling thread's CPU time, not the wall clock (less noise from "
                         "other processes on a shared machine)")
    a = ap.parse_args(argv)
    if a.cpu_time and a.threads != 1:
        ap.error("--cpu-time needs -t 1 (the pool's caller is its only thread)")
    clock = time.thread_time if a.cpu_time else time.perf_counter
    levels = [lv for lv in a.levels.split(",") if pi.cpu_isa_supported(lv)]
    if not levels:
        sys.exit("none of these levels runs here: " + pi.system_info())
    if a.model:
        return model_ab(a, levels)
    keep: list = []
    repacked, file_rows = weight(TYPES[a.type], a.N, a.K, keep)
    if a.layouts and repacked is file_rows:
        sys.exit(f"{a.type} [{a.N} x {a.K}] has no repacked layout at this level")
    variants = {"repacked": (levels[0], repacked), "file": (levels[0], file_rows)} if a.layouts else \
        {lv: (lv, repacked) for lv in levels}
    names = list(variants)
    pool = ffi.new("pi_threadpool **")
    check(lib.pi_threadpool_create(a.threads, pool))
    print(f"# {a.type} [{a.N} x {a.K}], {a.threads} threads{', CPU time' if a.cpu_time else ''}; {pi.system_info()}")
    start = pi.cpu_isa()
    for T in [int(v) for v in a.T.split(",")]:
        x = np.random.default_rng(1).standard_normal((T, a.K)).astype(np.float32)
        y = np.zeros((T, a.N), np.float32)
        times: dict[str, list[float]] = {v: [] for v in names}
        out: dict[str, np.ndarray] = {}
        reps = max(1, 64 // T)
        for _ in range(a.rounds):
            for v in names:
                lv, w = variants[v]
                pi.set_cpu_isa(lv)
                t0 = clock()
                for _ in range(reps):
                    check(lib.pi_op_mul_mat(pool[0], w, f32_tensor(x), f32_tensor(y)))
                times[v].append((clock() - t0) / reps)
                out[v] = y.copy()
        base = statistics.median(times[names[0]])
        for v in names:
            med = statistics.median(times[v])
            same = np.array_equal(out[v].view(np.uint32), out[names[0]].view(np.uint32))
            print(f"T={T:4d} {v:8s} {med * 1e3:9.3f} ms  {2 * a.K * a.N * T / med / 1e9:8.1f} GFLOP/s  "
                  f"x{base / med:.2f}  bits {'equal' if same else 'DIFFER'}")
    pi.set_cpu_isa(start)
    lib.pi_threadpool_free(pool[0])
    return 0


def model_ab(a, levels) -> int:
    start = pi.cpu_isa()
    tokens = [int(v) for v in a.T.split(",")]
    model = pi.Model(a.model)
    ctx = pi.Context(model, n_ctx=max(tokens) + a.gen + 8, n_batch=max(tokens), n_threads=a.threads)
    print(f"# {pi.system_info()}\n# {a.model}, threads {a.threads}, median of {a.rounds} alternating rounds")
    for T in tokens:
        prompt = [int(v) for v in np.random.default_rng(T).integers(1, model.n_vocab, T)]
        gen = [int(v) for v in np.random.default_rng(T + 1).integers(1, model.n_vocab, a.gen)]
        times: dict[str, list[float]] = {lv: [] for lv in levels}
        last: dict[str, np.ndarray] = {}
        for _ in range(a.rounds):
            for lv in levels:
                pi.set_cpu_isa(lv)
                ctx.kv_clear()
                t0 = time.perf_counter()
                ctx.decode(prompt)
                if gen:   # tg: the prompt untimed, then one token per decode
                    t0 = time.perf_counter()
                    for tok in gen:
                        ctx.decode([tok])
                times[lv].append(time.perf_counter() - t0)
                last[lv] = ctx.logits().copy()
        same = all(np.array_equal(last[lv].view(np.uint32), last[levels[0]].view(np.uint32)) for lv in levels)
        med = {lv: statistics.median(times[lv]) for lv in levels}
        n = a.gen or T
        cols = "  ".join(f"{lv} {n / med[lv]:7.2f} t/s" for lv in levels)
        test = f"tg{a.gen} after pp{T}" if a.gen else f"pp{T}"
        print(f"{test}  {cols}  {levels[-1]}/{levels[0]} = {med[levels[0]] / med[levels[-1]]:.2f}x"
              f"  logits {'equal' if same else 'DIFFER'}")
    pi.set_cpu_isa(start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
