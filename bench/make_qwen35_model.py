#!/usr/bin/env python3
"""A Qwen3.5-0.8B-shaped file (random weights) for `bench.py`'s comparison with llama.cpp.

    python bench/make_qwen35_model.py [OUT.gguf] [--layers 4] [--type q4_k_m]

Qwen3.5-0.8B's shapes (n_embd 1024, FFN 3584; gated delta net layers of 16 key and 16 value heads of 128, a conv of
4; full-attention layers every 4th of 8 heads of 256 with 2 KV heads, rope over 64 dims, M-RoPE sections 11/11/10;
248320 tokens) over fewer layers (default 4 of its 24: three gated delta nets, then one full attention), in the
converter's layout. Written as f16 with tests/model_files.py's qwen35 writer, then quantized by our llama-quantize twin
(powerinfer.quantize) to --type (default q4_k_m). 0.31 B parameters at 4 layers (0.25 B of them the token table and
the head).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.model_files import write_qwen35_model  # noqa: E402
from quantized_model import maker_main  # noqa: E402


def qwen35_08b_config(n_layer: int) -> dict:
    return dict(n_vocab=248320, n_embd=1024, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256, n_rot=64,
                n_layer=n_layer, interval=4, d_conv=4, d_state=128, n_group=16, dt_rank=16, eps=1e-6,
                rope_base=10000000.0, sections=[11, 11, 10, 0])


def main(argv=None) -> int:
    return maker_main(__doc__, "/tmp/qwen35_08b_shape.gguf", 4,
                      lambda n: None if n >= 4 else
                      "--layers must be at least 4 (three gated delta nets, then a full-attention layer)",
                      lambda path, n: write_qwen35_model(path, "qwen35", seed=0, dtype="f16", c=qwen35_08b_config(n),
                                                         meta={"context_length": 262144}), argv)


if __name__ == "__main__":
    sys.exit(main())
