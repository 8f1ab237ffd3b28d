#!/usr/bin/env python3
"""Quantize a GGUF model file, as llama.cpp's llama-quantize (the same output file, byte for byte).

    python tools/quantize.py [options] INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]
    python tools/quantize.py model-f16.gguf model-Q4_K_M.gguf Q4_K_M 4

TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q2_K_S Q3_K_S Q3_K_M (Q3_K) Q3_K_L Q4_K_S Q4_K_M (Q4_K) Q5_K_S Q5_K_M (Q5_K)
Q6_K F16 BF16 F32 COPY, or llama.cpp's number of one. Without OUTPUT the file is ggml-model-TYPE.gguf next to INPUT.
NTHREADS: threads converting each tensor (default: every CPU).

--imatrix FILE (python -m powerinfer.imatrix's or llama-imatrix's, GGUF or .dat) quantizes with llama.cpp's weighted
quantizers, as llama-quantize does (Q2_K_S requires one). The IQ types need quantizers this core does not have; they
are refused, as are split input files. A PowerInfer (PWRI) file is quantized as a dense one whose
predictors (fc1, fc2) keep their type (--tensor-type can name them), and stays a PWRI file.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from powerinfer.gguf_file import ModelLoadError
from powerinfer.quant_rules import FTYPE_REFUSED, QUANT_OPTIONS, QuantOptions, parse_ftype, parse_ggml_type
from powerinfer.quantize import QuantizeError, parse_kv_override, quantize_file


def _types_help() -> str:
    ok = [(n, ft) for n, ft in QUANT_OPTIONS if n not in FTYPE_REFUSED]
    return "allowed types: " + " ".join(f"{n} ({ft if n != 'COPY' else 'copy'})" for n, ft in ok)


def _ggml_type(s: str, what: str) -> int:
    t = parse_ggml_type(s)
    if t is None:
        raise SystemExit(f"quantize: error: invalid ggml_type '{s}' for {what}")
    return t


def _tensor_type(s: str) -> tuple[str, int]:
    """--tensor-type NAME=TYPE (llama-quantize's parse_tensor_type: the name lowercased, a regex)."""
    name, sep, t = s.partition("=")
    if not sep:
        raise SystemExit(f"quantize: error: malformed tensor type '{s}' (NAME=TYPE)")
    if not name:
        raise SystemExit("quantize: error: missing tensor name in --tensor-type")
    if not t:
        raise SystemExit(f"quantize: error: missing quantization type in --tensor-type '{s}'")
    try:
        re.compile(name.lower())
    except re.error as e:
        raise SystemExit(f"quantize: error: --tensor-type '{s}': bad pattern ({e})") from None
    return name.lower(), _ggml_type(t, "--tensor-type")


def _prune(s: str) -> list[int]:
    out = []
    for part in s.split(","):
        m = re.match(r"\s*([+-]?\d+)", part)
        if not m or int(m.group(1)) < 0:
            raise SystemExit(f"quantize: error: invalid layer id '{part}' in --prune-layers")
        out.append(int(m.group(1)))
    return sorted(set(out))


def _load_imatrix(path: str, include, exclude):
    """llama-quantize's load_imatrix + prepare_imatrix: the importance per tensor and the metadata it records
    (quantize.imatrix.file, .dataset, .entries_count, .chunks_count: --override-kv keys after the user's). None when no
    entry is left (then it quantizes without one, as llama-quantize)."""
    from powerinfer.imatrix import quant_weights, read_imatrix
    im = read_imatrix(path)
    data = quant_weights(im, include=include, exclude=exclude)
    print(f"quantize: loaded {len(im.entries)} importance matrix entries from {path} computed on {im.chunk_count} "
          "chunks", file=sys.stderr)
    if not data:
        return None, []
    print(f"quantize: have {len(data)} importance matrix entries", file=sys.stderr)
    kv = [("quantize.imatrix.file", path[:127])]
    if im.datasets:
        kv.append(("quantize.imatrix.dataset", im.datasets[0][:127]))
    kv.append(("quantize.imatrix.entries_count", len(data)))
    if im.chunk_count > 0:
        kv.append(("quantize.imatrix.chunks_count", im.chunk_count))
    return data, kv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=_types_help(),
                                 usage="%(prog)s [options] INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]")
    ap.add_argument("args", nargs="+", metavar="INPUT [OUTPUT] TYPE [NTHREADS]", help=argparse.SUPPRESS)
    ap.add_argument("--allow-requantize", action="store_true",
                    help="allow requantizing tensors that have already been quantized (dequantized, then quantized: "
                         "a loss of quality compared to quantizing from 16 or 32 bits)")
    ap.add_argument("--leave-output-tensor", action="store_true", help="leave output.weight un(re)quantized")
    ap.add_argument("--pure", action="store_true",
                    help="disable k-quant mixtures and quantize all tensors to the same type")
    ap.add_argument("--output-tensor-type", metavar="GGML_TYPE", help="use this ggml type for output.weight")
    ap.add_argument("--token-embedding-type", metavar="GGML_TYPE", help="use this ggml type for token_embd.weight")
    ap.add_argument("--tensor-type", action="append", default=[], metavar="NAME=GGML_TYPE",
                    help="quantize the tensors NAME (a regex searched in the name) matches to this type; repeatable, "
                         "the first match wins (e.g. --tensor-type attn_q=q8_0)")
    ap.add_argument("--tensor-type-file", metavar="FILE", help="NAME=GGML_TYPE entries, separated by blanks")
    ap.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                    help="set a metadata key in the output (TYPE: int, float, bool, str); repeatable")
    ap.add_argument("--prune-layers", metavar="L0,L1,...", help="layers to leave out (the rest renumbered)")
    ap.add_argument("--dry-run", action="store_true", help="show the types and sizes without writing a file")
    ap.add_argument("--keep-split", action="store_true", help="not supported (split files are not read)")
    ap.add_argument("--imatrix", metavar="FILE", help="an importance matrix (llama-imatrix's GGUF or .dat file)")
    ap.add_argument("--include-weights", action="append", default=[], metavar="NAME",
                    help="use the importance matrix only for tensors whose names contain NAME (repeatable)")
    ap.add_argument("--exclude-weights", action="append", default=[], metavar="NAME",
                    help="use the importance matrix for none of the tensors whose names contain NAME (repeatable)")
    ap.add_argument("--max-buffer-size", type=int, metavar="MIB",
                    help="accepted for llama-quantize's command lines; each tensor is converted in chunks of rows")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-tensor lines")
    a = ap.parse_intermixed_args(argv)

    def fail(msg: str) -> int:
        print(f"quantize: error: {msg}", file=sys.stderr)
        return 1

    if a.include_weights and a.exclude_weights:
        return fail("--include-weights and --exclude-weights exclude each other")
    if a.keep_split:
        return fail("--keep-split is not supported: split input files are not read (merge them first)")
    if a.max_buffer_size is not None and a.max_buffer_size <= 0:
        return fail(f"invalid --max-buffer-size '{a.max_buffer_size}'")

    args = list(a.args)
    if len(args) < 2:
        return fail("bad arguments: INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]")
    inp = args.pop(0)
    ft = parse_ftype(args[0])
    if ft is not None:          # INPUT TYPE: the output next to the input
        args.pop(0)
        cut = max(inp.rfind("/"), inp.rfind("\\"))
        out = inp[:cut + 1] + f"ggml-model-{ft[0]}.gguf"
    else:                       # INPUT OUTPUT TYPE
        out = args.pop(0)
        if not args:
            return fail("missing TYPE")
        ft = parse_ftype(args[0])
        if ft is None:
            return fail(f"invalid ftype '{args[0]}' ({_types_help()})")
        args.pop(0)
    nthread = 0
    if args:
        m = re.match(r"\s*([+-]?\d+)", args[0])
        if not m:
            return fail(f"invalid nthread '{args[0]}'")
        nthread = int(m.group(1))
        args.pop(0)
    if args:
        return fail(f"unexpected arguments: {' '.join(args)}")
    name, ftype = ft
    if name in FTYPE_REFUSED:
        return fail(f"{name} {FTYPE_REFUSED[name]} ({_types_help()})")

    tensor_types = [_tensor_type(s) for s in a.tensor_type]
    if a.tensor_type_file:
        try:
            with open(a.tensor_type_file) as fh:
                tensor_types += [_tensor_type(s) for s in fh.read().split()]
        except OSError as e:
            return fail(f"failed to open file '{a.tensor_type_file}': {e.strerror}")
    try:
        overrides = [parse_kv_override(s) for s in a.override_kv]
    except QuantizeError as e:
        return fail(str(e))
    imatrix = None
    if a.imatrix is not None:
        try:
            imatrix, more = _load_imatrix(a.imatrix, a.include_weights, a.exclude_weights)
        except (ValueError, OSError) as e:
            return fail(f"failed to load imatrix from '{a.imatrix}': {e}")
        overrides += more
    opts = QuantOptions(
        ftype=ftype, pure=a.pure, quantize_output_tensor=not a.leave_output_tensor, only_copy=name == "COPY",
        output_tensor_type=_ggml_type(a.output_tensor_type, "--output-tensor-type") if a.output_tensor_type else None,
        token_embedding_type=(_ggml_type(a.token_embedding_type, "--token-embedding-type")
                              if a.token_embedding_type else None),
        tensor_types=tensor_types)

    if not a.dry_run and os.path.exists(inp) and os.path.exists(out) and os.path.samefile(inp, out):
        return fail(f"input and output files are the same: '{inp}'")
    what = "calculating quantization size for" if a.dry_run else "quantizing"
    print(f"quantize: {what} '{inp}'" + ("" if a.dry_run else f" to '{out}'") + f" as {name}"
          + (f" using {nthread} threads" if nthread > 0 else ""), file=sys.stderr)
    log = None if a.quiet else (lambda line: print(line, file=sys.stderr))
    try:
        res = quantize_file(inp, None if a.dry_run else out, opts, nthread=nthread,
                            allow_requantize=a.allow_requantize, kv_overrides=overrides,
                            prune_layers=_prune(a.prune_layers) if a.prune_layers else (), dry_run=a.dry_run,
                            log=log, imatrix=imatrix)
    except (QuantizeError, ModelLoadError) as e:
        return fail(str(e))
    except OSError as e:
        return fail(f"{e.filename or out}: {e.strerror}")
    n_el = sum(_elements(p.ne) for p in res.tensors) or 1
    mib = 1 / (1 << 20)
    print(f"quantize: model size  = {res.size_in * mib:8.2f} MiB ({res.size_in * 8 / n_el:.2f} BPW)", file=sys.stderr)
    print(f"quantize: quant size  = {res.size_out * mib:8.2f} MiB ({res.size_out * 8 / n_el:.2f} BPW)",
          file=sys.stderr)
    if res.fallbacks:
        print(f"quantize: WARNING: {len(res.fallbacks)} of {len(res.tensors)} tensor(s) required fallback "
              "quantization", file=sys.stderr)
    print(f"quantize: {'planned' if a.dry_run else 'wrote ' + out} in {res.seconds:.2f} s", file=sys.stderr)
    return 0


def _elements(ne) -> int:
    n = 1
    for x in ne:
        n *= int(x)
    return n


if __name__ == "__main__":
    sys.exit(main())
