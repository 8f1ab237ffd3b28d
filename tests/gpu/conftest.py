"""The GPU suite: every test here is marked `gpu` and skips without a device, or when the library
was built without -DPI_CUDA=ON (run tests/gpu/run_gpu_checks.sh on a GPU machine)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA/ROCm device and a libpowerinfer built with a GPU backend")


def pytest_collection_modifyitems(config, items):
    from gpu_helpers import gpu_ready
    ok, why = gpu_ready()
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not ok:
                item.add_marker(pytest.mark.skip(reason=f"GPU suite: {why}"))
