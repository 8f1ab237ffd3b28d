"""PowerInfer-py: fast LLM inference on one machine, built on activation sparsity."""
from ._ffi import PowerInferError
from .api import PowerInfer
from .context import Context
from .gguf_file import ModelLoadError
from .model import HParams, Model
from .sampling import Sampler, SamplingParams
from .tokenizer import StreamDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = ["Context", "HParams", "PowerInfer", "Model", "ModelLoadError", "PowerInferError", "Sampler", "SamplingParams",
           "StreamDecoder", "Tokenizer", "system_info", "__version__"]


def system_info() -> str:
    """The SIMD features libpowerinfer was built with."""
    from ._ffi import ffi, lib
    return ffi.string(lib.pi_system_info()).decode()
