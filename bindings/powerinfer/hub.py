"""Model download from the Hugging Face Hub for the examples: ``-hf REPO [-hff FILE]``.

    python examples/main.py -hf PowerInfer/ReluLLaMA-7B-PowerInfer-GGUF -p "Once upon a time"
    python examples/main.py -hf owner/repo:q4_0          # the one model file whose name contains "q4_0"
    python examples/main.py -hf owner/repo -hff model.q8_0.gguf

``resolve_model(args)`` turns the ``-m`` / ``-hf`` / ``-hff`` options that ``add_model_args(parser)``
adds into a local file path:

* ``-m FILE``: the file, as given.
* ``-hf OWNER/NAME[:TAG]``: list the repository's files (``huggingface_hub.HfApi.model_info``) and
  pick the model file: ``--hf-file`` if given (a path in the repo or a unique base name), else the single
  ``*.powerinfer.gguf`` file, else the single ``*.gguf`` file (a ``:TAG`` first keeps only the files whose
  name contains TAG, case-insensitively, like llama.cpp's ``-hf user/repo:quant``); anything else is an
  error that lists the candidates. The file is then downloaded with ``snapshot_download(allow_patterns=
  [FILE, "activation/*"])`` into the standard Hugging Face cache (``$HF_HUB_CACHE``, default
  ``~/.cache/huggingface/hub``), together with the repository's ``activation/`` folder when it has one
  (PowerInfer's layout: ``*.powerinfer.gguf`` next to ``activation/activation_N.pt``), and the returned
  path is the file inside the cache snapshot, so ``activation/`` sits next to it.
* Offline (``HF_HUB_OFFLINE=1``), or when the Hub cannot be reached or answers with an error, the same
  choice is made from the cached snapshot of the revision (``refs/<revision>`` ->
  ``snapshots/<commit>/``) and the file is taken with ``hf_hub_download(local_files_only=True)``.
  When nothing usable is cached, ``HubError`` carries one line that says why; the examples print it
  as ``error: ...`` and exit with status 1.

``huggingface_hub`` is only imported when ``-hf`` is used (``pip install huggingface_hub``).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterable

__all__ = ["HubError", "add_model_args", "resolve_model", "resolve_hf", "pick_model_file", "parse_repo"]

_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "on", "yes", "true"}


class HubError(Exception):
    """A model could not be resolved; str() is one line meant for the user."""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(exc: BaseException) -> str:
    msg = _one_line(str(exc), 200)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


# ----------------------------------------------------------------------------------------- arguments
BUNDLED_MODEL = Path("models") / "tinyrelu" / "tinyrelu.powerinfer.gguf"


def bundled_model() -> str | None:
    """The project's bundled sparse model (models/tinyrelu/, see models/README.md), found next to a
    source checkout of the package or under the current directory; None when neither has it."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / BUNDLED_MODEL).is_file():
            return str(root / BUNDLED_MODEL)
    return None


def add_model_args(parser: argparse.ArgumentParser, *, default: str | None = None,
                   model_flags: Iterable[str] = ("-m", "--model")) -> None:
    """Add -m/--model, -hf/--hf-repo and -hff/--hf-file to parser (model default: `default`)."""
    g = parser.add_argument_group("model")
    g.add_argument(*model_flags, dest="model", default=None,
                   help="model path (GGUF)" + (f" (default: {default})" if default else ""))
    g.add_argument("-hf", "--hf-repo", dest="hf_repo", default=None, metavar="OWNER/NAME[:TAG]",
                   help="download the model from this Hugging Face repository (cached; works offline "
                        "from the cache); TAG keeps only the model files whose name contains it")
    g.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                   help="the file to use from the -hf repository (default: its single *.powerinfer.gguf, "
                        "else its single *.gguf)")
    parser.set_defaults(_model_default=default)


