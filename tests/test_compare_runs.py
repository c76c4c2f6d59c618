"""compare and verify-fp4 against run directories laid out as docs/contract.md describes."""
import sys
from pathlib import Path

import pytest
import yaml

from primus_slurm.cli import run as cli_run

PREC = {"fp4": None, "fp8": None}


def make_run(root: Path, name: str, losses, precision_line: str, fp4=None, fp8=None, lr=1e-4, seed=1234,
             tok=1000.0, mem=10.0, attempts=None, train_iters=4, lr_decay_iters=None):
    d = root / name
    (d / "logs" / "rank-0").mkdir(parents=True)
    recipe = {"experiment": {"seed": seed, "name": "x"},
              "trainer": {"model": {"num_layers": 2}, "data": {"train": {"path": "d.jsonl"}, "seq_length": 64,
                                                                "packing": True, "format": "alpaca"},
                          "schedule": {"global_batch_size": 8, "lr": lr, "micro_batch_size": 1, "lr_decay": "cosine",
                                       "train_iters": train_iters, "lr_decay_iters": lr_decay_iters},
                          "precision": {"fp4": fp4, "fp8": fp8}, "logging": {"log_avg_skip_iterations": 1}}}
    (d / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    lines = ["[2026-11-30 01:02:03] primus-trainer start | attempt 0 | world_size 1 | device cpu | resumed_from none",
             f"[2026-11-30 01:02:03] arg trainer.precision.fp4 = {fp4}",
             f"[2026-11-30 01:02:03] {precision_line}"]
    for i, loss in enumerate(losses, 1):
        t = tok if i > 1 else 1.0   # iteration 1 is skipped by the averages
        lines.append(f"[2026-11-30 01:02:05] iteration {i}/{len(losses)} | lm loss {loss:.6E} | lr 1.000000E-04 | "
                     f"grad norm 1.0E-01 | tokens/s/GPU {t} | TFLOP/s/GPU 1.0 | mem alloc GiB 1.0 | "
                     f"mem peak GiB {mem if i > 1 else 99} | ms/iter 10.0")
    (d / "logs" / "rank-0" / "debug.log").write_text("\n".join(lines) + "\n")
    for n, extra in (attempts or {}).items():
        (d / "logs" / "rank-0" / f"debug.attempt-{n}.log").write_text("\n".join(extra) + "\n")
    return d


FP4_EMU = "precision | fp4 e2m1 | fp8 None | recipe NVFP4-emulated | tensor_class NVFP4EmulatedQDQ | mode fp4-local-emulated"
FP4_NATIVE = "precision | fp4 e2m1 | fp8 None | recipe NVFP4BlockScaling | tensor_class NVFP4Tensor | mode fp4-native"
FP8 = "precision | fp4 None | fp8 hybrid | recipe DelayedScaling | tensor_class Float8Tensor | mode fp8"
BF16 = "precision | fp4 None | fp8 None | recipe none | tensor_class torch.Tensor | mode bf16 | weight_dtype bfloat16"


def test_compare_table_divergence_and_plot(tmp_path, capsys):
    a = make_run(tmp_path, "bf16", [3.0, 2.5, 2.0, 1.8], BF16)
    b = make_run(tmp_path, "fp4", [3.0, 2.6, 2.1, 1.6], FP4_EMU, fp4="e2m1")
    png = tmp_path / "out" / "cmp.png"
    assert cli_run(["compare", str(a), str(b), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "2.600000" in out and "2.500000" in out
    assert "max |d lm loss| 0.200000, mean 0.100000 over 4 iterations" in out
    assert "fp4 (fp4 NVFP4-emulated) against the reference bf16 (bfloat16)" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_uses_restart_values(tmp_path, capsys, monkeypatch):
    later = ["[2026-11-30 02:00:00] iteration 4/4 | lm loss 1.000000E+00 | tokens/s/GPU 5"]
    a = make_run(tmp_path, "a", [3.0, 2.5, 2.0, 1.8], BF16, attempts={1: later})
    b = make_run(tmp_path, "b", [3.0, 2.5, 2.0, 1.8], BF16)
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    assert cli_run(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "max |d lm loss| 0.800000" in out
    assert "plot:" not in out and list(here.iterdir()) == []  # no --plot: nothing written


def test_compare_refuses_different_lr(tmp_path, capsys):
    a = make_run(tmp_path, "a", [3.0], BF16)
    b = make_run(tmp_path, "b", [3.0], BF16, lr=2e-4)
    assert cli_run(["compare", str(a), str(b), "--plot", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trainer.schedule.lr" in err and err.startswith("error: runs differ")


def test_compare_refuses_a_different_lr_schedule(tmp_path, capsys):
    """Peak LR alone is not the schedule: a cosine decay that ends elsewhere gives other losses from the start."""
    a = make_run(tmp_path, "a", [3.0], BF16, train_iters=40)
    b = make_run(tmp_path, "b", [3.0], BF16, train_iters=300)
    assert cli_run(["compare", str(a), str(b)]) == 2
    assert "runs differ in LR decay end (trainer.schedule.lr_decay_iters, else train_iters) (a: 40, b: 300)" in \
        capsys.readouterr().err
    c = make_run(tmp_path, "c", [3.0], BF16, train_iters=300, lr_decay_iters=40)  # longer, same schedule
    assert cli_run(["compare", str(a), str(c)]) == 0


def test_compare_refuses_unknown_run(tmp_path, capsys):
    a = make_run(tmp_path, "a", [3.0], BF16)
    assert cli_run(["compare", str(a), str(tmp_path / "nope"), "--plot", ""]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert cli_run(["compare", str(a), str(a), "--plot", str(tmp_path / "x.txt")]) == 2  # matplotlib raised
    assert "the plot is a PNG" in capsys.readouterr().err and not (tmp_path / "x.txt").exists()


def test_verify_native_fp4_all_hold(tmp_path, capsys):
    fp4 = make_run(tmp_path, "fp4", [3.0, 2.0, 1.5], FP4_NATIVE, fp4="e2m1", tok=1500, mem=8.0)
    fp8 = make_run(tmp_path, "fp8", [3.0, 2.0, 1.5], FP8, fp8="hybrid", tok=1000, mem=10.0)
    assert cli_run(["verify-fp4", str(fp4), "--fp8-run", str(fp8)]) == 0
    out = capsys.readouterr().out
    assert out.count("[PASS]") == 5 and "5/5 hold" in out
    assert "FP4 1500.00 vs FP8 1000.00 (x1.50)" in out and "FP4 8.00 vs FP8 10.00" in out


# the line an emulated run logged on the H100 (2026-12-05): TE's reference tensor class, whose name holds NVFP4Tensor
FP4_EMU_TE = ("precision | fp4 e2m1 | fp8 None | recipe NVFP4-emulated | tensor_class PrimusNVFP4TensorRef | "
              "mode fp4-te-emulated | format nvfp4 act/grad 1x16, weight 16x16 | weight_dtype bfloat16")


@pytest.mark.parametrize("line", [FP4_EMU, FP4_EMU_TE])
def test_verify_emulated_says_so(tmp_path, capsys, line):
    fp4 = make_run(tmp_path, "fp4", [3.0, 2.0], line, fp4="e2m1", tok=600, mem=12.0)
    fp8 = make_run(tmp_path, "fp8", [3.0, 2.0], FP8, fp8="hybrid", tok=1000, mem=10.0)
    assert cli_run(["verify-fp4", str(fp4), "--fp8-run", str(fp8)]) == 1
    out = capsys.readouterr().out
    assert "3. [PASS]" in out and "EMULATED" in out and "hardware path" not in out
    assert "4. [FAIL]" in out and "5. [FAIL]" in out and "expected for emulation" in out
    assert "3/5 hold" in out


def test_verify_bf16_run_fails_and_without_fp8_not_checked(tmp_path, capsys):
    bf = make_run(tmp_path, "bf", [3.0], BF16)
    assert cli_run(["verify-fp4", str(bf)]) == 1
    out = capsys.readouterr().out
    assert "1. [FAIL]" in out and "3. [FAIL]" in out and "4. [NOT CHECKED]" in out and "1/5 hold" in out
    fp8run = make_run(tmp_path, "f8", [3.0], FP8, fp8="hybrid")
    assert cli_run(["verify-fp4", str(fp8run)]) == 1
    assert "2. [FAIL] fp8 is None: precision line: fp8 hybrid" in capsys.readouterr().out


def test_verify_refuses_fp8_run_of_another_recipe(tmp_path, capsys):
    fp4 = make_run(tmp_path, "fp4", [3.0], FP4_NATIVE, fp4="e2m1")
    other = make_run(tmp_path, "bf", [3.0], BF16)
    assert cli_run(["verify-fp4", str(fp4), "--fp8-run", str(other)]) == 2
    assert "did not run FP8" in capsys.readouterr().err


def test_cli_modules_do_not_import_torch(tmp_path):
    import subprocess

    code = "import sys, primus_slurm.post_training.compare, primus_slurm.post_training.verify_fp4, primus_slurm.planning.precision_cli; " \
           "assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _events_run(root: Path, name: str, attempts: list[list[list]]) -> Path:
    """A run whose event streams log `attempts`: per attempt, its log points as lists of (iteration, loss)."""
    import json

    d = make_run(root, name, [], BF16, train_iters=10)
    for n, points in enumerate(attempts):
        events = [{"event": "metrics", "iteration": pts[-1][0], "lm_loss": sum(v for _, v in pts) / len(pts),
                   "losses": [list(p) for p in pts]} for pts in points]
        (d / "logs" / "rank-0" / ("events.jsonl" if n == 0 else f"events.attempt-{n}.jsonl")).write_text(
            "".join(json.dumps(e) + "\n" for e in events))
        if n:
            (d / "logs" / "rank-0" / f"debug.attempt-{n}.log").write_text("")
    return d


def test_a_resumed_run_equals_its_uninterrupted_twin(tmp_path, capsys):
    """Stopped at 8 and resumed: the interval means at 8 and 10 average 3 and 2 iterations where the twin's at 10
    averages 5, so comparing the logged means reported a difference that is not there (issue 28 item 5)."""
    loss = {i: 3.0 - 0.2 * i for i in range(1, 11)}
    iv = lambda a, b: [(i, loss[i]) for i in range(a, b + 1)]  # noqa: E731
    twin = _events_run(tmp_path, "twin", [[iv(1, 5), iv(6, 10)]])
    resumed = _events_run(tmp_path, "resumed", [[iv(1, 5), iv(6, 8)], [iv(9, 10)]])
    assert cli_run(["compare", str(twin), str(resumed)]) == 0
    out = capsys.readouterr().out
    assert "compared: per-iteration losses" in out
    assert "resumed against the reference twin: equal: max |d lm loss| 0.000000, mean 0.000000 over 10 " \
           "iterations" in out, out
    off = {**loss, 9: loss[9] + 0.01}
    _events_run(tmp_path, "other", [[[(i, off[i]) for i in range(1, 6)], [(i, off[i]) for i in range(6, 11)]]])
    assert cli_run(["compare", str(twin), str(tmp_path / "other")]) == 0
    assert "different: max |d lm loss| 0.010000" in capsys.readouterr().out
