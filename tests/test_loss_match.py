"""bench/loss_match.py: a lever's loss against the default's, within the spread of a reseeded default."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from primus_contract import run_files

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp: Path, name: str, losses: list[float], eval_loss: float) -> Path:
    folder = tmp / name / "logs" / "rank-0"
    folder.mkdir(parents=True)
    lines = [run_files.event_line("metrics", iteration=i + 1, losses=[[i + 1, v]]) for i, v in enumerate(losses)]
    lines.append(run_files.event_line("eval", iteration=len(losses), eval_loss=eval_loss))
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    return tmp / name


def _match(a: Path, b: Path, s: Path) -> dict:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "loss_match.py"), "--a", str(a), "--b", str(b),
                          "--spread", str(s), "--window", "3"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_within_and_outside_the_reseeded_spread(tmp_path):
    a = _run(tmp_path, "a", [5.0, 4.0, 3.0, 2.0], 3.0)
    spread = _run(tmp_path, "s", [5.1, 4.1, 3.1, 2.1], 3.05)
    close = _run(tmp_path, "b", [5.0, 4.0, 3.0, 2.01], 3.01)
    got = _match(a, close, spread)
    assert got["verdict"] == "within spread" and abs(got["max_abs_diff_b_a"] - 0.01) < 1e-9, got
    assert abs(got["tail_b_a"] - 0.01 / 3) < 1e-9 and abs(got["tail_spread"] - 0.1) < 1e-9, got
    far = _run(tmp_path, "far", [5.0, 4.0, 3.0, 2.0], 3.2)  # the same training curve, an eval loss off by 0.2
    assert _match(a, far, spread)["verdict"] == "outside spread"


def test_runs_that_ended_apart_are_refused(tmp_path):
    a = _run(tmp_path, "a", [5.0, 4.0, 3.0, 2.0], 3.0)
    short = _run(tmp_path, "short", [5.0, 4.0, 3.0], 3.0)  # stopped early (a timeout, a crash)
    spread = _run(tmp_path, "s", [5.1, 4.1, 3.1, 2.1], 3.05)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "loss_match.py"), "--a", str(a), "--b", str(short),
                          "--spread", str(spread)], capture_output=True, text=True)
    assert out.returncode != 0 and "same last iteration" in out.stderr and not out.stdout, out
