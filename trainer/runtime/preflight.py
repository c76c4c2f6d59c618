"""Preflight: does this interpreter (a container image's or the host's) hold the trainer's stack, at versions the
trainer supports? Runs in the job before training, on every node, and from `primus-slurm preflight`.

    python -m trainer.runtime.preflight --config RESOLVED.yaml --run-dir RUN_DIR [--report] [-- CMD ...]

Nothing here imports torch, megatron or TE: they are looked up with importlib (find_spec, metadata), so an image
without them gets one line, not a traceback. On success it prints one `preflight | ...` line and, given CMD, execs
it (same pid: the job script's traps and waits are unchanged). On failure it prints one line, writes it as a
`config error | ...` line to the attempt's rank-0 log (node 0 only; `primus-slurm status` shows it), exit 2.
--report prints one line per check instead.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import time
from typing import Optional

from primus_contract import run_files
from primus_contract.fields import SCHEMA
from primus_contract.machine import parse_version
from trainer.runtime import node_preflight
from trainer.runtime.signals import EXIT_CONFIG, EXIT_ERROR

# (distribution, import name, lowest supported, first unsupported): megatron-core 0.16.1 declares torch>=2.6 and
# TE >=2.9 (its `dev` extra); the trainer runs megatron-core 0.16.1 (the CPU pin) and 0.19.2 (with TE 2.20.2 on
# H200), so 0.16 up to 0.19 is supported and anything else is refused rather than left to fail mid-run.
PYTHON_MIN = (3, 10)
CORE = (("torch", "torch", (2, 6), None), ("megatron-core", "megatron.core", (0, 16), (0, 20)))
TE = ("transformer-engine", "transformer_engine", (2, 9), None)
TE_DISTS = ("transformer-engine", "transformer_engine", "transformer-engine-torch", "transformer_engine_torch")
# imported by the trainer or (undeclared) by megatron-core 0.16.1; presence is enough
MODULES = (("numpy", "numpy"), ("PyYAML", "yaml"), ("safetensors", "safetensors"), ("transformers", "transformers"),
           ("tokenizers", "tokenizers"), ("datasets", "datasets"), ("triton", "triton"), ("psutil", "psutil"),
           ("einops", "einops"))
STAMP = "%Y-%m-%d %H:%M:%S"


class Missing(Exception):
    """One line: what the interpreter lacks."""


def where() -> str:
    """`image IMAGE` inside a container (the job script names it), else `interpreter PATH`."""
    image = os.environ.get("PRIMUS_CONTAINER_IMAGE")
    return f"image {image}" if image and container() != "none" else f"interpreter {sys.executable}"


def container() -> str:
    """The container the job runs this in: the runtime the job script launched (PRIMUS_CONTAINER_RUNTIME, set only
    when it starts one), with the file that runtime leaves inside as evidence (podman, and docker via podman:
    /run/.containerenv; docker /.dockerenv; apptainer /.singularity.d; enroot/pyxis its environ file). A marker
    file alone says nothing: a bare-metal job on a machine that is itself a container has one."""
    runtime = os.environ.get("PRIMUS_CONTAINER_RUNTIME", "none") or "none"
    if runtime == "none":
        return "none"
    for path in ("/run/.containerenv", "/.dockerenv", "/.singularity.d", "/etc/enroot/environ"):
        if os.path.exists(path):
            return f"{runtime} ({path})"
    return f"{runtime} (no container marker file found)"


def _mount_namespace() -> str:
    """`mount namespace N`: a container's differs from the host's (evidence the check ran inside it)."""
    try:
        return "mount namespace " + os.readlink("/proc/self/ns/mnt").strip("mnt:[]")
    except OSError:
        return "mount namespace unknown"


def _version(dist_names, module: str) -> Optional[str]:
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):  # a parent package missing or broken
        return None
    for dist in dist_names:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _in_range(version: str, low: tuple, high: Optional[tuple]) -> bool:
    v = parse_version(version)
    return v >= low and (high is None or v < high)


def _span(low: tuple, high: Optional[tuple]) -> str:
    return ">=" + ".".join(map(str, low)) + ("" if high is None else ",<" + ".".join(map(str, high)))


def te_needed(resolved: Optional[dict]) -> Optional[str]:
    """Why this recipe needs Transformer Engine (FP8, or FP4 not emulated), else None. Read from the resolved
    recipe with the contract's defaults (stdlib): trainer.precision imports torch, which this check must not."""
    if not resolved:
        return None
    prec = (resolved.get("trainer") or {}).get("precision") or {}
    default = SCHEMA["trainer"]["precision"]
    fp8, fp4, emulated = (prec.get(k, default[k].default) for k in ("fp8", "fp4", "fp4_emulation"))
    if fp8:
        return f"fp8: {fp8}"
    if fp4 and not emulated:
        return f"fp4: {fp4} without fp4_emulation"
    return None


