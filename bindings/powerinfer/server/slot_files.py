"""POST /slots/{id}?action=save|restore|erase: llama.cpp's slot save / restore (`--slot-save-path DIR`).

save writes the tokens idle slot `id` holds as its prompt cache and the KV rows of their positions to DIR/filename
(the request's `{"filename": ...}`); restore reads such a file into an idle slot, so that a request starting with
those tokens reuses them without evaluating them again (bit for bit: the rows are the ones the model computed);
erase forgets a slot's prompt cache. Responses are llama.cpp's: `{id_slot, filename, n_saved, n_written, timings:
{save_ms}}`, `{id_slot, filename, n_restored, n_read, timings: {restore_ms}}`, `{id_slot, n_erased}`.

File: magic b"PISLOT\\0\\1", uint32 length of a JSON header (model name, n_vocab, n_layer, n_tokens), the header, the
n_tokens token ids (int32 little-endian), then the KV state (Context.kv_seq_state). A file of another model is
refused (its header, then the core's check of the KV layout: layers, width, type).
"""
from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from ..request import RequestError
from .protocol import JSON, error_response, read_json

MAGIC = b"PISLOT\x00\x01"


def valid_filename(name) -> bool:
    """A plain file name (llama.cpp's rule): no directory part, not . or .., no control characters."""
    return (isinstance(name, str) and 0 < len(name.encode("utf-8")) <= 255 and name not in (".", "..")
            and not any(c in name for c in "/\\") and not any(ord(c) < 32 or ord(c) == 127 for c in name))


def _model_header(llm) -> dict:
    m = llm.model
    return {"model": Path(llm.model_path).name, "n_vocab": int(m.n_vocab), "n_layer": int(m.hparams.n_layer)}


def write_slot_file(path: Path, llm, tokens: list[int], state: bytes) -> int:
    header = json.dumps({**_model_header(llm), "n_tokens": len(tokens)}).encode()
    body = MAGIC + struct.pack("<I", len(header)) + header + np.asarray(tokens, "<i4").tobytes() + state
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)   # never a half-written slot file under the name
    return len(body)


def read_slot_file(path: Path, llm) -> tuple[list[int], bytes, int]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RequestError(f"slot file {path.name!r} not found", code=404, status=404, type="not_found_error") from None
    except OSError as e:
        raise RequestError(f"cannot read slot file {path.name!r}: {e.strerror}") from None
    bad = RequestError(f"{path.name!r} is not a slot file of this server's model")
    if len(data) < len(MAGIC) + 4 or data[:len(MAGIC)] != MAGIC:
        raise bad
    (n_header,) = struct.unpack_from("<I", data, len(MAGIC))
    at = len(MAGIC) + 4 + n_header
    try:
        header = json.loads(data[len(MAGIC) + 4:at])
        n = int(header["n_tokens"])
    except (ValueError, KeyError, TypeError):
        raise bad from None
    want = _model_header(llm)
    if not isinstance(header, dict) or any(header.get(k) != want[k] for k in ("n_vocab", "n_layer")) or n < 0 \
            or len(data) < at + 4 * n:
        raise bad
    tokens = np.frombuffer(data, "<i4", count=n, offset=at).tolist()
    return tokens, data[at + 4 * n:], len(data)


def routes(state) -> list[Route]:

    async def slot_action(request: Request):
        llm = state.require()
        try:
            sid = int(request.path_params["id_slot"])
        except ValueError:
            raise RequestError("Invalid slot ID", param="id_slot") from None
        action = request.query_params.get("action", "")
        engine = llm.engine
        if action == "erase":
            n = await run_in_threadpool(engine.erase_slot, sid)
            return JSON({"id_slot": sid, "n_erased": n})
        if action not in ("save", "restore"):
            raise RequestError(f"Invalid action {action!r}: save, restore or erase", param="action")
        if not state.slot_save_path:
            return error_response(501, "This server does not support slots action. Start it with `--slot-save-path`",
                                  "not_supported_error", 501)
        body = await read_json(request, state)
        filename = body.get("filename")
        if not valid_filename(filename):
            raise RequestError("Invalid filename", param="filename")
        path = Path(state.slot_save_path) / filename
        t0 = time.perf_counter()
        if action == "save":
            def save():
                tokens, kv = engine.slot_state(sid)
                return len(tokens), write_slot_file(path, llm, tokens, kv)
            try:
                n, written = await run_in_threadpool(save)
            except OSError as e:
                raise RequestError(f"cannot write slot file {filename!r}: {e.strerror}", code=500, status=500,
                                   type="server_error") from None
            return JSON({"id_slot": sid, "filename": filename, "n_saved": n, "n_written": written,
                         "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})

        def restore():
            tokens, kv, n_read = read_slot_file(path, llm)
            engine.restore_slot_state(sid, tokens, kv)
            return len(tokens), n_read
        n, n_read = await run_in_threadpool(restore)
        return JSON({"id_slot": sid, "filename": filename, "n_restored": n, "n_read": n_read,
                     "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})

    return [Route("/slots/{id_slot}", slot_action, methods=["POST"])]
