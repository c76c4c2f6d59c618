"""The GPUs' error counters from the vendor's tool (nvidia-smi; amd-smi, else rocm-smi), for the node check and the
preflight.

Standard library only (the preflight imports no torch). Where no tool is on PATH (CPU nodes, a container without
it) the counters are skipped and the caller says so in a note. The formats, from the tools' own sources:

- nvidia-smi `--query-gpu=index,pci.bus_id,<NVIDIA_FIELDS> --format=csv,noheader,nounits`: one line a GPU, cells
  `, `-separated; a field the GPU lacks reads `[N/A]` (or `N/A`), one the driver lacks `[Not Supported]`, and a
  field name the driver does not know fails the whole query (`Field "X" is not a valid field to query.`, exit 2):
  then each field is asked alone. Row remapping (A100 and later; H100/H200 retire no pages, they remap rows) is
  asked with `--query-remapped-rows=gpu_bus_id,<REMAP_FIELDS>` and joined on the bus id; `Yes`/`No` answers are
  1/0.
- amd-smi (ROCm 6 and later) `metric --ecc --json`: `[{"gpu": 0, "ecc": {"total_uncorrectable_count": 0, ...}}]`
  (amdsmi_cli/amdsmi_commands.py `metric`, printed by amdsmi_logger.py's json.dumps of the per-GPU list); newer
  releases wrap the list as `{"gpu_data": [...]}`; a count the GPU lacks reads "N/A".
- rocm-smi `--showrasinfo all`, the text table: its `--json` prints no RAS data at all (rocm_smi.py showRasInfo
  prints through printTableLog, which returns at once under --json), so the table is read: `GPU[N]:\tRAS INFO`,
  then `Block  Status  Correctable Error  Uncorrectable Error` rows; a block whose counts could not be read has no
  count cells, and a DISABLED block's counts mean nothing.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

# nvidia-smi --query-gpu fields whose non-zero value means the GPU needs attention: uncorrectable ECC errors since
# the driver loaded, pages waiting to be retired (GPUs before A100)
NVIDIA_FIELDS = ("ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
# --query-remapped-rows: a row the memory failed to remap, a remap waiting for a GPU reset
REMAP_FIELDS = ("remapped_rows.failure", "remapped_rows.pending")
AMD_FIELDS = ("total_uncorrectable_count",)  # amd-smi metric --ecc: its `ecc` object
TIMEOUT_S = 30
UNKNOWN = ("", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "unknown error")
RAS_GPU = re.compile(r"^GPU\[(\d+)\]:\s*RAS INFO")


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _number(value) -> float | None:
    if isinstance(value, dict):  # amd-smi's {"value": N, "unit": ...}
        value = value.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    if text in UNKNOWN:
        return None
    if text in ("yes", "no"):  # retired_pages.pending / remapped_rows.* answer Yes / No
        return 1.0 if text == "yes" else 0.0
    try:
        return float(text)
    except ValueError:
        return None


def _csv(text: str, width: int) -> list[list[str]]:
    rows = [[c.strip() for c in raw.split(",")] for raw in (text or "").splitlines()]
    return [r for r in rows if len(r) == width]


def nvidia(text: str, fields=NVIDIA_FIELDS) -> dict[int, dict[str, float]]:
    """{GPU index: {field: value}} from `nvidia-smi --query-gpu=index,pci.bus_id,<fields> ...,noheader,nounits`."""
    out = {}
    for cells in _csv(text, 2 + len(fields)):
        if cells[0].isdigit():
            values = {name: _number(cell) for name, cell in zip(fields, cells[2:])}
            out[int(cells[0])] = {k: v for k, v in values.items() if v is not None}
    return out


def bus_ids(text: str) -> dict[str, int]:
    """{bus id: GPU index} from the same query's first two columns."""
    rows = [[c.strip() for c in raw.split(",")] for raw in (text or "").splitlines()]
    return {r[1].lower(): int(r[0]) for r in rows if len(r) >= 2 and r[0].isdigit()}