def resolve_model(args: argparse.Namespace, *, log: Callable[[str], None] | None = None) -> Path:
    """The local model path for parsed arguments of add_model_args. Raises HubError."""
    repo = getattr(args, "hf_repo", None)
    hf_file = getattr(args, "hf_file", None)
    model = getattr(args, "model", None)
    if repo:
        if model:
            raise HubError("give either -m/--model or -hf/--hf-repo, not both")
        return resolve_hf(repo, hf_file, log=log)
    if hf_file:
        raise HubError("--hf-file needs -hf/--hf-repo")
    model = model or getattr(args, "_model_default", None)
    if not model:
        raise HubError(f"no model given (use -m FILE or -hf OWNER/NAME; the bundled default {BUNDLED_MODEL} "
                       "is not in this directory)")
    if Path(model).is_dir():
        found = sorted(p.name for p in Path(model).glob("*.gguf"))[:5]
        raise HubError(f"-m {model}: is a directory, not a model file"
                       + (f" (GGUF files in it: {', '.join(found)})" if found else " (no .gguf file in it)"))
    return Path(model)


# ------------------------------------------------------------------------------------- file choice
def parse_repo(spec: str) -> tuple[str, str | None]:
    """'owner/name[:tag]' -> ('owner/name', tag or None); also accepts a https://huggingface.co/ URL."""
    s = spec.strip()
    for prefix in ("https://huggingface.co/", "http://huggingface.co/", "hf://"):
        if s.startswith(prefix):
            s = s[len(prefix):].rstrip("/")
    tag = None
    if ":" in s:
        s, tag = s.split(":", 1)
        tag = tag or None
    if not _REPO_RE.match(s) or "--" in s or ".." in s:
        raise HubError(f"-hf: '{spec}' is not a repository id of the form OWNER/NAME[:TAG]")
    return s, tag


def _listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def pick_model_file(files: Iterable[str], hf_file: str | None = None, tag: str | None = None,
                    repo: str = "the repository") -> str:
    """Choose the model file among a repository's files (see the module docstring)."""
    files = sorted(set(files))
    if hf_file:
        want = hf_file.strip("/")
        if want in files:
            return want
        if any(c in want for c in "*?["):      # a glob, as llama-cpp-python's from_pretrained takes
            import fnmatch
            hits = [f for f in files if fnmatch.fnmatch(f, want) or fnmatch.fnmatch(f.rsplit("/", 1)[-1], want)]
            if len(hits) == 1:
                return hits[0]
            raise HubError(f"{repo} has {len(hits)} files matching '{hf_file}'" + (f": {_listing(hits)}" if hits else ""))
        same = [f for f in files if f.rsplit("/", 1)[-1] == want]
        if len(same) == 1:
            return same[0]
        ggufs = [f for f in files if f.endswith(".gguf")]
        raise HubError(f"{repo} has {'several files named' if same else 'no file'} '{hf_file}'"
                       + (f" ({_listing(same)})" if same else f" (GGUF files: {_listing(ggufs) or 'none'})"))
    ggufs = [f for f in files if f.endswith(".gguf") and "/activation/" not in f"/{f}"]
    if tag:
        tagged = [f for f in ggufs if tag.lower() in f.rsplit("/", 1)[-1].lower()]
        if not tagged:
            raise HubError(f"{repo} has no GGUF file matching ':{tag}' (GGUF files: {_listing(ggufs) or 'none'})")
        ggufs = tagged
    sparse = [f for f in ggufs if f.endswith(".powerinfer.gguf")]
    for group, kind in ((sparse, "*.powerinfer.gguf"), (ggufs, "*.gguf")):
        if len(group) == 1:
            return group[0]
        if len(group) > 1:
            raise HubError(f"{repo} has several {kind} files, choose one with --hf-file "
                           f"(or OWNER/NAME:TAG): {_listing(group)}")
    raise HubError(f"{repo} has no .gguf file (files: {_listing(files) or 'none'})")


def _activation_prefix(model_file: str) -> str:
    d = model_file.rsplit("/", 1)[0] + "/" if "/" in model_file else ""
    return d + "activation/"


# ------------------------------------------------------------------------------------------- cache
def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _cache_dir(explicit) -> Path:
    if explicit is not None:
        return Path(explicit).expanduser()
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE).expanduser()


