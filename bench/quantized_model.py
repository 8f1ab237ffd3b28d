"""The bench model makers' last step: a model written as f16 by `write_f16(path)`, then quantized by our llama-quantize
twin (tools/quantize.py: the same bytes as llama.cpp's quantizer) into `out`."""
from __future__ import annotations

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
