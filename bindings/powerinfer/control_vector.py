"""Control vectors: llama.cpp's --control-vector files (GGUF with f32 1-d tensors "direction.N", N >= 1, one per
layer; repeng and llama.cpp's cvector-generator write them), added to the residual stream after layer N.

    data = load_control_vectors(model, [("happy.gguf", 0.8), ("calm.gguf", -0.5)])   # [n_layer, n_embd]
    ctx.set_control_vector(data, layer_start=1, layer_end=model.hparams.n_layer)

As llama.cpp: several files (and several tensors of one layer in a file) add up, each times its strength; the layer
range is llama.cpp's (--control-vector-layer-range, default 1 .. n_layer: layer 0 never has a vector).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable

import numpy as np

from .gguf_file import ModelLoadError, open_gguf
from .model import Model

_DIRECTION = re.compile(r"direction\.(\d+)")


def load_control_vectors(model: Model, specs: Iterable[tuple[str | os.PathLike, float]]) -> np.ndarray:
    """The sum of the files' directions times their strengths: float32 [n_layer, n_embd] (row N: direction.N; rows
    the files leave out are 0). ModelLoadError naming the file and the tensor for what llama.cpp refuses."""
    hp = model.hparams
    out = np.zeros((hp.n_layer, hp.n_embd), dtype=np.float32)
    for path, strength in specs:
        try:
            f = open_gguf(path)
        except ModelLoadError as e:
            raise ModelLoadError(f"control vector: {e}") from None
        if not f.tensors:
            raise ModelLoadError(f"{path}: no direction tensors (not a control vector file)")
        for name, t in f.tensors.items():
            m = _DIRECTION.fullmatch(name)
            if m is None or int(m.group(1)) == 0:
                raise ModelLoadError(f"{path}: tensor '{name}' is not a direction.N tensor with N >= 1 (a control "
                                     "vector file holds only those)")
            if t.type != 0 or len(t.ne) != 1:
                raise ModelLoadError(f"{path}: '{name}' must be a 1-d f32 tensor")
            if t.ne[0] != hp.n_embd:
                raise ModelLoadError(f"{path}: '{name}' has {t.ne[0]} values, the model's n_embd is {hp.n_embd}")
            layer = int(m.group(1))
            if layer < hp.n_layer:          # llama.cpp keeps the others too, but never applies them
                with np.errstate(all="ignore"):     # a NaN or inf is refused by the core, with its message
                    out[layer] += np.frombuffer(memoryview(t.data), dtype=np.float32) * np.float32(strength)
    return out
