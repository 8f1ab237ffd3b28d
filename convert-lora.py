#!/usr/bin/env python3
"""Convert a Hugging Face PEFT LoRA adapter to a llama.cpp GGUF LoRA adapter file (what llama.cpp's
--lora and llama-cpp-python's Llama(lora_path=...) load), as llama.cpp's convert_lora_to_gguf.py does.

    python convert-lora.py --base BASE [--outfile F] [--outtype f32|f16|bf16|q8_0] ADAPTER_DIR

ADAPTER_DIR: adapter_config.json and adapter_model.safetensors (or adapter_model.bin).
BASE: the base model's Hugging Face checkpoint directory (its config.json) or a GGUF file of it.
Default output: ADAPTER_DIR/ggml-lora-<outtype>.gguf; default outtype f16. rsLoRA adapters are written
with alpha = lora_alpha * sqrt(r) (llama.cpp scales by alpha / r). Layout and limits: the docstring of
bindings/powerinfer/convert/lora.py. On failure: one error line, exit status 1.
"""
import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_powerinfer_convert_cli",
                                               Path(__file__).resolve().parent / "convert.py")
_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cli)

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
PROG = "convert-lora.py"


def main(argv=None) -> int:
    ap = _cli._ArgumentParser(prog=PROG, description="Hugging Face PEFT LoRA adapter -> llama.cpp GGUF LoRA adapter")
    ap.add_argument("--base", type=Path, required=True,
                    help="the base model: its Hugging Face checkpoint directory (config.json) or a GGUF file of it")
    ap.add_argument("--outfile", type=Path, default=None,
                    help="output file (default: ADAPTER_DIR/ggml-lora-<outtype>.gguf)")
    ap.add_argument("--outtype", choices=OUTTYPES, default="f16",
                    help="tensor type; with q8_0, tensors with rows not a multiple of 32 stay f16 (default: f16)")
    ap.add_argument("adapter_dir", type=Path, metavar="ADAPTER_DIR",
                    help="PEFT adapter directory (adapter_config.json, adapter_model.safetensors)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)

    return _cli.run(PROG, a.quiet, lambda conv, progress: conv.convert_lora(a.adapter_dir, a.base, a.outfile,
                                                                           a.outtype, progress=progress))


if __name__ == "__main__":
    sys.exit(main())
