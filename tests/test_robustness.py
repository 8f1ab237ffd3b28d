"""Robustness: every bad input gives a Python exception (or a C error status with a message),
never a segfault, an abort or a hang.

Three layers are covered:
  * model files: missing, empty, truncated anywhere, wrong magic/version, corrupt offsets, counts
    and types, missing or misshapen tensors, absurd hyper-parameters, unsupported architectures,
    PowerInfer (PWRI) files -> powerinfer.ModelLoadError with a message that says what is wrong;
  * every public C function of core/include/powerinfer.h, called directly through cffi with NULL
    pointers, bad sizes, bad type ids, mismatched shapes, bad tokens/positions/sequence ids,
    oversized batches and contexts, a full KV cache -> the documented status code and a
    non-empty pi_last_error();
  * the high-level Context -> ValueError / PowerInferError.

The cases that could take the interpreter down if a check regressed (huge sizes, allocation
failure, corrupt array lengths that used to make the gguf reader spin) also run in a child
process, which must exit cleanly.
"""
from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "tools"))

import powerinfer as pi  # noqa: E402
from powerinfer import ModelLoadError, PowerInferError  # noqa: E402
from powerinfer._ffi import ffi, lib  # noqa: E402
from make_test_model import write_model  # noqa: E402
from model_files import rewrite  # noqa: E402

TINY = dict(n_vocab=320, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, n_layer=2)

OK = lib.PI_OK
INVALID = lib.PI_ERR_INVALID_ARG
NOMEM = lib.PI_ERR_OUT_OF_MEMORY
UNSUPPORTED = lib.PI_ERR_UNSUPPORTED
BAD_MODEL = lib.PI_ERR_BAD_MODEL
KV_FULL = lib.PI_ERR_KV_FULL
ABORTED = lib.PI_ERR_ABORTED
F32, F16, Q4_0, Q8_0, I32, BF16 = (lib.PI_TYPE_F32, lib.PI_TYPE_F16, lib.PI_TYPE_Q4_0, lib.PI_TYPE_Q8_0,
                                   lib.PI_TYPE_I32, lib.PI_TYPE_BF16)
INT32_MAX = 2**31 - 1


# =======================================================================================
# helpers
# =======================================================================================
def last_error() -> str:
    return ffi.string(lib.pi_last_error()).decode("utf-8", "replace")


def poison_error() -> None:
    """Leave a known message in pi_last_error(), so that a later check sees a fresh one."""
    out = ffi.new("pi_threadpool **")
    assert lib.pi_threadpool_create(10**6, out) == INVALID
    assert "n_threads" in last_error()


def expect(status: int, code: int | tuple[int, ...], *words: str) -> str:
    """status is `code` (one of them), and pi_last_error() is non-empty and contains every word."""
    codes = code if isinstance(code, tuple) else (code,)
    msg = last_error()
    assert status in codes, f"status {status}, expected {codes}; last error: {msg!r}"
    assert msg.strip(), "pi_last_error() is empty after a failed call"
    for w in words:
        assert w.lower() in msg.lower(), f"{w!r} not in error message {msg!r}"
    return msg


def _isolated_env(extra_asan: str = "") -> dict:
    env = dict(os.environ)
    pkg_parent = str(Path(pi.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, str(_ROOT / "tools"), env.get("PYTHONPATH")) if p)
    env["POWERINFER_LIB_PATH"] = str(_loaded_library())
    if extra_asan:
        env["ASAN_OPTIONS"] = ":".join(p for p in (env.get("ASAN_OPTIONS"), extra_asan) if p)
    return env


def _loaded_library() -> Path:
    from powerinfer import _ffi
    return _ffi._library_path()


def run_isolated(code: str, *, timeout: float = 120, extra_asan: str = "") -> str:
    """Run `code` in a fresh interpreter; it must exit 0 without a crash report. Returns stdout."""
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=timeout, env=_isolated_env(extra_asan))
    except subprocess.TimeoutExpired:
        pytest.fail(f"child process hung (> {timeout} s)")
    report = f"rc={r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}"
    assert r.returncode == 0, report
    for bad in ("Segmentation fault", "ERROR: AddressSanitizer", "runtime error:", "Aborted", "core dumped"):
        assert bad not in r.stderr, report
    return r.stdout


# ---- GGUF file surgery ----------------------------------------------------------------
def tensor_fields(path) -> dict[str, dict]:
    """name -> {'type_at', 'offset_at' (file offsets of those fields), 'start', 'nbytes'}."""
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        f = t.field
        sizes = [int(p.nbytes) for p in f.parts]
        type_at = f.offset + sum(sizes[:4])
        out[t.name] = dict(info_at=f.offset, type_at=type_at, offset_at=type_at + 4,
                           start=int(t.data_offset), nbytes=int(t.n_bytes))
    return out


def kv_field(path, key):
    r = gguf.GGUFReader(path)
    f = r.fields[key]
    return f, [int(p.nbytes) for p in f.parts]


def patch(path, at: int, fmt: str, value) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(struct.pack("<" + fmt, value))


def copy_to(src, dst) -> Path:
    Path(dst).write_bytes(Path(src).read_bytes())
    return Path(dst)


def load_error(path) -> str:
    """Model(path) must raise ModelLoadError; returns its message (which names the file)."""
    with pytest.raises(ModelLoadError) as ei:
        pi.Model(path)
    msg = str(ei.value)
    assert Path(path).name in msg, msg
    return msg


# =======================================================================================
# fixtures
# =======================================================================================
@pytest.fixture(scope="module")
def base_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("robust") / "tiny-q8_0.gguf"
    write_model(path, dtype="q8_0", seed=5, **TINY)
    return path


@pytest.fixture(scope="module")
def model(base_file):
    return pi.Model(base_file)


@pytest.fixture
def tmp_file(tmp_path, base_file):
    return copy_to(base_file, tmp_path / "patched.gguf")


def test_base_model_loads(model):
    assert model.hparams.n_vocab == TINY["n_vocab"]
    ctx = pi.Context(model, n_ctx=16, n_threads=2)
    ctx.decode([1, 2, 3])
    assert np.isfinite(ctx.logits()).all()


# =======================================================================================
# 1. model files
# =======================================================================================
def test_missing_file(tmp_path):
    assert "no such model file" in load_error(tmp_path / "nope.gguf")


def test_directory_instead_of_file(tmp_path):
    d = tmp_path / "adir.gguf"
    d.mkdir()
    assert "is a directory, not a model file (no .gguf file in it)" in load_error(d)
    (d / "m.gguf").write_bytes(b"")
    assert "GGUF files in it: m.gguf" in load_error(d)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    assert "too small" in load_error(p)


def test_random_bytes(tmp_path):
    p = tmp_path / "noise.gguf"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert "not a GGUF file" in load_error(p)


def _cut(src, dst, n) -> Path:
    dst = Path(dst)
    dst.write_bytes(Path(src).read_bytes()[:n])
    return dst


def _truncation_points(path) -> dict[str, int]:
    tf = tensor_fields(path)
    names = list(tf)
    tokens, tsizes = kv_field(path, "tokenizer.ggml.tokens")
    first = min(tf.values(), key=lambda t: t["info_at"])
    mid = tf[names[len(names) // 2]]
    last = max(tf.values(), key=lambda t: t["start"])
    return {
        "header_magic_only": 4,
        "header_counts": 20,
        "header_complete": 24,
        "metadata_first_key": 24 + 5,
        "metadata_tokens": tokens.offset + sum(tsizes) // 2,
        "tensor_infos": first["info_at"] + 10,
        "tensor_infos_last": max(t["info_at"] for t in tf.values()) + 7,
        "tensor_data_first": min(t["start"] for t in tf.values()) + 3,
        "tensor_data_middle": mid["start"] + mid["nbytes"] // 2,
        "tensor_data_last_byte": last["start"] + last["nbytes"] - 1,
    }


@pytest.mark.parametrize("where", ["header_magic_only", "header_counts", "header_complete", "metadata_first_key",
                                   "metadata_tokens", "tensor_infos", "tensor_infos_last", "tensor_data_first",
                                   "tensor_data_middle", "tensor_data_last_byte"])
def test_truncated(base_file, tmp_path, where):
    n = _truncation_points(base_file)[where]
    msg = load_error(_cut(base_file, tmp_path / f"cut-{where}.gguf", n))
    assert "too small" in msg or "truncated" in msg, msg
    if where.startswith("tensor_data"):
        assert "truncated" in msg and "tensor '" in msg, msg


def test_truncated_anywhere(base_file, tmp_path):
    """A sweep of cut points over the whole file: always ModelLoadError, never another exception."""
    data = base_file.read_bytes()
    data_end = max(t["start"] + t["nbytes"] for t in tensor_fields(base_file).values())
    data_start = min(t["start"] for t in tensor_fields(base_file).values())
    cuts = sorted(set(np.linspace(0, data_end - 1, 160).astype(int).tolist()) | set(range(0, 64)))
    p = tmp_path / "cut.gguf"
    for n in cuts:
        p.write_bytes(data[:n])
        try:
            pi.Model(p)
        except ModelLoadError as e:
            msg = str(e)
            assert "too small" in msg or "truncated" in msg, (n, msg)
            if n >= data_start:
                assert "truncated" in msg, (n, msg)
        else:
            pytest.fail(f"file cut at {n} of {len(data)} bytes loaded without error")


@pytest.mark.parametrize("magic", [b"GGML", b"ggjt", b"\0\0\0\0", b"FUGG"])
def test_wrong_magic(tmp_file, magic):
    patch(tmp_file, 0, "4s", magic)
    msg = load_error(tmp_file)
    assert "not a GGUF file" in msg and repr(magic) in msg


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFFFFFF, 0x03000000])
def test_unsupported_version(tmp_file, version):
    patch(tmp_file, 4, "I", version)
    msg = load_error(tmp_file)
    assert f"unsupported GGUF version {version}" in msg


@pytest.mark.parametrize("what,at,value", [
    ("tensor_count", 8, 2**62), ("tensor_count", 8, 10**6), ("kv_count", 16, 2**62), ("kv_count", 16, 10**6),
])
def test_corrupt_counts(tmp_file, what, at, value):
    patch(tmp_file, at, "Q", value)
    assert "truncated" in load_error(tmp_file)


def test_corrupt_array_length_does_not_hang(tmp_file):
    """A float array claiming 2^62 items used to make the gguf reader loop (nearly) forever."""
    f, sizes = kv_field(tmp_file, "tokenizer.ggml.scores")
    patch(tmp_file, f.offset + sum(sizes[:4]), "Q", 2**62)   # parts: klen, key, vtype, itype, alen, ...
    out = run_isolated(f"""
        import powerinfer as pi
        try:
            pi.Model({str(tmp_file)!r})
        except pi.ModelLoadError as e:
            print("ERR", e)
    """, timeout=60)
    assert "ERR" in out and "truncated" in out


@pytest.mark.parametrize("key", ["general.architecture", "tokenizer.ggml.tokens"])
def test_corrupt_string_length(tmp_file, key):
    f, sizes = kv_field(tmp_file, key)
    if key == "tokenizer.ggml.tokens":   # the length of the first string in the array
        patch(tmp_file, f.offset + sum(sizes[:5]), "Q", 2**60)
    else:                                # the key's own length
        patch(tmp_file, f.offset, "Q", 2**60)
    assert "truncated" in load_error(tmp_file)


@pytest.mark.parametrize("rel", [2**40, 2**63, 2**64 - 32, "file_size"])
def test_tensor_offset_out_of_bounds(tmp_file, rel):
    tf = tensor_fields(tmp_file)
    name = "blk.0.attn_q.weight"
    value = os.path.getsize(tmp_file) if rel == "file_size" else rel
    patch(tmp_file, tf[name]["offset_at"], "Q", value)
    msg = load_error(tmp_file)
    assert f"tensor '{name}'" in msg and "outside the file" in msg, msg


def _data_offset(path) -> int:
    return int(gguf.GGUFReader(path).data_offset)


@pytest.mark.parametrize("delta", [1, 2, 4, 16])
def test_misaligned_tensor_offset(tmp_file, delta):
    """An offset that is not a multiple of general.alignment (32) is refused by name (llama.cpp's rule);
    the C core would otherwise read floats and fp16 scales at misaligned addresses."""
    name = "blk.0.attn_q.weight"
    tf = tensor_fields(tmp_file)
    patch(tmp_file, tf[name]["offset_at"], "Q", tf[name]["start"] - _data_offset(tmp_file) + delta)
    msg = load_error(tmp_file)
    assert f"tensor '{name}'" in msg and "general.alignment = 32" in msg, msg


@pytest.mark.parametrize("onto", ["previous", "first", "next"])
def test_overlapping_or_out_of_order_tensor_data(tmp_file, onto):
    """Aligned offsets that make two tensors share bytes (or swap places) are refused."""
    tf = tensor_fields(tmp_file)
    names = list(tf)
    i = names.index("blk.0.attn_k.weight")
    target = {"previous": names[i - 1], "first": names[0], "next": names[i + 1]}[onto]
    patch(tmp_file, tf[names[i]]["offset_at"], "Q", tf[target]["start"] - _data_offset(tmp_file))
    msg = load_error(tmp_file)
    assert "expected" in msg and ("overlaps" in msg or "gap" in msg), msg


@pytest.mark.parametrize("new_type", [QT.Q4_0, QT.F16, QT.Q8_0])
def test_tensor_type_changed_in_place(tmp_file, new_type):
    """A type id patched to another type changes the tensor's size: a smaller one (q8_0 -> q4_0) used to
    load and read the next tensor's bytes as its own; now the layout no longer adds up."""
    name = "blk.0.ffn_up.weight" if new_type != QT.Q8_0 else "output_norm.weight"   # q8_0 / f32 tensors
    tf = tensor_fields(tmp_file)
    if name == list(tf)[-1]:
        pytest.skip("the last tensor has no successor to collide with")
    patch(tmp_file, tf[name]["type_at"], "I", int(new_type))
    msg = load_error(tmp_file)
    assert f"tensor '{name}' ({new_type.name}" in msg and ("gap" in msg or "overlaps" in msg), msg


def test_tensor_n_dims_corrupt(tmp_file):
    tf = tensor_fields(tmp_file)
    info = tf["output_norm.weight"]["info_at"]
    name_len = len("output_norm.weight")
    patch(tmp_file, info + 8 + name_len, "I", 2**31)      # n_dims
    assert "truncated" in load_error(tmp_file)


@pytest.mark.parametrize("type_id", [99, 2**31, 4, 40])
def test_unknown_tensor_type(tmp_file, type_id):
    name = "blk.0.attn_q.weight"
    patch(tmp_file, tensor_fields(tmp_file)[name]["type_at"], "I", type_id)
    msg = load_error(tmp_file)
    assert f"tensor '{name}'" in msg and str(type_id) in msg, msg


@pytest.mark.parametrize("type_id,type_name",
                         [(34, "tq1_0"), (26, "i32"), (28, "f64"), (35, "tq2_0")])
def test_known_but_unsupported_tensor_type(tmp_file, type_id, type_name):
    """A valid ggml type the core does not compute with: the message names the tensor and the type."""
    name = "blk.0.attn_q.weight"
    patch(tmp_file, tensor_fields(tmp_file)[name]["type_at"], "I", type_id)
    msg = load_error(tmp_file)
    assert f"tensor '{name}'" in msg and type_name in msg.lower(), msg


def test_tq2_0_tensor_reaches_the_core(tmp_path):
    """With rows of 256 the gguf layer accepts TQ2_0 and the C loader refuses it by name (a
    well-formed file: the tensor's bytes are TQ2_0-sized, so the layout check passes)."""
    src = tmp_path / "wide.gguf"
    write_model(src, dtype="q8_0", n_vocab=320, n_embd=256, n_ff=256, n_head=4, n_head_kv=4, n_layer=1)
    name = "blk.0.attn_q.weight"
    path = rewrite(src, tmp_path / "tq2_0.gguf",
                   replace={name: (np.zeros((256, 66), dtype=np.uint8), QT.TQ2_0)})
    msg = load_error(path)
    assert f"tensor '{name}'" in msg and "tq2_0" in msg and "cannot compute" in msg, msg


@pytest.mark.parametrize("name", ["token_embd.weight", "output_norm.weight", "blk.0.attn_k.weight",
                                  "blk.1.ffn_down.weight", "blk.1.ffn_gate.weight", "blk.0.attn_norm.weight"])
def test_missing_tensor(base_file, tmp_path, name):
    msg = load_error(rewrite(base_file, tmp_path / "missing.gguf", drop=[name]))
    assert f"missing tensor '{name}'" in msg, msg


def test_missing_output_means_tied_embeddings(base_file, tmp_path):
    m = pi.Model(rewrite(base_file, tmp_path / "tied.gguf", drop=["output.weight"]))
    ctx = pi.Context(m, n_ctx=8)
    ctx.decode([1, 2])
    assert np.isfinite(ctx.logits()).all()