def _cached_snapshot(cache: Path, repo: str, revision: str) -> tuple[Path, list[str]] | None:
    """(snapshot folder, files in it) of repo@revision in the cache, or None."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    commit = revision if _COMMIT_RE.match(revision) else None
    if commit is None:
        try:
            commit = (storage / "refs" / revision).read_text().strip()
        except OSError:
            return None
    snap = storage / "snapshots" / commit
    if not snap.is_dir():
        return None
    files = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())
    return snap, files


# ------------------------------------------------------------------------------------------ resolve
def resolve_hf(spec: str, hf_file: str | None = None, *, revision: str | None = None, cache_dir=None,
               endpoint: str | None = None, token=None, offline: bool | None = None,
               log: Callable[[str], None] | None = None) -> Path:
    """Local path of the model file of Hub repository `spec` (OWNER/NAME[:TAG]), downloading it
    (and the repository's activation/ folder) into the Hugging Face cache when needed. HubError
    (one line) when it cannot be done."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    repo, tag = parse_repo(spec)
    try:
        import huggingface_hub as hf
        from huggingface_hub import constants
    except ImportError:
        raise HubError("-hf needs the huggingface_hub package: pip install huggingface_hub") from None
    revision = revision or "main"
    cache = _cache_dir(cache_dir)
    if offline is None:
        offline = bool(getattr(constants, "HF_HUB_OFFLINE", False)) or _env_true("HF_HUB_OFFLINE")
    ep = (endpoint or getattr(constants, "ENDPOINT", None) or "https://huggingface.co").rstrip("/")
    kw = {"cache_dir": str(cache), "revision": revision}
    if endpoint:
        kw["endpoint"] = endpoint
    if token is not None:
        kw["token"] = token

    why_offline = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else None
    if not offline:
        try:
            # model_info: one request, no retry loop (list_repo_files retries a dead connection for ~25 s)
            info = hf.HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision)
            files = [s.rfilename for s in (info.siblings or [])]
        except Exception as e:           # connection refused, timeout, offline, 4xx/5xx: try the cache
            why_offline = _hub_failure(e, repo, ep)
        else:
            name = pick_model_file(files, hf_file, tag, repo)
            act = _activation_prefix(name)
            patterns = [name] + ([act + "*"] if any(f.startswith(act) for f in files) else [])
            try:
                folder = hf.snapshot_download(repo, allow_patterns=patterns, **kw)
            except Exception as e:
                why_offline = _hub_failure(e, repo, ep)
            else:
                path = Path(folder) / name
                n_act = sum(1 for f in files if f.startswith(act))
                log(f"hub: {repo}: {name}" + (f" + {n_act} activation files" if n_act else "")
                    + f" in {folder}")
                return path

    # offline, or the Hub failed: the cached snapshot of this revision
    snap = _cached_snapshot(cache, repo, revision)
    if snap is None:
        raise HubError(f"cannot get {repo}: {why_offline}, and it is not in the Hugging Face cache ({cache})")
    folder, files = snap
    try:
        name = pick_model_file(files, hf_file, tag, f"{repo} (cached)")
    except HubError as e:
        raise HubError(f"{e}; {why_offline}") from None
    try:
        path = Path(hf.hf_hub_download(repo, name, local_files_only=True, **kw))
    except Exception as e:
        raise HubError(f"cannot get {repo}/{name}: {why_offline}, and the cached copy is unusable "
                       f"({_reason(e)})") from None
    act = _activation_prefix(name)
    n_act = sum(1 for f in files if f.startswith(act))
    log(f"hub: {repo}: {name}" + (f" + {n_act} activation files" if n_act else "")
        + f" from the cache ({why_offline}) in {folder}")
    return path


def _hub_failure(exc: Exception, repo: str, endpoint: str) -> str:
    """A short reason for a failed Hub call (the caller then looks in the cache)."""
    name = type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if name in ("OfflineModeIsEnabled",):
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return f"the Hub at {endpoint} has no repository {repo} you can access (HTTP {status})" if status \
            else f"the Hub at {endpoint} has no repository {repo} you can access"
    if name == "RevisionNotFoundError":
        return f"the Hub at {endpoint} has no such revision of {repo}"
    if status:
        return f"the Hub at {endpoint} answered HTTP {status}"
    return f"the Hugging Face Hub at {endpoint} cannot be reached ({_reason(exc)})"
