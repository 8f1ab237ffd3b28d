#!/usr/bin/env python3
"""Run the Python test suite against libpowerinfer built with AddressSanitizer + UBSan.

    python tests/asan_check.py                      # build build-asan/, check ASan is live, run tests/
    python tests/asan_check.py tests/test_robustness.py tests/test_ops.py -x    # any pytest arguments
    python tests/asan_check.py --no-build ...       # reuse build-asan/
    python tests/asan_check.py --check-only         # build and run the canary only

The same by hand (what the nox session `asan` does):

    cmake -S . -B build-asan -G Ninja -DPI_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
    cmake --build build-asan
    POWERINFER_LIB_PATH=$PWD/build-asan/libpowerinfer.so \\
    LD_PRELOAD=$(gcc -print-file-name=libasan.so) \\
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \\
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \\
    PYTHONPATH=bindings python -m pytest -q -p no:cacheprovider tests

Python itself is not instrumented, so the ASan runtime has to be preloaded (it must come first in
the process); detect_leaks=0 silences the interpreter's own "leaks" at exit. Tests that provoke an
allocation failure on purpose add allocator_may_return_null=1 in their child process.

Before the suite, a canary makes the instrumented library read past the end of a heap buffer
(pi_dequantize_row over more elements than the buffer holds) in a child process and requires an
ASan heap-buffer-overflow report: a run where ASan silently is not active fails here.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build-asan"
LIB = BUILD / "libpowerinfer.so"

CANARY = textwrap.dedent("""
    from powerinfer._ffi import ffi, lib
    src = ffi.new("float[]", 1000)            # 4000 bytes on the (ASan) heap
    dst = ffi.new("float[]", 4000)
    lib.pi_dequantize_row(lib.PI_TYPE_F32, src, dst, 3000)   # reads 12000 bytes: overflow
    print("CANARY NOT CAUGHT")
""")


def log(msg: str) -> None:
    print(f"[asan_check] {msg}", flush=True)


def build() -> None:
    gen = ["-G", "Ninja"] if shutil.which("ninja") and not (BUILD / "Makefile").exists() else []
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(BUILD), *gen, "-DPI_SANITIZE=ON",
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 2)], check=True)


def asan_runtime() -> str:
    """The ASan runtime the library is linked against (from ldd), else gcc's."""
    out = subprocess.run(["ldd", str(LIB)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"(libasan\.so[.\d]*|libclang_rt\.asan[-\w.]*\.so)\s+=>\s+(\S+)", out)
    if not m:
        sys.exit(f"[asan_check] {LIB} is not linked against an ASan runtime:\n{out}")
    return m.group(2)


def check_symbols() -> None:
    nm = subprocess.run(["nm", "-D", str(LIB)], capture_output=True, text=True, check=True).stdout
    n = len(re.findall(r"__asan_report_load", nm))
    if n == 0:
        sys.exit(f"[asan_check] {LIB} has no __asan_report_* references: not instrumented")
    log(f"{LIB.relative_to(ROOT)}: instrumented ({n} __asan_report_load* references, "
        f"{len(re.findall(r'__ubsan_handle', nm))} __ubsan_handle* references)")


def sanitizer_env(runtime: str) -> dict:
    env = dict(os.environ)
    env["POWERINFER_LIB_PATH"] = str(LIB)
    env["LD_PRELOAD"] = runtime
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "bindings"), env.get("PYTHONPATH")) if p)
    return env


def canary(env: dict) -> None:
    r = subprocess.run([sys.executable, "-c", CANARY], env=env, capture_output=True, text=True, timeout=120)
    if "heap-buffer-overflow" not in r.stderr or "CANARY NOT CAUGHT" in r.stdout:
        sys.exit(f"[asan_check] ASan is NOT active: the canary overflow was not reported "
                 f"(rc={r.returncode})\n{r.stdout}\n{r.stderr[-3000:]}")
    log("canary: ASan reported the deliberate heap-buffer-overflow -> sanitizers are live")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-build", action="store_true", help="use the existing build-asan/")
    ap.add_argument("--check-only", action="store_true", help="stop after the canary")
    args, pytest_args = ap.parse_known_args()
    if not args.no_build:
        build()
    if not LIB.is_file():
        sys.exit(f"[asan_check] {LIB} not found (build it, or drop --no-build)")
    runtime = asan_runtime()
    log(f"ASan runtime: {runtime}")
    check_symbols()
    env = sanitizer_env(runtime)
    canary(env)
    if args.check_only:
        return 0
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(pytest_args or [str(ROOT / "tests")])]
    log("LD_PRELOAD=" + env["LD_PRELOAD"] + " POWERINFER_LIB_PATH=" + env["POWERINFER_LIB_PATH"] +
        " ASAN_OPTIONS=" + env["ASAN_OPTIONS"] + " UBSAN_OPTIONS=" + env["UBSAN_OPTIONS"] + " " + " ".join(cmd))
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
