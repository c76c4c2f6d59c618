#!/usr/bin/env python
"""Generate the bundled real-text dataset and tokenizer for the BF16 / FP8 / FP4-emulated comparison (issue 6).

The text is English prose every Python install carries: the docstrings (inspect.getdoc) of a fixed, sorted list
of standard-library modules and of their public classes, functions and methods. Docstrings are split into
paragraphs; code examples (">>>", indented blocks), tables and very short or very long paragraphs are dropped;
exact duplicates are removed. Paragraphs are grouped per module into documents of at most DOC_CHARS characters.
Deterministic for a given Python version (docstrings change slightly between versions; README.txt records the
version the committed files came from, and the committed files are what count).

recipes/data/realtext/train.jsonl, validation.jsonl: {"text": ...} records (trainer format `text`); every
MODULES[i] with i % VAL_EVERY == VAL_EVERY - 1 goes to validation, so the splits share no module.
recipes/data/realtext/tokenizer/: byte-level BPE (vocab VOCAB_SIZE) trained on the train split, saved with
scripts/make_quickstart_data.py's helper (same specials, ChatML template, portable config).
pretrain_documents(): the pretraining corpus of the realtext base (scripts/make_realtext_base.py), not written
here: the other standard-library modules' docstrings and comments and pydoc's topics, disjoint from both splits.

Usage: python scripts/make_realtext_data.py [--out recipes/data/realtext] [--max-bytes 560000]
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import platform
import re
import sys
import tokenize
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scripts import make_quickstart_data as qs  # noqa: E402  (reuse its jsonl writer and tokenizer saver)

VOCAB_SIZE = 1536
VAL_EVERY = 8
DOC_CHARS = 800  # ~240 tokens: a document fits one 256-token pack, untruncated
MIN_PARA, MAX_PARA = 80, 800
MODULES = sorted([
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "bz2", "calendar", "cmd", "codecs",
    "collections", "colorsys", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime",
    "decimal", "difflib", "email", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt",
    "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "http.server", "imaplib",
    "inspect", "io", "ipaddress", "itertools", "json", "locale", "logging", "lzma", "mailbox", "math",
    "mimetypes", "multiprocessing", "netrc", "numbers", "operator", "optparse", "os", "pathlib", "pdb",
    "pickle", "pkgutil", "platform", "poplib", "pprint", "profile", "queue", "quopri", "random", "re", "sched",
    "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "socketserver",
    "sqlite3", "ssl", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "tokenize", "trace", "traceback", "typing", "unittest", "urllib.parse",
    "urllib.request", "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "xml.etree.ElementTree",
    "zipfile", "zoneinfo", "asyncio.events", "asyncio.streams", "asyncio.tasks", "code", "codeop",
    "collections.abc", "compileall", "concurrent.futures.thread", "contextvars", "dis", "doctest",
    "email.message", "email.utils", "fileinput", "graphlib", "http.cookiejar", "http.cookies",
    "importlib.metadata", "json.decoder", "json.encoder", "linecache", "logging.handlers", "modulefinder",
    "multiprocessing.pool", "pickletools", "plistlib", "py_compile", "pydoc", "reprlib", "rlcompleter", "runpy",
    "symtable", "sysconfig", "tabnanny", "tomllib", "unittest.mock", "urllib.robotparser", "webbrowser",
    "wsgiref.simple_server", "xml.sax", "xmlrpc.client", "xmlrpc.server", "zipimport",
])
# not in the pretraining corpus: needs Tk (missing on many installs), the test suite (often not installed),
# setuptools' copy shadows it (distutils), no docstring prose (pydoc_data: used as topics), or side effects
PRETRAIN_SKIP = {"idlelib", "tkinter", "turtle", "turtledemo", "test", "distutils", "ensurepip", "pydoc_data",
                 "this", "antigravity"}
_CODEY = re.compile(r"^(>>>|\.\.\.|\s{2,}|[-=+*|]{3,})|[{}]|::$|\$ ")


def _objects(mod, everything: bool = False) -> list:
    """The module, then its public classes/functions defined in it (sorted by name), each class followed by its
    public methods (sorted). With `everything` (the pretraining corpus), also private and dunder names, routines
    written in C and properties."""
    def wanted(name: str, obj) -> bool:
        if everything:
            return inspect.isroutine(obj) or isinstance(obj, property)
        return not name.startswith("_") and inspect.isfunction(obj)

    out = [mod]
    for name, obj in sorted(vars(mod).items()):
        if (name.startswith("_") and not everything) or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj):
            out.append(obj)
            out += [m for n, m in sorted(vars(obj).items()) if wanted(n, m)]
        elif wanted(name, obj):
            out.append(obj)
    return out


def _comments(mod) -> list[str]:
    """The comment blocks (runs of '#' lines on consecutive lines; an empty '#' line ends a block) of a module's
    Python source, comment markers stripped, one line per comment line."""
    path = getattr(mod, "__file__", None) or ""
    if not path.endswith(".py"):
        return []
    with tokenize.open(path) as f:
        comments = [(t.start[0], t.string.lstrip("#").strip()) for t in tokenize.generate_tokens(f.readline)
                    if t.type == tokenize.COMMENT]
    blocks, last = [], -2
    for line, text in comments:
        if text and line == last + 1 and blocks:
            blocks[-1].append(text)
        elif text:
            blocks.append([text])
        last = line if text else -2
    return ["\n".join(b) for b in blocks]


def _paragraphs(doc: str) -> list[str]:
    keep = []
    for block in re.split(r"\n\s*\n", doc):
        lines = block.split("\n")
        if any(_CODEY.search(line) for line in lines):
            continue
        para = " ".join(line.strip() for line in lines)
        words = para.split()
        # prose: long enough, mostly alphabetic words, starts with a capital, ends a sentence
        if not (MIN_PARA <= len(para) <= MAX_PARA and para[0].isupper() and para.endswith((".", ":"))):
            continue
        if sum(w.strip(".,;:()'\"").isalpha() for w in words) < 0.8 * len(words):
            continue
        keep.append(para)
    return keep


def _import(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except ImportError:
            return None


def _group(paragraphs, seen: set[str]) -> list[str]:
    """The paragraphs not in `seen` (which they then join), in order, grouped into documents of <= DOC_CHARS."""
    docs, cur = [], []
    for para in paragraphs:
        if para in seen:
            continue
        seen.add(para)
        if cur and sum(len(p) + 2 for p in cur) + len(para) > DOC_CHARS:
            docs.append("\n\n".join(cur))
            cur = []
        cur.append(para)
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def _docstring_paragraphs(mod, everything: bool = False):
    return (para for obj in _objects(mod, everything) for para in _paragraphs(inspect.getdoc(obj) or ""))


def module_documents(name: str, seen: set[str]) -> list[str]:
    mod = _import(name)
    if mod is None:
        return []
    return _group(_docstring_paragraphs(mod), seen)


def _walk(name: str):
    """`name`, then (if it is a package) its public submodules, recursively, sorted; test packages left out."""
    yield name
    mod = _import(name)
    for info in sorted(pkgutil.iter_modules(getattr(mod, "__path__", None) or []), key=lambda i: i.name):
        if not (info.name.startswith("_") or info.name in ("test", "tests")):
            yield from _walk(f"{name}.{info.name}")


def pretrain_modules() -> list[str]:
    """Every public standard-library module and submodule that neither MODULES nor PRETRAIN_SKIP names, sorted
    (platform-specific ones that fail to import here are listed and yield no text)."""
    tops = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in PRETRAIN_SKIP)
    return sorted({m for top in tops for m in _walk(top)} - set(MODULES))


def pretrain_documents(seen: set[str]) -> list[str]:
    """The pretraining corpus for the realtext base (scripts/make_realtext_base.py): per module of
    pretrain_modules(), documents of its docstrings (_objects with `everything`), then of its source comments; then
    the language-reference topics pydoc ships (pydoc_data.topics, one topic at a time). Same paragraph filter and
    grouping as the SFT documents; paragraphs in `seen` (pass the SFT train and validation paragraphs) are
    skipped, so the corpus shares no paragraph, and no module, with the SFT set."""
    from pydoc_data.topics import topics

    docs = []
    for mod in filter(None, map(_import, pretrain_modules())):
        docs += _group(_docstring_paragraphs(mod, everything=True), seen)
        docs += _group((para for block in _comments(mod) for para in _paragraphs(block)), seen)
    return docs + [d for key in sorted(topics) for d in _group(_paragraphs(topics[key]), seen)]


def build(max_bytes: int) -> tuple[list[dict], list[dict]]:
    train, val, seen, total = [], [], set(), 0
    for i, name in enumerate(MODULES):
        split = val if i % VAL_EVERY == VAL_EVERY - 1 else train
        for text in module_documents(name, seen):
            size = len(json.dumps({"text": text}, separators=(",", ":")).encode()) + 1
            if total + size > max_bytes:
                return train, val
            split.append({"text": text})
            total += size
    return train, val


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "recipes", "data", "realtext"))
    ap.add_argument("--max-bytes", type=int, default=560_000, help="cap on train+validation jsonl bytes")
    args = ap.parse_args()
    train, val = build(args.max_bytes)
    os.makedirs(args.out, exist_ok=True)
    qs.write_jsonl(os.path.join(args.out, "train.jsonl"), train)
    qs.write_jsonl(os.path.join(args.out, "validation.jsonl"), val)
    qs.VOCAB_SIZE = VOCAB_SIZE  # train_tokenizer reads the module constant; same specials/template/config
    tok_dir = os.path.join(args.out, "tokenizer")
    qs.train_tokenizer([r["text"] for r in train], tok_dir)
    vocab = qs._vocab(tok_dir)
    with open(os.path.join(args.out, "README.txt"), "w") as f:
        f.write(f"Real English text for the precision comparison (recipes/compare_realtext.yaml), made by\n"
                f"scripts/make_realtext_data.py from standard-library docstrings of CPython "
                f"{platform.python_version()}.\n"
                f"train.jsonl: {len(train)} documents, validation.jsonl: {len(val)} documents "
                f"(modules disjoint); tokenizer/: byte-level BPE, {vocab} tokens, trained on train.jsonl.\n"
                f"Other Python versions produce slightly different text; the committed files are the dataset.\n")
    print(json.dumps({"out": os.path.abspath(args.out), "train": len(train), "validation": len(val),
                      "vocab_size": vocab, "python": platform.python_version()}))


if __name__ == "__main__":
    main()
