"""Perplexity the way llama.cpp's `perplexity` computes it, and KL divergence against a saved base run.

    >>> from powerinfer.perplexity import perplexity
    >>> r = perplexity(model, open("wiki.test.raw").read(), n_ctx=512)
    >>> print(f"PPL = {r.ppl:.4f} +/- {r.stderr:.5f}")

Method (llama.cpp, and PowerInfer's fork of it):

* The whole text is tokenized once, with BOS when the vocabulary adds one (SPM). At least 2*n_ctx
  tokens are needed.
* It is cut into n_chunk = n_tokens // n_ctx windows of n_ctx tokens (``chunks`` caps them). For each
  window the KV cache is cleared, the window's first token is replaced by BOS (when the vocabulary
  adds one) and the window is evaluated from position 0 (in n_batch pieces).
* Only the second half is scored: rows first = n_ctx/2 .. n_ctx-2 predict the next token, so each
  window contributes n_ctx - 1 - n_ctx/2 negative log-likelihoods (float64 log-softmax).
* PPL = exp(mean NLL); its error is PPL * sqrt(var(NLL) / (count - 1)) with var = E[NLL^2] - E[NLL]^2
  (llama.cpp's "+/-"). ``per_chunk`` holds the running estimate after each window, as printed
  ``[1]x.xxxx,[2]...``.

KL divergence (``save_kld=FILE`` on a base run, typically dense; ``kld_base=FILE`` on the run to compare,
typically sparse). The base file holds, per scored position, the log-softmax over the whole
vocabulary in float16 (so 2 * n_vocab bytes per scored token: n_chunk * (n_ctx/2 - 1) * n_vocab * 2
bytes in all, e.g. ~1.3 GB for 80 windows of 512 with a 32k vocabulary), plus the exact base NLL of
each target and the exact base argmax, and the evaluated tokens (a comparison run needs no text).
Layout, little-endian:

    bytes 0-7     magic b"PIKLD\\0\\0\\1" (format version 1)
    bytes 8-11    uint32 H, length of the JSON header
    bytes 12-     JSON header: n_ctx, n_vocab, n_chunk, first, n_scored (per chunk), add_bos, bos_id,
                  model, sparse, sparse_threshold, and "sections": {name: [offset, dtype, shape]},
                  offsets counted from the data start, the first multiple of 64 after the header
    sections      (64-byte aligned) tokens int32 [n_chunk*n_ctx]; nll float64 [n_chunk, n_scored];
                  top1 int32 [n_chunk, n_scored]; logprobs float16 [n_chunk, n_scored, n_vocab]
                  (clamped to >= -65504)

The comparison rounds its own log-softmax to float16 the same way and renormalises both rows, so a
run compared with itself gives exactly KLD 0 and 100% top-1 agreement; KL(base || this) =
sum_v p_base(v) * (log p_base(v) - log p_this(v)). The PPL ratio (this/base) is exp(mean(nll_this -
nll_base)) with the exact NLLs, its error ratio * stderr(nll_this - nll_base).
"""
from __future__ import annotations

import json
import math
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .context import Context
from .model import Model

__all__ = ["perplexity", "PerplexityResult", "KLDResult", "KLDBase", "read_kld_base", "log_softmax"]

KLD_MAGIC = b"PIKLD\x00\x00\x01"
_F16_MIN = float(np.finfo(np.float16).min)     # -65504


# --------------------------------------------------------------------------------------- results
@dataclass
class KLDResult:
    """Comparison of a run with a saved base run, over the same scored tokens."""
    n: int                       # scored tokens compared
    mean: float                  # mean KL(base || this), nats
    stderr: float                # its standard error
    median: float
    p99: float
    max: float
    top1: float                  # fraction of tokens whose argmax agrees with the base's
    top1_stderr: float
    ppl_ratio: float             # PPL(this) / PPL(base)
    ppl_ratio_stderr: float
    ln_ppl_ratio: float          # mean(nll_this - nll_base)
    ln_ppl_ratio_stderr: float
    base_ppl: float
    kld: np.ndarray = field(repr=False, default=None)   # per-token KLD [n_chunk, n_scored]


