"""`primus-slurm nodes check`: a short Slurm job, one task per node (templates/node_check.sh.j2 running
trainer/runtime/node_check.py), whose reports are judged here (primus_contract/node_health.py): one line a node
(ok / slow / failed, the figure and why), the cross-node figures, a summary; slow and failed nodes become suspect
in the node ledger. Exit 0 when every node is ok, 3 otherwise.

The check's directory is `<workspace>/.nodes/checks/<check-id>/` (job.sbatch, code/, reports/, logs/).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

import primus_contract
from primus_contract import node_health, node_ledger
from primus_slurm.config.render import render_template
from primus_slurm.errors import UserError
from primus_slurm.jobs import runs
from primus_slurm.jobs.executors import executor_for
from primus_slurm.jobs.slurm_executor import slurm_states
from primus_slurm.nodes import ledger

HOSTLIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,\[\]-]{0,1023}$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]{1,256}$")
TEMPLATE = "node_check.sh.j2"


@dataclass
class CheckSpec:
    nodes: int | None
    nodelist: str | None
    partition: str | None
    gpus_per_node: int
    exclusive: bool
    timeout: float
    python: str
    workspace: str
    local: bool = False  # this machine's probe as a process, no Slurm (a GPU box without a cluster)


def validate(spec: CheckSpec) -> None:
    """One UserError line for the first bad option (nothing is written or submitted before this passes)."""
    if spec.nodes is not None and spec.nodelist:
        raise UserError("--nodes and --nodelist: give one (--nodelist alone checks every node it names)")
    if spec.nodelist is not None and not HOSTLIST_RE.match(spec.nodelist):
        raise UserError(f"--nodelist must be a Slurm host list such as node[1-4],gpu7 (letters, digits, "
                        f"'.', '_', '-', ',', '[', ']'), got {spec.nodelist!r:.80}")
    if spec.partition is not None and not PARTITION_RE.match(spec.partition):
        raise UserError(f"--partition must be a partition name (letters, digits, '.', '_', '-'), got "
                        f"{spec.partition!r:.80}")
    if not PYTHON_RE.match(spec.python):
        raise UserError(f"--python must be an interpreter path (letters, digits, ./_+-), got {spec.python!r:.80}")
    if spec.local:
        given = [o for o, v in (("--nodes", spec.nodes), ("--nodelist", spec.nodelist), ("--partition", spec.partition),
                                ("--gpus-per-node", spec.gpus_per_node), ("--exclusive", spec.exclusive)) if v]
        if given:
            raise UserError(f"--local checks this machine only; not with {', '.join(given)}")
    elif not shutil.which("sbatch"):
        raise UserError("nodes check runs a Slurm job, and `sbatch` is not on PATH here (--local: this machine)")


def _sbatch(spec: CheckSpec, check_dir: Path) -> list[str]:
    lines = ["--job-name=primus-node-check", "--ntasks-per-node=1", "--no-requeue",
             f"--time={int(spec.timeout // 60) + 2}", f"--output={check_dir}/logs/slurm-%j.out", "--open-mode=append"]
    lines += [f"--nodelist={spec.nodelist}"] if spec.nodelist else [f"--nodes={spec.nodes or 1}"]
    if spec.partition:
        lines.append(f"--partition={spec.partition}")
    if spec.gpus_per_node:
        lines.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.exclusive:
        lines.append("--exclusive")
    return lines


def prepare(spec: CheckSpec) -> tuple[str, Path]:
    """(check id, its directory holding job.sbatch and the code snapshot)."""
    check_id = f"check-{runs.new_run_id()}"
    check_dir = Path(ledger.path_for(spec.workspace)).parent / "checks" / check_id
    script = render_template(
        TEMPLATE, sbatch=_sbatch(spec, check_dir), check_id=check_id, check_dir=str(check_dir), python=spec.python,
        env=[("OMP_NUM_THREADS", "1")] if not spec.gpus_per_node else [], cross_seconds=max(30, int(spec.timeout / 2)))
    try:
        for sub in ("logs", "reports"):
            (check_dir / sub).mkdir(parents=True)
        (check_dir / "job.sbatch").write_text(script)
        for source in (runs.trainer_source_dir(), Path(primus_contract.__file__).parent):
            shutil.copytree(source, check_dir / "code" / source.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    except OSError as exc:
        shutil.rmtree(check_dir, ignore_errors=True)
        raise UserError(f"cannot create the check directory {check_dir} (--workspace): {exc.strerror or exc}") \
            from None
    return check_id, check_dir


def _hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else []


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no output"
    return lines[-1][:200] if lines else "no output"


def collect(check_dir: Path, job_id: str | None) -> tuple[list[dict], dict | None]:
    """Every node's report (a missing one as a failed report naming its last output line), and cross.json (the
    Slurm job's nodes; without a job, the reports there are)."""
    nodelist = (slurm_states([job_id]).get(job_id) or {}).get("nodes") or "" if job_id else ""
    names = _hostnames(nodelist) if nodelist and nodelist not in ("None", "None assigned") else []
    found = {p.stem: r for p in (check_dir / "reports").glob("*.json") if p.stem != "cross" and (r := _read(p))}
    reports = [found.get(n) or {"node": n, "error": f"no report; its task's last line: "
                                                   f"{_last_line(check_dir / 'logs' / f'task-{i}.out')}"}
               for i, n in enumerate(names)]  # (one task a node, in the job's node order)
    reports += [r for n, r in sorted(found.items()) if n not in names]
    return reports, _read(check_dir / "reports" / "cross.json")


