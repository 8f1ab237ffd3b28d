"""Embedding throughput of an encoder (bert) against llama-cpp-python in the same run.

Writes a bge-small-en-v1.5-shaped bert file (n_embd 384, 12 heads, 12 layers, FFN 1536, 512 positions; the tests'
WordPiece vocabulary, random weights) in f16 and Q8_0 (tests/encoder_files.py), then embeds N inputs of L tokens each
([CLS] + L - 2 words + [SEP], the same ids on both sides) with mean pooling and L2 normalization, R times, and reports
tokens/s (medians of R runs, the two sides alternating) and how close the vectors are (worst cosine).

    python bench/bench_encoders.py -t 2 -n 64 -l 128 -r 3 [--layers 6]   (--layers 6: all-MiniLM-L6-v2's depth)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bindings"))

from encoder_files import WORDS, write_bert_model  # noqa: E402

import powerinfer as pi  # noqa: E402
from powerinfer.embedding import Embedder  # noqa: E402


def texts(n: int, length: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = WORDS.split()
    return [" ".join(rng.choice(words, length - 2)) for _ in range(n)]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--inputs", type=int, default=64)
    ap.add_argument("-l", "--length", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-b", "--batch", type=int, default=2048, help="tokens per decode (both sides)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp with flash attention")
    args = ap.parse_args()
    shape = dict(n_embd=384, n_head=12, n_ff=1536, n_layer=args.layers, n_ctx_train=512)
    inputs = texts(args.inputs, args.length)
    n_tok = args.inputs * args.length
    print(f"system: {pi.system_info()}")
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
        print("llama_cpp not installed: ours only")
    with tempfile.TemporaryDirectory() as d:
        for dt in args.types.split(","):
            path = write_bert_model(Path(d) / f"bge-small-{dt}.gguf", "bert", dtype=dt, shape=shape, pooling=1)[0]
            model = pi.Model(path)
            toks = [model.tokenizer.encode(t) for t in inputs]
            assert all(len(t) == args.length for t in toks), {len(t) for t in toks}
            emb = Embedder(model, n_ctx=args.batch, n_batch=args.batch, n_seq_max=64, n_threads=args.threads)
            emb.embed_tokens(toks[:2], pooling="mean")                        # warm up
            ll = None
            if llama_cpp is not None:
                ll = llama_cpp.Llama(str(path), embedding=True, pooling_type=1, n_ctx=args.batch, n_batch=args.batch,
                                     n_ubatch=args.batch, n_threads=args.threads, n_threads_batch=args.threads,
                                     flash_attn=args.flash_attn, verbose=False)
                assert ll.tokenize(inputs[0].encode(), add_bos=True) == toks[0]
                ll.embed(inputs[:2])
            t_ours, t_ll = [], []
            for _ in range(args.reps):      # alternating, so both see the same machine (medians reported)
                t, ours = timed(lambda: emb.embed_tokens(toks, pooling="mean"))
                t_ours.append(t)
                if ll is not None:
                    t, theirs = timed(lambda: ll.embed(inputs, normalize=True))
                    t_ll.append(t)
            mo = float(np.median(t_ours))
            line = f"{dt}: ours {n_tok / mo:8.1f} tokens/s ({mo * 1e3:7.1f} ms)"
            if ll is not None:
                ml = float(np.median(t_ll))
                cos = min(float(np.dot(a, b)) for a, b in zip(ours, np.array(theirs)))
                line += (f" | llama.cpp {n_tok / ml:8.1f} tokens/s ({ml * 1e3:7.1f} ms) | ratio "
                         f"{ml / mo:.2f}x | min cosine {cos:.6f}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
