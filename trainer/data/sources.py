"""Raw record sources: local JSONL / JSON / Parquet files, HF ``save_to_disk`` directories, a directory holding
``<split>.{jsonl,json,parquet}``, or a hub dataset name (``hf_name``, loaded with `datasets.load_dataset`).

`iter_records` yields ``(loc, record, error)``: ``loc`` is ``file:line`` (JSONL), ``file:record N`` (JSON array),
``file:row N`` (Parquet / HF); ``error`` is a one-line problem of that record (a JSONL line that is not UTF-8 or not
JSON) or None. A whole file that cannot be read (a .json that is not UTF-8 or not JSON, a corrupt Parquet file) is a
`DataError` naming the file.
`fingerprint` identifies the source contents for the cache key (paths + sizes + mtimes, or the hub name).
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator

from primus_contract import data_paths
from primus_contract.records import json_lines

from .errors import DataError
from .options import SourceSpec


def resolve(spec: SourceSpec, key: str) -> tuple[str, str]:
    """(kind, target): kind in file|hf_disk|hub; raises DataError naming `<key>.path` if nothing is there."""
    if not spec.path:
        return "hub", str(spec.hf_name)
    try:
        return data_paths.local_source(os.path.abspath(os.path.expanduser(spec.path)), spec.split)
    except ValueError as exc:
        raise DataError(f"{key}.path: {exc}") from None


def fingerprint(spec: SourceSpec, key: str) -> dict:
    kind, target = resolve(spec, key)
    fp: dict[str, Any] = {"kind": kind, "target": target, "split": spec.split, "limit": spec.limit}
    if kind == "file":
        st = os.stat(target)
        fp["files"] = [[os.path.basename(target), st.st_size, st.st_mtime_ns]]
    elif kind == "hf_disk":
        files = []
        for root, _, names in os.walk(target):
            for n in sorted(names):
                st = os.stat(os.path.join(root, n))
                files.append([os.path.relpath(os.path.join(root, n), target), st.st_size, st.st_mtime_ns])
        fp["files"] = sorted(files)
    return fp


def _one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _jsonl(path: str) -> Iterator[tuple[str, Any, str | None]]:
    with open(path, "rb") as f:  # each line decoded on its own: a line that is not UTF-8 is one bad record
        for lineno, value, problem in json_lines(f):
            yield f"{path}:{lineno}", value, problem


def _json(path: str, split: str) -> Iterator[tuple[str, Any, str | None]]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    except (RecursionError, ValueError) as e:  # nested too deeply; an integer of too many digits
        raise DataError(f"{path}: invalid JSON ({_one_line(e)})") from None
    if isinstance(data, dict):
        data = data.get(split, data.get("data"))
    if not isinstance(data, list):
        raise DataError(f"{path}:1: expected a JSON array of records (or an object with a '{split}' array)")
    for i, rec in enumerate(data, 1):
        yield f"{path}:record {i}", rec, None


def _rows(ds: Any, label: str) -> Iterator[tuple[str, Any, str | None]]:
    for i, rec in enumerate(ds, 1):
        yield f"{label}:row {i}", rec, None


def _parquet(path: str) -> Iterator[tuple[str, Any, str | None]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a Parquet file that can be read ({_one_line(e)})") from None
    yield from _rows(rows, path)


def _hf_disk(path: str, split: str, key: str) -> Iterator[tuple[str, Any, str | None]]:
    import datasets

    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign directory becomes one user-facing line
        raise DataError(f"{key}.path: cannot load the save_to_disk dataset {path}: {_one_line(e)}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{key}.split: split {split!r} not in {path} (has {'|'.join(ds)})")
        ds = ds[split]
    yield from _rows(ds, f"{path}[{split}]")


def _hub(name: str, split: str, key: str) -> Iterator[tuple[str, Any, str | None]]:
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # noqa: BLE001 - network/hub failures become one user-facing line
        raise DataError(f"{key}.hf_name: cannot load {name!r} split {split!r}: {_one_line(e)}") from None
    yield from _rows(ds, f"{name}[{split}]")


def iter_records(spec: SourceSpec, key: str) -> Iterator[tuple[str, Any, str | None]]:
    """Records of one source, at most `spec.limit` of them (bad ones count towards the limit)."""
    kind, target = resolve(spec, key)
    if kind == "hub":
        it = _hub(target, spec.split, key)
    elif kind == "hf_disk":
        it = _hf_disk(target, spec.split, key)
    elif target.endswith(".parquet"):
        it = _parquet(target)
    elif target.endswith(".json"):
        it = _json(target, spec.split)
    else:
        it = _jsonl(target)
    for n, item in enumerate(it):
        if spec.limit is not None and n >= spec.limit:
            return
        yield item
