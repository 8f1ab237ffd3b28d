#!/usr/bin/env python3
"""Convert a Hugging Face llama/bamboo checkpoint to a dense GGUF file (GGUF magic,
untransposed ffn_down, no predictors). It records the FFN activation
(powerinfer.ffn_activation), so ReLU models run with ReLU in dense mode too.

    python convert-dense.py [--outfile F] [--outtype f32|f16|q8_0|q4_0] MODEL_DIR

Default output: MODEL_DIR/ggml-model-<outtype>.gguf. On failure: one error line, exit status 1.
"""
import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_powerinfer_convert_cli",
                                               Path(__file__).resolve().parent / "convert.py")
_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cli)


def main(argv=None) -> int:
    return _cli.main(argv, sparse=False)


if __name__ == "__main__":
    sys.exit(main())
