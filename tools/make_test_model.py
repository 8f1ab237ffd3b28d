#!/usr/bin/env python3
"""Write small (or huge, benchmark-shaped) deterministic llama/bamboo GGUF models
with random weights, for testing and benchmarking PowerInfer-py.

Usable as a script::

    python tools/make_test_model.py OUT.gguf --dtype q4_0 --n-embd 64 ...
    python tools/make_test_model.py /tmp/7b.gguf --preset 7b --dtype q4_0 --random-blocks

and as a module::

    from make_test_model import write_model
    write_model("m.gguf", dtype="q8_0", n_vocab=320, n_embd=64, n_ff=160,
                n_head=4, n_head_kv=2, n_layer=2)

Weights
-------
Default mode: every tensor is generated as float32 from its own RNG stream
(``numpy.random.default_rng([seed, crc32(name)])``), so a tensor's float values
only depend on ``seed``, its name and its shape -- the same seed gives the same
float weights for every ``dtype`` (an f32 and a q8_0 model are "the same model"
up to quantization error).  2-D matrices: ``normal * 1/sqrt(fan_in)``
(``token_embd``: ``normal``, i.e. std 1 per element); 1-D norm weights:
``1 + 0.1*normal`` (always F32).  The float weights are then converted with the
numpy quantizers of ``powerinfer.quants`` (``quantize_q8_0``, ``quantize_q4_0``,
``float_to_bf16``, re-exported here), which follow ggml's reference quantizers.

``random_blocks=True`` (``--random-blocks``): quantized tensors are filled with
random *valid* blocks directly (uniform random nibbles / int8 and random fp16
scales of random sign, magnitude ~ 1/(sqrt(fan_in)*std(q))), float tensors with
random normals; everything is generated and written in bounded-size chunks, so
7B-shaped models can be written quickly with bounded memory.

The file is always written through ``gguf.GGUFWriter``'s streaming API
(``add_tensor_info`` -> header / kv / tensor-info -> tensor data), alignment 32.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT


# --------------------------------------------------------------------------------------
# quantizers
# --------------------------------------------------------------------------------------
def _load_quants():
    """powerinfer.quants; from this checkout's bindings/ when the package is not importable, and
    as a standalone module when the package is there but its C library is not built yet (the
    quantizers are pure numpy)."""
    try:
        from powerinfer import quants
        return quants
    except ImportError:
        pass
    bindings = Path(__file__).resolve().parents[1] / "bindings"
    if str(bindings) not in sys.path:
        sys.path.insert(0, str(bindings))
        try:
            from powerinfer import quants
            return quants
        except ImportError:
            pass
    import importlib.util
    spec = importlib.util.spec_from_file_location("_powerinfer_quants", bindings / "powerinfer" / "quants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


_quants = _load_quants()
# the numpy quantizers (ggml reference arithmetic) live in powerinfer.quants; re-exported here
QK = _quants.QK
Q4_0_BYTES = _quants.Q4_0_BYTES
Q8_0_BYTES = _quants.Q8_0_BYTES
Q5_0_BYTES = 22          # fp16 d, qh[4] (the 5th bits), qs[16] (nibbles as Q4_0's)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """float rows (..., n) -> Q5_0 bytes (..., n / 32 * 22) as ggml's reference quantizer does it: d = m / -16 for
    the block's value m of largest magnitude, u = min(31, trunc(x / d + 16.5)), value d (u - 16). Test models only
    (the converters do not write Q5_0)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(-1, QK)
    m = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    d = (m / np.float32(-16)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0).astype(np.float32)
    u = np.minimum(31, (blocks * inv[:, None] + np.float32(16.5)).astype(np.int8)).astype(np.uint32)
    qs = (u[:, :16] & 15) | ((u[:, 16:] & 15) << 4)
    qh = ((u >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    out = np.zeros((len(blocks), Q5_0_BYTES), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:6] = qh.astype("<u4").view(np.uint8).reshape(-1, 4)
    out[:, 6:] = qs.astype(np.uint8)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK * Q5_0_BYTES)
float_to_bf16 = _quants.float_to_bf16
quantize_q8_0 = _quants.quantize_q8_0
quantize_q4_0 = _quants.quantize_q4_0

# --------------------------------------------------------------------------------------
# block layouts
# --------------------------------------------------------------------------------------
DTYPES = {
    # name: (ggml type, general.file_type, block elems, block bytes)
    "f32":  (QT.F32,  0,  1, 4),
    "f16":  (QT.F16,  1,  1, 2),
    "bf16": (QT.BF16, 32, 1, 2),
    "q8_0": (QT.Q8_0, 7,  QK, Q8_0_BYTES),
    "q4_0": (QT.Q4_0, 2,  QK, Q4_0_BYTES),
    "q5_0": (QT.Q5_0, 8,  QK, Q5_0_BYTES),
}

FFN_ACTS = ("silu", "relu", "gelu")

PRESETS = {
    # n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer, n_ctx_train
    "tiny": dict(n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, n_ctx_train=512),
    "7b": dict(n_vocab=32000, n_embd=4096, n_ff=11008, n_head=32, n_head_kv=32, n_layer=32, n_ctx_train=4096),
    "13b": dict(n_vocab=32000, n_embd=5120, n_ff=13824, n_head=40, n_head_kv=40, n_layer=40, n_ctx_train=4096),
    # Qwen3-0.6B's shape (with --arch qwen3 --head-dim 128 --rope-freq-base 1e6 --norm-eps 1e-6 --tied-output)
    "qwen3-0.6b": dict(n_vocab=151936, n_embd=1024, n_ff=3072, n_head=16, n_head_kv=8, n_layer=28, n_ctx_train=40960),
}

_CHUNK_BYTES = 64 << 20   # generation / write chunk size


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows -> raw uint8 bytes of the GGUF tensor data for `dtype` (row-major)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return quantize_q5_0(x) if dtype == "q5_0" else _quants.quantize(x, dtype)


# --------------------------------------------------------------------------------------
# vocabulary
# --------------------------------------------------------------------------------------
_WORDS = (
    "the of and to a in is that it for was on are as with he his they at be this "
    "from have or by one had not but what all were when we there can an your which "
    "their said if do will each about how up out them then she many some so these "
    "would other into has more her two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water long "
    "little very after words called just where most know hello world once upon story"
).split()


def synthetic_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-like vocab: <unk>, <s>, </s>, 256 byte tokens, then normal pieces."""
    if n_vocab < 3 + 256 + 1:
        raise ValueError("n_vocab must be >= 260 for the synthetic vocab")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)

    cand: list[str] = ["\u2581"]
    cand += list("etaoinshrdlcumwfgypbvkjxqz")
    for w in _WORDS:                     # every prefix so that bigram merges can reach the word
        for k in range(1, len(w) + 1):
            cand.append("\u2581" + w[:k])
    cand += list("ETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,!?'\"-:;()")
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    cand += [a + b for a in letters for b in letters]
    cand += [w for w in _WORDS if len(w) > 1]
    cand += [a + b + c for a in letters[:12] for b in letters[:12] for c in letters[:12]]
    seen = set(tokens)
    pieces = []
    for c in cand:
        if c not in seen:
            seen.add(c)
            pieces.append(c)
    i = 0
    while len(tokens) + len(pieces) < n_vocab:       # pad (only for very large n_vocab)
        p = f"\u2581tok{i}"
        i += 1
        if p not in seen:
            seen.add(p)
            pieces.append(p)
    pieces = pieces[: n_vocab - len(tokens)]
    for i, p in enumerate(pieces):
        tokens.append(p)
        scores.append(-float(i + 1))
        types.append(1)
    return tokens, scores, types


# --------------------------------------------------------------------------------------
# model layout
# --------------------------------------------------------------------------------------
def add_vocab(w: gguf.GGUFWriter, tokens, scores, types) -> None:
    """The tokenizer.* keys of a test model: a SentencePiece ("llama") vocabulary, unk 0, BOS 1 (added),
    EOS 2 (not added)."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(s) for s in scores])
    w.add_token_types([int(t) for t in types])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def tensor_specs(*, n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer, tied_output=False, head_dim=None,
                 qk_norm=False):
    """[(name, ne (GGUF order, ne[0] contiguous), kind)] with kind 'norm' | 'embd' | 'mat'. head_dim: q/k/v size per
    head (default n_embd / n_head); qk_norm: per-head q/k RMSNorm weights (qwen3)."""
    if (head_dim is None and n_embd % n_head) or n_head % n_head_kv:
        raise ValueError("n_embd % n_head and n_head % n_head_kv must be 0")
    head_dim = head_dim or n_embd // n_head
    n_embd_q, n_embd_gqa = n_head * head_dim, n_head_kv * head_dim
    specs = [("token_embd.weight", (n_embd, n_vocab), "embd"),
             ("output_norm.weight", (n_embd,), "norm")]
    if not tied_output:
        specs.append(("output.weight", (n_embd, n_vocab), "mat"))
    for i in range(n_layer):
        p = f"blk.{i}."
        specs += [
            (p + "attn_norm.weight", (n_embd,), "norm"),
            (p + "attn_q.weight", (n_embd, n_embd_q), "mat"),
            (p + "attn_k.weight", (n_embd, n_embd_gqa), "mat"),
            (p + "attn_v.weight", (n_embd, n_embd_gqa), "mat"),
            (p + "attn_output.weight", (n_embd_q, n_embd), "mat"),
            (p + "ffn_norm.weight", (n_embd,), "norm"),
            (p + "ffn_gate.weight", (n_embd, n_ff), "mat"),
            (p + "ffn_up.weight", (n_embd, n_ff), "mat"),
            (p + "ffn_down.weight", (n_ff, n_embd), "mat"),
        ]
        if qk_norm:
            specs += [(p + "attn_q_norm.weight", (head_dim,), "norm"), (p + "attn_k_norm.weight", (head_dim,), "norm")]
    return specs


def _tensor_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _row_chunks(n_rows: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    step = max(1, _CHUNK_BYTES // max(1, row_bytes))
    for r0 in range(0, n_rows, step):
        yield r0, min(n_rows, r0 + step)


def _float_weights(rng, kind, ne, r0, r1) -> np.ndarray:
    """rows r0..r1 of the float32 source weights (numpy shape (rows, ne[0]))."""
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(ne[0])).astype(np.float32)
    scale = 1.0 if kind == "embd" else 1.0 / math.sqrt(ne[0])
    return (rng.standard_normal((r1 - r0, ne[0]), dtype=np.float32) * np.float32(scale))


def _random_blocks(rng, dtype, kind, ne, r0, r1) -> np.ndarray:
    """rows r0..r1 of random valid blocks as raw bytes (rows, row_bytes)."""
    n0 = ne[0]
    rows = r1 - r0
    if dtype in ("f32", "f16", "bf16"):
        return encode(_float_weights(rng, kind, ne, r0, r1), dtype)
    nb = rows * (n0 // QK)
    if dtype == "q4_0":
        bsz, qstd = Q4_0_BYTES, 4.61      # std of uniform{-8..7}
    elif dtype == "q5_0":
        bsz, qstd = Q5_0_BYTES, 9.23      # std of uniform{-16..15}
    else:
        bsz, qstd = Q8_0_BYTES, 73.9      # std of uniform{-128..127}
    fan = 1.0 if kind == "embd" else 1.0 / math.sqrt(n0)
    blocks = np.frombuffer(rng.bytes(nb * bsz), dtype=np.uint8).reshape(nb, bsz).copy()
    mag = (rng.random(nb, dtype=np.float32) + np.float32(0.5)) * np.float32(fan / qstd)
    sign = np.where(blocks[:, 2] & 1, np.float32(-1), np.float32(1))   # reuse a random bit
    blocks[:, :2] = (mag * sign).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def _row_bytes(dtype: str, n0: int) -> int:
    _, _, be, bb = DTYPES[dtype]
    if n0 % be:
        raise ValueError(f"{dtype}: row length {n0} is not a multiple of the block size {be}")
    return n0 // be * bb


# --------------------------------------------------------------------------------------
# writer
# --------------------------------------------------------------------------------------
def write_model(path, *, dtype, n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer,
                n_ctx_train=512, seed=0, arch="llama", ffn_act=None, tied_output=False,
                rope_freq_base=10000.0, rope_scale_linear=None, norm_eps=1e-5, vocab=None,
                magic="GGUF", random_blocks=False, name=None, progress=False, head_dim=None) -> dict:
    """Write a deterministic random-weight model; returns a summary dict. arch qwen3: per-head q/k RMSNorm, no biases
    (head_dim may differ from n_embd / n_head, as in Qwen3)."""
    dtype = dtype.lower()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}")
    if arch not in ("llama", "bamboo", "qwen3"):
        raise ValueError("arch must be 'llama', 'bamboo' or 'qwen3'")
    if ffn_act is not None and ffn_act not in FFN_ACTS:
        raise ValueError(f"ffn_act must be one of {FFN_ACTS}")
    if magic not in ("GGUF", "PWRI"):
        raise ValueError("magic must be 'GGUF' or 'PWRI'")
    explicit_head_dim = head_dim is not None
    head_dim = head_dim or n_embd // n_head
    if head_dim % 2:
        raise ValueError("head_dim must be even")

    if vocab is None:
        tokens, scores, types = synthetic_vocab(n_vocab)
    else:
        tokens, scores, types = (list(v) for v in vocab)
        if not (len(tokens) == len(scores) == len(types)):
            raise ValueError("vocab: tokens, scores and types must have the same length")
        n_vocab = len(tokens)

    qtype, ftype, _, _ = DTYPES[dtype]
    specs = tensor_specs(n_vocab=n_vocab, n_embd=n_embd, n_ff=n_ff, n_head=n_head,
                         n_head_kv=n_head_kv, n_layer=n_layer, tied_output=tied_output, head_dim=head_dim,
                         qk_norm=arch == "qwen3")

    path = Path(path)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name or f"powerinfer-test-{arch}-{dtype}")
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_block_count(n_layer)
    w.add_rope_dimension_count(head_dim)
    if explicit_head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(rope_freq_base))
    w.add_layer_norm_rms_eps(float(norm_eps))
    if rope_scale_linear is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope_scale_linear))
    if ffn_act is not None:
        w.add_string("powerinfer.ffn_activation", ffn_act)
    add_vocab(w, tokens, scores, types)

    # tensor infos (shapes in numpy order of the raw bytes: (rows..., row_bytes))
    plan = []
    for tname, ne, kind in specs:
        tdt = "f32" if kind == "norm" else dtype
        rb = _row_bytes(tdt, ne[0])
        n_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
        byte_shape = (*reversed(ne[1:]), rb)
        w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), n_rows * rb, raw_dtype=DTYPES[tdt][0])
        plan.append((tname, ne, kind, tdt, n_rows, rb))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    # tensor data, streamed in chunks (mirrors GGUFWriter.write_tensor_data's padding)
    assert w.fout is not None and len(w.fout) == 1
    fout = w.fout[0]
    align = w.data_alignment
    t0 = time.time()
    total = 0
    for i, (tname, ne, kind, tdt, n_rows, rb) in enumerate(plan):
        rng = _tensor_rng(seed, tname)
        w.write_padding(fout, fout.tell())
        start = fout.tell()
        for r0, r1 in _row_chunks(n_rows, rb):
            if random_blocks:
                data = _random_blocks(rng, tdt, kind, ne, r0, r1)
            else:
                data = encode(_float_weights(rng, kind, ne, r0, r1), tdt)
            data = np.ascontiguousarray(data).view(np.uint8)
            assert data.size == (r1 - r0) * rb, (tname, data.shape)
            data.tofile(fout)
        assert fout.tell() - start == n_rows * rb
        w.write_padding(fout, n_rows * rb, align)
        total += n_rows * rb
        if progress:
            print(f"\r[{i + 1}/{len(plan)}] {total / 2**20:.0f} MiB  {time.time() - t0:.1f}s",
                  end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    w.tensors = [{}]
    w.flush()
    w.close()

    if magic == "PWRI":
        with open(path, "r+b") as f:
            f.write(b"PWRI")

    n_params = sum(int(np.prod(ne)) for _, ne, _ in specs)
    return dict(path=str(path), arch=arch, dtype=dtype, n_vocab=n_vocab, n_embd=n_embd, n_ff=n_ff,
                n_head=n_head, n_head_kv=n_head_kv, n_layer=n_layer, n_ctx_train=n_ctx_train,
                head_dim=head_dim, n_tensors=len(specs), n_params=n_params,
                file_size=os.path.getsize(path), magic=magic, random_blocks=random_blocks,
                ffn_act=ffn_act, tied_output=tied_output, seed=seed)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                    help="base shape; explicit --n-* options override it")
    ap.add_argument("--dtype", choices=list(DTYPES), default="q4_0")
    for k in ("n_vocab", "n_embd", "n_ff", "n_head", "n_head_kv", "n_layer", "n_ctx_train"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None,
                        help=f"(tiny preset: {PRESETS['tiny'][k]})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=["llama", "bamboo", "qwen3"], default="llama")
    ap.add_argument("--head-dim", type=int, default=None, help="q/k/v size per head (default n_embd / n_head)")
    ap.add_argument("--ffn-act", choices=FFN_ACTS, default=None,
                    help="write powerinfer.ffn_activation (default: not written)")
    ap.add_argument("--tied-output", action="store_true", help="omit output.weight")
    ap.add_argument("--rope-freq-base", type=float, default=10000.0)
    ap.add_argument("--rope-scale-linear", type=float, default=None)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--magic", choices=["GGUF", "PWRI"], default="GGUF")
    ap.add_argument("--random-blocks", action="store_true",
                    help="fast mode: random valid blocks instead of quantized random weights")
    ap.add_argument("--name", default=None)
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args(argv)

    shape = dict(PRESETS[a.preset])
    for k in shape:
        v = getattr(a, k)
        if v is not None:
            shape[k] = v
    t0 = time.time()
    s = write_model(a.out, dtype=a.dtype, seed=a.seed, arch=a.arch, ffn_act=a.ffn_act,
                    tied_output=a.tied_output, rope_freq_base=a.rope_freq_base,
                    rope_scale_linear=a.rope_scale_linear, norm_eps=a.norm_eps, magic=a.magic,
                    random_blocks=a.random_blocks, name=a.name, progress=a.progress, head_dim=a.head_dim, **shape)
    dt = time.time() - t0
    print(f"wrote {s['path']}: arch={s['arch']} dtype={s['dtype']} magic={s['magic']}"
          f"{' random-blocks' if s['random_blocks'] else ''}")
    print(f"  n_vocab={s['n_vocab']} n_embd={s['n_embd']} n_ff={s['n_ff']} n_head={s['n_head']} "
          f"n_head_kv={s['n_head_kv']} n_layer={s['n_layer']} n_ctx_train={s['n_ctx_train']} "
          f"head_dim={s['head_dim']}")
    print(f"  tensors={s['n_tensors']} params={s['n_params']:,} size={s['file_size']:,} bytes "
          f"({s['file_size'] / 2**20:.2f} MiB) time={dt:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
