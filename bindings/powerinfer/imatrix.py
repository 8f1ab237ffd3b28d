"""The importance matrix: llama.cpp's llama-imatrix (collection, its GGUF file and the legacy .dat) and what
llama-quantize reads of it (--imatrix).

    python -m powerinfer.imatrix -m model.gguf -f text.txt -o imatrix.gguf [--chunks N] [-c 512] [--process-output]

Collection (`collect`): the text is tokenized once and cut into windows of n_ctx tokens, as llama-imatrix (and
powerinfer.perplexity) cut it: per window the cache is cleared, the first token becomes BOS where the vocabulary adds
one, and the window is decoded with every row's logits wanted. Meanwhile the C core's observer (core/src/imatrix.c,
pi_imatrix_begin) sums x_j^2 per input column j of every weight matmul (batches of 16 rows or more; experts: every
routed row) and counts the rows: an entry per matrix, `sums` [n_mat, n_cols] and `counts` [n_mat]. llama-imatrix
evaluates n_batch / n_ctx windows per batch; here one window is one decode (the same rows, the float sums in another
order). The perplexity of the windows' second halves is printed as llama-imatrix prints it (--no-ppl: not computed).

Files: GGUF (the default; general.type "imatrix", imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size and per
matrix NAME.in_sum2 [n_cols, n_mat] and NAME.counts [1, n_mat], f32, names sorted) or the legacy .dat
(--output-format dat: per entry the mean x^2 times the number of chunks). `read_imatrix` reads both.

What is collected: see core/src/imatrix.c. For PowerInfer (PWRI) and gate-sparse files only the attention matrices
(their FFNs run neuron-sparse kernels, not whole-row matmuls, even with dense=True). Entries whose names are not
tensors of the file (the split views of a fused tensor) are dropped with a warning. The CPU only: -ngl other than 0
is refused.
"""
from __future__ import annotations

import argparse
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Imatrix", "ImatrixEntry", "collect", "read_imatrix", "write_imatrix", "quant_weights", "main"]

KV_DATASETS, KV_CHUNK_COUNT, KV_CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"


@dataclass
class ImatrixEntry:
    sums: np.ndarray      # float32 [n_mat, n_cols]: sum of x^2 (legacy files: mean x^2 * ncall)
    counts: np.ndarray    # int64 [n_mat]: rows summed (legacy files: [ncall])


@dataclass
class Imatrix:
    entries: dict = field(default_factory=dict)     # name -> ImatrixEntry
    datasets: list = field(default_factory=list)
    chunk_size: int = 0
    chunk_count: int = 0
    is_legacy: bool = False
    has_metadata: bool = True

    def add(self, other: "Imatrix") -> None:
        """Accumulate another matrix (llama-imatrix's load_imatrix: --in-file)."""
        cs = self.chunk_size
        for name, e in other.entries.items():
            if other.is_legacy:   # (mean * ncall) * chunk_size ~ raw sums, ncall * chunk_size ~ raw counts
                sums = e.sums.astype(np.float32) * np.float32(cs)
                counts = np.full(1, int(e.counts[0]) * cs, dtype=np.int64)
            else:
                sums, counts = e.sums, e.counts
            cur = self.entries.get(name)
            if cur is None:
                self.entries[name] = ImatrixEntry(sums.astype(np.float32).copy(), counts.astype(np.int64).copy())
                continue
            if cur.sums.size != sums.size:
                raise ValueError(f"mismatched sums size for {name}: {sums.size} != {cur.sums.size}")
            if len(cur.counts) == 1 and len(counts) > 1:
                cur.counts = np.full(len(counts), cur.counts[0], dtype=np.int64)
                cur.sums = cur.sums.reshape(len(counts), -1)
            if not other.is_legacy and len(counts) != len(cur.counts):
                raise ValueError(f"mismatched counts size for {name}: {len(counts)} != {len(cur.counts)}")
            cur.sums = (cur.sums.reshape(-1) + sums.reshape(-1)).reshape(cur.sums.shape).astype(np.float32)
            cur.counts = cur.counts + counts
        self.datasets += list(other.datasets)
        self.chunk_count = self.last_chunk()

    def last_chunk(self) -> int:
        mx = max((int(e.counts.max()) for e in self.entries.values() if len(e.counts)), default=0)
        return mx // self.chunk_size if self.chunk_size > 0 else 0


