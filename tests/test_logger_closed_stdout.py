"""A trainer whose stdout is closed under it (the pipe of a cancelled container job) keeps logging to its file and
writing events, so a stop signal can still end in a checkpoint (before, the first log line raised BrokenPipeError)."""
from __future__ import annotations

import json

from trainer.observability.logger import TrainLogger


class ClosedPipe:
    def write(self, _text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_closed_stdout_does_not_stop_the_log(tmp_path):
    logger = TrainLogger(str(tmp_path), 0, 0, stream=ClosedPipe())
    logger.line("stop signal | signal SIGUSR2 | iteration 7")
    logger.record("checkpoint", "checkpoint saved | iteration 7 | path checkpoints/iter_0000007", iteration=7,
                  path="checkpoints/iter_0000007")
    log = (tmp_path / "logs" / "rank-0" / "debug.log").read_text()
    assert "stop signal | signal SIGUSR2 | iteration 7" in log and "checkpoint saved | iteration 7" in log
    events = [json.loads(x) for x in (tmp_path / "logs" / "rank-0" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events][-1] == "checkpoint" and events[-1]["iteration"] == 7
