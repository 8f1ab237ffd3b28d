#!/usr/bin/env python3
"""Convert a Hugging Face llama/bamboo checkpoint and its PowerInfer predictors to a
PowerInfer sparse model file (GGUF with the PWRI magic).

    python convert.py [--outfile F] [--outtype f32|f16|q8_0|q4_0] MODEL_DIR PREDICTOR_DIR

MODEL_DIR: config.json, *.safetensors or pytorch_model*.bin, tokenizer.model.
PREDICTOR_DIR: model_0.pt, model_1.pt, ... (one per layer), optional config.json with
sparse_threshold. Progress goes to stderr; on failure one error line and exit status 1.
(convert-dense.py writes a plain dense GGUF file instead.)
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

OUTTYPES = ("f32", "f16", "q8_0", "q4_0")


def _import_convert():
    """powerinfer.convert, from this checkout's bindings/ if needed. The converters are pure
    Python: when the package's C library is not built, the package __init__ (which loads it)
    is bypassed."""
    try:
        import powerinfer.convert as conv
        return conv
    except ImportError:
        pass
    bindings = Path(__file__).resolve().parent / "bindings"
    if str(bindings) not in sys.path:
        sys.path.insert(0, str(bindings))
    try:
        import powerinfer.convert as conv
        return conv
    except ImportError:
        if not (bindings / "powerinfer" / "convert").is_dir():
            raise
    import types
    for k in [k for k in sys.modules if k == "powerinfer" or k.startswith("powerinfer.")]:
        del sys.modules[k]
    pkg = types.ModuleType("powerinfer")
    pkg.__path__ = [str(bindings / "powerinfer")]
    sys.modules["powerinfer"] = pkg
    import powerinfer.convert as conv
    return conv


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message):              # one line and exit status 1, like every other failure
        self.exit(1, f"{self.prog}: error: {message}\n")


def main(argv=None, *, sparse: bool = True) -> int:
    prog = "convert.py" if sparse else "convert-dense.py"
    ap = _ArgumentParser(
        prog=prog,
        description=("HF llama/bamboo checkpoint + PowerInfer predictors -> PowerInfer sparse GGUF (PWRI)"
                     if sparse else "HF llama/bamboo checkpoint -> dense GGUF"))
    ap.add_argument("--outfile", type=Path, default=None,
                    help=("output file (default: MODEL_DIR/<name>.powerinfer.gguf)" if sparse
                          else "output file (default: MODEL_DIR/ggml-model-<outtype>.gguf)"))
    ap.add_argument("--outtype", choices=OUTTYPES, default="f16",
                    help="type of the 2-D weights; 1-D tensors are always f32 (default: f16)")
    ap.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="Hugging Face checkpoint directory")
    if sparse:
        ap.add_argument("predictor_dir", type=Path, metavar="PREDICTOR_DIR",
                        help="directory with model_0.pt, model_1.pt, ...")
    else:
        ap.add_argument("--down-t", action="store_true",
                        help="also write blk.N.ffn_down_t (the down matrix transposed, quantized from the checkpoint "
                             "itself): tools/sparsify.py keeps it instead of re-quantizing a quantized ffn_down")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)

    def convert(conv, progress):
        if sparse:
            conv.convert_sparse(a.model_dir, a.predictor_dir, a.outfile, a.outtype, progress=progress)
        else:
            conv.convert_dense(a.model_dir, a.outfile, a.outtype, progress=progress, down_t=a.down_t)
    return run(prog, a.quiet, convert)


def run(prog: str, quiet: bool, convert) -> int:
    """convert(conv, progress) with the converters' log on stderr (warnings only when quiet), progress lines there
    (None when quiet), SIGTERM unwinding as Ctrl+C does (so the temporary file is removed): 0, or one error line
    and 1 (130 when interrupted). Shared by convert.py, convert-dense.py and convert-lora.py."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("powerinfer.convert")
    log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_sigterm)

    try:
        conv = _import_convert()
    except ImportError as e:
        print(f"{prog}: error: cannot import the converters: {e}", file=sys.stderr)
        return 1
    try:
        convert(conv, None if quiet else progress)
    except (conv.ConversionError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        log.removeHandler(handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
