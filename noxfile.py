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
def bench(session: nox.Session) -> None:
    """llama-bench style numbers for a model: nox -s bench -- -m MODEL.gguf [-p 512 -n 128]."""
    session.install(".")
    session.run("python", "bench/bench.py", *(session.posargs or ["--help"]))


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "bindings", "examples", "tools", "tests", "bench", "--select", "E,F,W", "--line-length", "120")
