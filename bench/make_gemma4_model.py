#!/usr/bin/env python3
"""A Gemma 4 E2B-shaped file (random weights) for `bench.py`'s comparison with llama.cpp.

    python bench/make_gemma4_model.py [OUT.gguf] [--layers 10] [--type q4_k_m]

Gemma 4 E2B's shapes (n_embd 1536, 8 query heads, one KV head of 256 (local) / 512 (global), FFN 6144 and twice
that in the shared-KV layers, per-layer embeddings of 256, Gemma's 262144-token vocabulary, a window of 512) with
fewer layers (default 10 of its 35, four local to one global as E2B, the last half sharing the KV of the layers
before them, as E2B's last 20 do). Written as f16 with tests/model_files.py's gemma4 writer, then quantized by our
llama-quantize twin (powerinfer.quantize: the same bytes as llama.cpp's quantizer) to --type (default q4_k_m).
About 1.6 B parameters with the per-layer token table (0.5 B in the layers); 12 GB of memory and 3 minutes on 2 cores.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.model_files import gemma4_ple_weights, write_gemma4_model  # noqa: E402
from quantized_model import maker_main  # noqa: E402


def e2b_config(n_layer: int) -> dict:
    """E2B's shapes over n_layer layers (a multiple of 10: the shared half starts after a global layer)."""
    local = [int(il % 5 != 4) for il in range(n_layer)]
    shared = n_layer // 2
    n_ff = [6144 if il < n_layer - shared else 12288 for il in range(n_layer)]
    return dict(n_vocab=262144, n_embd=1536, n_head=8, n_layer=n_layer, local=tuple(local), head_dim=512,
                head_dim_swa=256, n_head_kv=(1,) * n_layer, n_ff=tuple(n_ff), n_rot_pairs=64, rope_base=1000000.0,
                rope_base_swa=10000.0, eps=1e-6, n_swa=512, shared_kv=shared, final_softcap=30.0)


def write_f16(path: str, n_layer: int) -> None:
    c = e2b_config(n_layer)
    w = gemma4_ple_weights(c, seed=0, n_pl=256)
    write_gemma4_model(path, w, c, dtype="f16", meta={"embedding_length_per_layer_input": 256, "context_length": 32768})


def main(argv=None) -> int:
    return maker_main(__doc__, "/tmp/gemma4_e2b_shape.gguf", 10,
                      lambda n: None if n >= 10 and n % 10 == 0 else "--layers must be a multiple of 10", write_f16,
                      argv)


if __name__ == "__main__":
    sys.exit(main())
