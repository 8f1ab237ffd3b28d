"""Quantize a GGUF file: the file llama.cpp's quantizer (llama_model_quantize, llama-quantize) writes, byte for byte,
for the file types of powerinfer.quant_rules (Q4_0 .. Q8_0, Q2_K .. Q6_K and their mixes, Q2_K_S, IQ4_NL, IQ4_XS,
F16, BF16, F32, COPY).

    quantize_file("model-f16.gguf", "model-Q4_K_M.gguf", QuantOptions(ftype=FTYPE["Q4_K_M"]), nthread=4)

The layout is llama.cpp's: the input's keys in their order without general.quantization_version, general.file_type
and the split keys, then those two (u32) and any --override-kv keys; the tensors in its weights-map order
(quant_rules.llama_order) with ggml_n_dims dimensions; 32-byte alignment. Each converted tensor is dequantized
(pi_dequantize_row) and quantized (pi_quantize_row, llama.cpp's reference quantizers without an importance matrix;
pi_quantize_rows_imatrix, its quantize_row_*_impl with one: `imatrix=`, powerinfer.imatrix.quant_weights) in chunks of
rows on `nthread` threads (the C calls release the GIL), then checked as llama.cpp checks it
(ggml_validate_row_data: no NaN or infinity among the values or the blocks' scales). The file is written next to its
name and renamed into place when complete.

A PowerInfer (PWRI) file keeps its magic and its predictors' type (fc1 / fc2: the neuron selection), the rest as a
dense file (its ffn_down_t is the layer's down matrix, llama.cpp's ffn_down category).
"""
from __future__ import annotations

import dataclasses
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gguf_file import _Reader, open_gguf
from .quant_rules import (BF16, F16, F32, FLOAT_TYPES, FTYPE, MXFP4, WRITABLE, HParams, QuantOptions, block_size,
                          guessed_ftype, is_quantized, llama_order, n_dims, plan_types, requires_imatrix, type_name)

GGML_QNT_VERSION = 2
GGUF_VERSION = 3
ALIGNMENT = 32
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
# bytes per block and the offsets of its fp16 scales (ggml_validate_row_data's checks)
_BLOCK = {2: (18, (0,)), 3: (20, (0, 2)), 6: (22, (0,)), 7: (24, (0, 2)), 8: (34, (0,)), 10: (84, (80, 82)),
          11: (110, (108,)), 12: (144, (0, 2)), 13: (176, (0, 2)), 14: (210, (208,)), 20: (18, (0,)), 23: (136, (0,)),
          18: (98, (0,)), 21: (110, (0,))}
_CHUNK_ELEMENTS = 1 << 16     # elements per task of the thread pool


class QuantizeError(ValueError):
    """The file cannot be quantized as asked (the message says why)."""


@dataclass
class TensorPlan:
    name: str            # in the output (--prune-layers renumbers layers)
    src_name: str
    ne: tuple
    src_type: int
    dst_type: int
    nbytes: int          # output bytes
    offset: int = 0      # in the output's data section
    imatrix: np.ndarray | None = None   # float32 [n_mat * ne[0]]: the importance of each column (per expert)


@dataclass
class QuantizeResult:
    tensors: list
    file_type: int
    size_in: int         # tensor bytes
    size_out: int
    fallbacks: list
    seconds: float = 0.0


# ---------------------------------------------------------------- GGUF bytes
def _gguf_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv_bytes(key: str, value) -> bytes:
    """A key/value as gguf.cpp writes it: u32 for int (llama.cpp's overrides: the absolute value), f32 for float,
    bool, string."""
    if isinstance(value, bool):
        return _gguf_str(key) + struct.pack("<IB", 7, int(value))
    if isinstance(value, int):
        return _gguf_str(key) + struct.pack("<II", 4, abs(value) & 0xFFFFFFFF)
    if isinstance(value, float):
        return _gguf_str(key) + struct.pack("<If", 6, value)
    return _gguf_str(key) + struct.pack("<I", 8) + _gguf_str(str(value))


def _row_bytes(t: int, n: int) -> int:
    from ._ffi import lib
    rb = int(lib.pi_row_bytes(t, n))
    if rb < 0:
        raise QuantizeError(f"rows of {n} elements cannot be stored as {type_name(t)}")
    return rb


