"""Cross-field rules for data, schedule, logging and checkpoint over a defaulted recipe (one definition: run by
`validate`/`submit` and by the trainer at start)."""
from __future__ import annotations

import re
from pathlib import Path

from primus_contract.errors import fail
from primus_contract.hf_config import HFConfigError, check_pretrained

HUB_PREFIX = "hf://"  # trainer.tokenizer.path: an explicit Hugging Face Hub id; anything else is a local path
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def hub_id(value: str, field: str = "trainer.tokenizer.path") -> str:
    """The repo id of `hf://org/name` (refused when it is not one)."""
    repo = value[len(HUB_PREFIX):]
    if not HUB_ID_RE.match(repo) or ".." in repo:
        fail(f"`{field}` is {value!r:.120}; expected {HUB_PREFIX}org/name (letters, digits and ._-)")
    return repo


def uses_hub(t: dict) -> bool:
    """The recipe names something on the Hub (an hf:// tokenizer, an hf_name dataset): its job may use the
    network; every other job runs with HF_HUB_OFFLINE=1."""
    d = t["data"]
    return str(t["tokenizer"]["path"] or "").startswith(HUB_PREFIX) or bool(
        d["train"]["hf_name"] or d["validation"]["hf_name"])


def sample_length(seq_length: int, multiple: int) -> int:
    """The length of every sample handed to the model: seq_length rounded up to pad_to_multiple_of."""
    return -(-int(seq_length) // int(multiple)) * int(multiple)


LINE_FILES = (".jsonl", ".ndjson", ".parquet")  # files without splits (primus_contract/data_paths.py FILE_EXTS)


def data_and_schedule_rules(t: dict) -> None:
    d, s = t["data"], t["schedule"]
    if not d["train"]["path"] and not d["train"]["hf_name"]:
        fail("`trainer.data.train.path` or `trainer.data.train.hf_name` is required")
    for split in ("train", "validation"):  # the path wins in the loader: an hf_name beside it would be ignored
        if d[split]["path"] and d[split]["hf_name"]:
            fail(f"`trainer.data.{split}.hf_name` is set beside `trainer.data.{split}.path`; a source is one of them: "
                 "remove one")
        # a .jsonl/.parquet file is read whole (trainer/data/sources.py): a split there would be accepted and ignored
        path, wanted = str(d[split]["path"] or ""), d[split]["split"]
        if d["format"] != "mlperf_npy" and path.endswith(LINE_FILES) and wanted != split:
            fail(f"`trainer.data.{split}.split` is {wanted!r}, but `trainer.data.{split}.path` is one "
                 f"{path.rsplit('.', 1)[-1]} file, read whole (a split selects a hub or save_to_disk dataset's split, "
                 f"a directory's <split> file or a .json object's key); remove split or point path at that data")
    if d["format"] == "mlperf_npy" and not d["train"]["path"]:
        fail("`trainer.data.train.path` must be the MLPerf packed .npy directory when format is mlperf_npy")
    if d["format"] != "mlperf_npy" and not t["tokenizer"]["path"]:
        fail(f"`trainer.tokenizer.path` is required (a local tokenizer directory or {HUB_PREFIX}org/name)")
    if str(t["tokenizer"]["path"] or "").startswith(HUB_PREFIX):
        hub_id(t["tokenizer"]["path"])
    if s["eval_interval"] and not (d["validation"]["path"] or d["validation"]["hf_name"]):
        fail("`trainer.schedule.eval_interval` is set but `trainer.data.validation` has no path or hf_name")
    if s["min_lr"] > s["lr"]:
        fail(f"`trainer.schedule.min_lr` ({s['min_lr']}) must not exceed `trainer.schedule.lr` ({s['lr']})")
    if s["warmup_iters"] > s["train_iters"]:
        fail(f"`trainer.schedule.warmup_iters` ({s['warmup_iters']}) exceeds train_iters ({s['train_iters']})")
    if s["lr_decay_iters"] is not None and s["lr_decay_iters"] < s["warmup_iters"]:
        fail(f"`trainer.schedule.lr_decay_iters` ({s['lr_decay_iters']}) is before the end of warmup_iters "
             f"({s['warmup_iters']}): it must be null or >= warmup_iters")
    lg = t["logging"]
    if lg["profile_end"] is not None and (lg["profile_start"] is None or lg["profile_end"] < lg["profile_start"]):
        fail(f"`trainer.logging.profile_end` ({lg['profile_end']}) needs `trainer.logging.profile_start` <= it")


def checkpoint_rules(t: dict) -> None:
    """What the checkpoint section asks of the model: HF import and PEFT export."""
    m = t["model"]
    ckpt = t["checkpoint"]
    # the checkpoint's config.json is the truth: a recipe model that disagrees, or a config.json field the trainer
    # does not implement, is refused by name (where the directory is readable: the login node, then the job's node)
    if ckpt["pretrained"] and Path(ckpt["pretrained"]).is_dir():
        try:
            check_pretrained(m, ckpt["pretrained"])
        except HFConfigError as e:
            fail(str(e), e.field)