def checks(resolved: Optional[dict]) -> list[tuple[str, str, Optional[str]]]:
    """[(name, found, problem or None)] for python, torch, megatron-core, TE and the other modules."""
    out = []
    py = ".".join(map(str, sys.version_info[:3]))
    out.append(("python", py, None if sys.version_info[:2] >= PYTHON_MIN else
                f"python {py} is too old (the trainer needs >={'.'.join(map(str, PYTHON_MIN))})"))
    wanted = [(dist, (dist,), mod, low, high, None) for dist, mod, low, high in CORE]
    why_te = te_needed(resolved)
    if why_te:
        wanted.append((TE[0], TE_DISTS, TE[1], TE[2], TE[3], why_te))
    for dist, dists, mod, low, high, why in wanted:
        version = _version(dists, mod)
        need = f"{dist} {_span(low, high)}" + (f" for {why}" if why else "")
        if version is None:
            out.append((dist, "missing", f"lacks {dist} (needs {need})"))
        elif version != "unknown" and not _in_range(version, low, high):
            out.append((dist, version, f"has {dist} {version} (needs {need})"))
        else:
            out.append((dist, version, None))
    if not why_te:
        out.append((TE[0], "not needed", None))
    for dist, mod in MODULES:
        version = _version((dist,), mod)
        out.append((dist, version or "missing", None if version else f"lacks {dist} (the trainer imports {mod})"))
    return out


def _load(config: Optional[str]) -> Optional[dict]:
    if not config or importlib.util.find_spec("yaml") is None:
        return None  # reported as a missing module
    import yaml

    with open(config, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def summary(found: list) -> str:
    keep = ("python", "torch", "megatron-core", TE[0])
    return " | ".join(f"{name} {version}" for name, version, _ in found if name in keep)


def _log_failure(run_dir: Optional[str], line: str, head: str = "config error", code: int = EXIT_CONFIG,
                 any_node: bool = False) -> None:
    """The attempt's rank-0 log and event stream (primus_contract.run_files), from node 0 only (`any_node`: from
    the node that found a problem of its own): status shows it."""
    if not run_dir or (os.environ.get("SLURM_PROCID", "0") != "0" and not any_node):
        return
    attempt = run_files.current_attempt()
    folder = os.path.join(run_dir, "logs", "rank-0")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, run_files.log_name(attempt)), "a", encoding="utf-8") as fh:
            fh.write(f"[{time.strftime(STAMP)}] {head} | {line}\n")
        with open(os.path.join(folder, run_files.events_name(attempt)), "a", encoding="utf-8") as fh:
            fh.write(run_files.event_line("outcome", status=head, exit=code, message=line) + "\n")
    except OSError:
        pass


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(prog="python -m trainer.runtime.preflight")
    ap.add_argument("--config", help="resolved recipe YAML (decides whether TE is needed)")
    ap.add_argument("--run-dir", help="run directory: a failure is written to its rank-0 log")
    ap.add_argument("--report", action="store_true", help="one line per check")
    ap.add_argument("--env-stdin", action="store_true",
                    help="read NAME=VALUE items, NUL-separated, from stdin into the environment (the job's secrets "
                         "in a docker/podman container: never an -e option, which the runtime stores on disk)")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.env_stdin:
        for item in sys.stdin.buffer.read().split(b"\0"):
            name, eq, value = item.partition(b"=")
            if eq and name:
                os.environb[name] = value
    try:
        resolved = _load(args.config)
    except (OSError, ValueError) as err:
        print(f"preflight: cannot read {args.config}: {err}", file=sys.stderr)
        return EXIT_CONFIG
    node_preflight.start(args.run_dir)
    peer_error = node_preflight.injected_peer_error()
    if peer_error:
        print(peer_error, flush=True)
        return EXIT_ERROR
    device = node_preflight.problem()
    if device:
        node = node_preflight.record(args.run_dir, "device", f"preflight: {device}")
        line = f"node {node}: {device} (preflight)"
        print(f"preflight: {line}", file=sys.stderr, flush=True)
        _log_failure(args.run_dir, line, head="error", code=EXIT_ERROR, any_node=True)
        return EXIT_ERROR
    found = checks(resolved)
    problems = [p for _, _, p in found if p]
    if args.report:
        for name, version, problem in found:
            print(f"preflight | {name:<18} {version:<14} {'ok' if problem is None else 'PROBLEM: ' + problem}")
    if problems:
        line = f"{where()} {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        print(f"preflight: {line}", file=sys.stderr, flush=True)
        node_preflight.record(args.run_dir, "preflight", line)  # a node's only when other nodes passed
        _log_failure(args.run_dir, line)
        return EXIT_CONFIG
    print(f"preflight | {summary(found)} | container {container()} | {where()} | {_mount_namespace()}", flush=True)
    if cmd:
        os.execvp(cmd[0], cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
