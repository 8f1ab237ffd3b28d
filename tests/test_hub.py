"""-hf model resolution (powerinfer.hub): the Hugging Face cache layout, offline use, a local fake Hub,
and the one-line error when the Hub cannot be reached and nothing is cached."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from make_test_model import write_model  # noqa: E402
from powerinfer import hub  # noqa: E402

REPO = "owner/tiny-PowerInfer-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("hubmodel") / "tiny.gguf"
    write_model(path, dtype="q8_0", n_vocab=320, n_embd=64, n_ff=160, n_head=4, n_head_kv=2, n_layer=2, seed=2)
    return path.read_bytes()


def fill_cache(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT) -> Path:
    """Write repo@commit the way huggingface_hub does: blobs/<hash>, snapshots/<commit>/<path> -> symlink
    to the blob, refs/main holding the commit. Returns the snapshot folder."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snap = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return snap


def pi_files(model_bytes) -> dict[str, bytes]:
    return {"tiny.powerinfer.gguf": model_bytes, "activation/activation_0.pt": b"act0",
            "activation/activation_1.pt": b"act1", "README.md": b"# tiny\n"}


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def env_for(cache: Path, home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(home), HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=str(ROOT / "bindings") + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    return env


# ------------------------------------------------------------------------------------- resolution
def test_offline_resolution_from_prefilled_cache(tmp_path, model_bytes):
    cache = tmp_path / "hub"
    snap = fill_cache(cache, REPO, pi_files(model_bytes))
    logs = []
    path = hub.resolve_hf(REPO, cache_dir=cache, offline=True, log=logs.append)
    assert path == snap / "tiny.powerinfer.gguf" and path.read_bytes() == model_bytes
    assert (path.parent / "activation" / "activation_1.pt").read_bytes() == b"act1"
    assert len(logs) == 1 and "from the cache" in logs[0] and "2 activation files" in logs[0]
    assert hub.resolve_hf(REPO, "tiny.powerinfer.gguf", cache_dir=cache, offline=True, log=logs.append) == path
    with pytest.raises(hub.HubError, match="no file 'nope.gguf'"):
        hub.resolve_hf(REPO, "nope.gguf", cache_dir=cache, offline=True, log=logs.append)
    with pytest.raises(hub.HubError, match="offline mode is on.*not in the Hugging Face cache"):
        hub.resolve_hf("owner/other", cache_dir=cache, offline=True, log=logs.append)


def test_unreachable_hub_falls_back_to_cache(tmp_path, model_bytes):
    cache = tmp_path / "hub"
    snap = fill_cache(cache, REPO, pi_files(model_bytes))
    logs = []
    path = hub.resolve_hf(REPO, cache_dir=cache, endpoint=f"http://127.0.0.1:{closed_port()}", offline=False,
                          log=logs.append)
    assert path == snap / "tiny.powerinfer.gguf" and "cannot be reached" in logs[0]


def test_pick_model_file():
    pick = hub.pick_model_file
    assert pick(["a.powerinfer.gguf", "a.gguf", "activation/activation_0.pt"]) == "a.powerinfer.gguf"
    assert pick(["README.md", "m-q8_0.gguf"]) == "m-q8_0.gguf"
    assert pick(["m-q8_0.gguf", "m-q4_0.gguf"], tag="Q4_0") == "m-q4_0.gguf"
    assert pick(["x.q4.powerinfer.gguf", "x.powerinfer.gguf"], hf_file="x.powerinfer.gguf") == "x.powerinfer.gguf"
    assert pick(["sub/x.gguf", "y.gguf"], hf_file="x.gguf") == "sub/x.gguf"
    with pytest.raises(hub.HubError, match=r"several \*\.powerinfer\.gguf files.*--hf-file.*a\.powerinfer\.gguf, "
                                           r"a\.q4\.powerinfer\.gguf"):
        pick(["a.powerinfer.gguf", "a.q4.powerinfer.gguf"])
    with pytest.raises(hub.HubError, match="no .gguf file"):
        pick(["README.md", "model.safetensors"])
    with pytest.raises(hub.HubError, match="no GGUF file matching ':q5'"):
        pick(["m-q8_0.gguf"], tag="q5")
    assert hub.parse_repo("owner/name:Q4_0") == ("owner/name", "Q4_0")
    assert hub.parse_repo("https://huggingface.co/owner/name") == ("owner/name", None)
    for bad in ("owner", "a/b/c", "owner/na me", "../x"):
        with pytest.raises(hub.HubError, match="not a repository id"):
            hub.parse_repo(bad)


def test_model_arguments():
    p = argparse.ArgumentParser()
    hub.add_model_args(p, default="models/default.gguf")
    assert hub.resolve_model(p.parse_args([])) == Path("models/default.gguf")
    assert hub.resolve_model(p.parse_args(["-m", "x.gguf"])) == Path("x.gguf")
    with pytest.raises(hub.HubError, match="either -m"):
        hub.resolve_model(p.parse_args(["-m", "x.gguf", "-hf", "a/b"]))
    with pytest.raises(hub.HubError, match="needs -hf"):
        hub.resolve_model(p.parse_args(["-hff", "x.gguf"]))
    a = p.parse_args(["-hf", "a/b", "-hff", "f.gguf"])
    assert (a.hf_repo, a.hf_file) == ("a/b", "f.gguf")


# ------------------------------------------------------------------------------------ a fake Hub
class FakeHub:
    """The few Hub routes huggingface_hub's model_info / snapshot_download / hf_hub_download use."""

    def __init__(self, repos: dict[str, dict[str, bytes]], commit: str = COMMIT):
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", headers=None, head=False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, obj):
                self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _handle(self, head):
                owner.requests.append(f"{self.command} {self.path}")
                parts = unquote(urlparse(self.path).path).strip("/").split("/")
                if parts[:2] == ["api", "models"]:
                    repo, rest = "/".join(parts[2:4]), parts[4:]
                    if repo not in repos:
                        return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    files = repos[repo]
                    if not rest or rest[0] == "revision":
                        return self._json({"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]})
                    if rest[0] == "tree":
                        return self._json([{"type": "file", "path": f, "size": len(d),
                                            "oid": hashlib.sha1(d).hexdigest()} for f, d in files.items()])
                elif len(parts) >= 5 and parts[2] == "resolve":
                    data = repos.get("/".join(parts[:2]), {}).get("/".join(parts[4:]))
                    if data is not None:
                        return self._send(200, data, {"X-Repo-Commit": commit,
                                                      "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}, head)
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                return self._send(404)

            def do_GET(self):
                self._handle(False)

            def do_HEAD(self):
                self._handle(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_download_from_fake_hub_then_offline(tmp_path, model_bytes):
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        pytest.skip("HF_HUB_OFFLINE is set for this test run")
    files = {**pi_files(model_bytes), "tiny.q4.gguf": b"other", "sub/activation/activation_0.pt": b"no"}
    fake = FakeHub({REPO: files})
    cache = tmp_path / "hub"
    logs = []
    try:
        path = hub.resolve_hf(REPO, cache_dir=cache, endpoint=fake.url, offline=False, log=logs.append)
        with pytest.raises(hub.HubError, match="no repository owner/missing"):
            hub.resolve_hf("owner/missing", cache_dir=cache, endpoint=fake.url, offline=False, log=logs.append)
    finally:
        fake.close()
    snap = cache / "models--owner--tiny-PowerInfer-GGUF" / "snapshots" / COMMIT
    assert path == snap / "tiny.powerinfer.gguf" and path.read_bytes() == model_bytes
    got = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())
    assert got == ["activation/activation_0.pt", "activation/activation_1.pt", "tiny.powerinfer.gguf"]
    assert (cache / "models--owner--tiny-PowerInfer-GGUF" / "refs" / "main").read_text().strip() == COMMIT
    assert not any("README" in r or "tiny.q4" in r for r in fake.requests)
    # the Hub is gone now: the same call is served from the cache, and so is an offline one
    assert hub.resolve_hf(REPO, cache_dir=cache, endpoint=fake.url, offline=False, log=logs.append) == path
    assert hub.resolve_hf(REPO, cache_dir=cache, offline=True, log=logs.append) == path


# ----------------------------------------------------------------------------- the examples, end to end
def test_main_runs_offline_from_cache(tmp_path, model_bytes):
    cache = tmp_path / "hub"
    fill_cache(cache, REPO, pi_files(model_bytes))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "main.py"), "-hf", REPO, "-p", "Once upon",
                        "-n", "4", "-t", "1", "--temp", "0", "--ignore-eos"],
                       capture_output=True, text=True, timeout=60, env=env_for(cache, tmp_path, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon") and len(r.stdout) > len("Once upon")
    assert "from the cache (offline mode is on" in r.stderr


def test_unreachable_hub_nothing_cached_is_one_error_line(tmp_path):
    cache = tmp_path / "empty-cache"
    env = env_for(cache, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "main.py"), "-hf", REPO, "-p", "x", "-n", "2"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: cannot get {REPO}: the Hugging Face Hub at http://127.0.0.1:")
    assert "cannot be reached" in lines[0] and "not in the Hugging Face cache" in lines[0]
    assert "Traceback" not in r.stderr
