"""trainer.profiling.StepProfiler: a torch.profiler window over training steps."""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from tests.test_train_support import log_text, run_trainer, write_recipe
from trainer.profiling import StepProfiler


class _Log:
    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text)


def _cfg(start, end=None, ranks=(0,), trace=False):
    return SimpleNamespace(profile_start=start, profile_end=end, profile_ranks=list(ranks), profile_trace=trace)


def _loop(prof, iters):
    a = torch.randn(64, 64)
    for it in range(1, iters + 1):
        prof.before_step(it)
        assert prof.active == (prof.start is not None and prof.start <= it <= prof.end)
        a = torch.tanh(a @ a)
        prof.after_step(it)
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


def test_other_ranks_and_no_window_record_nothing(tmp_path):
    for cfg, rank in ((_cfg(None), 0), (_cfg(1, 2, ranks=(1,)), 0)):
        prof = StepProfiler.from_cfg(cfg, str(tmp_path), rank, torch.device("cpu"))
        _loop(prof, 3)
    assert not (tmp_path / "profile").exists()


def test_trainer_writes_profile_when_training_ends_inside_the_window(tmp_path):
    cfg = write_recipe(tmp_path, "trainer.schedule.train_iters=5", "trainer.logging.profile_start=3",
                       "trainer.logging.profile_end=99")
    run = tmp_path / "run"
    res = run_trainer(cfg, run)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "] profile written | iterations 3-5 | path profile/rank-0/summary.txt" in log_text(run)
    summary = (run / "profile" / "rank-0" / "summary.txt").read_text()
    assert "aten::" in summary and not (run / "profile" / "rank-0" / "trace.json").exists()
