"""`resume`'s next attempt number: past every attempt the run's files know of, so that a new attempt never reads an
old one's node records as its own (a second ledger strike for one failure, a requeue count that includes the old
job). Pure files: milliseconds."""
from __future__ import annotations

import json

from primus_slurm.jobs.resume import next_attempt


def test_an_attempt_known_only_from_its_node_records_is_not_run_again(tmp_path):
    assert next_attempt(tmp_path) == 0  # never started
    logs = tmp_path / "logs"
    (logs / "rank-0").mkdir(parents=True)
    # attempt 0's preflight failed on a node before the trainer logged: only logs/nodes.jsonl knows of it
    (logs / "nodes.jsonl").write_text(json.dumps({"event": "fault", "attempt": 0, "node": "n1", "kind": "device"})
                                      + "\n" + json.dumps({"event": "attempt", "attempt": 0, "rc": 1}) + "\n")
    assert next_attempt(tmp_path) == 1
    (logs / "rank-0" / "debug.attempt-2.log").write_text("[..] training started\n")
    assert next_attempt(tmp_path) == 3
