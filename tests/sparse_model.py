"""Small PowerInfer (PWRI) test models: the tiny random llama of tools/make_test_model.py, rewritten
in the sparse layout (ffn_down_t = ffn_down transposed, random per-layer predictors fc1/fc2)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from make_test_model import write_model  # noqa: E402

TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}


def _encode(w: np.ndarray, dtype: str):
    if w.ndim == 1 or dtype == "f32":
        return w.astype(np.float32), Q.F32
    if dtype == "f16":
        return w.astype(np.float16), Q.F16
    return quantize(w.astype(np.float32), TYPES[dtype]), TYPES[dtype]


def write_sparse_model(path, *, dtype="f32", pred_dtype=None, ranks=(32, 64), seed=0, threshold=None,
                       arch="llama", predictors=True, **shape) -> Path:
    """Write a PWRI file; ranks gives the predictor rank per layer (n_layer = len(ranks)).
    predictors=False leaves fc1/fc2 out (an invalid sparse file, for error tests)."""
    path = Path(path)
    dense = path.with_suffix(".dense-f32.gguf")
    shape = {**dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2), **shape, "n_layer": len(ranks)}
    write_model(dense, dtype="f32", seed=seed, arch=arch, ffn_act="relu", **shape)
    reader = GGUFReader(dense)
    writer = GGUFWriter(str(path), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if len(field.types) > 1 else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    if threshold is not None:
        writer.add_float32("powerinfer.sparse_threshold", threshold)
    rng = np.random.default_rng(seed + 1000)
    E = shape["n_embd"]
    F = shape["n_ff"]
    for t in reader.tensors:
        w = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        name = t.name
        if name.endswith("ffn_down.weight"):
            name, w = name.replace("ffn_down", "ffn_down_t"), np.ascontiguousarray(w.T)   # (n_ff, n_embd)
        data, q = _encode(w, dtype)
        writer.add_tensor(name, data, raw_dtype=q)
    for il, r in enumerate(ranks if predictors else ()):
        fc1 = rng.standard_normal((r, E)).astype(np.float32) / np.sqrt(E)
        fc2 = rng.standard_normal((F, r)).astype(np.float32) / np.sqrt(r)
        for name, w in ((f"blk.{il}.fc1.weight", fc1), (f"blk.{il}.fc2.weight", fc2)):
            data, q = _encode(w, pred_dtype or ("f16" if dtype in ("f32", "bf16") else dtype))
            writer.add_tensor(name, data, raw_dtype=q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dense.unlink()
    with open(path, "r+b") as f:
        f.write(b"PWRI")
    return path
