"""Converters: Hugging Face llama-family checkpoints (+ PowerInfer predictors) -> GGUF.

>>> from powerinfer.convert import convert_sparse, convert_dense
>>> convert_sparse("ReluLLaMA-7B", "ReluLLaMA-7B-Predictor", "relu-7b.powerinfer.gguf", "f16")
>>> convert_dense("ReluLLaMA-7B", "relu-7b.gguf", "q8_0")

Both raise `ConversionError` with a one-line message for bad inputs and write atomically.
Command lines: ``convert.py`` and ``convert-dense.py`` at the repository root.
Only numpy, gguf and sentencepiece are needed (plus safetensors for .safetensors weights when
installed); PyTorch files are read without torch.
"""
from .common import ConversionError, LazyTensor
from .llama import OUTTYPES, ConversionResult, convert_dense, convert_sparse, default_outfile, permute_qk

__all__ = ["OUTTYPES", "ConversionError", "ConversionResult", "LazyTensor", "convert_dense", "convert_sparse",
           "default_outfile", "permute_qk"]
