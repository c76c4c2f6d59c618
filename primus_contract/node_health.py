"""`primus-slurm nodes check`'s verdicts: each node's report (written by the check job, trainer's node check) judged
ok, slow or failed, with the figure and why. Standard library only; the GPU expectations are the planner's.

A node's report (JSON): node, device (cuda / cpu), gpu_name, gpus: [{index, gemm_tflops, free_gib, total_gib,
errors: {counter: n} or null (null where the job sees some GPUs only: torch's numbering is not the tool's)}],
counters: {the tool's GPU index: {counter: n}} of every GPU of the node, or null, gemm_tflops (the node's slowest
device), vendor_tool (nvidia-smi / amd-smi / rocm-smi or null), notes, disk: {path, free_gib, error}, shared_fs:
{path, write_ms, error}, error (the check itself failed).
The job's rank 0 adds the cross-node figures: allreduce {ms, busbw_gb_s, ranks} and ring: [{src, dst, gb_s}], each
rank sending to the next node's rank (src → dst), so one slow link is found and not just a slow total.

Thresholds, and why:
- GEMM: slow below GEMM_FRACTION (0.8) of the expected rate. The expected rate is the planner's: the BF16 GEMM
  rate calibrated on the H200 (plan/calibration.py COST['gemm_bf16'], seconds per FLOP, fitted on whole training
  steps) scaled to the node's GPU by its vendor peak (plan/gpus.py), as plan/speed.py scales it. A healthy GPU's
  large square GEMM runs at or above the training mix's rate: a healthy H200 measured 766.6 TFLOP/s against the
  696.9 expected (2026-12-05, `make gpu-test`), so 0.8 (557.5) flags a GPU that lost 27 % of its healthy rate, as
  power or thermal throttling does (25 % and more), and leaves a 10 % dip ok (0.75 let a 30 % loss pass). Other
  GPUs (B200, MI300X, MI355X: the H200's rate scaled by vendor peak, unmeasured) get UNCALIBRATED_FRACTION (0.55).
  Nodes whose GPU the table lacks are judged against the other nodes only: slow below RELATIVE (0.5) of the
  median node; CPU nodes below RELATIVE_CPU (0.25: on the local test cluster two healthy "nodes" sharing two busy
  cores measured 0.098 and 0.037 TFLOP/s in one check), where the figures only prove that the code paths run.
- Links: a ring link below RELATIVE of the median link marks both its ends slow (the link is named); GPU nodes
  only (on CPU nodes the links are gloo over whatever the host has, measured but not judged).
- Free GPU memory below FREE_FRACTION (0.9) of the total: failed (another process holds the GPU).
- Vendor error counters (uncorrectable ECC, retired / pending pages, XID where reported) above zero: failed.
- Local disk: not writable, failed; under DISK_MIN_GIB free, slow. Shared filesystem: not writable, failed; a
  write + fsync + read back slower than SHARED_FS_SLOW_MS, slow.
"""
from __future__ import annotations

import statistics

from primus_contract.plan.calibration import COST
from primus_contract.plan.gpus import CALIBRATED_ON, GPUS, Gpu

GEMM_FRACTION = 0.8
# GPUs whose expected rate is only the H200's scaled by vendor peak (no measured row): vendors' peaks are reached
# unevenly (AMD's large BF16 GEMMs are commonly reported well under the peak ratio), so a wider margin until a row
# of theirs calibrates it
UNCALIBRATED_FRACTION = 0.55
MEASURED_GPUS = ("h100", "h200")  # the Hopper parts: the planner's H200 costs, same GEMM hardware
RELATIVE = 0.5
RELATIVE_CPU = 0.25  # CPU nodes sharing cores with other work: two healthy ones measured 2.6x apart
FREE_FRACTION = 0.9
DISK_MIN_GIB = 10.0
SHARED_FS_SLOW_MS = 1000.0
VERDICTS = ("ok", "slow", "failed")


def gpu_of(name: str | None) -> Gpu | None:
    """The machine table's GPU for a device name as torch reports it ("NVIDIA H200", "AMD Instinct MI300X")."""
    text = (name or "").lower().replace(" ", "")
    for key in sorted(GPUS, key=len, reverse=True):
        if key in text:
            return GPUS[key]
    return None


