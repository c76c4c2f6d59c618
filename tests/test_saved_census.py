"""trainer.observability.saved_census: what a forward keeps for backward, by module, counted per storage."""
from __future__ import annotations

import re

import pytest
import torch

from tests.test_train_support import beside, train_curves, write_recipe
from trainer.observability.saved_census import SavedTensorCensus


class _KeepsSlice(torch.autograd.Function):
    """Saves a view (the first column block) of its input: the whole buffer stays alive."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x[:, :4])
        return x[:, :4] * 2.0

    @staticmethod
    def backward(ctx, g):
        (part,) = ctx.saved_tensors
        out = torch.zeros(part.shape[0], 16, dtype=g.dtype)
        out[:, :4] = g * 2.0
        return out


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(8, 16, bias=False).requires_grad_(False)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4, bias=False) for _ in range(2)])

    def forward(self, x):
        h = self.frozen(x)                   # frozen weight, x needs no grad: saves nothing
        h = h.requires_grad_(True)
        h = _KeepsSlice.apply(h)             # keeps all of h (3 x 16 fp32) through a view
        for blk in self.blocks:
            h = blk(h)                       # trainable weight: saves its input (3 x 4 fp32 each)
        return h


def test_census_counts_whole_storages_per_module_and_skips_weights():
    net = _Net()
    census = SavedTensorCensus(net, torch.device("cpu"))
    census.start()
    out = net(torch.randn(3, 8))
    assert census.recording
    out.sum().backward()                     # the first unpack ends the recording
    assert not census.recording
    census.close()
    totals = census.totals()
    assert totals == {"(model)": 3 * 16 * 4, "blocks.*": 2 * 3 * 4 * 4}
    report = census.report()
    assert report.splitlines()[0] == ("saved for backward by 1 micro-batch forward(s) before the first backward: "
                                      "0.00 MiB in 3 storages")
    assert "blocks.*  (float32[3, 4])" in report
    # nothing is recorded once closed
    net(torch.randn(3, 8)).sum().backward()
    assert census.totals() == totals


def _fc2_mib(run) -> float:
    text = (run / "profile" / "rank-0" / "saved_tensors.txt").read_text()
    m = re.search(r"^\s*([0-9.]+)\s+[0-9.]+%\s+decoder\.layers\.\*\.mlp\.linear_fc2\b", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.slow  # ~17 s on two cores under load: `make test` runs it, `make check` does not
def test_trainer_reports_saved_tensors_and_adapter_inputs_shrinks_them(tmp_path):
    """The profiled step's census in a real training run: recomputing fc2's adapter input removes what
    its adapter kept (the SwiGLU output), the rest stays."""
    started = {}
    for keep in (False, True):  # both runs at once (test_train_support.beside)
        # fused_swiglu pinned off: on by default it folds fc1's adapter only where fc2's recompute is off, so the
        # two runs would differ by it too
        cfg = write_recipe(tmp_path, "trainer.schedule.train_iters=3", "trainer.logging.profile_start=2",
                           f"trainer.recompute.adapter_inputs={str(not keep).lower()}",
                           "trainer.lora.fused_swiglu=false", name=f"r{int(keep)}.yaml")
        started[keep] = beside(train_curves, cfg, tmp_path / f"run{int(keep)}")
    runs = {}
    for keep, future in started.items():
        _, _, text = future.result()
        m = re.search(r"\] saved tensors \| iteration 2 \| ([0-9.]+) MiB \| micro-batches 1 \| "
                      r"path profile/rank-0/saved_tensors.txt", text)
        assert m, text[-2000:]
        runs[keep] = (float(m.group(1)), _fc2_mib(tmp_path / f"run{int(keep)}"))
    (total_keep, fc2_keep), (total_rec, fc2_rec) = runs[True], runs[False]
    assert fc2_keep > 0.0 and fc2_rec < fc2_keep / 4
    assert total_rec < total_keep


@pytest.mark.slow
def test_pipeline_stage_reports_every_forward_before_its_first_backward(tmp_path):
    """1F1B with PP=2 and two micro-batches: stage 0 runs both forwards before its first backward, and the
    census says it covered two (its totals are not one micro-batch's)."""
    from tests.test_train_parallel import _torchrun

    cfg = write_recipe(tmp_path, "trainer.schedule.train_iters=2", "trainer.logging.profile_start=2",
                       "trainer.parallelism.pipeline=2", "cluster.nproc_per_node=2",
                       "trainer.checkpoint.disable_last_saving=true")
    run = tmp_path / "pp2"
    res = _torchrun(cfg, run)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    text = (run / "logs" / "rank-0" / "debug.log").read_text()
    assert re.search(r"\] saved tensors \| iteration 2 \| [0-9.]+ MiB \| micro-batches 2 \| ", text), text[-2000:]
    report = (run / "profile" / "rank-0" / "saved_tensors.txt").read_text()
    assert "by 2 micro-batch forward(s) before the first backward" in report
    assert "decoder.layers.*.mlp" in report and "output_layer" not in report  # stage 0: no output layer
