"""PowerInfer-py: fast LLM inference on one machine, built on activation sparsity."""
from ._ffi import PowerInferError
from .api import PowerInfer
from .grammar import Grammar, GrammarError
from .context import Context
from .gguf_file import ModelLoadError
from .model import HParams, Model
from .sampling import Sampler, SamplingParams
from .speculative import DraftModel, PromptLookup
from .tokenizer import StreamDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = ["Context", "DraftModel", "Grammar", "GrammarError", "HParams", "PowerInfer", "Model", "ModelLoadError",
           "PowerInferError", "PromptLookup", "Sampler", "SamplingParams", "StreamDecoder", "Tokenizer", "bf16_dot", "cpu_isa", "cpu_isa_supported", "cpu_name",
           "set_cpu_isa", "system_info", "__version__"]

def _arch_levels() -> tuple[str, ...]:
    """The kernel levels a build for this machine's architecture has (core/src/cpu.c), lowest first."""
    import platform
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return ("scalar", "avx2", "avx512", "amx")
    if machine in ("aarch64", "arm64"):
        return ("scalar", "neon", "dotprod", "i8mm")
    return ("scalar",)


CPU_ISA_LEVELS = _arch_levels()


def system_info() -> str:
    """The CPU kernel level in use, the levels this CPU runs, its SIMD features, the GPU backend and devices."""
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


def cpu_isa() -> str:
    """The CPU kernel level in use: "scalar", "avx2", "avx512", "amx" or, on aarch64, "neon", "dotprod" or "i8mm"
    ($POWERINFER_ISA sets it at start)."""
    from ._ffi import ffi, lib
    return ffi.string(lib.pi_cpu_isa()).decode()


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"), else what platform says: for benchmark figures."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_dot() -> bool:
    """Whether bf16 weights are computed in vdpbf16ps's arithmetic (activations rounded to bf16) at every level: by
    default where the CPU has AVX512_BF16 ($POWERINFER_BF16_DOT=0 / 1 chooses at start)."""
    from ._ffi import lib
    return bool(lib.pi_bf16_dot())


def cpu_isa_supported(level: str) -> bool:
    """Whether this build has the level and this CPU runs it."""
    from ._ffi import lib
    return bool(lib.pi_cpu_isa_supported(level.encode()))


def set_cpu_isa(level: str) -> None:
    """Switch the CPU kernels of the whole process to `level` (every level computes the same bits;
    not while another thread is inside the library). Raises PowerInferError if it cannot run here."""
    from ._ffi import check, lib
    check(lib.pi_cpu_isa_set(level.encode()), "set_cpu_isa")
