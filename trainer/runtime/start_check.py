"""The trainer's verdict on the resolved recipe before anything is built (no distributed init, no model):

1. primus_contract.check_resolved: the same schema and cross-field rules `validate`/`submit` ran;
2. the machine rules the contract declares (primus_contract.machine), on this machine's Environment;
3. the trainer's own readers: the data options and megatron-core's TransformerConfig (its __post_init__ checks).

Every refusal is a StartRefused with one line naming the field (exit 2 in trainer/__main__.py).
"""
from __future__ import annotations

from typing import Optional

import primus_contract
from primus_contract.machine import Environment, offload_error
from trainer import precision
from trainer.config import ConfigError
from trainer.data.errors import DataError
from trainer.data.options import DataOptions


class StartRefused(Exception):
    """The recipe cannot run here; `field` is the key the refusal names (None when it names none)."""

    def __init__(self, message: str, field: Optional[str] = None):
        super().__init__(" ".join(str(message).split()))
        self.field = field


def _field_of(message: str) -> Optional[str]:
    return primus_contract.ContractError(message).field or (message.split(":")[0].split()[0] if message else None)


def pre_start(cfg, env: Optional[Environment] = None, megatron: bool = True) -> precision.Precision:
    """Raise StartRefused unless the recipe runs on `env` (None: probe this process's machine); the run's
    precision, resolved (the one probe and Mode of a training run)."""
    try:
        primus_contract.check_resolved(cfg.to_dict())
    except primus_contract.ContractError as err:
        raise StartRefused(str(err), err.field) from None
    try:
        prec = precision.resolve(cfg, env)
        DataOptions.from_config(cfg)
    except (precision.PrecisionError, DataError, ConfigError) as err:
        raise StartRefused(str(err), _field_of(str(err))) from None
    problem = offload_error(int(cfg.trainer.recompute.activation_offload_layers), prec.env)
    if problem:
        raise StartRefused(problem, _field_of(problem))
    if megatron:
        _megatron_config(cfg, prec)
    return prec


def _megatron_config(cfg, prec: precision.Precision) -> None:
    """megatron-core's own TransformerConfig checks, on the kwargs the model build will pass."""
    import torch

    from trainer.model.build import make_transformer_config
    from trainer.model.specs import te_available

    device = torch.device("cuda" if prec.env.device == "cuda" else "cpu")
    try:
        make_transformer_config(cfg, device, te_available(device), prec)
    except (ValueError, AssertionError, ConfigError, precision.PrecisionError) as err:
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise StartRefused(f"megatron-core refuses the recipe: {line}", _field_of(line)) from None
