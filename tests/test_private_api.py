"""trainer/private_api.py lists every private megatron-core / Transformer Engine name the trainer touches.

The scan reads trainer/**/*.py (ast, nothing imported): imports of `_name`s from megatron.* / transformer_engine.*,
`X._name` and getattr/hasattr/setattr(X, "_name") where X is bound to such a module or class, `super()._name`,
`self._name` and private methods defined in a class whose base is such a class (an override, or a helper that
could shadow one), `_name=` keywords to such a class, and any other `obj._name` on an object the scan cannot
type, which must be listed (seen_as) or named in NOT_MEGATRON_OR_TE. Then every listed megatron-core name is
looked up in the installed megatron-core (0.16.1 here); names that only exist in a later version or in TE say
so and are skipped with that reason.
"""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from trainer import private_api

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("megatron", "transformer_engine", "transformer_engine_torch")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


class _Scan(ast.NodeVisitor):
    """Touches in one file: (dotted name, line) for names bound to megatron/TE, ('.' + attr, line) for others."""

    def __init__(self, tree: ast.Module):
        self.bound: dict[str, str] = {}  # local name -> dotted megatron/TE name (or another module's, unused)
        self.found: list[tuple[str, int]] = []
        self.classes: list[tuple[str, set]] = []  # the enclosing classes: (megatron/TE base or '', own names)
        for node in ast.walk(tree):  # bindings first: an import inside a function binds for the whole file
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if a.name.split(".")[0] in TARGETS and any(_private(p) for p in a.name.split(".")):
                        self.found.append((a.name, node.lineno))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.bound[a.asname or a.name] = f"{node.module}.{a.name}"
                    if node.module.split(".")[0] in TARGETS and any(
                            _private(p) for p in [*node.module.split("."), a.name]):
                        self.found.append((f"{node.module}.{a.name}", node.lineno))
        self.own_classes: dict[str, str] = {}  # a class defined here with a megatron/TE base -> that base
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b for b in map(self.dotted, node.bases) if b and b.split(".")[0] in TARGETS]
                if bases:
                    self.own_classes[node.name] = bases[0]

    def dotted(self, node) -> str | None:
        """The megatron/TE dotted name an expression stands for, None when unknown."""
        if isinstance(node, ast.Name):
            return self.own_classes.get(node.id) or self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def touch(self, owner, attr: str, line: int) -> None:
        if not _private(attr):
            return
        base = self.classes[-1][0] if self.classes else ""
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            if base:
                self.found.append((f"{base}.{attr}", line))
            return
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            if base and attr not in self.classes[-1][1]:
                self.found.append((f"{base}.{attr}", line))  # the base's attribute, set or read
            return  # an own class's own attribute
        dotted = self.dotted(owner)
        if dotted is None:
            self.found.append((f".{attr}", line))
        elif dotted.split(".")[0] in TARGETS:
            self.found.append((f"{dotted}.{attr}", line))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        base = self.own_classes.get(node.name, "")
        own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if base:  # an override of the base's private method, or a helper that must not shadow one
            self.found += [(f"{base}.{name}", node.lineno) for name in sorted(own) if _private(name)]
        self.classes.append((base, own))
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.touch(node.value, node.attr, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr", "setattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            self.touch(node.args[0], node.args[1].value, node.lineno)
        callee = self.dotted(func)
        if callee and callee.split(".")[0] in TARGETS:
            self.found += [(f"{callee}.{k.arg}", node.lineno) for k in node.keywords if k.arg and _private(k.arg)]
        self.generic_visit(node)


def scan() -> dict[str, list[str]]:
    """{touched name: ['trainer/x.py:LINE', ...]} over trainer/**/*.py."""
    touched: dict[str, list[str]] = {}
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        visitor = _Scan(ast.parse(path.read_text(), str(path)))
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for name, line in visitor.found:
            touched.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line}")
    return touched


def _listed() -> dict[str, str]:
    """{what the scan reports: listed name} of NAMES, OWN_IN_SUBCLASSES and NOT_MEGATRON_OR_TE."""
    keys = {(n.seen_as or n.name): n.name for n in private_api.NAMES}
    others = [*private_api.OWN_IN_SUBCLASSES, *private_api.NOT_MEGATRON_OR_TE]
    return {**keys, **{name: name for name in others}}


def test_every_private_name_the_trainer_touches_is_listed():
    listed = _listed()
    unlisted = {name: where for name, where in scan().items() if name not in listed}
    assert not unlisted, ("private megatron-core/TE names the trainer touches that trainer/private_api.py does not "
                          f"list (add them with what they are used for and the versions checked): {unlisted}")


def test_no_listed_name_is_stale():
    """(NOT_MEGATRON_OR_TE may keep a name the trainer dropped: it only excuses what is not megatron's or TE's.)"""
    touched = scan()
    stale = [name for key, name in _listed().items()
             if key not in touched and key not in private_api.NOT_MEGATRON_OR_TE]
    assert not stale, f"trainer/private_api.py lists names the trainer no longer touches: {stale}"


def test_rows_are_complete():
    known = set(private_api.VERSIONS)
    for n in private_api.NAMES:
        assert n.name.split(".")[0] in TARGETS and _private(n.name.rsplit(".", 1)[1]), n.name
        assert n.used_for and n.checked and set(n.checked) <= known, n


def _resolve(dotted: str):
    """Import the longest module prefix of `dotted`, then getattr the rest; an instance attribute (set in
    __init__ or a method) counts when the class's source assigns or reads self.<name>."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, attr in enumerate(parts[cut:]):
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif inspect.isclass(obj) and i == len(parts[cut:]) - 1 and any(
                    f"self.{attr}" in inspect.getsource(k) for k in obj.__mro__ if k.__module__.startswith(TARGETS)):
                return obj
            else:
                raise AttributeError(f"{'.'.join(parts[:cut + i])} has no {attr}")
        return obj
    raise ImportError(f"no module of {dotted} imports")


@pytest.mark.parametrize("row", private_api.NAMES, ids=lambda n: n.name)
def test_listed_megatron_name_exists_in_the_installed_megatron_core(row):
    if row.skip_here:
        pytest.skip(row.skip_here)
    pytest.importorskip("megatron.core")
    _resolve(row.name)


@pytest.mark.parametrize("name", sorted(private_api.OWN_IN_SUBCLASSES), ids=str)
def test_own_helpers_shadow_nothing_in_the_installed_megatron_core(name):
    """A private helper of ours in a megatron-core subclass must not be a name the base class has."""
    if not name.startswith("megatron."):
        pytest.skip("a TE class: TE is not installed here (checked in the source, see OWN_IN_SUBCLASSES)")
    module, cls, attr = name.rsplit(".", 2)
    base = getattr(importlib.import_module(module), cls)
    assert not hasattr(base, attr), f"{name}: megatron-core has it, so ours overrides it (list it in NAMES)"
