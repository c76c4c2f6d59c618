"""The step FLOPs model lives in the contract (primus_contract/flops.py: pure Python, imported by the trainer for
TFLOP/s and by the launcher's planner for step time); this module is the trainer's name for it."""
from primus_contract.flops import (attention_fwd_flops, base_linear_fwd_flops_per_token, doc_length_stats,  # noqa: F401
                                   is_adapted, layer_linears, lora_fwd_flops_per_token, step_flops)
