"""The VRAM accounting: what a model's device part costs under a budget, and how many hot FFN
neurons fit in what is left.

In the spec's priority order: attention (all layers), predictors, FFN norms, output head, then the
KV cache (V, then K) and the compute buffers (which the original forgot, the root of its
out-of-memory reports), then hot FFN rows with what is left. Every device buffer is counted with
its 256-byte padding plus the allocator's rounding, so ``plan.used_bytes <= budget`` always holds.
Sizes come from libpowerinfer: a type's row bytes (pi_row_bytes), a context's compute buffers
(pi_offload_compute_bytes with the device, pi_offload_plan_compute_bytes without one)."""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .._ffi import check, ffi, lib
from .common import ALIGN, GROUP, BudgetError, GpuSplitError, gib, padded

ARENAS = 4                       # device allocations of a context: weights, hot FFN rows, KV cache, compute
ARENA_ROUNDING = 2 << 20         # cudaMalloc rounds large allocations up to 2 MiB
GPU_TYPES = {0, 1, 2, 8, 30}     # weight types the GPU kernels (core/cuda) compute with


def type_name(type_id: int) -> str:
    return ffi.string(lib.pi_type_name(int(type_id))).decode()


def row_bytes(type_id: int, n: int) -> int:
    """Bytes of a row of n elements of a ggml type, as libpowerinfer's type traits give them."""
    block = int(lib.pi_type_block_size(int(type_id)))
    if block == 0:
        raise GpuSplitError(f"unknown ggml type id {type_id}")
    if n % block:
        raise GpuSplitError(f"{n} elements is not a multiple of the {type_name(type_id)} block size {block}")
    return int(lib.pi_row_bytes(int(type_id), int(n)))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type: int
    ne: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.ne[1:]:
            n *= d
        return row_bytes(self.type, self.ne[0]) * n


