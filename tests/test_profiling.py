"""trainer.observability.profiling.StepProfiler: a torch.profiler window over training steps."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

import torch

from tests.test_train_support import train_curves, write_recipe
from trainer.observability.profiling import StepProfiler


class _Log:
    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text)


def _cfg(start, end=None, ranks=(0,), trace=False):
    return SimpleNamespace(profile_start=start, profile_end=end, profile_ranks=list(ranks), profile_trace=trace)


def _loop(prof, iters, first=1):
    a = torch.randn(64, 64)
    for it in range(first, iters + 1):
        prof.before_step(it)
        assert prof.active == (prof.start is not None and prof.start <= it <= prof.end)
        a = torch.tanh(a @ a)
        spent = prof.after_step(it)
        assert spent >= 0.0 and (spent > 0.0) == (prof.end is not None and it == prof.end)
    prof.close(iters)


def test_window_is_profiled_and_written(tmp_path):
    log = _Log()
    prof = StepProfiler.from_cfg(_cfg(2, 3, trace=True), str(tmp_path), 0, torch.device("cpu"), log)
    _loop(prof, 5)
    summary = (tmp_path / "profile" / "rank-0" / "summary.txt").read_text()
    assert summary.startswith("iterations 2-3, sorted by self_cpu_time_total")
    assert "aten::mm" in summary and "aten::tanh" in summary
    events = json.loads((tmp_path / "profile" / "rank-0" / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert log.lines == ["profile written | iterations 2-3 | path profile/rank-0/summary.txt"]


def test_resumed_inside_the_window_profiles_the_rest_and_unreached_window_is_logged(tmp_path):
    log = _Log()
    prof = StepProfiler.from_cfg(_cfg(2, 4), str(tmp_path), 0, torch.device("cpu"), log)
    _loop(prof, 6, first=3)  # a run resumed at iteration 3
    assert log.lines == ["profile written | iterations 3-4 | path profile/rank-0/summary.txt"]
    late = _Log()
    prof = StepProfiler.from_cfg(_cfg(10, 12), str(tmp_path / "late"), 0, torch.device("cpu"), late)
    _loop(prof, 5)
    assert late.lines == ["profile skipped | iterations 10-12 | run ended at iteration 5"]
    assert not (tmp_path / "late" / "profile").exists()


def test_other_ranks_and_no_window_record_nothing(tmp_path):
    for cfg, rank in ((_cfg(None), 0), (_cfg(1, 2, ranks=(1,)), 0)):
        prof = StepProfiler.from_cfg(cfg, str(tmp_path), rank, torch.device("cpu"))
        _loop(prof, 3)
    assert not (tmp_path / "profile").exists()


@pytest.mark.slow  # ~11 s on two cores under load: `make test` runs it, `make check` does not
def test_trainer_writes_profile_when_training_ends_inside_the_window(tmp_path):
    cfg = write_recipe(tmp_path, "trainer.schedule.train_iters=5", "trainer.logging.profile_start=3",
                       "trainer.logging.profile_end=99", "trainer.recompute.adapter_inputs=true")
    run = tmp_path / "run"
    _, _, text = train_curves(cfg, run)
    assert "] profile written | iterations 3-5 | path profile/rank-0/summary.txt" in text
    layers = int(re.search(r"\] arg model.num_layers = (\d+)", text).group(1))
    assert f"] adapter inputs | scope all | fc2 {layers} | norm 0" in text  # (no fused norms on CPU)
    summary = (run / "profile" / "rank-0" / "summary.txt").read_text()
    assert "aten::" in summary and not (run / "profile" / "rank-0" / "trace.json").exists()
