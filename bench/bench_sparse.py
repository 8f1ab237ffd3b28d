#!/usr/bin/env python3
"""Decode speed of PowerInfer sparse inference vs dense, with a memory-bandwidth bound.

    PYTHONPATH=bindings python bench/bench_sparse.py --sparse /tmp/7b.powerinfer.gguf \\
        --dense /tmp/7b.dense.gguf -t 2 -n 64 -r 3 [--peer llama.cpp] [--profile]

Runs (token generation, "tg": a short prompt decoded as one batch, then -n tokens fed one at a
time, the same fixed pseudo-random token ids for every run and engine):

* ``sparse``        ours on the PWRI file, predictor-guided FFN (the file's threshold)
* ``sparse-all``    ours on the PWRI file with dense=True (every neuron, through the sparse kernels)
* ``dense``         ours on the dense GGUF (plain matmuls)
* ``llama.cpp``     llama-cpp-python on the dense GGUF (when importable; --peer none skips it)
* with --profile:   ``pred-only`` (PWRI file, threshold +inf: predictor runs, no neuron is computed)
                    and ``pred+all`` (threshold -inf: predictor and every neuron), to split the time

Reported: median tokens/s over -r runs, the fraction of neurons computed per layer (from
ctx.sparse_stats over the timed tokens), and a bandwidth bound: bytes each token has to read
(attention weights + KV cache + predictor + gate/up/down_t rows of the computed neurons +
output head; dense: all FFN rows, no predictor) divided by the memory read bandwidth, measured
here with a numpy pass over a large array (or given with --bandwidth GB/s).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT / "bindings") not in sys.path:
    sys.path.insert(0, str(_ROOT / "bindings"))

import powerinfer
from powerinfer.gguf_file import open_gguf


# --------------------------------------------------------------------------------------
# memory bandwidth
# --------------------------------------------------------------------------------------
def stream_pass(a: np.ndarray, n_threads: int = 2) -> list:
    """One pass of each of measure_bandwidth's reductions over the uint64 array a with n_threads threads: their read
    rates (GB/s, 1e9 bytes), xor then max."""
    out = []
    with ThreadPoolExecutor(n_threads) as ex:
        for fn, view in ((np.bitwise_xor.reduce, a), (np.max, a.view(np.uint8))):
            def part(i, fn=fn, view=view):
                s = view[i * len(view) // n_threads:(i + 1) * len(view) // n_threads]
                chunk = (16 << 20) // view.itemsize                              # 16 MiB per call
                for j in range(0, len(s), chunk):
                    fn(s[j:j + chunk])
            t0 = time.perf_counter()
            list(ex.map(part, range(n_threads)))
            out.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
    return out


def measure_bandwidth(mib: int = 2048, n_threads: int = 2, passes: int = 3) -> dict:
    """Read bandwidth (GB/s, 1e9 bytes) of numpy reductions (max over uint8, xor over uint64: SIMD, far
    cheaper than the memory traffic) over `mib` MiB, with 1 and n_threads threads (numpy releases the GIL
    in the reduction loop); the best of `passes` passes and of the two reductions."""
    a = np.ones(mib * 2**20 // 8, dtype=np.uint64)
    a[:: 4096 // 8] = np.arange(len(a[:: 4096 // 8]), dtype=np.uint64)     # touch every page
    res = {nth: max(max(stream_pass(a, nth)) for _ in range(passes)) for nth in sorted({1, max(1, n_threads)})}
    del a
    gc.collect()
    return res


# --------------------------------------------------------------------------------------
# engines
# --------------------------------------------------------------------------------------
class Ours:
    _models: dict = {}       # one mapped Model per file, shared by the contexts on it

    def __init__(self, path, n_ctx, n_threads, **ctx_kw):
        key = str(path)
        if key not in Ours._models:
            Ours._models[key] = powerinfer.Model(path)
        self.m = Ours._models[key]
        self.ctx = powerinfer.Context(self.m, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads, **ctx_kw)
        self.sparse = self.ctx.sparse
        self.n_vocab = self.m.n_vocab

    def clear(self):
        self.ctx.kv_clear()

    def decode(self, tokens):
        self.ctx.decode(tokens, logits="last")

    def stats_reset(self):
        if self.sparse:
            self.ctx.sparse_stats_reset()

    def stats(self):
        return self.ctx.sparse_stats() if self.sparse else None

    def close(self):
        del self.ctx, self.m
        gc.collect()


class LlamaCpp:
    sparse = False

    def __init__(self, path, n_ctx, n_threads):
        import llama_cpp
        self.lc = lc = llama_cpp
        self.llm = lc.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=n_threads,
                            n_threads_batch=n_threads, logits_all=False, verbose=False)
        self.ctx = self.llm.ctx
        self.n_vocab = self.llm.n_vocab()

    def clear(self):
        lc = self.lc
        if hasattr(lc, "llama_memory_clear"):
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        else:
            lc.llama_kv_self_clear(self.ctx)

    def decode(self, tokens):
        lc = self.lc
        arr = (lc.llama_token * len(tokens))(*tokens)
        rc = lc.llama_decode(self.ctx, lc.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        lc.llama_synchronize(self.ctx)

    def stats_reset(self):
        pass

    def stats(self):
        return None

    def close(self):
        self.llm.close() if hasattr(self.llm, "close") else None
        del self.llm
        gc.collect()


def warmup(engine, tokens, n_prompt):
    engine.clear()                                   # pages the weights in
    engine.decode(tokens[:n_prompt])
    for tk in tokens[n_prompt:n_prompt + 4]:
        engine.decode([tk])


def run_once(engine, tokens, n_prompt, n_gen):
    """One tg run: the prompt decoded untimed as one batch, then n_gen single-token decodes timed.
    Returns (tokens/s, tokens per CPU-second of this process, sparse stats of the timed tokens)."""
    prompt, gen = tokens[:n_prompt], tokens[n_prompt:n_prompt + n_gen]
    engine.clear()
    engine.decode(prompt)
    engine.stats_reset()
    c0 = time.process_time()
    t0 = time.perf_counter()
    for tk in gen:
        engine.decode([tk])
    dt = time.perf_counter() - t0
    cdt = time.process_time() - c0
    return n_gen / dt, n_gen / max(cdt, 1e-9), engine.stats()


# --------------------------------------------------------------------------------------
# pi_tensor views for op-level calls (also used by ab_ops.py); `keep` holds the buffers alive
# --------------------------------------------------------------------------------------
def gguf_tensor(t, keep):
    """A 2-d GGUF tensor (gguf_file) as a pi_tensor over the mapped file -> (pi_tensor *, bytes)."""
    from powerinfer._ffi import ffi, lib
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = t.type, 2
    p.ne[0], p.ne[1], p.ne[2], p.ne[3] = t.ne[0], t.ne[1], 1, 1
    rb = lib.pi_row_bytes(t.type, t.ne[0])
    p.nb[0], p.nb[1] = lib.pi_type_block_bytes(t.type), rb
    p.nb[2] = p.nb[3] = rb * t.ne[1]
    buf = ffi.from_buffer(t.data)
    keep.append(buf)
    p.data = ffi.cast("void *", buf)
    return p, t.data.nbytes


def weight_buffer(nbytes, keep):
    """nbytes of anonymous memory on 2 MiB pages where the kernel gives them (as pi_model_create allocates
    its repacked and packed copies): a uint8 numpy array kept alive by `keep`."""
    import mmap
    m = mmap.mmap(-1, nbytes + (2 << 20))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    arr = np.frombuffer(m, np.uint8)
    skip = -arr.ctypes.data % (2 << 20)          # start on a 2 MiB boundary
    keep.append(m)
    return arr[skip:skip + nbytes]


def f32_tensor(arr, keep):
    """A 2-d float32 numpy array [rows, cols] as a pi_tensor [cols, rows]."""
    from powerinfer._ffi import ffi, lib
    p = ffi.new("pi_tensor *")
    p.type, p.n_dims = lib.PI_TYPE_F32, 2
    p.ne[0], p.ne[1], p.ne[2], p.ne[3] = arr.shape[1], arr.shape[0], 1, 1
    p.nb[0], p.nb[1] = 4, 4 * arr.shape[1]
    p.nb[2] = p.nb[3] = arr.nbytes
    buf = ffi.from_buffer(arr)
    keep.append((arr, buf))
    p.data = ffi.cast("void *", buf)
    return p


# --------------------------------------------------------------------------------------
# op-level microbenchmark of one layer (CPU time, so that a shared machine matters less)
# --------------------------------------------------------------------------------------
def kernel_bench(sparse_path, dense_path, threads, reps=5, seed=0):
    """Median CPU ms of the FFN-related ops for one token (T=1), at 1 and `threads` threads. Each op is run
    on every layer in turn (so the weights come from memory, not from the last-level cache, as in a real
    decode); the median is over all (rep, layer) calls."""
    from powerinfer._ffi import ffi, lib
    fs = open_gguf(sparse_path)
    fd = open_gguf(dense_path) if dense_path else None
    keep = []

    def wt(f, name):
        return gguf_tensor(f.tensors[name], keep)

    def f32(arr):
        return f32_tensor(arr, keep)

    md = fs.metadata
    n_layer = int(md[f"{md.get('general.architecture', 'llama')}.block_count"])
    L = []
    for il in range(n_layer):
        P = f"blk.{il}."
        d = {k: wt(fs, P + k + ".weight") for k in ("ffn_gate", "ffn_up", "ffn_down_t", "fc1", "fc2", "attn_q")}
        if fd:
            d["ffn_down"] = wt(fd, P + "ffn_down.weight")
        w = ffi.new("pi_sparse_ffn_weights *")
        w.gate, w.up, w.down_t = d["ffn_gate"][0][0], d["ffn_up"][0][0], d["ffn_down_t"][0][0]
        d["w"] = w
        nbytes = lib.pi_sparse_pack_bytes(w, 0)
        if nbytes > 0:   # the per-neuron packing pi_model_create makes (PI_FFN_PAR)
            buf = weight_buffer(nbytes, keep)
            wp = ffi.new("pi_sparse_ffn_weights *")
            lib.pi_sparse_pack(w, 0, ffi.from_buffer(buf), nbytes, wp)
            keep.append(buf)
            d["wp"] = wp
        L.append(d)
    E, F = L[0]["ffn_gate"][0].ne[0], L[0]["ffn_gate"][0].ne[1]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, E)).astype(np.float32) * 3
    hvec = np.maximum(rng.standard_normal((1, F)).astype(np.float32), 0)
    scores = [np.zeros((1, F), np.float32) for _ in range(n_layer)]
    out, yF, yE = np.zeros((1, E), np.float32), np.zeros((1, F), np.float32), np.zeros((1, E), np.float32)
    X, OUT, YF, YE, H = f32(x), f32(out), f32(yF), f32(yE), f32(hvec)
    SC = [f32(sc) for sc in scores]
    na = ffi.new("int64_t *")
    inf = float("inf")
    rows = []
    for nth in sorted({1, threads}):
        pp = ffi.new("pi_threadpool **")
        lib.pi_threadpool_create(nth, pp)
        pool = pp[0]
        frac = []
        for il, d in enumerate(L):
            lib.pi_op_predictor(pool, d["fc1"][0], d["fc2"][0], X, SC[il])
            lib.pi_op_sparse_ffn(pool, d["w"], 1, 0, X, SC[il], 0.0, OUT, na)
            frac.append(na[0] / F)
        frac = float(np.mean(frac))

        def timeit(fn):
            ts, ws = [], []
            for _ in range(reps):
                for il in range(n_layer):
                    c0, t0 = time.process_time(), time.perf_counter()
                    fn(il)
                    ts.append(time.process_time() - c0)
                    ws.append(time.perf_counter() - t0)
            return 1e3 * statistics.median(ts), 1e3 * statistics.median(ws)

        def nb(*keys):
            return sum(L[0][k][1] for k in keys)

        ops = [("predictor fc2.relu(fc1.x)", lambda il, pool=pool: lib.pi_op_predictor(pool, L[il]["fc1"][0], L[il]["fc2"][0], X, SC[il]),
                nb("fc1", "fc2")),
               (f"sparse_ffn, predicted set ({frac:.3f})",
                lambda il, pool=pool: lib.pi_op_sparse_ffn(pool, L[il]["w"], 1, 0, X, SC[il], 0.0, OUT, na),
                int(frac * nb("ffn_gate", "ffn_up", "ffn_down_t"))),
               *([(f"sparse_ffn, predicted set ({frac:.3f}), packed",
                   lambda il, pool=pool: lib.pi_op_sparse_ffn(pool, L[il]["wp"], 1, 0, X, SC[il], 0.0, OUT, na),
                   int(frac * nb("ffn_gate", "ffn_up", "ffn_down_t")))] if "wp" in L[0] else []),
               ("sparse_ffn, no neuron", lambda il, pool=pool: lib.pi_op_sparse_ffn(pool, L[il]["w"], 1, 0, X, SC[il], inf, OUT, na), 0),
               ("sparse_ffn, all neurons", lambda il, pool=pool: lib.pi_op_sparse_ffn(pool, L[il]["w"], 1, 0, X, SC[il], -inf, OUT, na),
                nb("ffn_gate", "ffn_up", "ffn_down_t")),
               ("mul_mat ffn_gate (dense)", lambda il, pool=pool: lib.pi_op_mul_mat(pool, L[il]["ffn_gate"][0], X, YF), nb("ffn_gate")),
               ("mul_mat attn_q (dense)", lambda il, pool=pool: lib.pi_op_mul_mat(pool, L[il]["attn_q"][0], X, YE), nb("attn_q"))]
        if fd:
            ops.append(("mul_mat ffn_down (dense)", lambda il, pool=pool: lib.pi_op_mul_mat(pool, L[il]["ffn_down"][0], H, YE),
                        nb("ffn_down")))
        for label, fn, nbytes in ops:
            cpu, wall = timeit(fn)
            rows.append((nth, label, cpu, wall, nbytes))
        lib.pi_threadpool_free(pool)
    print(f"\nop-level (E={E}, F={F}), one token, each op run on all {n_layer} layers in turn, median of {reps}x{n_layer}"
          " calls. CPU ms = CPU time of the process (only trustworthy at 1 thread: Linux updates the CPU time"
          " of a thread running on another core lazily); GB/s = weight bytes touched / wall time")
    print("| threads | op | wall ms | CPU ms | MB | GB/s (wall) |")
    print("|---:|---|---:|---:|---:|---:|")
    for nth, label, cpu, wall, nbytes in rows:
        gbs = f"{nbytes / 1e6 / wall:.2f}" if nbytes and wall > 0 else "-"
        print(f"| {nth} | {label} | {wall:.3f} | {cpu:.3f} | {nbytes / 1e6:.1f} | {gbs} |")
    return rows


# --------------------------------------------------------------------------------------
# bytes per token
# --------------------------------------------------------------------------------------
def traffic(sparse_path, dense_path, fractions, n_ctx_avg) -> dict:
    """Bytes read per decoded token by each part of the model."""
    fs = open_gguf(sparse_path)
    t = {k: v.data.nbytes for k, v in fs.tensors.items()}
    md = fs.metadata
    arch = md.get("general.architecture", "llama")
    n_layer = int(md[f"{arch}.block_count"])
    n_embd = int(md[f"{arch}.embedding_length"])
    n_ff = int(md[f"{arch}.feed_forward_length"])
    n_head = int(md[f"{arch}.attention.head_count"])
    n_head_kv = int(md.get(f"{arch}.attention.head_count_kv", n_head))
    n_vocab = fs.tensors["token_embd.weight"].ne[1]
    attn = sum(t[f"blk.{i}.{n}.weight"] for i in range(n_layer)
               for n in ("attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_norm"))
    kv = int(n_ctx_avg * n_layer * 2 * (n_embd * n_head_kv // n_head) * 2)          # f16 K and V
    pred = sum(t[f"blk.{i}.{n}.weight"] for i in range(n_layer) for n in ("fc1", "fc2"))
    ffn_layer = [sum(t[f"blk.{i}.{n}.weight"] for n in ("ffn_gate", "ffn_up", "ffn_down_t")) for i in range(n_layer)]
    ffn_all = sum(ffn_layer)
    ffn_active = sum(f * b for f, b in zip(fractions, ffn_layer)) if fractions is not None else None
    head = t["output.weight"] + t["output_norm.weight"] + t["token_embd.weight"] // n_vocab
    out = dict(attn=attn, kv=kv, pred=pred, ffn_all=ffn_all, ffn_active=ffn_active, head=head,
               dense=attn + kv + ffn_all + head, sparse_all=attn + kv + ffn_all + head,
               pred_only=attn + kv + pred + head, pred_all=attn + kv + pred + ffn_all + head)
    out["sparse"] = attn + kv + pred + ffn_active + head if ffn_active is not None else None
    if dense_path:
        fd = open_gguf(dense_path)
        out["dense"] = sum(v.data.nbytes for k, v in fd.tensors.items() if k != "token_embd.weight") + \
            fd.tensors["token_embd.weight"].data.nbytes // n_vocab + kv
        del fd
    out.update(n_layer=n_layer, n_ff=n_ff, n_embd=n_embd)
    del fs
    return out


# --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--sparse", required=True, help="PowerInfer (PWRI) file")
    ap.add_argument("--dense", default=None, help="the equivalent dense GGUF (bench/make_sparse_model.py --dense-out)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="tokens decoded one at a time per run")
    ap.add_argument("-p", "--n-prompt", type=int, default=8, help="prompt tokens (one batch, untimed)")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--peer", default="llama.cpp", choices=["llama.cpp", "none"])
    ap.add_argument("--bandwidth", type=float, default=None, help="memory read bandwidth in GB/s (default: measure)")
    ap.add_argument("--bw-mib", type=int, default=2048, help="array size of the bandwidth measurement")
    ap.add_argument("--profile", action="store_true", help="also run pred-only (threshold +inf) and pred+all (-inf)")
    ap.add_argument("--only", default=None, help="comma list of runs to do (sparse,sparse-all,dense,llama.cpp,"
                                                   "pred-only,pred+all)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", action="store_true",
                    help="only the op-level microbenchmark (CPU time, all layers in turn), then exit")
    a = ap.parse_args(argv)

    print(f"# bench_sparse  {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.node()}  {powerinfer.cpu_name()}"
          f"  cpus={os.cpu_count()}  threads={a.threads}  load avg {os.getloadavg()[0]:.1f}")
    print(f"# {powerinfer.system_info() if hasattr(powerinfer, 'system_info') else ''}".rstrip())
    if a.bandwidth:
        bw = {"given": a.bandwidth}
        bw_gbs = a.bandwidth
    else:
        bw = measure_bandwidth(a.bw_mib, a.threads)
        bw_gbs = max(bw.values())
        print("# memory read bandwidth (numpy max/xor reductions over %d MiB): %s -> using %.1f GB/s" % (
            a.bw_mib, ", ".join(f"{k} thread{'s' if k > 1 else ''} {v:.1f} GB/s" for k, v in bw.items()), bw_gbs))

    if a.kernels:
        kernel_bench(a.sparse, a.dense, a.threads)
        return 0

    runs = ["sparse", "sparse-all"]
    if a.dense:
        runs.append("dense")
        if a.peer == "llama.cpp":
            try:
                import llama_cpp  # noqa: F401
                runs.append("llama.cpp")
            except Exception as e:  # noqa: BLE001
                print(f"# llama.cpp skipped: the llama_cpp package is not importable ({type(e).__name__}: {e})")
    if a.profile:
        runs += ["pred-only", "pred+all"]
    if a.only:
        keep = a.only.split(",")
        runs = [r for r in runs if r in keep]

    n_ctx = a.n_prompt + a.n_gen + 16
    m0 = powerinfer.Model(a.sparse)
    rng = np.random.default_rng([a.seed, 1234])
    tokens = [1] + rng.integers(259, m0.n_vocab, size=a.n_prompt + a.n_gen).tolist()
    print(f"# {m0.describe()}")
    del m0
    gc.collect()
    tokens = tokens[:a.n_prompt + a.n_gen]

    # every engine stays open and the runs are interleaved round-robin, so that all of them see the same
    # background load (this machine is shared); one mapped Model per file
    engines = {}
    for name in runs:
        if name == "sparse":
            engines[name] = Ours(a.sparse, n_ctx, a.threads)
        elif name == "sparse-all":
            engines[name] = Ours(a.sparse, n_ctx, a.threads, dense=True)
        elif name == "pred-only":
            engines[name] = Ours(a.sparse, n_ctx, a.threads, sparse_threshold=float("inf"))
        elif name == "pred+all":
            engines[name] = Ours(a.sparse, n_ctx, a.threads, sparse_threshold=float("-inf"))
        elif name == "dense":
            engines[name] = Ours(a.dense, n_ctx, a.threads)
        else:
            engines[name] = LlamaCpp(a.dense, n_ctx, a.threads)
    for name, eng in engines.items():
        t0 = time.perf_counter()
        warmup(eng, tokens, a.n_prompt)
        print(f"#   warmup {name}: {time.perf_counter() - t0:.1f}s", flush=True)
    results = {name: dict(rates=[], cpu_rates=[], loadavg=[]) for name in runs}
    acc = {name: [None, 0] for name in runs}
    for rep in range(a.reps):
        for name, eng in engines.items():
            load0 = os.getloadavg()[0]
            tps, cps, st = run_once(eng, tokens, a.n_prompt, a.n_gen)
            r = results[name]
            r["rates"].append(tps)
            r["cpu_rates"].append(cps)
            r["loadavg"].append(load0)
            if st is not None and st[1]:
                acc[name][0] = st[0].astype(np.int64) if acc[name][0] is None else acc[name][0] + st[0]
                acc[name][1] += st[1]
            print(f"#   rep {rep + 1}/{a.reps} {name:<10} tg{a.n_gen}: {tps:.2f} tok/s, {cps:.2f} tok per CPU-s"
                  f" (load avg {load0:.1f})", flush=True)
        if a.json:                                   # partial results, in case a later run dies
            with open(a.json, "w") as fh:
                json.dump(dict(args=vars(a), bandwidth=bw, partial=True, results=results), fh, indent=1, default=float)
    for name, r in results.items():
        r["median"] = statistics.median(r["rates"])
        r["cpu_median"] = statistics.median(r["cpu_rates"])
        if acc[name][0] is not None:
            r["fractions"] = (acc[name][0] / acc[name][1]).tolist()
        print(f"#   {name:<10} tg{a.n_gen}: " + " ".join(f"{x:.2f}" for x in r["rates"]) +
              f" tok/s (median {r['median']:.2f}; per CPU-second {r['cpu_median']:.2f})")
    for eng in engines.values():
        eng.close()
    del engines
    Ours._models.clear()
    gc.collect()

    fr = results.get("sparse", {}).get("fractions")
    tr = traffic(a.sparse, a.dense, fr, a.n_prompt + a.n_gen / 2)
    byte_key = {"sparse": "sparse", "sparse-all": "sparse_all", "dense": "dense", "llama.cpp": "dense",
                "pred-only": "pred_only", "pred+all": "pred_all"}

    GB = 1e9
    print()
    print(f"decode (tg{a.n_gen} after a {a.n_prompt}-token prompt), {a.threads} threads, median of {a.reps} runs; "
          f"bandwidth {bw_gbs:.1f} GB/s")
    print()
    print("| run | tok/s | ms/token | tok per CPU-s (all threads) | GB read/token | achieved GB/s | bound tok/s | % of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        b = tr.get(byte_key[name])
        if b is None:
            continue
        tps = r["median"]
        print(f"| {name} | {tps:.2f} | {1000 / tps:.0f} | {r['cpu_median']:.2f} | {b / GB:.3f} | {b * tps / GB:.1f} | {bw_gbs * GB / b:.2f} "
              f"| {100 * tps * b / (bw_gbs * GB):.0f}% |")
        r["bytes_per_token"] = b
    print()
    s = results.get("sparse", {}).get("median")
    if s:
        for other in ("sparse-all", "dense", "llama.cpp"):
            if other in results:
                print(f"speedup sparse / {other}: {s / results[other]['median']:.2f}x")
        if tr["sparse"]:
            print(f"bound ratio (bytes dense / bytes sparse): {tr['dense'] / tr['sparse']:.2f}x")
    print()
    print("bytes per token (GB): attention %.3f, KV cache %.3f, predictor %.3f, FFN all %.3f%s, output head %.3f" % (
        tr["attn"] / GB, tr["kv"] / GB, tr["pred"] / GB, tr["ffn_all"] / GB,
        f", FFN active {tr['ffn_active'] / GB:.3f}" if tr["ffn_active"] is not None else "", tr["head"] / GB))
    if fr:
        f = np.array(fr)
        print(f"neurons computed per layer (sparse): min {f.min():.3f} mean {f.mean():.3f} max {f.max():.3f}")
        print("  " + " ".join(f"{x:.3f}" for x in f))

    if "pred-only" in results and "pred+all" in results and "sparse-all" in results and "sparse" in results:
        def split(key):
            t = {k: 1.0 / v[key] for k, v in results.items() if isinstance(v, dict) and key in v}
            t_pred = t["pred+all"] - t["sparse-all"]
            t_base = t["pred-only"] - t_pred
            rows = [("attention + KV + head + other", t_base, tr["attn"] + tr["kv"] + tr["head"]),
                    ("predictor (fc1, fc2)", t_pred, tr["pred"]),
                    ("sparse FFN, selected neurons", t["sparse"] - t["pred-only"], tr["ffn_active"]),
                    ("FFN, all neurons (sparse kernels)", t["sparse-all"] - t_base, tr["ffn_all"])]
            if "dense" in t:
                rows.append(("FFN, all neurons (dense matmuls)", t["dense"] - t_base, tr["ffn_all"]))
            return rows
        wall, cpu = split("median"), split("cpu_median")
        print()
        print("time per token, split from the run differences (pred+all - sparse-all = predictor; pred-only - predictor ="
              " the rest; sparse - pred-only = selected FFN; ...). GB/s = bytes of that part / its time:")
        print("| part | wall ms/token | GB/s | CPU ms/token (all threads) | GB | ")
        print("|---|---:|---:|---:|---:|")
        for (label, tw, b), (_, tc, _) in zip(wall, cpu):
            gbs = f"{b / GB / tw:.1f}" if b and tw > 0 else "-"
            print(f"| {label} | {1000 * tw:.1f} | {gbs} | {1000 * tc:.1f} | {(b or 0) / GB:.3f} |")
        results["split_ms"] = {label: 1000 * tt for label, tt, _ in wall}
        results["split_cpu_ms"] = {label: 1000 * tt for label, tt, _ in cpu}

    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(args=vars(a), bandwidth=bw, bandwidth_used=bw_gbs, traffic=tr, results=results,
                           date=time.strftime("%Y-%m-%d %H:%M:%S"), machine=platform.node()), fh, indent=1,
                      default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
