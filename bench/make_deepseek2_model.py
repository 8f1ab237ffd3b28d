#!/usr/bin/env python3
"""A DeepSeek-V2-Lite-shaped file (random weights) for `bench.py`'s comparison with llama.cpp.

    python bench/make_deepseek2_model.py [OUT.gguf] [--layers 4] [--type q4_k_m]

DeepSeek-V2-Lite's shapes (n_embd 2048, 16 heads, MLA with kv_lora_rank 512, 64 rope and 128 no-rope dims per q/k
head, 128 per v head; a dense first layer of 10944, then 64 experts of 1408, 6 per token, and 2 shared; 102400 tokens)
over fewer layers (default 4 of its 27), in the newer files' absorbed layout (attn_k_b / attn_v_b). Written as f16 with
tests/model_files.py's deepseek2 writer, then quantized by our llama-quantize twin (powerinfer.quantize: the same
bytes as llama.cpp's quantizer) to --type (default q4_k_m). 2.2 B parameters at 4 layers (0.55 B per expert layer);
about 12 GB of memory and 3 minutes on 2 cores.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.model_files import write_deepseek2_model  # noqa: E402
from quantized_model import maker_main  # noqa: E402


def v2_lite_config(n_layer: int) -> dict:
    return dict(n_vocab=102400, n_embd=2048, n_ff=10944, n_head=16, n_layer=n_layer, kv_lora_rank=512, n_rot=64,
                nope=128, v=128, n_expert=64, n_expert_used=6, n_ff_exp=1408, n_shared=2, n_dense=1, eps=1e-6,
                rope_base=10000.0)


def main(argv=None) -> int:
    return maker_main(__doc__, "/tmp/deepseek2_lite_shape.gguf", 4,
                      lambda n: None if n >= 2 else "--layers must be at least 2 (a dense layer, then experts)",
                      lambda path, n: write_deepseek2_model(path, seed=0, dtype="f16", c=v2_lite_config(n),
                                                            meta={"context_length": 32768}), argv)


if __name__ == "__main__":
    sys.exit(main())
