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
    """The SIMD features libpowerinfer was built with, its GPU backend and devices."""
    from ._ffi import ffi, lib
    info = ffi.string(lib.pi_system_info()).decode()
    n = int(lib.pi_device_count())
    devs = []
    p = ffi.new("pi_device_info *")
    for i in range(n):
        if lib.pi_device_get_info(i, p) == 0:
            devs.append(f"{i}: {ffi.string(p.name).decode()}, {p.total_bytes / 2**20:.0f} MiB")
    gpu = ffi.string(lib.pi_gpu_backend_name()).decode()
    listed = f": {'; '.join(devs)}" if devs else ""
    return f"{info.rstrip(' |')} | GPU = {gpu} ({n} device{'s' if n != 1 else ''}{listed})"
