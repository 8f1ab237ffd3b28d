"""Tiny encoder files (the BERT family, powerinfer.encoder) with a WordPiece vocabulary in llama.cpp's converted form,
written through model_files.write_gguf:

    write_bert_model(path, "bert", dtype="f16", seed=0)               bert: positions, biases, GELU FFN
    write_bert_model(path, "nomic-bert", ...)                         nomic-bert: rope, fused attn_qkv, SwiGLU
    write_bert_model(path, "bert", rerank=True)                       + the classifier head (cls, cls.output), rank
    write_bert_model(path, "bert", shape=MINILM_L6)                   all-MiniLM-L6 / bge-small's shapes (bench)

The vocabulary (WPM_TOKENS) is BERT's layout: [PAD] 0, [unused*] 1..99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103,
then word-initial pieces ("▁word") and continuations ("ing"), single characters of both kinds (ASCII, accented
Latin, Greek, Cyrillic, CJK), so WordPiece's greedy cut, its [UNK] and its normalization all take part.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFValueType as VT

from model_files import write_gguf

SPACE = "\u2581"
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
WORDS = ("the quick brown fox jumps over lazy dog hello world what is a cat cats dog dogs embedding embed un able "
         "token tokens tokenizer sentence sentences search query document relevant relevance paris france capital "
         "of in and to for with this that it be are was i you we they me my machine learning model models "
         "encoder bert rank rerank score good bad very much")
PIECES = ("ing", "ed", "s", "es", "er", "ers", "ly", "able", "aff", "iza", "tion", "un", "ment", "ness", "##")
CHARS = ("abcdefghijklmnopqrstuvwxyz0123456789" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "ßæøåœ" + "αβγδλ"
         + "абвгд" + "中文字日本語の世界你好" + "한국")


def wpm_vocab() -> tuple[list[str], list[int]]:
    tokens = ["[PAD]"] + [f"{SPACE}[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [TOKEN_CONTROL] + [TOKEN_NORMAL] * 99 + [TOKEN_CONTROL] * 4
    seen = set(tokens)
    for t in ([SPACE + w for w in WORDS.split()] + list(PIECES) + [SPACE + c for c in CHARS] + list(CHARS)):
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            types.append(TOKEN_NORMAL)
    return tokens, types


WPM_TOKENS, WPM_TYPES = wpm_vocab()
TINY = dict(n_embd=64, n_head=4, n_ff=128, n_layer=2, n_ctx_train=128)
MINILM_L6 = dict(n_embd=384, n_head=12, n_ff=1536, n_layer=6, n_ctx_train=512)   # all-MiniLM-L6-v2, bge-small: 12 L


def bert_weights(arch: str, seed: int, shape: dict, n_vocab: int, rerank: bool = False) -> dict[str, np.ndarray]:
    """Random weights under llama.cpp's names (numpy shape = reversed ne), scaled like a trained encoder's."""
    rng = np.random.default_rng(seed)
    E, F, L = shape["n_embd"], shape["n_ff"], shape["n_layer"]

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vec(n, scale=0.1):
        return (rng.standard_normal(n) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)
    w = {"token_embd.weight": (rng.standard_normal((n_vocab, E)) * 0.5).astype(np.float32),
         "token_types.weight": (rng.standard_normal((2, E)) * 0.5).astype(np.float32),
         "token_embd_norm.weight": norm(E), "token_embd_norm.bias": vec(E)}
    if arch == "bert":
        w["position_embd.weight"] = (rng.standard_normal((shape["n_ctx_train"], E)) * 0.5).astype(np.float32)
    for il in range(L):
        p = f"blk.{il}."
        if arch == "nomic-bert":
            w[p + "attn_qkv.weight"] = mat(3 * E, E)
            w[p + "ffn_gate.weight"] = mat(F, E)
        else:
            for part in ("attn_q", "attn_k", "attn_v"):
                w[p + part + ".weight"], w[p + part + ".bias"] = mat(E, E), vec(E)
            w[p + "attn_output.bias"] = vec(E)
            w[p + "ffn_up.bias"], w[p + "ffn_down.bias"] = vec(F), vec(E)
        w[p + "attn_output.weight"] = mat(E, E)
        w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"] = norm(E), vec(E)
        w[p + "ffn_up.weight"], w[p + "ffn_down.weight"] = mat(F, E), mat(E, F)
        w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"] = norm(E), vec(E)
    if rerank:
        w["cls.weight"], w["cls.bias"] = mat(E, E), vec(E)
        w["cls.output.weight"], w["cls.output.bias"] = mat(1, E), vec(1)
    return w


def write_bert_model(path, arch: str = "bert", *, dtype: str = "f32", seed: int = 0, shape: dict | None = None,
                     rerank: bool = False, pooling: int | None = None, tokens: list[str] | None = None,
                     types: list[int] | None = None, lowercase: bool | None = None):
    """A tiny encoder file; pooling: the file's pooling_type (llama.cpp's ids; default mean, rank with rerank)."""
    shape = {**TINY, **(shape or {})}
    tokens, types = (tokens or WPM_TOKENS), (types or WPM_TYPES)
    weights = bert_weights(arch, seed, shape, len(tokens), rerank)
    pooling = pooling if pooling is not None else 4 if rerank else 1

    def keys(wr):
        wr.add_context_length(shape["n_ctx_train"])
        wr.add_embedding_length(shape["n_embd"])
        wr.add_feed_forward_length(shape["n_ff"])
        wr.add_block_count(shape["n_layer"])
        wr.add_head_count(shape["n_head"])
        wr.add_layer_norm_eps(1e-12)
        wr.add_causal_attention(False)
        wr.add_uint32(f"{arch}.pooling_type", pooling)
        if arch == "nomic-bert":
            wr.add_rope_freq_base(1000.0)
        wr.add_token_type_count(2)
        wr.add_tokenizer_model("bert")
        wr.add_tokenizer_pre("default")
        wr.add_token_list(tokens)
        wr.add_token_types(types)
        wr.add_bos_token_id(101)
        wr.add_sep_token_id(102)
        wr.add_unk_token_id(100)
        wr.add_pad_token_id(0)
        wr.add_mask_token_id(103)
        if lowercase is not None:
            wr.add_key_value("tokenizer.ggml.normalizer.lowercase", lowercase, VT.BOOL)
        if rerank:
            wr.add_classifier_output_labels(["score"])
    # llama.cpp's converter keeps token_types and position_embd in f32 (its graph adds the type row as it is)
    return write_gguf(path, arch, weights, dtype=dtype, keys=keys,
                      dtypes={"token_types": "f32", "position_embd": "f32"}), weights
