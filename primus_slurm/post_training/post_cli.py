"""CLI commands after training: export, generate, eval (the job side is trainer/post). `cli.py` calls register()."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from primus_contract import data_paths
from primus_contract.prompts import CHAT, FORMATS, INPUT_FIELD, check_prompt, from_text
from primus_contract.records import FIELDS, DataError, json_lines
from primus_contract.serving import VLLM_LORA_RANKS, vllm_lora_rank
from primus_slurm import chat_template, first_records
from primus_slurm.post_training import post
from primus_slurm.errors import UserError
from primus_slurm.cli_options import run_argument

SAMPLING_ONLY = ("top_p", "seed")  # generate options greedy decoding (--temperature 0) does not use


def common(func):
    func = click.option("--executor", type=click.Choice(["slurm", "local"]), default=None,
                        help="where the job runs (default: where the run ran)")(func)
    func = click.option("--checkpoint", "iteration", type=click.IntRange(min=0), default=None, metavar="ITER",
                        help="checkpoint iteration (default: the latest)")(func)
    return run_argument()(func)


def _finish(job: post.PostJob) -> None:
    rc, result = post.launch(job)
    if rc != 0 or not result:
        raise UserError(f"{job.kind} job failed (exit {rc}); its output: {job.post_dir}/"
                        f"{job.runner.post_output}")
    click.echo(f"{job.kind} result: {job.post_dir / 'result.json'}")


def _checkpoint_args(job: post.PostJob, iteration) -> None:
    post.check_layout(job.run_dir, post.check_checkpoint(job.run_dir, iteration), job.resolved)
    if iteration is not None:
        job.args += ["--checkpoint", iteration]


@click.command("export")
@common
@click.option("--adapter", is_flag=False, flag_value="", default=None, metavar="OUT",
              help="write the checkpoint's PEFT adapter to OUT (no OUT: into the export's directory)")
@click.option("--merged", is_flag=False, flag_value="", default=None, metavar="OUT",
              help="write a merged Hugging Face checkpoint (base + LoRA) to OUT (no OUT: into the export's "
                   "directory); needs the run's trainer.checkpoint.pretrained")
def export_cmd(run, iteration, executor, adapter, merged):
    """Export RUN's checkpoint: the PEFT adapter and/or a merged HF model (into RUN/exports/)."""
    job = post.new_job("export", run, executor)
    if adapter is None and merged is None:
        raise UserError("export: give --adapter [OUT] and/or --merged [OUT]")
    if merged is not None and not post.pretrained(job.resolved):
        raise UserError("--merged: run has no pretrained base (trainer.checkpoint.pretrained is unset); only "
                        "--adapter can be exported")
    _checkpoint_args(job, iteration)
    outs = []
    for option, value, name in (("--adapter", adapter, "adapter"), ("--merged", merged, "merged")):
        out = post.output_dir(job, value, name, option)
        if out:
            if out in outs:  # (the merge would refuse it in the job, after the adapter was written)
                raise UserError(f"--merged {value}: the same directory as --adapter; give each its own")
            outs.append(out)
            job.args += [option, out]
    _finish(job)


def read_records(path: str, option: str, check=None) -> None:
    """A JSON-lines file of records, read as the job will (primus_contract.records.json_lines: JSON objects, at least
    one), each passing `check(record, loc)` where given (the job's own checks); else one error naming `option`."""
    n = 0
    try:
        with open(path, "rb") as fh:
            for i, record, problem in json_lines(fh):
                if problem:
                    raise UserError(f"{option} {path}:{i}: {problem}")
                if not isinstance(record, dict):
                    raise UserError(f"{option} {path}:{i}: each line must be a JSON object (a record of the run's "
                                    "format)")
                try:
                    if check is not None:
                        check(record, f"{path}:{i}")
                except DataError as exc:
                    raise UserError(f"{option} {exc}") from None
                n += 1
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot read it ({exc.strerror or exc})") from None
    if not n:
        raise UserError(f"{option} {path}: no records")


def read_prompts(path: str, option: str = "--prompts", fmt: str | None = None) -> None:
    """read_records of prompts the job lays out in format `fmt` where given (primus_contract.prompts.check_prompt)."""
    read_records(path, option, None if fmt is None else lambda record, loc: check_prompt(fmt, record, loc))


def check_eval_data(data: str, resolved: dict) -> Path:
    """`eval --data PATH` as the job will read it (primus_contract.data_paths: the trainer's own rule, with the run's
    validation split): it exists, and a JSON-lines file's records pass the job's formatter where the run's
    `bad_records: error` would stop the job on one. The resolved path; else one error naming --data."""
    path = Path(data).expanduser().resolve()
    if not path.exists():
        raise UserError(f"--data {data}: no such file or directory")
    d = resolved["trainer"]["data"]
    split = (d.get("validation") or {}).get("split") or "validation"
    try:
        kind, target = data_paths.source(str(path), split, d["format"])
    except ValueError as exc:
        raise UserError(f"--data {data}: {exc}") from None
    if kind == "file" and target.endswith((".jsonl", ".ndjson")):
        read_records(target, "--data", _eval_check(resolved) if d.get("bad_records") == "error" else None)
    return path


def _eval_check(resolved: dict):
    """The job's checks of an eval record: its format's, and for a chat format the run's chat template's render where
    the run's tokenizer directory is on this machine (as submit renders the training data's first records)."""
    fmt, tokenizer = resolved["trainer"]["data"]["format"], resolved["trainer"]["tokenizer"]["path"]
    if fmt not in FIELDS:
        return None
    here = fmt in CHAT and isinstance(tokenizer, str) and os.path.isdir(tokenizer)
    render = chat_template.renderer(tokenizer, "trainer.tokenizer.path") if here else None
    return first_records.record_check(fmt, render)


