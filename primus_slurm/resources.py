"""Where the shipped data lives: templates/ and recipes/ from a checkout, or the installed package data."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def data_dir(name: str) -> Path:
    """`templates` or `recipes`: the checkout's folder when running from a clone, else the installed copy."""
    local = _CHECKOUT / name
    if (local / ".primus-data").exists():
        return local
    return Path(str(importlib.resources.files(f"primus_slurm.{name}")))


def templates_dir() -> Path:
    return data_dir("templates")


def recipes_dir() -> Path:
    return data_dir("recipes")
