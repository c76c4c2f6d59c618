"""docs/contract.md says every key of its resolved-recipe block is present: the block and the schema's trainer
section must list the same keys (a field added to one and not the other is a contract the docs do not state)."""
import re
from pathlib import Path

import yaml

from primus_slurm.config.schema import SCHEMA

DOC = Path(__file__).resolve().parent.parent / "docs" / "contract.md"


def _leaves(tree: dict, prefix: str) -> set:
    out = set()
    for key, value in tree.items():
        path = f"{prefix}.{key}"
        out |= _leaves(value, path) if isinstance(value, dict) and value else {path}
    return out


def test_contract_block_lists_every_trainer_key():
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S).group(1)
    documented = _leaves(yaml.safe_load(block)["trainer"], "trainer")
    schema = _leaves(SCHEMA["trainer"], "trainer")
    assert schema - documented == set(), "in the schema, not in docs/contract.md"
    assert documented - schema == set(), "in docs/contract.md, not in the schema"
