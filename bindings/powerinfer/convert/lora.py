"""Hugging Face PEFT LoRA adapter -> llama.cpp's GGUF LoRA adapter file (as its convert_lora_to_gguf.py).

Input: a PEFT directory, ``adapter_config.json`` (r, lora_alpha, use_rslora, use_dora, ...) and
``adapter_model.safetensors`` (or ``adapter_model.bin``, read without torch like the checkpoints);
the base model, as its Hugging Face checkpoint directory (only config.json is read) or as a GGUF file
of it (general.architecture, the head counts and every tensor's name and shape are read from it).

Output (GGUF magic): general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (float32),
general.architecture = the base's, and per adapted base tensor W (numpy (n_out, n_in), ne [n_in, n_out]):

=========================  ===============================  ==============================================
GGUF tensor                from (PEFT)                      numpy shape (GGUF ne is this reversed)
=========================  ===============================  ==============================================
<W>.lora_a                 <module>.lora_A.weight, as is    (r, n_in)
<W>.lora_b                 <module>.lora_B.weight           (n_out, r); attn_q / attn_k rows permuted HF
                                                            rotate_half -> GGUF order (permute_qk), as W's
token_embd.weight.lora_a   embed_tokens.lora_embedding_A.T  (n_vocab, r): llama.cpp takes the rows of the
                                                            tokens from it (get_rows), so it is transposed
token_embd.weight.lora_b   embed_tokens.lora_embedding_B    (n_embd, r)
=========================  ===============================  ==============================================

<W> is the module's tensor in the dense GGUF file (llama.gguf_name: q_proj -> blk.N.attn_q.weight, ...,
lm_head -> output.weight, embed_tokens -> token_embd.weight). llama.cpp adds
(alpha / r) * B @ (A @ x) to W @ x (r: the rank of that tensor, lora_b's ne[0]), which is PEFT's
lora_alpha / r scaling. rsLoRA (use_rslora) scales by lora_alpha / sqrt(r) instead: the file's alpha is
then lora_alpha * sqrt(r), so that alpha / r is rsLoRA's scale (a tensor whose rank differs from r through
rank_pattern gets the remaining factor sqrt(r_tensor / r) folded into its lora_b).

Types (``outtype``, default f16): f32, f16, bf16 or q8_0 for every tensor; with q8_0 a tensor whose
rows (numpy's last dimension: n_in for lora_a, r for lora_b) are not a multiple of 32 is stored as f16
(with a warning).

``<module>.base_layer.weight`` tensors (the base's own embed_tokens / lm_head, which PEFT saves beside
their LoRA factors) are skipped, as llama.cpp's converter does.

Refused with a one-line ConversionError: a missing adapter_config.json or weights file, peft_type other
than LORA, DoRA (use_dora, lora_magnitude_vector), alpha_pattern, fan_in_fan_out, LoRA biases, full
tensors in the adapter (modules_to_save, trained embeddings or norms: llama.cpp LoRA files hold only
lora_a / lora_b pairs), a module the dense GGUF file has no tensor for, a lora_A without its lora_B (or
the reverse), shapes that do not fit the base tensor, a base architecture the converters do not handle
(llama and bamboo: the Hugging Face converter's model types).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

import gguf

from .. import quants
from ..gguf_file import ModelLoadError, open_gguf
from .common import FLOAT_DTYPES, ConversionError, LazyTensor, log
from .hf import SUPPORTED_MODEL_TYPES, hparams_from_config, load_config, load_weight_file, read_json_config
from .llama import ConversionResult, _Plan, gguf_name, hf_shapes, permute_qk
from .writer import write_gguf

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
ARCHS = tuple(sorted(set(SUPPORTED_MODEL_TYPES.values())))        # general.architecture of the bases handled
# one PEFT tensor name: [base_model.model.]<module>.<factor>
_LORA_RX = re.compile(r"(?:base_model\.model\.)?(.+)\."
                      r"(lora_A\.weight|lora_B\.weight|lora_embedding_A|lora_embedding_B)")


@dataclass
class BaseModel:
    """What the conversion needs from the base model."""
    arch: str                               # general.architecture
    n_head: int
    n_head_kv: int
    shapes: dict[str, tuple[int, ...]]      # GGUF tensor name -> numpy shape (ne reversed), in file order
    where: str                              # the config.json or GGUF file, for messages


def base_from_hf(model_dir) -> BaseModel:
    """The base model from its Hugging Face checkpoint directory (config.json only)."""
    model_dir = Path(model_dir)
    hp = hparams_from_config(load_config(model_dir), str(model_dir / "config.json"))
    shapes = {gguf_name(n): s for n, s in hf_shapes(hp).items()}
    return BaseModel(hp.arch, hp.n_head, hp.n_head_kv, shapes, str(model_dir / "config.json"))


def base_from_gguf(path) -> BaseModel:
    """The base model from a GGUF (or PowerInfer) file of it."""
    try:
        f = open_gguf(path)
    except ModelLoadError as e:
        raise ConversionError(str(e)) from None
    md = f.metadata
    if md.get("general.type") == "adapter":
        raise ConversionError(f"{path}: is an adapter file, not a base model")
    arch = md.get("general.architecture")
    if arch not in ARCHS:
        raise ConversionError(f"{path}: architecture {arch!r} is not supported (the converters handle "
                              f"{', '.join(ARCHS)})")
    n_head = md.get(f"{arch}.attention.head_count")
    n_head_kv = md.get(f"{arch}.attention.head_count_kv", n_head)
    for key, v in (("head_count", n_head), ("head_count_kv", n_head_kv)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConversionError(f"{path}: {arch}.attention.{key} = {v!r}, expected a positive integer")
    shapes = {name: tuple(reversed(t.ne)) for name, t in f.tensors.items()}
    return BaseModel(arch, n_head, n_head_kv, shapes, str(path))


def load_base(base) -> BaseModel:
    """A Hugging Face checkpoint directory or a GGUF file."""
    base = Path(base)
    if base.is_dir():
        return base_from_hf(base)
    if base.is_file():
        return base_from_gguf(base)
    raise ConversionError(f"{base}: base model does not exist (expected a Hugging Face checkpoint directory "
                          "or a GGUF file)")


@dataclass
class Adapter:
    alpha: float                                        # lora_alpha
    r: int
    rslora: bool
    rank_pattern: bool                                  # per-module ranks (the tensors' own ranks hold)
    pairs: dict[str, tuple[LazyTensor, LazyTensor]]     # HF module -> (A, B), in the weights file's order
    weights_file: Path


def _positive(cfg: dict, key: str, kind, where: Path):
    v = cfg.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) or not v > 0:
        raise ConversionError(f"{where}: {key} = {v!r}, expected a positive {'integer' if kind is int else 'number'}")
    return v


def load_adapter(adapter_dir) -> Adapter:
    """adapter_config.json and the lora_A / lora_B pairs of adapter_model.safetensors (or .bin), unloaded."""
    adapter_dir = Path(adapter_dir)
    cfg = read_json_config(adapter_dir, "adapter_config.json", "adapter", "a PEFT LoRA adapter directory")
    cpath = adapter_dir / "adapter_config.json"
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ConversionError(f"{cpath}: peft_type {cfg['peft_type']!r} is not a LoRA adapter")
    if cfg.get("use_dora"):
        raise ConversionError(f"{cpath}: DoRA adapters (use_dora) are not supported: llama.cpp has no magnitude "
                              "vectors; merge the adapter into the model instead")
    if cfg.get("alpha_pattern"):
        raise ConversionError(f"{cpath}: alpha_pattern (per-module lora_alpha) is not supported: the file has "
                              "one alpha")
    if cfg.get("fan_in_fan_out"):
        raise ConversionError(f"{cpath}: fan_in_fan_out (Conv1D layers) is not supported")
    if cfg.get("lora_bias"):
        raise ConversionError(f"{cpath}: lora_bias is not supported (llama.cpp LoRA files have no biases)")
    alpha = float(_positive(cfg, "lora_alpha", (int, float), cpath))
    r = _positive(cfg, "r", int, cpath)
    rslora = bool(cfg.get("use_rslora"))

    wpath = adapter_dir / "adapter_model.safetensors"
    if not wpath.is_file():
        wpath = adapter_dir / "adapter_model.bin"
    if not wpath.is_file():
        raise ConversionError(f"{adapter_dir}: no adapter_model.safetensors or adapter_model.bin")
    factors: dict[str, dict[str, LazyTensor]] = {}
    for name, t in load_weight_file(wpath).items():
        if name.endswith(".base_layer.weight"):     # the base's own embed_tokens / lm_head (PEFT's
            continue                                # save_embedding_layers), as llama.cpp's converter skips them
        m = _LORA_RX.fullmatch(name)
        if m is None:
            what = ("a DoRA magnitude vector" if "lora_magnitude_vector" in name else
                    "a LoRA bias" if ".lora_B.bias" in name else "not a lora_A / lora_B factor")
            raise ConversionError(f"{wpath}: tensor {name!r} is {what}; a llama.cpp LoRA file holds only lora_A / "
                                  "lora_B pairs (no modules_to_save, trained embeddings or norms)")
        if len(t.shape) != 2 or t.dtype not in FLOAT_DTYPES:
            raise ConversionError(f"{wpath}: tensor {name!r} has shape {list(t.shape)} and dtype {t.dtype}, "
                                  "expected a 2-D float tensor")
        module, factor = m.groups()
        factors.setdefault(module, {})["A" if factor in ("lora_A.weight", "lora_embedding_A") else "B"] = t
    if not factors:
        raise ConversionError(f"{wpath}: no LoRA tensors")
    pairs = {}
    for module, ab in factors.items():
        if len(ab) != 2:
            have, miss = ("lora_A", "lora_B") if "A" in ab else ("lora_B", "lora_A")
            raise ConversionError(f"{wpath}: {module} has a {have} without its {miss}")
        pairs[module] = (ab["A"], ab["B"])
    return Adapter(alpha, r, rslora, bool(cfg.get("rank_pattern")), pairs, wpath)


def default_outfile(adapter_dir, outtype: str = "f16") -> Path:
    """ADAPTER_DIR/ggml-lora-<outtype>.gguf"""
    return Path(adapter_dir) / f"ggml-lora-{outtype}.gguf"


def convert_lora(adapter_dir, base, outfile=None, outtype: str = "f16", *,
                 progress: Callable[[str], None] | None = None) -> ConversionResult:
    """PEFT LoRA adapter directory + base model (HF checkpoint directory or GGUF file) -> GGUF LoRA adapter.
    Raises ConversionError (one-line message) for bad inputs; never leaves a partial outfile."""
    if not isinstance(outtype, str) or outtype.lower() not in OUTTYPES:
        raise ConversionError(f"unknown outtype {outtype!r} (choose one of {', '.join(OUTTYPES)})")
    outtype = outtype.lower()
    say = progress or (lambda s: None)
    ad = load_adapter(adapter_dir)
    bm = load_base(base)
    file_alpha = ad.alpha * math.sqrt(ad.r) if ad.rslora else ad.alpha

    plan = _Plan(outtype, warn_each=False)
    by_gguf = {}
    for module, (A, B) in ad.pairs.items():
        name = gguf_name(module + ".weight")
        if name is None or name.endswith("norm.weight"):
            raise ConversionError(f"{ad.weights_file}: module {module} has no matrix in a {bm.arch} GGUF file "
                                  "(adaptable: q/k/v/o_proj, gate/up/down_proj, embed_tokens, lm_head)")
        if name not in bm.shapes:
            hint = (" (the base ties lm_head to the embeddings)" if name == "output.weight" else
                    " (a PowerInfer sparse file stores it transposed, as ffn_down_t: give the dense GGUF or the "
                    "HF checkpoint as the base)" if name.replace("ffn_down", "ffn_down_t") in bm.shapes else "")
            raise ConversionError(f"{bm.where}: the base model has no tensor {name} for {module}{hint}")
        by_gguf[name] = (module, A, B)
    for name, shape in bm.shapes.items():                  # in the base's order
        if name not in by_gguf:
            continue
        module, A, B = by_gguf.pop(name)
        n_out, n_in = shape                                # numpy shape of W
        embd = name == "token_embd.weight"                 # W (n_vocab, n_embd); A (r, n_vocab), B (n_embd, r)
        rank = A.shape[0]
        want_a, want_b = ((rank, n_out), (n_in, rank)) if embd else ((rank, n_in), (n_out, rank))
        if A.shape != want_a or B.shape != want_b:
            raise ConversionError(f"{ad.weights_file}: {module}: lora_A {list(A.shape)} and lora_B {list(B.shape)} "
                                  f"do not fit the base's {name} {list(shape)} (expected {list(want_a)} and "
                                  f"{list(want_b)}): wrong base model?")
        if rank != ad.r and not ad.rank_pattern:
            raise ConversionError(f"{ad.weights_file}: {module} has rank {rank} but adapter_config.json r = {ad.r}")
        fold = math.sqrt(rank / ad.r) if ad.rslora else 1.0    # file alpha / rank * fold = rsLoRA's scale
        heads = {"attn_q": bm.n_head, "attn_k": bm.n_head_kv}.get(name.split(".")[-2]) if not embd else None
        if heads is not None and n_out % (2 * heads):
            raise ConversionError(f"{bm.where}: {name} has {n_out} rows, not a multiple of 2 * {heads} heads")

        def a_src(A=A, embd=embd):                        # (r, n_in), or (n_vocab, r) for token_embd
            a = A.load_f32()
            return np.ascontiguousarray(a.T) if embd else a

        def b_src(B=B, heads=heads, fold=fold):           # (n_out, r), or (n_embd, r) for token_embd
            b = B.load_f32()
            b = permute_qk(b, heads) if heads is not None else b
            return b * np.float32(fold) if fold != 1.0 else b
        plan.add(name + ".lora_a", want_a[::-1] if embd else want_a, a_src)
        plan.add(name + ".lora_b", want_b, b_src)

    say(f"adapter: {ad.weights_file.name}, {len(ad.pairs)} modules, r {ad.r}, lora_alpha {ad.alpha:g}"
        + (f" (rsLoRA: alpha written as {file_alpha:g})" if ad.rslora else "") + f"; base: {bm.where} ({bm.arch})")
    if plan.fallbacks:
        block = quants.TYPES[outtype].block_size
        msg = (f"warning: {len(plan.fallbacks)} tensors stored as f16 instead of {outtype}: their rows (lora_b: r, "
               f"lora_a: n_in) are not a multiple of {block} ({', '.join(plan.fallbacks[:3])}"
               f"{', ...' if len(plan.fallbacks) > 3 else ''})")
        log.warning(msg)
        plan.warnings.append(msg)

    adapter_dir = Path(adapter_dir)
    outfile = Path(outfile) if outfile is not None else default_outfile(adapter_dir, outtype)

    def metadata(w: gguf.GGUFWriter) -> None:
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, file_alpha)
        w.add_name(adapter_dir.resolve().name)
        w.add_file_type(quants.TYPES[outtype].file_type)
        if outtype == "q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    say(f"writing {outfile} (LoRA adapter, arch {bm.arch}, {outtype}, {len(plan.specs)} tensors)")
    write_gguf(outfile, bm.arch, metadata, plan.specs, progress=progress)
    say(f"wrote {outfile} ({os.path.getsize(outfile) / 2**20:.1f} MiB)")
    return ConversionResult(outfile, bm.arch, outtype, False, len(plan.specs),
                            {s.name: s.type_name for s in plan.specs}, plan.warnings)


__all__ = ["ARCHS", "OUTTYPES", "Adapter", "BaseModel", "base_from_gguf", "base_from_hf", "convert_lora",
           "default_outfile", "load_adapter", "load_base"]
