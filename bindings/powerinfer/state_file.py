"""A sequence's tokens and KV rows in a file: the server's slot files (POST /slots/N?action=save|restore) and
main.py's --prompt-cache use this one format.

File: magic b"PISLOT\\0\\1", uint32 length of a JSON header (model name, n_vocab, n_layer, n_tokens), the header, the
n_tokens token ids (int32 little-endian), then the KV state (Context.kv_seq_state: positions 0..n_tokens-1). A file
of another model is refused (its header here, then the core's check of the KV layout: layers, width, type).
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

MAGIC = b"PISLOT\x00\x01"

__all__ = ["MAGIC", "StateFileError", "read_state_file", "write_state_file"]


class StateFileError(ValueError):
    """The file is not a state file of this model."""


def _model_header(model) -> dict:
    return {"model": Path(model.path).name, "n_vocab": int(model.n_vocab), "n_layer": int(model.hparams.n_layer)}


def write_state_file(path: Path, model, tokens: list[int], state: bytes) -> int:
    """Write tokens and their KV state (atomically: never a half-written file under the name); returns the bytes
    written. OSError when it cannot be written."""
    path = Path(path)
    if any(t < 0 for t in tokens):   # powerinfer.multimodal's image rows: their embeddings are not in the file
        raise ValueError("a sequence holding an image cannot be saved to a state file (image rows are not tokens)")
    header = json.dumps({**_model_header(model), "n_tokens": len(tokens)}).encode()
    body = MAGIC + struct.pack("<I", len(header)) + header + np.asarray(tokens, "<i4").tobytes() + state
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)
    return len(body)


def read_state_file(path: Path, model) -> tuple[list[int], bytes, int]:
    """(tokens, KV state, bytes read) of a state file of `model`; FileNotFoundError / OSError when it cannot be
    read, StateFileError when it is not such a file."""
    path = Path(path)
    data = path.read_bytes()
    bad = StateFileError(f"{path.name!r} is not a state file of this model")
    if len(data) < len(MAGIC) + 4 or data[:len(MAGIC)] != MAGIC:
        raise bad
    (n_header,) = struct.unpack_from("<I", data, len(MAGIC))
    at = len(MAGIC) + 4 + n_header
    try:
        header = json.loads(data[len(MAGIC) + 4:at])
        n = int(header["n_tokens"])
    except (ValueError, KeyError, TypeError):
        raise bad from None
    want = _model_header(model)
    if not isinstance(header, dict) or any(header.get(k) != want[k] for k in ("n_vocab", "n_layer")) or n < 0 \
            or len(data) < at + 4 * n:
        raise bad
    tokens = np.frombuffer(data, "<i4", count=n, offset=at).tolist()
    return tokens, data[at + 4 * n:], len(data)
