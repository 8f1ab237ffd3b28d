"""POST /slots/{id}?action=save|restore|erase (llama.cpp's slot save / restore, --slot-save-path) and the core's
sequence state under it (Context.kv_seq_state / kv_seq_set_state)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))
import powerinfer as pi  # noqa: E402
from make_test_model import write_model  # noqa: E402
from powerinfer.server.slot_files import valid_filename  # noqa: E402
from test_server import post, serve_model  # noqa: E402

# heads of 32 values: every cache type's blocks fit
SHAPE = dict(n_vocab=320, n_embd=128, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=1)
PROMPT = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("slotfiles") / "tiny-f32.gguf"
    write_model(path, dtype="f32", **SHAPE)
    return path


def _complete(base):
    r = post(base, "/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 3,
                                   "cache_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()


def v1_state(state: bytes) -> bytes:
    """A state (one cache type for K and V) in the layout of version 1 (kv_cache.c), which the core still reads."""
    import struct
    n_layer, type_k, type_v, _, n_embd_kv, k_row, v_row, n, _ = struct.unpack_from("<4i3q2i", state, 8)
    assert type_k == type_v and k_row == v_row
    return b"PIKVSEQ\x01" + struct.pack("<2i2q2i", n_layer, type_k, n_embd_kv, k_row, n, 0) + state[56:]


@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0", ("q4_0", "q5_1")], ids=str)
def test_sequence_state_round_trip(model_file, kv_type):
    """A sequence's state written into another context continues with the original's logits: bit for bit in the same
    cells, to f32 rounding beside another sequence or in given cells; states of another layout, truncated ones and
    cells held by another sequence are refused, changing nothing. A version-1 state (before K and V had types of
    their own) still reads."""
    m = pi.Model(model_file)
    toks = list(range(5, 30))
    a = pi.Context(m, n_ctx=64, n_seq_max=2, kv_type=kv_type)
    a.decode(toks[:20], logits="last")
    state = a.kv_seq_state(0)
    assert a.kv_state_positions(state).tolist() == list(range(20))
    assert a.kv_state_positions(a.kv_seq_state(0, 4, 9)).tolist() == [4, 5, 6, 7, 8]
    a.decode([toks[20]], pos=[20], logits="last")
    want = np.array(a.logits(0))
    b = pi.Context(m, n_ctx=64, n_seq_max=2, kv_type=kv_type)
    b.kv_seq_set_state(0, state)                              # the same cells as in a: the same bits
    b.decode([toks[20]], pos=[20], logits="last")
    assert np.array_equal(np.array(b.logits(0)), want)
    if isinstance(kv_type, str):
        b = pi.Context(m, n_ctx=64, n_seq_max=2, kv_type=kv_type)
        b.kv_seq_set_state(0, v1_state(state))
        b.decode([toks[20]], pos=[20], logits="last")
        assert np.array_equal(np.array(b.logits(0)), want)
    for cells in (None, range(30, 50)):   # other cells: the attention's tiles fall elsewhere, f32 rounding apart
        b = pi.Context(m, n_ctx=64, n_seq_max=2, kv_type=kv_type)
        b.decode([7, 8, 9], seq_id=1, logits="last")            # another sequence in cells 0-2
        b.kv_seq_set_state(0, state, cells=cells)
        assert b.kv_used == 23
        b.decode([toks[20]], pos=[20], logits="last")
        np.testing.assert_allclose(np.array(b.logits(0)), want, rtol=1e-5, atol=1e-5)
    k, v = (kv_type, kv_type) if isinstance(kv_type, str) else kv_type
    for other in ("f32" if k == "f16" else "f16", (k, "f32" if v == "f16" else "f16")):
        c = pi.Context(m, n_ctx=64, n_seq_max=2, kv_type=other)
        with pytest.raises(pi.PowerInferError, match=f"another KV layout .2 layers, K {k}, V {v}"):
            c.kv_seq_set_state(0, state)
    b = pi.Context(m, n_ctx=64, n_seq_max=2, kv_type=kv_type)
    b.decode([7, 8, 9], seq_id=1, logits="last")
    with pytest.raises(pi.PowerInferError, match="takes"):
        b.kv_seq_set_state(0, state[:-1])
    with pytest.raises(pi.PowerInferError, match="bad magic"):
        b.kv_seq_set_state(0, b"x" * len(state))
    with pytest.raises(pi.PowerInferError, match="holds another sequence"):
        b.kv_seq_set_state(0, state, cells=range(0, 20))
    with pytest.raises(pi.PowerInferError, match="cells given"):
        b.kv_seq_set_state(0, state, cells=range(10))
    assert b.kv_used == 3                                      # nothing changed by the refusals


def test_valid_filename():
    assert valid_filename("slot0.bin") and valid_filename("a b.bin")
    for bad in ("", ".", "..", "../x", "a/b", "a\\b", "x\x00", 5, None, "x" * 256):
        assert not valid_filename(bad), bad


def test_save_erase_restore(model_file, tmp_path):
    """A slot saved, erased and restored (also into another server) serves the same prompt from its cache with the
    same probabilities, bit for bit; a file whose KV rows were altered gives other ones, so the rows are used."""
    srv = serve_model(model_file, slot_save_path=str(tmp_path))
    try:
        first = _complete(srv.base)
        again = _complete(srv.base)
        n_cached = again["tokens_cached"]
        assert again["timings"]["cache_n"] > 0
        r = post(srv.base, "/slots/0?action=save", {"filename": "s0.bin"})
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "s0.bin" and saved["n_saved"] == n_cached
        assert saved["n_written"] == (tmp_path / "s0.bin").stat().st_size and "save_ms" in saved["timings"]
        r = post(srv.base, "/slots/0?action=erase")
        assert r.status_code == 200 and r.json() == {"id_slot": 0, "n_erased": n_cached}
        r = post(srv.base, "/slots/0?action=restore", {"filename": "s0.bin"})
        assert r.status_code == 200, r.text
        assert r.json()["n_restored"] == n_cached and r.json()["n_read"] == saved["n_written"]
        restored = _complete(srv.base)
        assert restored["timings"]["cache_n"] == again["timings"]["cache_n"]
        assert restored["content"] == first["content"]
        assert restored["completion_probabilities"] == first["completion_probabilities"]
    finally:
        srv.close()
    # a fresh server: the file alone brings the cache back
    srv = serve_model(model_file, slot_save_path=str(tmp_path))
    try:
        assert post(srv.base, "/slots/0?action=restore", {"filename": "s0.bin"}).status_code == 200
        fresh = _complete(srv.base)
        assert fresh["timings"]["cache_n"] == again["timings"]["cache_n"]
        assert fresh["completion_probabilities"] == first["completion_probabilities"]
        data = bytearray((tmp_path / "s0.bin").read_bytes())
        data[-4096:] = bytes(4096)                              # zero the last rows (the last layer's V)
        (tmp_path / "bad.bin").write_bytes(bytes(data))
        assert post(srv.base, "/slots/1?action=restore", {"filename": "bad.bin"}).status_code == 200
        post(srv.base, "/slots/0?action=erase")                 # so the request goes to slot 1
        altered = _complete(srv.base)
        assert altered["timings"]["cache_n"] == again["timings"]["cache_n"]
        assert altered["completion_probabilities"] != first["completion_probabilities"]
    finally:
        srv.close()


def test_slot_action_errors(model_file, tmp_path):
    srv = serve_model(model_file, slot_save_path=str(tmp_path))
    try:
        def err(path, body=None, status=400):
            r = post(srv.base, path, body)
            assert r.status_code == status, (path, r.status_code, r.text)
            return r.json()["error"]
        assert "Invalid action" in err("/slots/0?action=dump", {"filename": "a"})["message"]
        assert "Invalid slot ID" in err("/slots/7?action=erase")["message"]
        assert "Invalid slot ID" in err("/slots/x?action=erase")["message"]
        assert "Invalid filename" in err("/slots/0?action=save", {"filename": "../a"})["message"]
        assert "Invalid filename" in err("/slots/0?action=save", {})["message"]
        assert err("/slots/0?action=restore", {"filename": "none.bin"}, 404)["type"] == "not_found_error"
        (tmp_path / "junk.bin").write_bytes(b"not a slot file")
        assert "not a slot file" in err("/slots/0?action=restore", {"filename": "junk.bin"})["message"]
    finally:
        srv.close()
    srv = serve_model(model_file)                                    # no --slot-save-path
    try:
        r = post(srv.base, "/slots/0?action=save", {"filename": "a.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
        assert post(srv.base, "/slots/0?action=erase").status_code == 200
    finally:
        srv.close()


def test_restore_refuses_another_model(model_file, tmp_path):
    other = tmp_path / "other.gguf"
    write_model(other, dtype="f32", **{**SHAPE, "n_layer": 3})
    a = serve_model(other, slot_save_path=str(tmp_path))
    try:
        _complete(a.base)
        assert post(a.base, "/slots/0?action=save", {"filename": "o.bin"}).status_code == 200
    finally:
        a.close()
    b = serve_model(model_file, slot_save_path=str(tmp_path))
    try:
        r = post(b.base, "/slots/0?action=restore", {"filename": "o.bin"})
        assert r.status_code == 400 and "not a slot file of this server's model" in r.json()["error"]["message"]
    finally:
        b.close()
