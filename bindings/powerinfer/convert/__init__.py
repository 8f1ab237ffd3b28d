"""Converters: Hugging Face llama-family checkpoints (+ PowerInfer predictors) -> GGUF.

>>> from powerinfer.convert import convert_sparse, convert_dense, convert_lora
>>> convert_sparse("ReluLLaMA-7B", "ReluLLaMA-7B-Predictor", "relu-7b.powerinfer.gguf", "f16")
>>> convert_dense("ReluLLaMA-7B", "relu-7b.gguf", "q8_0")
>>> convert_lora("my-peft-adapter", "relu-7b.gguf", "adapter.gguf")      # PEFT LoRA -> llama.cpp GGUF LoRA

All raise `ConversionError` with a one-line message for bad inputs and write atomically.
Command lines: ``convert.py``, ``convert-dense.py`` and ``convert-lora.py`` at the repository root.
Only numpy, gguf and sentencepiece are needed (plus safetensors for .safetensors weights when
installed); PyTorch files are read without torch.
"""
from .common import ConversionError, LazyTensor
from .llama import OUTTYPES, ConversionResult, convert_dense, convert_sparse, default_outfile, permute_qk
from .lora import convert_lora

__all__ = ["OUTTYPES", "ConversionError", "ConversionResult", "LazyTensor", "convert_dense", "convert_lora",
           "convert_sparse", "default_outfile", "permute_qk"]
