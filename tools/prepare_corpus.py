#!/usr/bin/env python3
"""Make the English training corpus of the bundled model from an offline, permissively
licensed source: the reStructuredText sources of the Python 3.11 documentation as shipped by
Debian's ``python3.11-doc`` package (``/usr/share/doc/python3.11/html/_sources/**.rst.txt``;
the Python documentation is under the PSF License Version 2, its code examples also under the
Zero-Clause BSD licence; see data/README.md).

    python tools/prepare_corpus.py [--deb FILE.deb | --src DIR] [--out data/corpus]
        [--heldout data/heldout.txt] [--heldout-bytes 81920]

Source: with neither --deb nor --src the script runs ``apt-get download python3.11-doc`` into
a temporary directory (Debian's registry is reachable from the project's machines; no install,
no root needed for the download itself) and unpacks it with ``dpkg-deb -x``. The package
version is printed and written to OUT/SOURCE.txt; the bundled model was made from
``python3.11-doc 3.11.2-6+deb12u9`` (Debian 12).

Cleaning (rst -> plain prose, deterministic, no randomness): code blocks (``::`` literal
blocks, code-block/doctest/productionlist/... directives, ``>>>`` sessions), tables, comments,
index/toctree/module directives and section underlines are dropped; the bodies of note/warning/
versionchanged/function/class/... directives are kept as prose; inline markup is reduced to
its text (``:func:`~os.path.join``` -> ``join``, ````x```` -> ``x``, ```text <url>`_`` ->
``text``). Every paragraph becomes one line; paragraphs of fewer than 4 words or with too few
letters are dropped; the paragraphs of one document are separated by one newline, documents
by an empty line. Documents are ordered by their path.

Split: documents are ordered by sha1(relative path); documents of 2-40 KB of prose are taken
in that order into the held-out set until it holds --heldout-bytes; everything else is the
training set. Outputs: OUT/train.txt, OUT/heldout.txt (and a copy at --heldout, the file that
is committed), OUT/SOURCE.txt. The same package version gives byte-identical files.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

PKG = "python3.11-doc"
SRC_SUBDIR = "usr/share/doc/python3.11/html/_sources"

# directives whose body is kept as prose (the directive line itself is dropped)
KEEP_BODY = {
    "note", "warning", "seealso", "versionadded", "versionchanged", "deprecated",
    "deprecated-removed", "impl-detail", "attention", "caution", "important", "tip", "hint",
    "admonition", "topic", "sidebar", "rubric", "function", "method", "class", "attribute",
    "data", "exception", "describe", "decorator", "decoratormethod", "classmethod",
    "staticmethod", "abstractmethod", "coroutinefunction", "coroutinemethod", "opcode",
    "cmdoption", "option", "envvar", "pdbcommand", "c:function", "c:type", "c:member",
    "c:macro", "c:var", "c:struct", "c:union", "c:enum", "c:enumerator", "c:data",
    "glossary", "availability", "only", "container", "centered", "epigraph", "highlights",
    "pull-quote", "versionremoved",
}


def log(msg: str) -> None:
    print(f"prepare_corpus: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------------------
# source
# --------------------------------------------------------------------------------------

def deb_version(deb: str) -> str:
    try:
        out = subprocess.run(["dpkg-deb", "-f", deb, "Package", "Version"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"prepare_corpus: error: cannot read {deb}: {e}")
    return " ".join(line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line)


def fetch_deb(tmp: str) -> str:
    log(f"apt-get download {PKG}")
    try:
        subprocess.run(["apt-get", "download", PKG], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"prepare_corpus: error: apt-get download {PKG} failed ({e}); "
                         f"pass --deb FILE or --src DIR (run 'apt-get update' first?)")
    debs = sorted(f for f in os.listdir(tmp) if f.endswith(".deb"))
    if not debs:
        raise SystemExit(f"prepare_corpus: error: no .deb downloaded for {PKG}")
    return os.path.join(tmp, debs[0])


def extract_deb(deb: str, tmp: str) -> str:
    dest = os.path.join(tmp, "x")
    subprocess.run(["dpkg-deb", "-x", deb, dest], check=True)
    src = os.path.join(dest, SRC_SUBDIR)
    if not os.path.isdir(src):
        raise SystemExit(f"prepare_corpus: error: {deb} has no {SRC_SUBDIR}")
    return src


# --------------------------------------------------------------------------------------
# rst -> prose
# --------------------------------------------------------------------------------------

_ROLE = re.compile(r":[\w:.+-]+:`([^`]*)`")
_LINK = re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?")
_REF = re.compile(r"`([^`]+)`__?")
_LIT = re.compile(r"``([^`]*)``")
_INTERP = re.compile(r"`([^`]*)`")
_STRONG = re.compile(r"\*\*([^*]+)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])")
_SUBST = re.compile(r"\|(\w[\w -]*)\|_?")
_BULLET = re.compile(r"^(?:[-*+•]|#\.|\d+[.)]|\(\d+\)|[a-z][.)])\s+")
_FIELD = re.compile(r"^:[^:`]+:\s*")
_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`:.<>_])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::(.*)$")
_TARGET = re.compile(r"^\.\.\s+(_[^:]*:|\[[^\]]*\]|\|[^|]*\|)")
_TABLE = re.compile(r"^\s*(\+[-=+]+\+?|\|.*\||=+(\s+=+)+)\s*$")


_ROLE_NAME = re.compile(r":([\w:.+-]+):`")


def _role_text(m: re.Match) -> str:
    t = m.group(1)
    role = _ROLE_NAME.match(m.group(0)).group(1)
    if role in ("pep", "rfc") and t.split("#")[0].isdigit():
        return f"{role.upper()} {t.split('#')[0]}"
    lt = t.find(" <")
    if lt > 0 and t.endswith(">"):
        return t[:lt]
    t = t.lstrip("!")
    if t.startswith("~"):
        t = t[1:].rsplit(".", 1)[-1]
    return t


def inline(text: str) -> str:
    text = _ROLE.sub(_role_text, text)
    text = _LIT.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _REF.sub(r"\1", text)
    text = _INTERP.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPH.sub(r"\1", text)
    text = _SUBST.sub(r"\1", text)
    text = text.replace("\\ ", "").replace("\\", "")
    return " ".join(text.split())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_to_paragraphs(src: str) -> list[str]:
    lines = src.expandtabs(8).splitlines()
    paras: list[str] = []
    cur: list[str] = []
    skip_indent = -1          # while >= 0: drop lines indented more than this (and blanks)
    literal_after = False     # the last paragraph ended in '::' -> next indented block is code

    def flush() -> None:
        nonlocal cur
        if cur:
            paras.append(" ".join(cur))
        cur = []

    prev_indent = 0
    for raw in lines:
        line = raw.rstrip()
        ind = _indent(line)
        if skip_indent >= 0:
            if not line or ind > skip_indent:
                continue
            skip_indent = -1
        if not line:
            flush()
            continue
        s = line.strip()
        if literal_after:
            literal_after = False
            if ind > prev_indent:
                skip_indent = prev_indent
                continue
        if _UNDERLINE.match(s):
            # a section title's underline (or overline): the title line stays a paragraph
            flush()
            continue
        if _TABLE.match(line):
            flush()
            skip_indent = -1
            continue
        m = _DIRECTIVE.match(s)
        if m:
            flush()
            name = m.group(1).lower()
            if name not in KEEP_BODY:
                skip_indent = ind
            elif name in ("rubric", "centered") and m.group(2).strip():
                paras.append(m.group(2).strip())
            prev_indent = ind
            continue
        if s.startswith(".."):
            # comment, target, footnote, substitution definition: drop it and its body
            flush()
            skip_indent = ind
            continue
        if s.startswith(">>>") or s.startswith("... ") or s == "...":
            flush()
            continue
        if s.startswith(":") and _FIELD.match(s) and not cur:
            s = _FIELD.sub("", s)
            if not s:
                continue
        if _BULLET.match(s):
            flush()
            s = _BULLET.sub("", s)
        if s == "::":
            flush()
            literal_after = True
            prev_indent = ind
            continue
        if s.endswith("::"):
            s = s[:-1]
            cur.append(s)
            flush()
            literal_after = True
            prev_indent = ind
            continue
        cur.append(s)
        prev_indent = ind
    flush()

    out = []
    for p in paras:
        t = inline(p)
        words = t.split()
        if len(words) < 4:
            continue
        letters = sum(c.isalpha() for c in t)
        if letters < 0.6 * len(t):
            continue
        if not t.isascii():
            # keep it English prose: drop paragraphs with non-ASCII text (a few examples)
            continue
        out.append(t)
    return out


# --------------------------------------------------------------------------------------

def load_documents(src_dir: str) -> list[tuple[str, str]]:
    docs = []
    for root, dirs, files in os.walk(src_dir):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".txt"):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, src_dir).replace(os.sep, "/")
            with open(p, encoding="utf-8", errors="replace") as fh:
                paras = rst_to_paragraphs(fh.read())
            if paras:
                docs.append((rel, "\n".join(paras) + "\n"))
    docs.sort()
    return docs


def split(docs: list[tuple[str, str]], heldout_bytes: int):
    order = sorted(docs, key=lambda d: hashlib.sha1(d[0].encode()).hexdigest())
    held, size = set(), 0
    for rel, text in order:
        if size >= heldout_bytes:
            break
        n = len(text.encode())
        if 2048 <= n <= 40960 and size + n <= heldout_bytes * 1.25:
            held.add(rel)
            size += n
    train = [t for r, t in docs if r not in held]
    test = [t for r, t in docs if r in held]
    return train, test, sorted(held)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--deb", help=f"a downloaded {PKG} .deb (default: apt-get download it)")
    g.add_argument("--src", help="an already unpacked _sources directory")
    ap.add_argument("--out", default="data/corpus", help="output directory (default data/corpus)")
    ap.add_argument("--heldout", default="data/heldout.txt",
                    help="where to copy the held-out text (default data/heldout.txt; '' = no copy)")
    ap.add_argument("--heldout-bytes", type=int, default=80 * 1024)
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp:
        if a.src:
            src, version = a.src, "(unpacked directory " + a.src + ")"
        else:
            deb = a.deb or fetch_deb(tmp)
            version = deb_version(deb)
            src = extract_deb(deb, tmp)
        log(f"source: {version}")
        docs = load_documents(src)
    if not docs:
        raise SystemExit("prepare_corpus: error: no documents found")
    train, test, held = split(docs, a.heldout_bytes)
    os.makedirs(a.out, exist_ok=True)
    train_txt = "\n".join(train)
    test_txt = "\n".join(test)
    with open(os.path.join(a.out, "train.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(train_txt)
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(test_txt)
    with open(os.path.join(a.out, "SOURCE.txt"), "w", encoding="utf-8") as f:
        f.write(f"package: {version}\nfiles: {SRC_SUBDIR}/**.txt\n"
                f"documents: {len(docs)} ({len(train)} train, {len(test)} held out)\n"
                "held out:\n" + "".join(f"  {r}\n" for r in held))
    if a.heldout:
        os.makedirs(os.path.dirname(a.heldout) or ".", exist_ok=True)
        shutil.copyfile(os.path.join(a.out, "heldout.txt"), a.heldout)
    log(f"{len(docs)} documents: train {len(train_txt.encode())} bytes ({len(train)} docs), "
        f"held out {len(test_txt.encode())} bytes ({len(test)} docs) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