def remapped(text: str, index_of: dict[str, int], into: dict[int, dict[str, float]]) -> None:
    """Add `nvidia-smi --query-remapped-rows=gpu_bus_id,<REMAP_FIELDS> ...,noheader,nounits` to `into`."""
    for cells in _csv(text, 1 + len(REMAP_FIELDS)):
        index = index_of.get(cells[0].lower())
        if index is None:
            continue
        for name, cell in zip(REMAP_FIELDS, cells[1:]):
            value = _number(cell)
            if value is not None:
                into.setdefault(index, {})[name] = value


def amd(text: str) -> dict[int, dict[str, float]]:
    """{GPU index: {field: count}} from `amd-smi metric --ecc --json` (a list, or {"gpu_data": list})."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if isinstance(data, dict):
        data = data.get("gpu_data")
    out = {}
    for entry in data if isinstance(data, list) else []:
        if not (isinstance(entry, dict) and isinstance(entry.get("gpu"), int)):
            continue
        ecc = entry.get("ecc") if isinstance(entry.get("ecc"), dict) else {}
        values = {name: _number(ecc.get(name)) for name in AMD_FIELDS}
        out[entry["gpu"]] = {k: v for k, v in values.items() if v is not None}
    return out


def rocm(text: str) -> dict[int, dict[str, float]]:
    """{GPU index: {`BLOCK uncorrectable`: count}} from `rocm-smi --showrasinfo all` (the text table)."""
    out: dict[int, dict[str, float]] = {}
    gpu = None
    for raw in (text or "").splitlines():
        head = RAS_GPU.match(raw.strip())
        if head:
            gpu = int(head.group(1))
            out.setdefault(gpu, {})
            continue
        cells = raw.split()
        if gpu is None or len(cells) != 4 or cells[1] in ("Status", "DISABLED"):
            continue  # the header, a block without counts, a disabled block
        value = _number(cells[3])
        if value is not None:
            out[gpu][f"{cells[0]} uncorrectable"] = value
    return out


def _nvidia_counters() -> tuple[dict[int, dict[str, float]], str]:
    base = ["nvidia-smi", "--format=csv,noheader,nounits"]
    text = _run([*base, f"--query-gpu=index,pci.bus_id,{','.join(NVIDIA_FIELDS)}"])
    notes = []
    if text is not None:
        found = nvidia(text)
    else:  # a field this driver does not know fails the whole query: ask each alone
        found, text = {}, ""
        for name in NVIDIA_FIELDS:
            one = _run([*base, f"--query-gpu=index,pci.bus_id,{name}"])
            if one is None:
                notes.append(f"nvidia-smi could not read {name}")
                continue
            text = text or one
            for index, values in nvidia(one, (name,)).items():
                found.setdefault(index, {}).update(values)
        if not text:
            return {}, "nvidia-smi failed; error counters not read"
    rows = _run([*base, f"--query-remapped-rows=gpu_bus_id,{','.join(REMAP_FIELDS)}"])
    if rows is not None:
        remapped(rows, bus_ids(text), found)
    return found, "; ".join(notes)


def counters() -> tuple[str | None, dict[int, dict[str, float]], str]:
    """(the tool used or None, {GPU index: {counter: value}}, a note: what was skipped and why)."""
    if shutil.which("nvidia-smi"):
        found, note = _nvidia_counters()
        return "nvidia-smi", found, note
    if shutil.which("amd-smi"):
        text = _run(["amd-smi", "metric", "--ecc", "--json"])
        if text is not None:
            return "amd-smi", amd(text), ""
        if not shutil.which("rocm-smi"):
            return "amd-smi", {}, "amd-smi failed; error counters not read"
    if shutil.which("rocm-smi"):
        text = _run(["rocm-smi", "--showrasinfo", "all"])
        if text is None:
            return "rocm-smi", {}, "rocm-smi failed; error counters not read"
        return "rocm-smi", rocm(text), ""
    return None, {}, "no nvidia-smi, amd-smi or rocm-smi on PATH: GPU error counters skipped"


def bad(found: dict[int, dict[str, float]]) -> str | None:
    """`GPU 3: ecc.errors.uncorrected.volatile.total 2` for the first GPU with a non-zero counter, else None."""
    for index in sorted(found):
        nonzero = {k: v for k, v in found[index].items() if v > 0}
        if nonzero:
            return f"GPU {index}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(nonzero.items()))
    return None
