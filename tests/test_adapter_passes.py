"""primus_contract/plan/adapter_passes.py: the pass counts behind bench/adapter_traffic.py and the planner's adapter
term for trainer.lora.epilogue / fused_swiglu (1.0 with neither, so the calibrated default path keeps its fit)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from primus_contract.plan.adapter_passes import REALIZED, passes, traffic_ratio
from primus_contract.plan.shapes import Linear

ROOT = Path(__file__).resolve().parent.parent


def _lin(short, i, o, norm_fed):
    return Linear(short=short, path=f"decoder.layers.0.x.{short}", params=0.0, in_local=i, out_local=o, uses=1,
                  expert=False, norm_fed=norm_fed, adapted=True)


def test_pass_counts():
    assert passes("unfused", False) == (6, 4) and passes("fused", False) == (4, 4) and passes("epilogue", False) == (3, 3)
    assert passes("epilogue", True) == (6, 4)  # norm-fed linears keep the unfused path
    assert passes("fused", True, "linear_fc1", swiglu=True) == (6, 2)
    assert passes("unfused", False, dropout=True) == (11, 4) and passes("fused", False, dropout=True) == (7, 4)


def test_planner_ratio():
    proj, fc1 = _lin("linear_proj", 4096, 4096, False), _lin("linear_fc1", 4096, 28672, True)
    lora = {"fused": True, "epilogue": False, "fused_swiglu": False, "dropout": 0.0}
    assert traffic_ratio(lora, proj) == 1.0 and traffic_ratio(lora, fc1) == 1.0
    # the byte saving, of which the measured share (REALIZED) shows as time
    ep, sw = REALIZED["epilogue"], REALIZED["fused_swiglu"]
    assert traffic_ratio({**lora, "epilogue": True}, proj) == pytest.approx(1 - ep * (1 - (3 + 3) / (4 + 4)))
    assert traffic_ratio({**lora, "epilogue": True}, fc1) == 1.0
    assert traffic_ratio({**lora, "epilogue": True}, proj, tp=2) == 1.0  # refused at TP 2: priced as the default
    folded = (6 * 4096 + 2 * 28672) / (6 * 4096 + 4 * 28672)
    assert traffic_ratio({**lora, "fused_swiglu": True}, fc1) == pytest.approx(1 - sw * (1 - folded))
    both = {**lora, "fused_swiglu": True, "epilogue": True}  # fc1 is norm-fed: the epilogue leaves it as it was
    assert traffic_ratio(both, fc1) == pytest.approx(1 - sw * (1 - folded))
    assert traffic_ratio(both, proj) == traffic_ratio({**lora, "epilogue": True}, proj)


def test_adapter_traffic_prints_every_design():
    out = subprocess.run([sys.executable, str(ROOT / "bench/adapter_traffic.py")], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    bf16 = {(r["design"], r["fused_swiglu"]): r["adapter_gb_per_step"] for r in rows if r["precision"] == "bf16"}
    assert bf16[("unfused", False)] > bf16[("fused", False)] > bf16[("epilogue", False)] > bf16[("epilogue", True)]
    fp8 = {(r["design"], r["fused_swiglu"]): r["adapter_gb_per_step"] for r in rows if r["precision"] == "fp8"}
    assert fp8[("fused", True)] > fp8[("epilogue", True)] > fp8[("epilogue-all", True)]  # FP8: epilogue true (TE's GEMMs)
