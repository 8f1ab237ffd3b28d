"""A/B of two builds of the library on one op, in one process, alternating: what a kernel change is
worth without the run-to-run drift of this shared VM (+-10% between runs minutes apart).

    cmake -S . -B /tmp/build-b -G Ninja && ninja -C /tmp/build-b       # the other build (e.g. git stash)
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op sparse_ffn -m /tmp/sparse7b.powerinfer.gguf
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op mul_mat --mats attn_q,attn_k,attn_v,attn_output
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op mul_mat --mats attn_output -T 512   # prompts
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op cats,gate_t,dense_ffn -t 1 --cpu-time \
        -m /tmp/bench_7b_q4_0.sparse.gguf --layers 8 --sparsity 0.5      # activation sparsity (issue 16)
    PYTHONPATH=bindings python bench/ab_ops.py --lib-b /tmp/build-b --op attention -m MODEL -T 512 --depth 4096

`attention` = pi_op_attention of -T queries (f32) over an f16 K/V cache of --depth + T cells with a causal mask,
the model's head count, kv head count and head size, one K/V cache per layer (random values); a prompt at depth
when -T > 1, one decoded token when -T is 1. GB/s counts the K and V bytes once.

The activation-sparsity ops (a gate-sparse file of tools/sparsify.py, one token): `cats` = the sparse FFN with
the gate given (packed up + down_t rows of the channels with |act(g)| >= the --sparsity quantile of this input),
`gate_t` = the input-sparse gate (ffn_gate_t rows of the inputs with |x_j| >= their --sparsity quantile),
`gate` and `dense_ffn` = the dense gate and up + down matmuls they replace (repacked as the loader does).
GB/s counts the weight bytes the op reads (the selected rows only).

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

lib_b = None   # the other library (main)
FILE_LAYOUT_B = False   # --file-layout-b (main)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib-b", required=True, help="directory (or file) of the other libpowerinfer.so")
    ap.add_argument("-m", "--model", default="/tmp/sparse7b.powerinfer.gguf")
    ap.add_argument("--op", default="sparse_ffn",
                    help="comma list of: sparse_ffn, mul_mat, attention, and for gate-sparse files cats, gate_t, gate, "
                    "dense_ffn")
    ap.add_argument("--layers", type=int, default=None, help="the first N layers only (default: all)")
    ap.add_argument("--sparsity", type=float, default=0.5, help="cats, gate_t: the share of rows skipped")
    ap.add_argument("--file-layout-b", action="store_true", help="mul_mat: B reads the file's layout, not the "
                    "interleaved copy (with --lib-b the same build: what the copy is worth)")
    ap.add_argument("--mats", default="attn_q", help="mul_mat: comma list of per-layer weights (each layer's) or of "
                    "whole-model ones (token_embd, output: the head)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=6)
    ap.add_argument("-T", "--tokens", type=int, default=1, help="mul_mat: activation rows per call (1: decode); "
                    "attention: queries")
    ap.add_argument("--depth", type=int, default=0, help="attention: cells in the cache before the queries")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the calling thread's CPU (needs -t 1: the op then runs inline), not the wall clock: "
                         "time spent descheduled on a loaded machine is not counted")
    a = ap.parse_args(argv)
    if a.cpu_time and a.threads != 1:
        ap.error("--cpu-time needs -t 1")
    clock = time.thread_time if a.cpu_time else time.perf_counter
    b_path = Path(a.lib_b)
    global lib_b, FILE_LAYOUT_B
    FILE_LAYOUT_B = a.file_layout_b
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
    if a.layers:
        n_layer = min(n_layer, a.layers)
    for op in a.op.split(","):
        calls, nbytes = build(op, a, f, n_layer, weight, f32, pools, keep)
        measure(op, a, calls, nbytes, clock, lib_b, pools)
    for k, L in enumerate((lib_a, lib_b)):
        L.pi_threadpool_free(pools[k])
    return 0


def repacked(t, keep):
    """(A's, B's) copy of weight t as each library's loader lays it out (t where a library repacks none): the two
    may not share a layout (a type one of them lacks)."""
    out = []
    for L in (lib_a, lib_b):
        n = 0 if L is lib_b and FILE_LAYOUT_B else L.pi_repack_bytes(t)
        r = t
        if n > 0:
            buf = weight_buffer(n, keep)
            keep.append(buf)
            r = ffi.new("pi_tensor *")
            L.pi_repack(t, ffi.from_buffer(buf), n, r)
        keep.append(r)
        out.append(r)
    return out


def packed_per_lib(w, keep, mode=None):
    """(A's, B's) packed copy of sparse FFN weights w (gate mode seq unless given), what the loader makes,
    each library in its own layout; w where a library packs none."""
    mode = lib_a.PI_FFN_SEQ if mode is None else mode
    out = []
    for L in (lib_a, lib_b):
        n = L.pi_sparse_pack_bytes(w, mode)
        p = w
        if n > 0:
            buf = weight_buffer(n, keep)
            p = ffi.new("pi_sparse_ffn_weights *")
            L.pi_sparse_pack(w, mode, ffi.from_buffer(buf), n, p)
        keep.append(p)
        out.append(p)
    return out


def silu(v):
    return v / (1 + np.exp(-v.astype(np.float64)))


def build(op, a, f, n_layer, weight, f32, pools, keep):
    """calls[i](lib, pool) and the weight bytes one round reads."""
    calls, nbytes = [], 0
    if op == "sparse_ffn":
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
            ws = packed_per_lib(w, keep, lib_a.PI_FFN_PAR)   # what the loader does
            scores = f32(np.zeros((1, F), np.float32))
            lib_a.pi_op_predictor(pools[0], weight(P + "fc1.weight")[0], weight(P + "fc2.weight")[0], x, scores)
            lib_a.pi_op_sparse_ffn(pools[0], ws[0], lib_a.PI_ACT_RELU, lib_a.PI_FFN_PAR, x, scores, 0.0, out, n_active)
            nbytes += n_active[0] / F * (gb + ub + db)
            calls.append(lambda L, pool, ws=ws, s=scores: L.pi_op_sparse_ffn(
                pool, ws[L is lib_b], lib_a.PI_ACT_RELU, lib_a.PI_FFN_PAR, x, s, 0.0, out, ffi.NULL))
    elif op == "mul_mat":
        names = [f"blk.{il}.{m}.weight" for il in range(n_layer) for m in a.mats.split(",")
                 if f"{m}.weight" not in f.tensors]
        names += [f"{m}.weight" for m in a.mats.split(",") if f"{m}.weight" in f.tensors]   # token_embd, output
        for il, name in enumerate(names):
            t, nb = weight(name)
            ts = repacked(t, keep)
            xi = f32(np.random.default_rng(il).standard_normal((a.tokens, t.ne[0])).astype(np.float32))
            yi = f32(np.zeros((a.tokens, t.ne[1]), np.float32))
            nbytes += nb
            calls.append(lambda L, pool, ts=ts, xi=xi, yi=yi: L.pi_op_mul_mat(pool, ts[L is lib_b], xi, yi))
    elif op in ("cats", "gate_t", "gate", "dense_ffn"):
        E = f.tensors["blk.0.ffn_up.weight"].ne[0]
        F = f.tensors["blk.0.ffn_up.weight"].ne[1]
        rng = np.random.default_rng(0)
        n_active = ffi.new("int64_t *")
        for il in range(n_layer):
            P = f"blk.{il}."
            x = f32(rng.standard_normal((1, E)).astype(np.float32))
            g = np.zeros((1, F), np.float32)
            gate, gb = weight(P + "ffn_gate.weight")
            gates = repacked(gate, keep)
            gt = f32(g)
            lib_a.pi_op_mul_mat(pools[0], gates[0], x, gt)
            if op == "gate":
                nbytes += gb
                calls.append(lambda L, pool, ts=gates, xi=x, yi=gt: L.pi_op_mul_mat(pool, ts[L is lib_b], xi, yi))
            elif op == "dense_ffn":
                (up, ub), (down, db) = weight(P + "ffn_up.weight"), weight(P + "ffn_down.weight")
                ups, downs = repacked(up, keep), repacked(down, keep)
                h = f32(np.zeros((1, F), np.float32))
                y = f32(np.zeros((1, E), np.float32))
                nbytes += ub + db
                calls.append(lambda L, pool, ups=ups, downs=downs, xi=x, h=h, y=y:
                             (L.pi_op_mul_mat(pool, ups[L is lib_b], xi, h),
                              L.pi_op_mul_mat(pool, downs[L is lib_b], h, y)))
            elif op == "cats":
                w = ffi.new("pi_sparse_ffn_weights *")
                (up, ub), (down, db) = weight(P + "ffn_up.weight"), weight(P + "ffn_down.weight")
                w.up, w.down = up[0], down[0]   # as the loader: the down step from ffn_down's column layout,
                if P + "ffn_down_t.weight" in f.tensors:   # else from the transposed copy where the file has one
                    w.down_t = weight(P + "ffn_down_t.weight")[0][0]
                ws = packed_per_lib(w, keep)   # the gate-less packing pi_model_create makes
                thr = float(np.quantile(np.abs(silu(g[0])), a.sparsity))
                lib_a.pi_op_sparse_ffn(pools[0], ws[0], lib_a.PI_ACT_SILU, lib_a.PI_FFN_PAR, x, gt, thr,
                                       f32(np.zeros((1, E), np.float32)), n_active)
                nbytes += n_active[0] / F * (ub + db)
                y = f32(np.zeros((1, E), np.float32))
                calls.append(lambda L, pool, ws=ws, xi=x, s=gt, thr=thr, y=y: L.pi_op_sparse_ffn(
                    pool, ws[L is lib_b], lib_a.PI_ACT_SILU, lib_a.PI_FFN_PAR, xi, s, thr, y, ffi.NULL))
            else:   # gate_t: up and gate NULL, the scores are h = x
                w = ffi.new("pi_sparse_ffn_weights *")
                tb = gb   # the loader lays out ffn_gate's own blocks by input where it can (the same bytes),
                w.down = gate[0]   # else reads the transposed copy, where the file has one
                if P + "ffn_gate_t.weight" in f.tensors:
                    gt_t, tb = weight(P + "ffn_gate_t.weight")
                    w.down_t = gt_t[0]
                ws = packed_per_lib(w, keep)   # the loader's packed copy, where a build has one for a matrix alone
                thr = float(np.quantile(np.abs(values(x, E)), a.sparsity))
                lib_a.pi_op_sparse_ffn(pools[0], ws[0], lib_a.PI_ACT_SILU, lib_a.PI_FFN_SEQ, x, x, thr, gt, n_active)
                nbytes += n_active[0] / E * tb
                calls.append(lambda L, pool, ws=ws, xi=x, thr=thr, y=gt: L.pi_op_sparse_ffn(
                    pool, ws[L is lib_b], lib_a.PI_ACT_SILU, lib_a.PI_FFN_SEQ, xi, xi, thr, y, ffi.NULL))
    elif op == "attention":
        md, arch = f.metadata, f.metadata.get("general.architecture", "llama")
        H, E = int(md[f"{arch}.attention.head_count"]), int(md[f"{arch}.embedding_length"])
        H_kv = int(md.get(f"{arch}.attention.head_count_kv", H))
        hd = int(md.get(f"{arch}.attention.key_length", E // H))
        T, n_kv = a.tokens, a.depth + a.tokens
        rng = np.random.default_rng(0)
        mask = np.where(np.arange(n_kv)[None, :] <= a.depth + np.arange(T)[:, None], 0, -np.inf).astype(np.float32)
        mask_t = array_tensor(mask, lib_a.PI_TYPE_F32, keep)
        for il in range(n_layer):
            q = array_tensor(rng.standard_normal((T, H, hd)).astype(np.float32), lib_a.PI_TYPE_F32, keep)
            k, v = (array_tensor(rng.standard_normal((n_kv, H_kv, hd)).astype(np.float16).view(np.uint16),
                                 lib_a.PI_TYPE_F16, keep) for _ in range(2))
            out = array_tensor(np.zeros((T, H, hd), np.float32), lib_a.PI_TYPE_F32, keep)
            nbytes += 2 * n_kv * H_kv * hd * 2
            calls.append(lambda L, pool, q=q, k=k, v=v, out=out: L.pi_op_attention(
                pool, q, k, v, mask_t, 1.0 / np.sqrt(hd), out))
    else:
        raise SystemExit(f"unknown op {op}")
    return calls, nbytes


def array_tensor(arr, dtype, keep):
    """A C-contiguous numpy array (f32, or uint16 holding f16) as a pi_tensor of its shape reversed (GGUF order)."""
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = dtype, arr.ndim
    shape = list(arr.shape[::-1]) + [1] * (4 - arr.ndim)
    for i in range(4):
        p.ne[i] = shape[i]
        p.nb[i] = arr.itemsize * int(np.prod(shape[:i]))
    buf = ffi.from_buffer(arr)
    keep.append((arr, buf, p))
    p.data = ffi.cast("void *", buf)
    return p


def values(x, n):
    """The n floats of an f32 pi_tensor."""
    return np.frombuffer(ffi.buffer(ffi.cast("float *", x.data), 4 * n), np.float32)


def measure(op, a, calls, nbytes, clock, lib_b, pools):
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
              f"({op}, {len(calls)} calls per round, median of {a.rounds}{', CPU time' if a.cpu_time else ''})")
    paired = statistics.median(ta / tb for ta, tb in zip(*times))
    print(f"A/B = {statistics.median(times[0]) / statistics.median(times[1]):.3f} (medians; paired: median of the "
          f"rounds' A/B {paired:.3f}, fastest rounds {min(times[0]) / min(times[1]):.3f})")


if __name__ == "__main__":
    sys.exit(main())
