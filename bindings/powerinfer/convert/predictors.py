"""Read a PowerInfer predictor directory.

PREDICTOR_DIR holds one file per layer, ``model_0.pt``, ``model_1.pt``, ... (found by counting
up from 0 until a file is missing), each a torch state_dict with exactly ``fc1.weight``
[r, n_embd] and ``fc2.weight`` [n_ff, r] (no biases; the rank r may differ per layer), and an
optional ``config.json`` whose ``sparse_threshold`` becomes ``powerinfer.sparse_threshold``.
Files are read with the torch-free reader (torch_pickle.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .common import FLOAT_DTYPES, ConversionError, LazyTensor
from .torch_pickle import load_state_dict

PREDICTOR_KEYS = ("fc1.weight", "fc2.weight")


@dataclass
class Predictors:
    fc1: list[LazyTensor]           # [r_l, n_embd] per layer (numpy shape)
    fc2: list[LazyTensor]           # [n_ff, r_l]
    files: list[Path]
    sparse_threshold: float | None

    @property
    def ranks(self) -> list[int]:
        return [t.shape[0] for t in self.fc1]


def predictor_files(predictor_dir: Path) -> list[Path]:
    predictor_dir = Path(predictor_dir)
    if not predictor_dir.is_dir():
        raise ConversionError(f"{predictor_dir}: predictor directory does not exist")
    files = []
    while (predictor_dir / f"model_{len(files)}.pt").is_file():
        files.append(predictor_dir / f"model_{len(files)}.pt")
    return files


def read_predictor_config(predictor_dir: Path) -> float | None:
    path = Path(predictor_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable predictor config ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("sparse_threshold") is None:
        return None
    thr = cfg["sparse_threshold"]
    if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not math.isfinite(thr):
        raise ConversionError(f"{path}: sparse_threshold = {thr!r} must be a finite number")
    return float(thr)


def load_predictors(predictor_dir: Path, *, n_layer: int, n_embd: int, n_ff: int) -> Predictors:
    """Read and validate the predictors of an n_layer model (shapes only; data stays lazy)."""
    predictor_dir = Path(predictor_dir)
    files = predictor_files(predictor_dir)
    if not files:
        extra = sorted(p.name for p in predictor_dir.glob("*.pt"))
        hint = f" (found {', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''})" if extra else ""
        raise ConversionError(f"{predictor_dir}: no predictor files model_0.pt, model_1.pt, ...{hint}")
    if len(files) != n_layer:
        stray = sorted(p.name for p in predictor_dir.glob("model_*.pt") if p not in files)
        note = f"; model_{len(files)}.pt is missing but {', '.join(stray[:3])} exist" if stray else ""
        raise ConversionError(f"{predictor_dir}: found {len(files)} predictor files (model_0.pt .. "
                              f"model_{len(files) - 1}.pt) but the model has {n_layer} layers{note}")
    fc1s, fc2s = [], []
    for i, f in enumerate(files):
        sd = load_state_dict(f)
        keys = set(sd)
        if keys != set(PREDICTOR_KEYS):
            missing = [k for k in PREDICTOR_KEYS if k not in keys]
            extra = sorted(keys - set(PREDICTOR_KEYS))
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                    ([f"unexpected {', '.join(extra)}"] if extra else [])
            raise ConversionError(f"{f}: a predictor must hold exactly fc1.weight and fc2.weight "
                                  f"({'; '.join(parts)})")
        fc1, fc2 = sd["fc1.weight"], sd["fc2.weight"]
        for name, t in (("fc1.weight", fc1), ("fc2.weight", fc2)):
            if t.dtype not in FLOAT_DTYPES:
                raise ConversionError(f"{f}: {name} has dtype {t.dtype}, expected a float tensor")
        if len(fc1.shape) != 2 or len(fc2.shape) != 2:
            raise ConversionError(f"{f}: fc1.weight {list(fc1.shape)} and fc2.weight {list(fc2.shape)} "
                                  "must be matrices")
        r = fc1.shape[0]
        if fc1.shape[1] != n_embd or r == 0:
            raise ConversionError(f"{f}: fc1.weight has shape {list(fc1.shape)}, expected [r, {n_embd}] "
                                  f"(n_embd = {n_embd})")
        if fc2.shape != (n_ff, r):
            raise ConversionError(f"{f}: fc2.weight has shape {list(fc2.shape)}, expected [{n_ff}, {r}] "
                                  f"(n_ff = {n_ff}, rank r = {r} from fc1.weight)")
        fc1s.append(fc1)
        fc2s.append(fc2)
    return Predictors(fc1s, fc2s, files, read_predictor_config(predictor_dir))
