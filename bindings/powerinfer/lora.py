"""LoRA adapters: llama.cpp's GGUF adapter files (general.type = adapter, adapter.type = lora; convert-lora.py writes
them from a PEFT directory), applied at run time by the core: each adapted weight W gives W x + s * B (A x) with
s = scale * alpha / r (llama.cpp's rule; the scale is chosen per context, per request in the server).

    model = Model("base.gguf")
    adapter = LoraAdapter("adapter.gguf", model)
    ctx = Context(model)
    ctx.set_lora([(adapter, 1.0)])

The terms run on the CPU (an offloaded layer that an adapter adapts is an error), for the attention's, the dense
FFN's and the output head's weights and the token embeddings; the FFN of PowerInfer and gate-sparse files computes
only the neurons it selects, so adapters of it are refused there.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

from ._ffi import PowerInferError, check, ffi, lib
from .gguf_file import ModelLoadError, open_gguf
from .model import FUSED_ARCHS, Model, fused_adapter_views, tensor_descs

_ALORA_KEY = "adapter.alora.invocation_tokens"


class LoraAdapter:
    """One LoRA adapter file over a loaded Model (it keeps the model alive). .path, .alpha (adapter.lora.alpha,
    0: none, the scale alone), .n_weights (weights it adapts), .metadata."""

    def __init__(self, path: str | os.PathLike, model: Model):
        _refuse_ggla(path)
        try:
            self.file = open_gguf(path)
        except ModelLoadError as e:
            raise ModelLoadError(f"LoRA adapter: {e}") from None
        self.path = self.file.path
        self.model = model
        meta = self.metadata = self.file.metadata
        kind = meta.get("general.type")
        if kind != "adapter":
            raise ModelLoadError(f"{self.path}: not a LoRA adapter (general.type = {kind!r}, expected 'adapter'; a "
                                 "model file goes to -m, an adapter to --lora)")
        if meta.get("adapter.type") != "lora":
            raise ModelLoadError(f"{self.path}: adapter.type = {meta.get('adapter.type')!r}; only 'lora' adapters "
                                 "are read here (a control vector goes to --control-vector)")
        if _ALORA_KEY in meta:
            raise ModelLoadError(f"{self.path}: activated LoRA (aLoRA, {_ALORA_KEY}) adapters are not supported")
        arch, base_arch = meta.get("general.architecture"), model.metadata.get("general.architecture")
        if arch != base_arch:
            raise ModelLoadError(f"{self.path}: the adapter is for '{arch}' models, the model is '{base_arch}' "
                                 "(general.architecture)")
        alpha = meta.get("adapter.lora.alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ModelLoadError(f"{self.path}: adapter.lora.alpha = {alpha!r} is not a finite number")
        self.alpha = float(alpha)
        tensors = self.file.tensors
        if model.hparams.arch in FUSED_ARCHS:   # the model's fused weights are views of their parts: so are the pairs
            tensors = fused_adapter_views(self.path, tensors, model.hparams)
        descs, self._names = tensor_descs(self.path, tensors)   # the names kept alive with the adapter
        out = ffi.new("pi_adapter **")
        try:
            check(lib.pi_adapter_create(model._ptr, self.alpha, len(tensors), descs, out))
        except PowerInferError as e:
            raise ModelLoadError(f"{self.path}: {e}") from None
        self._ptr = ffi.gc(out[0], lib.pi_adapter_free)
        self.n_weights = int(lib.pi_adapter_n_pairs(self._ptr))

    def __repr__(self) -> str:
        return f"LoraAdapter({str(self.path)!r}, alpha={self.alpha:g}, weights={self.n_weights})"


def _refuse_ggla(path) -> None:
    """The ggml-era LoRA format (magic "ggla", llama.cpp's convert-lora-to-ggml.py of 2023, the original PowerInfer's):
    a clear error instead of "not a GGUF file"."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return                           # open_gguf says what is wrong with the path
    if head == b"algg":
        raise ModelLoadError(f"{path}: a ggml-era LoRA file (magic 'ggla'); convert the PEFT adapter to a GGUF "
                             "adapter with convert-lora.py")


def load_adapters(model: Model, specs: Iterable[tuple[str | os.PathLike, float]]) -> list[tuple[LoraAdapter, float]]:
    """(path, scale) pairs -> (LoraAdapter, scale): llama.cpp's --lora / --lora-scaled list."""
    out = []
    for path, scale in specs:
        out.append((LoraAdapter(path, model), check_scale(scale)))
    return out


def check_scale(scale) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"a LoRA scale must be a finite number, got {scale!r}")
    return float(scale)


def scaled_adapters(loaded: Sequence[tuple[LoraAdapter, float]], spec) -> tuple[tuple[LoraAdapter, float], ...]:
    """The loaded adapters with the scales of spec (llama.cpp's request `lora` and POST /lora-adapters: [{"id": i,
    "scale": s}, ...], or (i, s) pairs), each left out at 0. ValueError naming a bad entry."""
    if not isinstance(spec, (list, tuple)):
        raise ValueError("lora must be an array of {\"id\", \"scale\"} objects")
    scales = [0.0] * len(loaded)
    for entry in spec:
        i, scale = (entry.get("id"), entry.get("scale", 0.0)) if isinstance(entry, dict) else \
            tuple(entry) if isinstance(entry, (list, tuple)) and len(entry) == 2 else (None, None)
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"lora entries are {{\"id\": int, \"scale\": number}}, got {entry!r}")
        if not 0 <= i < len(loaded):
            raise ValueError(f"lora id {i} is not a loaded adapter ({len(loaded)} loaded: GET /lora-adapters)")
        scales[i] = check_scale(scale)
    return tuple((ad, s) for (ad, _), s in zip(loaded, scales))


def set_context_adapters(ctx, adapters: Sequence[tuple[LoraAdapter, float]]) -> None:
    """The core call behind Context.set_lora: the adapters (of ctx's model) and their scales for the next decodes."""
    for ad, _ in adapters:
        if ad.model is not ctx.model:
            raise ValueError(f"LoRA adapter {ad.path} was loaded for another model")
    ptrs = ffi.new("pi_adapter *[]", max(len(adapters), 1))
    scales = ffi.new("float[]", max(len(adapters), 1))
    for i, (ad, s) in enumerate(adapters):
        ptrs[i], scales[i] = ad._ptr, check_scale(s)
    check(lib.pi_context_set_adapters(ctx._ptr, len(adapters), ptrs, scales), "setting LoRA adapters")
