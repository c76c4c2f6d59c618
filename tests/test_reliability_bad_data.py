"""Malformed data records through the real `python -m trainer`: with `bad_records: error` (the default) it
stops before training with exit 2 and one line naming file:line of the first bad record; with `skip` it
trains on the rest and logs how many records it skipped."""
from __future__ import annotations

import json

import pytest

from test_train_support import ROOT, beside, log_text, run_trainer, write_recipe

pytestmark = pytest.mark.slow


def _data(tmp_path):
    lines = (ROOT / "recipes" / "data" / "quickstart" / "train.jsonl").read_text().splitlines()[:60]
    lines.insert(2, '{"instruction": "unterminated')            # line 3: not JSON
    lines.insert(5, json.dumps({"instruction": "no answer"}))    # line 6: no `output`
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Both tests' trainer runs on the same bad data, started at once when the module starts (one trainer thread
    each: test_train_support.beside): {case: (data path, run dir, future of run_trainer's result)}."""
    started = {}
    for case, sets in (("default", ()), ("skip", ("trainer.data.bad_records=skip",))):
        tmp = tmp_path_factory.mktemp(case)
        data = _data(tmp)
        cfg = write_recipe(tmp, "trainer.schedule.train_iters=2", f"trainer.data.train.path={data}", *sets)
        started[case] = (data, tmp / "run", beside(run_trainer, cfg, tmp / "run"))
    return started


def test_bad_record_stops_with_file_and_line(runs):
    data, run_dir, started = runs["default"]
    res = started.result()
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if str(data) in line]
    assert len(lines) == 1 and lines[0].startswith(f"config error | {data}:3: invalid JSON"), res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert "] iteration " not in log_text(run_dir)


def test_bad_records_skipped_and_counted(runs):
    _, run_dir, started = runs["skip"]
    res = started.result()
    assert res.returncode == 0, res.stderr[-3000:]
    text = log_text(run_dir)
    line = next(ln for ln in text.splitlines() if "] data | split train |" in ln)
    assert "| records 62 |" in line and "| skipped_bad_records 2 |" in line, line
    assert "] iteration 2/2 |" in text