@dataclass
class ModelInfo:
    """What the placement needs to know about a model (from its GGUF file, or built by hand)."""
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    tensors: dict[str, TensorSpec]
    sparse: bool = True
    path: Path | None = None
    n_swa: int = 0

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def max_rank(self) -> int:
        return max((t.ne[1] for n, t in self.tensors.items() if n.endswith(".fc1.weight")), default=0)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "ModelInfo":
        from ..gguf_file import open_gguf
        f = open_gguf(path)
        meta = f.metadata
        arch = meta.get("general.architecture")

        def get(key, default=None):
            v = meta.get(f"{arch}.{key}", default)
            if v is None:
                raise GpuSplitError(f"{path}: missing metadata {arch}.{key}")
            return int(v)

        n_embd, n_head = get("embedding_length"), get("attention.head_count")
        head_dim = int(meta.get(f"{arch}.attention.key_length") or n_embd // n_head)
        tensors = {name: TensorSpec(name, t.type, tuple(t.ne)) for name, t in f.tensors.items()}
        emb = tensors.get("token_embd.weight")
        return cls(n_layer=get("block_count"), n_embd=n_embd, n_ff=get("feed_forward_length"), n_head=n_head,
                   n_head_kv=get("attention.head_count_kv", n_head), head_dim=head_dim,
                   n_vocab=emb.ne[1] if emb else len(meta.get("tokenizer.ggml.tokens") or []),
                   tensors=tensors, sparse=f.is_sparse, path=Path(path),
                   n_swa=int(meta.get(f"{arch}.attention.sliding_window") or 0))


_LEVELS = ("attn", "pred", "ffn_io", "output")
_LEVEL_RE = [
    ("attn", re.compile(r"^blk\.(\d+)\.(attn_norm(_2)?|attn_q|attn_k|attn_v|attn_output|attn_qkv|attn_q_norm|"
                        r"attn_k_norm|attn_sinks|post_attention_norm)\.(weight|bias)$")),
    ("pred", re.compile(r"^blk\.(\d+)\.(fc1|fc2)\.weight$")),
    ("ffn_io", re.compile(r"^blk\.(\d+)\.(ffn_norm|post_ffw_norm)\.(weight|bias)$")),
    ("output", re.compile(r"^(output|output_norm)\.(weight|bias)$")),
]
_FFN_RE = re.compile(r"^blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down_t|ffn_down)\.weight$")


def dense_levels(info: ModelInfo) -> dict[str, list[TensorSpec]]:
    """Tensors of the dense levels, each level in layer order (spec 3.3). Tied output heads
    (no output.weight) put token_embd in the output level: the logits need it on the device."""
    levels: dict[str, list[tuple[int, str, TensorSpec]]] = {lv: [] for lv in _LEVELS}
    for name, t in info.tensors.items():
        for lv, rx in _LEVEL_RE:
            m = rx.match(name)
            if m:
                layer = int(m.group(1)) if lv != "output" else 0
                levels[lv].append((layer, name, t))
                break
    if "output.weight" not in info.tensors and "token_embd.weight" in info.tensors:
        levels["output"].append((0, "token_embd.weight", info.tensors["token_embd.weight"]))
    return {lv: [t for _, _, t in sorted(items, key=lambda x: (x[0], x[1]))] for lv, items in levels.items()}



def _q8_bytes(K: int, T: int) -> int:
    return int(lib.pi_row_bytes(lib.PI_TYPE_Q8_0, K)) * T


def compute_buffers(info: ModelInfo, n_ctx: int, n_batch: int) -> dict[str, int]:
    """Device buffers of one forward pass over n_batch tokens with n_ctx KV cells (bytes, unpadded),
    for a ModelInfo made by hand (no file to ask the library about): an upper bound of what the GPU
    forward pass allocates (core/cuda/README.md, "Wiring"). A model file's plan asks the library
    instead (library_compute_bytes); the axpy partial sums come from the CUDA kernel's own sizing."""
    E, T, F, H = info.n_embd, n_batch, info.n_ff, info.n_head
    Eq = H * info.head_dim
    r = info.max_rank
    bufs = {
        "residual x, normed input, attention out, ffn out (GPU part, CPU part)": 5 * T * E * 4,
        "q": T * Eq * 4,
        "k, v of the batch": 2 * T * info.n_embd_kv * 4,
        "attention scores": H * T * n_ctx * 4,
        "attention masks": T * n_ctx * 4 * (2 if info.n_swa else 1),
        "positions, cells, token ids": 3 * T * 4,
        "q8_0 activations (largest K)": max(_q8_bytes(K - K % 32, T) for K in (E, Eq, F, max(r, 32))),
        "logits": T * info.n_vocab * 4,
        "counters": 8,
    }
    if info.sparse:
        bufs["predictor scores"] = T * F * 4
        bufs["predictor hidden"] = T * r * 4
        bufs["ffn hidden h (all neurons hot)"] = T * F * 4
        bufs["axpy partial sums"] = int(lib.pi_cuda_axpy_sparse_scratch(E, F, T))
    else:
        bufs["ffn gate, up"] = 2 * T * F * 4
    return bufs




def library_compute_bytes(model_path: str | os.PathLike, n_ctx: int, n_batch: int, device: int | None = None) -> int:
    """The device bytes of a context's compute buffers and scratch as libpowerinfer allocates them: on
    `device`, or (None) on a device of this build's GPU backend, planned without one. Loads the model
    (without the CPU's repacked copies)."""
    from ..model import Model
    model = Model(model_path, repack=False)
    if device is None:
        n = int(lib.pi_offload_plan_compute_bytes(model._ptr, int(n_ctx), int(n_batch)))
    else:
        n = int(lib.pi_offload_compute_bytes(model._ptr, int(device), int(n_ctx), int(n_batch)))
    if n < 0:
        check(-1, "compute buffer bytes")
    return n


@dataclass
class PlanItem:
    name: str
    category: str            # attn, pred, ffn_io, output, kv_v, kv_k, compute, reserve, ffn_hot
    nbytes: int              # padded device bytes


@dataclass
class Plan:
    """Where everything goes. used_bytes <= budget_bytes always holds."""
    budget_bytes: int
    offload: bool                        # the dense part (attention ... output, KV, compute) is on the GPU
    items: list[PlanItem]
    dense_bytes: int                     # everything before the hot FFN rows
    ffn_bytes: int                       # budget left for hot FFN rows (split.vram_capacity)
    neuron_bytes: int                    # device bytes of one hot neuron (gate+up+down_t rows + bucket entry)
    row_bytes: list[int]                 # bytes per neuron of each FFN matrix on the GPU (gate, up, down_t)
    capacity_neurons: int                # hot neurons that fit in ffn_bytes (multiple of GROUP)
    n_layer: int
    n_ff: int
    hot_counts: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    n_ctx: int = 0
    n_batch: int = 0

    @property
    def hot_bytes(self) -> int:
        return sum(i.nbytes for i in self.items if i.category == "ffn_hot")

    @property
    def used_bytes(self) -> int:
        return sum(i.nbytes for i in self.items)

    def by_category(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in self.items:
            out[i.category] = out.get(i.category, 0) + i.nbytes
        return out

    def with_hot_counts(self, counts: Sequence[int]) -> "Plan":
        """A copy with the hot FFN rows of `counts` (per layer) added; raises BudgetError if they do not
        fit (they always do for counts from solve_greedy(acts, self.capacity_neurons))."""
        counts = [int(c) for c in counts]
        if len(counts) != self.n_layer or any(not 0 <= c <= self.n_ff for c in counts):
            raise GpuSplitError(f"hot counts {counts[:4]}... do not fit {self.n_layer} layers of {self.n_ff} neurons")
        if not self.offload and any(counts):
            raise BudgetError("no FFN rows can go to the GPU: the dense part is not offloaded", self.dense_bytes)
        items = [i for i in self.items if i.category != "ffn_hot"]
        for il, k in enumerate(counts):
            if k == 0:
                continue
            nbytes = sum(padded(b * k) for b in self.row_bytes) + padded(4 * k)
            items.append(PlanItem(f"blk.{il} hot FFN rows ({k} of {self.n_ff})", "ffn_hot", nbytes))
        plan = dataclasses.replace(self, items=items, hot_counts=counts, warnings=list(self.warnings))
        if plan.used_bytes > plan.budget_bytes:
            raise BudgetError(f"hot FFN rows need {gib(plan.hot_bytes)}, only {gib(self.ffn_bytes)} is left",
                              plan.used_bytes)
        return plan

    def summary(self) -> str:
        cat = self.by_category()
        names = {"attn": "attention", "pred": "predictors", "ffn_io": "FFN norms", "output": "output head",
                 "kv_v": "KV cache V", "kv_k": "KV cache K", "compute": "compute buffers",
                 "reserve": "allocator rounding", "ffn_hot": "hot FFN rows"}
        lines = [f"VRAM budget {gib(self.budget_bytes)} (n_ctx {self.n_ctx}, n_batch {self.n_batch}): "
                 f"{'dense part on the GPU' if self.offload else 'nothing offloaded'}"]
        for c in ("attn", "pred", "ffn_io", "output", "kv_v", "kv_k", "compute", "reserve", "ffn_hot"):
            if c in cat:
                lines.append(f"  {names[c]:<20} {gib(cat[c]):>12}")
        if self.hot_counts:
            hot = sum(self.hot_counts)
            lines.append(f"  hot neurons {hot} of {self.n_layer * self.n_ff} "
                         f"({100.0 * hot / max(1, self.n_layer * self.n_ff):.1f}%), per layer "
                         f"{min(self.hot_counts)}..{max(self.hot_counts)}")
        lines.append(f"  used {gib(self.used_bytes)} of {gib(self.budget_bytes)}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _kv_row_bytes(kv_type: str | tuple[str, str], n_embd_kv: int) -> tuple[int, int]:
    """Bytes of one cell's K and V rows in one layer: kv_type one cache type for both, or a (K, V) pair
    (Context's kv_type)."""
    pair = (kv_type, kv_type) if isinstance(kv_type, str) else tuple(kv_type)
    out = []
    for t in pair:
        if not isinstance(t, str) or not hasattr(lib, "PI_TYPE_" + t.upper()) or t == "i32":
            raise GpuSplitError(f"kv_type must name a cache type (f16, f32, q8_0, ...), not {kv_type!r}")
        out.append(row_bytes(getattr(lib, "PI_TYPE_" + t.upper()), n_embd_kv))
    if len(out) != 2:
        raise GpuSplitError(f"kv_type must be a type or a (K, V) pair of types, not {kv_type!r}")
    return out[0], out[1]


def ffn_row_bytes(info: ModelInfo) -> list[int]:
    """Device bytes per neuron of each FFN matrix that moves with a hot neuron (the largest over
    layers, in their own dtypes): gate (if any), up, down_t."""
    out = []
    for part in ("ffn_gate", "ffn_up", "ffn_down_t"):
        specs = [t for n, t in info.tensors.items() if n.endswith(f".{part}.weight") and n.startswith("blk.")]
        if specs:
            out.append(max(row_bytes(t.type, t.ne[0]) for t in specs))
    return out


def plan_budget(info: ModelInfo, budget_bytes: int, *, n_ctx: int = 512, n_batch: int = 512,
                kv_type: str | tuple[str, str] = "f16", explicit: bool = True, disable_gpu_index: bool = False,
                group: int = GROUP, compute_bytes: int | None = None) -> Plan:
    """The dense part in priority order, then the capacity left for hot FFN rows (spec 3, with the
    KV cache and compute buffers counted). Raises BudgetError when an explicit budget cannot hold
    the dense part; with explicit=False returns a plan that offloads nothing, with a warning.
    compute_bytes: the device bytes of the compute buffers and scratch as the library allocates
    them (pi_offload_compute_bytes, what Context passes); None: the estimate of compute_buffers()."""
    budget_bytes = int(budget_bytes)
    if budget_bytes < 0:
        raise GpuSplitError(f"VRAM budget {budget_bytes} bytes is negative")
    if n_ctx < 1 or n_batch < 1:
        raise GpuSplitError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be >= 1")
    n_batch = min(n_batch, n_ctx)
    items: list[PlanItem] = []
    unsupported = set()
    for lv, specs in dense_levels(info).items():
        for t in specs:
            if t.type not in GPU_TYPES:
                unsupported.add(f"{t.name} ({type_name(t.type)})")
            items.append(PlanItem(t.name, lv, padded(t.nbytes)))
    k_row, v_row = _kv_row_bytes(kv_type, info.n_embd_kv)
    for il in range(info.n_layer):
        items.append(PlanItem(f"blk.{il} V cache", "kv_v", padded(n_ctx * v_row)))
    for il in range(info.n_layer):
        items.append(PlanItem(f"blk.{il} K cache", "kv_k", padded(n_ctx * k_row)))
    if compute_bytes is not None:
        items.append(PlanItem("compute buffers and scratch (libpowerinfer)", "compute", padded(int(compute_bytes))))
    else:
        for name, b in compute_buffers(info, n_ctx, n_batch).items():
            items.append(PlanItem(name, "compute", padded(b)))
    items.append(PlanItem(f"allocator rounding ({ARENAS} arenas)", "reserve", ARENAS * ARENA_ROUNDING))
    dense = sum(i.nbytes for i in items)
    rb = ffn_row_bytes(info)
    neuron_bytes = sum(rb) + 4
    base = dict(budget_bytes=budget_bytes, n_layer=info.n_layer, n_ff=info.n_ff, neuron_bytes=neuron_bytes,
                row_bytes=rb, n_ctx=n_ctx, n_batch=n_batch)
    if unsupported or dense > budget_bytes:
        if unsupported:
            msg = (f"the GPU kernels do not support {', '.join(sorted(unsupported)[:3])}"
                   f"{' ...' if len(unsupported) > 3 else ''}: nothing is offloaded")
        else:
            running, first = 0, None
            for i in items:
                running += i.nbytes
                if running > budget_bytes:
                    first = i
                    break
            msg = (f"VRAM budget {gib(budget_bytes)} cannot hold the dense part of the model: it needs "
                   f"{gib(dense)} (attention, predictors, norms, output head, KV cache for {n_ctx} tokens, "
                   f"compute buffers for {n_batch} tokens); the first that does not fit is {first.name}. "
                   f"Give at least --vram-budget {math.ceil(dense / 2**30 * 100) / 100:.2f}, or lower -c/-b")
        if explicit and not unsupported:
            raise BudgetError(msg, dense)
        return Plan(offload=False, items=[], dense_bytes=dense, ffn_bytes=0, capacity_neurons=0,
                    warnings=[msg], **base)
    ffn = budget_bytes - dense
    warns = []
    # per layer, each FFN matrix and the bucket are padded once: reserve that before dividing
    reserve = info.n_layer * (len(rb) + 1) * ALIGN
    cap = 0
    if disable_gpu_index:
        warns.append("--disable-gpu-index: the FFN runs on the CPU")
    elif not info.sparse:
        warns.append("dense model (GGUF magic): no hot-neuron split; the FFN runs on the CPU")
    elif not rb:
        warns.append("the model has no FFN matrices")
    else:
        ffn_types = {t.type for n, t in info.tensors.items() if _FFN_RE.match(n)}
        bad = ffn_types - GPU_TYPES
        if bad:
            warns.append(f"FFN weights of type {', '.join(type_name(b) for b in sorted(bad))} have no "
                         "GPU kernels yet: the FFN runs on the CPU")
        else:
            cap = max(0, ffn - reserve) // neuron_bytes // group * group
            cap = min(cap, -(-info.n_ff // group) * group * info.n_layer)
    return Plan(offload=True, items=items, dense_bytes=dense, ffn_bytes=ffn, capacity_neurons=cap,
                warnings=warns, **base)
