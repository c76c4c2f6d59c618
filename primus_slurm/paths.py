"""Data, tokenizer and checkpoint paths that the launcher can see are checked at submit time, so a typo is
one error line now instead of a failed job after it waited in the queue.

Only absolute paths are checked. Inside a container a path is translated through `cluster.container.mounts`
(a path under no mount lives in the image and cannot be seen from here). With the local executor the job
runs on this machine, so a missing path is always an error; on Slurm it is an error when the path's top-level
directory exists here (the same filesystem is mounted on the login node) and is skipped when it does not
(e.g. `/data` only exists on the compute nodes).
"""
from __future__ import annotations

import os
from pathlib import PurePosixPath

from .errors import UserError
from .executors import executor_for

FIELDS = ("trainer.data.train.path", "trainer.data.validation.path", "trainer.tokenizer.path",
          "trainer.checkpoint.pretrained")


def _get(resolved: dict, dotted: str):
    node = resolved
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


TOKENIZER_FIELD = "trainer.tokenizer.path"


def _has_tokenizer(folder: str) -> bool:
    """Any file an HF tokenizer loads from: tokenizer.json / tokenizer_config.json, or a vocabulary file
    (vocab.*, *.model sentencepiece, merges.txt, *.tiktoken)."""
    names = os.listdir(folder)
    return any(n in ("tokenizer.json", "tokenizer_config.json", "merges.txt") or n.startswith("vocab.")
               or n.endswith((".model", ".tiktoken")) for n in names)


def _host_path(path: str, cluster: dict) -> str | None:
    """Where `path` (as the job sees it) lies on this machine; None when it cannot be seen from here."""
    container = cluster.get("container") or {}
    if container.get("runtime", "none") == "none":
        return path
    for mount in container.get("mounts") or []:
        src, dst = mount.split(":")[:2]
        rel = os.path.relpath(path, dst)
        if rel == "." or not rel.startswith(".."):
            return os.path.normpath(os.path.join(src, rel))
    return None


def check_paths(resolved: dict, executor: str) -> None:
    """UserError naming the first field whose path is visible from here and missing."""
    cluster, runs_here = resolved["cluster"], executor_for(executor).runs_here
    for field in FIELDS:
        value = _get(resolved, field)
        if not isinstance(value, str) or not value.startswith(("/", "~")):
            continue  # unset, relative, or a hub name
        host = _host_path(os.path.expanduser(value), cluster)
        if host is not None and field == TOKENIZER_FIELD and os.path.isdir(host) and not _has_tokenizer(host):
            raise UserError(f"`{field}` is {value!r:.200}, a directory without a tokenizer (no tokenizer.json, "
                            "tokenizer_config.json or vocabulary file in it)")
        if host is None or os.path.exists(host):
            continue
        top = PurePosixPath(host).parts[:2]
        if not runs_here and not os.path.isdir(os.path.join(*top)):
            continue  # that filesystem is not mounted on this machine
        where = "" if host == value else f" (on this machine: {host})"
        raise UserError(f"`{field}` is {value!r:.200}, which does not exist{where}")
