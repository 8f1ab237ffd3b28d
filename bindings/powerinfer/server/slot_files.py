"""POST /slots/{id}?action=save|restore|erase: llama.cpp's slot save / restore (`--slot-save-path DIR`).

save writes the tokens idle slot `id` holds as its prompt cache and the KV rows of their positions to DIR/filename
(the request's `{"filename": ...}`); restore reads such a file into an idle slot, so that a request starting with
those tokens reuses them without evaluating them again (bit for bit: the rows are the ones the model computed);
erase forgets a slot's prompt cache. Responses are llama.cpp's: `{id_slot, filename, n_saved, n_written, timings:
{save_ms}}`, `{id_slot, filename, n_restored, n_read, timings: {restore_ms}}`, `{id_slot, n_erased}`.

File format: powerinfer.state_file (shared with main.py's --prompt-cache).
"""
from __future__ import annotations

import time
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from ..request import RequestError
from ..state_file import StateFileError, read_state_file, write_state_file
from .protocol import JSON, error_response, read_json


def valid_filename(name) -> bool:
    """A plain file name (llama.cpp's rule): no directory part, not . or .., no control characters."""
    return (isinstance(name, str) and 0 < len(name.encode("utf-8")) <= 255 and name not in (".", "..")
            and not any(c in name for c in "/\\") and not any(ord(c) < 32 or ord(c) == 127 for c in name))


def write_slot_file(path: Path, llm, tokens: list[int], state: bytes) -> int:
    return write_state_file(path, llm.model, tokens, state)


def read_slot_file(path: Path, llm) -> tuple[list[int], bytes, int]:
    try:
        return read_state_file(path, llm.model)
    except FileNotFoundError:
        raise RequestError(f"slot file {path.name!r} not found", code=404, status=404, type="not_found_error") from None
    except StateFileError:
        raise RequestError(f"{path.name!r} is not a slot file of this server's model") from None
    except OSError as e:
        raise RequestError(f"cannot read slot file {path.name!r}: {e.strerror}") from None


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
