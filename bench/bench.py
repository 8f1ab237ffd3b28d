#!/usr/bin/env python3
"""llama-bench style throughput benchmark for PowerInfer-py (optionally against llama.cpp).

    PYTHONPATH=bindings python bench/bench.py -m MODEL.gguf [-p 128,512] [-n 128] [-d 0] [-r 5] [-t CORES]
        [-b 512] [-ctk f16] [-ctv f16] [-fa 0|1] [-o md|csv|json] [--peer llama.cpp|none] [--no-repack]

Defaults: pp128, pp512 and tg128, on the physical cores, against llama.cpp when llama-cpp-python is
installed (its rows follow ours, and ours get the ratio).

Tests follow llama-bench: pp<N> = one decode of N random tokens (split in n_batch chunks) on a
cleared KV cache; tg<N> = N single-token decodes starting from an empty cache; with -d D (llama-bench's
--n-depth) the cache first gets D random tokens, untimed, and the test is named "pp512 @ d4096" (how
fast prompts and decoding stay at long contexts).  Each test runs
once as warmup (tg: one token), then -r timed repetitions; t/s = mean ± sample stddev over the
repetitions, plus their median.  With --peer llama.cpp the same tests run through
llama-cpp-python's low-level API (llama_batch_get_one + llama_decode, as llama-bench does) on
the same file, interleaved with ours, and our rows get a ratio column (ours / llama.cpp).
-ctk / -ctv set the K and V caches' types in both engines (llama-bench's flags; tests then read "tg128 kv q8_0/q8_0");
llama.cpp quantizes a V cache only with flash attention, so -fa defaults to 1 there when V is quantized (-fa is
llama.cpp's alone: ours has one attention).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings"))
import powerinfer  # noqa: E402
from powerinfer.cli_args import KV_GGML_IDS  # noqa: E402

FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K - Medium",
          11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large", 14: "Q4_K - Small", 15: "Q4_K - Medium",
          16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K", 19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw",
          22: "IQ3_XXS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 25: "IQ4_NL - 4.5 bpw",
          26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw",
          30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw", 32: "BF16"}   # llama.cpp's general.file_type names


def physical_cores() -> int:
    """The core's default thread count (physical cores), as every example uses it."""
    from powerinfer._ffi import ffi, lib
    pool = ffi.new("pi_threadpool **")
    if lib.pi_threadpool_create(0, pool) != 0:
        return os.cpu_count() or 1
    n = lib.pi_threadpool_size(pool[0])
    lib.pi_threadpool_free(pool[0])
    return n


def model_desc(m: powerinfer.Model) -> str:
    """'llama 7B Q4_0', like llama_model_desc."""
    n = m.n_params
    size = f"{round(n / 1e9)}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
    ftype = FTYPES.get(m.metadata.get("general.file_type"), "?")
    return f"{m.hparams.arch} {size} {ftype}"


class Ours:
    name, backend = "powerinfer", "CPU"

    def __init__(self, path, n_ctx, n_batch, n_threads, repack=True, type_k="f16", type_v="f16", lora=None,
                 lora_scale=1.0):
        self.m = powerinfer.Model(path, repack=repack)
        self.ctx = powerinfer.Context(self.m, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                      kv_type=(type_k, type_v))
        if lora:
            from powerinfer.lora import LoraAdapter
            self.ctx.set_lora([(LoraAdapter(lora, self.m), lora_scale)])
        self.desc, self.size, self.params = model_desc(self.m), self.m.size_bytes, self.m.n_params
        self.n_vocab = self.m.n_vocab

    def clear(self):
        self.ctx.kv_clear()

    def decode(self, tokens):
        self.ctx.decode(tokens, logits="last")


