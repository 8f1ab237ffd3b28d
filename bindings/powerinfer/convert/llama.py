"""Hugging Face llama / bamboo checkpoint (+ PowerInfer predictors) -> PWRI or dense GGUF.

Tensor layout (powerinfer-spec.md 1.4; GGUF ne = numpy shape reversed):

======================  ==========================  ================================
GGUF name               from (HF)                   notes
======================  ==========================  ================================
token_embd.weight       model.embed_tokens.weight
output_norm.weight      model.norm.weight           F32
output.weight           lm_head.weight              omitted if tie_word_embeddings
blk.N.attn_norm         input_layernorm             F32
blk.N.attn_q            self_attn.q_proj            rows permuted HF rotate_half -> interleaved
blk.N.attn_k            self_attn.k_proj            same, with n_head_kv heads
blk.N.attn_v/output     self_attn.v_proj/o_proj
blk.N.ffn_norm          post_attention_layernorm    F32
blk.N.ffn_gate/up       mlp.gate_proj/up_proj       row i = neuron i
blk.N.ffn_down          mlp.down_proj               dense files only, as is (ne [n_ff, n_embd])
blk.N.ffn_down_t        mlp.down_proj transposed    sparse files, and dense ones with down_t=True (beside
                                                    ffn_down, for tools/sparsify.py) (ne [n_embd, n_ff])
blk.N.fc1 / fc2         predictor model_N.pt        sparse files only (ne [n_embd, r], [r, n_ff])
======================  ==========================  ================================

Types (``outtype``): every 1-D tensor is F32; every 2-D tensor (predictors included) is
``outtype``; a tensor whose rows cannot be split into 32-element blocks falls back to F16 for
the quantized outtypes (with a warning).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import gguf

from .. import quants
from .common import FLOAT_DTYPES, ConversionError, LazyTensor, log
from .hf import HParams, Vocab, hparams_from_config, load_config, load_tensors, load_vocab
from .predictors import Predictors, load_predictors
from .writer import TensorSpec, write_gguf

OUTTYPES = ("f32", "f16", "q8_0", "q4_0")
ACTIVATION_KEY = "powerinfer.ffn_activation"
THRESHOLD_KEY = "powerinfer.sparse_threshold"
_IGNORED = ("rotary_emb.inv_freq", "rope.freqs")


@dataclass
class ConversionResult:
    path: Path
    arch: str
    outtype: str
    sparse: bool
    n_tensors: int
    tensor_types: dict[str, str]                 # GGUF name -> type name
    warnings: list[str] = field(default_factory=list)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k_proj rows (per head: [first half, second half], rotate_half RoPE) -> GGUF order
    (per head: interleaved pairs (0, hd/2), (1, hd/2+1), ...), as llama.cpp's convert does."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
             .swapaxes(1, 2).reshape(w.shape))


# Hugging Face module -> GGUF tensor (the table in the module doc): outside the layers, and under
# model.layers.N. -> blk.N.; the ".weight" suffix is kept (gguf_name)
HF_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
HF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_LAYER_RX = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(hf_name: str) -> str | None:
    """HF tensor name -> its tensor in a dense GGUF file (model.layers.3.self_attn.q_proj.weight ->
    blk.3.attn_q.weight, lm_head.weight -> output.weight); None for a module the file has no tensor of."""
    module, _, suffix = hf_name.rpartition(".")
    if module in HF_GLOBAL_NAMES:
        return f"{HF_GLOBAL_NAMES[module]}.{suffix}"
    m = _LAYER_RX.fullmatch(module)
    if m and m.group(2) in HF_LAYER_NAMES:
        return f"blk.{m.group(1)}.{HF_LAYER_NAMES[m.group(2)]}.{suffix}"
    return None


def hf_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    """HF name -> numpy shape ((n_out, n_in) for matrices) of every checkpoint tensor a dense file
    converts, from config.json (lm_head.weight only when the embeddings are not tied)."""
    E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
    E_kv = hp.head_dim * hp.n_head_kv
    shapes = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,)}
    if not hp.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, E)
    layer = {"input_layernorm": (E,), "self_attn.q_proj": (E, E), "self_attn.k_proj": (E_kv, E),
             "self_attn.v_proj": (E_kv, E), "self_attn.o_proj": (E, E), "post_attention_layernorm": (E,),
             "mlp.gate_proj": (F, E), "mlp.up_proj": (F, E), "mlp.down_proj": (E, F)}
    for i in range(hp.n_layer):
        shapes.update((f"model.layers.{i}.{m}.weight", s) for m, s in layer.items())
    return shapes


def _check_outtype(outtype: str) -> str:
    if not isinstance(outtype, str) or outtype.lower() not in OUTTYPES:
        raise ConversionError(f"unknown outtype {outtype!r} (choose one of {', '.join(OUTTYPES)})")
    return outtype.lower()


class _Plan:
    """The tensors to write and their types. warn_each=False: no warning per f16 fallback (the caller
    sums up `fallbacks`)."""

    def __init__(self, outtype: str, *, warn_each: bool = True):
        self.outtype = outtype
        self.warn_each = warn_each
        self.specs: list[TensorSpec] = []
        self.warnings: list[str] = []
        self.fallbacks: list[str] = []       # tensors stored as f16: rows not a multiple of outtype's block

    def add(self, name: str, shape: tuple[int, ...], source: Callable[[], np.ndarray]) -> None:
        if len(shape) == 1:
            tn = "f32"
        else:
            tn = self.outtype
            if not quants.can_quantize(tn, shape[-1]):
                self.fallbacks.append(name)
                if self.warn_each:
                    msg = (f"warning: {name}: row length {shape[-1]} is not a multiple of "
                           f"{quants.TYPES[tn].block_size}; stored as f16 instead of {tn}")
                    log.warning(msg)
                    self.warnings.append(msg)
                tn = "f16"
        self.specs.append(TensorSpec(name, tuple(shape), tn, source))


def _get(tensors: dict[str, LazyTensor], name: str, shape: tuple[int, ...], where: Path) -> LazyTensor:
    t = tensors.get(name)
    if t is None:
        raise ConversionError(f"{where}: tensor {name} is missing from the checkpoint")
    if t.shape != shape:
        raise ConversionError(f"{where}: tensor {name} has shape {list(t.shape)}, expected {list(shape)} "
                              "(from config.json)")
    if t.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"{where}: tensor {name} has dtype {t.dtype}, expected a float tensor")
    return t


def _plan_model(model_dir: Path, hp: HParams, tensors: dict[str, LazyTensor], qk_interleaved: bool,
                plan: _Plan, *, sparse: bool, down_t: bool = False) -> None:
    shapes = hf_shapes(hp)
    used = set()

    def get(name):
        used.add(name)
        return _get(tensors, name, shapes[name], model_dir)

    def add(name, source=None):          # the HF tensor under its GGUF name (its data as is unless source)
        t = get(name)
        plan.add(gguf_name(name), t.shape, source or t.load_f32)

    add("model.embed_tokens.weight")
    add("model.norm.weight")
    if not hp.tie_word_embeddings:
        if "lm_head.weight" not in tensors:
            raise ConversionError(f"{model_dir}: tensor lm_head.weight is missing and tie_word_embeddings "
                                  "is not set in config.json")
        add("lm_head.weight")
    else:
        used.add("lm_head.weight")

    for i in range(hp.n_layer):
        p = f"model.layers.{i}."
        q, k = get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight")
        add(p + "input_layernorm.weight")
        if qk_interleaved:
            add(p + "self_attn.q_proj.weight")
            add(p + "self_attn.k_proj.weight")
        else:
            add(p + "self_attn.q_proj.weight", lambda t=q: permute_qk(t.load_f32(), hp.n_head))
            add(p + "self_attn.k_proj.weight", lambda t=k: permute_qk(t.load_f32(), hp.n_head_kv))
        for m in ("self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj"):
            add(f"{p}{m}.weight")
        down = get(p + "mlp.down_proj.weight")          # numpy (n_embd, n_ff)
        if not sparse:
            add(p + "mlp.down_proj.weight")
        if sparse or down_t:
            plan.add(f"blk.{i}.ffn_down_t.weight", down.shape[::-1],
                     lambda t=down: np.ascontiguousarray(t.load_f32().T))

    unused = sorted(n for n in tensors if n not in used and not n.endswith(_IGNORED))
    if unused:
        msg = (f"warning: {len(unused)} checkpoint tensor(s) not converted: {', '.join(unused[:4])}"
               f"{', ...' if len(unused) > 4 else ''}")
        log.warning(msg)
        plan.warnings.append(msg)


def _plan_predictors(pred: Predictors, plan: _Plan) -> None:
    for i, (fc1, fc2) in enumerate(zip(pred.fc1, pred.fc2)):
        plan.add(f"blk.{i}.fc1.weight", fc1.shape, fc1.load_f32)
        plan.add(f"blk.{i}.fc2.weight", fc2.shape, fc2.load_f32)


def _metadata(hp: HParams, vocab: Vocab, name: str, outtype: str, threshold: float | None):
    def add(w: gguf.GGUFWriter) -> None:
        w.add_name(name)
        w.add_file_type(quants.TYPES[outtype].file_type)
        if outtype in ("q8_0", "q4_0"):
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(hp.n_ctx)
        w.add_embedding_length(hp.n_embd)
        w.add_feed_forward_length(hp.n_ff)
        w.add_head_count(hp.n_head)
        w.add_head_count_kv(hp.n_head_kv)
        w.add_block_count(hp.n_layer)
        w.add_rope_dimension_count(hp.head_dim)
        w.add_rope_freq_base(hp.rope_theta)
        w.add_layer_norm_rms_eps(hp.norm_eps)
        if hp.rope_scaling_factor is not None:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(hp.rope_scaling_factor)
        w.add_string(ACTIVATION_KEY, hp.ffn_act)
        if threshold is not None:
            w.add_float32(THRESHOLD_KEY, threshold)
        w.add_tokenizer_model("llama")
        w.add_token_list(vocab.tokens)
        w.add_token_scores(vocab.scores)
        w.add_token_types(vocab.types)
        if vocab.bos_id is not None:
            w.add_bos_token_id(vocab.bos_id)
        if vocab.eos_id is not None:
            w.add_eos_token_id(vocab.eos_id)
        if vocab.unk_id is not None:
            w.add_unk_token_id(vocab.unk_id)
        if vocab.pad_id is not None:
            w.add_pad_token_id(vocab.pad_id)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    return add


def _convert(model_dir, predictor_dir, outfile, outtype, *, sparse: bool,
             progress: Callable[[str], None] | None, down_t: bool = False) -> ConversionResult:
    outtype = _check_outtype(outtype)
    model_dir = Path(model_dir)
    say = progress or (lambda s: None)
    cfg = load_config(model_dir)
    hp = hparams_from_config(cfg, str(model_dir / "config.json"))
    # cheap validation first (tokenizer, predictors), then the weights
    if not (model_dir / "tokenizer.model").is_file():
        raise ConversionError(f"{model_dir}: no tokenizer.model (a SentencePiece vocabulary is required)")
    pred = None
    if sparse and hp.ffn_act != "relu":
        # the loader refuses such a file (Model._check_sparse): fail here, before hours of writing
        raise ConversionError(f"{model_dir}: hidden_act {hp.hidden_act!r}: a sparse (PowerInfer) file needs a "
                              "ReLU-family FFN (predictors skip the neurons ReLU zeroes); convert this model with "
                              "convert-dense.py")
    if sparse:
        pred = load_predictors(Path(predictor_dir), n_layer=hp.n_layer, n_embd=hp.n_embd, n_ff=hp.n_ff)
        say(f"predictors: {len(pred.files)} layers, ranks {sorted(set(pred.ranks))}"
            + (f", sparse_threshold {pred.sparse_threshold}" if pred.sparse_threshold is not None else ""))
    weights = load_tensors(model_dir)
    say(f"weights: {', '.join(p.name for p in weights.files)} ({len(weights.tensors)} tensors)")
    embd = weights.tensors.get("model.embed_tokens.weight")
    if embd is not None and len(embd.shape) == 2 and embd.shape[0] != hp.n_vocab:
        raise ConversionError(f"{model_dir}: config.json vocab_size {hp.n_vocab} != embed_tokens rows "
                              f"{embd.shape[0]}")
    vocab = load_vocab(model_dir, hp.n_vocab)

    plan = _Plan(outtype)
    _plan_model(model_dir, hp, weights.tensors, weights.qk_interleaved, plan, sparse=sparse, down_t=down_t)
    if pred is not None:
        _plan_predictors(pred, plan)

    name = model_dir.resolve().name
    if outfile is None:
        outfile = default_outfile(model_dir, outtype, sparse=sparse)
    outfile = Path(outfile)
    threshold = pred.sparse_threshold if pred is not None else None
    say(f"writing {outfile} ({'PowerInfer sparse' if sparse else 'dense'}, arch {hp.arch}, {outtype}, "
        f"act {hp.ffn_act}, {len(plan.specs)} tensors)")
    write_gguf(outfile, hp.arch, _metadata(hp, vocab, name, outtype, threshold), plan.specs,
               powerinfer_magic=sparse, progress=progress)
    say(f"wrote {outfile} ({os.path.getsize(outfile) / 2**20:.1f} MiB)")
    return ConversionResult(outfile, hp.arch, outtype, sparse, len(plan.specs),
                            {s.name: s.type_name for s in plan.specs}, plan.warnings)


def default_outfile(model_dir, outtype: str = "f16", *, sparse: bool) -> Path:
    """MODEL_DIR/<name>.powerinfer.gguf (f16; <name>.<outtype>.powerinfer.gguf otherwise) for
    sparse files, MODEL_DIR/ggml-model-<outtype>.gguf for dense ones."""
    model_dir = Path(model_dir)
    if sparse:
        name = model_dir.resolve().name
        mid = "" if outtype == "f16" else f".{outtype}"
        return model_dir / f"{name}{mid}.powerinfer.gguf"
    return model_dir / f"ggml-model-{outtype}.gguf"


def convert_sparse(model_dir, predictor_dir, outfile=None, outtype: str = "f16", *,
                   progress: Callable[[str], None] | None = None) -> ConversionResult:
    """HF llama/bamboo checkpoint + predictor dir -> PowerInfer sparse file (PWRI magic).
    Raises ConversionError (one-line message) for bad inputs; never leaves a partial outfile."""
    return _convert(model_dir, predictor_dir, outfile, outtype, sparse=True, progress=progress)


def convert_dense(model_dir, outfile=None, outtype: str = "f16", *,
                  progress: Callable[[str], None] | None = None, down_t: bool = False) -> ConversionResult:
    """HF llama/bamboo checkpoint -> dense GGUF (GGUF magic, untransposed ffn_down, no predictors); down_t:
    also ffn_down_t, the transpose quantized from the checkpoint (tools/sparsify.py keeps it)."""
    return _convert(model_dir, None, outfile, outtype, sparse=False, progress=progress, down_t=down_t)


__all__ = ["HF_GLOBAL_NAMES", "HF_LAYER_NAMES", "OUTTYPES", "ConversionResult", "convert_dense", "convert_sparse",
           "default_outfile", "gguf_name", "hf_shapes", "permute_qk"]
