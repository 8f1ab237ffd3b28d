#!/usr/bin/env python3
"""Write a deterministic random PEFT LoRA adapter directory for a Hugging Face llama checkpoint, for
testing convert-lora.py (no torch needed: safetensors.numpy).

    python tools/make_test_lora.py MODEL_DIR OUT_DIR [--rank 8] [--alpha 16] [--targets q_proj,v_proj]
                                   [--seed 0] [--scale-b 0] [--rslora] [--merged MERGED_DIR]

OUT_DIR gets adapter_config.json and adapter_model.safetensors (float32) with PEFT's tensor names
(base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight (r, n_in), ...lora_B.weight (n_out, r);
embed_tokens: ...embed_tokens.lora_embedding_A (r, n_vocab), ...lora_embedding_B (n_embd, r)).
--targets: comma-separated module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj,
lm_head, embed_tokens) or "all-linear" (the seven projections of every layer, as PEFT's shortcut).
A ~ N(0, 1/n_in) (embed_tokens: N(0, 1)); B ~ scale_b * N(0, 1/r): PEFT initialises B to zero (the
default, --scale-b 0: the adapter then changes nothing), tests use a random B so that it does.
--merged: also write MODEL_DIR with the adapter merged, W + s * B @ A (embed_tokens: W + s * (B @ A).T,
s = alpha / r, or alpha / sqrt(r) with --rslora), as PEFT's merge_and_unload (float32 safetensors).

As a module: make_lora(model_dir, out_dir, ...) -> the tensors; merge_lora(weights, tensors, ...).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGETS = (*LINEAR, "lm_head", "embed_tokens")
PREFIX = "base_model.model."


def _convert():
    """Make powerinfer.convert importable, through convert.py's importer (works without the built C library)."""
    spec = importlib.util.spec_from_file_location("_powerinfer_convert_cli", ROOT / "convert.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli._import_convert()


def parse_targets(targets: str) -> list[str]:
    names = list(LINEAR) if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise ValueError(f"unknown target module(s) {bad} (choose from {', '.join(TARGETS)} or all-linear)")
    return names


def modules(model_dir, targets: list[str]) -> dict[str, tuple[int, int]]:
    """HF module -> numpy shape (n_out, n_in) of its weight, for the targets, in checkpoint order."""
    _convert()
    from powerinfer.convert.hf import hparams_from_config, load_config
    from powerinfer.convert.llama import hf_shapes
    hp = hparams_from_config(load_config(Path(model_dir)))
    out = {}
    for name, shape in hf_shapes(hp).items():
        module = name[:-len(".weight")]
        if len(shape) == 2 and module.rsplit(".", 1)[-1] in targets:
            out[module] = shape
    return out


def make_lora(model_dir, out_dir, *, rank: int = 8, alpha: float = 16, targets="q_proj,v_proj", seed: int = 0,
              scale_b: float = 0.0, rslora: bool = False) -> dict[str, np.ndarray]:
    """Write the adapter directory; returns its tensors (PEFT names -> float32 arrays)."""
    from safetensors.numpy import save_file
    names = parse_targets(targets) if isinstance(targets, str) else list(targets)
    rng = np.random.default_rng(seed)
    tensors = {}
    for module, (n_out, n_in) in modules(model_dir, names).items():
        if module.endswith("embed_tokens"):        # W (n_vocab, n_embd): A (r, n_vocab), B (n_embd, r)
            tensors[f"{PREFIX}{module}.lora_embedding_A"] = rng.standard_normal((rank, n_out)).astype(np.float32)
            tensors[f"{PREFIX}{module}.lora_embedding_B"] = \
                (scale_b * rng.standard_normal((n_in, rank)) / math.sqrt(rank)).astype(np.float32)
        else:                                      # W (n_out, n_in): A (r, n_in), B (n_out, r)
            tensors[f"{PREFIX}{module}.lora_A.weight"] = \
                (rng.standard_normal((rank, n_in)) / math.sqrt(n_in)).astype(np.float32)
            tensors[f"{PREFIX}{module}.lora_B.weight"] = \
                (scale_b * rng.standard_normal((n_out, rank)) / math.sqrt(rank)).astype(np.float32)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir),
        "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": names, "bias": "none",
        "fan_in_fan_out": False, "use_rslora": rslora, "use_dora": False, "modules_to_save": None,
        "init_lora_weights": True, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {},
        "inference_mode": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    return tensors


def merge_lora(weights: dict[str, np.ndarray], tensors: dict[str, np.ndarray], *, rank: int, alpha: float,
               rslora: bool = False) -> dict[str, np.ndarray]:
    """HF weights (name -> array) with the adapter merged in, as PEFT's merge_and_unload."""
    s = alpha / (math.sqrt(rank) if rslora else rank)
    out = dict(weights)
    for name, a in tensors.items():
        if name.endswith(("lora_A.weight", "lora_embedding_A")):
            module = name[len(PREFIX):].rsplit(".", 2 if name.endswith(".weight") else 1)[0]
            b = tensors[name.replace("lora_A", "lora_B").replace("lora_embedding_A", "lora_embedding_B")]
            delta = (b.astype(np.float64) @ a.astype(np.float64))      # (n_out, n_in); embed: (n_embd, n_vocab)
            w = weights[module + ".weight"]
            out[module + ".weight"] = (w + s * (delta.T if name.endswith("lora_embedding_A") else delta)
                                       ).astype(np.float32)
    return out


def write_merged(model_dir, merged_dir, tensors, *, rank: int, alpha: float, rslora: bool = False) -> Path:
    """A copy of the checkpoint directory (config, tokenizer files) with the adapter merged into its weights."""
    from safetensors.numpy import save_file
    _convert()
    from powerinfer.convert.hf import find_weight_files, load_tensors
    model_dir, merged_dir = Path(model_dir), Path(merged_dir)
    merged_dir.mkdir(parents=True, exist_ok=True)
    weight_files = set(find_weight_files(model_dir))
    for p in model_dir.iterdir():
        if p.is_file() and p not in weight_files and not p.name.endswith((".gguf", ".index.json")):
            shutil.copy(p, merged_dir / p.name)
    weights = {k: t.load_f32() for k, t in load_tensors(model_dir).tensors.items()}
    save_file(merge_lora(weights, tensors, rank=rank, alpha=alpha, rslora=rslora),
              str(merged_dir / "model.safetensors"))
    return merged_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="Hugging Face llama checkpoint directory")
    ap.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="adapter directory to write")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--targets", default="q_proj,v_proj", help='comma-separated modules, or "all-linear"')
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale-b", type=float, default=0.0, help="std scale of lora_B (0: PEFT's zero init)")
    ap.add_argument("--rslora", action="store_true", help="write use_rslora: true (scale alpha / sqrt(r))")
    ap.add_argument("--merged", type=Path, default=None, help="also write the merged checkpoint here")
    a = ap.parse_args(argv)
    try:
        parse_targets(a.targets)
    except ValueError as e:
        ap.error(str(e))
    tensors = make_lora(a.model_dir, a.out_dir, rank=a.rank, alpha=a.alpha, targets=a.targets, seed=a.seed,
                        scale_b=a.scale_b, rslora=a.rslora)
    print(f"wrote {a.out_dir} ({len(tensors) // 2} modules, r {a.rank}, lora_alpha {a.alpha:g})", file=sys.stderr)
    if a.merged is not None:
        write_merged(a.model_dir, a.merged, tensors, rank=a.rank, alpha=a.alpha, rslora=a.rslora)
        print(f"wrote {a.merged} (merged checkpoint)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
