"""The bench model makers' command line (maker_main) and last step: a model written as f16 by `write_f16(path)`,
then quantized by our llama-quantize twin (tools/quantize.py: the same bytes as llama.cpp's quantizer) into `out`."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_quantized(out: str, ftype: str, write_f16) -> int:
    """Writes `out` of llama.cpp file type `ftype` (f16: write_f16's file itself); the exit status (0: done)."""
    if ftype.lower() == "f16":
        write_f16(out)
        return 0
    with tempfile.TemporaryDirectory(dir=Path(out).parent) as d:
        f16 = os.path.join(d, "f16.gguf")
        write_f16(f16)
        return subprocess.call([sys.executable, str(ROOT / "tools" / "quantize.py"), f16, out, ftype.upper()])


def maker_main(doc: str, default_out: str, default_layers: int, layers_error, write_f16, argv=None) -> int:
    """The makers' command line: `[OUT.gguf] [--layers N] [--type T]`, the description doc's first paragraph.
    layers_error(n) is the message refusing n layers (None: accepted); write_f16(path, n_layers) writes the f16 file.
    Prints OUT once written; the exit status (0: done)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=default_out)
    ap.add_argument("--layers", type=int, default=default_layers)
    ap.add_argument("--type", default="q4_k_m", help="a powerinfer.quantize file type (f16: no quantization)")
    a = ap.parse_args(argv)
    err = layers_error(a.layers)
    if err:
        ap.error(err)
    rc = write_quantized(a.out, a.type, lambda path: write_f16(path, a.layers))
    if rc:
        return rc
    print(a.out)
    return 0
