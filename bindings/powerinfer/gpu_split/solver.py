"""The hot-neuron solver: per-layer counts of hot neurons under a capacity, and which neurons they are.

``solve_greedy`` is exactly the original's ILP (spec 2): each layer's activations are sorted
descending and cut into groups of 256; maximise sum w[l,g] x[l,g] subject to sum x <= C, x binary.
Every group costs the same, so the C largest weights are optimal. ``solve_milp`` is that ILP
through ``scipy.optimize.milp`` (the tests check that both reach the same objective)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .common import GROUP, GpuSplitError


def _check_acts(acts: Sequence[np.ndarray], group: int) -> None:
    if group < 1:
        raise GpuSplitError(f"group size {group} must be >= 1")
    if not acts:
        raise GpuSplitError("no layers")
    for i, a in enumerate(acts):
        if np.ndim(a) != 1 or len(a) == 0:
            raise GpuSplitError(f"layer {i}: activations must be a non-empty 1-D array")


def group_sums(act: np.ndarray, group: int = GROUP) -> tuple[np.ndarray, np.ndarray]:
    """(sums, sizes) of one layer's groups: activations sorted descending, cut into groups of
    `group` (the last one shorter when len % group != 0)."""
    s = np.sort(np.asarray(act, dtype=np.float64))[::-1]
    starts = np.arange(0, len(s), group)
    return np.add.reduceat(s, starts), np.minimum(group, len(s) - starts)


def solve_greedy(acts: Sequence[np.ndarray], capacity_neurons: int, group: int = GROUP) -> list[int]:
    """Hot neurons per layer: the floor(capacity / group) largest group sums over all layers.
    Equal sums go to the lower layer, then the lower group index, so each layer gets a prefix of
    its sorted groups (for non-negative activations)."""
    _check_acts(acts, group)
    n_groups = max(0, int(capacity_neurons)) // group
    sums, sizes, layer = [], [], []
    for i, a in enumerate(acts):
        s, z = group_sums(a, group)
        sums.append(s)
        sizes.append(z)
        layer.append(np.full(len(s), i))
    sums_a, sizes_a, layer_a = np.concatenate(sums), np.concatenate(sizes), np.concatenate(layer)
    gidx = np.concatenate([np.arange(len(s)) for s in sums])
    order = np.lexsort((gidx, layer_a, -sums_a))[:n_groups]
    counts = np.zeros(len(acts), dtype=np.int64)
    np.add.at(counts, layer_a[order], sizes_a[order])
    return [int(c) for c in counts]


def solve_milp(acts: Sequence[np.ndarray], capacity_neurons: int, group: int = GROUP,
               threshold: int = 0, time_limit: float = 30.0) -> list[int]:
    """The original's ILP (spec 2) through scipy.optimize.milp: binary x[l,g] (group g of layer l on
    the GPU) and y[l]; maximise sum w x; sum x <= floor(capacity/group); per layer
    sum_g x >= floor(threshold/group) y_l and sum_g x <= 1e6 y_l. Needs scipy."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    _check_acts(acts, group)
    sums = [group_sums(a, group) for a in acts]
    n_x = sum(len(s) for s, _ in sums)
    L = len(acts)
    n_var = n_x + L
    c = np.zeros(n_var)
    A = lil_matrix((1 + 2 * L, n_var))
    col = 0
    starts = []
    for i, (s, _) in enumerate(sums):
        starts.append(col)
        c[col:col + len(s)] = -s
        A[0, col:col + len(s)] = 1
        A[1 + 2 * i, col:col + len(s)] = 1
        A[1 + 2 * i, n_x + i] = -(threshold // group)
        A[2 + 2 * i, col:col + len(s)] = 1
        A[2 + 2 * i, n_x + i] = -1e6
        col += len(s)
    lb = np.concatenate([[-np.inf], np.tile([0.0, -np.inf], L)])
    ub = np.concatenate([[max(0, int(capacity_neurons)) // group], np.tile([np.inf, 0.0], L)])
    res = milp(c, constraints=LinearConstraint(A.tocsr(), lb, ub), integrality=np.ones(n_var),
               bounds=Bounds(0, 1), options={"time_limit": time_limit, "mip_rel_gap": 0.0})
    if res.x is None:
        raise GpuSplitError(f"milp found no solution: {res.message}")
    x = np.round(res.x).astype(np.int64)
    counts = []
    for i, (s, z) in enumerate(sums):
        counts.append(int((x[starts[i]:starts[i] + len(s)] * z).sum()))
    return counts


def objective(acts: Sequence[np.ndarray], counts: Sequence[int]) -> float:
    """Activation mass on the GPU: sum over layers of the counts[l] largest activations."""
    return float(sum(np.sort(np.asarray(a, dtype=np.float64))[::-1][:c].sum() for a, c in zip(acts, counts)))


def hot_neurons(act: np.ndarray, count: int) -> np.ndarray:
    """Ascending int32 indices of the `count` most active neurons (ties: the lower index)."""
    order = np.argsort(-np.asarray(act, dtype=np.float64), kind="stable")[:count]
    return np.sort(order).astype(np.int32)
