"""Hot-neuron placement (powerinfer.gpu_split): the solver against the original's ILP, the gpuidx
file format, the VRAM budget accounting, the index cache rules and bad input. CPU only."""
from __future__ import annotations

import argparse
import itertools
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from powerinfer import gpu_split as gs  # noqa: E402
from helpers import torch_free_save  # noqa: E402
from model_files import write_sparse_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def random_acts(rng, n_layer, n_ff, kind="int"):
    if kind == "int":
        return [rng.integers(0, 50, n_ff).astype(np.float64) for _ in range(n_layer)]
    if kind == "ties":
        return [rng.integers(0, 3, n_ff).astype(np.float64) for _ in range(n_layer)]
    # power-law like real statistics: a few hot neurons, a long cold tail
    return [rng.pareto(1.5, n_ff) * rng.uniform(0.2, 3.0) for _ in range(n_layer)]


def save_acts(d: Path, acts):
    d.mkdir(parents=True, exist_ok=True)   # activation_N.pt: torch.save's format, written without torch
    for i, a in enumerate(acts):
        torch_free_save(d / f"activation_{i}.pt", np.asarray(a, dtype=np.float32))
    return d


# ---- the solver -----------------------------------------------------------------------------

def brute_force(acts, capacity, group):
    """max sum of chosen group weights, any subset of at most capacity // group groups."""
    w = [s for a in acts for s in gs.group_sums(a, group)[0]]
    best = 0.0
    for r in range(min(len(w), capacity // group) + 1):
        for comb in itertools.combinations(range(len(w)), r):
            best = max(best, sum(w[i] for i in comb))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_greedy_equals_the_ilp_by_brute_force(seed):
    rng = np.random.default_rng(seed)
    group = int(rng.integers(1, 5))
    acts = random_acts(rng, int(rng.integers(1, 4)), int(rng.integers(1, 4)) * group + int(rng.integers(0, group)),
                       kind=["int", "ties", "pareto"][seed % 3])
    cap = int(rng.integers(0, sum(len(a) for a in acts) + group))
    counts = gs.solve_greedy(acts, cap, group)
    assert gs.objective(acts, counts) == pytest.approx(brute_force(acts, cap, group), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_greedy_matches_scipy_milp(seed):
    pytest.importorskip("scipy")
    rng = np.random.default_rng(100 + seed)
    n_layer = int(rng.integers(1, 7))
    n_ff = int(rng.choice([256, 512, 768, 1000, 1300]))      # also n_ff % 256 != 0
    acts = random_acts(rng, n_layer, n_ff, kind=["int", "ties", "pareto"][seed % 3])
    cap = int(rng.integers(0, n_layer * n_ff + 600))
    greedy = gs.solve_greedy(acts, cap)
    ilp = gs.solve_milp(acts, cap)
    assert gs.objective(acts, greedy) == pytest.approx(gs.objective(acts, ilp), rel=1e-9, abs=1e-9)
    for counts in (greedy, ilp):     # both use at most floor(capacity / 256) groups
        n_groups = sum(-(-c // 256) for c in counts)
        assert n_groups <= cap // 256


def test_milp_threshold_gives_all_or_at_least_threshold():
    pytest.importorskip("scipy")
    rng = np.random.default_rng(7)
    acts = random_acts(rng, 4, 1024, "pareto")
    counts = gs.solve_milp(acts, 6 * 256, threshold=512)
    assert all(c == 0 or c >= 512 for c in counts)
    assert sum(counts) <= 6 * 256


def test_greedy_picks_prefixes_and_respects_capacity():
    rng = np.random.default_rng(3)
    acts = random_acts(rng, 9, 1100, "pareto")
    for cap in (0, 255, 256, 1000, 4096, 9 * 1100, 10**9):
        counts = gs.solve_greedy(acts, cap)
        assert sum(-(-c // 256) for c in counts) <= cap // 256
        assert all(0 <= c <= 1100 for c in counts)
        # each layer's count is a prefix of its groups: multiples of 256, or everything
        assert all(c % 256 == 0 or c == 1100 for c in counts)
    assert gs.solve_greedy(acts, 10**9) == [1100] * 9


def test_greedy_prefers_the_hotter_layer():
    acts = [np.ones(512), np.full(512, 5.0), np.zeros(512)]
    assert gs.solve_greedy(acts, 512) == [0, 512, 0]
    assert gs.solve_greedy(acts, 768) == [256, 512, 0]


def test_hot_neurons_are_the_most_active_ascending():
    a = np.array([0, 9, 3, 9, 1, 7], dtype=float)
    assert gs.hot_neurons(a, 3).tolist() == [1, 3, 5]
    assert gs.hot_neurons(a, 0).dtype == np.int32 and len(gs.hot_neurons(a, 0)) == 0
    assert gs.hot_neurons(a, 6).tolist() == list(range(6))


# ---- activation files ---------------------------------------------------------------------------

def test_numeric_order_of_activation_files(tmp_path):
    """13 layers: layer i's statistics mark neuron i hot. String order would give layer 2 the file
    activation_10.pt (the original exporter's bug)."""
    n_layer, n_ff = 13, 512
    acts = []
    for i in range(n_layer):
        a = np.zeros(n_ff)
        a[i * 7:(i * 7) + 256] = 100 + i
        acts.append(a)
    d = save_acts(tmp_path / "activation", acts)
    assert sorted(p.name for p in d.iterdir())[2] == "activation_10.pt"    # the trap
    loaded = gs.load_activations(d, n_layer, n_ff)
    for i in range(n_layer):
        np.testing.assert_array_equal(loaded[i], acts[i])
    counts = gs.solve_greedy(loaded, 256 * n_layer)
    assert counts == [256] * n_layer
    for i in range(n_layer):
        assert gs.hot_neurons(loaded[i], 256).tolist() == list(range(i * 7, i * 7 + 256))


def test_activations_without_torch(tmp_path, monkeypatch):
    acts = random_acts(np.random.default_rng(1), 3, 300)
    d = save_acts(tmp_path / "act", acts)
    monkeypatch.setitem(sys.modules, "torch", None)      # `import torch` now raises ImportError
    loaded = gs.load_activations(d, 3, 300)
    for a, b in zip(acts, loaded):
        np.testing.assert_array_equal(np.float32(a), b)


def test_activation_errors(tmp_path):
    with pytest.raises(gs.ActivationError, match="not found"):
        gs.load_activations(tmp_path / "nope", 2, 256)
    (tmp_path / "empty").mkdir()
    with pytest.raises(gs.ActivationError, match="no activation_N.pt"):
        gs.load_activations(tmp_path / "empty", 2, 256)
    d = save_acts(tmp_path / "a", [np.ones(256), np.ones(256)])
    with pytest.raises(gs.ActivationError, match="missing activation_2.pt"):
        gs.load_activations(d, 3, 256)
    with pytest.raises(gs.ActivationError, match="256 neurons, the model's n_ff is 512"):
        gs.load_activations(d, 2, 512)
    torch_free_save(d / "activation_1.pt", np.ones((4, 64), np.float32))
    with pytest.raises(gs.ActivationError, match="1-D"):
        gs.load_activations(d, 2, 256)
    torch_free_save(d / "activation_1.pt", np.array([1.0, float("nan")] * 128, np.float32))
    with pytest.raises(gs.ActivationError, match="finite"):
        gs.load_activations(d, 2, 256)
    torch_free_save(d / "activation_1.pt", np.array([1.0, -1.0] * 128, np.float32))
    with pytest.raises(gs.ActivationError, match=">= 0"):
        gs.load_activations(d, 2, 256)
    (d / "activation_1.pt").write_bytes(b"not a zip")
    with pytest.raises(gs.ActivationError, match="activation_1.pt"):
        gs.load_activations(d, 2, 256)


def test_n_ff_not_a_multiple_of_256(tmp_path):
    acts = random_acts(np.random.default_rng(5), 3, 300, "pareto")
    counts = gs.solve_greedy(acts, 3 * 512)
    assert counts == [300, 300, 300]           # the short second group fits, costing a whole group
    counts = gs.solve_greedy(acts, 2 * 256)
    assert sum(-(-c // 256) for c in counts) <= 2 and all(c in (0, 256, 300) for c in counts)


# ---- the gpuidx file -----------------------------------------------------------------------------

def sample_buckets(rng, n_layer, n_ff):
    out = []
    for i in range(n_layer):
        k = [0, n_ff, int(rng.integers(1, n_ff))][i % 3]
        out.append(np.sort(rng.choice(n_ff, k, replace=False)).astype(np.int32))
    return out


def test_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    buckets = sample_buckets(rng, 7, 1000)
    extra = {"powerinfer_py.vram_budget": 123456789012, "powerinfer_py.activation_fingerprint": "abc",
             "powerinfer_py.flag": True, "powerinfer_py.ratio": 0.25}
    p = gs.write_gpuidx(tmp_path / "m.gguf.generated.gpuidx", buckets, 1000, 2**40 + 3, extra)
    idx = gs.read_gpuidx(p)
    assert idx.n_layer == 7 and idx.n_ff == 1000 and idx.vram_capacity == 2**40 + 3
    assert idx.extra == extra
    for a, b in zip(buckets, idx.buckets):
        np.testing.assert_array_equal(a, b)
    assert idx.hot_counts == [len(b) for b in buckets]
    np.testing.assert_array_equal(np.flatnonzero(idx.mask(2)), buckets[2])
    assert not list(tmp_path.glob("*.tmp*"))


def test_file_bytes_match_the_original_format(tmp_path):
    buckets = [np.array([1, 5], np.int32), np.array([], np.int32), np.arange(8, dtype=np.int32)]
    p = gs.write_gpuidx(tmp_path / "x.gpuidx", buckets, 8, 4096)
    b = p.read_bytes()
    assert b[:4] == b"PWRI"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
    assert (version, n_tensors, n_kv) == (3, 6, 3)
    pos = 24

    def string():
        nonlocal pos
        n, = struct.unpack_from("<Q", b, pos)
        s = b[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        return s

    kvs = []
    for _ in range(n_kv):
        key = string()
        vtype, = struct.unpack_from("<I", b, pos)
        pos += 4
        if vtype == 8:
            kvs.append((key, vtype, string()))
        else:
            fmt = {4: "<I", 10: "<Q"}[vtype]
            kvs.append((key, vtype, struct.unpack_from(fmt, b, pos)[0]))
            pos += struct.calcsize(fmt)
    assert kvs == [("general.architecture", 8, "generic.gpu_index"), ("generic.gpu_index.block_count", 4, 3),
                   ("split.vram_capacity", 10, 4096)]
    infos = []
    for _ in range(n_tensors):
        name = string()
        n_dims, = struct.unpack_from("<I", b, pos)
        ne, ttype, off = struct.unpack_from("<QIQ", b, pos + 4)
        pos += 4 + 8 * n_dims + 4 + 8
        assert n_dims == 1 and ttype == 18 and off % 32 == 0
        infos.append((name, ne, off))
    assert [i[0] for i in infos] == ["blk.0.gpu_idx", "blk.0.gpu_bucket", "blk.1.gpu_idx", "blk.1.gpu_bucket",
                                     "blk.2.gpu_idx", "blk.2.gpu_bucket"]
    assert [i[1] for i in infos] == [8, 2, 8, 0, 8, 8]
    start = -(-pos // 32) * 32
    data = {name: np.frombuffer(b, "<i4", ne, start + off) for name, ne, off in infos}
    assert data["blk.0.gpu_idx"].tolist() == [0, 1, 0, 0, 0, 1, 0, 0]
    assert data["blk.0.gpu_bucket"].tolist() == [1, 5]
    assert data["blk.1.gpu_idx"].tolist() == [0] * 8
    assert data["blk.2.gpu_idx"].tolist() == [1] * 8
    assert len(b) % 32 == 0


def _patched(p: Path, tmp_path: Path) -> Path:
    q = tmp_path / "patched.gguf"
    q.write_bytes(b"GGUF" + p.read_bytes()[4:])
    return q


def test_gguf_reader_opens_the_file(tmp_path):
    """gguf-py reads the file once the magic says GGUF. With today's I32 id (26) it decodes the data too;
    with the original's id 18 (today's IQ3_XXS) the structure still parses."""
    from gguf import GGUFReader
    buckets = [np.arange(0, 512, 2, dtype=np.int32), np.arange(256, dtype=np.int32)]
    p = gs.write_gpuidx(tmp_path / "modern.gpuidx", buckets, 512, 10**9, {"powerinfer_py.vram_budget": 7},
                        legacy_i32=False)
    r = GGUFReader(_patched(p, tmp_path))
    assert r.fields["general.architecture"].contents() == "generic.gpu_index"
    assert r.fields["generic.gpu_index.block_count"].contents() == 2
    assert r.fields["split.vram_capacity"].contents() == 10**9
    assert [t.name for t in r.tensors] == ["blk.0.gpu_idx", "blk.0.gpu_bucket", "blk.1.gpu_idx", "blk.1.gpu_bucket"]
    np.testing.assert_array_equal(r.tensors[1].data, buckets[0])
    np.testing.assert_array_equal(r.tensors[0].data, np.isin(np.arange(512), buckets[0]).astype(np.int32))
    np.testing.assert_array_equal(r.tensors[3].data, buckets[1])

    p = gs.write_gpuidx(tmp_path / "legacy.gpuidx", buckets, 512, 10**9)
    r = GGUFReader(_patched(p, tmp_path))
    assert [t.name for t in r.tensors] == ["blk.0.gpu_idx", "blk.0.gpu_bucket", "blk.1.gpu_idx", "blk.1.gpu_bucket"]
    assert [int(t.tensor_type) for t in r.tensors] == [18] * 4
    assert [int(t.shape[0]) for t in r.tensors] == [512, 256, 512, 256]
    assert r.fields["split.vram_capacity"].contents() == 10**9


def test_reader_rejects_broken_files(tmp_path):
    good = gs.write_gpuidx(tmp_path / "g.gpuidx", [np.array([0, 3], np.int32)], 4, 1)
    raw = good.read_bytes()
    cases = {
        "magic": b"GGML" + raw[4:],
        "truncated": raw[:60],
        "short data": raw[:-40],
    }
    for name, data in cases.items():
        p = tmp_path / f"{name}.gpuidx"
        p.write_bytes(data)
        with pytest.raises(gs.GpuIndexError):
            gs.read_gpuidx(p)
    with pytest.raises(gs.GpuIndexError, match="cannot read"):
        gs.read_gpuidx(tmp_path / "missing.gpuidx")
    # a mask that disagrees with the bucket
    p = tmp_path / "bad.gpuidx"
    p.write_bytes(raw.replace(struct.pack("<4i", 1, 0, 0, 1), struct.pack("<4i", 1, 1, 0, 1)))
    with pytest.raises(gs.GpuIndexError, match="gpu_bucket does not list"):
        gs.read_gpuidx(p)
    with pytest.raises(gs.GpuSplitError, match="ascending"):
        gs.write_gpuidx(tmp_path / "w.gpuidx", [np.array([3, 1])], 4, 1)
    with pytest.raises(gs.GpuSplitError, match="ascending"):
        gs.write_gpuidx(tmp_path / "w.gpuidx", [np.array([0, 4])], 4, 1)


# ---- budget accounting --------------------------------------------------------------------------

def synthetic_info(rng, *, n_layer=None, sparse=True, wtype=None, ffn_type=None, tied=None):
    types = [0, 1, 30, 2, 8]
    n_head = int(rng.choice([4, 8, 32]))
    head_dim = int(rng.choice([32, 64, 128]))
    n_embd = n_head * head_dim
    n_head_kv = int(rng.choice([h for h in (1, 2, 4, 8, n_head) if n_head % h == 0]))
    n_ff = int(rng.choice([256, 704, 1024, 2816, 11008]))
    n_layer = n_layer or int(rng.integers(1, 40))
    n_vocab = int(rng.choice([320, 32000]))
    wtype = types[int(rng.integers(len(types)))] if wtype is None else wtype
    ffn_type = types[int(rng.integers(len(types)))] if ffn_type is None else ffn_type
    tied = bool(rng.integers(2)) if tied is None else tied
    T = gs.TensorSpec
    t = {"token_embd.weight": T("token_embd.weight", wtype, (n_embd, n_vocab)),
         "output_norm.weight": T("output_norm.weight", 0, (n_embd,))}
    if not tied:
        t["output.weight"] = T("output.weight", wtype, (n_embd, n_vocab))
    for il in range(n_layer):
        b = f"blk.{il}."
        rank = int(rng.choice([32, 64, 128]))
        specs = [("attn_norm.weight", 0, (n_embd,)), ("ffn_norm.weight", 0, (n_embd,)),
                 ("attn_q.weight", wtype, (n_embd, n_embd)), ("attn_k.weight", wtype, (n_embd, n_head_kv * head_dim)),
                 ("attn_v.weight", wtype, (n_embd, n_head_kv * head_dim)),
                 ("attn_output.weight", wtype, (n_embd, n_embd)),
                 ("ffn_gate.weight", ffn_type, (n_embd, n_ff)), ("ffn_up.weight", ffn_type, (n_embd, n_ff))]
        if sparse:
            specs += [("ffn_down_t.weight", ffn_type, (n_embd, n_ff)), ("fc1.weight", 1, (n_embd, rank)),
                      ("fc2.weight", 1, (rank, n_ff))]
        else:
            specs += [("ffn_down.weight", ffn_type, (n_ff, n_embd))]
        for name, ty, ne in specs:
            t[b + name] = T(b + name, ty, ne)
    return gs.ModelInfo(n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
                        head_dim=head_dim, n_vocab=n_vocab, tensors=t, sparse=sparse)


def total_weight_bytes(info):
    return sum(t.nbytes for t in info.tensors.values())


def test_budget_is_never_exceeded():
    rng = np.random.default_rng(2024)
    n_offloaded = n_hot = 0
    for trial in range(300):
        info = synthetic_info(rng)
        n_ctx = int(rng.choice([64, 512, 2048, 8192]))
        n_batch = int(rng.choice([1, 32, 512, 4096]))
        budget = int(rng.uniform(0, 1.3) * (total_weight_bytes(info) + 2 * n_ctx * info.n_embd_kv * 2 * info.n_layer
                                          + (1 << 30)))
        explicit = bool(rng.integers(2))
        try:
            plan = gs.plan_budget(info, budget, n_ctx=n_ctx, n_batch=n_batch, explicit=explicit,
                                  kv_type=["f16", "f32"][trial % 2])
        except gs.BudgetError as e:
            assert explicit and e.min_budget_bytes > budget and "at least" in str(e)
            continue
        assert plan.used_bytes <= budget
        if not plan.offload:
            assert plan.warnings and plan.used_bytes == 0
            continue
        n_offloaded += 1
        acts = random_acts(rng, info.n_layer, info.n_ff, "pareto")
        counts = gs.solve_greedy(acts, plan.capacity_neurons)
        full = plan.with_hot_counts(counts)
        n_hot += sum(counts) > 0
        assert full.used_bytes <= budget, (full.summary(), budget)
        assert full.hot_counts == counts
        # nothing big is wasted: either every neuron is hot or less than one more group fits
        if sum(counts) < info.n_layer * info.n_ff and plan.capacity_neurons > 0:
            left = budget - full.used_bytes
            short = (256 - info.n_ff % 256) % 256          # a layer's last group holds fewer neurons
            reserve = info.n_layer * (len(plan.row_bytes) + 1) * gs.ALIGN
            assert left < reserve + (256 + info.n_layer * short) * plan.neuron_bytes
    assert n_offloaded > 50 and n_hot > 30


def test_priority_order_and_categories():
    rng = np.random.default_rng(1)
    info = synthetic_info(rng, n_layer=4, wtype=1, ffn_type=1, tied=False)
    plan = gs.plan_budget(info, 1 << 34, n_ctx=256, n_batch=64)
    cats = [i.category for i in plan.items]
    order = ["attn", "pred", "ffn_io", "output", "kv_v", "kv_k", "compute", "reserve"]
    assert [c for i, c in enumerate(cats) if i == 0 or cats[i - 1] != c] == order
    attn = [i.name for i in plan.items if i.category == "attn"]
    assert attn[0].startswith("blk.0.") and attn[-1].startswith("blk.3.")
    assert sum(i.nbytes for i in plan.items if i.category == "kv_v") == 4 * gs.padded(256 * info.n_embd_kv * 2)
    compute = {i.name: i.nbytes for i in plan.items if i.category == "compute"}
    assert compute["attention scores"] >= info.n_head * 64 * 256 * 4 and compute["logits"] >= 64 * info.n_vocab * 4
    assert plan.capacity_neurons == 4 * info.n_ff        # a 16 GiB budget holds everything
    full = plan.with_hot_counts([info.n_ff] * 4)
    assert full.used_bytes <= plan.budget_bytes
    assert "hot FFN rows" in full.summary()


def test_explicit_budget_too_small_is_a_clear_error():
    info = synthetic_info(np.random.default_rng(0), n_layer=8, wtype=1, ffn_type=1)
    with pytest.raises(gs.BudgetError, match="cannot hold the dense part.*at least --vram-budget") as e:
        gs.plan_budget(info, 1 << 20, n_ctx=512)
    dense = e.value.min_budget_bytes
    plan = gs.plan_budget(info, dense, n_ctx=512)            # exactly enough: dense only
    assert plan.offload and plan.capacity_neurons == 0 and plan.used_bytes == dense
    auto = gs.plan_budget(info, 1 << 20, n_ctx=512, explicit=False)
    assert not auto.offload and auto.used_bytes == 0 and "cannot hold" in auto.warnings[0]
    assert "nothing offloaded" in auto.summary()


def test_unsupported_types_and_dense_models_keep_the_ffn_on_the_cpu():
    rng = np.random.default_rng(4)
    info = synthetic_info(rng, n_layer=2, wtype=1, ffn_type=12)          # q4_K FFN
    plan = gs.plan_budget(info, 1 << 34)
    assert plan.offload and plan.capacity_neurons == 0 and "q4_K" in plan.warnings[0]
    info = synthetic_info(rng, n_layer=2, wtype=1, ffn_type=39)          # mxfp4 FFN (the GPU has no MXFP4 kernels)
    plan = gs.plan_budget(info, 1 << 34)
    assert plan.offload and plan.capacity_neurons == 0 and "mxfp4" in plan.warnings[0]
    info = synthetic_info(rng, n_layer=2, wtype=12, ffn_type=1)          # q4_K attention
    plan = gs.plan_budget(info, 1 << 34)
    assert not plan.offload and "do not support" in plan.warnings[0]
    info = synthetic_info(rng, n_layer=2, wtype=1, ffn_type=1, sparse=False)
    plan = gs.plan_budget(info, 1 << 34)
    assert plan.offload and plan.capacity_neurons == 0 and "dense model" in plan.warnings[0]
    plan = gs.plan_budget(synthetic_info(rng, n_layer=2, wtype=1, ffn_type=1), 1 << 34, disable_gpu_index=True)
    assert plan.capacity_neurons == 0 and "disable-gpu-index" in plan.warnings[0]


def test_compute_buffers_grow_with_context_and_batch():
    info = synthetic_info(np.random.default_rng(9), n_layer=2, wtype=1, ffn_type=1)
    small = sum(gs.compute_buffers(info, 256, 8).values())
    assert sum(gs.compute_buffers(info, 4096, 8).values()) > small
    assert sum(gs.compute_buffers(info, 256, 256).values()) > small


# ---- the index next to the model -----------------------------------------------------------------

@pytest.fixture()
def model_dir(tmp_path):
    path = write_sparse_model(tmp_path / "tiny.powerinfer.gguf", dtype="f16", ranks=(32, 64, 32), n_ff=640)
    rng = np.random.default_rng(0)
    save_acts(tmp_path / "activation", random_acts(rng, 3, 640, "pareto"))
    return path


@pytest.fixture()
def writes(monkeypatch):
    calls = []
    real = gs.write_gpuidx

    def counting(*a, **k):
        calls.append(a[3])
        return real(*a, **k)
    monkeypatch.setattr(gs, "write_gpuidx", counting)
    return calls


def test_ensure_gpu_index_regeneration_rules(model_dir, writes):
    idx_path = gs.gpuidx_path(model_dir)
    assert idx_path.name == "tiny.powerinfer.gguf.generated.gpuidx"
    info = gs.ModelInfo.from_gguf(model_dir)
    dense = gs.plan_budget(info, 1 << 40).dense_bytes
    per_group = 256 * gs.plan_budget(info, 1 << 40).neuron_bytes
    budget = dense + 4 * per_group + (64 << 10)

    plan, idx = gs.ensure_gpu_index(model_dir, budget)
    assert len(writes) == 1 and idx_path.exists() and plan.used_bytes <= budget
    assert sum(plan.hot_counts) > 0 and idx.hot_counts == plan.hot_counts
    stored = gs.read_gpuidx(idx_path)
    assert stored.vram_capacity == plan.ffn_bytes and stored.extra["powerinfer_py.vram_budget"] == budget

    gs.ensure_gpu_index(model_dir, budget)                       # same budget: reused
    assert len(writes) == 1
    plan2, _ = gs.ensure_gpu_index(model_dir, budget + 5 * per_group)   # larger: regenerated (the original kept it)
    assert len(writes) == 2 and sum(plan2.hot_counts) > sum(plan.hot_counts)
    gs.ensure_gpu_index(model_dir, budget)                       # smaller: regenerated
    assert len(writes) == 3
    gs.ensure_gpu_index(model_dir, budget, reset=True)           # --reset-gpu-index
    assert len(writes) == 4
    gs.ensure_gpu_index(model_dir, budget, n_ctx=256)            # another context size leaves another FFN budget
    assert len(writes) == 5
    gs.ensure_gpu_index(model_dir, budget)
    assert len(writes) == 6
    st = model_dir.stat()
    os.utime(model_dir, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # the model file changed
    gs.ensure_gpu_index(model_dir, budget)
    assert len(writes) == 7
    act = model_dir.parent / "activation" / "activation_1.pt"
    act.write_bytes(act.read_bytes())                            # new statistics (size/mtime)
    os.utime(act, ns=(0, 10**9))
    gs.ensure_gpu_index(model_dir, budget)
    assert len(writes) == 8
    idx_path.write_bytes(b"garbage")                             # unreadable: regenerated, no crash
    gs.ensure_gpu_index(model_dir, budget)
    assert len(writes) == 9 and gs.read_gpuidx(idx_path).n_layer == 3
    gs.ensure_gpu_index(model_dir, budget)
    assert len(writes) == 9


def test_ensure_gpu_index_disable_and_missing_statistics(model_dir, writes, tmp_path):
    plan, idx = gs.ensure_gpu_index(model_dir, 1 << 30, disable=True)
    assert idx is None and not plan.hot_counts and plan.offload and not writes
    plan, idx = gs.ensure_gpu_index(model_dir, 1 << 30, activation_dir=tmp_path / "none")
    assert idx is None and any("not found" in w for w in plan.warnings) and not writes
    with pytest.raises(gs.ActivationError):
        gs.ensure_gpu_index(model_dir, 1 << 30, activation_dir=tmp_path / "none", strict=True)
    with pytest.raises(gs.BudgetError):
        gs.ensure_gpu_index(model_dir, 1000)
    plan, idx = gs.ensure_gpu_index(model_dir, 1000, explicit=False)
    assert not plan.offload and idx is None
    plan, idx = gs.ensure_gpu_index(model_dir, 1 << 30)          # everything fits: every neuron hot
    assert plan.hot_counts == [640] * 3 and plan.used_bytes <= 1 << 30


# ---- command line --------------------------------------------------------------------------------

def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO / "bindings")}
    return subprocess.run([sys.executable, "-m", "powerinfer.gpu_split", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


def test_cli_original_invocation(tmp_path):
    n_layer, n_ff = 12, 512
    acts = random_acts(np.random.default_rng(8), n_layer, n_ff, "pareto")
    d = save_acts(tmp_path / "activation", acts)
    out = tmp_path / "m.gguf.generated.gpuidx"
    r = run_cli("--activation", d, "--layer", n_layer, "--neuron", n_ff, "--capacity", 2560,
                "--vram-capacity", 123456, "--output", out)
    assert r.returncode == 0, r.stderr
    idx = gs.read_gpuidx(out)
    assert idx.vram_capacity == 123456 and idx.n_layer == n_layer and sum(idx.hot_counts) == 2560
    assert idx.hot_counts == gs.solve_greedy(gs.load_activations(d, n_layer, n_ff), 2560)
    for i in range(n_layer):
        np.testing.assert_array_equal(idx.buckets[i], gs.hot_neurons(np.float32(acts[i]), idx.hot_counts[i]))


def test_cli_friendly_form_and_errors(model_dir, tmp_path):
    r = run_cli("--model", model_dir, "--vram-budget", 0.5, "-c", 256)
    assert r.returncode == 0, r.stderr
    assert "hot FFN rows" in r.stdout and gs.gpuidx_path(model_dir).exists()
    r = run_cli("--model", model_dir, "--vram-budget", 0.0001)
    assert r.returncode == 1 and "cannot hold the dense part" in r.stderr
    r = run_cli("--activation", tmp_path / "none", "--layer", 2, "--neuron", 256, "--capacity", 256,
                "--vram-capacity", 1, "--output", tmp_path / "o")
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("--layer", 2)
    assert r.returncode == 2 and "missing --activation" in r.stderr


# ---- the GPU API in a build without a device ------------------------------------------------------

def test_gpu_api_is_always_exported():
    api = gs.cuda_api()
    assert api is not None, "libpowerinfer does not export powerinfer_cuda.h (stale build?)"
    ffi, lib = api
    n = lib.pi_cuda_available()
    assert n >= 0
    if n == 0:
        x = ffi.new("pi_tensor *")
        assert lib.pi_cuda_op_mul_mat(x, x, x) == lib.PI_ERR_UNSUPPORTED
        msg = ffi.string(lib.pi_last_error()).decode()
        assert "no GPU device" in msg or "without a GPU backend" in msg
        assert gs.device_info() is None and gs.default_budget_bytes() is None


def test_example_gpu_flags_parse():
    """-ngl is its own option (argparse's prefix matching would read it as -n gl); --vram-budget is GiB."""
    import importlib.util
    root = Path(__file__).resolve().parents[1]
    from powerinfer.offload import gpu_kwargs
    for name in ("main", "perplexity", "batched"):
        spec = importlib.util.spec_from_file_location(f"ex_{name}", root / "examples" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod   # dataclasses look their module up there
        spec.loader.exec_module(mod)
        extra = ["-m", "x.gguf"] if name != "batched" else ["x.gguf"]
        a = mod.parse_args([*extra, "-ngl", "7", "--vram-budget", "1.5", "--reset-gpu-index", "--disable-gpu-index"])
        assert gpu_kwargs(a) == dict(vram_budget=int(1.5 * 2**30), reset_gpu_index=True, disable_gpu_index=True,
                                     n_gpu_layers=7)
        assert mod.parse_args([*extra, "--n-gpu-layers", "-1"]).n_gpu_layers == -1
    from powerinfer.server.cli import parse_args
    a = parse_args(["-m", "x.gguf", "-ngl", "3", "--vram-budget", "2"])
    assert a.n_gpu_layers == 3 and a.vram_budget == 2.0
    with pytest.raises(ValueError, match="vram-budget"):
        gpu_kwargs(argparse.Namespace(vram_budget=-1.0))