# ------------------------------------------------------------------------------------------------ files
def _gstr(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _n_dims(ne) -> int:
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return n


def write_gguf(path, im: Imatrix) -> None:
    """llama-imatrix's save_imatrix: the GGUF file gguf_write_to_file writes."""
    kvs = [_gstr("general.type") + struct.pack("<I", 8) + _gstr("imatrix"),
           _gstr(KV_DATASETS) + struct.pack("<IIQ", 9, 8, len(im.datasets)) + b"".join(_gstr(d) for d in im.datasets),
           _gstr(KV_CHUNK_COUNT) + struct.pack("<II", 4, im.chunk_count),
           _gstr(KV_CHUNK_SIZE) + struct.pack("<II", 4, im.chunk_size)]
    tensors = []
    for name in sorted(im.entries):
        e = im.entries[name]
        n_mat = len(e.counts)
        if e.sums.size == 0 or n_mat == 0:
            continue
        tensors.append((f"{name}.in_sum2", (e.sums.size // n_mat, n_mat), e.sums.astype("<f4").tobytes()))
        tensors.append((f"{name}.counts", (1, n_mat), e.counts.astype("<f4").tobytes()))
    infos, off = [], 0
    for name, ne, data in tensors:
        nd = _n_dims(ne)
        infos.append(_gstr(name) + struct.pack(f"<I{nd}QIQ", nd, *ne[:nd], 0, off))
        off += -(-len(data) // 32) * 32
    head = b"GGUF" + struct.pack("<Iqq", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % 32)
    tmp = Path(str(path) + ".part")
    with open(tmp, "wb") as f:
        f.write(head)
        for _, _, data in tensors:
            f.write(data)
            f.write(bytes(-len(data) % 32))
    os.replace(tmp, path)


def write_dat(path, im: Imatrix) -> None:
    """llama-imatrix's save_imatrix_legacy (--output-format dat): per entry (names sorted, those without data
    skipped) the mean x^2 per column times ncall = ceil(max count / chunk_size), then the chunk count and the
    dataset."""
    cs = max(1, im.chunk_size)
    names = [n for n in sorted(im.entries) if len(im.entries[n].counts) and im.entries[n].counts.any()]
    out = [struct.pack("<i", len(names))]
    for name in names:
        e = im.entries[name]
        b = name.encode()
        ncall = (int(e.counts.max()) + cs - 1) // cs
        n_mat = len(e.counts)
        sums = e.sums.reshape(n_mat, -1).astype(np.float32)
        cnt = e.counts.astype(np.float32)[:, None]
        vals = np.where(cnt == 0, np.float32(1.0), sums / np.where(cnt == 0, np.float32(1.0), cnt))
        vals = (vals * np.float32(ncall)).astype("<f4")
        out.append(struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, vals.size) + vals.tobytes())
    ds = (im.datasets[-1] if im.datasets else "").encode()
    out.append(struct.pack("<ii", im.chunk_count, len(ds)) + ds)
    tmp = Path(str(path) + ".part")
    tmp.write_bytes(b"".join(out))
    os.replace(tmp, path)


def write_imatrix(path, im: Imatrix, fmt: str | None = None) -> None:
    fmt = fmt or "gguf"
    if fmt == "dat":
        write_dat(path, im)
    elif fmt == "gguf":
        write_gguf(path, im)
    else:
        raise ValueError(f"unknown imatrix output format {fmt!r} (gguf or dat)")


def _read_dat(path: Path) -> Imatrix:
    buf = path.read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(buf):
            raise ValueError(f"{path}: truncated imatrix file")
        v = struct.unpack_from(fmt, buf, pos)
        pos += size
        return v
    (n,) = take("<i")
    if n < 1:
        raise ValueError(f"{path}: no data in the imatrix file")
    im = Imatrix(is_legacy=True, has_metadata=False)
    for i in range(n):
        (ln,) = take("<i")
        if ln < 0 or pos + ln > len(buf):
            raise ValueError(f"{path}: failed reading name for entry {i + 1}")
        name = buf[pos:pos + ln].decode("utf-8", "replace")
        pos += ln
        ncall, nval = take("<ii")
        if nval < 1:
            raise ValueError(f"{path}: failed reading number of values for entry {i}")
        vals = np.frombuffer(buf, dtype="<f4", count=nval, offset=pos).astype(np.float32) \
            if pos + 4 * nval <= len(buf) else None
        if vals is None:
            raise ValueError(f"{path}: failed reading data for entry {i}")
        pos += 4 * nval
        im.entries[name] = ImatrixEntry(vals.reshape(1, -1), np.array([ncall], dtype=np.int64))
    if pos + 4 <= len(buf):
        (im.chunk_count,) = take("<i")
        if pos + 4 <= len(buf):
            (ln,) = take("<i")
            if ln > 0 and pos + ln <= len(buf):
                im.datasets.append(buf[pos:pos + ln].decode("utf-8", "replace"))
    return im


def read_imatrix(path) -> Imatrix:
    """A GGUF imatrix file, or else a legacy .dat one (common_imatrix_load). ValueError when it is neither."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such imatrix file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        return _read_dat(path)
    from .gguf_file import open_gguf
    g = open_gguf(path)
    if not g.tensors:
        raise ValueError(f"{path}: no data in the imatrix file")
    meta = g.metadata
    im = Imatrix(datasets=[str(d) for d in (meta.get(KV_DATASETS) or [])],
                 chunk_count=int(meta.get(KV_CHUNK_COUNT, 0) or 0), chunk_size=int(meta.get(KV_CHUNK_SIZE, 0) or 0),
                 has_metadata=all(k in meta for k in (KV_DATASETS, KV_CHUNK_COUNT, KV_CHUNK_SIZE)))
    pairs: dict = {}
    for name, t in g.tensors.items():
        for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
            if name.endswith(suffix) and len(name) > len(suffix):
                pairs.setdefault(name[:-len(suffix)], [None, None])[slot] = t
    for name, (s, c) in sorted(pairs.items()):
        if s is None or c is None:
            raise ValueError(f"{path}: mismatched sums and counts for {name}")
        if s.type != 0 or c.type != 0:
            raise ValueError(f"{path}: sums and counts for {name} must be F32")
        sums = np.frombuffer(s.data, dtype="<f4").astype(np.float32)
        counts = np.rint(np.frombuffer(c.data, dtype="<f4")).astype(np.int64)
        if len(counts) == 0 or sums.size % len(counts):
            raise ValueError(f"{path}: {name}: {sums.size} sums do not split into {len(counts)} matrices")
        im.entries[name] = ImatrixEntry(sums.reshape(len(counts), -1), counts)
    return im


def quant_weights(im: Imatrix, include=(), exclude=()) -> dict:
    """What llama-quantize hands llama_model_quantize (load_imatrix + prepare_imatrix): per name the float32 importance
    of each column, expert after expert (GGUF: sums / count, 1 where a matrix has no rows; legacy: the value / ncall);
    names containing an `exclude` string dropped, then only those containing an `include` string kept."""
    if not im.is_legacy and not im.has_metadata:
        raise ValueError("missing imatrix metadata in the file")
    out = {}
    for name, e in im.entries.items():
        if im.is_legacy:
            ncall = int(e.counts[0]) if len(e.counts) else 0
            v = (e.sums.reshape(-1) / np.float32(ncall)) if ncall > 0 else e.sums.reshape(-1)
        else:
            n_mat = len(e.counts)
            s = e.sums.reshape(n_mat, -1)
            cnt = e.counts.astype(np.float32)[:, None]
            v = np.where(cnt > 0, s / np.where(cnt > 0, cnt, np.float32(1)), np.float32(1)).reshape(-1)
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    for pat in exclude:
        out = {k: v for k, v in out.items() if pat not in k}
    if include:
        out = {k: v for k, v in out.items() if any(p in k for p in include)}
    return out


# ------------------------------------------------------------------------------------------------ collection
def _read_entries(ctx) -> dict:
    from ._ffi import check, ffi, lib
    out = {}
    name, n_cols, n_mat = ffi.new("const char **"), ffi.new("int64_t *"), ffi.new("int64_t *")
    sums, counts = ffi.new("float **"), ffi.new("int64_t **")
    for i in range(int(lib.pi_imatrix_n_entries(ctx._ptr))):
        check(lib.pi_imatrix_entry(ctx._ptr, i, name, n_cols, n_mat, sums, counts), "imatrix")
        nc, nm = int(n_cols[0]), int(n_mat[0])
        s = np.frombuffer(ffi.buffer(sums[0], 4 * nc * nm), dtype=np.float32).reshape(nm, nc).copy()
        c = np.frombuffer(ffi.buffer(counts[0], 8 * nm), dtype=np.int64).copy()
        out[ffi.string(name[0]).decode()] = ImatrixEntry(s, c)
    return out


def collect(model, text, *, n_ctx: int = 512, chunks: int = -1, from_chunk: int = 0, process_output: bool = False,
            compute_ppl: bool = True, parse_special: bool = False, n_threads: int | None = None,
            dataset: str = "", base: Imatrix | None = None, kv_type="f16", log=print, on_chunk=None) -> Imatrix:
    """The importance matrix of `text` (a string or token ids) on `model` (a Model or a path), llama-imatrix's
    compute_imatrix. base: a matrix to add to (--in-file). on_chunk(i, imatrix): after each window (i from 1; the
    matrix of the windows so far, for --output-frequency / --save-frequency). kv_type: the cache's (Context's)."""
    from ._ffi import check, lib
    from .context import Context
    from .model import Model
    from .perplexity import decode_window, log_softmax
    if not isinstance(model, Model):
        model = Model(model)
    n_ctx = int(n_ctx)
    if n_ctx <= 0:
        raise ValueError("imatrix tool requires '--ctx-size' > 0")
    tok = model.tokenizer
    if isinstance(text, str):
        tokens = np.asarray(tok.encode(text, add_special=True, parse_special=parse_special), dtype=np.int64)
    else:
        tokens = np.asarray(list(text), dtype=np.int64).reshape(-1)
    if from_chunk > 0:
        if (from_chunk + 2) * n_ctx >= len(tokens):
            raise ValueError(f"there will be not enough tokens left after removing {from_chunk} chunks")
        tokens = tokens[from_chunk * n_ctx:]
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; the data file "
                         f"you provided tokenizes to only {len(tokens)} tokens")
    n_chunk = len(tokens) // n_ctx
    if chunks is not None and chunks >= 0:
        n_chunk = min(n_chunk, int(chunks))
    add_bos = bool(tok.add_bos and tok.bos_id is not None)
    if model.sparse or model.gate_sparse:
        log("warning: a sparse file: only the attention matrices are collected (its FFN runs neuron-sparse "
            "kernels, not whole-row matmuls)")
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads, kv_type=kv_type)
    check(lib.pi_imatrix_begin(ctx._ptr, lib.PI_IMATRIX_OUTPUT if process_output else 0), "imatrix")
    base = base if base is not None else Imatrix(chunk_size=n_ctx)
    prior = {k: ImatrixEntry(v.sums.copy(), v.counts.copy()) for k, v in base.entries.items()}
    prior_ds = list(base.datasets)
    known = set(model.file.tensors)
    dropped: set = set()

    def snapshot() -> Imatrix:
        cur = Imatrix(entries={k: ImatrixEntry(v.sums.copy(), v.counts.copy()) for k, v in prior.items()},
                      datasets=prior_ds + ([dataset] if dataset else []), chunk_size=n_ctx)
        got = Imatrix(entries=_read_entries(ctx), chunk_size=n_ctx)
        for name in list(got.entries):
            if name not in known:
                dropped.add(name)
                del got.entries[name]
            elif not got.entries[name].counts.any():
                del got.entries[name]    # never reached (batches under 16 rows, unrouted experts everywhere)
        cur.add(got)
        cur.chunk_count = cur.last_chunk()
        return cur

    first = n_ctx // 2
    mask = np.ones(n_ctx, dtype=np.int8)
    nll = nll2 = 0.0
    count = 0
    line = []
    t_start = time.perf_counter()
    try:
        for i in range(n_chunk):
            t0 = time.perf_counter()
            decode_window(ctx, tokens, i, n_ctx, tok.bos_id if add_bos else None, mask)
            if i == 0:
                secs = time.perf_counter() - t0
                log(f"compute_imatrix: {secs:.2f} seconds per pass - ETA {secs * n_chunk / 60:.2f} minutes")
            if compute_ppl:
                logits = np.stack([ctx.logits(r) for r in range(first, n_ctx - 1)])
                lp = log_softmax(logits)
                targets = tokens[i * n_ctx + first + 1:(i + 1) * n_ctx]
                v = -lp[np.arange(len(targets)), targets]
                nll += float(v.sum())
                nll2 += float((v * v).sum())
                count += len(v)
                line.append(f"[{i + 1}]{math.exp(nll / count):.4f},")
            if on_chunk is not None:
                on_chunk(i + 1, snapshot)
        result = snapshot()
    finally:
        lib.pi_imatrix_end(ctx._ptr)
    if line:
        log("".join(line))
    if compute_ppl and count > 1:
        m = nll / count
        var = nll2 / count - m * m
        ppl = math.exp(m)
        err = ppl * math.sqrt(var / (count - 1)) if var > 0 else float("nan")
        log(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}")
    for name in sorted(dropped):
        log(f"warning: {name} is not a tensor of the file (a view of a fused tensor): not stored")
    log(f"collected {len(result.entries)} entries over {n_chunk} chunks in {time.perf_counter() - t_start:.1f} s")
    return result


# ------------------------------------------------------------------------------------------------ statistics
def statistics(im: Imatrix) -> list:
    """llama-imatrix --show-statistics: per entry (name, sum, min, max, mean, stddev, active, n, entropy, zd, cossim
    with the same matrix of the layer before)."""
    import re
    rows = {}
    for name, e in im.entries.items():
        n_mat = len(e.counts)
        s = e.sums.reshape(n_mat, -1)
        acts = np.concatenate([s[i] / np.float32(e.counts[i]) for i in range(n_mat) if e.counts[i]] or
                              [np.zeros(0, np.float32)]).astype(np.float32)
        if acts.size == 0:
            continue
        total = float(acts.sum(dtype=np.float32))
        mean = total / acts.size
        var = float((acts * acts).sum(dtype=np.float32)) / acts.size - mean * mean
        dev = math.sqrt(max(0.0, var))
        active = 1 - float((np.abs(acts) <= 1e-5).sum()) / acts.size
        p = acts / np.float32(total) if total > 0 else np.zeros_like(acts)
        p = p[p > 0]
        entropy = float(-(p * np.log2(p)).sum())
        zd = float(((acts - mean) / dev > 1).sum()) / acts.size if dev > 0 else 0.0
        rows[name] = dict(name=name, total=total, min=float(acts.min()), max=float(acts.max()), mean=mean, dev=dev,
                          active=active, n=int(acts.size), entropy=entropy, zd=zd, cossim=0.0,
                          vals=e.sums.reshape(-1).astype(np.float32))
    pat = re.compile(r"blk\.(\d+)\.")
    for name, r in rows.items():
        m = pat.search(name)
        if m:
            prev = rows.get(name[:m.start(1)] + str(int(m.group(1)) - 1) + name[m.end(1):])
            if prev is not None and prev["vals"].size == r["vals"].size:
                a, b = r["vals"], prev["vals"]
                r["cossim"] = float(np.dot(a, b) / (math.sqrt(float(np.dot(a, a))) * math.sqrt(float(np.dot(b, b)))))
    return list(rows.values())


def _show_statistics(im: Imatrix, path, log) -> None:
    def split(name):
        parts = name.split(".")
        layer = parts[parts.index("blk") + 1] if "blk" in parts[:-1] else "-"
        tensor = parts[parts.index("weight") - 1] if "weight" in parts[1:] else name
        return layer, tensor
    ts = statistics(im)
    ts.sort(key=lambda r: (split(r["name"])[1], -r["total"]))
    log(f"\nComputing statistics for {path} ({len(ts)} tensors)\n")
    log(" Layer\t       Tensor\t          Σ(Act²)\t  Min\t            Max\t           μ\t   σ\t % Active\tN\t"
        "   Entropy\tE (norm)\tZD\t  CosSim")
    log("=" * 170)
    for r in ts:
        layer, tensor = split(r["name"])
        en = 100.0 * r["entropy"] / math.log2(r["n"]) if r["n"] > 1 else 0.0
        log(f"{layer:>5}\t{tensor:<20}\t{r['total']:10.2f}\t{r['min']:8.4f}\t{r['max']:11.4f}\t{r['mean']:6.2f}\t"
            f"{r['dev']:6.2f}\t{r['active'] * 100:8.2f}%\t{r['n']:6d}\t{r['entropy']:10.4f}\t{en:6.2f}%\t"
            f"{100 * r['zd']:10.2f}%\t{r['cossim']:8.4f}")


# ------------------------------------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m powerinfer.imatrix",
                                description="Compute an importance matrix for llama-quantize --imatrix "
                                            "(llama.cpp's llama-imatrix).")
    p.add_argument("-m", "--model", help="the model file (GGUF, or a PowerInfer file)")
    p.add_argument("-f", "--file", help="the text to evaluate")
    p.add_argument("-o", "--output-file", "--output", default="imatrix.gguf")
    p.add_argument("--output-format", choices=("gguf", "dat"), default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=512)
    p.add_argument("-b", "--batch-size", type=int, default=None,
                   help="accepted (llama-imatrix's windows per batch); every window is one decode here")
    p.add_argument("--chunks", type=int, default=-1, help="at most this many chunks (-1: all)")
    p.add_argument("--chunk", "--from-chunk", dest="from_chunk", type=int, default=0, help="skip the first N chunks")
    p.add_argument("--process-output", action="store_true", help="collect output.weight too")
    p.add_argument("--no-ppl", dest="ppl", action="store_false")
    p.add_argument("--ppl", dest="ppl", action="store_true", default=True)
    p.add_argument("-ofreq", "--output-frequency", type=int, default=10, help="save every N chunks")
    p.add_argument("--save-frequency", type=int, default=0, help="also save a copy FILE.at_N every N chunks")
    p.add_argument("--in-file", action="append", default=[], help="an imatrix to add to (repeatable)")
    p.add_argument("--show-statistics", action="store_true")
    p.add_argument("--parse-special", action="store_true")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="ngl", type=int, default=0)
    return p


def main(argv=None) -> int:
    a = _parser().parse_args(argv)

    def log(s):
        print(s, file=sys.stderr, flush=True)
    try:
        if a.show_statistics:
            if len(a.in_file) != 1:
                log("Error: a single imatrix file is required to compute tensor statistics")
                return 1
            _show_statistics(read_imatrix(a.in_file[0]), a.in_file[0], log)
            return 0
        if a.ngl != 0:
            log(f"error: -ngl {a.ngl}: importance-matrix collection runs on the CPU only here (use -ngl 0)")
            return 1
        if a.ctx_size <= 0:
            log("error: imatrix tool requires '--ctx-size' > 0")
            return 1
        fmt = a.output_format
        if fmt is None and not a.output_file.endswith(".gguf"):
            log("warning: saving imatrix using GGUF format with a different suffix than .gguf "
                "(--output-format dat for the previous format)")
        base = Imatrix(chunk_size=a.ctx_size)
        for f in a.in_file:
            log(f"loading imatrix from '{f}'")
            base.add(read_imatrix(f))
        if not a.file:
            if not a.in_file:
                log("Error: No prompt provided and no precomputed matrices (--in-file) to combine.")
                return 1
            write_imatrix(a.output_file, base, fmt)
            log(f"saving {'combined ' if len(a.in_file) > 1 else ''}imatrix to '{a.output_file}'")
            return 0
        if not a.model:
            log("error: -m MODEL is required to collect")
            return 1
        text = Path(a.file).read_text(encoding="utf-8", errors="replace")
        from .model import Model
        model = Model(a.model)

        def on_chunk(i, snapshot):
            if a.output_frequency > 0 and i % a.output_frequency == 0:
                write_imatrix(a.output_file, snapshot(), fmt)
            if a.save_frequency > 0 and i % a.save_frequency == 0:
                write_imatrix(f"{a.output_file}.at_{i}", snapshot(), fmt)
        im = collect(model, text, n_ctx=a.ctx_size, chunks=a.chunks, from_chunk=a.from_chunk,
                     process_output=a.process_output, compute_ppl=a.ppl, parse_special=a.parse_special,
                     n_threads=a.threads, dataset=a.file, base=base, log=log, on_chunk=on_chunk)
        write_imatrix(a.output_file, im, fmt)
        log(f"stored collected data after {im.chunk_count} chunks in {a.output_file}")
        return 0
    except (ValueError, OSError) as e:
        log(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
