"""Encoder models (the BERT family) as llama.cpp runs them: the architectures, their hyper-parameters, tensor views.

    bert        all-MiniLM, bge-*, mxbai-embed, snowflake-arctic-embed, e5 (WordPiece vocabularies) and the rerankers
                llama.cpp converts as bert with a classifier head (cls / cls.output, pooling rank): learned
                position embeddings, q/k/v/o biases, a GELU FFN with biases, no rope
    nomic-bert  nomic-embed-text v1 / v1.5: rope (NEOX), a fused attn_qkv without biases, a SwiGLU FFN

Both are the core's PI_ARCH_BERT (core/include/powerinfer.h): the embeddings' LayerNorm, attention over each sequence
of a batch in both directions, post-LayerNorm blocks, no output norm and no head. A context outputs embeddings only;
an input must be decoded whole (one decode per input: llama.cpp's n_ubatch >= the input), so inputs longer than
the model's positions (n_ctx_train) or the context's batch are refused. Other encoder architectures llama.cpp has are
refused by name (ENCODER_REFUSED).
"""
from __future__ import annotations

from ._ffi import lib
from .gguf_file import ModelLoadError

__all__ = ["ENCODER_ARCHS", "ENCODER_REFUSED", "is_encoder", "encoder_hparams", "encoder_views", "refuse_generation"]

ENCODER_ARCHS = {"bert": lib.PI_ARCH_BERT, "nomic-bert": lib.PI_ARCH_BERT}
ENCODER_REFUSED = {
    "nomic-bert-moe": "nomic-embed-text v2 (nomic-bert with mixture-of-experts layers)",
    "jina-bert-v2": "jina-embeddings-v2 (ALiBi attention, GEGLU FFN)",
    "jina-bert-v3": "jina-embeddings-v3 (XLM-RoBERTa with LoRA tasks)",
    "modern-bert": "ModernBERT (alternating local / global attention, GEGLU)",
    "neo-bert": "NeoBERT",
    "eurobert": "EuroBERT",
    "t5encoder": "the T5 encoder",
    "t5": "T5 (encoder-decoder)",
}


def is_encoder(arch: str) -> bool:
    return arch in ENCODER_ARCHS


def refuse_unsupported(path, arch: str) -> None:
    """ModelLoadError naming an encoder architecture this build does not run (llama.cpp does)."""
    if arch in ENCODER_REFUSED:
        raise ModelLoadError(f"{path}: the encoder architecture '{arch}' ({ENCODER_REFUSED[arch]}) is not supported; "
                             f"encoders that run: {', '.join(ENCODER_ARCHS)}")


def encoder_hparams(path, arch: str, get, as_float) -> dict:
    """What an encoder changes from llama's defaults (HParams fields; llama.cpp's bert and nomic-bert graphs). get,
    as_float: _hparams_from_metadata's readers of the file's keys."""
    if get("attention.causal", False):
        raise ModelLoadError(f"{path}: {arch}.attention.causal is true; an encoder attends in both directions")
    eps = as_float("attention.layer_norm_epsilon", get("attention.layer_norm_epsilon", required=True))
    if arch == "nomic-bert":     # rope (NEOX), SwiGLU, no biases (the fused attn_qkv: encoder_views)
        return dict(norm_eps=eps, rope_mode="neox", ffn_act="silu", ffn_gate="par")
    # bert: learned positions, no rope in any layer, GELU without a gate; biases where the file has them
    return dict(norm_eps=eps, ffn_act="gelu", ffn_gate="seq", n_no_rope_layer_step=1)


def encoder_views(path, tensors: dict, hp) -> tuple[dict, dict]:
    """The tensor checks of an encoder and the pi_hparams flags the file's biases set (llama.cpp's bert loader reads
    q/k/v and output biases where a file has them)."""
    if hp.arch == "bert" and "position_embd.weight" not in tensors:
        raise ModelLoadError(f"{path}: bert without position_embd.weight")
    flags = {"qkv_bias": int("blk.0.attn_q.bias" in tensors), "attn_out_bias": int("blk.0.attn_output.bias" in tensors)}
    return tensors, flags


def refuse_generation(model, what: str = "text generation") -> None:
    """ValueError for a program or route that generates text from an encoder (it has no output head)."""
    arch = model.hparams.arch
    if is_encoder(arch):
        raise ValueError(f"{model.path.name} is an encoder model ({arch}): it has no output head and cannot do "
                         f"{what}; use it for embeddings (--embedding) or reranking (--rerank)")