def parse_kv_override(s: str):
    """llama.cpp's --override-kv KEY=TYPE:VALUE (int, float, bool, str) -> (key, value)."""
    key, sep, rest = s.partition("=")
    if not sep or len(key) >= 128:
        raise QuantizeError(f"malformed KV override '{s}'")
    kind, _, val = rest.partition(":")
    try:
        if kind == "int":
            return key, int(val.strip() or 0)
        if kind == "float":
            return key, float(val.strip() or 0.0)
    except ValueError:
        raise QuantizeError(f"invalid value for KV override '{s}'") from None
    if kind == "bool":
        if val not in ("true", "false"):
            raise QuantizeError(f"invalid boolean value for KV override '{s}'")
        return key, val == "true"
    if kind == "str":
        if len(val) > 127:
            raise QuantizeError(f"malformed KV override '{s}', value cannot exceed 127 chars")
        return key, val
    raise QuantizeError(f"invalid type for KV override '{s}'")


def _prune_names(names, prune):
    """llama.cpp's remap_layer over the names in order: {old name: new name or None (pruned)}, the new layer count."""
    import re
    prune = sorted(set(prune))
    mapped, next_id, out = {}, 0, {}
    for n in names:
        m = re.search(r"blk\.(\d+)\.", n)
        if not prune or not m:
            out[n] = n
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = None
            elif blk < prune[0]:
                mapped[blk], next_id = str(blk), blk + 1
            else:
                mapped[blk], next_id = str(next_id), next_id + 1
        out[n] = None if mapped[blk] is None else n[:m.start(1)] + mapped[blk] + n[m.end(1):]
    return out, next_id


# ---------------------------------------------------------------- data
def _validate(t: int, out: np.ndarray) -> bool:
    """ggml_validate_row_data: no NaN or infinity among the values (float types) or the blocks' fp16 scales (MXFP4: no
    E8M0 scale 0xff)."""
    if t == F32:
        return bool(np.isfinite(out.view(np.float32)).all())
    if t == F16:
        return not ((out.view(np.uint16) & 0x7C00) == 0x7C00).any()
    if t == BF16:
        return not ((out.view(np.uint16) & 0x7F80) == 0x7F80).any()
    if t == MXFP4:   # the E8M0 scale byte: 0xff is NaN
        return not (out.reshape(-1, 17)[:, 0] == 0xFF).any()
    bb, offs = _BLOCK[t]
    blocks = out.reshape(-1, bb)
    for o in offs:
        h = blocks[:, o].astype(np.uint16) | (blocks[:, o + 1].astype(np.uint16) << 8)
        if ((h & 0x7C00) == 0x7C00).any():
            return False
    return True