class LlamaCpp:
    name, backend = "llama.cpp", "CPU (llama.cpp)"

    def __init__(self, path, n_ctx, n_batch, n_threads, verbose=False, type_k="f16", type_v="f16", flash_attn=False,
                 lora=None, lora_scale=1.0):
        import llama_cpp
        self.lc = lc = llama_cpp
        self.llm = lc.Llama(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=n_threads,
                            n_threads_batch=n_threads, logits_all=False, verbose=verbose,
                            type_k=KV_GGML_IDS[type_k], type_v=KV_GGML_IDS[type_v], flash_attn=flash_attn,
                            lora_path=str(lora) if lora else None, lora_scale=lora_scale)
        model, self.ctx = self.llm.model, self.llm.ctx
        buf = lc.ctypes.create_string_buffer(128)
        lc.llama_model_desc(model, buf, 128)
        self.desc = buf.value.decode()
        self.size, self.params = lc.llama_model_size(model), lc.llama_model_n_params(model)
        self.n_vocab = self.llm.n_vocab()
        self.n_batch = n_batch

    def clear(self):
        lc = self.lc
        if hasattr(lc, "llama_memory_clear"):       # llama.cpp >= mid 2025
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        else:
            lc.llama_kv_self_clear(self.ctx)

    def decode(self, tokens):
        lc = self.lc
        for s in range(0, len(tokens), self.n_batch):   # like llama-bench's test_prompt
            chunk = tokens[s:s + self.n_batch]
            arr = (lc.llama_token * len(chunk))(*chunk)
            rc = lc.llama_decode(self.ctx, lc.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        lc.llama_synchronize(self.ctx)


def run_test(impl, n_prompt, n_gen, reps, rng, n_depth=0):
    """Returns tokens/s of each repetition."""
    def once(n_tg_tokens):
        toks = rng.integers(0, impl.n_vocab, size=n_depth + max(n_prompt, n_tg_tokens)).tolist()
        impl.clear()
        if n_depth:                                  # the context the test runs at, not timed
            impl.decode(toks[:n_depth])
            toks = toks[n_depth:]
        t0 = time.perf_counter()
        if n_prompt:
            impl.decode(toks[:n_prompt])
        else:
            for tok in toks[:n_tg_tokens]:
                impl.decode([tok])
        return time.perf_counter() - t0

    once(1 if n_gen else 0)                        # warmup: pp runs in full, tg one token
    n = n_prompt or n_gen
    return [n / once(n_gen) for _ in range(reps)]


def split_ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


COLS = [("model", 30, "<"), ("size", 10, ">"), ("params", 10, ">"), ("backend", 15, "<"),
        ("threads", 7, ">"), ("test", 15, ">"), ("t/s", 20, ">"), ("median", 10, ">")]


def md_line(cells, cols):
    return "| " + " | ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, cols)) + " |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="GGUF file(s), comma separated")
    ap.add_argument("-p", "--n-prompt", default="128,512", help="prompt sizes, comma separated (0: none)")
    ap.add_argument("-n", "--n-gen", default="128", help="generation lengths, comma separated (0: none)")
    ap.add_argument("-d", "--n-depth", default="0",
                    help="KV cache tokens before each test, comma separated (llama-bench's --n-depth; default 0)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", default=None, help="comma separated (default: physical cores)")
    ap.add_argument("-b", "--batch-size", type=int, default=512)
    ap.add_argument("-o", "--output", choices=["md", "csv", "json"], default="md")
    ap.add_argument("--peer", choices=["llama.cpp", "none"], default="llama.cpp",
                    help="also measure this implementation (default: llama.cpp, skipped if not installed)")
    ap.add_argument("--no-repack", action="store_true",
                    help="ours: read the file's weight layout (no interleaved copies)")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", choices=list(KV_GGML_IDS),
                    help="the K cache's type, both engines (default: %(default)s)")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", choices=list(KV_GGML_IDS),
                    help="the V cache's type, both engines (default: %(default)s)")
    ap.add_argument("-fa", "--flash-attn", type=int, choices=[0, 1], default=None,
                    help="llama.cpp's flash attention (default: 1 where the V cache is quantized, else 0)")
    ap.add_argument("--lora", default=None, metavar="FNAME",
                    help="a LoRA adapter (GGUF) both engines apply (tools/random_lora.py makes one for any base file)")
    ap.add_argument("--lora-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--verbose", action="store_true", help="let llama.cpp print its log")
    a = ap.parse_args()
    if a.threads is None:
        a.threads = str(physical_cores())
    if a.flash_attn is None:
        a.flash_attn = int(a.cache_type_v not in ("f16", "f32", "bf16"))
    kv = (a.cache_type_k, a.cache_type_v)
    kv_name = ("" if kv == ("f16", "f16") else f" kv {kv[0]}/{kv[1]}") + (" +lora" if a.lora else "")

    depths = split_ints(a.n_depth) or [0]
    if min(depths) < 0:
        ap.error("-d/--n-depth values must be >= 0")
    tests = [(p, 0, d) for d in depths for p in split_ints(a.n_prompt) if p > 0] + \
            [(0, n, d) for d in depths for n in split_ints(a.n_gen) if n > 0]
    impls = [Ours]
    if a.peer == "llama.cpp":
        try:
            import llama_cpp  # noqa: F401
            impls.append(LlamaCpp)
        except ImportError as e:
            print(f"peer llama.cpp skipped: the llama_cpp package (llama-cpp-python) is not importable ({e})",
                  file=sys.stderr)
    cols = COLS + ([("ratio", 7, ">")] if len(impls) > 1 else [])
    if a.output == "md":
        print(md_line([c for c, _, _ in cols], cols))
        print("| " + " | ".join("-" * (w - 1) + (":" if al == ">" else "-") for _, w, al in cols) + " |")

    results = []
    for path in a.model.split(","):
        for threads in split_ints(a.threads):
            n_ctx = max(p + n + d for p, n, d in tests)
            loaded = []
            for cls in impls:
                kw = ({"verbose": a.verbose, "flash_attn": bool(a.flash_attn)} if cls is LlamaCpp
                      else {"repack": not a.no_repack})
                kw.update(type_k=kv[0], type_v=kv[1], lora=a.lora, lora_scale=a.lora_scale)
                try:
                    loaded.append(cls(path, n_ctx, a.batch_size, threads, **kw))
                except Exception as e:   # e.g. llama.cpp refusing the file: report it, keep our rows
                    print(f"{cls.name}: cannot load {path}: {type(e).__name__}: {e}"
                          + ("  (rerun with --verbose for llama.cpp's log)" if cls is LlamaCpp else ""),
                          file=sys.stderr)
            for p, n, d in tests:
                row_ts = {}
                for impl in loaded:
                    ts = run_test(impl, p, n, a.repetitions, np.random.default_rng(a.seed), n_depth=d)
                    row_ts[impl.name] = ts
                    r = dict(impl=impl.name, model=impl.desc, model_filename=path, size=impl.size,
                             params=impl.params, backend=impl.backend, threads=threads, n_batch=a.batch_size,
                             test=(f"pp{p}" if p else f"tg{n}") + (f" @ d{d}" if d else "") + kv_name, n_prompt=p,
                             n_gen=n, n_depth=d, type_k=kv[0], type_v=kv[1],
                             avg_ts=statistics.mean(ts), stddev_ts=statistics.stdev(ts) if len(ts) > 1 else 0.0,
                             median_ts=statistics.median(ts), samples_ts=ts)
                    if impl.name == "powerinfer" and "llama.cpp" in [x.name for x in loaded]:
                        r["ratio"] = None   # filled once llama.cpp has run this test
                    results.append(r)
                if "llama.cpp" in row_ts and "powerinfer" in row_ts:
                    ours = next(r for r in reversed(results) if r["impl"] == "powerinfer")
                    ours["ratio"] = statistics.median(row_ts["powerinfer"]) / statistics.median(row_ts["llama.cpp"])
                if a.output == "md":
                    for r in results[-len(loaded):]:
                        size = f"{r['size'] / 2**30:.2f} GiB" if r["size"] >= 2**30 else f"{r['size'] / 2**20:.2f} MiB"
                        params = f"{r['params'] / 1e9:.2f} B" if r["params"] >= 1e9 else f"{r['params'] / 1e6:.2f} M"
                        cells = [r["model"], size, params,
                                 r["backend"], r["threads"], r["test"],
                                 f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}", f"{r['median_ts']:.2f}"]
                        if len(cols) > len(COLS):
                            cells.append(f"{r['ratio']:.2f}x" if r.get("ratio") else "")
                        print(md_line(cells, cols), flush=True)

    if a.output == "json":
        print(json.dumps(results, indent=2))
    elif a.output == "csv":
        keys = ["impl", "model", "model_filename", "size", "params", "backend", "threads", "n_batch", "test",
                "n_prompt", "n_gen", "n_depth", "type_k", "type_v", "avg_ts", "stddev_ts", "median_ts", "ratio",
                "samples_ts"]
        print(",".join(keys))
        for r in results:
            vals = {**r, "samples_ts": " ".join(f"{x:.4f}" for x in r["samples_ts"])}
            print(",".join(f'"{vals[k]}"' if isinstance(vals.get(k), str) else str(vals.get(k, "")) for k in keys))
    elif a.output == "md":
        print(f"\npowerinfer: {powerinfer.system_info()}; ratio = median t/s ours / llama.cpp"
              + (f"; llama.cpp flash_attn = {a.flash_attn}" if len(impls) > 1 else ""))


if __name__ == "__main__":
    main()
