"""The activation statistics: ``<model_dir>/activation/activation_N.pt``, one vector [n_ff] per layer
(how often each FFN neuron ran; tools/profile_sparse.py writes them), files taken in numeric order."""
from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

import numpy as np

from .common import ActivationError

log = logging.getLogger("powerinfer")

_ACT_FILE = re.compile(r"^activation_(\d+)\.pt$")


def list_activation_files(act_dir: str | os.PathLike) -> dict[int, Path]:
    """{layer: path} of the activation_N.pt files in act_dir (numeric N)."""
    d = Path(act_dir)
    if not d.is_dir():
        raise ActivationError(f"activation directory '{d}' not found (it holds activation_N.pt, one file per "
                              "layer; tools/profile_activations.py writes them)")
    files: dict[int, Path] = {}
    for p in d.iterdir():
        m = _ACT_FILE.match(p.name)
        if m and p.is_file():
            files[int(m.group(1))] = p
    if not files:
        raise ActivationError(f"no activation_N.pt files in '{d}'")
    return dict(sorted(files.items()))


def _read_tensor_file(path: Path) -> np.ndarray:
    """A torch.save'd tensor as numpy: with torch when it is installed, else the torch-free reader."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many kinds
            raise ActivationError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
        if not isinstance(obj, torch.Tensor):
            raise ActivationError(f"{path}: holds a {type(obj).__name__}, expected a 1-D tensor")
        t = obj.detach().cpu()
        return (t.double() if t.is_floating_point() or t.dtype == torch.bool else t.long()).numpy()
    from ..convert.common import ConversionError, LazyTensor
    from ..convert.torch_pickle import TorchReadError, read_torch_zip
    try:
        obj = read_torch_zip(path)
        if not isinstance(obj, LazyTensor):
            raise ActivationError(f"{path}: holds a {type(obj).__name__}, expected a 1-D tensor")
        return np.asarray(obj.load())
    except (TorchReadError, ConversionError) as e:
        raise ActivationError(f"{path}: cannot read without torch ({e})") from None


def load_activations(act_dir: str | os.PathLike, n_layer: int | None = None,
                     n_ff: int | None = None) -> list[np.ndarray]:
    """One float64 vector [n_ff] per layer, layer i from activation_i.pt (numeric order).
    Raises ActivationError for a missing directory or file, a wrong shape or a bad value."""
    files = list_activation_files(act_dir)
    if n_layer is None:
        n_layer = max(files) + 1
    missing = [i for i in range(n_layer) if i not in files]
    if missing:
        shown = ", ".join(f"activation_{i}.pt" for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ActivationError(f"'{act_dir}': missing {shown} ({len(missing)} of {n_layer} layers)")
    extra = [i for i in files if i >= n_layer]
    if extra:
        log.warning("gpu_split: %s has files for %d layers beyond the model's %d; ignored",
                    act_dir, len(extra), n_layer)
    acts = []
    for i in range(n_layer):
        a = _read_tensor_file(files[i])
        if a.ndim != 1:
            raise ActivationError(f"{files[i]}: shape {tuple(a.shape)}, expected a 1-D tensor [n_ff]")
        if n_ff is not None and a.shape[0] != n_ff:
            raise ActivationError(f"{files[i]}: {a.shape[0]} neurons, the model's n_ff is {n_ff}")
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)) or (a < 0).any():
            raise ActivationError(f"{files[i]}: activation statistics must be finite and >= 0 (counts or "
                                  "frequencies)")
        acts.append(a)
    widths = {a.shape[0] for a in acts}
    if len(widths) != 1:
        raise ActivationError(f"'{act_dir}': layers have different lengths {sorted(widths)}")
    return acts


def activation_fingerprint(act_dir: str | os.PathLike, n_layer: int) -> str:
    """Changes when any of the first n_layer activation files changes (name, size, mtime)."""
    h = hashlib.sha256()
    files = list_activation_files(act_dir)
    for i in range(n_layer):
        p = files.get(i)
        st = p.stat() if p else None
        h.update(f"{i}:{st.st_size if st else -1}:{st.st_mtime_ns if st else -1};".encode())
    return h.hexdigest()[:32]