def _convert(src: np.ndarray, p: TensorPlan, pool, nthread: int) -> np.ndarray:
    """The tensor's bytes as p.dst_type: rows dequantized to f32 and quantized, chunks of rows per task (with an
    importance matrix: llama.cpp's weighted quantizers, each expert's rows with its slice)."""
    from ._ffi import check, ffi, lib
    n = p.ne[0]
    nrows = int(np.prod(p.ne[1:], dtype=np.int64)) if len(p.ne) > 1 else 1
    srb, drb = _row_bytes(p.src_type, n), _row_bytes(p.dst_type, n)
    out = np.empty(nrows * drb, dtype=np.uint8)
    step = max(1, -(-_CHUNK_ELEMENTS // n))
    per_expert = p.ne[1] if len(p.ne) > 1 else 1
    if p.imatrix is not None:
        step = min(step, per_expert)
        while per_expert % step:    # chunks never cross an expert's rows
            step -= 1

    def work(r0: int) -> None:
        r1 = min(nrows, r0 + step)
        k = (r1 - r0) * n
        s = src[r0 * srb:r1 * srb]
        d = out[r0 * drb:r1 * drb]
        if p.src_type == F32:
            x = ffi.from_buffer("float[]", s)
        elif p.dst_type == F32:
            check(lib.pi_dequantize_row(p.src_type, ffi.from_buffer(s), ffi.from_buffer("float[]", d), k))
            return
        else:
            buf = np.empty(k, dtype=np.float32)
            x = ffi.from_buffer("float[]", buf)
            check(lib.pi_dequantize_row(p.src_type, ffi.from_buffer(s), x, k))
        if p.dst_type == F32:
            ffi.memmove(ffi.from_buffer(d), x, k * 4)
        else:
            e = r0 // per_expert
            qw = ffi.NULL if p.imatrix is None else ffi.from_buffer("float[]", p.imatrix[e * n:(e + 1) * n])
            check(lib.pi_quantize_rows_imatrix(p.dst_type, x, ffi.from_buffer(d), r1 - r0, n, qw))

    starts = range(0, nrows, step)
    if pool is None or len(starts) == 1:
        for r0 in starts:
            work(r0)
    else:
        list(pool.map(work, starts))
    return out


# ---------------------------------------------------------------- the file
def _imatrix_for(p: TensorPlan, imatrix: dict | None, ftype: int, log, dry_run: bool):
    """llama.cpp's lookup of a tensor's importance (by its input name: --prune-layers renames after), its size check
    (ne[0] x experts; a mismatch is an error but for token_embd) and the very low-bit types that need one (a
    --dry-run only warns, as llama.cpp's)."""
    qw = None
    if imatrix is not None:
        v = imatrix.get(p.src_name)
        n_mat = p.ne[2] if len(p.ne) > 2 else 1
        if v is None:
            log(f"====== did not find weights for {p.src_name}")
        elif np.asarray(v).size == p.ne[0] * n_mat:
            qw = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
        elif p.src_name not in ("token_embd.weight", "per_layer_token_embd.weight") and not dry_run:
            raise QuantizeError(f"imatrix size {np.asarray(v).size} is different from tensor size {p.ne[0] * n_mat} "
                                f"for {p.src_name}")
    if qw is None and requires_imatrix(p.name, p.dst_type, ftype):
        if dry_run:
            log(f"WARNING: completing this quantization will require an imatrix ({p.name} as {type_name(p.dst_type)})")
            return None
        raise QuantizeError(f"this quantization requires an importance matrix: tensor {p.name} as "
                            f"{type_name(p.dst_type)} (--imatrix; a missing entry counts as none)")
    return qw


def _can_dequantize(t: int) -> bool:
    from ._ffi import lib
    return t in FLOAT_TYPES or (is_quantized(t) and bool(lib.pi_type_supported(t)))


def quantize_file(src, dst, opts: QuantOptions, *, nthread: int = 0, allow_requantize: bool = False,
                  kv_overrides=(), prune_layers=(), dry_run: bool = False, log=None,
                  imatrix: dict | None = None) -> QuantizeResult:
    """Write dst, src quantized as opts say (llama_model_quantize's parameters; kv_overrides: [(key, value)] of
    parse_kv_override). nthread <= 0: every CPU. dry_run: the plan and sizes only. log(line): progress lines as
    llama.cpp's. imatrix: {tensor name: float32 importance per column (experts one after the other)}, what
    llama-quantize passes as params.imatrix (powerinfer.imatrix.quant_weights); its presence turns on llama.cpp's
    has_imatrix rules. QuantizeError / ModelLoadError (bad input) before anything is written."""
    t0 = time.perf_counter()
    log = log or (lambda line: None)
    src, dst = Path(src), Path(dst) if dst is not None else None
    f = open_gguf(src)
    meta = dict(f.metadata)
    if int(meta.get("split.count", 1) or 1) > 1:
        raise QuantizeError(f"{src} is one of {meta['split.count']} split files; merge them first "
                            "(llama-gguf-split --merge): split input is not supported")
    meta.update(kv_overrides)
    try:
        hp = HParams.from_metadata(meta)
    except ValueError as e:
        raise QuantizeError(f"{src}: {e}") from None
    opts = dataclasses.replace(opts, pwri=f.is_sparse, has_imatrix=imatrix is not None)
    if imatrix is not None:
        log(f"have importance matrix data with {len(imatrix)} entries")
        for k, v in imatrix.items():
            bad = ~np.isfinite(np.asarray(v, dtype=np.float32))
            if bad.any():
                raise QuantizeError(f"imatrix contains non-finite value {float(np.asarray(v)[bad][0])} ({k})")

    order = llama_order(list(f.tensors))
    renamed, n_block = _prune_names(order, prune_layers)
    order = [n for n in order if renamed[n] is not None]
    listed = [(renamed[n], f.tensors[n].ne, f.tensors[n].type) for n in order]
    try:
        types, fallbacks = plan_types(listed, hp, opts)
    except ValueError as e:
        raise QuantizeError(f"{src}: {e}") from None

    plans = []
    for (name, ne, cur), old, new in zip(listed, order, types):
        if cur != new:
            if new not in WRITABLE:
                raise QuantizeError(f"tensor {name}: type {type_name(new)} has no quantizer in this core "
                                    f"(it writes {', '.join(type_name(t) for t in sorted(WRITABLE))})")
            if ne[0] % block_size(new):
                raise QuantizeError(f"tensor {name}: rows of {ne[0]} elements cannot be stored as {type_name(new)} "
                                    f"(blocks of {block_size(new)})")
            if is_quantized(cur) and not allow_requantize:
                raise QuantizeError(f"requantizing from type {type_name(cur)} is disabled (tensor {name}; "
                                    "--allow-requantize converts it, at a loss of quality)")
            if not _can_dequantize(cur):
                raise QuantizeError(f"tensor {name}: cannot dequantize/convert tensor type {type_name(cur)}")
            nbytes = _row_bytes(new, ne[0]) * (int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1)
        else:
            nbytes = f.tensors[old].data.nbytes
        plan = TensorPlan(name, old, tuple(ne), cur, new, nbytes)
        if cur != new and not opts.only_copy:
            plan.imatrix = _imatrix_for(plan, imatrix, opts.ftype, log, dry_run)
        plans.append(plan)

    if opts.only_copy:
        ft = meta.get("general.file_type")
        file_type = int(ft) if isinstance(ft, int) and not isinstance(ft, bool) else guessed_ftype(listed)
    else:
        file_type = opts.ftype

    # header: the input's keys (raw bytes), then the quantizer's
    align = int(meta.get("general.alignment", ALIGNMENT))
    reader = _Reader(src, "r")
    if reader.byte_order == "S":
        raise QuantizeError(f"{src}: a big-endian GGUF file is not supported")
    # gguf_set_val_*: a key set again leaves its place for the end
    tail: dict = {}
    tail["general.quantization_version"] = GGML_QNT_VERSION
    tail["general.file_type"] = file_type
    for k, v in kv_overrides:
        tail.pop(k, None)
        tail[k] = v
    if prune_layers:
        tail.pop(f"{hp.arch}.block_count", None)
        tail[f"{hp.arch}.block_count"] = n_block
    kvs = []
    for fld in reader.fields.values():
        if fld.name.startswith("GGUF.") or fld.name in tail or fld.name in _SPLIT_KEYS:
            continue
        size = sum(int(p.nbytes) for p in fld.parts)
        kvs.append(bytes(reader.data[fld.offset:fld.offset + size]))
    kvs += [_kv_bytes(k, v) for k, v in tail.items()]
    del reader

    infos, off = [], 0
    for p in plans:
        p.offset = off
        nd = n_dims(p.ne)
        infos.append(_gguf_str(p.name) + struct.pack(f"<I{nd}QIQ", nd, *p.ne[:nd], p.dst_type, off))
        off += -(-p.nbytes // align) * align
    magic = b"PWRI" if f.is_sparse else b"GGUF"
    head = magic + struct.pack("<Iqq", GGUF_VERSION, len(plans), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % align)

    res = QuantizeResult(plans, file_type, sum(f.tensors[p.src_name].data.nbytes for p in plans),
                         sum(p.nbytes for p in plans), fallbacks)
    for note in fallbacks:
        log("warning: " + note)
    mib = 1 / (1 << 20)
    if dry_run:
        for i, p in enumerate(plans):
            log(f"[{i + 1:4d}/{len(plans):4d}] {p.name:<36} - [{', '.join(f'{x:6d}' for x in p.ne)}], "
                f"type = {type_name(p.src_type):>6}, size = {f.tensors[p.src_name].data.nbytes * mib:8.3f} MiB"
                + (f" -> {p.nbytes * mib:8.2f} MiB ({type_name(p.dst_type)})" if p.src_type != p.dst_type else ""))
        res.seconds = time.perf_counter() - t0
        return res

    if nthread <= 0:
        nthread = os.cpu_count() or 1
    tmp = dst.with_name(dst.name + ".part")
    pool = ThreadPoolExecutor(nthread) if nthread > 1 else None
    try:
        with open(tmp, "wb") as fout:
            fout.write(head)
            for i, p in enumerate(plans):
                data = f.tensors[p.src_name].data
                line = (f"[{i + 1:4d}/{len(plans):4d}] {p.name:<36} - [{', '.join(f'{x:6d}' for x in p.ne)}], "
                        f"type = {type_name(p.src_type):>6}, ")
                if p.src_type == p.dst_type:
                    fout.write(memoryview(data))
                    log(line + f"size = {data.nbytes * mib:8.3f} MiB")
                else:
                    out = _convert(data, p, pool, nthread)
                    if not _validate(p.dst_type, out):
                        raise QuantizeError(f"tensor {p.name}: quantized data validation failed (NaN or infinity "
                                            f"in the {type_name(p.dst_type)} data: the input has non-finite or "
                                            "too large values)")
                    fout.write(memoryview(out))
                    log(line + f"converting to {type_name(p.dst_type)} .. size = {data.nbytes * mib:8.2f} MiB -> "
                        f"{p.nbytes * mib:8.2f} MiB")
                fout.write(bytes(-p.nbytes % align))
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        if pool is not None:
            pool.shutdown()
    res.seconds = time.perf_counter() - t0
    return res


__all__ = ["FTYPE", "QuantOptions", "QuantizeError", "QuantizeResult", "parse_kv_override", "quantize_file"]
