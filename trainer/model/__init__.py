"""Model half of the trainer: GPTModel construction, LoRA, HF import and PEFT export.

    from trainer.model import build, build_model, forward_losses, adapter_state_dict, ...
"""
from trainer.model.build import BuiltModel, build, build_model
from trainer.model.forward import forward_losses
from trainer.model.lora.state import (adapter_state_dict, allreduce_sequence_parallel_grads,
                                load_adapter_state_dict)


def export_peft(model, cfg, out_dir):
    from trainer.model.peft_export import export_peft as _export

    return _export(model, cfg, out_dir)


__all__ = ["BuiltModel", "build", "build_model", "forward_losses", "adapter_state_dict", "load_adapter_state_dict",
           "allreduce_sequence_parallel_grads", "export_peft"]