@dataclass
class PerplexityResult:
    ppl: float                   # exp(mean NLL) over every scored token
    stderr: float                # llama.cpp's +/- : ppl * sqrt(var(NLL)/(count-1)); nan when var <= 0
    per_chunk: list[float]       # running PPL estimate after each window ([1], [2], ... as printed)
    n_tokens: int                # tokens in the input
    n_chunks: int                # windows evaluated
    n_ctx: int
    n_scored: int                # scored tokens in all (count)
    nll_mean: float
    nll_stderr: float            # sqrt(var(NLL)/(count-1)); nan when var <= 0
    chunk_ppl: list[float] = field(default_factory=list)    # each window's own PPL
    token_nll: np.ndarray = field(repr=False, default=None)  # [n_chunks, n_ctx-1-first] float64
    logits: list[np.ndarray] | None = field(repr=False, default=None)  # per window [n_scored, n_vocab], if kept
    kld: KLDResult | None = None
    seconds: float = 0.0


# -------------------------------------------------------------------------------------- helpers
_BLOCK_ROWS = 4   # rows per block of the row-wise helpers: their float64 temporaries stay in a core's cache


def _by_row_blocks(n_rows: int, work: Callable[[int, int], None]) -> None:
    """work(i0, i1) over blocks of _BLOCK_ROWS rows, on up to 8 threads (numpy releases the GIL). A 255 x 262144
    float64 temporary (Gemma 3's vocabulary) costs more in page faults than its arithmetic: whole-array log-softmax
    took 2-5 s a window, in blocks 0.15 s. Each row's result does not depend on the split."""
    threads = max(1, min(os.cpu_count() or 1, 8, -(-n_rows // _BLOCK_ROWS)))

    def run(t: int) -> None:
        for i in range(t * _BLOCK_ROWS, n_rows, threads * _BLOCK_ROWS):
            work(i, min(n_rows, i + _BLOCK_ROWS))
    if threads == 1:
        run(0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads)))


def _log_softmax_rows(x: np.ndarray, out: np.ndarray) -> None:
    """out = x - max - log(sum(exp(x - max))) row-wise, in float64 (x: f16, f32 or f64 rows)."""
    np.subtract(x, np.max(x, axis=-1, keepdims=True), out=out, dtype=np.float64)
    out -= np.log(np.sum(np.exp(out), axis=-1, keepdims=True))


def _rows_2d(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype not in (np.float16, np.float32, np.float64):
        a = a.astype(np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a


def decode_window(ctx, tokens: np.ndarray, i: int, n_ctx: int, bos_id: int | None, mask: np.ndarray) -> None:
    """Window i of the text (tokens [i n_ctx, (i + 1) n_ctx)) decoded on a cleared cache, its first token replaced by
    BOS where bos_id is given (llama-perplexity's windows), logits where mask is set."""
    window = tokens[i * n_ctx:(i + 1) * n_ctx].copy()
    if bos_id is not None:
        window[0] = bos_id
    ctx.kv_clear()
    ctx.decode(window, pos=range(n_ctx), seq_id=0, logits=mask)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    x = np.asarray(logits)
    x2 = _rows_2d(x)
    out = np.empty(x2.shape, np.float64)
    _by_row_blocks(x2.shape[0], lambda i0, i1: _log_softmax_rows(x2[i0:i1], out[i0:i1]))
    return out.reshape(x.shape)


def _to_f16_logprobs(lp: np.ndarray) -> np.ndarray:
    out = np.empty(lp.shape, np.float16)
    _by_row_blocks(lp.shape[0], lambda i0, i1: np.maximum(lp[i0:i1], _F16_MIN, out=out[i0:i1], casting="unsafe"))
    return out


def _kld_rows(base_lp16: np.ndarray, lp16: np.ndarray) -> np.ndarray:
    """KL(base || this) of each row of two float16 log-prob arrays [rows, n_vocab], both renormalised in float64."""
    kld = np.empty(lp16.shape[0], np.float64)

    def work(i0: int, i1: int) -> None:
        lp_b, lp_t = (np.empty((i1 - i0, lp16.shape[1]), np.float64) for _ in range(2))
        _log_softmax_rows(base_lp16[i0:i1], lp_b)
        _log_softmax_rows(lp16[i0:i1], lp_t)
        p_b = np.exp(lp_b)
        with np.errstate(invalid="ignore"):
            terms = np.where(p_b > 0, p_b * (lp_b - lp_t), 0.0)
        kld[i0:i1] = np.maximum(terms.sum(axis=1), 0.0)
    _by_row_blocks(lp16.shape[0], work)
    return kld


def _mean_stderr(x: np.ndarray) -> tuple[float, float]:
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    n = x.size
    mean = float(x.mean()) if n else float("nan")
    if n < 2:
        return mean, float("nan")
    var = float(np.mean(x * x)) - mean * mean
    return mean, math.sqrt(var / (n - 1)) if var > 0 else (0.0 if var == 0 else float("nan"))


def _resolve(model_or_ctx, n_ctx: int, n_batch: int, n_threads, sparse_threshold, dense) -> tuple[Context, Model]:
    obj = model_or_ctx
    if isinstance(obj, (str, os.PathLike)):
        obj = Model(obj)
    if not isinstance(obj, (Model, Context)) and hasattr(obj, "ctx"):      # PowerInfer-like objects
        obj = obj.ctx
    if isinstance(obj, Context):
        if obj.n_ctx < n_ctx:
            raise ValueError(f"the context holds {obj.n_ctx} tokens, fewer than n_ctx = {n_ctx}")
        return obj, obj.model
    if isinstance(obj, Model):
        return Context(obj, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                       sparse_threshold=sparse_threshold, dense=dense), obj
    raise TypeError(f"perplexity: expected a Model, a Context or a model path, got {type(model_or_ctx).__name__}")


# ------------------------------------------------------------------------------------ KLD base file
class KLDBase:
    """A saved base run (see the module docstring), memory-mapped."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                head = f.read(12)
                if len(head) < 12 or head[:8] != KLD_MAGIC:
                    raise ValueError(f"{self.path}: not a PowerInfer KL-divergence base file "
                                     "(write one with --kl-divergence-base FILE and no --kl-divergence)")
                (hlen,) = struct.unpack("<I", head[8:12])
                self.header = json.loads(f.read(hlen).decode("utf-8"))
        except OSError as e:
            raise ValueError(f"cannot read KL-divergence base {self.path}: {e.strerror or e}") from None
        h = self.header
        self.n_ctx, self.n_vocab, self.n_chunk = int(h["n_ctx"]), int(h["n_vocab"]), int(h["n_chunk"])
        self.first, self.n_scored = int(h["first"]), int(h["n_scored"])
        size = self.path.stat().st_size
        data_start = (12 + hlen + 63) // 64 * 64
        self._arrays = {}
        for name, (rel, dtype, shape) in h["sections"].items():
            off = data_start + rel
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if off + nbytes > size:
                raise ValueError(f"{self.path}: file is truncated ({size} bytes, section {name} ends at "
                                 f"{off + nbytes})")
            self._arrays[name] = np.memmap(self.path, dtype=dtype, mode="r", offset=off, shape=tuple(shape))

    @property
    def tokens(self) -> np.ndarray:
        return self._arrays["tokens"]

    def chunk(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(nll [n_scored], top1 [n_scored], logprobs float16 [n_scored, n_vocab]) of window i."""
        a = self._arrays
        return a["nll"][i], a["top1"][i], a["logprobs"][i]


def read_kld_base(path) -> KLDBase:
    return KLDBase(path)


class _KLDWriter:
    """Writes a base file to PATH.tmp window by window and renames it when complete."""

    def __init__(self, path, header: dict, tokens: np.ndarray):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        n_chunk, n_scored, n_vocab = header["n_chunk"], header["n_scored"], header["n_vocab"]
        specs = [("tokens", "<i4", [n_chunk * header["n_ctx"]]), ("nll", "<f8", [n_chunk, n_scored]),
                 ("top1", "<i4", [n_chunk, n_scored]), ("logprobs", "<f2", [n_chunk, n_scored, n_vocab])]
        sections: dict = {}
        off = 0
        for name, dt, shape in specs:
            off = (off + 63) // 64 * 64
            sections[name] = [off, dt, shape]
            off += int(np.prod(shape)) * np.dtype(dt).itemsize
        blob = json.dumps({**header, "sections": sections}).encode()
        self.data_start = (12 + len(blob) + 63) // 64 * 64
        self.sections = sections
        self.f = open(self.tmp, "wb")
        self.f.write(KLD_MAGIC + struct.pack("<I", len(blob)) + blob)
        self.f.truncate(self.data_start + off)
        self._put("tokens", 0, np.asarray(tokens, dtype="<i4"))

    def _put(self, name: str, index_bytes: int, arr: np.ndarray) -> None:
        self.f.seek(self.data_start + self.sections[name][0] + index_bytes)
        self.f.write(np.ascontiguousarray(arr).tobytes())

    def write_chunk(self, i: int, nll: np.ndarray, top1: np.ndarray, lp16: np.ndarray) -> None:
        n_scored = nll.shape[0]
        self._put("nll", i * n_scored * 8, nll.astype("<f8"))
        self._put("top1", i * n_scored * 4, top1.astype("<i4"))
        self._put("logprobs", i * lp16.size * 2, lp16.astype("<f2"))

    def finish(self) -> None:
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        try:
            self.f.close()
            self.tmp.unlink()
        except OSError:
            pass


# ------------------------------------------------------------------------------------- perplexity
def perplexity(model_or_ctx, text: str | Sequence[int] | None, n_ctx: int = 512, n_batch: int = 512,
               chunks: int = -1, progress: Callable[[int, int, float, float], None] | None = None, *,
               n_threads: int | None = None, sparse_threshold: float | None = None, dense: bool = False,
               keep_logits: bool = False, save_kld: str | os.PathLike | None = None,
               kld_base: str | os.PathLike | KLDBase | None = None) -> PerplexityResult:
    """Perplexity of `text` (a string, or token ids used as they are) with llama.cpp's method.

    model_or_ctx: a Model (a Context of n_ctx/n_batch is made), a Context (with room for n_ctx
    tokens), or a model path. chunks: at most this many windows (<= 0: all). progress(i, n_chunk,
    running_ppl, seconds_for_window_i) is called after each window (i from 1). keep_logits keeps the
    scored rows' logits in the result. save_kld writes a KL-divergence base file of this run;
    kld_base compares this run with one (text may then be None: the base's tokens are used).
    """
    if save_kld is not None and kld_base is not None:
        raise ValueError("save_kld and kld_base exclude each other")
    base = kld_base if isinstance(kld_base, KLDBase) or kld_base is None else KLDBase(kld_base)
    if base is not None and base.n_ctx != n_ctx:
        raise ValueError(f"the KL-divergence base was computed with n_ctx = {base.n_ctx}, not {n_ctx}")
    n_ctx = int(n_ctx)
    first = n_ctx // 2
    n_scored_chunk = n_ctx - 1 - first
    if n_scored_chunk < 1:
        raise ValueError(f"n_ctx = {n_ctx} is too small (at least 3)")
    ctx, model = _resolve(model_or_ctx, n_ctx, n_batch, n_threads, sparse_threshold, dense)
    tok = model.tokenizer
    n_vocab = model.n_vocab
    if base is not None and base.n_vocab != n_vocab:
        raise ValueError(f"the KL-divergence base has a vocabulary of {base.n_vocab}, this model {n_vocab}")

    if text is None:
        if base is None:
            raise ValueError("perplexity: no text")
        tokens = np.asarray(base.tokens, dtype=np.int64)
    elif isinstance(text, str):
        tokens = np.asarray(tok.encode(text, add_special=True), dtype=np.int64)
    else:
        tokens = np.asarray(list(text), dtype=np.int64).reshape(-1)
    n_tokens = len(tokens)
    if n_tokens < 2 * n_ctx and not (text is None and n_tokens >= n_ctx):   # a KL base holds the windows it scored
        raise ValueError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                         f"{n_ctx}; the input tokenizes to only {n_tokens} tokens")
    n_chunk = n_tokens // n_ctx
    if chunks is not None and chunks > 0:
        n_chunk = min(n_chunk, int(chunks))
    if base is not None:
        n_chunk = min(n_chunk, base.n_chunk)
        if not np.array_equal(tokens[:n_chunk * n_ctx], np.asarray(base.tokens[:n_chunk * n_ctx])):
            raise ValueError("the text does not tokenize to the tokens of the KL-divergence base run")
    add_bos = bool(tok.add_bos and tok.bos_id is not None)

    writer = None
    if save_kld is not None:
        writer = _KLDWriter(save_kld, {
            "format": "powerinfer-kld", "version": 1, "n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk,
            "first": first, "n_scored": n_scored_chunk, "add_bos": add_bos, "bos_id": tok.bos_id,
            "model": str(getattr(model, "path", "")), "sparse": bool(ctx.sparse),
            "sparse_threshold": float(ctx.sparse_threshold)}, tokens[:n_chunk * n_ctx])

    mask = np.zeros(n_ctx, dtype=np.int8)
    mask[first:n_ctx - 1] = 1
    token_nll = np.zeros((n_chunk, n_scored_chunk), dtype=np.float64)
    kld_rows, top1_rows, dnll_rows = [], [], []
    per_chunk, chunk_ppl, kept = [], [], []
    nll_sum = nll2_sum = 0.0
    count = 0
    t_all = time.perf_counter()
    try:
        for i in range(n_chunk):
            t0 = time.perf_counter()
            decode_window(ctx, tokens, i, n_ctx, tok.bos_id if add_bos else None, mask)
            logits = np.stack([ctx.logits(r) for r in range(first, n_ctx - 1)])
            ctx.kv_clear()
            targets = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]
            lp = log_softmax(logits)
            nll = -lp[np.arange(n_scored_chunk), targets]
            token_nll[i] = nll
            nll_sum += float(nll.sum())
            nll2_sum += float((nll * nll).sum())
            count += n_scored_chunk
            per_chunk.append(math.exp(nll_sum / count))
            chunk_ppl.append(math.exp(float(nll.mean())))
            if keep_logits:
                kept.append(logits)
            top1 = np.argmax(logits, axis=1)
            lp16 = _to_f16_logprobs(lp) if writer is not None or base is not None else None
            if writer is not None:
                writer.write_chunk(i, nll, top1, lp16)
            if base is not None:
                b_nll, b_top1, b_lp16 = base.chunk(i)
                kld_rows.append(_kld_rows(np.asarray(b_lp16), lp16))
                top1_rows.append(top1 == np.asarray(b_top1))
                dnll_rows.append(nll - np.asarray(b_nll, dtype=np.float64))
            if progress is not None:
                progress(i + 1, n_chunk, per_chunk[-1], time.perf_counter() - t0)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        writer.finish()

    nll_mean = nll_sum / count
    var = nll2_sum / count - nll_mean * nll_mean
    nll_se = math.sqrt(var / (count - 1)) if var > 0 and count > 1 else float("nan")
    ppl = math.exp(nll_mean)
    res = PerplexityResult(ppl=ppl, stderr=ppl * nll_se, per_chunk=per_chunk, n_tokens=n_tokens, n_chunks=n_chunk,
                           n_ctx=n_ctx, n_scored=count, nll_mean=nll_mean, nll_stderr=nll_se, chunk_ppl=chunk_ppl,
                           token_nll=token_nll, logits=kept if keep_logits else None,
                           seconds=time.perf_counter() - t_all)
    if base is not None:
        kld = np.stack(kld_rows)
        agree = np.concatenate(top1_rows).astype(np.float64)
        dnll = np.concatenate(dnll_rows)
        k_mean, k_se = _mean_stderr(kld)
        t1 = float(agree.mean())
        n = agree.size
        t1_se = math.sqrt(t1 * (1 - t1) / (n - 1)) if n > 1 else float("nan")
        ln_r, ln_r_se = _mean_stderr(dnll)
        base_nll = nll_mean - ln_r
        flat = kld.reshape(-1)
        res.kld = KLDResult(n=int(flat.size), mean=k_mean, stderr=k_se, median=float(np.median(flat)),
                            p99=float(np.percentile(flat, 99)), max=float(flat.max()), top1=t1, top1_stderr=t1_se,
                            ppl_ratio=math.exp(ln_r), ppl_ratio_stderr=math.exp(ln_r) * ln_r_se,
                            ln_ppl_ratio=ln_r, ln_ppl_ratio_stderr=ln_r_se, base_ppl=math.exp(base_nll), kld=kld)
    return res