def _f32(*shape):
    return np.ones(shape, dtype=np.float32)


@pytest.mark.parametrize("name,data,dt,words", [
    ("blk.0.attn_norm.weight", _f32(32), QT.F32, ["shape"]),
    ("blk.0.attn_norm.weight", _f32(2, 64), QT.F32, ["shape"]),
    ("output_norm.weight", np.ones(64, np.float16), QT.F16, ["must be f32"]),
    ("blk.1.ffn_up.weight", np.zeros((64, 96 // 32 * 34), np.uint8), QT.Q8_0, ["shape"]),   # transposed
    ("blk.0.attn_k.weight", np.zeros((64, 64 // 32 * 34), np.uint8), QT.Q8_0, ["shape"]),   # n_head_kv wrong
    ("token_embd.weight", np.zeros((300, 64 // 32 * 34), np.uint8), QT.Q8_0, ["shape"]),    # n_vocab wrong
    ("blk.0.attn_q.weight", _f32(64, 64, 1, 2), QT.F32, ["shape"]),                           # 4-d
])
def test_wrong_tensor_shape_or_type(base_file, tmp_path, name, data, dt, words):
    msg = load_error(rewrite(base_file, tmp_path / "shape.gguf", replace={name: (data, dt)}))
    assert f"tensor '{name}'" in msg, msg
    for w in words:
        assert w in msg, msg


A = "llama."


@pytest.mark.parametrize("meta,words", [
    ({A + "embedding_length": (2**40, VT.UINT64)}, ["embedding_length", "out of range"]),
    ({A + "embedding_length": (0, VT.UINT32)}, ["embedding_length", "out of range"]),
    ({A + "embedding_length": (-64, VT.INT32)}, ["embedding_length", "out of range"]),
    ({A + "embedding_length": ("64", VT.STRING)}, ["embedding_length", "not an integer"]),
    ({A + "embedding_length": (64.5, VT.FLOAT32)}, ["embedding_length", "not an integer"]),
    ({A + "attention.head_count": (0, VT.UINT32)}, ["head_count", "out of range"]),
    ({A + "attention.head_count": (3, VT.UINT32)}, ["not a multiple of head_count"]),
    ({A + "attention.head_count": (2**32 - 1, VT.UINT32)}, ["head_count", "out of range"]),
    ({A + "attention.head_count_kv": (3, VT.UINT32)}, ["n_head_kv"]),
    ({A + "attention.head_count_kv": (0, VT.UINT32)}, ["head_count_kv", "out of range"]),
    ({A + "block_count": (10**6, VT.UINT32)}, ["n_layer", "absurd"]),
    ({A + "block_count": (2**40, VT.UINT64)}, ["block_count", "out of range"]),
    ({A + "block_count": (0, VT.UINT32)}, ["block_count", "out of range"]),
    ({A + "block_count": (3, VT.UINT32)}, ["missing tensor 'blk.2."]),
    ({A + "feed_forward_length": (2**31, VT.UINT32)}, ["feed_forward_length", "out of range"]),
    ({A + "feed_forward_length": (2**24, VT.UINT32)}, ["n_ff", "out of range"]),
    ({A + "context_length": (-1, VT.INT32)}, ["context_length", "out of range"]),
    ({A + "rope.dimension_count": (7, VT.UINT32)}, ["rope dimension"]),
    ({A + "rope.dimension_count": (64, VT.UINT32)}, ["rope dimension"]),
    ({A + "rope.freq_base": (-1.0, VT.FLOAT32)}, ["rope freq base"]),
    ({A + "rope.freq_base": (float("nan"), VT.FLOAT32)}, ["rope freq base"]),
    ({A + "rope.scaling.type": ("longrope", VT.STRING)}, ["longrope", "not supported"]),
    ({A + "rope.scaling.factor": (0.0, VT.FLOAT32)}, ["scaling factor"]),
    ({A + "attention.layer_norm_rms_epsilon": (float("inf"), VT.FLOAT32)}, ["epsilon"]),
    ({A + "attention.layer_norm_rms_epsilon": (-1.0, VT.FLOAT32)}, ["epsilon"]),
    ({A + "attention.layer_norm_rms_epsilon": ("tiny", VT.STRING)}, ["layer_norm_rms_epsilon"]),
    ({A + "rope.freq_base": ("big", VT.STRING)}, ["freq_base"]),
    ({A + "rope.scaling.factor": ("x", VT.STRING)}, ["scaling.factor"]),
    ({"powerinfer.ffn_activation": ("swiglu2", VT.STRING)}, ["swiglu2"]),
    ({A + "block_count": None}, ["missing metadata key llama.block_count"]),
    ({A + "embedding_length": None}, ["missing metadata key llama.embedding_length"]),
    ({"tokenizer.ggml.tokens": None}, ["tokenizer.ggml.tokens"]),
    ({"powerinfer.sparse_threshold": (float("nan"), VT.FLOAT32)}, ["powerinfer.sparse_threshold", "finite"]),
    ({"powerinfer.sparse_threshold": (float("inf"), VT.FLOAT32)}, ["powerinfer.sparse_threshold", "finite"]),
    ({"powerinfer.sparse_threshold": ("high", VT.STRING)}, ["powerinfer.sparse_threshold", "finite"]),
])
def test_bad_metadata(base_file, tmp_path, meta, words):
    msg = load_error(rewrite(base_file, tmp_path / "meta.gguf", meta=meta))
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("arch", ["gptj", "bloom", "mistral-ish"])
def test_unsupported_architecture(base_file, tmp_path, arch):
    msg = load_error(rewrite(base_file, tmp_path / "arch.gguf", arch=arch))
    assert f"unsupported architecture '{arch}'" in msg, msg


@pytest.mark.parametrize("arch", ["falcon", "opt"])
def test_dense_falcon_opt_refused(base_file, tmp_path, arch):
    msg = load_error(rewrite(base_file, tmp_path / "arch.gguf", arch=arch))
    assert "dense falcon/opt not supported; use the PowerInfer file" in msg, msg


def test_pwri_without_predictors(tmp_path):
    path = tmp_path / "sparse.gguf"
    write_model(path, dtype="q8_0", magic="PWRI", **TINY)
    assert path.read_bytes()[:4] == b"PWRI"
    msg = load_error(path)
    assert "PWRI" in msg and "without" in msg and "ffn_down_t" in msg, msg


def test_pwri_with_incomplete_predictors(base_file, tmp_path):
    """Layer 0 has ffn_down_t and fc1 only; fc2 and layer 1's tensors are missing."""
    extra = {"blk.0.ffn_down_t.weight": (np.zeros((96, 64 // 32 * 34), np.uint8), QT.Q8_0),
             "blk.0.fc1.weight": (_f32(32, 64), QT.F32)}
    path = rewrite(base_file, tmp_path / "sparse.gguf", extra=extra,
                   meta={"powerinfer.ffn_activation": ("relu", VT.STRING)})
    patch(path, 0, "4s", b"PWRI")
    msg = load_error(path)
    assert "PWRI" in msg and ("without" in msg or "not implemented" in msg), msg


def _sparse_writer():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from model_files import write_sparse_model
    except ImportError:
        pytest.skip("tests/sparse_model.py is not available")
    return write_sparse_model


def _pwri_to_gguf_and_back(path, fn):
    patch(path, 0, "4s", b"GGUF")
    out = fn(path)
    patch(out, 0, "4s", b"PWRI")
    return out


def test_pwri_complete_file_loads_or_is_refused_clearly(tmp_path):
    path = _sparse_writer()(tmp_path / "sparse.gguf", dtype="q8_0", ranks=(32, 64), n_ff=96)
    try:
        m = pi.Model(path)
    except ModelLoadError as e:          # sparse inference not there yet
        assert "PWRI" in str(e) and "not implemented" in str(e), str(e)
        return
    ctx = pi.Context(m, n_ctx=8, n_threads=2)
    ctx.decode([1, 2, 3])
    assert np.isfinite(ctx.logits()).all()
    with pytest.raises(PowerInferError, match="out of range"):
        ctx.decode([1, 320])
    with pytest.raises(PowerInferError, match="KV cache full"):
        ctx.decode(list(range(1, 7)))
    ctx.decode([4, 5])
    # the C loader's checks of the sparse layout
    for mutate, words in (
        (lambda d: setattr(d.index["blk.1.fc1.weight"], "name", ffi.NULL), ["predictor", "blk.1.fc1.weight"]),
        (lambda d: setattr(d.index["blk.0.fc1.weight"], "n_dims", 1), ["blk.0.fc1.weight", "2-d"]),
        (lambda d: d.index["blk.0.fc1.weight"].ne.__setitem__(1, 0), ["blk.0.fc1.weight"]),
        (lambda d: d.index["blk.0.fc1.weight"].ne.__setitem__(1, 2**40), ["blk.0.fc1.weight"]),
        (lambda d: d.index["blk.1.fc2.weight"].ne.__setitem__(0, 16), ["blk.1.fc2.weight", "shape"]),
        (lambda d: setattr(d.index["blk.0.fc2.weight"], "name", ffi.NULL), ["missing tensor 'blk.0.fc2.weight'"]),
        (lambda d: setattr(d.index["blk.1.ffn_down_t.weight"], "name", ffi.NULL),
         ["missing tensor 'blk.1.ffn_down_t.weight'"]),
        (lambda d: setattr(d.index["blk.0.ffn_down_t.weight"], "type", 13), ["blk.0.ffn_down_t.weight", "q5_K"]),
        (lambda d: setattr(d.index["blk.0.fc2.weight"], "nbytes", 1), ["blk.0.fc2.weight", "needs"]),
    ):
        d = Desc(m)
        mutate(d)
        poison_error()
        st, ptr = d.create()
        assert ptr == ffi.NULL
        expect(st, (BAD_MODEL, UNSUPPORTED), *words)


def test_pwri_with_a_non_relu_activation(tmp_path):
    path = _sparse_writer()(tmp_path / "sparse.gguf", dtype="f32", ranks=(32, 32), n_ff=96)
    path = _pwri_to_gguf_and_back(path, lambda p: rewrite(p, tmp_path / "silu.gguf",
                                                          meta={"powerinfer.ffn_activation": ("silu", VT.STRING)}))
    msg = load_error(path)
    assert "relu" in msg.lower() or "not implemented" in msg, msg


# =======================================================================================
# 2. the C API, function by function
# =======================================================================================
def test_error_info_functions():
    assert isinstance(last_error(), str)
    info = ffi.string(lib.pi_system_info()).decode()
    assert "CPU_ISA = " in info and "NEON" in info


def test_cpu_isa_functions():
    level = ffi.string(lib.pi_cpu_isa()).decode()
    for bad in (ffi.NULL, b"", b"AVX2", b"avx2 ", b"x" * 5000):
        assert lib.pi_cpu_isa_supported(bad) == 0
        poison_error()
        expect(lib.pi_cpu_isa_set(bad), INVALID, "unknown ISA level")
        assert ffi.string(lib.pi_cpu_isa()).decode() == level
    assert lib.pi_cpu_isa_supported(b"scalar") == 1
    assert lib.pi_cpu_isa_set(level.encode()) == lib.PI_OK
    assert lib.pi_cpu_isa_env_error() == ffi.NULL or os.environ.get("POWERINFER_ISA")
    assert lib.pi_bf16_dot() in (0, 1)   # no arguments: the contract chosen at load (test_isa runs both)


@pytest.mark.parametrize("t", [-2**31, -1, 4, 5, 34, 35, 64, 1000, INT32_MAX])   # 40..63: internal (test_ops)
def test_type_queries_out_of_range(t):
    assert lib.pi_type_supported(t) == 0
    assert ffi.string(lib.pi_type_name(t)) == b"unknown"
    assert lib.pi_type_block_size(t) == 0
    assert lib.pi_type_block_bytes(t) == 0
    assert lib.pi_row_bytes(t, 32) == -1


def test_type_queries_valid():
    for t, name, bs, bb in [(F32, b"f32", 1, 4), (F16, b"f16", 1, 2), (BF16, b"bf16", 1, 2), (Q4_0, b"q4_0", 32, 18),
                            (Q8_0, b"q8_0", 32, 34), (39, b"mxfp4", 32, 17)]:
        assert lib.pi_type_supported(t) == 1
        assert ffi.string(lib.pi_type_name(t)) == name
        assert (lib.pi_type_block_size(t), lib.pi_type_block_bytes(t)) == (bs, bb)
    assert lib.pi_type_supported(I32) == 0     # known (for names), not computable


@pytest.mark.parametrize("t,n", [(Q8_0, 33), (Q4_0, 1), (Q8_0, -32), (F32, -1), (F32, 2**62), (F16, 2**63 - 1),
                                 (BF16, 2**62), (Q8_0, 2**63 - 32)])
def test_row_bytes_invalid_or_overflowing(t, n):
    assert lib.pi_row_bytes(t, n) == -1


def test_row_bytes_large_but_valid():
    assert lib.pi_row_bytes(F32, 2**40) == 2**42
    assert lib.pi_row_bytes(Q8_0, 2**40) == 2**40 // 32 * 34


@pytest.mark.parametrize("fn", ["pi_quantize_row", "pi_dequantize_row"])
def test_quantize_dequantize_bad_args(fn):
    f = getattr(lib, fn)
    src = np.zeros(64, np.float32)
    dst = np.zeros(64 * 4, np.uint8)
    if fn == "pi_quantize_row":
        s, d = ffi.from_buffer("float[]", src), ffi.from_buffer(dst)
    else:
        s, d = ffi.from_buffer(dst), ffi.from_buffer("float[]", src)
    for t in (-1, 99, 4, I32, INT32_MAX):
        poison_error()
        expect(f(t, s, d, 32), UNSUPPORTED, "type")
    for t in (Q8_0, Q4_0, F16, BF16, F32):
        poison_error()
        expect(f(t, ffi.NULL, d, 32), INVALID, "NULL")
        poison_error()
        expect(f(t, s, ffi.NULL, 32), INVALID, "NULL")
        poison_error()
        expect(f(t, s, d, -32), INVALID, "-32")
        assert f(t, s, d, 0) == OK
        assert f(t, s, d, 32) == OK
    for t, n in ((Q8_0, 33), (Q4_0, 16), (Q8_0, 2**62 + 1)):
        poison_error()
        expect(f(t, s, d, n), INVALID, "block size")


def test_threadpool_bad_args():
    out = ffi.new("pi_threadpool **")
    for n in (10**6, 513, INT32_MAX):
        poison_error() if n != 10**6 else None
        expect(lib.pi_threadpool_create(n, out), INVALID, "n_threads", str(n))
        assert out[0] == ffi.NULL
    expect(lib.pi_threadpool_create(4, ffi.NULL), INVALID, "NULL")
    for n in (0, -1, -2**31):          # <= 0: physical cores
        assert lib.pi_threadpool_create(n, out) == OK
        assert lib.pi_threadpool_size(out[0]) >= 1
        lib.pi_threadpool_free(out[0])
    lib.pi_threadpool_free(ffi.NULL)
    assert lib.pi_threadpool_size(ffi.NULL) == 1


# ---- ops ------------------------------------------------------------------------------
class Tensor:
    """A pi_tensor over a numpy buffer that it keeps alive (contiguous strides)."""

    def __init__(self, ne, type=F32, rng=None):
        n_dims = len(ne)
        ne4 = list(ne) + [1] * (4 - n_dims)
        rb = lib.pi_row_bytes(type, ne4[0])
        assert rb > 0
        nbytes = rb * math.prod(ne4[1:])
        rng = rng or np.random.default_rng(0)
        if type == F32:
            self.buf = rng.standard_normal(nbytes // 4).astype(np.float32)
        elif type == F16:
            self.buf = rng.standard_normal(nbytes // 2).astype(np.float16)
        elif type in (Q8_0, Q4_0):
            x = rng.standard_normal(nbytes // lib.pi_type_block_bytes(type) * 32).astype(np.float32)
            self.buf = np.zeros(nbytes, np.uint8)
            assert lib.pi_quantize_row(type, ffi.from_buffer("float[]", x), ffi.from_buffer(self.buf), x.size) == OK
        else:
            self.buf = np.zeros(nbytes, np.uint8)
        t = ffi.new("pi_tensor *")
        t.type, t.n_dims = type, n_dims
        for i in range(4):
            t.ne[i] = ne4[i]
        t.nb[0] = lib.pi_type_block_bytes(type)
        t.nb[1] = rb
        for i in (2, 3):
            t.nb[i] = t.nb[i - 1] * ne4[i - 1]
        t.data = ffi.from_buffer(self.buf)
        self.t = t


def i32(values):
    a = np.ascontiguousarray(values, dtype=np.int32)
    return a, ffi.from_buffer("int32_t[]", a)


@pytest.fixture(scope="module")
def pool():
    out = ffi.new("pi_threadpool **")
    assert lib.pi_threadpool_create(2, out) == OK
    p = out[0]
    yield p
    lib.pi_threadpool_free(p)


def op_cases():
    """op name -> builder returning (function, args, {arg index: role}) for a valid call.

    role: 'tensor' (must not be NULL), 'opt' (may be NULL), 'ptr' (a non-tensor pointer, must not be NULL)."""
    def get_rows():
        table, out = Tensor([64, 10], Q8_0), Tensor([64, 3])
        ids = i32([0, 9, 4])
        return lib.pi_op_get_rows, [None, table.t, ids[1], 3, out.t], {1: "tensor", 2: "ptr", 4: "tensor"}, \
            (table, out, ids)

    def mul_mat():
        w, x, y = Tensor([64, 16], Q8_0), Tensor([64, 3]), Tensor([16, 3])
        return lib.pi_op_mul_mat, [None, w.t, x.t, y.t], {1: "tensor", 2: "tensor", 3: "tensor"}, (w, x, y)

    def rms_norm():
        x, w, out = Tensor([64, 3]), Tensor([64]), Tensor([64, 3])
        return lib.pi_op_rms_norm, [None, x.t, w.t, 1e-5, out.t], {1: "tensor", 2: "opt", 4: "tensor"}, (x, w, out)

    def layer_norm():
        x, w, b, out = Tensor([64, 3]), Tensor([64]), Tensor([64]), Tensor([64, 3])
        return lib.pi_op_layer_norm, [None, x.t, w.t, b.t, 1e-5, out.t], \
            {1: "tensor", 2: "opt", 3: "opt", 5: "tensor"}, (x, w, b, out)

    def rope():
        x, out = Tensor([16, 4, 3]), Tensor([16, 4, 3])
        pos = i32([0, 1, 7])
        return lib.pi_op_rope, [None, x.t, pos[1], 16, 0, 10000.0, 1.0, out.t], {1: "tensor", 2: "ptr", 7: "tensor"}, \
            (x, out, pos)

    def softmax():
        x, out = Tensor([10, 3]), Tensor([10, 3])
        return lib.pi_op_softmax, [None, x.t, out.t], {1: "tensor", 2: "tensor"}, (x, out)

    def unary():
        x, out = Tensor([10, 3]), Tensor([10, 3])
        return lib.pi_op_unary, [None, lib.PI_UNARY_GELU, x.t, out.t], {2: "tensor", 3: "tensor"}, (x, out)

    def binary():
        a, b, out = Tensor([8, 3]), Tensor([8, 1]), Tensor([8, 3])
        return lib.pi_op_binary, [None, lib.PI_BINARY_MUL, a.t, b.t, out.t], {2: "tensor", 3: "tensor", 4: "tensor"}, \
            (a, b, out)

    def attention():
        q, k, v = Tensor([16, 4, 3]), Tensor([16, 2, 5], F16), Tensor([16, 2, 5], F16)
        mask, out = Tensor([5, 3]), Tensor([16, 4, 3])
        return lib.pi_op_attention, [None, q.t, k.t, v.t, mask.t, 0.25, out.t], \
            {1: "tensor", 2: "tensor", 3: "tensor", 4: "opt", 6: "tensor"}, (q, k, v, mask, out)

    def attention_softcap():
        q, k, v = Tensor([16, 4, 3]), Tensor([16, 2, 5], F16), Tensor([16, 2, 5], F16)
        mask, out = Tensor([5, 3]), Tensor([16, 4, 3])
        return lib.pi_op_attention_softcap, [None, q.t, k.t, v.t, mask.t, 0.25, 50.0, out.t], \
            {1: "tensor", 2: "tensor", 3: "tensor", 4: "opt", 7: "tensor"}, (q, k, v, mask, out)

    def attention_sinks():
        q, k, v = Tensor([16, 4, 3]), Tensor([16, 2, 5], F16), Tensor([16, 2, 5], F16)
        mask, sinks, out = Tensor([5, 3]), Tensor([4]), Tensor([16, 4, 3])
        return lib.pi_op_attention_sinks, [None, q.t, k.t, v.t, mask.t, 0.25, 0.0, sinks.t, out.t], \
            {1: "tensor", 2: "tensor", 3: "tensor", 4: "opt", 7: "opt", 8: "tensor"}, (q, k, v, mask, sinks, out)

    def swiglu_oai():
        gate, up = Tensor([10, 3]), Tensor([10, 3])
        return lib.pi_op_swiglu_oai, [None, gate.t, up.t, 1.702, 7.0], {1: "tensor", 2: "tensor"}, (gate, up)

    def xielu():
        x, p = Tensor([10, 3]), ffi.new("float[4]", [1.3, 0.9, 0.5, -1e-6])
        return lib.pi_op_xielu, [None, x.t, p], {1: "tensor", 2: "ptr"}, (x, p)

    def softcap():
        x, out = Tensor([10, 3]), Tensor([10, 3])
        return lib.pi_op_softcap, [None, x.t, 30.0, out.t], {1: "tensor", 3: "tensor"}, (x, out)

    def predictor():
        fc1, fc2, x, scores = Tensor([64, 32], Q8_0), Tensor([32, 96]), Tensor([64, 3]), Tensor([96, 3])
        return lib.pi_op_predictor, [None, fc1.t, fc2.t, x.t, scores.t], \
            {1: "tensor", 2: "tensor", 3: "tensor", 4: "tensor"}, (fc1, fc2, x, scores)

    def sparse_ffn():
        gate, up, down_t = Tensor([64, 96], Q8_0), Tensor([64, 96], Q4_0), Tensor([64, 96], F16)
        w = ffi.new("pi_sparse_ffn_weights *")
        w.gate, w.up, w.down_t = gate.t[0], up.t[0], down_t.t[0]
        x, scores, out = Tensor([64, 3]), Tensor([96, 3]), Tensor([64, 3])
        n_active = ffi.new("int64_t *")
        return lib.pi_op_sparse_ffn, [None, w, lib.PI_ACT_RELU, lib.PI_FFN_PAR, x.t, scores.t, 0.0, out.t, n_active], \
            {1: "ptr", 4: "tensor", 5: "tensor", 7: "tensor", 8: "optptr"}, (w, x, scores, out, gate, up, down_t)

    def sparse_mask():
        s, src, dst = Tensor([96, 3]), Tensor([96, 3]), Tensor([96, 3])
        weights, n_kept, counts = ffi.new("float[96]", [1.0] * 96), ffi.new("int64_t *"), ffi.new("int64_t[96]")
        return lib.pi_op_sparse_mask, [None, s.t, lib.PI_ACT_SILU, weights, 0.1, src.t, dst.t, n_kept, counts], \
            {1: "tensor", 3: "optptr", 5: "tensor", 6: "tensor", 7: "optptr", 8: "optptr"}, \
            (s, src, dst, weights, n_kept, counts)

    cases = dict(get_rows=get_rows, mul_mat=mul_mat, rms_norm=rms_norm, layer_norm=layer_norm, rope=rope,
                 softmax=softmax, unary=unary,
                 binary=binary, attention=attention, attention_softcap=attention_softcap, softcap=softcap,
                 attention_sinks=attention_sinks, swiglu_oai=swiglu_oai, xielu=xielu)
    if hasattr(lib, "pi_op_predictor"):
        cases.update(predictor=predictor, sparse_ffn=sparse_ffn, sparse_mask=sparse_mask)
    return cases


OPS = op_cases()
OP_WORD = dict(attention_softcap="attention", attention_sinks="attention")   # the word an op's messages carry, where
                                                                              # it is not the case's name
OUT_INDEX = dict(get_rows=1, mul_mat=2, rms_norm=2, layer_norm=3, rope=1, softmax=1, unary=1, binary=2, attention=4,
                 attention_softcap=4, softcap=1, attention_sinks=5, swiglu_oai=1, xielu=0, predictor=3,
                 sparse_ffn=3, sparse_mask=2)     # which kept Tensor is the op's output


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("use_pool", [False, True])
def test_op_valid_call(op, use_pool, pool):
    fn, args, _, keep = OPS[op]()
    args[0] = pool if use_pool else ffi.NULL
    assert fn(*args) == OK, last_error()
    assert np.isfinite(keep[OUT_INDEX[op]].buf).all()


@pytest.mark.parametrize("op", list(OPS))
def test_op_null_pointers(op):
    fn, args, roles, keep = OPS[op]()
    args[0] = ffi.NULL
    for i, role in roles.items():
        a = list(args)
        a[i] = ffi.NULL
        poison_error()
        st = fn(*a)
        if role in ("opt", "optptr"):
            assert st == OK, last_error()
        else:
            expect(st, INVALID, OP_WORD.get(op, op), "NULL")


def _bad_variants(t):
    """(label, mutate(pi_tensor), expected codes) for a valid tensor t."""
    nd = t.n_dims

    def setter(**kw):
        def f(x):
            for k, v in kw.items():
                if k.startswith("ne") or k.startswith("nb"):
                    getattr(x, k[:2])[int(k[2:])] = v
                else:
                    setattr(x, k, v)
        return f
    yield "type99", setter(type=99), (UNSUPPORTED, INVALID)
    yield "type-1", setter(type=-1), (UNSUPPORTED, INVALID)
    yield "typemax", setter(type=INT32_MAX), (UNSUPPORTED, INVALID)
    yield "type4", setter(type=4), (UNSUPPORTED, INVALID)
    yield "n_dims0", setter(n_dims=0), (INVALID,)
    yield "n_dims5", setter(n_dims=5), (INVALID,)
    yield "n_dims-1", setter(n_dims=-1), (INVALID,)
    yield "ne0=0", setter(ne0=0), (INVALID,)
    yield "ne0=-1", setter(ne0=-1), (INVALID,)
    yield "ne0=-2^63", setter(ne0=-2**63), (INVALID,)
    yield "ne0=2^41", setter(ne0=2**41), (INVALID,)
    yield "ne0=2^63-1", setter(ne0=2**63 - 1), (INVALID,)
    if nd >= 2:
        yield "ne1=0", setter(ne1=0), (INVALID,)
        yield "ne1=-5", setter(ne1=-5), (INVALID,)
    yield "ne_past_n_dims", setter(**{f"ne{nd}": 2}) if nd < 4 else setter(ne3=0), (INVALID,)
    yield "ne3=0", setter(ne3=0), (INVALID,)
    yield "elements_overflow", setter(n_dims=4, ne1=2**40, ne2=2**40, ne3=2**40), (INVALID,)
    yield "elements_2^50", setter(n_dims=4, ne1=2**20, ne2=2**20, ne3=2**10), (INVALID,)
    yield "rows_not_contiguous", setter(nb0=2 * t.nb[0]), (INVALID,)
    yield "rows_stride0", setter(nb0=0), (INVALID,)
    yield "data_null", setter(data=ffi.NULL), (INVALID,)
    if t.type in (Q8_0, Q4_0):
        yield "quant_row_not_multiple_of_32", setter(ne0=t.ne[0] - 1), (INVALID,)
        yield "quant_row_16", setter(ne0=16), (INVALID,)
    else:
        yield "as_q8_0_row_33", setter(type=Q8_0, nb0=34, ne0=33), (INVALID, UNSUPPORTED)


def _tensor_arg_cases():
    for op, build in OPS.items():
        _, args, roles, _ = build()
        for i, role in roles.items():
            if role in ("tensor", "opt"):
                for label, _, _ in _bad_variants(args[i]):
                    yield pytest.param(op, i, label, id=f"{op}-arg{i}-{label}")


@pytest.mark.parametrize("op,i,label", list(_tensor_arg_cases()))
def test_op_bad_tensor(op, i, label):
    fn, args, roles, keep = OPS[op]()
    args[0] = ffi.NULL
    t = args[i]
    [(mutate, codes)] = [(m, c) for lab, m, c in _bad_variants(t) if lab == label]
    mutate(t)
    poison_error()
    expect(fn(*args), codes, OP_WORD.get(op, op))


def _mul_mats_args():
    ws = [Tensor([64, 16], Q8_0, rng=np.random.default_rng(i)) for i in range(3)]
    x, ys = Tensor([64, 3]), [Tensor([16, 3]) for _ in range(3)]
    return ws, x, ys


_MUL_MATS_ARGS = (("w1", Tensor([64, 16], Q8_0)), ("x", Tensor([64, 3])), ("y2", Tensor([16, 3])))


@pytest.mark.parametrize("which,label", [(which, lab) for which, t in _MUL_MATS_ARGS
                                          for lab, _, _ in _bad_variants(t.t)])
def test_mul_mats_bad_tensor(which, label):
    """pi_op_mul_mats: any broken weight, input or output fails cleanly, as pi_op_mul_mat's would."""
    ws, x, ys = _mul_mats_args()
    t = {"w1": ws[1].t, "x": x.t, "y2": ys[2].t}[which]
    [(mutate, codes)] = [(m, c) for lab, m, c in _bad_variants(t) if lab == label]
    mutate(t)
    poison_error()
    expect(lib.pi_op_mul_mats(ffi.NULL, 3, [w.t for w in ws], x.t, [y.t for y in ys]), codes, "mul_mat")


def test_mul_mats_null_and_counts():
    ws, x, ys = _mul_mats_args()
    w, y = [v.t for v in ws], [v.t for v in ys]
    for n in (0, -1, 4, 2**31 - 1):
        poison_error()
        expect(lib.pi_op_mul_mats(ffi.NULL, n, w, x.t, y), INVALID, "not 1..3")
    for args in [(ffi.NULL, x.t, y), (w, x.t, ffi.NULL), (w, ffi.NULL, y), ([w[0], ffi.NULL, w[2]], x.t, y),
                 (w, x.t, [y[0], y[1], ffi.NULL])]:
        poison_error()
        expect(lib.pi_op_mul_mats(ffi.NULL, 3, *args), INVALID, "NULL")
    assert lib.pi_op_mul_mats(ffi.NULL, 3, w, x.t, y) == OK


@pytest.mark.parametrize("label", [lab for lab, _, _ in _bad_variants(Tensor([64, 16], Q4_0).t)])
def test_repack_bad_tensor(label):
    """pi_repack_bytes says 0 (no layout) and pi_repack fails cleanly for every broken tensor."""
    w = Tensor([64, 16], Q4_0)
    dst = np.zeros(w.buf.nbytes, np.uint8)
    [(mutate, codes)] = [(m, c) for lab, m, c in _bad_variants(w.t) if lab == label]
    mutate(w.t)
    assert lib.pi_repack_bytes(w.t) == 0
    poison_error()
    expect(lib.pi_repack(w.t, ffi.from_buffer(dst), dst.nbytes, ffi.new("pi_tensor *")), codes + (UNSUPPORTED,))


def test_repack_null_and_small_arguments():
    w = Tensor([64, 16], Q4_0)
    dst = np.zeros(w.buf.nbytes, np.uint8)
    out = ffi.new("pi_tensor *")
    assert lib.pi_repack_bytes(ffi.NULL) == 0
    for args in [(ffi.NULL, ffi.from_buffer(dst), dst.nbytes, out), (w.t, ffi.NULL, dst.nbytes, out),
                 (w.t, ffi.from_buffer(dst), dst.nbytes, ffi.NULL)]:
        poison_error()
        expect(lib.pi_repack(*args), INVALID, "NULL")
    if lib.pi_repack_bytes(w.t):      # a build with the interleaved layout
        for n in (0, -1, dst.nbytes - 1, -2**63):
            poison_error()
            expect(lib.pi_repack(w.t, ffi.from_buffer(dst), n, out), INVALID, "dst")
    poison_error()
    expect(lib.pi_repack(Tensor([64, 16]).t, ffi.from_buffer(dst), dst.nbytes, out), UNSUPPORTED, "f32")


def _sparse_q4_0(E=256, F=16):
    """Valid q4_0 sparse FFN weights that pi_sparse_pack accepts, and their keep-alive tensors."""
    ts = [Tensor([E, F], Q4_0, rng=np.random.default_rng(i)) for i in range(3)]
    w = ffi.new("pi_sparse_ffn_weights *")
    w.gate, w.up, w.down_t = ts[0].t[0], ts[1].t[0], ts[2].t[0]
    return w, ts


@pytest.mark.parametrize("part", ["gate", "up", "down_t"])
@pytest.mark.parametrize("label", [lab for lab, _, _ in _bad_variants(Tensor([256, 16], Q4_0).t)])
def test_sparse_pack_bad_tensor(part, label):
    """pi_sparse_pack_bytes says 0 and pi_sparse_pack fails cleanly when any of the three is broken."""
    w, keep = _sparse_q4_0()
    n = lib.pi_sparse_pack_bytes(w, 0)
    assert n == 3 * 256 // 32 * 18 * 16
    dst = np.zeros(n, np.uint8)
    t = getattr(w, part)
    [(mutate, codes)] = [(m, c) for lab, m, c in _bad_variants(t) if lab == label]
    mutate(t)
    assert lib.pi_sparse_pack_bytes(w, 0) == 0
    poison_error()
    expect(lib.pi_sparse_pack(w, 0, ffi.from_buffer(dst), n, ffi.new("pi_sparse_ffn_weights *")), (UNSUPPORTED,))


def test_sparse_pack_null_and_small_arguments():
    w, keep = _sparse_q4_0()
    n = lib.pi_sparse_pack_bytes(w, 0)
    dst = np.zeros(n, np.uint8)
    out = ffi.new("pi_sparse_ffn_weights *")
    assert lib.pi_sparse_pack_bytes(ffi.NULL, 0) == 0
    for mode in (-1, 3, INT32_MAX, -2**31):
        assert lib.pi_sparse_pack_bytes(w, mode) == 0
        poison_error()
        expect(lib.pi_sparse_pack(w, mode, ffi.from_buffer(dst), n, out), UNSUPPORTED, "q4_0")
    for args in [(ffi.NULL, 0, ffi.from_buffer(dst), n, out), (w, 0, ffi.NULL, n, out),
                 (w, 0, ffi.from_buffer(dst), n, ffi.NULL)]:
        poison_error()
        expect(lib.pi_sparse_pack(*args), INVALID, "NULL")
    for size in (0, -1, n - 1, -2**63):
        poison_error()
        expect(lib.pi_sparse_pack(w, 0, ffi.from_buffer(dst), size, out), INVALID, "dst")
    w.gate = ffi.new("pi_tensor *")[0]                       # no gate: fine for seq only
    assert lib.pi_sparse_pack_bytes(w, 0) == 0 and lib.pi_sparse_pack_bytes(w, 2) == 2 * n // 3
    assert lib.pi_model_n_packed_ffn(ffi.NULL) == 0


def retype(t, type_id):
    """Change a tensor's type (and its dim-0 stride to match, so that the type is what is wrong)."""
    t.type = type_id
    t.nb[0] = lib.pi_type_block_bytes(type_id) or 4


OP_MISMATCHES = {
    "get_rows": [
        ("out_ne0", lambda a, k: k[1].t.ne.__setitem__(0, 32), ["out must be"]),
        ("n_vs_out", lambda a, k: a.__setitem__(3, 2), ["out must be"]),
        ("n_zero", lambda a, k: a.__setitem__(3, 0), ["get_rows"]),
        ("n_negative", lambda a, k: a.__setitem__(3, -3), ["get_rows"]),
        ("id_negative", lambda a, k: k[2][0].__setitem__(1, -1), ["id -1", "out of range"]),
        ("id_too_big", lambda a, k: k[2][0].__setitem__(1, 10), ["id 10", "out of range"]),
        ("id_max", lambda a, k: k[2][0].__setitem__(2, INT32_MAX), ["out of range"]),
        ("table_3d", lambda a, k: (setattr(k[0].t, "n_dims", 3), k[0].t.ne.__setitem__(1, 5),
                                   k[0].t.ne.__setitem__(2, 2)), ["2-d"]),
        ("out_3d", lambda a, k: (setattr(k[1].t, "n_dims", 3), k[1].t.ne.__setitem__(1, 1),
                                 k[1].t.ne.__setitem__(2, 3), a.__setitem__(3, 1)), ["get_rows"]),
        ("out_f16", lambda a, k: retype(k[1].t, F16), ["must be f32"]),
        ("table_i32", lambda a, k: (retype(k[0].t, I32), setattr(k[0].t, "ne", [16, 10, 1, 1]),
                                    setattr(k[0].t, "nb", [4, 64, 640, 640])), ["get_rows"]),
    ],
    "mul_mat": [
        ("x_K", lambda a, k: k[1].t.ne.__setitem__(0, 32), ["do not fit"]),
        ("y_N", lambda a, k: k[2].t.ne.__setitem__(0, 8), ["do not fit"]),
        ("y_T", lambda a, k: k[2].t.ne.__setitem__(1, 2), ["do not fit"]),
        ("w_3d", lambda a, k: (setattr(k[0].t, "n_dims", 3), k[0].t.ne.__setitem__(1, 8),
                               k[0].t.ne.__setitem__(2, 2)), ["2-d"]),
        ("x_3d", lambda a, k: (setattr(k[1].t, "n_dims", 3), k[1].t.ne.__setitem__(1, 1),
                               k[1].t.ne.__setitem__(2, 3)), ["2-d"]),
        ("y_4d", lambda a, k: (setattr(k[2].t, "n_dims", 4), k[2].t.ne.__setitem__(1, 1),
                               k[2].t.ne.__setitem__(3, 3)), ["mul_mat"]),
        ("y_f16", lambda a, k: retype(k[2].t, F16), ["must be f32"]),
        ("x_q8", lambda a, k: retype(k[1].t, Q8_0), ["must be f32"]),
        ("w_i32", lambda a, k: retype(k[0].t, I32), ["mul_mat"]),
    ],
    "rms_norm": [
        ("out_shape", lambda a, k: k[2].t.ne.__setitem__(1, 2), ["shape mismatch"]),
        ("weight_len", lambda a, k: k[1].t.ne.__setitem__(0, 32), ["weight must be"]),
        ("weight_2d", lambda a, k: (setattr(k[1].t, "n_dims", 2), k[1].t.ne.__setitem__(1, 2)), ["weight must be"]),
        ("weight_f16", lambda a, k: retype(k[1].t, F16), ["must be f32"]),
        ("eps_negative", lambda a, k: a.__setitem__(3, -1.0), ["eps"]),
        ("eps_nan", lambda a, k: a.__setitem__(3, float("nan")), ["eps"]),
    ],
    "rope": [
        ("out_shape", lambda a, k: k[1].t.ne.__setitem__(1, 2), ["shape mismatch"]),
        ("n_rot_0", lambda a, k: a.__setitem__(3, 0), ["n_rot"]),
        ("n_rot_neg", lambda a, k: a.__setitem__(3, -2), ["n_rot"]),
        ("n_rot_odd", lambda a, k: a.__setitem__(3, 3), ["n_rot"]),
        ("n_rot_big", lambda a, k: a.__setitem__(3, 18), ["n_rot"]),
        ("n_rot_max", lambda a, k: a.__setitem__(3, INT32_MAX - 1), ["n_rot"]),
        ("mode_1", lambda a, k: a.__setitem__(4, 1), ["mode"]),
        ("base_0", lambda a, k: a.__setitem__(5, 0.0), ["freq_base"]),
        ("base_nan", lambda a, k: a.__setitem__(5, float("nan")), ["freq_base"]),
        ("scale_neg", lambda a, k: a.__setitem__(6, -1.0), ["freq_scale"]),
        ("scale_nan", lambda a, k: a.__setitem__(6, float("nan")), ["freq_scale"]),
        ("x_4d", lambda a, k: (setattr(k[0].t, "n_dims", 4), k[0].t.ne.__setitem__(2, 1),
                               k[0].t.ne.__setitem__(3, 3), setattr(k[1].t, "n_dims", 4),
                               k[1].t.ne.__setitem__(2, 1), k[1].t.ne.__setitem__(3, 3)), ["rope"]),
    ],
    "softmax": [
        ("out_shape", lambda a, k: k[1].t.ne.__setitem__(0, 5), ["shape mismatch"]),
        ("out_f16", lambda a, k: retype(k[1].t, F16), ["must be f32"]),
    ],
    "unary": [
        ("op_-1", lambda a, k: a.__setitem__(1, -1), ["unknown op -1"]),
        ("op_3", lambda a, k: a.__setitem__(1, 3), ["unknown op 3"]),
        ("op_max", lambda a, k: a.__setitem__(1, INT32_MAX), ["unknown op"]),
        ("out_shape", lambda a, k: k[1].t.ne.__setitem__(1, 2), ["shape mismatch"]),
    ],
    "binary": [
        ("op_2", lambda a, k: a.__setitem__(1, 2), ["unknown op 2"]),
        ("op_-1", lambda a, k: a.__setitem__(1, -1), ["unknown op"]),
        ("b_not_broadcastable", lambda a, k: k[1].t.ne.__setitem__(1, 2), ["neither 1 nor"]),
        ("b_ne0", lambda a, k: k[1].t.ne.__setitem__(0, 4), ["neither 1 nor"]),
        ("out_shape", lambda a, k: k[2].t.ne.__setitem__(1, 2), ["shape mismatch"]),
    ],
    "attention": [
        ("out_shape", lambda a, k: k[4].t.ne.__setitem__(2, 2), ["q/out"]),
        ("kv_shape", lambda a, k: k[2].t.ne.__setitem__(2, 4), ["k/v"]),
        ("head_dim", lambda a, k: (k[1].t.ne.__setitem__(0, 8), k[2].t.ne.__setitem__(0, 8)), ["head_dim"]),
        ("heads_not_multiple", lambda a, k: (k[1].t.ne.__setitem__(1, 3), k[2].t.ne.__setitem__(1, 3)),
         ["not a multiple"]),
        ("k_q8", lambda a, k: (retype(k[1].t, Q8_0),
                               k[1].t.ne.__setitem__(0, 32), k[2].t.ne.__setitem__(0, 32)), ["attention"]),
        ("k_i32", lambda a, k: (retype(k[1].t, I32), retype(k[2].t, I32)),
         ["no cache of k i32"]),
        ("mask_shape", lambda a, k: k[3].t.ne.__setitem__(0, 4), ["mask must be"]),
        ("mask_T", lambda a, k: k[3].t.ne.__setitem__(1, 2), ["mask must be"]),
        ("mask_f16", lambda a, k: retype(k[3].t, F16), ["must be f32"]),
        ("scale_inf", lambda a, k: a.__setitem__(5, float("inf")), ["scale"]),
        ("scale_nan", lambda a, k: a.__setitem__(5, float("nan")), ["scale"]),
        ("q_4d", lambda a, k: (setattr(k[0].t, "n_dims", 4), k[0].t.ne.__setitem__(2, 1),
                               k[0].t.ne.__setitem__(3, 3), setattr(k[4].t, "n_dims", 4),
                               k[4].t.ne.__setitem__(2, 1), k[4].t.ne.__setitem__(3, 3)), ["attention"]),
    ],
    "attention_softcap": [
        ("softcap_neg", lambda a, k: a.__setitem__(6, -1.0), ["softcap"]),
        ("softcap_inf", lambda a, k: a.__setitem__(6, float("inf")), ["softcap"]),
        ("softcap_nan", lambda a, k: a.__setitem__(6, float("nan")), ["softcap"]),
        ("out_shape", lambda a, k: k[4].t.ne.__setitem__(2, 2), ["q/out"]),
    ],
    "softcap": [
        ("cap_0", lambda a, k: a.__setitem__(2, 0.0), ["softcap", "cap"]),
        ("cap_neg", lambda a, k: a.__setitem__(2, -30.0), ["softcap", "cap"]),
        ("cap_inf", lambda a, k: a.__setitem__(2, float("inf")), ["softcap", "cap"]),
        ("cap_nan", lambda a, k: a.__setitem__(2, float("nan")), ["softcap", "cap"]),
        ("out_shape", lambda a, k: k[1].t.ne.__setitem__(1, 2), ["shape mismatch"]),
        ("out_f16", lambda a, k: retype(k[1].t, F16), ["must be f32"]),
    ],
    "predictor": [
        ("fc1_K", lambda a, k: k[0].t.ne.__setitem__(0, 32), ["predictor fc1", "shape"]),
        ("fc2_rank", lambda a, k: k[1].t.ne.__setitem__(0, 16), ["predictor fc2", "shape"]),
        ("scores_rows", lambda a, k: k[3].t.ne.__setitem__(0, 95), ["predictor scores", "shape"]),
        ("scores_T", lambda a, k: k[3].t.ne.__setitem__(1, 2), ["predictor scores", "shape"]),
        ("x_3d", lambda a, k: (setattr(k[2].t, "n_dims", 3), k[2].t.ne.__setitem__(1, 1),
                               k[2].t.ne.__setitem__(2, 3)), ["predictor x"]),
        ("fc1_3d", lambda a, k: (setattr(k[0].t, "n_dims", 3), k[0].t.ne.__setitem__(1, 16),
                                 k[0].t.ne.__setitem__(2, 2)), ["predictor fc1"]),
        ("x_f16", lambda a, k: retype(k[2].t, F16), ["predictor x"]),
        ("fc1_i32", lambda a, k: (retype(k[0].t, I32), k[0].t.ne.__setitem__(0, 64)), ["predictor fc1"]),
    ],
    "sparse_ffn": [
        ("gate_mode_3", lambda a, k: a.__setitem__(3, 3), ["gate mode 3"]),
        ("gate_mode_-1", lambda a, k: a.__setitem__(3, -1), ["gate mode"]),
        ("act_3", lambda a, k: a.__setitem__(2, 3), ["activation 3"]),
        ("act_-1", lambda a, k: a.__setitem__(2, -1), ["activation"]),
        ("threshold_nan", lambda a, k: a.__setitem__(6, float("nan")), ["threshold"]),
        ("out_aliases_x", lambda a, k: setattr(k[3].t, "data", k[1].t.data), ["alias"]),
        ("scores_shape", lambda a, k: k[2].t.ne.__setitem__(0, 64), ["sparse_ffn scores"]),
        ("out_shape", lambda a, k: k[3].t.ne.__setitem__(1, 2), ["sparse_ffn out"]),
        ("x_E", lambda a, k: (k[1].t.ne.__setitem__(0, 32), k[3].t.ne.__setitem__(0, 32)), ["sparse_ffn"]),
        ("up_F", lambda a, k: k[0].up.ne.__setitem__(1, 95), ["sparse_ffn"]),
        ("gate_F", lambda a, k: k[0].gate.ne.__setitem__(1, 95), ["sparse_ffn gate"]),
        ("down_t_E", lambda a, k: k[0].down_t.ne.__setitem__(0, 32), ["sparse_ffn down_t"]),
        ("down_t_transposed", lambda a, k: (k[0].down_t.ne.__setitem__(0, 96), k[0].down_t.ne.__setitem__(1, 64),
                                            k[0].down_t.nb.__setitem__(1, 192)), ["sparse_ffn down_t"]),
        # gate.data NULL in PAR mode is the gate given (the scores are its values): tests/test_act_sparsity.py
        ("up_missing", lambda a, k: setattr(k[0].up, "data", ffi.NULL), ["sparse_ffn up", "NULL"]),
        ("up_type_99", lambda a, k: setattr(k[0].up, "type", 99), ["sparse_ffn up"]),
        ("down_t_i32", lambda a, k: retype(k[0].down_t, I32), ["sparse_ffn down_t"]),
        ("x_f16", lambda a, k: retype(k[1].t, F16), ["sparse_ffn x"]),
    ],
}


@pytest.mark.parametrize("op,label", [(op, lab) for op, cases in OP_MISMATCHES.items() for lab, _, _ in cases
                                      if op in OPS])
def test_op_mismatched_shapes_and_args(op, label):
    fn, args, roles, keep = OPS[op]()
    args[0] = ffi.NULL
    [(mutate, words)] = [(m, w) for lab, m, w in OP_MISMATCHES[op] if lab == label]
    mutate(args, keep)
    poison_error()
    expect(fn(*args), (INVALID, UNSUPPORTED), *words)


needs_sparse = pytest.mark.skipif(not hasattr(lib, "pi_op_sparse_ffn"), reason="no sparse FFN in this build")


@needs_sparse
@pytest.mark.parametrize("member", ["gate", "up", "down_t"])
def test_sparse_ffn_bad_weight_member(member):
    _, args0, _, keep0 = OPS["sparse_ffn"]()
    for label, _, _ in list(_bad_variants(getattr(keep0[0], member))):
        if member == "gate" and label == "data_null":
            continue      # the gate given: valid (test_sparse_ffn_without_gate_in_seq_mode)
        fn, args, _, keep = OPS["sparse_ffn"]()
        args[0] = ffi.NULL
        [(mutate, codes)] = [(m, c) for lab, m, c in _bad_variants(getattr(keep[0], member)) if lab == label]
        mutate(getattr(keep[0], member))
        poison_error()
        expect(fn(*args), codes, "sparse_ffn")   # (a bad up.ne[1] is reported against gate: F comes from up)


@needs_sparse
def test_sparse_ffn_without_gate_in_seq_mode():
    fn, args, _, keep = OPS["sparse_ffn"]()
    args[0] = ffi.NULL
    keep[0].gate.data = ffi.NULL
    args[3] = lib.PI_FFN_SEQ
    assert fn(*args) == OK, last_error()
    args[3] = lib.PI_FFN_PAR        # no gate rows in a gated mode: the scores are the gate's values (activation
    assert fn(*args) == OK, last_error()   # sparsity, tests/test_act_sparsity.py checks the result)
    keep[0].up.data = ffi.NULL      # neither gate nor up: only as an input-sparse matmul (mode seq)
    poison_error()
    expect(fn(*args), INVALID, "sparse_ffn up", "NULL")


def test_op_huge_sizes_do_not_read_out_of_bounds():
    """Shapes that are individually legal but whose product overflows int64 must be refused, not run."""
    x, out = Tensor([4, 4]), Tensor([4, 4])
    for t in (x, out):
        t.t.n_dims = 4
        t.t.ne[1] = t.t.ne[2] = t.t.ne[3] = 2**40
    for fn, args in ((lib.pi_op_softmax, (ffi.NULL, x.t, out.t)),
                     (lib.pi_op_unary, (ffi.NULL, lib.PI_UNARY_RELU, x.t, out.t)),
                     (lib.pi_op_rms_norm, (ffi.NULL, x.t, ffi.NULL, 1e-5, out.t)),
                     (lib.pi_op_binary, (ffi.NULL, lib.PI_BINARY_ADD, x.t, x.t, out.t))):
        poison_error()
        expect(fn(*args), INVALID, "too many elements")


# ---- models ---------------------------------------------------------------------------
class Desc:
    """A pi_model_desc built from a loaded Model's file (like model.py), open to mutation."""

    def __init__(self, model):
        tensors = list(model.file.tensors.values())
        self.names = [ffi.new("char[]", t.name.encode()) for t in tensors]
        self.tensors = ffi.new("pi_tensor_desc[]", len(tensors))
        self.index = {}
        for i, t in enumerate(tensors):
            d = self.tensors[i]
            d.name, d.type, d.n_dims = self.names[i], t.type, len(t.ne)
            for j, v in enumerate(t.ne):
                d.ne[j] = v
            d.data = ffi.from_buffer(t.data)
            d.nbytes = t.data.nbytes
            self.index[t.name] = d
        self.desc = ffi.new("pi_model_desc *")
        assert lib.pi_model_hparams(model._ptr, ffi.addressof(self.desc.hparams)) == OK
        self.desc.n_tensors = len(tensors)
        self.desc.tensors = self.tensors

    @property
    def hp(self):
        return self.desc.hparams

    def create(self):
        out = ffi.new("pi_model **")
        out[0] = ffi.cast("pi_model *", 1)    # must be reset to NULL on failure
        st = lib.pi_model_create(self.desc, out)
        return st, out[0]


def test_model_create_valid_desc(model):
    st, m = Desc(model).create()
    assert st == OK, last_error()
    lib.pi_model_free(m)
    lib.pi_model_free(ffi.NULL)


def test_model_create_null_args(model):
    d = Desc(model)
    expect(lib.pi_model_create(d.desc, ffi.NULL), INVALID, "out is NULL")
    out = ffi.new("pi_model **")
    expect(lib.pi_model_create(ffi.NULL, out), INVALID, "desc is NULL")
    assert out[0] == ffi.NULL
    hp = ffi.new("pi_hparams *")
    expect(lib.pi_model_hparams(ffi.NULL, hp), INVALID, "NULL")
    expect(lib.pi_model_hparams(model._ptr, ffi.NULL), INVALID, "NULL")


HP_CASES = [
    ("n_vocab", 0, ["n_vocab"]), ("n_vocab", -1, ["n_vocab"]), ("n_vocab", 2**24, ["n_vocab"]),
    ("n_vocab", 300, ["token_embd.weight", "shape"]),
    ("n_embd", 0, ["n_embd"]), ("n_embd", 2**31 - 1, ["n_embd"]), ("n_embd", 96, ["token_embd.weight", "shape"]),
    ("n_ff", -5, ["n_ff"]), ("n_ff", 128, ["ffn_gate.weight", "shape"]),
    ("n_head", 0, ["n_head"]), ("n_head", 3, ["multiple"]), ("n_head", -4, ["n_head"]),
    ("n_head_kv", 0, ["n_head_kv"]), ("n_head_kv", 3, ["multiple"]), ("n_head_kv", 4, ["attn_k.weight", "shape"]),
    ("n_layer", 0, ["n_layer"]), ("n_layer", 10**6, ["n_layer"]), ("n_layer", 4097, ["n_layer"]),
    ("n_layer", 3, ["missing tensor 'blk.2."]),
    ("n_ctx_train", 0, ["n_ctx_train"]), ("n_ctx_train", -1, ["n_ctx_train"]),
    ("n_rot", 0, ["rope dimension"]), ("n_rot", 3, ["rope dimension"]), ("n_rot", 18, ["rope dimension"]),
    ("n_rot", -2, ["rope dimension"]),
    ("arch", 7, ["architecture"]), ("arch", 4, ["dense falcon/opt"]), ("arch", -1, ["architecture"]),
    ("arch", INT32_MAX, ["architecture"]),
    ("ffn_act", 3, ["activation"]), ("ffn_act", -1, ["activation"]),
    ("ffn_gate", 3, ["gate"]), ("ffn_gate", -1, ["gate"]),
    ("norm_eps", float("nan"), ["epsilon"]), ("norm_eps", -1e-5, ["epsilon"]), ("norm_eps", 1.0, ["epsilon"]),
    ("rope_freq_base", 0.0, ["rope freq"]), ("rope_freq_base", float("nan"), ["rope freq"]),
    ("rope_freq_scale", -1.0, ["rope freq"]), ("rope_freq_scale", float("nan"), ["rope freq"]),
    # architecture details (issue 7): bad values, or flags whose tensors the file lacks
    ("head_dim", -1, ["head_dim"]), ("head_dim", 2**24, ["head_dim"]), ("head_dim", 8, ["rope dimension"]),
    ("rope_mode", 1, ["rope mode"]), ("attn_scale", float("nan"), ["attention scale"]),
    ("embd_scale", -1.0, ["embedding scale"]), ("n_swa", -1, ["sliding window"]), ("swa_pattern", -6, ["pattern"]),
    ("rope_freq_base_swa", float("nan"), ["local layers"]), ("qkv_bias", 2, ["qkv_bias"]),
    ("qkv_bias", 1, ["missing tensor 'blk.0.attn_q.bias'"]), ("qk_norm", 1, ["missing tensor 'blk.0.attn_q_norm"]),
    ("post_norms", 1, ["missing tensor 'blk.0.post_attention_norm"]),
    ("attn_softcap", -1.0, ["softcap"]), ("attn_softcap", float("nan"), ["softcap"]),
    ("final_softcap", float("inf"), ["softcap"]), ("final_softcap", -30.0, ["softcap"]),
    ("n_ff_exp", 64, ["n_ff_exp", "without experts"]), ("n_ff_exp", -1, ["n_ff_exp"]),
    ("moe_router_norm", 1, ["moe_router_norm", "without experts"]), ("moe_dense_ffn", 2, ["moe_dense_ffn"]),
]
if "sparse" in dir(ffi.new("pi_hparams *")):
    HP_CASES.append(("sparse", 1, ["missing tensor 'blk.0.ffn_down_t.weight'"]))   # a dense file as sparse
HP_CASES += [   # per-layer embeddings (gemma4 E2B / E4B) on a file without them, or out of range
    ("n_embd_per_layer", 32, ["missing tensor 'per_layer_token_embd.weight'"]),
    ("n_embd_per_layer", -1, ["n_embd_per_layer"]), ("n_embd_per_layer", 1 << 30, ["n_embd_per_layer"]),
]
HP_CASES += [   # deepseek2's MLA and V3 routing on a file without them, or out of range
    ("q_lora_rank", 8, ["q_lora_rank without MLA"]), ("mla_kv_rank", -1, ["mla_kv_rank"]),
    ("mla_kv_rank", 32, ["mla_head_k = 0"]), ("expert_sigmoid", 1, ["expert_sigmoid", "without experts"]),
    ("n_expert_groups", 2, ["n_expert_groups", "without experts"]), ("expert_sigmoid", 2, ["expert_sigmoid"]),
]


@pytest.mark.parametrize("field,value,words", HP_CASES, ids=[f"{f}={v}" for f, v, _ in HP_CASES])
def test_model_create_bad_hparams(model, field, value, words):
    d = Desc(model)
    setattr(d.hp, field, value)
    poison_error()
    st, m = d.create()
    assert m == ffi.NULL
    expect(st, (BAD_MODEL, UNSUPPORTED, INVALID), *words)


GEOM_CASES = [   # (layer, field, value, words): a bad per-layer geometry table (pi_model_desc.layers)
    (0, "head_dim", 0, ["head_dim"]), (1, "n_head_kv", 3, ["n_head_kv"]), (0, "n_ff", -1, ["n_ff"]),
    (1, "n_rot", 7, ["rope dimension"]), (0, "n_rot", 2 * 1024, ["rope dimension"]),
    (0, "is_local", 1, ["sliding window"]), (0, "is_local", 2, ["is_local"]),
    (0, "kv_source", 1, ["kv_source"]), (1, "kv_source", -1, ["kv_source"]),
    (0, "n_ff", 40, ["ffn_gate.weight", "shape"]), (1, "head_dim", 32, ["attn_q.weight", "shape"]),
    (1, "moe", 1, ["moe", "needs experts"]), (0, "moe", -1, ["moe"]),
]


@pytest.mark.parametrize("il,field,value,words", GEOM_CASES, ids=[f"{il}.{f}={v}" for il, f, v, _ in GEOM_CASES])
def test_model_create_bad_layer_geometry(model, il, field, value, words):
    """pi_model_desc.layers: each layer's shape checked (PI errors, no model); the table as it is loads."""
    d = Desc(model)
    n = d.hp.n_layer
    geom = ffi.new("pi_layer_geom[]", n)
    for i in range(n):
        assert lib.pi_model_layer_geom(model._ptr, i, ffi.addressof(geom[i])) == OK
    d.desc.layers = geom
    st, m = d.create()
    assert st == OK, last_error()
    lib.pi_model_free(m)
    setattr(geom[il], field, value)
    poison_error()
    st, m = d.create()
    assert m == ffi.NULL
    expect(st, (BAD_MODEL, UNSUPPORTED), *words)


def test_model_layer_geom_bad_args(model):
    g = ffi.new("pi_layer_geom *")
    expect(lib.pi_model_layer_geom(ffi.NULL, 0, g), INVALID, "NULL")
    expect(lib.pi_model_layer_geom(model._ptr, 0, ffi.NULL), INVALID, "NULL")
    for il in (-1, model.hparams.n_layer, INT32_MAX):
        expect(lib.pi_model_layer_geom(model._ptr, il, g), INVALID, "out of range")


def _td(d, name):
    return d.index[name]


TD_CASES = [
    ("n_tensors_negative", lambda d: setattr(d.desc, "n_tensors", -1), INVALID, ["tensor table"]),
    ("tensors_null", lambda d: setattr(d.desc, "tensors", ffi.NULL), INVALID, ["tensor table"]),
    ("no_tensors", lambda d: (setattr(d.desc, "n_tensors", 0), setattr(d.desc, "tensors", ffi.NULL)), BAD_MODEL,
     ["missing tensor 'token_embd.weight'"]),
    ("name_null", lambda d: setattr(_td(d, "blk.0.attn_v.weight"), "name", ffi.NULL), BAD_MODEL,
     ["missing tensor 'blk.0.attn_v.weight'"]),
    ("type_99", lambda d: setattr(_td(d, "blk.0.attn_q.weight"), "type", 99), UNSUPPORTED,
     ["blk.0.attn_q.weight", "99"]),
    ("type_-1", lambda d: setattr(_td(d, "blk.0.attn_q.weight"), "type", -1), UNSUPPORTED,
     ["blk.0.attn_q.weight", "-1"]),
    ("type_tq1_0", lambda d: setattr(_td(d, "blk.0.attn_q.weight"), "type", 34), UNSUPPORTED,
     ["blk.0.attn_q.weight", "tq1_0", "id 34"]),
    ("type_i32", lambda d: setattr(_td(d, "blk.1.ffn_up.weight"), "type", I32), UNSUPPORTED,
     ["blk.1.ffn_up.weight", "i32"]),
    ("norm_not_f32", lambda d: setattr(_td(d, "output_norm.weight"), "type", F16), BAD_MODEL,
     ["output_norm.weight", "must be f32"]),
    ("n_dims_0", lambda d: setattr(_td(d, "blk.0.attn_k.weight"), "n_dims", 0), BAD_MODEL,
     ["blk.0.attn_k.weight", "shape"]),
    ("n_dims_5", lambda d: setattr(_td(d, "blk.0.attn_k.weight"), "n_dims", 5), BAD_MODEL,
     ["blk.0.attn_k.weight", "shape"]),
    ("n_dims_-1", lambda d: setattr(_td(d, "blk.0.attn_k.weight"), "n_dims", -1), BAD_MODEL,
     ["blk.0.attn_k.weight", "shape"]),
    ("ne_negative", lambda d: _td(d, "blk.0.ffn_down.weight").ne.__setitem__(1, -64), BAD_MODEL,
     ["blk.0.ffn_down.weight", "shape"]),
    ("ne_huge", lambda d: _td(d, "token_embd.weight").ne.__setitem__(1, 2**62), BAD_MODEL,
     ["token_embd.weight", "shape"]),
    ("ne_extra_dim", lambda d: (setattr(_td(d, "blk.0.ffn_norm.weight"), "n_dims", 2),
                                _td(d, "blk.0.ffn_norm.weight").ne.__setitem__(1, 2)), BAD_MODEL,
     ["blk.0.ffn_norm.weight", "shape"]),
    ("data_null", lambda d: setattr(_td(d, "blk.1.attn_output.weight"), "data", ffi.NULL), BAD_MODEL,
     ["blk.1.attn_output.weight", "bytes"]),
    ("nbytes_short", lambda d: setattr(_td(d, "blk.1.attn_output.weight"), "nbytes", 100), BAD_MODEL,
     ["blk.1.attn_output.weight", "needs"]),
    ("nbytes_zero", lambda d: setattr(_td(d, "output.weight"), "nbytes", 0), BAD_MODEL, ["output.weight", "needs"]),
]


@pytest.mark.parametrize("label,mutate,code,words", TD_CASES, ids=[c[0] for c in TD_CASES])
def test_model_create_bad_tensor_table(model, label, mutate, code, words):
    d = Desc(model)
    mutate(d)
    poison_error()
    st, m = d.create()
    assert m == ffi.NULL
    expect(st, code, *words)


def test_model_create_quantized_row_not_multiple_of_32(model):
    """n_embd = 48 with q8_0 weights: the row length is not a whole number of blocks."""
    d = Desc(model)
    d.hp.n_embd, d.hp.n_head, d.hp.n_head_kv, d.hp.n_rot = 48, 4, 2, 12
    d.index["token_embd.weight"].ne[0] = 48
    poison_error()
    st, m = d.create()
    assert m == ffi.NULL
    expect(st, BAD_MODEL, "token_embd.weight", "48", "not a multiple")


# ---- contexts -------------------------------------------------------------------------
def ctx_params(**kw):
    p = ffi.new("pi_context_params *", lib.pi_context_default_params())
    p.n_threads = 2
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def make_ctx(model, **kw):
    out = ffi.new("pi_context **")
    assert lib.pi_context_create(model._ptr, ctx_params(**kw), out) == OK, last_error()
    return ffi.gc(out[0], lib.pi_context_free)


def test_context_default_params():
    p = lib.pi_context_default_params()
    assert p.n_ctx > 0 and p.n_batch > 0 and 1 <= p.n_seq_max <= 64 and p.type_k == F16 and p.type_v == F16


CTX_CASES = [
    ("n_ctx", 0, INVALID, ["n_ctx"]), ("n_ctx", -1, INVALID, ["n_ctx"]), ("n_ctx", 2**30, INVALID, ["n_ctx"]),
    ("n_ctx", INT32_MAX, INVALID, ["n_ctx"]), ("n_ctx", -2**31, INVALID, ["n_ctx"]),
    ("n_batch", 0, INVALID, ["n_batch"]), ("n_batch", -1, INVALID, ["n_batch"]),
    ("n_seq_max", 0, INVALID, ["n_seq_max"]), ("n_seq_max", 65, INVALID, ["n_seq_max"]),
    ("n_seq_max", -1, INVALID, ["n_seq_max"]), ("n_seq_max", INT32_MAX, INVALID, ["n_seq_max"]),
    ("type_k", 99, INVALID, ["K cache type unknown"]), ("type_v", -1, INVALID, ["V cache type unknown"]),
    ("type_k", Q8_0, INVALID, ["K cache type q8_0", "head size 16"]), ("type_v", 12, INVALID, ["V cache type q4_K"]),
    ("type_k", 26, INVALID, ["K cache type i32"]), ("type_v", 14, INVALID, ["V cache type q6_K"]),
    ("n_threads", 10**6, INVALID, ["n_threads"]), ("n_threads", INT32_MAX, INVALID, ["n_threads"]),
]
if "sparse_mode" in dir(lib.pi_context_default_params()):
    CTX_CASES += [("sparse_mode", 2, INVALID, ["sparse_mode"]), ("sparse_mode", -1, INVALID, ["sparse_mode"]),
                  ("sparse_mode", INT32_MAX, INVALID, ["sparse_mode"]),
                  ("sparse_threshold", float("nan"), INVALID, ["sparse_threshold"]),
                  ("sparse_batch_max", -1, INVALID, ["sparse_batch_max"]),
                  ("sparse_batch_max", -2**31, INVALID, ["sparse_batch_max"]),
                  ("sparse_gather_max", -1, INVALID, ["sparse_gather_max"]),
                  ("sparse_gather_max", -2**31, INVALID, ["sparse_gather_max"])]


@pytest.mark.parametrize("field,value,code,words", CTX_CASES, ids=[f"{f}={v}" for f, v, _, _ in CTX_CASES])
def test_context_create_bad_params(model, field, value, code, words):
    out = ffi.new("pi_context **")
    out[0] = ffi.cast("pi_context *", 1)
    poison_error() if field != "n_threads" else None
    expect(lib.pi_context_create(model._ptr, ctx_params(**{field: value}), out), code, *words)
    assert out[0] == ffi.NULL


def test_context_create_null_args(model):
    out = ffi.new("pi_context **")
    expect(lib.pi_context_create(model._ptr, ctx_params(), ffi.NULL), INVALID, "NULL")
    expect(lib.pi_context_create(ffi.NULL, ctx_params(), out), INVALID, "NULL")
    expect(lib.pi_context_create(model._ptr, ffi.NULL, out), INVALID, "NULL")
    lib.pi_context_free(ffi.NULL)


def test_context_n_batch_larger_than_n_ctx_is_clamped(model):
    ctx = make_ctx(model, n_ctx=8, n_batch=1000)
    tok, pos, seq = i32(range(1, 9)), i32(range(8)), i32([0] * 8)
    b = ffi.new("pi_batch *", dict(n_tokens=8, token=tok[1], pos=pos[1], seq_id=seq[1]))
    assert lib.pi_decode(ctx, b) == OK, last_error()
    b.n_tokens = 9
    expect(lib.pi_decode(ctx, b), INVALID, "n_batch (8)")


class FakeBigModel:
    """A pi_model with huge hparams whose tensors all claim enough bytes over a tiny buffer.

    Fine for context creation (which never reads weights); never decode with it."""

    def __init__(self, n_embd, n_layer, n_vocab=320):
        self.buf = np.zeros(64, np.uint8)
        hp_shapes = [("token_embd.weight", (n_embd, n_vocab)), ("output_norm.weight", (n_embd,))]
        for il in range(n_layer):
            for s, ne in (("attn_norm", (n_embd,)), ("attn_q", (n_embd, n_embd)), ("attn_k", (n_embd, n_embd)),
                          ("attn_v", (n_embd, n_embd)), ("attn_output", (n_embd, n_embd)), ("ffn_norm", (n_embd,)),
                          ("ffn_gate", (n_embd, n_embd)), ("ffn_up", (n_embd, n_embd)),
                          ("ffn_down", (n_embd, n_embd))):
                hp_shapes.append((f"blk.{il}.{s}.weight", ne))
        self.names = [ffi.new("char[]", n.encode()) for n, _ in hp_shapes]
        self.tensors = ffi.new("pi_tensor_desc[]", len(hp_shapes))
        for i, (_, ne) in enumerate(hp_shapes):
            d = self.tensors[i]
            d.name, d.type, d.n_dims = self.names[i], F32, len(ne)
            for j, v in enumerate(ne):
                d.ne[j] = v
            d.data = ffi.from_buffer(self.buf)
            d.nbytes = 2**62
        desc = ffi.new("pi_model_desc *")
        hp = desc.hparams
        hp.arch, hp.n_vocab, hp.n_ctx_train, hp.n_embd, hp.n_ff = lib.PI_ARCH_LLAMA, n_vocab, 4096, n_embd, n_embd
        hp.n_head = hp.n_head_kv = n_embd // 128
        hp.n_layer, hp.n_rot = n_layer, 128
        hp.norm_eps, hp.rope_freq_base, hp.rope_freq_scale = 1e-5, 10000.0, 1.0
        desc.n_tensors, desc.tensors = len(hp_shapes), self.tensors
        out = ffi.new("pi_model **")
        assert lib.pi_model_create(desc, out) == OK, last_error()
        self.ptr = ffi.gc(out[0], lib.pi_model_free)


def test_context_kv_cache_too_large_is_an_error():
    """2^24 cells x 512 layers x 8192 floats (2^48 bytes): refused before any allocation is attempted."""
    big = FakeBigModel(n_embd=8192, n_layer=512)
    out = ffi.new("pi_context **")
    poison_error()
    st = lib.pi_context_create(big.ptr, ctx_params(n_ctx=2**24, n_batch=1, n_threads=1, type_k=F32, type_v=F32), out)
    expect(st, NOMEM, "too large")
    assert out[0] == ffi.NULL


def test_context_allocation_failure_is_an_error():
    """A 32 TiB KV cache: malloc fails (or, with overcommit, succeeds lazily): never a crash.
    Runs in a child process (under ASan, allocator_may_return_null=1 makes ASan's malloc return NULL)."""
    out = run_isolated(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_robustness import FakeBigModel, ctx_params, ffi, lib, last_error
        big = FakeBigModel(n_embd=8192, n_layer=64)
        out = ffi.new("pi_context **")
        st = lib.pi_context_create(big.ptr, ctx_params(n_ctx=2**24, n_batch=1, n_threads=1, type_k=0, type_v=0), out)
        print("STATUS", st, last_error() if st else "")
        if st == 0:
            lib.pi_context_free(out[0])
        else:
            assert out[0] == ffi.NULL
    """, timeout=180, extra_asan="allocator_may_return_null=1")
    m = re.search(r"STATUS (-?\d+) (.*)", out)
    assert m, out
    st = int(m.group(1))
    assert st in (OK, NOMEM), out
    if st == NOMEM:
        assert "out of memory" in m.group(2), out


def test_set_n_threads_and_abort_callback_bad_args(model):
    expect(lib.pi_set_n_threads(ffi.NULL, 2), INVALID, "NULL")
    ctx = make_ctx(model, n_ctx=16)
    for n in (10**6, INT32_MAX, 513):
        poison_error() if n != 10**6 else None
        expect(lib.pi_set_n_threads(ctx, n), INVALID, "n_threads")
    assert lib.pi_set_n_threads(ctx, -1) == OK
    assert lib.pi_set_n_threads(ctx, 1) == OK
    lib.pi_set_abort_callback(ffi.NULL, ffi.NULL, ffi.NULL)
    lib.pi_set_abort_callback(ctx, ffi.NULL, ffi.NULL)
    _decode(ctx, [1, 2, 3], [0, 1, 2])
    assert lib.pi_get_logits(ctx, 2) != ffi.NULL


# ---- decode ---------------------------------------------------------------------------
def _batch(tokens, pos, seq=None, logits=None):
    n = len(tokens)
    keep = [i32(tokens), i32(pos), i32(seq if seq is not None else [0] * n)]
    b = ffi.new("pi_batch *")
    b.n_tokens = n
    b.token, b.pos, b.seq_id = keep[0][1], keep[1][1], keep[2][1]
    if logits is not None:
        arr = np.ascontiguousarray(logits, dtype=np.int8)
        keep.append(arr)
        b.logits = ffi.from_buffer("int8_t[]", arr)
    return b, keep


def _decode(ctx, tokens, pos, seq=None, logits=None) -> int:
    b, keep = _batch(tokens, pos, seq, logits)
    return lib.pi_decode(ctx, b)


def _logits(ctx, i, n_vocab=TINY["n_vocab"]) -> np.ndarray:
    p = lib.pi_get_logits(ctx, i)
    assert p != ffi.NULL, last_error()
    return np.frombuffer(ffi.buffer(p, 4 * n_vocab), dtype=np.float32).copy()


BATCH_CASES = [
    ("token_-1", dict(tokens=[1, -1, 2]), ["token -1", "out of range"]),
    ("token_n_vocab", dict(tokens=[1, 320, 2]), ["token 320", "out of range"]),
    ("token_max", dict(tokens=[INT32_MAX, 1, 2]), ["out of range"]),
    ("token_min", dict(tokens=[-2**31, 1, 2]), ["out of range"]),
    ("pos_-1", dict(pos=[0, -1, 2]), ["negative position"]),
    ("pos_min", dict(pos=[-2**31, 1, 2]), ["negative position"]),
    ("seq_-1", dict(seq=[0, -1, 0]), ["sequence id -1"]),
    ("seq_n_seq_max", dict(seq=[0, 2, 0]), ["sequence id 2"]),
    ("seq_64", dict(seq=[64, 0, 0]), ["sequence id 64"]),
    ("seq_max", dict(seq=[0, 0, INT32_MAX]), ["sequence id"]),
    ("n_tokens_0", dict(n_tokens=0), ["batch of 0"]),
    ("n_tokens_-1", dict(n_tokens=-1), ["batch of -1"]),
    ("n_tokens_min", dict(n_tokens=-2**31), ["batch of"]),
    ("n_tokens_over_n_batch", dict(tokens=list(range(1, 10)), pos=list(range(9)), seq=[0] * 9), ["n_batch (8)"]),
    ("token_null", dict(null="token"), ["incomplete batch"]),
    ("pos_null", dict(null="pos"), ["incomplete batch"]),
    ("seq_null", dict(null="seq_id"), ["incomplete batch"]),
]


@pytest.mark.parametrize("label,case,words", BATCH_CASES, ids=[c[0] for c in BATCH_CASES])
def test_decode_bad_batch(model, label, case, words):
    ctx = make_ctx(model, n_ctx=32, n_batch=8, n_seq_max=2)
    assert _decode(ctx, [5, 6], [0, 1]) == OK
    ref = _logits(ctx, 1)
    used = lib.pi_kv_used_cells(ctx)
    b, keep = _batch(case.get("tokens", [1, 2, 3]), case.get("pos", [2, 3, 4]), case.get("seq", [0, 0, 0]))
    if "n_tokens" in case:
        b.n_tokens = case["n_tokens"]
    if "null" in case:
        setattr(b, case["null"], ffi.NULL)
    poison_error()
    expect(lib.pi_decode(ctx, b), INVALID, *words)
    # nothing changed: same cells, no logits from the failed call, decoding goes on
    assert lib.pi_kv_used_cells(ctx) == used
    assert lib.pi_get_logits(ctx, 0) == ffi.NULL
    lib.pi_kv_clear(ctx)
    assert _decode(ctx, [5, 6], [0, 1]) == OK
    np.testing.assert_array_equal(_logits(ctx, 1), ref)


def test_decode_null_ctx_and_batch(model):
    b, keep = _batch([1], [0])
    expect(lib.pi_decode(ffi.NULL, b), INVALID, "context is NULL")
    ctx = make_ctx(model, n_ctx=8)
    expect(lib.pi_decode(ctx, ffi.NULL), INVALID, "batch")


def test_decode_huge_position_is_fine(model):
    ctx = make_ctx(model, n_ctx=8)
    assert _decode(ctx, [1, 2], [INT32_MAX - 1, INT32_MAX]) == OK, last_error()
    assert np.isfinite(_logits(ctx, 1)).all()
    assert lib.pi_kv_seq_pos_max(ctx, 0) == INT32_MAX


def test_get_logits_bad_index(model):
    ctx = make_ctx(model, n_ctx=16)
    poison_error()
    assert lib.pi_get_logits(ctx, 0) == ffi.NULL            # nothing decoded yet
    expect(INVALID, INVALID, "no logits")
    assert _decode(ctx, [1, 2, 3, 4], [0, 1, 2, 3], logits=[1, 0, 1, 0]) == OK
    _logits(ctx, 0), _logits(ctx, 2)
    for i in (1, 3, 4, -1, 100, INT32_MAX, -2**31):
        poison_error()
        assert lib.pi_get_logits(ctx, i) == ffi.NULL
        expect(INVALID, INVALID, "no logits", f"row {i}")
    poison_error()
    assert lib.pi_get_logits(ffi.NULL, 0) == ffi.NULL
    expect(INVALID, INVALID, "NULL")
    assert _decode(ctx, [5], [4], logits=[0]) == OK          # a decode that asks for no logits
    assert lib.pi_get_logits(ctx, 0) == ffi.NULL


def test_outputs_bad_args(model):
    ctx = make_ctx(model, n_ctx=16)
    for bad in (0, 4, -1, INT32_MAX, -2**31):
        poison_error()
        assert lib.pi_set_outputs(ctx, bad) == INVALID
        expect(INVALID, INVALID, "pi_set_outputs", str(bad))
    poison_error()
    assert lib.pi_set_outputs(ffi.NULL, lib.PI_OUTPUT_EMBD) == INVALID
    expect(INVALID, INVALID, "NULL")
    assert _decode(ctx, [1, 2], [0, 1]) == OK
    poison_error()
    assert lib.pi_get_embeddings(ctx, 1) == ffi.NULL            # logits only (the default)
    expect(INVALID, INVALID, "does not output embeddings")
    assert lib.pi_set_outputs(ctx, lib.PI_OUTPUT_EMBD) == OK
    assert lib.pi_get_logits(ctx, 1) == ffi.NULL                # embeddings only now
    expect(INVALID, INVALID, "embeddings only")
    assert _decode(ctx, [3, 4], [2, 3], logits=[1, 0]) == OK
    assert lib.pi_get_embeddings(ctx, 0) != ffi.NULL
    for i in (1, 2, -1, INT32_MAX, -2**31):
        poison_error()
        assert lib.pi_get_embeddings(ctx, i) == ffi.NULL
        expect(INVALID, INVALID, "no embeddings", f"row {i}")
    poison_error()
    assert lib.pi_get_embeddings(ffi.NULL, 0) == ffi.NULL
    expect(INVALID, INVALID, "NULL")


def test_kv_seq_ops_bad_ids(model):
    ctx = make_ctx(model, n_ctx=16, n_seq_max=2)
    assert _decode(ctx, [1, 2, 3], [0, 1, 2]) == OK
    for seq in (2, 64, INT32_MAX):
        poison_error()
        expect(lib.pi_kv_seq_rm(ctx, seq, 0, -1), INVALID, "sequence id")
    for src, dst in ((-1, 0), (0, -1), (2, 0), (0, 2), (0, 64), (INT32_MAX, 0), (-2**31, 1)):
        poison_error()
        expect(lib.pi_kv_seq_cp(ctx, src, dst, 0, -1), INVALID, "sequence id")
    assert lib.pi_kv_used_cells(ctx) == 3
    for seq in (-1, 2, 64):
        poison_error()
        assert lib.pi_kv_seq_pos_max(ctx, seq) == -1
        expect(INVALID, INVALID, "sequence id")
    # odd ranges are no-ops, not errors
    assert lib.pi_kv_seq_rm(ctx, 0, 5, 2) == OK
    assert lib.pi_kv_seq_rm(ctx, 0, -100, -100) == OK     # p1 < 0: to the end, p0 < 0: from 0
    assert lib.pi_kv_used_cells(ctx) == 0
    assert _decode(ctx, [1, 2, 3], [0, 1, 2]) == OK
    assert lib.pi_kv_seq_cp(ctx, 0, 0, 0, -1) == OK
    assert lib.pi_kv_seq_cp(ctx, 0, 1, INT32_MAX, -1) == OK
    # NULL context
    expect(lib.pi_kv_seq_rm(ffi.NULL, 0, 0, -1), INVALID, "NULL")
    expect(lib.pi_kv_seq_cp(ffi.NULL, 0, 1, 0, -1), INVALID, "NULL")
    assert lib.pi_kv_seq_pos_max(ffi.NULL, 0) == -1
    assert lib.pi_kv_used_cells(ffi.NULL) == 0
    lib.pi_kv_clear(ffi.NULL)
    lib.pi_kv_clear(ctx)
    assert lib.pi_kv_used_cells(ctx) == 0


def test_kv_seq_state_bad_args(model):
    """pi_kv_seq_state_*: bad sequence ids, NULL and short buffers, malformed states (magic, sizes, counts, positions),
    cells out of range, repeated or held by another sequence, a full cache: an error each, the cache unchanged."""
    import struct
    ctx = make_ctx(model, n_ctx=16, n_seq_max=2)
    assert _decode(ctx, [1, 2, 3], [0, 1, 2]) == OK
    for seq in (-1, 2, 64, INT32_MAX):
        poison_error()
        assert lib.pi_kv_seq_state_size(ctx, seq, 0, -1) == 0
        expect(INVALID, INVALID, "sequence id")
        expect(lib.pi_kv_seq_state_get(ctx, seq, 0, -1, ffi.NULL, 0, ffi.NULL), INVALID, "sequence id")
        expect(lib.pi_kv_seq_state_set(ctx, seq, b"x" * 64, 64, ffi.NULL, 0), INVALID, "sequence id")
    poison_error()
    assert lib.pi_kv_seq_state_size(ffi.NULL, 0, 0, -1) == 0
    expect(INVALID, INVALID, "NULL")
    n = lib.pi_kv_seq_state_size(ctx, 0, 0, -1)
    buf = ffi.new("char[]", n)
    written = ffi.new("size_t *")
    expect(lib.pi_kv_seq_state_get(ctx, 0, 0, -1, buf, n - 1, written), INVALID, "bytes")
    expect(lib.pi_kv_seq_state_get(ctx, 0, 0, -1, ffi.NULL, n, written), INVALID, "NULL")
    assert lib.pi_kv_seq_state_get(ctx, 0, 0, -1, buf, n, written) == OK and written[0] == n
    state = bytes(ffi.buffer(buf, n))
    H = 56   # the header's bytes (kv_cache.c; n at 48), then the positions
    assert lib.pi_kv_seq_state_size(ctx, 0, 5, 2) == H    # an empty range: the header alone
    used = lib.pi_kv_used_cells(ctx)

    def bad(data, *msg, cells=ffi.NULL, n_cells=0, code=INVALID):
        poison_error()
        expect(lib.pi_kv_seq_state_set(ctx, 1, data, len(data), cells, n_cells), code, *msg)
        assert lib.pi_kv_used_cells(ctx) == used

    bad(b"", "not a sequence state")
    bad(state[:39], "not a sequence state")
    bad(state[:H - 1], "bad magic")
    bad(b"Y" + state[1:], "bad magic")
    bad(state[:-1], "bytes")
    bad(state + b"\0", "bytes")
    bad(state[:8] + struct.pack("<i", 99) + state[12:], "another KV layout")
    bad(state[:12] + struct.pack("<i", F32) + state[16:], "another KV layout")      # K's type
    bad(state[:16] + struct.pack("<i", Q8_0) + state[20:], "another KV layout")     # V's type
    for count in (-1, 17, INT32_MAX):
        bad(state[:48] + struct.pack("<i", count) + state[52:], "tokens")
    bad(state[:H] + struct.pack("<iii", 0, 0, 1) + state[H + 12:], "ascending")       # a repeated position
    bad(state[:H] + struct.pack("<iii", -1, 0, 1) + state[H + 12:], "ascending")
    for cells in ([0, 1, 16], [3, 3, 4], [-1, 4, 5], [0, 4, 5]):                  # cell 0 holds sequence 0
        bad(state, "cell", cells=ffi.new("int32_t[]", cells), n_cells=3)
    bad(state, "cells given", cells=ffi.new("int32_t[]", [3, 4]), n_cells=2)
    expect(lib.pi_kv_seq_state_set(ffi.NULL, 0, state, len(state), ffi.NULL, 0), INVALID, "NULL")
    full = make_ctx(model, n_ctx=4, n_seq_max=2)
    assert _decode(full, [1, 2], [0, 1]) == OK
    poison_error()
    expect(lib.pi_kv_seq_state_set(full, 1, state, len(state), ffi.NULL, 0), KV_FULL, "KV cache full")
    assert lib.pi_kv_used_cells(full) == 2
    assert lib.pi_kv_seq_state_set(ctx, 1, state, len(state), ffi.NULL, 0) == OK   # the good state still goes in
    assert lib.pi_kv_used_cells(ctx) == 6

    # pi_kv_seq_state_positions reads the positions without a context, and refuses what is not a state
    count, pos = ffi.new("int32_t *"), ffi.new("int32_t[3]")
    assert lib.pi_kv_seq_state_positions(state, len(state), pos, 3, count) == OK and count[0] == 3
    assert list(pos) == [0, 1, 2]
    assert lib.pi_kv_seq_state_positions(state, len(state), ffi.NULL, 0, count) == OK and count[0] == 3
    for data in (b"", state[:39], b"Y" + state[1:], state[:48] + struct.pack("<i", -1) + state[52:],
                 state[:48] + struct.pack("<i", INT32_MAX) + state[52:], state[:H + 11]):
        poison_error()
        expect(lib.pi_kv_seq_state_positions(data, len(data), pos, 3, count), INVALID, "not a sequence state")
    expect(lib.pi_kv_seq_state_positions(ffi.NULL, 64, pos, 3, count), INVALID, "not a sequence state")
    expect(lib.pi_kv_seq_state_positions(state, len(state), ffi.NULL, 3, count), INVALID, "destination")
    expect(lib.pi_kv_seq_state_positions(state, len(state), pos, -1, count), INVALID, "destination")


def test_kv_cache_full_across_calls_and_still_usable(model):
    n_ctx = 8
    full = make_ctx(model, n_ctx=n_ctx, n_batch=8)
    assert _decode(full, [1, 2, 3, 4, 5], range(5)) == OK
    poison_error()
    expect(_decode(full, [6, 7, 8, 9], range(5, 9)), KV_FULL, "KV cache full", "4 tokens", "3 free", "8 cells")
    assert lib.pi_kv_used_cells(full) == 5
    assert lib.pi_get_logits(full, 0) == ffi.NULL
    # what fits still goes in, and gives the same logits as a context that never failed
    assert _decode(full, [6, 7, 8], range(5, 8)) == OK, last_error()
    fresh = make_ctx(model, n_ctx=n_ctx, n_batch=8)
    assert _decode(fresh, [1, 2, 3, 4, 5], range(5)) == OK
    assert _decode(fresh, [6, 7, 8], range(5, 8)) == OK
    np.testing.assert_array_equal(_logits(full, 2), _logits(fresh, 2))
    # one token at a time into a full cache
    for _ in range(3):
        poison_error()
        expect(_decode(full, [9], [8]), KV_FULL, "KV cache full")
    assert lib.pi_kv_used_cells(full) == n_ctx
    # freeing cells makes room again
    assert lib.pi_kv_seq_rm(full, 0, 6, -1) == OK
    assert lib.pi_kv_used_cells(full) == 6
    assert _decode(full, [7, 8], [6, 7]) == OK
    np.testing.assert_array_equal(_logits(full, 1), _logits(fresh, 2))


def test_abort_callback_leaves_cache_unchanged(model):
    ctx = make_ctx(model, n_ctx=16)
    assert _decode(ctx, [1, 2], [0, 1]) == OK
    cb = ffi.callback("int32_t(void *)", lambda _: 1)
    lib.pi_set_abort_callback(ctx, cb, ffi.NULL)
    poison_error()
    expect(_decode(ctx, [3, 4], [2, 3]), ABORTED, "abort")
    assert lib.pi_kv_used_cells(ctx) == 2
    lib.pi_set_abort_callback(ctx, ffi.NULL, ffi.NULL)
    assert _decode(ctx, [3, 4], [2, 3]) == OK


@needs_sparse
def test_sparse_stats_bad_args(model):
    ctx = make_ctx(model, n_ctx=8)
    active = ffi.new("int64_t[]", TINY["n_layer"])
    total = ffi.new("int64_t *")
    expect(lib.pi_sparse_stats(ffi.NULL, active, total), INVALID, "NULL")
    poison_error()
    expect(lib.pi_sparse_stats(ctx, ffi.NULL, total), INVALID, "NULL")
    poison_error()
    expect(lib.pi_sparse_stats(ctx, active, ffi.NULL), INVALID, "NULL")
    assert _decode(ctx, [1, 2], [0, 1]) == OK
    assert lib.pi_sparse_stats(ctx, active, total) == OK          # a dense model: nothing counted
    assert total[0] == 0 and list(active) == [0] * TINY["n_layer"]
    lib.pi_sparse_stats_reset(ffi.NULL)
    lib.pi_sparse_stats_reset(ctx)
    counts = ffi.new("int64_t[]", 4096)
    for c, out in ((ffi.NULL, counts), (ctx, ffi.NULL)):
        poison_error()
        expect(lib.pi_neuron_counts(c, 0, out), INVALID, "NULL")
    poison_error()
    expect(lib.pi_neuron_counts(ctx, 0, counts), INVALID, "not a sparse")   # (test_sparse.py: sparse cases)


def test_thresholds_histogram_and_input_stats_bad_args(model):
    """Per-layer thresholds, the calibration histogram and the gate-input statistics (the sparse cases:
    tests/test_act_sparsity.py)."""
    ctx = make_ctx(model, n_ctx=8)
    n = TINY["n_layer"]
    good, nan = ffi.new("float[]", [0.5] * n), ffi.new("float[]", [0.5] * (n - 1) + [float("nan")])
    for fn in (lib.pi_set_sparse_thresholds, lib.pi_set_gate_input_thresholds):
        poison_error()
        expect(fn(ffi.NULL, good), INVALID, "NULL")
        poison_error()
        expect(fn(ctx, nan), INVALID, "NaN", f"layer {n - 1}")
        assert fn(ctx, good) == OK and fn(ctx, ffi.NULL) == OK
    poison_error()
    expect(lib.pi_set_attn_input_thresholds(ffi.NULL, good, good), INVALID, "NULL")
    for q, o, which in ((nan, good, "input"), (good, nan, "output"), (ffi.NULL, nan, "output")):
        poison_error()
        expect(lib.pi_set_attn_input_thresholds(ctx, q, o), INVALID, "NaN", which, f"layer {n - 1}")
    assert lib.pi_set_attn_input_thresholds(ctx, good, ffi.NULL) == OK
    assert lib.pi_set_attn_input_thresholds(ctx, ffi.NULL, ffi.NULL) == OK
    active, total = ffi.new("int64_t[]", n), ffi.new("int64_t *")
    for c, a, t in ((ffi.NULL, active, total), (ctx, ffi.NULL, total), (ctx, active, ffi.NULL)):
        for fn in (lib.pi_gate_input_stats, lib.pi_attn_input_stats):
            poison_error()
            expect(fn(c, a, t), INVALID, "NULL")
    hist = ffi.new("int64_t[]", n * lib.PI_ACT_HIST_KINDS * lib.PI_ACT_HIST_BINS)
    for c, h in ((ffi.NULL, hist), (ctx, ffi.NULL)):
        poison_error()
        expect(lib.pi_act_histogram(c, h), INVALID, "NULL")
    poison_error()
    expect(lib.pi_act_histogram(ctx, hist), INVALID, "without act_histogram")
    means = ffi.new("float[]", n * 4096)
    for c, mm in ((ffi.NULL, means), (ctx, ffi.NULL)):
        poison_error()
        expect(lib.pi_act_channel_means(c, mm), INVALID, "NULL")
    poison_error()
    expect(lib.pi_act_channel_means(ctx, means), INVALID, "without act_histogram")
    assert lib.pi_act_histogram_edge(-5) == 0.0 and lib.pi_act_histogram_edge(0) == 0.0
    assert lib.pi_act_histogram_edge(1) == 2.0**-24 and lib.pi_act_histogram_edge(2**31 - 1) > 0


def test_device_and_offload_bad_args(model):
    """The GPU placement API (the device itself: tests/test_hybrid.py on the emulated device)."""
    ctx = make_ctx(model, n_ctx=8)
    n_dev = lib.pi_device_count()
    assert n_dev >= 0 and ffi.string(lib.pi_gpu_backend_name())
    info = ffi.new("pi_device_info *")
    expect(lib.pi_device_get_info(0, ffi.NULL), INVALID, "NULL")
    for dev in (-1, n_dev, 2**31 - 1):
        poison_error()
        expect(lib.pi_device_get_info(dev, info), INVALID, "does not exist")
    assert lib.pi_device_allocated_bytes() >= 0 and lib.pi_device_peak_bytes() >= lib.pi_device_allocated_bytes()
    lib.pi_device_reset_peak()
    assert lib.pi_offload_compute_bytes(ffi.NULL, 0, 8, 8) == -1
    assert lib.pi_offload_compute_bytes(model._ptr, 0, 0, 8) == -1
    assert lib.pi_offload_compute_bytes(model._ptr, -1, 8, 8) == -1
    assert lib.pi_offload_plan_compute_bytes(ffi.NULL, 8, 8) == -1
    assert lib.pi_offload_plan_compute_bytes(model._ptr, 8, 0) == -1
    planned = lib.pi_offload_plan_compute_bytes(model._ptr, 8, 8)
    assert planned > 0 and (n_dev == 0 or planned == lib.pi_offload_compute_bytes(model._ptr, 0, 8, 8))
    st = ffi.new("pi_offload_stats *")
    expect(lib.pi_context_offload_stats(ffi.NULL, st), INVALID, "NULL")
    expect(lib.pi_context_offload_stats(ctx, ffi.NULL), INVALID, "NULL")
    assert lib.pi_context_offload_stats(ctx, st) == OK and st.device == -1
    assert lib.pi_context_hot_neurons(ffi.NULL, 0, ffi.NULL) == -1
    assert lib.pi_context_hot_neurons(ctx, TINY["n_layer"], ffi.NULL) == -1
    assert lib.pi_context_hot_neurons(ctx, 0, ffi.NULL) == 0
    n_layer = TINY["n_layer"]
    arr = ffi.new("pi_layer_placement[]", n_layer)
    p = ffi.new("pi_offload_params *")
    p.n_layer, p.layers = n_layer, arr
    expect(lib.pi_context_offload(ffi.NULL, p), INVALID, "NULL")
    expect(lib.pi_context_offload(ctx, ffi.NULL), INVALID, "NULL")
    hot = ffi.new("int32_t[]", [3, 2])
    cases = [(dict(n_layer=n_layer + 1), "layer placements"), (dict(layers=ffi.NULL), "layers is NULL"),
             (dict(output=7), "output placement"), (dict(attn0=5), "PI_PLACE"), (dict(n_hot0=2), "sparse"),
             (dict(n_hot0=-1), "sparse")]
    for kw, words in cases:
        p.n_layer, p.layers, p.output = kw.get("n_layer", n_layer), kw.get("layers", arr), kw.get("output", 0)
        arr[0].attn, arr[0].n_hot, arr[0].hot = kw.get("attn0", 0), kw.get("n_hot0", 0), hot
        poison_error()
        expect(lib.pi_context_offload(ctx, p), INVALID, words)
    p.n_layer, p.layers, p.output = n_layer, arr, 0
    arr[0].attn, arr[0].n_hot = 0, 0
    assert lib.pi_context_offload(ctx, p) == OK                 # everything on the CPU: nothing to do
    p.device = 99
    arr[0].attn = lib.PI_PLACE_DEVICE
    poison_error()
    expect(lib.pi_context_offload(ctx, p), UNSUPPORTED, "does not exist")
    assert _decode(ctx, [1, 2], [0, 1]) == OK
    p.device = 0
    poison_error()
    expect(lib.pi_context_offload(ctx, p), INVALID, "before the first decode")


def test_lora_adapter_bad_args(model):
    """pi_adapter_create / pi_context_set_adapters: NULLs, counts, names, shapes, NaN (tests/test_lora.py: files)."""
    ctx = make_ctx(model, n_ctx=8)
    out = ffi.new("pi_adapter **")
    E, r = TINY["n_embd"], 4
    a = np.zeros((r, E), np.float32)       # ne [E, r]: attn_q's lora_a
    b = np.zeros((E, r), np.float32)       # ne [r, E]
    keep = []

    def descs(*items):
        d = ffi.new("pi_tensor_desc[]", max(len(items), 1))
        for i, (name, arr) in enumerate(items):
            keep.append(ffi.new("char[]", name.encode()))
            d[i].name, d[i].type, d[i].n_dims = keep[-1], 0, arr.ndim
            for j, n in enumerate(reversed(arr.shape)):
                d[i].ne[j] = n
            d[i].data, d[i].nbytes = ffi.from_buffer(arr), arr.nbytes
        return d
    good = descs(("blk.0.attn_q.weight.lora_a", a), ("blk.0.attn_q.weight.lora_b", b))
    expect(lib.pi_adapter_create(ffi.NULL, 1.0, 2, good, out), INVALID, "bad arguments")
    expect(lib.pi_adapter_create(model._ptr, 1.0, 2, good, ffi.NULL), INVALID, "bad arguments")
    expect(lib.pi_adapter_create(model._ptr, 1.0, -1, good, out), INVALID, "bad arguments")
    expect(lib.pi_adapter_create(model._ptr, 1.0, 2, ffi.NULL, out), INVALID, "bad arguments")
    expect(lib.pi_adapter_create(model._ptr, float("nan"), 2, good, out), BAD_MODEL, "alpha")
    expect(lib.pi_adapter_create(model._ptr, 1.0, 0, good, out), BAD_MODEL, "no tensors")
    expect(lib.pi_adapter_create(model._ptr, 1.0, 1, good, out), BAD_MODEL, "missing its lora_b")
    cases = [((("blk.0.attn_q.weight.lora_a", a), ("blk.0.attn_q.weight.lora_a", a)), "appears twice"),
             ((("blk.0.attn_q.weight", a),), "neither"),
             ((("blk.99.attn_q.weight.lora_a", a),), "does not have"),
             ((("blk.0.attn_x.weight.lora_a", a),), "does not have"),
             ((("blk.0.attn_q.weight.lora_a", a), ("blk.0.attn_q.weight.lora_b", np.zeros((E, r + 1), np.float32))),
              "has shapes"),
             ((("blk.0.attn_q.weight.lora_a", a[0]),), "2-d"),
             ((("x" * 200 + ".lora_a", a),), "too long")]
    for items, words in cases:
        expect(lib.pi_adapter_create(model._ptr, 1.0, len(items), descs(*items), out), BAD_MODEL, words)
    assert lib.pi_adapter_create(model._ptr, 0.0, 2, good, out) == OK
    ad = ffi.gc(out[0], lib.pi_adapter_free)
    assert lib.pi_adapter_n_pairs(ad) == 1 and lib.pi_adapter_n_pairs(ffi.NULL) == 0
    lib.pi_adapter_free(ffi.NULL)
    ads, scales = ffi.new("pi_adapter *[]", [ad]), ffi.new("float[]", [1.0])
    expect(lib.pi_context_set_adapters(ffi.NULL, 1, ads, scales), INVALID, "bad arguments")
    expect(lib.pi_context_set_adapters(ctx, 1, ffi.NULL, scales), INVALID, "bad arguments")
    expect(lib.pi_context_set_adapters(ctx, -1, ads, scales), INVALID, "bad arguments")
    expect(lib.pi_context_set_adapters(ctx, 65, ads, scales), INVALID, "at most 64")
    expect(lib.pi_context_set_adapters(ctx, 1, ffi.new("pi_adapter *[]", [ffi.NULL]), scales), INVALID, "not made")
    expect(lib.pi_context_set_adapters(ctx, 1, ads, ffi.new("float[]", [float("inf")])), INVALID, "not finite")
    other = pi.Model(model.path)
    assert lib.pi_adapter_create(other._ptr, 0.0, 2, good, out) == OK
    foreign = ffi.gc(out[0], lib.pi_adapter_free)
    expect(lib.pi_context_set_adapters(ctx, 1, ffi.new("pi_adapter *[]", [foreign]), scales), INVALID, "not made")
    assert lib.pi_context_set_adapters(ctx, 1, ads, scales) == OK
    assert _decode(ctx, [1, 2], [0, 1]) == OK                  # b is zero: the base model's logits
    assert lib.pi_context_set_adapters(ctx, 0, ffi.NULL, ffi.NULL) == OK


def test_control_vector_bad_args(model):
    ctx = make_ctx(model, n_ctx=8)
    E, n_layer = TINY["n_embd"], TINY["n_layer"]
    data = np.zeros((n_layer, E), np.float32)
    buf = ffi.from_buffer("float[]", data)
    expect(lib.pi_context_set_control_vector(ffi.NULL, buf, E, 1, n_layer), INVALID, "NULL")
    expect(lib.pi_context_set_control_vector(ctx, buf, E + 1, 1, n_layer), INVALID, "n_embd")
    expect(lib.pi_context_set_control_vector(ctx, buf, E, -1, n_layer), INVALID, "empty or negative")
    expect(lib.pi_context_set_control_vector(ctx, buf, E, 2, 1), INVALID, "empty or negative")
    data[0, 3] = np.inf
    expect(lib.pi_context_set_control_vector(ctx, buf, E, 1, n_layer), INVALID, "not finite")
    data[0, 3] = 0
    assert lib.pi_context_set_control_vector(ctx, buf, E, 0, 99) == OK       # a range past the last layer: fine
    assert _decode(ctx, [1, 2], [0, 1]) == OK
    assert lib.pi_context_set_control_vector(ctx, ffi.NULL, 0, 0, 0) == OK


def test_imatrix_bad_arguments(model):
    """The importance matrix (imatrix.c) and the weighted quantizers (quant_imatrix.c): NULL and out-of-range
    arguments fail with a message."""
    ctx = pi.Context(model, n_ctx=16, n_threads=2)._ptr
    expect(lib.pi_imatrix_begin(ffi.NULL, 0), INVALID, "ctx is NULL")
    expect(lib.pi_imatrix_begin(ctx, 2), INVALID, "unknown flags")
    lib.pi_imatrix_end(ffi.NULL)
    assert lib.pi_imatrix_n_entries(ffi.NULL) == 0 and lib.pi_imatrix_n_entries(ctx) == 0
    n = ffi.new("int64_t *")
    expect(lib.pi_imatrix_entry(ffi.NULL, 0, ffi.NULL, n, n, ffi.NULL, ffi.NULL), INVALID, "no importance matrix")
    assert lib.pi_imatrix_begin(ctx, 0) == OK
    assert lib.pi_imatrix_n_entries(ctx) > 0
    expect(lib.pi_imatrix_entry(ctx, -1, ffi.NULL, n, n, ffi.NULL, ffi.NULL), INVALID, "no entry -1")
    expect(lib.pi_imatrix_entry(ctx, 10**6, ffi.NULL, n, n, ffi.NULL, ffi.NULL), INVALID, "no entry")
    assert lib.pi_imatrix_entry(ctx, 0, ffi.NULL, n, ffi.NULL, ffi.NULL, ffi.NULL) == OK and n[0] > 0
    lib.pi_imatrix_end(ctx)
    lib.pi_imatrix_end(ctx)                     # twice: nothing
    x = np.ones(256, np.float32)
    buf = np.zeros(1024, np.uint8)
    xs, bs, w = ffi.from_buffer("float[]", x), ffi.from_buffer(buf), ffi.from_buffer("float[]", x)
    expect(lib.pi_quantize_rows_imatrix(12, ffi.NULL, bs, 1, 256, w), INVALID, "NULL")
    expect(lib.pi_quantize_rows_imatrix(12, xs, ffi.NULL, 1, 256, w), INVALID, "NULL")
    expect(lib.pi_quantize_rows_imatrix(12, xs, bs, -1, 256, w), INVALID, "negative")
    expect(lib.pi_quantize_rows_imatrix(12, xs, bs, 1, 100, w), INVALID, "cannot be stored")
    expect(lib.pi_quantize_rows_imatrix(12, xs, bs, 2**62, 256, w), INVALID, "too many")
    expect(lib.pi_quantize_rows_imatrix(99, xs, bs, 1, 256, w), INVALID, "cannot be stored")
    expect(lib.pi_quantize_rows_imatrix(16, xs, bs, 1, 256, w), UNSUPPORTED, "no quantizer with importance")
    assert lib.pi_quantize_rows_imatrix(12, xs, bs, 1, 256, ffi.NULL) == OK


# ---- every public function is exercised above -------------------------------------------
COVERED = {
    "pi_last_error", "pi_system_info", "pi_type_supported", "pi_type_name", "pi_type_block_size",
    "pi_type_block_bytes", "pi_row_bytes", "pi_quantize_row", "pi_dequantize_row", "pi_threadpool_create",
    "pi_threadpool_free", "pi_threadpool_size", "pi_op_get_rows", "pi_op_mul_mat", "pi_op_mul_mats", "pi_op_rms_norm",
    "pi_op_rope",
    "pi_op_layer_norm", "pi_op_softmax", "pi_op_unary", "pi_op_binary", "pi_op_attention", "pi_model_create",
    "pi_op_attention_softcap", "pi_op_softcap", "pi_op_attention_sinks", "pi_op_swiglu_oai", "pi_op_xielu",
    "pi_model_free",
    "pi_model_hparams", "pi_model_layer_geom", "pi_context_default_params", "pi_context_create", "pi_context_free",
    "pi_set_abort_callback", "pi_set_n_threads", "pi_decode", "pi_get_logits", "pi_kv_seq_rm", "pi_kv_seq_cp",
    "pi_set_outputs", "pi_get_embeddings",
    "pi_kv_clear", "pi_kv_seq_pos_max", "pi_kv_used_cells", "pi_kv_seq_state_size", "pi_kv_seq_state_get",
    "pi_kv_seq_state_set", "pi_kv_seq_state_positions",
    "pi_op_predictor", "pi_op_sparse_ffn", "pi_op_sparse_mask", "pi_sparse_stats", "pi_sparse_stats_reset",
    "pi_neuron_counts",
    "pi_repack_bytes", "pi_repack", "pi_sparse_pack_bytes", "pi_sparse_pack", "pi_model_n_packed_ffn",
    "pi_cpu_isa", "pi_cpu_isa_supported", "pi_cpu_isa_set", "pi_cpu_isa_env_error", "pi_bf16_dot",
    "pi_device_count", "pi_device_get_info", "pi_device_allocated_bytes", "pi_device_peak_bytes",
    "pi_device_reset_peak", "pi_gpu_backend_name", "pi_offload_compute_bytes", "pi_offload_plan_compute_bytes",
    "pi_context_offload",
    "pi_context_offload_stats", "pi_context_hot_neurons",
    "pi_set_sparse_thresholds", "pi_set_gate_input_thresholds", "pi_gate_input_stats", "pi_act_histogram",
    "pi_set_attn_input_thresholds", "pi_attn_input_stats",
    "pi_act_histogram_edge", "pi_act_channel_means",
    "pi_adapter_create", "pi_adapter_free", "pi_adapter_n_pairs", "pi_context_set_adapters",
    "pi_context_set_control_vector",
    "pi_recurrent_pos", "pi_op_ssm_conv", "pi_op_gated_delta_net",   # tests/test_qwen35.py: test_bad_arguments
    "pi_imatrix_begin", "pi_imatrix_end", "pi_imatrix_n_entries", "pi_imatrix_entry", "pi_quantize_rows_imatrix",
}


def test_every_public_function_has_robustness_cases():
    header = (_ROOT / "core" / "include" / "powerinfer.h").read_text()
    declared = set(re.findall(r"PI_API\s+[^;(]*?\b(pi_\w+)\s*\(", header))
    assert declared, "no PI_API functions found in powerinfer.h"
    missing = declared - COVERED
    assert not missing, f"add bad-argument cases to tests/test_robustness.py for: {sorted(missing)}"


# =======================================================================================
# 3. the high-level Context
# =======================================================================================
@pytest.fixture
def hctx(model):
    return pi.Context(model, n_ctx=16, n_batch=8, n_seq_max=2, n_threads=2)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(tokens=[]), ValueError, ["no tokens"]),
    (dict(tokens=[1, 320]), PowerInferError, ["token 320", "out of range"]),
    (dict(tokens=[-1]), PowerInferError, ["token -1"]),
    (dict(tokens=[2**40]), ValueError, ["tokens", "int32"]),
    (dict(tokens=np.array([2**32 + 5], dtype=np.int64)), ValueError, ["tokens", "int32"]),
    (dict(tokens=[1.5, 2.0]), ValueError, ["tokens", "integers"]),
    (dict(tokens=["a"]), ValueError, ["tokens", "integers"]),
    (dict(tokens=[True, False]), ValueError, ["tokens", "integers"]),
    (dict(tokens=[[1, 2], [3]]), ValueError, []),
    (dict(tokens=[1, 2], pos=[0]), ValueError, ["pos"]),
    (dict(tokens=[1, 2], pos=[0, -1]), PowerInferError, ["negative position"]),
    (dict(tokens=[1, 2], pos=[0, 2**31]), ValueError, ["pos", "int32"]),
    (dict(tokens=[1], seq_id=5), ValueError, ["sequence id 5"]),
    (dict(tokens=[1], seq_id=-1), ValueError, ["sequence id -1"]),
    (dict(tokens=[1], pos=[0], seq_id=5), PowerInferError, ["sequence id 5"]),
    (dict(tokens=[1], pos=[0], seq_id=2**40), ValueError, ["seq_id", "int32"]),
    (dict(tokens=[1, 2], seq_id=[0, 0, 0]), ValueError, ["seq_id"]),
    (dict(tokens=[1, 2], seq_id=[0, 1]), ValueError, ["give pos explicitly"]),
    (dict(tokens=[1], logits="every"), ValueError, ["logits"]),
    (dict(tokens=[1, 2], logits=[1]), ValueError, ["logits mask"]),
    (dict(tokens=list(range(1, 18))), PowerInferError, ["KV cache full"]),
])
def test_context_decode_bad_inputs(hctx, kwargs, exc, words):
    with pytest.raises(exc) as ei:
        hctx.decode(**kwargs)
    for w in words:
        assert w in str(ei.value), str(ei.value)
    if exc is PowerInferError:
        assert ei.value.status < 0
    # the context is still usable
    hctx.kv_clear()
    hctx.decode([1, 2, 3])
    assert np.isfinite(hctx.logits()).all()


def test_context_kv_full_status(hctx):
    hctx.decode(list(range(1, 11)))
    with pytest.raises(PowerInferError) as ei:
        hctx.decode(list(range(1, 8)))
    assert ei.value.status == KV_FULL and "KV cache full" in str(ei.value)
    assert hctx.kv_used == 10
    hctx.decode([1, 2, 3, 4, 5, 6])
    assert hctx.kv_used == 16


def test_context_bad_constructor_args(model):
    for kv in ("q6_K", ("q8_0",), ("f16", "q4_K")):
        with pytest.raises(ValueError, match="kv_type"):
            pi.Context(model, kv_type=kv)
    with pytest.raises(PowerInferError, match="K cache type q8_0: the model's head size 16 is not a multiple"):
        pi.Context(model, kv_type="q8_0")
    with pytest.raises(PowerInferError, match="V cache type q4_1: the model's head size 16"):
        pi.Context(model, kv_type=("f16", "q4_1"))
    for kw, word in ((dict(n_seq_max=0), "n_seq_max"), (dict(n_seq_max=65), "n_seq_max"),
                     (dict(n_ctx=2**30), "n_ctx"), (dict(n_threads=10**6), "n_threads")):
        with pytest.raises(PowerInferError, match=word):
            pi.Context(model, **kw)


def test_context_other_bad_calls(hctx):
    with pytest.raises(PowerInferError, match="no logits"):
        hctx.logits()
    hctx.decode([1, 2, 3], logits="none")
    with pytest.raises(PowerInferError, match="no logits"):
        hctx.logits()
    hctx.decode([4, 5], logits="last")
    with pytest.raises(PowerInferError, match="no logits for batch row 0"):
        hctx.logits(0)
    with pytest.raises(PowerInferError, match="sequence id"):
        hctx.kv_seq_rm(5)
    with pytest.raises(PowerInferError, match="sequence id"):
        hctx.kv_seq_cp(0, 2)
    with pytest.raises(PowerInferError, match="sequence id"):
        hctx.kv_seq_cp(-1, 0)
    with pytest.raises(ValueError, match="sequence id"):
        hctx.seq_pos_max(2)


# =======================================================================================
# 4. the riskiest cases once more, in a child process
# =======================================================================================
def test_risky_cases_do_not_crash_the_interpreter(base_file):
    out = run_isolated(f"""
        import numpy as np
        import powerinfer as pi
        from powerinfer._ffi import ffi, lib
        m = pi.Model({str(base_file)!r})
        # overflowing shapes, sizes and row lengths
        buf = np.zeros(64, np.float32)
        t = ffi.new("pi_tensor *", dict(type=0, n_dims=4, ne=[4, 2**40, 2**40, 2**40], nb=[4, 16, 64, 256],
                                        data=ffi.from_buffer(buf)))
        assert lib.pi_op_softmax(ffi.NULL, t, t) == lib.PI_ERR_INVALID_ARG
        assert lib.pi_row_bytes(0, 2**62) == -1
        assert lib.pi_dequantize_row(8, ffi.from_buffer(buf), ffi.from_buffer("float[]", buf), 33) != 0
        # contexts that cannot exist
        p = ffi.new("pi_context_params *", lib.pi_context_default_params())
        out = ffi.new("pi_context **")
        for field, v in (("n_ctx", 0), ("n_ctx", 2**30), ("n_seq_max", 0), ("n_seq_max", 65), ("type_k", 7),
                         ("n_threads", 10**6)):
            q = ffi.new("pi_context_params *", p[0])
            setattr(q, field, v)
            assert lib.pi_context_create(m._ptr, q, out) != 0, (field, v)
        # a full KV cache, across calls
        ctx = pi.Context(m, n_ctx=8, n_batch=8)
        ctx.decode([1, 2, 3, 4, 5, 6])
        for _ in range(3):
            try:
                ctx.decode([1, 2, 3])
            except pi.PowerInferError as e:
                assert e.status == lib.PI_ERR_KV_FULL
            else:
                raise AssertionError("no KV_FULL")
        ctx.decode([7, 8])
        print("DONE")
    """)
    assert "DONE" in out
