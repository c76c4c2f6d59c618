"""`primus-slurm nodes check --local` on the device (issue 38): the row that the node check's GPU thresholds wait for
(primus_contract/node_health.py: a GPU's GEMM against the planner's rate, its free memory, nvidia-smi's error
counters). The figures are recorded in the suite's JSON whatever the verdict; a healthy H200 must come out `ok`."""
from __future__ import annotations

import json
import os

import pytest

import lifecycle_support as ls

DEV = ls.device()
if DEV is None:
    pytest.skip("no CUDA device (PRIMUS_LIFECYCLE_ON_CPU=1 runs this suite on the CPU)", allow_module_level=True)
pytestmark = pytest.mark.gpu


def test_node_check_on_this_machine(tmp_path, record):
    from primus_contract import node_health

    out = ls.cli(dict(os.environ), "nodes", "check", "--local", "--json", "--workspace", str(tmp_path / "ws"),
                 timeout=600)
    assert out.returncode in (0, 3), (out.stdout[-3000:], out.stderr[-3000:])
    (node,) = json.loads(out.stdout)["nodes"]
    report = node["report"]
    expected = node_health.expected_tflops(node_health.gpu_of(report.get("gpu_name")))
    record(verdict=node["verdict"], why=node["why"], gpu_name=report.get("gpu_name"), gpus=report.get("gpus"),
           gemm_tflops=report.get("gemm_tflops"), expected_tflops=expected, vendor_tool=report.get("vendor_tool"),
           counters=report.get("counters"),
           notes=report.get("notes"), disk=report.get("disk"), shared_fs=report.get("shared_fs"))
    if DEV == "cuda":
        assert report["device"] == "cuda" and report["gpus"] and report["vendor_tool"] == "nvidia-smi", report
        assert report["counters"], report  # nvidia-smi's counters were read (every GPU of the machine)
    assert node["verdict"] == "ok" and out.returncode == 0, node
