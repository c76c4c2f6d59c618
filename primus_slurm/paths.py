"""Data, tokenizer and checkpoint paths are judged at submit (and by `validate`, the same verdict), so a typo is
one error line now instead of a failed job after it waited in the queue.

Each field is an existing file or directory, or (tokenizer only) an explicit Hub id `hf://org/name`; a Hub
dataset goes in `hf_name`. A relative value that exists from the current directory is already absolute here
(recipe.py anchors it); any other relative value is refused: it is neither a path nor a Hub id. Inside a
docker/podman container a path is translated through `cluster.container.mounts` (and the run directory, which
the job always mounts); a path under none of them is refused, naming the mounts. With the local executor the
job runs on this machine, so a missing path is an error; on Slurm it is an error when the path's top-level
directory exists here (the same filesystem is mounted on the login node), and is listed as "not checked here"
when it does not (e.g. `/data` only exists on the compute nodes), as is a path inside an apptainer/pyxis image.
Then the first records of the data files seen here are checked as the job's formatter checks them, with the
tokenizer's chat template where it has one (primus_slurm/first_records.py).
"""
from __future__ import annotations

import os
from pathlib import PurePosixPath

from primus_contract import data_paths, hf_files
from primus_contract.rules_data import HUB_PREFIX

from primus_slurm import first_records
from primus_slurm.errors import UserError
from primus_slurm.jobs.executors import executor_for

FIELDS = ("trainer.data.train.path", "trainer.data.validation.path", "trainer.tokenizer.path",
          "trainer.checkpoint.pretrained")
TOKENIZER_FIELD = "trainer.tokenizer.path"
PRETRAINED_FIELD = "trainer.checkpoint.pretrained"
MOUNTING = ("docker", "podman")  # runtimes that see only what the job mounts


def _get(resolved: dict, dotted: str):
    node = resolved
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _has_tokenizer(folder: str) -> bool:
    """Any file an HF tokenizer loads from: tokenizer.json / tokenizer_config.json, or a vocabulary file
    (vocab.*, *.model sentencepiece, merges.txt, *.tiktoken)."""
    names = os.listdir(folder)
    return any(n in ("tokenizer.json", "tokenizer_config.json", "merges.txt") or n.startswith("vocab.")
               or n.endswith((".model", ".tiktoken")) for n in names)


def _mounts(cluster: dict, run_dir: str | None) -> list[tuple[str, str]]:
    """(host, container) pairs of the container's mounts, the run directory's first."""
    pairs = [(run_dir, run_dir)] if run_dir else []
    return pairs + [tuple(m.split(":")[:2]) for m in cluster["container"]["mounts"]]


def _host_path(path: str, mounts: list[tuple[str, str]]) -> str | None:
    """Where `path` (as the container sees it) lies on this machine; None when it is under no mount."""
    for src, dst in mounts:
        rel = os.path.relpath(path, dst)
        if rel == "." or not rel.startswith(".."):
            return os.path.normpath(os.path.join(src, rel))
    return None


def _check_kind(resolved: dict, field: str, value: str, host: str) -> None:
    """A path that exists here holds what its field needs (as the job will read it), or one error naming the field."""
    if field == TOKENIZER_FIELD and not (os.path.isdir(host) and _has_tokenizer(host)):
        what = ("a directory without a tokenizer (no tokenizer.json, tokenizer_config.json or vocabulary file in it)"
                if os.path.isdir(host) else f"a file; expected a tokenizer directory or {HUB_PREFIX}org/name")
        raise UserError(f"`{field}` is {value!r:.200}, {what}")
    if field == PRETRAINED_FIELD and not os.path.isdir(host):
        raise UserError(f"`{field}` is {value!r:.200}, a file; expected the directory of a Hugging Face checkpoint "
                        "(config.json and its .safetensors)")
    if field == PRETRAINED_FIELD:  # its shard index, as `validate` describes it and the job reads it
        try:
            hf_files.shards(host)
        except hf_files.HFConfigError as exc:
            raise UserError(str(exc)) from None
    if field.startswith("trainer.data."):
        data = resolved["trainer"]["data"]
        split = data[field.split(".")[2]]["split"]
        try:
            data_paths.source(host, split, data["format"])
        except ValueError as exc:
            raise UserError(f"`{field}` is {value!r:.200}: {exc}") from None


def _relative(field: str, value: str, in_container: bool) -> UserError:
    hub = f", or {HUB_PREFIX}org/name for a tokenizer on the Hugging Face Hub" if field == TOKENIZER_FIELD else ""
    hub += "; a Hub dataset goes in trainer.data.*.hf_name" if field.startswith("trainer.data.") else ""
    if in_container:
        where, give = "a relative path is not taken inside a container", "an absolute path"
    else:
        where, give = f"no such file or directory from {os.getcwd()}", "a path that exists (relative to where you " \
            "run primus-slurm, or absolute)"
    return UserError(f"`{field}` is {value!r:.200}: neither an existing path nor a Hub id ({where}); give {give}{hub}")


def check_paths(resolved: dict, executor: str, run_dir: str | None = None) -> list[str]:
    """UserError naming the first field whose path is wrong from here; returns one note per path that only the
    job can see (the checks not made here)."""
    cluster, runner = resolved["cluster"], executor_for(executor)
    runtime = cluster["container"]["runtime"]
    in_container = runtime != "none" and not runner.container_unused(runtime)
    mounts = _mounts(cluster, run_dir)
    unchecked, hosts = [], {}
    for field in FIELDS:
        value = _get(resolved, field)
        if not isinstance(value, str) or not value:
            continue
        if value.startswith(HUB_PREFIX):
            if field != TOKENIZER_FIELD:
                raise UserError(f"`{field}` is {value!r:.200}; {HUB_PREFIX} names a tokenizer on the Hub only "
                                "(a Hub dataset goes in trainer.data.*.hf_name; a pretrained base is a local "
                                "directory)")
            continue  # (the contract checked the id's form)
        if not value.startswith(("/", "~")):
            raise _relative(field, value, in_container)
        path = os.path.expanduser(value)
        host = path
        if in_container:
            host = _host_path(path, mounts)
            if host is None and runtime in MOUNTING:
                listed = "".join(f"{dst} (from {src}), " for src, dst in mounts[bool(run_dir):])
                raise UserError(f"`{field}` is {value!r:.200}, under none of the container's mounts ({listed}"
                                "the run directory); add its folder to cluster.container.mounts")
            if host is None:
                unchecked.append(f"`{field}` {value}: inside the {runtime} image")
                continue
        where = "" if host == path else f" (on this machine: {host})"
        if os.path.exists(host):
            _check_kind(resolved, field, value, host)
            hosts[field] = host
            continue
        parts = PurePosixPath(host).parts
        top = os.path.join(*parts[:2]) if len(parts) > 2 else "/"  # (a file right under / is judged here)
        if not runner.runs_here and not os.path.isdir(top):
            unchecked.append(f"`{field}` {value}: {top} is not mounted on this machine{where}")
            continue
        raise UserError(f"`{field}` is {value!r:.200}, which does not exist{where}")
    first_records.check(resolved, hosts, TOKENIZER_FIELD)  # the data's first records, as the job's formatter
    return unchecked
