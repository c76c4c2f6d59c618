"""A post job's directory is made whole or not at all: an input file that cannot be copied (gone or unreadable since
submit read it) is one error naming it, and the half-made job directory is removed."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from primus_slurm.errors import UserError
from primus_slurm.post_training.post import create


def _job(tmp_path, copies):
    return SimpleNamespace(post_dir=tmp_path / "run" / "post" / "eval-1", copies=copies, kind="eval", post_id="eval-1",
                           entry={"run_id": "r1"}, executor="local", args=[])


def test_an_input_that_cannot_be_copied_is_one_error_and_leaves_nothing(tmp_path):
    job = _job(tmp_path, {"data.jsonl": tmp_path / "gone.jsonl"})
    with pytest.raises(UserError, match=r"cannot copy .*gone\.jsonl into the job: No such file"):
        create(job, "#!/bin/bash\n")
    assert not job.post_dir.exists()


def test_inputs_are_copied_beside_the_script(tmp_path):
    src = tmp_path / "prompts.jsonl"
    src.write_text('{"prompt": "hi"}\n')
    job = _job(tmp_path, {"prompts.jsonl": src})
    record = create(job, "#!/bin/bash\n")
    assert (job.post_dir / "prompts.jsonl").read_text() == src.read_text()
    assert (job.post_dir / "job.sh").read_text() == "#!/bin/bash\n" and record["kind"] == "eval"
