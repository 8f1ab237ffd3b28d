"""How the pool's threads share a decode matmul's rows (core/src/work_share.c): each thread owns a stretch of rows and
the threads that run out take the back half of the largest stretch left. Whatever the thread count and however the
threads are delayed, every row must be computed exactly once, by the same kernel: the result has the bits of one
thread's. Matmuls of at most 8 tokens go this way (ops.c PI_STREAM_MAX_T), larger ones through the prompts' items."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer._ffi import check, ffi, lib
from test_isa import repacked
from test_kquants import F32, Q8_0, c_quantize, tensor


def weight(t: int, rows: np.ndarray, repack: bool):
    """A pi_tensor over rows [N, K] as type t (F32 or Q8_0), with its buffers; repack: the loader's interleaved copy."""
    N, K = rows.shape
    raw = np.ascontiguousarray(rows, np.float32) if t == F32 else c_quantize(t, rows)
    wt = tensor(raw, t, K, N)
    if not repack:
        return wt, [raw]
    rt, buf = repacked(wt)
    return rt, [raw, buf, wt]


def mul_mat(w, x: np.ndarray, N: int, n_threads: int) -> np.ndarray:
    T, K = x.shape
    y = np.full((T, N), np.nan, np.float32)   # a row left out stays NaN
    xt = tensor(np.ascontiguousarray(x), F32, K, T)
    yt = tensor(y, F32, N, T)
    p = ffi.new("pi_threadpool **")
    check(lib.pi_threadpool_create(n_threads, p))
    try:
        check(lib.pi_op_mul_mat(p[0], w, xt, yt))
    finally:
        lib.pi_threadpool_free(p[0])
    return y


CASES = [(F32, False, 1000), (F32, False, 33), (F32, False, 5), (Q8_0, False, 70), (Q8_0, True, 4096),
         (Q8_0, True, 16), (Q8_0, True, 48)]


@pytest.mark.parametrize("t, repack, N", CASES, ids=[f"{'q8_0x16' if r else 'q8_0' if t else 'f32'}-{n}rows"
                                                     for t, r, n in CASES])
@pytest.mark.parametrize("T", [1, 3, 8, 9])
def test_every_row_once_at_any_thread_count(t, repack, N, T):
    rng = np.random.default_rng(N * 31 + T)
    K = 64
    w, keep = weight(t, rng.standard_normal((N, K)).astype(np.float32), repack)
    x = rng.standard_normal((T, K)).astype(np.float32)
    one = mul_mat(w, x, N, 1)
    assert not np.isnan(one).any()
    for n in (2, 3, 7, 64, 65):   # 65: more threads than work_share.h's slots, the prompts' items instead
        assert np.array_equal(mul_mat(w, x, N, n).view(np.uint32), one.view(np.uint32)), f"{n} threads"


def test_stealing_under_preemption():
    """More threads than cores: threads are descheduled mid-stretch and the others take their rows; repeated, so the
    claims race in many orders. Every result must still have one thread's bits."""
    rng = np.random.default_rng(5)
    N, K = 4096, 256
    w, keep = weight(Q8_0, rng.standard_normal((N, K)).astype(np.float32), True)
    x = rng.standard_normal((1, K)).astype(np.float32)
    one = mul_mat(w, x, N, 1)
    p = ffi.new("pi_threadpool **")
    check(lib.pi_threadpool_create(8, p))
    try:
        for _ in range(200):
            y = np.full((1, N), np.nan, np.float32)
            check(lib.pi_op_mul_mat(p[0], w, tensor(x, F32, K, 1), tensor(y, F32, N, 1)))
            assert np.array_equal(y.view(np.uint32), one.view(np.uint32))
    finally:
        lib.pi_threadpool_free(p[0])
