"""The architecture's rules that a test can hold: primus_contract is standard library only, and no module of a
package shadows a name its package exports (6acf67a added primus_contract/checkpoint_rules.py beside the package's
checkpoint_rules function: once the module was imported, every submit died with "'module' object is not
callable")."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
import types

import pytest

from conftest import ROOT


@pytest.mark.parametrize("package", ["primus_contract", "primus_slurm", "trainer"])
def test_no_module_shadows_what_its_package_exports(package):
    pkg = importlib.import_module(package)
    exported = {k: v for k, v in vars(pkg).items() if not k.startswith("_") and not isinstance(v, types.ModuleType)}
    clashes = sorted(name for name in exported if (ROOT / package / f"{name}.py").is_file()
                     or (ROOT / package / name / "__init__.py").is_file())
    assert not clashes, f"{package} exports {clashes}, and a module of the same name replaces it once imported"


def test_primus_contract_imports_only_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"primus_contract", "__future__"}
    bad = []
    for info in pkgutil.walk_packages([str(ROOT / "primus_contract")], "primus_contract."):
        path = ROOT / (info.name.replace(".", "/") + ("/__init__.py" if info.ispkg else ".py"))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            bad += [f"{info.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert not bad, bad
