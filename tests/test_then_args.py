"""`--then STEP [options]` (primus_slurm/experiments/pipeline.py) down to the argument list the step's job gives
`python -m trainer.post`: what the user typed reaches the job's parser as the same values. A prompt that starts
with '-' was passed as its own word, which the job's argparse would have taken for an option (audit, 2026-12-06)."""
from __future__ import annotations

from conftest import ROOT
from primus_slurm.config.recipe import load_recipe
from primus_slurm.experiments.pipeline import override, parse_then, step_job
from trainer.post.__main__ import parser


def test_a_generate_prompt_that_looks_like_an_option_stays_the_prompt(tmp_path):
    rest, steps = parse_then(["--then", "generate", "--prompt", "--seed", "--max-new-tokens", "5",
                              "--then", "eval"])
    assert rest == [] and [s["step"] for s in steps] == ["generate", "eval"]
    resolved = load_recipe(ROOT / "recipes" / "quickstart.yaml", overrides=override(steps)).resolved
    job = step_job(resolved["after"][0], "run-1", tmp_path, resolved, "local")
    args = parser().parse_args(["generate", "--run", str(tmp_path), "--out", str(tmp_path / "o"),
                                *map(str, job.args)])
    assert (args.prompt, args.max_new_tokens, args.seed) == ("--seed", 5, 0)


def test_validate_takes_then_and_gives_submits_verdict(tmp_path, capsys):
    """`validate` and `submit` give one verdict: with --then steps too (validate had no --then; audit, 2026-12-06)."""
    from primus_slurm.cli import run

    qs = str(ROOT / "recipes" / "quickstart.yaml")
    missing = ["--then", "eval", "--then", "generate", "--prompts", str(tmp_path / "none.jsonl")]
    assert run(["validate", qs, *missing]) == 2 == run(["submit", qs, "--dry-run", *missing])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == err[1] and err[0].startswith("error: `after[1].prompts`")
    assert run(["validate", qs, "--then", "eval", "--then", "export", "--merged"]) == 0
