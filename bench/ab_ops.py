"""A/B of two builds of the library on one op, in one process, alternating: what a kernel change is
worth without the run-to-run drift of this shared VM (+-10% between runs minutes apart).

    cmake -S . -B /tmp/build-b -G Ninja && ninja -C /tmp/build-b       # the other build (e.g. git stash)
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op sparse_ffn -m /tmp/sparse7b.powerinfer.gguf
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op mul_mat --mats attn_q,attn_k,attn_v,attn_output
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op mul_mat --mats attn_output -T 512   # prompts

A is the library the bindings load (./build), B the one in --lib-b. Both see the same weights (read
from the GGUF file, packed or repacked by A as the model loader would), the same input and their own
thread pool. Each round runs the op on every layer in turn (so the weights come from DRAM, not from
the cache), A then B; the script prints the median time per call and the weight bytes per second.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sparse import f32_tensor, gguf_tensor, weight_buffer  # noqa: E402
from powerinfer._ffi import ffi, lib as lib_a  # noqa: E402
from powerinfer.gguf_file import open_gguf  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib-b", required=True, help="directory (or file) of the other libpowerinfer.so")
    ap.add_argument("-m", "--model", default="/tmp/sparse7b.powerinfer.gguf")
    ap.add_argument("--op", choices=["sparse_ffn", "mul_mat"], default="sparse_ffn")
    ap.add_argument("--mats", default="attn_q", help="mul_mat: comma list of per-layer weights")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=6)
    ap.add_argument("-T", "--tokens", type=int, default=1, help="mul_mat: activation rows per call (1: decode)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the calling thread's CPU (needs -t 1: the op then runs inline), not the wall clock: "
                         "time spent descheduled on a loaded machine is not counted")
    a = ap.parse_args(argv)
    if a.cpu_time and a.threads != 1:
        ap.error("--cpu-time needs -t 1")
    clock = time.thread_time if a.cpu_time else time.perf_counter
    b_path = Path(a.lib_b)
    lib_b = ffi.dlopen(str(b_path / "libpowerinfer.so" if b_path.is_dir() else b_path))
    f = open_gguf(a.model)
    keep = []

    def f32(arr):
        return f32_tensor(arr, keep)

    def weight(name):
        return gguf_tensor(f.tensors[name], keep)

    md = f.metadata
    n_layer = int(md[f"{md.get('general.architecture', 'llama')}.block_count"])
    pools = []
    for L in (lib_a, lib_b):
        pp = ffi.new("pi_threadpool **")
        L.pi_threadpool_create(a.threads, pp)
        pools.append(pp[0])
    calls, nbytes = [], 0   # calls[i](lib, pool)
    if a.op == "sparse_ffn":
        E = f.tensors["blk.0.ffn_up.weight"].ne[0]
        F = f.tensors["blk.0.ffn_up.weight"].ne[1]
        x = f32(np.random.default_rng(0).standard_normal((1, E)).astype(np.float32) * 3)
        out = f32(np.zeros((1, E), np.float32))
        n_active = ffi.new("int64_t *")
        for il in range(n_layer):
            P = f"blk.{il}."
            w = ffi.new("pi_sparse_ffn_weights *")
            (gate, gb), (up, ub), (down, db) = (weight(P + n + ".weight") for n in ("ffn_gate", "ffn_up", "ffn_down_t"))
            w.gate, w.up, w.down_t = gate[0], up[0], down[0]
            n = lib_a.pi_sparse_pack_bytes(w, lib_a.PI_FFN_PAR)
            if n > 0:   # what the loader does
                buf = weight_buffer(n, keep)
                keep.append(buf)
                packed = ffi.new("pi_sparse_ffn_weights *")
                lib_a.pi_sparse_pack(w, lib_a.PI_FFN_PAR, ffi.from_buffer(buf), n, packed)
                w = packed
            keep.append(w)
            scores = f32(np.zeros((1, F), np.float32))
            lib_a.pi_op_predictor(pools[0], weight(P + "fc1.weight")[0], weight(P + "fc2.weight")[0], x, scores)
            lib_a.pi_op_sparse_ffn(pools[0], w, lib_a.PI_ACT_RELU, lib_a.PI_FFN_PAR, x, scores, 0.0, out, n_active)
            nbytes += n_active[0] / F * (gb + ub + db)
            calls.append(lambda L, pool, w=w, s=scores: L.pi_op_sparse_ffn(pool, w, lib_a.PI_ACT_RELU, lib_a.PI_FFN_PAR,
                                                                       x, s, 0.0, out, ffi.NULL))
    else:
        def as_loaded(L, t):   # the layout library L's loader gives the weight (each repacks for itself)
            n = L.pi_repack_bytes(t)
            if n <= 0:
                return t
            buf = weight_buffer(n, keep)
            keep.append(buf)
            r = ffi.new("pi_tensor *")
            L.pi_repack(t, ffi.from_buffer(buf), n, r)
            keep.append(r)
            return r

        for il in range(n_layer):
            for m in a.mats.split(","):
                t, nb = weight(f"blk.{il}.{m}.weight")
                keep.append(t)
                ts = {id(L): as_loaded(L, t) for L in (lib_a, lib_b)}
                xi = f32(np.random.default_rng(il).standard_normal((a.tokens, t.ne[0])).astype(np.float32))
                yi = f32(np.zeros((a.tokens, t.ne[1]), np.float32))
                nbytes += nb
                calls.append(lambda L, pool, ts=ts, xi=xi, yi=yi: L.pi_op_mul_mat(pool, ts[id(L)], xi, yi))
    times = [[], []]
    for r in range(a.rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):   # A first, then B first: neither always runs warm
            L = (lib_a, lib_b)[k]
            t0 = clock()
            for c in calls:
                c(L, pools[k])
            times[k].append(clock() - t0)
    for k, name in enumerate(("A (./build)", f"B ({a.lib_b})")):
        t = statistics.median(times[k])
        print(f"{name}: {1e3 * t / len(calls):.3f} ms per call, {nbytes / t / 1e9:.1f} GB/s of weights "
              f"({a.op}, {len(calls)} calls per round, median of {a.rounds}{', CPU time' if a.cpu_time else ''})")
    print(f"A/B = {statistics.median(times[0]) / statistics.median(times[1]):.3f}")
    for k, L in enumerate((lib_a, lib_b)):
        L.pi_threadpool_free(pools[k])
    return 0


if __name__ == "__main__":
    sys.exit(main())
