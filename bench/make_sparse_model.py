#!/usr/bin/env python3
"""Write a benchmark-shaped ReLU-LLaMA PowerInfer (PWRI) model with random weights and a
*planted* predictor whose selected neuron set has a chosen size and a power-law skew.

    python bench/make_sparse_model.py /tmp/7b.powerinfer.gguf --preset 7b --dtype q4_0 \\
        --rank 1024 --active 0.10 --alpha 1.0 --seed 0 --dense-out /tmp/7b.dense.gguf

Shapes: ``--preset 7b`` (n_vocab 32000, n_embd 4096, n_ff 11008, 32 heads, 32 layers,
rank 1024), ``--preset small`` (n_embd 1024, n_ff 2816, 8 heads, 8 layers, rank 256) for quick
checks, ``--preset tiny`` for tests.

Weights
-------
Attention, ``ffn_up``, ``ffn_down_t``, embeddings and the output head are random valid
blocks (``tools/make_test_model.py``'s ``--random-blocks`` generator, same per-name RNG
streams), written in bounded chunks. ``ffn_down_t`` has ne [n_embd, n_ff] (row i = output
vector of neuron i). The predictor ``fc1`` [n_embd, r] / ``fc2`` [r, n_ff] is Q4_0 and
built block by block so that its arithmetic is exact where it matters:

* ``fc1`` rows come in pairs (+w, -w) (the second row is the first with its fp16 block
  scales negated, an exact negation in Q4_0), so relu(w.x) - relu(-w.x) = w.x and
  relu(w.x) + relu(-w.x) = |w.x|.
* The first ``--mag-blocks`` blocks of 32 hidden units (16 pairs each, directions v_k) are
  the *magnitude* units: m(x) = sum_k |v_k.x| > 0, a per-token positive scale (a sum of
  many half-normals, so it varies little from token to token).
* The remaining K = (r - 32*mag_blocks)/2 pairs (directions w_k) are *linear* units.
* Row i of ``fc2``: its magnitude blocks hold -b_i in every slot (nibbles 0, fp16 scale
  b_i/8: exact up to the fp16 rounding of the scale); its other blocks hold pairs (c, -c),
  c = d*q with q in -7..7, so the linear part is u_i.x with u_i = sum_k c_ik w_k.

  score_i(x) = u_i.x - b_i m(x)

  Both terms scale with |x|, so the selection does not depend on the residual's size. For
  isotropic x, u_i.x ~ N(0, |u_i|^2 s^2) independent of m, so P(score_i >= 0) =
  E_m[Phi_bar(b_i m / (|u_i| s))]; b_i is found by inverting that function (tabulated from
  samples of m drawn with the exact Gram matrix of the quantized v_k) so that neuron i
  fires with the planted probability p_i.
* p_i: a power law p ~ rank^-alpha, capped at --p-max, scaled so that mean(p) = --active,
  then shuffled over the neurons of each layer (--no-shuffle keeps the hottest first).
* ``ffn_gate`` row i is (by default) u_i / ffn_norm (normalised, then quantized), so
  gate_i.rmsnorm(x) has the sign of u_i.x: a selected neuron with b_i >= 0 really fires
  (ReLU(gate) > 0), as in a real ReLU model where the predictor finds firing neurons.
  --independent-gate uses random gate rows instead (then about half of the selected
  neurons have h = 0).

The residual of a random model is not exactly isotropic, so the achieved fraction is then
measured on the real engine (``--calibrate N``: decode a batch of random tokens with
powerinfer, read ctx.sparse_stats(), rescale each layer's design mean, and patch the fp16
scales of the fc2 magnitude blocks in place; repeat N times) and reported per layer.

``--dense-out FILE`` writes the equivalent dense GGUF (magic GGUF, ``ffn_down`` [n_ff, n_embd]
= the transpose of ``ffn_down_t`` re-quantized, no predictors, ``powerinfer.ffn_activation`` =
relu): every other tensor is byte-identical, so llama.cpp and the engine's dense path run
the same shape and (up to the re-quantization of ffn_down) the same model.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
for _p in (_ROOT / "tools", _ROOT / "bindings"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import gguf
import make_test_model as mtm

QK = 32
Q4_BYTES = 18

PRESETS = {
    "7b": dict(n_vocab=32000, n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, n_layer=32,
               n_ctx_train=4096, rank=1024),
    "small": dict(n_vocab=32000, n_embd=1024, n_ff=2816, n_head=8, n_head_kv=8, n_layer=8,
                  n_ctx_train=2048, rank=256),
    "tiny": dict(n_vocab=320, n_embd=128, n_ff=352, n_head=4, n_head_kv=4, n_layer=2,
                 n_ctx_train=512, rank=128),
}


# --------------------------------------------------------------------------------------
# quantization helpers
# --------------------------------------------------------------------------------------
def _c_lib():
    try:
        from powerinfer._ffi import ffi, lib
        return ffi, lib
    except Exception:   # noqa: BLE001 - the C library is optional here
        return None, None


def quantize(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 (rows, n) -> raw bytes (rows, row_bytes). Uses the C quantizer when the library is
    built (byte-identical with the numpy reference, ~10x faster), else powerinfer.quants."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    ffi, lib = _c_lib()
    qt = {"q4_0": 2, "q8_0": 8}.get(dtype)
    if lib is not None and qt is not None:
        rb = mtm._row_bytes(dtype, x.shape[-1])
        out = np.empty((x.shape[0], rb), dtype=np.uint8)
        st = lib.pi_quantize_row(qt, ffi.from_buffer("float[]", x), ffi.from_buffer(out), x.size)
        if st == 0:
            return out
    return np.ascontiguousarray(mtm.encode(x, dtype)).view(np.uint8).reshape(x.shape[0], -1)


def dequantize(raw: np.ndarray, dtype: str, n: int) -> np.ndarray:
    from powerinfer import quants
    return quants.dequantize(np.ascontiguousarray(raw).reshape(-1, mtm._row_bytes(dtype, n)), dtype).reshape(-1, n)


def _q4_scales(raw: np.ndarray) -> np.ndarray:
    """(rows, nblocks) fp16 scales of Q4_0 rows (a view)."""
    rows = raw.shape[0]
    return raw.reshape(rows, -1, Q4_BYTES)[:, :, :2].copy().view(np.float16).reshape(rows, -1)


def _q4_values(raw: np.ndarray) -> np.ndarray:
    """(rows, n) float32 values of Q4_0 rows."""
    rows = raw.shape[0]
    b = raw.reshape(rows, -1, Q4_BYTES)
    d = b[:, :, :2].copy().view(np.float16).astype(np.float32)          # (rows, nb, 1)
    qs = b[:, :, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.float32) - 8.0
    return (q * d).reshape(rows, -1)


def _random_q4_rows(rng: np.random.Generator, rows: int, n: int, scale: float) -> np.ndarray:
    """Random Q4_0 rows: uniform nibbles, fp16 scale of random sign, |value| std ~ scale."""
    nb = rows * (n // QK)
    blocks = np.frombuffer(rng.bytes(nb * Q4_BYTES), dtype=np.uint8).reshape(nb, Q4_BYTES).copy()
    mag = (rng.random(nb, dtype=np.float32) + np.float32(0.5)) * np.float32(scale / 4.61)
    sign = np.where(rng.random(nb) < 0.5, np.float32(-1), np.float32(1))
    blocks[:, :2] = (mag * sign).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def _negate_q4(raw: np.ndarray) -> np.ndarray:
    """Exact negation of Q4_0 rows: flip the sign bit of every fp16 scale."""
    out = raw.copy()
    rows = out.shape[0]
    b = out.reshape(rows, -1, Q4_BYTES)
    b[:, :, 1] ^= 0x80
    return out


# --------------------------------------------------------------------------------------
# firing-rate model
# --------------------------------------------------------------------------------------
def firing_rates(n_ff: int, active: float, alpha: float, p_max: float) -> np.ndarray:
    """Sorted (hottest first) per-neuron firing probabilities: min(p_max, c * rank^-alpha) with c
    chosen so that the mean is `active`."""
    if not 0.0 < active < p_max <= 1.0:
        raise ValueError(f"need 0 < active ({active}) < p_max ({p_max}) <= 1")
    base = np.arange(1, n_ff + 1, dtype=np.float64) ** (-float(alpha))
    lo, hi = 0.0, 1.0
    while np.minimum(p_max, hi * base).mean() < active:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.minimum(p_max, mid * base).mean() < active:
            lo = mid
        else:
            hi = mid
    return np.minimum(p_max, hi * base)


def _erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function (Numerical Recipes erfcc, relative error < 1.2e-7)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    r = t * np.exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277)))))))))
    return np.where(x >= 0, r, 2.0 - r)


def phi_bar(x: np.ndarray) -> np.ndarray:
    return 0.5 * _erfc(x / math.sqrt(2.0))


class SelectionModel:
    """P(u.x >= b m(x)) for isotropic x, as a function of t = b * mean(m) / |u|:
    p(t) = E[Phi_bar(t * m / mean(m))]; inverted by table lookup."""

    def __init__(self, gram_v: np.ndarray, rng: np.random.Generator, n_samples: int = 8192):
        L = np.linalg.cholesky(gram_v.astype(np.float64) + 1e-12 * np.eye(len(gram_v)))
        z = rng.standard_normal((n_samples, len(gram_v))) @ L.T
        m = np.abs(z).sum(axis=1)
        self.mean_m = float(m.mean())
        self.cv_m = float(m.std() / m.mean())
        mh = m / self.mean_m
        self.t = np.concatenate([np.linspace(0.0, 4.0, 801), np.linspace(4.0, 12.0, 401)[1:]])
        self.p = np.array([phi_bar(tt * mh).mean() for tt in self.t])   # decreasing, p(0) = 0.5

    def t_of_p(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        q = np.where(p <= 0.5, p, 1.0 - p)
        q = np.clip(q, self.p[-1], 0.5)
        t = np.interp(q, self.p[::-1], self.t[::-1])
        return np.where(p <= 0.5, t, -t)

    def p_of_t(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        p = np.interp(np.abs(t), self.t, self.p)
        return np.where(t >= 0, p, 1.0 - p)


# --------------------------------------------------------------------------------------
# one layer's planted predictor (+ gate)
# --------------------------------------------------------------------------------------
class LayerPredictor:
    def __init__(self, *, il: int, seed: int, n_embd: int, n_ff: int, rank: int, mag_blocks: int,
                 active: float, alpha: float, p_max: float, shuffle: bool):
        if rank % QK or n_embd % QK:
            raise ValueError("rank and n_embd must be multiples of 32")
        n_mag = mag_blocks * QK // 2
        K = (rank - mag_blocks * QK) // 2
        if mag_blocks < 1 or K < QK // 2:
            raise ValueError(f"rank {rank} too small for {mag_blocks} magnitude block(s) + 1 linear block")
        self.il, self.n_ff, self.rank, self.mag_blocks = il, n_ff, rank, mag_blocks
        self.alpha, self.p_max, self.shuffle = alpha, p_max, shuffle
        rng = np.random.default_rng([seed, 0x5EED, il])
        # fc1: [+v_1, -v_1, ..., +v_M, -v_M, +w_1, -w_1, ...] (rows of n_embd)
        pos = _random_q4_rows(rng, n_mag + K, n_embd, 1.0 / math.sqrt(n_embd))
        neg = _negate_q4(pos)
        fc1 = np.empty((rank, pos.shape[1]), dtype=np.uint8)
        fc1[0::2] = pos
        fc1[1::2] = neg
        self.fc1 = fc1
        vals = _q4_values(pos)
        V, W = vals[:n_mag].astype(np.float64), vals[n_mag:]
        self.sel = SelectionModel(V @ V.T, rng)
        # fc2 linear blocks: pairs (c, -c), c = d*q, q uniform in -7..7
        n_lin_blocks = rank // QK - mag_blocks
        q = rng.integers(-7, 8, size=(n_ff, n_lin_blocks, QK // 2)).astype(np.int8)
        d = ((rng.random((n_ff, n_lin_blocks), dtype=np.float32) + np.float32(0.5))
             * np.float32(1.0 / (math.sqrt(rank) * 4.32))).astype(np.float16)
        elems = np.empty((n_ff, n_lin_blocks, QK), dtype=np.uint8)     # nibble values 1..15
        elems[:, :, 0::2] = (q + 8).astype(np.uint8)
        elems[:, :, 1::2] = (8 - q).astype(np.uint8)
        lin = np.empty((n_ff, n_lin_blocks, Q4_BYTES), dtype=np.uint8)
        lin[:, :, :2] = d.view(np.uint8).reshape(n_ff, n_lin_blocks, 2)
        lin[:, :, 2:] = elems[:, :, :16] | (elems[:, :, 16:] << 4)
        self.fc2 = np.empty((n_ff, rank // QK, Q4_BYTES), dtype=np.uint8)
        self.fc2[:, mag_blocks:] = lin
        self.fc2[:, :mag_blocks, 2:] = 0                                  # nibble 0 -> value -8*d
        # u_i = sum_k c_ik w_k: C[i, k] = d * q (block-major: pair k = block*16 + j)
        C = (q.astype(np.float32) * d.astype(np.float32)[:, :, None]).reshape(n_ff, K)
        self.U = C @ W                                                    # (n_ff, n_embd) float32
        self.u_norm = np.linalg.norm(self.U.astype(np.float64), axis=1)
        # planted firing probabilities
        self.perm = rng.permutation(n_ff) if shuffle else np.arange(n_ff)
        self.design_active = active
        self.set_active(active)

    def set_active(self, design_active: float) -> None:
        """(Re)compute the per-neuron rates for a design mean and the magnitude weights b_i."""
        self.design_active = float(design_active)
        p_sorted = firing_rates(self.n_ff, self.design_active, self.alpha, self.p_max)
        self.p = np.empty(self.n_ff)
        self.p[self.perm] = p_sorted
        t = self.sel.t_of_p(self.p)
        self.b = t * self.u_norm / self.sel.mean_m                         # score = u.x - b m
        scales = (self.b / 8.0).astype(np.float16)
        self.fc2[:, :self.mag_blocks, :2] = scales.view(np.uint8).reshape(self.n_ff, 1, 2)

    def fc2_scale_bytes(self) -> np.ndarray:
        return self.fc2[:, :self.mag_blocks, :2].copy()

    def gate_rows(self, norm_w: np.ndarray) -> np.ndarray:
        """gate row i = (u_i / ffn_norm) / |.| * 1  (element std ~ 1/sqrt(n_embd))."""
        g = self.U / norm_w[None, :].astype(np.float32)
        g /= np.linalg.norm(g, axis=1, keepdims=True).astype(np.float32) + np.float32(1e-30)
        return g

    def expected_gate_positive(self) -> float:
        """Expected fraction of selected (neuron, token) pairs with u.x >= 0 (ReLU(gate) > 0)."""
        return float(np.minimum(self.p, 0.5).sum() / self.p.sum())

    def simulate(self, n_samples: int, rng: np.random.Generator) -> tuple[float, np.ndarray]:
        """Monte Carlo on isotropic x with the dequantized fc1/fc2 (float math): (mean active
        fraction, per-neuron rates)."""
        fc1 = _q4_values(self.fc1)
        fc2 = _q4_values(self.fc2.reshape(self.n_ff, -1))
        x = rng.standard_normal((n_samples, fc1.shape[1])).astype(np.float32)
        h = np.maximum(x @ fc1.T, 0)
        s = h @ fc2.T
        rates = (s >= 0).mean(axis=0)
        return float(rates.mean()), rates


# --------------------------------------------------------------------------------------
# writer
# --------------------------------------------------------------------------------------
def _add_kv(w: gguf.GGUFWriter, *, dtype, n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer, n_ctx_train,
            name, extra: dict) -> None:
    tokens, scores, types = mtm.synthetic_vocab(n_vocab)
    w.add_name(name)
    w.add_file_type(mtm.DTYPES[dtype][1])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_block_count(n_layer)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_string("powerinfer.ffn_activation", "relu")
    for k, v in extra.items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, int(v))
    mtm.add_vocab(w, tokens, scores, types)


def write_models(out, *, dense_out=None, dtype="q4_0", n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer,
                 n_ctx_train, rank, active=0.10, alpha=1.0, p_max=0.95, mag_blocks=2, seed=0, shuffle=True,
                 independent_gate=False, progress=False, log=print) -> dict:
    """Write the PWRI file `out` (and the dense twin `dense_out`); returns a summary with the per-layer
    LayerPredictor objects and the file offsets of the fc2 tensors (for in-place calibration)."""
    if dtype not in ("q4_0", "q8_0"):
        raise ValueError("dtype must be q4_0 or q8_0")
    n_embd_gqa = n_embd * n_head_kv // n_head
    E = n_embd
    # unified tensor order: (name, ne, kind, files) with files a subset of {"s", "d"}
    seq = [("token_embd.weight", (E, n_vocab), "embd", "sd"), ("output_norm.weight", (E,), "norm", "sd"),
           ("output.weight", (E, n_vocab), "mat", "sd")]
    for il in range(n_layer):
        p = f"blk.{il}."
        seq += [(p + "attn_norm.weight", (E,), "norm", "sd"), (p + "attn_q.weight", (E, E), "mat", "sd"),
                (p + "attn_k.weight", (E, n_embd_gqa), "mat", "sd"), (p + "attn_v.weight", (E, n_embd_gqa), "mat", "sd"),
                (p + "attn_output.weight", (E, E), "mat", "sd"), (p + "ffn_norm.weight", (E,), "norm", "sd"),
                (p + "ffn_gate.weight", (E, n_ff), "gate", "sd"), (p + "ffn_up.weight", (E, n_ff), "mat", "sd"),
                (p + "ffn_down_t.weight", (E, n_ff), "down_t", "s"), (p + "ffn_down.weight", (n_ff, E), "down", "d"),
                (p + "fc1.weight", (E, rank), "fc1", "s"), (p + "fc2.weight", (rank, n_ff), "fc2", "s")]

    def tdtype(name, kind):
        if kind == "norm":
            return "f32"
        if kind in ("fc1", "fc2"):
            return "q4_0"
        return dtype

    extra = {"bench.sparse.active": float(active), "bench.sparse.alpha": float(alpha),
             "bench.sparse.p_max": float(p_max), "bench.sparse.seed": int(seed), "bench.sparse.rank": int(rank)}
    shape = dict(dtype=dtype, n_vocab=n_vocab, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
                 n_layer=n_layer, n_ctx_train=n_ctx_train)
    writers = {}
    paths = {"s": Path(out)}
    if dense_out:
        paths["d"] = Path(dense_out)
    for f, path in paths.items():
        w = gguf.GGUFWriter(path, "llama")
        _add_kv(w, name=f"powerinfer-bench-{'sparse' if f == 's' else 'dense'}-relu-llama-{dtype}",
                extra=extra, **shape)
        for name, ne, kind, files in seq:
            if f not in files:
                continue
            tdt = tdtype(name, kind)
            rb = mtm._row_bytes(tdt, ne[0])
            n_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
            w.add_tensor_info(name, (*reversed(ne[1:]), rb), np.dtype(np.uint8), n_rows * rb,
                              raw_dtype=mtm.DTYPES[tdt][0])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        writers[f] = w

    def put(f, data: np.ndarray):
        data = np.ascontiguousarray(data).view(np.uint8)
        data.tofile(writers[f].fout[0])

    offsets: dict[str, int] = {}
    preds: list[LayerPredictor] = []
    t0 = time.time()
    layer_cache: dict = {}
    total = 0
    for idx, (name, ne, kind, files) in enumerate(seq):
        tdt = tdtype(name, kind)
        rb = mtm._row_bytes(tdt, ne[0])
        n_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        starts = {}
        for f in files:
            if f in writers:
                w = writers[f]
                w.write_padding(w.fout[0], w.fout[0].tell())
                starts[f] = w.fout[0].tell()
        if "s" in starts:
            offsets[name] = starts["s"]
        il = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if kind in ("norm", "embd", "mat"):
            rng = mtm._tensor_rng(seed, name)
            for r0, r1 in mtm._row_chunks(n_rows, rb):
                data = mtm._random_blocks(rng, tdt, kind, ne, r0, r1)
                for f in starts:
                    put(f, data)
                if kind == "norm" and name.endswith("ffn_norm.weight"):
                    layer_cache["ffn_norm"] = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.float32)
        elif kind == "gate":
            pred = LayerPredictor(il=il, seed=seed, n_embd=n_embd, n_ff=n_ff, rank=rank, mag_blocks=mag_blocks,
                                  active=active, alpha=alpha, p_max=p_max, shuffle=shuffle)
            preds.append(pred)
            if independent_gate:
                rng = mtm._tensor_rng(seed, name)
                data = np.concatenate([mtm._random_blocks(rng, tdt, "mat", ne, r0, r1)
                                       for r0, r1 in mtm._row_chunks(n_rows, rb)])
            else:
                data = quantize(pred.gate_rows(layer_cache["ffn_norm"]), tdt)
            pred.U = None                                 # free the (n_ff, n_embd) float matrix
            for f in starts:
                put(f, data)
        elif kind == "down_t":
            rng = mtm._tensor_rng(seed, name)
            data = np.concatenate([mtm._random_blocks(rng, tdt, "mat", ne, r0, r1)
                                   for r0, r1 in mtm._row_chunks(n_rows, rb)])
            put("s", data)
            if "d" in writers:
                layer_cache["down_t"] = data
        elif kind == "down" and "d" in starts:   # the dense twin's only (without --dense-out: nothing to write)
            dt_raw = layer_cache.pop("down_t")
            vals = dequantize(dt_raw, tdt, n_embd)                 # (n_ff, n_embd)
            put("d", quantize(np.ascontiguousarray(vals.T), tdt))  # (n_embd, n_ff): ne [n_ff, n_embd]
            del vals
        elif kind == "fc1":
            put("s", preds[il].fc1)
        elif kind == "fc2":
            put("s", preds[il].fc2.reshape(n_ff, -1))
        for f, st in starts.items():
            fo = writers[f].fout[0]
            assert fo.tell() - st == n_rows * rb, (name, f, fo.tell() - st, n_rows * rb)
            writers[f].write_padding(fo, n_rows * rb)
        total += n_rows * rb
        if progress:
            print(f"\r[{idx + 1}/{len(seq)}] {total / 2**20:.0f} MiB  {time.time() - t0:.1f}s", end="",
                  file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    for w in writers.values():
        w.tensors = [{}]
        w.flush()
        w.close()
    with open(paths["s"], "r+b") as fh:
        fh.write(b"PWRI")
    return dict(path=str(paths["s"]), dense_path=str(paths.get("d", "")) or None, preds=preds, offsets=offsets,
                rank=rank, n_layer=n_layer, n_ff=n_ff, mag_blocks=mag_blocks, time_s=time.time() - t0)


def patch_fc2_scales(path, summary: dict) -> None:
    """Rewrite the fp16 scales of every fc2 magnitude block in place (after set_active)."""
    n_ff, rank, mb = summary["n_ff"], summary["rank"], summary["mag_blocks"]
    rb = rank // QK * Q4_BYTES
    mm = np.memmap(path, dtype=np.uint8, mode="r+")
    for il, pred in enumerate(summary["preds"]):
        off = summary["offsets"][f"blk.{il}.fc2.weight"]
        t = mm[off:off + n_ff * rb].reshape(n_ff, rank // QK, Q4_BYTES)
        t[:, :mb, :2] = pred.fc2_scale_bytes()
    mm.flush()
    del mm


# --------------------------------------------------------------------------------------
# measurement on the engine
# --------------------------------------------------------------------------------------
def measure_active(path, n_tokens: int = 32, n_threads: int = 2, seed: int = 0, batch: bool = True) -> np.ndarray:
    """Per-layer fraction of (neuron, token) pairs the engine computes for random tokens."""
    import powerinfer
    m = powerinfer.Model(path)
    ctx = powerinfer.Context(m, n_ctx=n_tokens + 8, n_batch=max(n_tokens, 8), n_threads=n_threads)
    rng = np.random.default_rng([seed, 77])
    toks = [1] + list(rng.integers(259, m.n_vocab, size=n_tokens - 1))
    ctx.sparse_stats_reset()
    if batch:
        ctx.decode(toks, logits="none")
    else:
        for tk in toks:
            ctx.decode([tk])
    active, total = ctx.sparse_stats()
    del ctx, m
    gc.collect()
    return active / max(total, 1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("out", help="output PWRI .gguf path")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="7b")
    ap.add_argument("--dtype", choices=["q4_0", "q8_0"], default="q4_0", help="weights (predictors are always Q4_0)")
    ap.add_argument("--rank", type=int, default=None, help="predictor rank (default: the preset's)")
    ap.add_argument("--n-layer", type=int, default=None, help="override the preset's layer count")
    ap.add_argument("--active", type=float, default=0.10, help="target mean fraction of neurons selected per token")
    ap.add_argument("--alpha", type=float, default=1.0, help="power-law exponent of the firing rates (0: uniform)")
    ap.add_argument("--p-max", type=float, default=0.95, help="cap of a neuron's firing probability")
    ap.add_argument("--mag-blocks", type=int, default=2, help="fc1 blocks of 32 hidden units used as magnitude units")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-shuffle", action="store_true", help="keep the hottest neurons first")
    ap.add_argument("--independent-gate", action="store_true", help="random gate rows (not aligned with the predictor)")
    ap.add_argument("--dense-out", default=None, help="also write the equivalent dense GGUF here")
    ap.add_argument("--calibrate", type=int, default=2,
                    help="engine calibration rounds (0: none, the analytic design only)")
    ap.add_argument("--verify-tokens", type=int, default=32, help="random tokens per engine measurement")
    ap.add_argument("--no-verify", action="store_true", help="skip all engine measurements")
    ap.add_argument("--simulate", type=int, default=0,
                    help="Monte Carlo check of layer 0 on N isotropic inputs (numpy)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args(argv)

    shape = dict(PRESETS[a.preset])
    if a.rank is not None:
        shape["rank"] = a.rank
    if a.n_layer is not None:
        shape["n_layer"] = a.n_layer
    t0 = time.time()
    s = write_models(a.out, dense_out=a.dense_out, dtype=a.dtype, active=a.active, alpha=a.alpha, p_max=a.p_max,
                     mag_blocks=a.mag_blocks, seed=a.seed, shuffle=not a.no_shuffle,
                     independent_gate=a.independent_gate, progress=a.progress, **shape)
    p0 = s["preds"][0]
    print(f"wrote {s['path']} ({os.path.getsize(s['path']) / 2**30:.2f} GiB, PWRI)"
          + (f" and {s['dense_path']} ({os.path.getsize(s['dense_path']) / 2**30:.2f} GiB, GGUF)" if s["dense_path"] else "")
          + f" in {s['time_s']:.0f}s")
    print(f"  preset={a.preset} {shape} dtype={a.dtype}")
    print(f"  planted rates: mean {p0.p.mean():.4f}, alpha {a.alpha}, p_max {a.p_max}; hottest 10% of neurons carry "
          f"{np.sort(p0.p)[::-1][: len(p0.p) // 10].sum() / p0.p.sum():.1%} of activations; "
          f"min p {p0.p.min():.4f}; magnitude m: CV {p0.sel.cv_m:.3f}")
    print(f"  expected fraction of selected pairs with ReLU(gate) > 0: "
          f"{p0.expected_gate_positive() if not a.independent_gate else 0.5:.1%}")
    if a.simulate:
        mean, rates = p0.simulate(a.simulate, np.random.default_rng([a.seed, 99]))
        corr = float(np.corrcoef(rates, p0.p)[0, 1])
        print(f"  isotropic Monte Carlo (layer 0, {a.simulate} samples): mean active {mean:.4f} "
              f"(design {p0.p.mean():.4f}), corr(rate, planted p) {corr:.3f}")
    if a.no_verify:
        return 0
    target = a.active
    for rnd in range(a.calibrate + 1):
        frac = measure_active(s["path"], n_tokens=a.verify_tokens, n_threads=a.threads, seed=a.seed)
        print(f"  engine round {rnd}: active per layer mean {frac.mean():.4f} min {frac.min():.4f} "
              f"max {frac.max():.4f}: " + " ".join(f"{f:.3f}" for f in frac))
        if rnd == a.calibrate:
            break
        for il, pred in enumerate(s["preds"]):
            f = max(float(frac[il]), 1e-4)
            new = float(np.clip(pred.design_active * target / f, 0.2 * target, min(0.5 * a.p_max, 5 * target)))
            pred.set_active(new)
        patch_fc2_scales(s["path"], s)
        print("  patched fc2 magnitude scales; design means now " +
              " ".join(f"{p.design_active:.3f}" for p in s["preds"]))
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
