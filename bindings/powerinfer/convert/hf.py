"""Read a Hugging Face llama-family checkpoint directory.

- ``config.json``: hyper-parameters (`hparams_from_config`);
- weights (`find_weight_files`, `load_tensors`), first match wins:
  ``model.safetensors.index.json`` / ``model-0000x-of-0000y.safetensors`` / ``model.safetensors``
  (read with the ``safetensors`` package's numpy API; BF16, which numpy cannot represent, and
  everything when the package is missing, through a small reader of the same format),
  then ``pytorch_model.bin.index.json`` / ``pytorch_model-0000x-of-0000y.bin`` /
  ``pytorch_model.bin`` / ``consolidated.00.pth`` (the torch-free reader of torch_pickle.py);
  Meta's ``consolidated.00.pth`` names (``layers.N.attention.wq`` ...) are mapped to the HF
  ones and need no Q/K permutation;
- ``tokenizer.model`` (SentencePiece) + ``added_tokens.json`` (`load_vocab`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..quants import bf16_to_float
from .common import ConversionError, LazyTensor, log
from .torch_pickle import load_state_dict

SUPPORTED_MODEL_TYPES = {"llama": "llama", "bamboo": "bamboo"}
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "BambooForCausalLM", "LLaMAForCausalLM")

# config.hidden_act -> powerinfer.ffn_activation
ACTIVATIONS = {
    "relu": "relu", "silu": "silu", "swish": "silu",
    "gelu": "gelu", "gelu_new": "gelu", "gelu_fast": "gelu", "gelu_pytorch_tanh": "gelu",
    "gelu_python": "gelu",
}
# accepted with a warning: FATReLU (ProSparse) is ReLU with a small positive threshold
APPROX_ACTIVATIONS = {"fatrelu": "relu"}

# token types (tokenizer.ggml.token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class HParams:
    arch: str                   # "llama" | "bamboo"
    n_vocab: int                # config.vocab_size
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_layer: int
    head_dim: int
    rope_theta: float
    norm_eps: float
    rope_scaling_factor: float | None     # linear scaling factor, None when not scaled
    ffn_act: str                # "relu" | "silu" | "gelu"
    hidden_act: str             # as written in config.json
    tie_word_embeddings: bool


@dataclass
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None


def read_json_config(directory, name: str, kind: str, expected: str) -> dict:
    """directory/name as a JSON object; ConversionError when the (kind) directory or the file is missing (the message
    says what was expected), unreadable, or not an object."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConversionError(f"{directory}: {kind} directory does not exist")
    path = directory / name
    if not path.is_file():
        raise ConversionError(f"{directory}: no {name} (expected {expected})")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable config ({e})") from None
    if not isinstance(cfg, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return cfg


def load_config(model_dir: Path) -> dict:
    return read_json_config(model_dir, "config.json", "model", "a Hugging Face checkpoint directory")


def hparams_from_config(cfg: dict, where: str = "config.json") -> HParams:
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type is None and archs:
        model_type = {"LlamaForCausalLM": "llama", "LLaMAForCausalLM": "llama",
                      "BambooForCausalLM": "bamboo"}.get(archs[0])
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(
            f"{where}: unsupported model_type {cfg.get('model_type')!r} (architectures {archs}); these converters "
            f"handle llama-family models (model_type {' or '.join(SUPPORTED_MODEL_TYPES)})")
    if archs and archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(f"{where}: unsupported architecture {archs[0]!r} for model_type {model_type!r} "
                              f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def req_int(*keys):
        for k in keys:
            v = cfg.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise ConversionError(f"{where}: {k} = {v!r} must be a positive integer")
                return v
        raise ConversionError(f"{where}: missing {' / '.join(keys)}")

    n_embd = req_int("hidden_size")
    n_head = req_int("num_attention_heads")
    n_head_kv = req_int("num_key_value_heads") if cfg.get("num_key_value_heads") is not None else n_head
    n_layer = req_int("num_hidden_layers")
    n_ff = req_int("intermediate_size")
    n_vocab = req_int("vocab_size")
    n_ctx = req_int("max_position_embeddings", "max_sequence_length")
    if n_embd % n_head:
        raise ConversionError(f"{where}: hidden_size {n_embd} is not a multiple of num_attention_heads {n_head}")
    if n_head % n_head_kv:
        raise ConversionError(f"{where}: num_attention_heads {n_head} is not a multiple of "
                              f"num_key_value_heads {n_head_kv}")
    head_dim = n_embd // n_head
    if cfg.get("head_dim") not in (None, head_dim):
        raise ConversionError(f"{where}: head_dim {cfg['head_dim']} != hidden_size/num_attention_heads "
                              f"({head_dim}) is not supported")
    if head_dim % 2:
        raise ConversionError(f"{where}: head dimension {head_dim} must be even for RoPE")

    hidden_act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if hidden_act in ACTIVATIONS:
        act = ACTIVATIONS[hidden_act]
    elif hidden_act in APPROX_ACTIVATIONS:
        act = APPROX_ACTIVATIONS[hidden_act]
        log.warning("warning: hidden_act %r is written as %r (the engine has no thresholded variant)",
                    hidden_act, act)
    else:
        raise ConversionError(f"{where}: unsupported hidden_act {hidden_act!r} "
                              f"(supported: {', '.join(sorted(ACTIVATIONS))})")

    factor = None
    rs = cfg.get("rope_scaling")
    if rs:
        if not isinstance(rs, dict):
            raise ConversionError(f"{where}: rope_scaling must be an object, got {rs!r}")
        typ = rs.get("type", rs.get("rope_type"))
        if typ == "linear":
            factor = rs.get("factor")
            if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
                raise ConversionError(f"{where}: rope_scaling factor {factor!r} must be a positive number")
            factor = float(factor)
        elif typ not in (None, "default", "none"):
            raise ConversionError(f"{where}: rope_scaling type {typ!r} is not supported (only linear)")

    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    for k, v in (("rms_norm_eps", eps), ("rope_theta", theta)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ConversionError(f"{where}: {k} = {v!r} must be a positive number")
    return HParams(
        arch=SUPPORTED_MODEL_TYPES[model_type], n_vocab=n_vocab, n_ctx=n_ctx, n_embd=n_embd, n_ff=n_ff,
        n_head=n_head, n_head_kv=n_head_kv, n_layer=n_layer, head_dim=head_dim, rope_theta=float(theta),
        norm_eps=float(eps), rope_scaling_factor=factor, ffn_act=act, hidden_act=str(hidden_act),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))


# --------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------
def _sharded(model_dir: Path, pattern: str) -> list[Path]:
    rx = re.compile(pattern)
    files = []
    for p in model_dir.iterdir():
        m = rx.fullmatch(p.name)
        if m:
            files.append((int(m.group(1)), int(m.group(2)), p))
    if not files:
        return []
    files.sort()
    total = files[0][1]
    have = [i for i, _, _ in files]
    if any(t != total for _, t, _ in files) or have != list(range(1, total + 1)):
        raise ConversionError(f"{model_dir}: incomplete set of weight shards "
                              f"({', '.join(p.name for _, _, p in files)}; expected {total})")
    return [p for _, _, p in files]


def _from_index(model_dir: Path, index_name: str) -> list[Path]:
    path = model_dir / index_name
    try:
        wm = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ConversionError(f"{path}: unreadable weight index ({type(e).__name__}: {e})") from None
    files = []
    for f in wm.values():
        p = model_dir / f
        if p not in files:
            files.append(p)
    missing = [p.name for p in files if not p.is_file()]
    if missing:
        raise ConversionError(f"{path}: lists missing weight files {', '.join(sorted(missing))}")
    return sorted(files)


def find_weight_files(model_dir: Path) -> list[Path]:
    """The checkpoint's weight files, in the order of preference described in the module doc."""
    model_dir = Path(model_dir)
    if (model_dir / "model.safetensors.index.json").is_file():
        return _from_index(model_dir, "model.safetensors.index.json")
    files = _sharded(model_dir, r"model-(\d+)-of-(\d+)\.safetensors")
    if files:
        return files
    if (model_dir / "model.safetensors").is_file():
        return [model_dir / "model.safetensors"]
    if (model_dir / "pytorch_model.bin.index.json").is_file():
        return _from_index(model_dir, "pytorch_model.bin.index.json")
    files = _sharded(model_dir, r"pytorch_model-(\d+)-of-(\d+)\.bin")
    if files:
        return files
    if (model_dir / "pytorch_model.bin").is_file():
        return [model_dir / "pytorch_model.bin"]
    if (model_dir / "consolidated.00.pth").is_file():
        if (model_dir / "consolidated.01.pth").is_file():
            raise ConversionError(f"{model_dir}: multi-file consolidated.NN.pth checkpoints (model-parallel "
                                  "shards) are not supported; use the Hugging Face format")
        return [model_dir / "consolidated.00.pth"]
    raise ConversionError(f"{model_dir}: no weights found (model.safetensors, model-*-of-*.safetensors, "
                          "pytorch_model.bin, pytorch_model-*-of-*.bin or consolidated.00.pth)")


_ST_NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _read_safetensors_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ConversionError(f"{path}: truncated safetensors file")
            n = int.from_bytes(raw, "little")
            if n > 100 << 20:
                raise ConversionError(f"{path}: implausible safetensors header size {n}")
            head = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable safetensors file ({type(e).__name__}: {e})") from None
    head.pop("__metadata__", None)
    return head, 8 + n


def _load_safetensors(path: Path) -> dict[str, LazyTensor]:
    head, data_start = _read_safetensors_header(path)
    size = path.stat().st_size
    try:
        from safetensors import safe_open
    except ImportError:
        safe_open = None
    out: dict[str, LazyTensor] = {}
    for name, info in head.items():
        try:
            dtype, shape, (b0, b1) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConversionError(f"{path}: bad safetensors entry for {name!r}") from None
        if dtype not in _ST_NP:
            raise ConversionError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
        count = int(np.prod(shape)) if shape else 1
        if b1 - b0 != count * np.dtype(_ST_NP[dtype]).itemsize or data_start + b1 > size:
            raise ConversionError(f"{path}: tensor {name!r} data range [{b0}, {b1}) is inconsistent "
                                  "(the file is truncated or corrupt)")
        src = f"{path}:{name}"
        if safe_open is not None and dtype != "BF16":
            def load(name=name):
                with safe_open(str(path), framework="np") as f:
                    return f.get_tensor(name)
        else:
            def load(dtype=dtype, shape=shape, b0=data_start + b0, count=count):
                if count == 0:
                    return np.zeros(shape, dtype=np.float32 if dtype == "BF16" else _ST_NP[dtype])
                a = np.memmap(path, dtype=_ST_NP[dtype], mode="r", offset=b0, shape=(count,))
                a = np.array(a).reshape(shape)
                return bf16_to_float(a) if dtype == "BF16" else a
        out[name] = LazyTensor(shape, dtype, load, src)
    return out


_META_NAMES = [
    (r"tok_embeddings\.weight", "model.embed_tokens.weight"),
    (r"norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"layers\.(\d+)\.attention\.wq\.weight", r"model.layers.\1.self_attn.q_proj.weight"),
    (r"layers\.(\d+)\.attention\.wk\.weight", r"model.layers.\1.self_attn.k_proj.weight"),
    (r"layers\.(\d+)\.attention\.wv\.weight", r"model.layers.\1.self_attn.v_proj.weight"),
    (r"layers\.(\d+)\.attention\.wo\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.w1\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.w2\.weight", r"model.layers.\1.mlp.down_proj.weight"),
    (r"layers\.(\d+)\.feed_forward\.w3\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"layers\.(\d+)\.attention_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"layers\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
]


def _meta_to_hf(tensors: dict[str, LazyTensor]) -> dict[str, LazyTensor]:
    out = {}
    for k, v in tensors.items():
        for rx, rep in _META_NAMES:
            if re.fullmatch(rx, k):
                out[re.sub(rx, rep, k)] = v
                break
        else:
            out[k] = v
    return out


@dataclass
class Weights:
    tensors: dict[str, LazyTensor]      # HF names
    files: list[Path]
    qk_interleaved: bool                # Meta layout: Q/K rows are already in GGUF order


def load_weight_file(path: Path) -> dict[str, LazyTensor]:
    """The tensors of one .safetensors file or PyTorch file (.bin, .pt, .pth; read without torch), by name."""
    path = Path(path)
    return _load_safetensors(path) if path.suffix == ".safetensors" else load_state_dict(path)


def load_tensors(model_dir: Path) -> Weights:
    files = find_weight_files(model_dir)
    tensors: dict[str, LazyTensor] = {}
    for f in files:
        part = load_weight_file(f)
        dup = set(part) & set(tensors)
        if dup:
            raise ConversionError(f"{f}: tensor {sorted(dup)[0]!r} appears in more than one weight file")
        tensors.update(part)
    meta = "tok_embeddings.weight" in tensors
    if meta:
        tensors = _meta_to_hf(tensors)
    return Weights(tensors, files, meta)


# --------------------------------------------------------------------------------------
# vocabulary
# --------------------------------------------------------------------------------------
def load_vocab(model_dir: Path, n_vocab: int) -> Vocab:
    """SentencePiece pieces/scores/types (+ added_tokens.json), padded with user-defined
    ``[PAD{i}]`` tokens up to n_vocab (the embedding's row count)."""
    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.model"
    if not path.is_file():
        raise ConversionError(f"{model_dir}: no tokenizer.model (a SentencePiece vocabulary is required)")
    try:
        import sentencepiece as spm
    except ImportError:
        raise ConversionError("reading tokenizer.model needs the sentencepiece package "
                              "(pip install sentencepiece)") from None
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(path.read_bytes())
    except Exception as e:  # sentencepiece raises RuntimeError/OSError variants
        raise ConversionError(f"{path}: not a SentencePiece model ({type(e).__name__}: {e})") from None
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        t = TOKEN_NORMAL
        if sp.is_unknown(i):
            t = TOKEN_UNKNOWN
        if sp.is_control(i):
            t = TOKEN_CONTROL
        if sp.is_unused(i):
            t = TOKEN_UNUSED
        if sp.is_byte(i):
            t = TOKEN_BYTE
        types.append(t)

    added_path = model_dir / "added_tokens.json"
    if added_path.is_file():
        try:
            added = json.loads(added_path.read_text(encoding="utf-8"))
            items = sorted((int(i), str(t)) for t, i in added.items())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
            raise ConversionError(f"{added_path}: unreadable ({type(e).__name__}: {e})") from None
        items = [(i, t) for i, t in items if i >= len(tokens)]
        expected = list(range(len(tokens), len(tokens) + len(items)))
        if [i for i, _ in items] != expected:
            raise ConversionError(f"{added_path}: added token ids {[i for i, _ in items]} are not consecutive "
                                  f"from the SentencePiece vocabulary size {len(tokens)}")
        for _, t in items:
            tokens.append(t)
            scores.append(-1000.0)
            types.append(TOKEN_USER_DEFINED)

    if len(tokens) > n_vocab:
        raise ConversionError(f"{model_dir}: the tokenizer has {len(tokens)} tokens but the model's vocabulary "
                              f"(embedding rows) is {n_vocab}")
    if len(tokens) < n_vocab:
        log.info("padding the vocabulary from %d to %d tokens with [PADi]", len(tokens), n_vocab)
        for i in range(len(tokens), n_vocab):
            tokens.append(f"[PAD{i}]")
            scores.append(-1000.0)
            types.append(TOKEN_USER_DEFINED)

    def opt(v):
        return int(v) if v is not None and v >= 0 else None
    return Vocab(tokens, scores, types, bos_id=opt(sp.bos_id()), eos_id=opt(sp.eos_id()),
                 unk_id=opt(sp.unk_id()), pad_id=opt(sp.pad_id()))
