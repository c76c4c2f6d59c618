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

Usage: python scripts/make_realtext_data.py [--out recipes/data/realtext] [--max-bytes 560000]
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import re
import sys
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
_CODEY = re.compile(r"^(>>>|\.\.\.|\s{2,}|[-=+*|]{3,})|[{}]|::$|\$ ")


def _objects(mod) -> list:
    """The module, then its public classes/functions defined in it (sorted by name), each class followed by its
    public methods (sorted)."""
    out = [mod]
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj):
            out.append(obj)
            out += [m for n, m in sorted(vars(obj).items()) if not n.startswith("_") and inspect.isfunction(m)]
        elif inspect.isfunction(obj):
            out.append(obj)
    return out


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


def module_documents(name: str, seen: set[str]) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mod = importlib.import_module(name)
        except ImportError:
            return []
    docs, cur = [], []
    for obj in _objects(mod):
        for para in _paragraphs(inspect.getdoc(obj) or ""):
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
