"""cffi layer: loads libpowerinfer and declares its API from core/include/powerinfer.h.

The declarations are the PI_CDEF_BEGIN..PI_CDEF_END region of the header, the
same text the C compiler checks when it builds the library, followed by the
PI_CUDA_CDEF_BEGIN..PI_CUDA_CDEF_END region of powerinfer_cuda.h (the GPU API,
which every build exports: a CPU-only one answers pi_cuda_available() == 0).
This is the package's one FFI: one `ffi`, one `lib`. `check(status)` is the one
place where C status codes become Python exceptions.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import cffi

_PKG = Path(__file__).resolve().parent
_REPO = _PKG.parents[1]
_LIB_NAMES = ("libpowerinfer.so", "libpowerinfer.dylib", "powerinfer.dll")


class PowerInferError(RuntimeError):
    """An error reported by the C core (its status code is in `.status`)."""

    def __init__(self, message: str, status: int = -1):
        super().__init__(message)
        self.status = status


def _find(candidates: list[Path], what: str) -> Path:
    for c in candidates:
        if c.is_file():
            return c
    tried = "\n  ".join(str(c) for c in candidates)
    raise ImportError(f"powerinfer: cannot find {what}; tried:\n  {tried}\n"
                      "Install the package with `pip install .` or build with CMake into ./build.")


def _library_path() -> Path:
    env = os.environ.get("POWERINFER_LIB_PATH")
    dirs = [Path(env)] if env else []
    dirs += [_PKG, _REPO / "build"]
    # running from a source checkout (PYTHONPATH=bindings) next to an installed copy: use its library
    dirs += [Path(p) / "powerinfer" for p in sys.path if p and Path(p, "powerinfer") != _PKG]
    cands = [d if d.is_file() else d / n for d in dirs for n in (_LIB_NAMES if not d.is_file() else ("",))]
    return _find([Path(c) for c in cands], "the libpowerinfer shared library")


def _header_path(name: str = "powerinfer.h") -> Path:
    return _find([_PKG / name, _REPO / "core" / "include" / name], name)


def _cdef_source(header: str, region: str = "PI_CDEF") -> str:
    """The declarations between /* {region}_BEGIN */ and /* {region}_END */, as cffi takes them."""
    m = re.search(rf"/\* {region}_BEGIN \*/(.*)/\* {region}_END \*/", header, re.S)
    if not m:
        raise ImportError(f"the header has no {region}_BEGIN/{region}_END region")
    text = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)   # comments
    text = re.sub(r"//[^\n]*", "", text)
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    return text.replace("PI_API ", "")


ffi = cffi.FFI()
ffi.cdef(_cdef_source(_header_path().read_text()))
ffi.cdef(_cdef_source(_header_path("powerinfer_cuda.h").read_text(), "PI_CUDA_CDEF"))
lib = ffi.dlopen(str(_library_path()))
if lib.pi_cpu_isa_env_error() != ffi.NULL:   # a POWERINFER_ISA the library could not apply
    raise ImportError("powerinfer: " + ffi.string(lib.pi_cpu_isa_env_error()).decode())


def last_error() -> str:
    return ffi.string(lib.pi_last_error()).decode("utf-8", "replace")


def check(status: int, what: str = "") -> None:
    """Raise PowerInferError with the core's message when status is an error."""
    if status != lib.PI_OK:
        msg = last_error() or f"error {status}"
        raise PowerInferError(f"{what}: {msg}" if what else msg, status)
