"""Tiny random GGUF models of the llama-family architectures added in issue 7 (llama/mistral, qwen2,
gemma3), with the tensor names and metadata llama.cpp's converters write.

    write_arch_model(path, "gemma3", seed=0)  -> dict of the float weights

reference_model.ReferenceModel is the reference of tests/test_arch.py; llama.cpp itself is the
reference of tests/compat/ (these same files, loaded by llama-cpp-python).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_test_model import synthetic_vocab  # noqa: E402

CONFIGS = {
    # llama: GQA, rope "normal" pairs
    "llama": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=3, head_dim=32,
                  rope_base=10000.0, eps=1e-5),
    # qwen2: llama + q/k/v biases, NEOX rope, tied output
    "qwen2": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_layer=3, head_dim=32,
                  rope_base=1000000.0, eps=1e-6),
    # gemma3: head_dim (key_length 64) != n_embd / n_head (32); 7 layers = 5 local, 1 global (il = 5),
    # 1 local; a sliding window of 5 positions so that a 16-token prompt exercises it
    "gemma3": dict(n_vocab=320, n_embd=128, n_ff=256, n_head=4, n_head_kv=1, n_layer=7, head_dim=64,
                   rope_base=1000000.0, eps=1e-6, n_swa=5),
}
CONFIGS["mistral"] = CONFIGS["llama"]


def make_weights(arch: str, seed: int = 0, rope_freqs: bool = False) -> dict[str, np.ndarray]:
    """Float32 weights (numpy shapes: (out, in) for matrices) under their GGUF names. rope_freqs: add
    Llama 3.1-style frequency factors (rope_freqs.weight, [head_dim/2], from 1 up to 8 for low frequencies)."""
    c = CONFIGS[arch]
    rng = np.random.default_rng(seed)
    E, F, V, hd = c["n_embd"], c["n_ff"], c["n_vocab"], c["head_dim"]
    Eq, Ekv = c["n_head"] * hd, c["n_head_kv"] * hd

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((V, E)).astype(np.float32) * (0.05 if arch == "gemma3" else 1.0),
         "output_norm.weight": norm(E)}
    if arch in ("llama", "mistral"):
        w["output.weight"] = mat(V, E)
    if rope_freqs:
        w["rope_freqs.weight"] = np.geomspace(1.0, 8.0, hd // 2).astype(np.float32)
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(E)
        w[p + "attn_q.weight"] = mat(Eq, E)
        w[p + "attn_k.weight"] = mat(Ekv, E)
        w[p + "attn_v.weight"] = mat(Ekv, E)
        w[p + "attn_output.weight"] = mat(E, Eq)
        w[p + "ffn_norm.weight"] = norm(E)
        w[p + "ffn_gate.weight"] = mat(F, E)
        w[p + "ffn_up.weight"] = mat(F, E)
        w[p + "ffn_down.weight"] = mat(E, F)
        if arch == "qwen2":
            for k, n in (("q", Eq), ("k", Ekv), ("v", Ekv)):
                w[p + f"attn_{k}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if arch == "gemma3":
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
            w[p + "post_attention_norm.weight"] = norm(E)
            w[p + "post_ffw_norm.weight"] = norm(E)
    return w


def write_arch_model(path, arch: str, seed: int = 0, weights: dict | None = None,
                     chat_template: str | None = None) -> dict[str, np.ndarray]:
    """Write an f32 GGUF of `arch` (general.architecture as given) and return its weights."""
    c = CONFIGS[arch]
    w = make_weights(arch, seed) if weights is None else weights
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(512)
    writer.add_embedding_length(c["n_embd"])
    writer.add_block_count(c["n_layer"])
    writer.add_feed_forward_length(c["n_ff"])
    writer.add_head_count(c["n_head"])
    writer.add_head_count_kv(c["n_head_kv"])
    writer.add_layer_norm_rms_eps(c["eps"])
    writer.add_rope_freq_base(c["rope_base"])
    if arch == "gemma3":
        writer.add_key_length(c["head_dim"])
        writer.add_value_length(c["head_dim"])
        writer.add_sliding_window(c["n_swa"])
    else:
        writer.add_rope_dimension_count(c["head_dim"])
    tokens, scores, types = synthetic_vocab(c["n_vocab"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for name, arr in w.items():
        writer.add_tensor(name, np.ascontiguousarray(arr, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return w
