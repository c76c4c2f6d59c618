"""The first records of the run's JSON-lines data, checked at submit as the job's formatter will check them, where
the launcher sees the files (primus_slurm/paths.py calls it once the paths are judged; `validate`, a dry run and a
sweep's trials are judged the same way).

Each of the first CHECKED records (or the split's `limit`) of `trainer.data.train.path` and `.validation.path`,
when that is a .jsonl/.ndjson file, passes the record checks of the run's format (primus_contract.records) and, for
openai/chatml with a tokenizer directory here that has a chat template, renders with that template
(primus_slurm/chat_template.py). With `bad_records: error` the first record that fails is refused: the job would
stop on it. With `skip` the job passes over a bad record, so only a check that every record read fails is
refused: the job would have nothing to train on, or the template (or the data) fails them all. The rest of the
file is read by the job only (a training file may be large); Hub, parquet, .json and save_to_disk data too.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from primus_contract import data_paths
from primus_contract.prompts import CHAT
from primus_contract.records import FIELDS, DataError, json_lines, record_error, template_failure

from primus_slurm import chat_template
from primus_slurm.errors import UserError

CHECKED = 64
LINE_FILES = (".jsonl", ".ndjson")


def record_check(fmt: str, render: Optional[Callable[[list], str]]) -> Callable[[Any, str], None]:
    """check(record, loc): the format's record checks, then the chat template's render of the messages where given;
    a DataError naming loc."""
    def check(record: Any, loc: str) -> None:
        value = FIELDS[fmt](record, loc)
        if render is not None:
            try:
                render(value)
            except Exception as exc:  # noqa: BLE001 - whatever the template raises is the record's error, as in the job
                raise template_failure(loc, exc) from None
    return check


def _check_file(field: str, path: str, check: Callable[[Any, str], None], policy: str, limit: int) -> None:
    read, good, first_bad = 0, 0, None
    with open(path, "rb") as fh:
        for lineno, record, problem in json_lines(fh):
            if read == limit:
                break
            read += 1
            try:
                if problem:
                    raise record_error(f"{path}:{lineno}", problem)
                check(record, f"{path}:{lineno}")
                good += 1
            except DataError as exc:
                if policy == "error":
                    raise UserError(f"`{field}` {exc} (with bad_records: error the job would stop on it)") from None
                first_bad = first_bad or exc
    if read and not good:
        which = f"each of its first {read} records" if read == limit else f"every one of its {read} records"
        raise UserError(f"`{field}`: {which} is bad (bad_records: skip would pass over them all); the first: "
                        f"{first_bad}")


def check(resolved: dict, hosts: dict[str, str], tokenizer_field: str) -> None:
    """Refuse (UserError, one line naming the field) what the job would refuse of the data's first records; `hosts`
    holds the host path of each path field that exists here."""
    d = resolved["trainer"]["data"]
    fmt = d["format"]
    if fmt not in FIELDS:
        return
    tokenizer = hosts.get(tokenizer_field)
    render = chat_template.renderer(tokenizer, tokenizer_field) if fmt in CHAT and tokenizer else None
    for split in ("train", "validation"):
        field = f"trainer.data.{split}.path"
        if field not in hosts:
            continue
        kind, target = data_paths.source(hosts[field], d[split]["split"], fmt)  # (judged by paths.check_paths)
        if kind == "file" and target.endswith(LINE_FILES):
            try:
                _check_file(field, target, record_check(fmt, render), d["bad_records"],
                            min(CHECKED, d[split]["limit"] or CHECKED))
            except OSError as exc:
                raise UserError(f"`{field}` {target}: cannot read it ({exc.strerror or exc})") from None
