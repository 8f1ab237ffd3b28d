"""Developer automation: `nox -l` lists the sessions."""
from __future__ import annotations

import os
import subprocess

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite against the installed package (what CI runs)."""
    session.install(".[test]")
    session.run("python", "-m", "pytest", "-q", *session.posargs)


def _build(session: nox.Session, build_dir: str, *defines: str) -> str:
    session.run("cmake", "-S", ".", "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", *defines, external=True)
    session.run("cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2), external=True)
    return os.path.abspath(os.path.join(build_dir, "libpowerinfer.so"))


@nox.session
def asan(session: nox.Session) -> None:
    """The C core under AddressSanitizer + UBSan, driven by the Python test suite
    (tests/asan_check.py builds build-asan/, proves the sanitizer is live with a canary, runs pytest)."""
    session.install(".[test]")
    session.run("python", "tests/asan_check.py", *session.posargs)


@nox.session
def scalar(session: nox.Session) -> None:
    """The test suite against the portable build without -march=native (scalar kernels)."""
    session.install(".[test]")
    lib = _build(session, "build-scalar", "-DPI_NATIVE=OFF")
    session.run("python", "-m", "pytest", "-q", *session.posargs, env={"POWERINFER_LIB_PATH": lib})


@nox.session
def isa(session: nox.Session) -> None:
    """The test suite once per CPU kernel level this machine runs (POWERINFER_ISA=scalar, avx2, ...):
    nox -s isa [-- LEVEL ...]. Levels the CPU lacks are reported and skipped."""
    session.install(".[test]")
    levels = [a for a in session.posargs if not a.startswith("-")] or ["scalar", "avx2", "avx512", "amx", "neon", "dotprod", "i8mm"]
    args = [a for a in session.posargs if a.startswith("-")]
    probe = "import sys, powerinfer as pi; sys.exit(0 if pi.cpu_isa_supported(sys.argv[1]) else 1)"
    for level in levels:
        if subprocess.run(["python", "-c", probe, level], env={**os.environ, "POWERINFER_ISA": ""},
                          cwd=session.create_tmp()).returncode != 0:
            session.log(f"{level}: not supported by this CPU/build, skipped")
            continue
        session.run("python", "-m", "pytest", "-q", *args, env={"POWERINFER_ISA": level})


@nox.session
def bench(session: nox.Session) -> None:
    """pp128/pp512/tg128 of a model, ours and llama.cpp's with the ratio: nox -s bench -- -m MODEL.gguf.

    llama-cpp-python (the peer) is compiled once per nox environment (~4 min; reuse it with -r), with
    -fno-dse: GCC 12 otherwise drops the AMX tile configuration and llama.cpp crashes on prompts."""
    session.install(".")
    session.install("llama-cpp-python", env={"CMAKE_ARGS": "-DLLAVA_BUILD=OFF -DCMAKE_CXX_FLAGS=-fno-dse"})
    session.run("python", "bench/bench.py", *(session.posargs or ["--help"]))


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "bindings", "examples", "tools", "tests", "bench", "--select", "E,F,W", "--line-length", "120")


def _find_tool(name: str, *extra_dirs: str) -> str | None:
    import glob
    import shutil
    found = shutil.which(name)
    if found:
        return found
    for pattern in extra_dirs:
        for d in sorted(glob.glob(pattern), reverse=True):
            if os.access(os.path.join(d, name), os.X_OK):
                return os.path.join(d, name)
    return None


def _check_gpu_exports(session: nox.Session, lib: str, backend: int) -> None:
    # ctypes, no package needed: the library loads and reports its backend (1 CUDA, 2 HIP); no GPU is used
    session.run("python3", "-c", f"import ctypes, sys; L = ctypes.CDLL({lib!r}); b = L.pi_cuda_compiled(); "
                f"n = L.pi_cuda_available(); print('backend', b, 'devices', n); sys.exit(b != {backend})",
                external=True)


@nox.session(venv_backend="none")
def build_cuda(session: nox.Session) -> None:
    """Compile and link libpowerinfer with the CUDA backend into build-cuda/ (no GPU needed).
    nox -s build_cuda -- "80;90"   (CUDA architectures; default 80;90)"""
    nvcc = _find_tool("nvcc", "/usr/local/cuda/bin", "/usr/local/cuda-*/bin")
    if not nvcc:
        session.skip("nvcc not found: install the CUDA toolkit to build the CUDA backend")
    archs = session.posargs[0] if session.posargs else "80;90"
    session.run("cmake", "-S", ".", "-B", "build-cuda", "-DPI_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}",
                f"-DCMAKE_CUDA_ARCHITECTURES={archs}", "-DCMAKE_BUILD_TYPE=Release", external=True)
    session.run("cmake", "--build", "build-cuda", "-j", str(os.cpu_count() or 2), external=True)
    _check_gpu_exports(session, os.path.abspath("build-cuda/libpowerinfer.so"), 1)


@nox.session(venv_backend="none")
def build_rocm(session: nox.Session) -> None:
    """Compile and link libpowerinfer with the ROCm/HIP backend (the core/cuda sources through hipcc)
    into build-rocm/ (no GPU needed). nox -s build_rocm -- "gfx90a;gfx1100"   (AMD targets; default: those of
    gfx90a, gfx1030, gfx1100 that the installed device libraries support)"""
    hipcc = _find_tool("hipcc", "/opt/rocm/bin", "/opt/rocm-*/bin")
    if not hipcc:
        session.skip("hipcc not found: install ROCm (or Debian's hipcc and libamdhip64-dev) to build the "
                     "ROCm backend")
    archs = [f"-DPI_HIP_ARCHITECTURES={session.posargs[0]}"] if session.posargs else []   # default: CMakeLists.txt's
    session.run("cmake", "-S", ".", "-B", "build-rocm", "-DPI_HIP=ON", f"-DPI_HIPCC={hipcc}", *archs,
                "-DCMAKE_BUILD_TYPE=Release", external=True)
    session.run("cmake", "--build", "build-rocm", "-j", str(os.cpu_count() or 2), external=True)
    _check_gpu_exports(session, os.path.abspath("build-rocm/libpowerinfer.so"), 2)


@nox.session(venv_backend="none")
def gpu_checks(session: nox.Session) -> None:
    """On a GPU machine: build with CUDA, run the GPU suite and the kernel benchmark
    (tests/gpu/run_gpu_checks.sh, under 8 minutes)."""
    session.run("bash", "tests/gpu/run_gpu_checks.sh", external=True)