def _sampling_only_given(temperature: float) -> None:
    """--top-p/--seed given to a greedy generate (accepted, they would do nothing): refused."""
    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in SAMPLING_ONLY
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)]
    if given and temperature <= 0:
        them = "them" if len(given) > 1 else "it"
        raise UserError(f"{' and '.join(given)}: only sampling uses {them}, and --temperature is 0 (greedy); "
                        f"give --temperature > 0 or leave {them} out")


@click.command("generate")
@common
@click.option("--prompt", default=None, metavar="TEXT",
              help="one prompt (alpaca instruction / squad question / chat user turn / text)")
@click.option("--input", "prompt_input", default=None, metavar="TEXT",
              help="with --prompt: the record's input (alpaca input, squad context)")
@click.option("--prompts", "prompts_file", default=None, metavar="FILE.jsonl",
              help="records in the run's data format; an answer field present is the reference (scored)")
@click.option("--merged", default=None, metavar="DIR", help="generate from this merged export instead")
@click.option("--base-only", is_flag=True, help="the run's base model without the adapter (before fine-tuning)")
@click.option("--max-new-tokens", type=click.IntRange(min=1, max=1 << 20), default=64)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, help="0: greedy")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0)
@click.option("--seed", type=click.IntRange(min=0), default=0)
@click.option("--engine", type=click.Choice(["auto", "transformers", "vllm"]), default="auto",
              help="auto: vLLM when importable on a GPU, else transformers + peft")
def generate_cmd(run, iteration, executor, prompt, prompt_input, prompts_file, merged, base_only, max_new_tokens,
                 temperature, top_p, seed, engine):
    """Generate from RUN's model, prompts laid out as in its training (into RUN/generations/)."""
    job = post.new_job("generate", run, executor)
    if (prompt is None) == (prompts_file is None):
        raise UserError("generate: give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    fmt = job.resolved["trainer"]["data"]["format"]
    if prompt is not None and fmt not in FORMATS:
        raise UserError(f"--prompt: the run's format {fmt} needs records; use --prompts FILE.jsonl")
    if prompt_input is not None and (prompt is None or fmt not in INPUT_FIELD):
        raise UserError(f"--input: goes with --prompt, for a format with an input field ({', '.join(INPUT_FIELD)}; "
                        f"the run's is {fmt})")
    if prompt is not None and fmt == "squad" and prompt_input is None:
        raise UserError("--prompt: the run's format squad needs the passage too: --input CONTEXT")
    if prompt is not None:
        try:  # the job's own checks of the record --prompt makes (an empty text, one that is not UTF-8)
            check_prompt(fmt, from_text(fmt, prompt, prompt_input), "--prompt")
        except DataError as exc:
            raise UserError(str(exc)) from None
    _sampling_only_given(temperature)
    if merged is not None and base_only:
        raise UserError("generate: --merged and --base-only exclude each other")
    rank = int(job.resolved["trainer"]["lora"]["dim"])
    if engine == "vllm" and merged is None and not base_only and vllm_lora_rank(rank) is None:
        raise UserError(f"--engine vllm: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}, and the run's "
                        f"trainer.lora.dim is {rank}; use --engine transformers (or --merged DIR)")
    if merged is not None:
        merged_dir = Path(merged).expanduser().resolve()
        if not (merged_dir / "config.json").is_file():
            raise UserError(f"--merged {merged}: not a Hugging Face model directory (no config.json)")
        job.args += ["--merged", str(merged_dir)]
    elif not post.pretrained(job.resolved):
        raise UserError("generate: run has no pretrained base (trainer.checkpoint.pretrained is unset); "
                        "generate needs one, or --merged DIR")
    if merged is None and not base_only:
        _checkpoint_args(job, iteration)
    elif iteration is not None:
        raise UserError("--checkpoint: not used with --merged or --base-only")
    if prompts_file is not None:
        read_prompts(prompts_file, fmt=fmt)
        job.copies["prompts.jsonl"] = prompts_file
        job.args += ["--prompts", str(job.post_dir / "prompts.jsonl")]
    else:
        job.args += ["--prompt", prompt] + (["--input", prompt_input] if prompt_input is not None else [])
    job.args += ["--max-new-tokens", max_new_tokens, "--temperature", temperature, "--top-p", top_p,
                 "--seed", seed, "--engine", engine] + (["--base-only"] if base_only else [])
    _finish(job)


@click.command("eval")
@common
@click.option("--data", default=None, metavar="PATH", help="another dataset in the run's format (default: its "
              "validation split)")
def eval_cmd(run, iteration, executor, data):
    """Eval loss and token accuracy of RUN's checkpoint, without training (into RUN/evals/)."""
    job = post.new_job("eval", run, executor)
    _checkpoint_args(job, iteration)
    if data is not None:
        job.args += ["--data", str(check_eval_data(data, job.resolved))]
    elif not (job.resolved["trainer"]["data"].get("validation") or {}).get("path") and \
            not (job.resolved["trainer"]["data"].get("validation") or {}).get("hf_name"):
        raise UserError("eval: the run has no validation split (trainer.data.validation); give --data PATH")
    _finish(job)


def show_results(run_dir, out=sys.stdout, rows: list | None = None) -> None:
    """The post jobs of a run (`rows`: post.results' already read), one line each (under `status RUN`)."""
    for r in post.results(run_dir) if rows is None else rows:
        out.write(f"{r['kind']:<8} {r['id']}  {r['state']:<9} {r['summary'] or r.get('reason') or '-'}\n")


def register(group: click.Group) -> None:
    for command in (export_cmd, generate_cmd, eval_cmd):
        group.add_command(command)