def expected_tflops(gpu: Gpu | None) -> float | None:
    """The planner's BF16 GEMM rate on `gpu`, TFLOP/s (None for a GPU the table lacks)."""
    if gpu is None:
        return None
    return 1.0 / COST["gemm_bf16"] / 1e12 * gpu.bf16_tflops / GPUS[CALIBRATED_ON].bf16_tflops


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def judge(reports: list[dict], cross: dict | None = None) -> list[dict]:
    """One verdict per report: {node, verdict, figure, why (list), report}, in the reports' order."""
    cross = cross or {}
    median_gemm = _median([r.get("gemm_tflops") or 0.0 for r in reports if not r.get("error")])
    links = [link for link in cross.get("ring") or [] if isinstance(link.get("gb_s"), (int, float))]
    if any(r.get("device") == "cpu" for r in reports):
        links = []  # gloo over the loopback of shared cores: the figures prove the code path, not a link
    median_link = _median([link["gb_s"] for link in links])
    out = []
    for r in reports:
        failed, slow = [], []
        if r.get("error"):
            failed.append(r["error"])
        else:
            _gpus(r, failed)
            _gemm(r, median_gemm, slow)
            _storage(r, failed, slow)
            for link in links:
                if r.get("node") in (link.get("src"), link.get("dst")) and median_link and \
                        link["gb_s"] < RELATIVE * median_link:
                    slow.append(f"link {link['src']}->{link['dst']} {link['gb_s']:.3g} GB/s, below {RELATIVE:g}x the "
                                f"median link ({median_link:.3g} GB/s)")
        verdict = "failed" if failed else "slow" if slow else "ok"
        gemm = r.get("gemm_tflops")
        out.append({"node": r.get("node"), "verdict": verdict, "why": failed + slow, "report": r,
                    "figure": f"GEMM {gemm:.3g} TFLOP/s" if isinstance(gemm, (int, float)) else "no GEMM figure"})
    return out


def _gpus(r: dict, failed: list) -> None:
    for g in r.get("gpus") or []:
        total, free = g.get("total_gib") or 0.0, g.get("free_gib")
        if total and free is not None and free < FREE_FRACTION * total:
            failed.append(f"GPU {g.get('index')}: {free:.1f} of {total:.1f} GiB free (another process holds it?)")
    # the vendor's counters of every GPU of the node, by its numbering (`counters`); a report without them (older
    # checks) carries them per visible GPU
    tool = r.get("vendor_tool") or "vendor tool"
    per_node = r.get("counters")
    if isinstance(per_node, dict):
        rows = [(f"{tool} GPU {k}", v) for k, v in sorted(per_node.items(), key=lambda kv: int(kv[0]))]
    else:
        rows = [(f"GPU {g.get('index')}", g.get("errors")) for g in r.get("gpus") or []]
    for name, errors in rows:
        bad = {k: v for k, v in (errors or {}).items() if isinstance(v, (int, float)) and v > 0}
        if bad:
            failed.append(f"{name}: " + ", ".join(f"{k} {v:g}" for k, v in sorted(bad.items())))


def _gemm(r: dict, median: float | None, slow: list) -> None:
    rate = r.get("gemm_tflops")
    if not isinstance(rate, (int, float)):
        return
    gpu = gpu_of(r.get("gpu_name")) if r.get("device") != "cpu" else None
    want = expected_tflops(gpu)
    part = GEMM_FRACTION if gpu is not None and any(GPUS.get(k) is gpu for k in MEASURED_GPUS) \
        else UNCALIBRATED_FRACTION
    if want and rate < part * want:
        slow.append(f"GEMM {rate:.3g} TFLOP/s, below {part:g}x the {want:.0f} TFLOP/s the planner expects "
                    f"of a {r.get('gpu_name')}")
    elif median and rate < (RELATIVE_CPU if r.get("device") == "cpu" else RELATIVE) * median:
        fraction = RELATIVE_CPU if r.get("device") == "cpu" else RELATIVE
        slow.append(f"GEMM {rate:.3g} TFLOP/s, below {fraction:g}x the median node ({median:.3g} TFLOP/s)")


def _storage(r: dict, failed: list, slow: list) -> None:
    disk, shared = r.get("disk") or {}, r.get("shared_fs") or {}
    if disk.get("error"):
        failed.append(f"local disk {disk.get('path')}: {disk['error']}")
    elif isinstance(disk.get("free_gib"), (int, float)) and disk["free_gib"] < DISK_MIN_GIB:
        slow.append(f"local disk {disk.get('path')}: {disk['free_gib']:.1f} GiB free (under {DISK_MIN_GIB:g})")
    if shared.get("error"):
        failed.append(f"shared filesystem {shared.get('path')}: {shared['error']}")
    elif isinstance(shared.get("write_ms"), (int, float)) and shared["write_ms"] > SHARED_FS_SLOW_MS:
        slow.append(f"shared filesystem {shared.get('path')}: write+fsync+read {shared['write_ms']:.0f} ms "
                    f"(over {SHARED_FS_SLOW_MS:g})")


def exit_code(verdicts: list[dict]) -> int:
    """0 when every node is ok, 3 otherwise."""
    return 0 if verdicts and all(v["verdict"] == "ok" for v in verdicts) else 3
