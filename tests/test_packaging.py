"""One distribution: a built wheel carries the launcher, the trainer, the templates and the recipes, and the
launcher never imports trainer dependencies."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_trainer_subpackage_is_declared():
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "trainer").rglob("__init__.py")}
    found |= {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "primus_slurm").rglob("__init__.py")}
    assert found <= declared, f"add to pyproject packages: {sorted(found - declared)}"


@pytest.mark.slow
def test_wheel_contains_data_and_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("primus_slurm-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("primus_slurm/cli.py", "primus_slurm/templates/job.sh.j2", "primus_slurm/templates/profiles.yaml",
                     "primus_slurm/recipes/llama2_70b_fp4.yaml", "primus_slurm/recipes/quickstart.yaml",
                     "primus_slurm/recipes/models/llama3_8b.yaml", "primus_slurm/recipes/presets/mi300x.yaml",
                     "primus_slurm/recipes/data/quickstart/train.jsonl",
                     "primus_slurm/recipes/data/quickstart/tokenizer/tokenizer.json",
                     "primus_slurm/recipes/data/quickstart/base/model.safetensors",
                     "primus_slurm/recipes/proxies/qwen3_30b_a3b_proxy.yaml",
                     "trainer/__main__.py", "trainer/data/__init__.py", "trainer/model/__init__.py"):
        assert required in names, required


def test_launcher_imports_no_trainer_dependency():
    code = ("import sys; import primus_slurm.cli, primus_slurm.config.recipe, primus_slurm.config.render; "
            "bad = [m for m in ('torch', 'megatron', 'transformer_engine', 'datasets', 'numpy') if m in sys.modules]; "
            "print(','.join(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""
