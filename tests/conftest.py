"""Fixtures shared by the test modules."""
from __future__ import annotations

import pytest

from powerinfer._ffi import check, ffi, lib


@pytest.fixture(scope="module")
def pool2():
    """A 2-thread pool for op-level tests (work really is split between threads)."""
    p = ffi.new("pi_threadpool **")
    check(lib.pi_threadpool_create(2, p))
    yield p[0]
    lib.pi_threadpool_free(p[0])
