"""Malformed data records through the real `python -m trainer`: with `bad_records: error` (the default) it
stops before training with exit 2 and one line naming file:line of the first bad record; with `skip` it
trains on the rest and logs how many records it skipped."""
from __future__ import annotations

import json

import pytest

from test_train_support import ROOT, log_text, run_trainer, write_recipe

pytestmark = pytest.mark.slow


def _data(tmp_path):
    lines = (ROOT / "recipes" / "data" / "quickstart" / "train.jsonl").read_text().splitlines()[:60]
    lines.insert(2, '{"instruction": "unterminated')            # line 3: not JSON
    lines.insert(5, json.dumps({"instruction": "no answer"}))    # line 6: no `output`
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_record_stops_with_file_and_line(tmp_path):
    data = _data(tmp_path)
    res = run_trainer(write_recipe(tmp_path, "trainer.schedule.train_iters=2", f"trainer.data.train.path={data}"),
                      tmp_path / "run")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if str(data) in line]
    assert len(lines) == 1 and lines[0].startswith(f"config error | {data}:3: invalid JSON"), res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert "] iteration " not in log_text(tmp_path / "run")


def test_bad_records_skipped_and_counted(tmp_path):
    data = _data(tmp_path)
    res = run_trainer(write_recipe(tmp_path, "trainer.schedule.train_iters=2", f"trainer.data.train.path={data}",
                                   "trainer.data.bad_records=skip"), tmp_path / "run")
    assert res.returncode == 0, res.stderr[-3000:]
    text = log_text(tmp_path / "run")
    line = next(ln for ln in text.splitlines() if "] data | split train |" in ln)
    assert "| records 62 |" in line and "| skipped_bad_records 2 |" in line, line
    assert "] iteration 2/2 |" in text