def _line(v: dict) -> str:
    """`node1  ok  GEMM … | device, disk, shared filesystem`, or `node2  slow  <each reason, with its figure>`."""
    r = v["report"]
    notes = "".join(f" (note: {n})" for n in r.get("notes") or [])
    if v["why"]:
        return f"{v['node']:<16} {v['verdict']:<6} {'; '.join(v['why'])}{notes}"
    disk, fs = r.get("disk") or {}, r.get("shared_fs") or {}
    return (f"{v['node']:<16} {v['verdict']:<6} {v['figure']} | {r.get('gpu_name') or r.get('device')}, local disk "
            f"{disk.get('free_gib', '?')} GiB free, shared filesystem {fs.get('write_ms', '?')} ms{notes}")


def _cross_lines(cross: dict | None, size: int) -> list[str]:
    if size < 2:
        return []
    if not cross:
        return ["across nodes: no figures (the all-reduce or the ring did not finish; see the nodes' logs)"]
    a = cross["allreduce"]
    ring = ", ".join(f"{x['src']}->{x['dst']} {x['gb_s']:.3g} GB/s" for x in cross["ring"])
    return [f"all-reduce | {a['ranks']} nodes | {a['mib']} MiB | {a['ms']:.2f} ms | busbw {a['busbw_gb_s']:.3g} GB/s"
            f" | result {'ok' if a['correct'] else 'WRONG'}", f"ring | {ring}"]


def _start(spec: CheckSpec, check_dir: Path) -> tuple[str, int]:
    """Run the check (a Slurm job, or with --local this machine's probe as a process); (the job's name, its exit)."""
    if spec.local:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(check_dir / "code"), os.environ.get("PYTHONPATH", "")]))
        cmd = [spec.python, "-m", "trainer.runtime.node_check", "--out", str(check_dir)]
        with open(check_dir / "logs" / "task-0.out", "w") as out:
            try:
                rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=spec.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        return "local", rc
    job: list[str] = []
    rc, _ = executor_for("slurm").run_check(
        check_dir, spec.timeout, lambda job_id: (job.append(job_id),
                                                  click.echo(f"nodes check: Slurm job {job_id} ({check_dir})",
                                                             err=True)))
    return job[0], rc


def run(spec: CheckSpec, as_json: bool) -> int:
    validate(spec)
    check_id, check_dir = prepare(spec)
    t0 = time.monotonic()
    job_id, rc = _start(spec, check_dir)
    job = [job_id]
    reports, cross = collect(check_dir, None if spec.local else job_id)
    verdicts = node_health.judge(reports, cross)
    broken = len(reports) > 1 and (not cross or not cross["allreduce"].get("correct"))
    code = 3 if broken else node_health.exit_code(verdicts)
    bad = [v for v in verdicts if v["verdict"] != "ok"]
    by = f"check {check_id} (job {job[0]})"
    itself = len(reports) > 1 and all(r.get("error") for r in reports)  # no node could run it: the check's fault
    if not itself:
        ledger.append(ledger.path_for(spec.workspace),
                           [node_ledger.line(v["node"], "suspect", f"nodes check: {'; '.join(v['why'])}", by)
                            for v in bad if v["node"]])
    counts = {k: sum(v["verdict"] == k for v in verdicts) for k in node_health.VERDICTS}
    ended = "" if rc == 0 else ", which failed"
    summary = (f"{len(verdicts)} node(s) checked: {counts['ok']} ok, {counts['slow']} slow, {counts['failed']} failed"
               f" ({'this machine' if spec.local else 'Slurm job ' + job[0]}{ended}, {time.monotonic() - t0:.0f} s)")
    if itself:
        summary += "; every node failed to run the check, so none is recorded in the node ledger (see its logs)"
    elif bad:
        summary += f"; suspect in the node ledger: {', '.join(v['node'] for v in bad)}"
    if as_json:
        click.echo(json.dumps({"check_id": check_id, "job_id": job[0], "check_dir": str(check_dir),
                               "nodes": verdicts, "cross": cross, "summary": summary, "exit": code}, indent=2))
    else:
        for v in verdicts:
            click.echo(_line(v))
        for text in _cross_lines(cross, len(reports)):
            click.echo(text)
        click.echo(f"summary: {summary}")
    return code


def default_python() -> str:
    return sys.executable
