"""`primus-slurm verify-fp4 RUN [--fp8-run RUN]`: did RUN really train in FP4? Five pieces of evidence:

1. the fp4 argument is e2m1            (`precision | fp4 e2m1 | ...` and the args dump)
2. fp8 is None                         (fp4 and fp8 are exclusive; a set fp8 means FP8 ran)
3. the TE recipe / tensor class is FP4 (NVFP4BlockScaling / MXFP4BlockScaling / NVFP4Tensor / Float4Tensor),
                                       or the emulation, named as such (NVFP4-emulated: FP4 numerics, not FP4 hardware)
4. peak memory below an FP8 run of the same recipe
5. throughput above that FP8 run
Each line says PASS / FAIL / NOT CHECKED and why. Never imports torch.
"""
from __future__ import annotations

from typing import Optional

from primus_slurm.post_training.compare import RunLog, get, load_run
from primus_slurm.errors import UserError

FP4_RECIPES = ("NVFP4BlockScaling", "MXFP4BlockScaling")
FP4_TENSORS = ("NVFP4Tensor", "Float4Tensor", "MXFP4Tensor")
MODEL_KEYS = (("trainer", "model"), ("trainer", "data", "seq_length"), ("trainer", "schedule", "micro_batch_size"),
              ("trainer", "schedule", "global_batch_size"), ("trainer", "parallelism"), ("trainer", "lora"),
              ("trainer", "recompute"))


def _arg(run: RunLog, name: str) -> Optional[str]:
    for key in (f"trainer.precision.{name}", f"precision.{name}", name):
        if key in run.args:
            return run.args[key]
    return None


def _fp4_arg(run: RunLog) -> tuple[Optional[bool], str]:
    line, arg = run.precision.get("fp4"), _arg(run, "fp4")
    seen = line if line is not None else arg
    if seen is None:
        return None, "no `precision |` line or fp4 arg in the log"
    ok = seen == "e2m1" and arg in (None, "e2m1")
    return ok, f"precision line: fp4 {line}" + (f"; arg fp4 = {arg}" if arg is not None else "")


def _fp8_none(run: RunLog) -> tuple[Optional[bool], str]:
    line, arg = run.precision.get("fp8"), _arg(run, "fp8")
    if line is None and arg is None:
        return None, "no `precision |` line or fp8 arg in the log"
    ok = line in (None, "None") and arg in (None, "None", "null")
    return ok, f"precision line: fp8 {line}" + (f"; arg fp8 = {arg}" if arg is not None else "")


def _recipe_class(run: RunLog) -> tuple[Optional[bool], str]:
    if not run.precision:
        return None, "no `precision |` line in the log"
    recipe, tclass = run.precision.get("recipe", ""), run.precision.get("tensor_class", "")
    shown = f"recipe {recipe}, tensor_class {tclass}"
    # the emulated recipe first: its TE tensor class on the GPU (PrimusNVFP4TensorRef) contains "NVFP4Tensor"
    if recipe.endswith("-emulated") and recipe[:5] in ("NVFP4", "MXFP4"):
        return True, shown + " (EMULATED: FP4 numerics with bf16 GEMMs, not FP4 hardware)"
    if recipe in FP4_RECIPES or any(t in tclass for t in FP4_TENSORS):
        return True, shown + " (FP4 hardware path)"
    return False, shown


def _same_recipe(fp4: RunLog, fp8: RunLog) -> None:
    for path in MODEL_KEYS:
        a, b = get(fp4.recipe, path), get(fp8.recipe, path)
        if a != b:
            raise UserError(f"--fp8-run differs from RUN in {'.'.join(path)}; the memory/throughput checks need "
                            "an FP8 run of the same recipe")
    if get(fp8.recipe, ("trainer", "precision", "fp8")) in (None, "null") and fp8.precision.get("fp8") in (None, "None"):
        raise UserError(f"--fp8-run {fp8.name} did not run FP8 (trainer.precision.fp8 is null)")


def _versus(run: RunLog, fp8: Optional[RunLog], key: str, lower_is_better: bool, what: str):
    if fp8 is None:
        return None, "no --fp8-run given"
    mine, theirs = run.average(key), fp8.average(key)
    if mine is None or theirs is None:
        return None, f"'{key}' missing from {'RUN' if mine is None else '--fp8-run'} iteration lines"
    ratio = mine / theirs if theirs else float("inf")
    ok = mine < theirs if lower_is_better else mine > theirs
    note = f"{what}: FP4 {mine:.2f} vs FP8 {theirs:.2f} (x{ratio:.2f})"
    if not ok and run.precision.get("recipe", "").endswith("-emulated"):
        note += "; expected for emulation, which stores and multiplies in bf16"
    return ok, note


def verify(ref: str, fp8_ref: Optional[str] = None) -> tuple[str, bool]:
    run = load_run(ref)
    fp8 = load_run(fp8_ref) if fp8_ref else None
    if fp8 is not None:
        _same_recipe(run, fp8)
    checks = [
        ("fp4 argument is e2m1", _fp4_arg(run)),
        ("fp8 is None", _fp8_none(run)),
        ("TE recipe / tensor class is FP4", _recipe_class(run)),
        ("peak memory below the FP8 run", _versus(run, fp8, "mem peak GiB", True, "mem peak GiB")),
        ("throughput above the FP8 run", _versus(run, fp8, "tokens/s/GPU", False, "tokens/s/GPU")),
    ]
    lines = [f"verify-fp4 {run.name}" + (f" (vs FP8 run {fp8.name})" if fp8 else "")]
    for i, (title, (ok, why)) in enumerate(checks, 1):
        verdict = "NOT CHECKED" if ok is None else ("PASS" if ok else "FAIL")
        lines.append(f"  {i}. [{verdict}] {title}: {why}")
    held = sum(1 for _, (ok, _) in checks if ok)
    emulated = run.precision.get("recipe", "").endswith("-emulated")
    lines.append(f"{held}/5 hold" + (" - this run EMULATED FP4; it is evidence of FP4 numerics, not FP4 hardware"
                                      if emulated else ""))
    return "\n".join(lines), held == 5
