"""The README and the docs/ pages point at files that exist, at the contract for the keys and rules (not at the
launcher's re-export shim), and say where the run registry lives (issue 28 item 7: they had drifted). The README's
text moved to docs/ pages (issue 33 item 9): the checks follow it there."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KEYS_AND_RULES = [ROOT / "README.md", ROOT / "docs" / "contract.md", ROOT / "docs" / "recipes.md"]
REGISTRY_DOC = ROOT / "docs" / "architecture.md"
PATH_RE = re.compile(r"\b((?:primus_slurm|primus_contract|trainer|scripts|templates|tests|bench|docs)/"
                     r"[\w/.-]*\w\.(?:py|j2|sh|yaml|md))\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_file_the_docs_name_exists(doc):
    named = set(PATH_RE.findall(doc.read_text()))
    assert named or doc.parent.name == "docs", doc  # (a short page may name none)
    missing = sorted(p for p in named if not (ROOT / p).exists() and not list(ROOT.glob(p)))
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", KEYS_AND_RULES, ids=lambda p: p.name)
def test_keys_and_rules_are_pointed_at_the_contract(doc):
    text = doc.read_text()
    assert "primus_slurm/config/schema.py" not in text  # a re-export of primus_contract/fields.py
    assert "primus_contract/fields.py" in text or "primus_contract/" in text


def test_the_registry_location_is_the_documented_one(monkeypatch, tmp_path):
    from primus_slurm.jobs import registry

    text = REGISTRY_DOC.read_text()
    monkeypatch.delenv("PRIMUS_SLURM_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert registry.registry_path() == tmp_path / ".local" / "state" / "primus-slurm" / "runs.jsonl"
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(tmp_path / "s"))
    assert registry.registry_path() == tmp_path / "s" / "runs.jsonl"
    for words in ("`runs.jsonl`", "`$PRIMUS_SLURM_STATE_DIR`", "`$XDG_STATE_HOME/primus-slurm`",
                  "`~/.local/state/primus-slurm`"):
        assert words in text, words
