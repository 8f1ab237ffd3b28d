#!/usr/bin/env python3
"""A GLM-4.5-Air-shaped file (random weights) for `bench.py`'s comparison with llama.cpp.

    python bench/make_glm4moe_model.py [OUT.gguf] [--layers 3] [--type q4_k_m]

GLM-4.5-Air's shapes (n_embd 4096, 96 query heads and 8 KV heads of 128, rope over 64 of them, q/k/v biases; a dense
first layer of 10944, then 128 experts of 1408 with 8 per token chosen by sigmoid + the selection bias, renormalized,
and one shared expert; 151552 tokens) over fewer layers (default 3 of its 46: one dense, two with experts), without its
MTP layer (the loaders leave it out). The keys are tests/model_files.py's (moe_arch_keys); the tensors are written one
at a time as f16 (an expert layer's stacks are 4.4 GB in f16: the whole model does not fit in memory), then quantized
by our llama-quantize twin (powerinfer.quantize: the same bytes as llama.cpp's quantizer) to --type (default q4_k_m).
6.2 B parameters at 3 layers (2.2 B per expert layer, 1.2 B of embeddings and output); a 12 GB f16 file on the way,
about 10 minutes on 2 cores.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFWriter  # noqa: E402

from tests.model_files import add_moe_arch_keys, moe_arch_keys  # noqa: E402
from quantized_model import maker_main  # noqa: E402


def air_config(n_layer: int) -> dict:
    return dict(n_vocab=151552, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128, n_rot=64, n_layer=n_layer,
                n_ff=10944, n_expert=128, n_expert_used=8, n_ff_exp=1408, n_ff_shexp=1408, n_dense=1, nextn=0)


def tensor_specs(c: dict) -> list[tuple[str, tuple, str]]:
    """(name, numpy shape, kind) in tests/model_files.moe_arch_weights's layout; kind: mat (std 1 / sqrt(n_in)), norm
    (1 + 0.1 N), bias (0.1 N), router (3 / sqrt(n_in)), probs_b (0.3 N), embd (8 / sqrt(n_embd)), exps (a stack of
    mats)."""
    E, H, Hkv, hd, NE, Fe = c["n_embd"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_expert"], c["n_ff_exp"]
    specs = [("token_embd.weight", (c["n_vocab"], E), "embd"), ("output_norm.weight", (E,), "norm"),
             ("output.weight", (c["n_vocab"], E), "mat")]
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        specs += [(p + "attn_norm.weight", (E,), "norm"), (p + "attn_q.weight", (H * hd, E), "mat"),
                  (p + "attn_k.weight", (Hkv * hd, E), "mat"), (p + "attn_v.weight", (Hkv * hd, E), "mat"),
                  (p + "attn_q.bias", (H * hd,), "bias"), (p + "attn_k.bias", (Hkv * hd,), "bias"),
                  (p + "attn_v.bias", (Hkv * hd,), "bias"), (p + "attn_output.weight", (E, H * hd), "mat"),
                  (p + "post_attention_norm.weight", (E,), "norm")]
        if il < c["n_dense"]:
            specs += [(p + "ffn_gate.weight", (c["n_ff"], E), "mat"), (p + "ffn_up.weight", (c["n_ff"], E), "mat"),
                      (p + "ffn_down.weight", (E, c["n_ff"]), "mat")]
            continue
        specs += [(p + "ffn_gate_inp.weight", (NE, E), "router"), (p + "ffn_gate_exps.weight", (NE, Fe, E), "exps"),
                  (p + "ffn_up_exps.weight", (NE, Fe, E), "exps"), (p + "ffn_down_exps.weight", (NE, E, Fe), "exps"),
                  (p + "ffn_gate_shexp.weight", (c["n_ff_shexp"], E), "mat"),
                  (p + "ffn_up_shexp.weight", (c["n_ff_shexp"], E), "mat"),
                  (p + "ffn_down_shexp.weight", (E, c["n_ff_shexp"]), "mat"),
                  (p + "exp_probs_b.bias", (NE,), "probs_b")]
    return specs


def random_tensor(rng, shape: tuple, kind: str) -> np.ndarray:
    if kind in ("norm", "bias", "probs_b"):
        v = rng.standard_normal(shape, dtype=np.float32)
        return (1.0 + 0.1 * v if kind == "norm" else (0.1 if kind == "bias" else 0.3) * v).astype(np.float32)
    scale = {"embd": 8.0, "router": 3.0}.get(kind, 1.0) / math.sqrt(shape[-1])
    out = np.empty(shape, dtype=np.float16)
    for i in range(shape[0]):      # a row block (an expert) at a time: f16 out, one f32 block in memory
        out[i] = rng.standard_normal(shape[1:], dtype=np.float32) * np.float32(scale)
    return out


def write_f16(path, c: dict, seed: int = 0) -> None:
    """The model's file, f16 matrices (1-d tensors f32), each tensor made and written in turn."""
    rng = np.random.default_rng(seed)
    keys = moe_arch_keys("glm4moe", c, meta={"context_length": 32768, "rope.freq_base": 1000000.0})
    w = GGUFWriter(str(path), "glm4moe")
    add_moe_arch_keys(w, "glm4moe", keys)
    specs = tensor_specs(c)
    for name, shape, kind in specs:
        f32 = len(shape) == 1
        n = int(np.prod(shape)) * (4 if f32 else 2)
        w.add_tensor_info(name, shape, np.dtype(np.float32 if f32 else np.float16), n,
                          raw_dtype=Q.F32 if f32 else Q.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in specs:
        w.write_tensor_data(random_tensor(rng, shape, kind))
    w.close()


def main(argv=None) -> int:
    return maker_main(__doc__, "/tmp/glm45_air_shape.gguf", 3,
                      lambda n: None if n >= 2 else "--layers must be at least 2 (a dense layer, then experts)",
                      lambda path, n: write_f16(path, air_config(n)), argv)


if __name__ == "__main__":
    sys.exit(main())
