"""Cross-field rules for the experiment trackers (trainer.logging.wandb; TensorBoard has only its switch)."""
from __future__ import annotations

from primus_contract.errors import fail

W = "trainer.logging.wandb"
MAX_TAG = 64  # W&B refuses longer tags


def tracking_rules(t: dict) -> None:
    w = t["logging"]["wandb"]
    if w["project"] is None:  # W&B is off: a key of the section set without it would be accepted and ignored
        for key in ("entity", "name", "mode", "tags", "group"):
            if w[key]:
                fail(f"`{W}.{key}` is set but `{W}.project` is not; W&B logs only to a project: set "
                     f"`{W}.project` or remove `{W}.{key}`")
    for i, tag in enumerate(w["tags"]):
        if not 1 <= len(tag) <= MAX_TAG:
            fail(f"`{W}.tags[{i}]` is {tag!r:.80}; expected a tag of 1 to {MAX_TAG} characters")
