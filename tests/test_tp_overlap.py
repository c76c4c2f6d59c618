"""trainer.parallelism.tp_comm_overlap: the megatron flags it sets, and its refusals where TE userbuffers
cannot run (the overlap itself needs a GPU with TE; its throughput is in bench/results)."""
import pytest
import torch

from tests.model_helpers import tiny_cfg
from trainer.config import ConfigError
from trainer.model import tp_overlap
from trainer.model.build import make_transformer_config

ON = {"parallelism": {"tensor": 2, "sequence_parallel": True, "tp_comm_overlap": True}}


def test_off_by_default_sets_nothing():
    cfg = tiny_cfg()
    assert cfg.trainer.parallelism.tp_comm_overlap is False
    assert tp_overlap.config_kwargs(cfg) == {}
    config = make_transformer_config(cfg, torch.device("cpu"), use_te=False)
    assert config.tp_comm_overlap is False
    tokens = tp_overlap.initialize(cfg, config, torch.device("cpu"), use_te=False)
    assert tokens is None
    tp_overlap.check_tokens(16, tokens)  # no buffer size refuses this model's micro-batches


def test_flags_reach_a_real_transformer_config():
    cfg = tiny_cfg(trainer=ON)
    config = make_transformer_config(cfg, torch.device("cpu"), use_te=False)
    # frozen base: no wgrad GEMM, so the bulk overlaps are off and dgrad's reduce-scatter is pipelined
    assert (config.tp_comm_overlap, config.tp_comm_overlap_ag, config.tp_comm_overlap_rs) == (True, True, True)
    assert config.tp_comm_overlap_rs_dgrad is True
    assert (config.tp_comm_bulk_dgrad, config.tp_comm_bulk_wgrad) == (False, False)


@pytest.mark.parametrize("device,use_te,extra,expect", [
    ("cpu", False, {}, "needs a GPU with Transformer Engine"),
    ("cpu", True, {}, "needs a GPU with Transformer Engine"),
    ("cuda", False, {}, "needs a GPU with Transformer Engine"),
    ("cuda", True, {"precision": {"fp4": "e2m1", "fp4_emulation": True}}, "carries BF16 or FP8"),
    ("cuda", True, {"parallelism": {"tensor": 2, "sequence_parallel": False, "tp_comm_overlap": True}},
     "needs trainer.parallelism.sequence_parallel: true"),
])
def test_refusals_name_the_field(device, use_te, extra, expect):
    cfg = tiny_cfg(trainer={**ON, **extra})
    config = make_transformer_config(cfg, torch.device("cpu"), use_te=False)
    with pytest.raises(ConfigError) as info:
        tp_overlap.initialize(cfg, config, torch.device(device), use_te=use_te)
    msg = str(info.value)
    assert msg.startswith("trainer.parallelism.tp_comm_overlap") and expect in msg and "\n" not in msg


@pytest.mark.parametrize("precision,expect", [
    ({"fp8_recipe": "blockwise"}, "not blockwise"),  # TE cannot fill a buffer from block-scaled data
    ({"first_last_layers_bf16": True}, "first_last_layers_bf16"),  # BF16 layers would need a second buffer set
])
def test_fp8_variants_userbuffers_cannot_carry(precision, expect):
    cfg = tiny_cfg(trainer={**ON, "precision": {"fp8": "hybrid", "bf16": True, "fp8_recipe": "tensorwise", **precision}})
    config = make_transformer_config(tiny_cfg(trainer=ON), torch.device("cpu"), use_te=False)
    config.fp8 = "hybrid"  # (a CPU cannot build an FP8 config; the refusal reads the recipe's precision)
    with pytest.raises(ConfigError, match=expect):
        tp_overlap.initialize(cfg, config, torch.device("cuda"), use_te=True)


def test_micro_batch_must_match_the_buffers():
    tp_overlap.check_tokens(2 * 16, 2 * 16)
    with pytest.raises(ValueError, match="micro-batch of 16 tokens.*= 32"):
        tp_overlap.check_tokens(16, 2 * 16)


def test_evaluation_checks_every_micro_batch():
    """The buffers' size travels with the built model (BuiltModel.ub_tokens) to evaluation's micro-batches (and
    the loop's: Trainer.micro_batches); a 16-token pack against 32-token buffers is refused before any forward."""
    import numpy as np

    from trainer.step.evaluate import evaluate

    pack = {"input_ids": np.zeros(16, np.int64), "labels": np.zeros(16, np.int64), "loss_mask": np.ones(16),
            "position_ids": np.arange(16), "cu_seqlens": [0, 16], "num_tokens": 16}
    with pytest.raises(ValueError, match="micro-batch of 16 tokens.*= 32"):
        evaluate(torch.nn.Linear(2, 2), None, [pack], global_batch_size=1, micro_batch_size=1, eval_iters=1, seed=0,
                 dp_rank=0, dp_size=1, device=torch.device("cpu"), ub_tokens=32)


def test_log_line_counts_norm_linears_that_cannot_overlap(monkeypatch):
    """TE skips the forward all-gather overlap of a LayerNormLinear that returns its norm output (what LoRA
    asks for without adapter_inputs): the log line says how many, counting each wrapped linear once (LoRALinear
    forwards attribute reads to its base)."""
    from trainer.model.lora.layers import LoRALinear

    class NormLinear(torch.nn.Linear):  # the attributes TE's LayerNormLinear carries
        def __init__(self):
            super().__init__(4, 4, bias=False)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(4))
            self.return_layernorm_output, self.ub_name, self.parallel_mode = False, "qkv", "column"

    def lora(base):
        return LoRALinear(base, "linear_qkv", dim=2, alpha=4, dropout=0.0, dropout_position="pre", a_init="xavier",
                          b_init="zero", tp_size=1, tp_rank=0, sequence_parallel=False, seed=0)

    row = torch.nn.Linear(2, 2)
    row.ub_name = "proj"  # a row-parallel linear: no norm output, not counted
    model = torch.nn.Sequential(lora(NormLinear()), NormLinear(), row)
    monkeypatch.setenv("UB_SKIPMC", "1")
    line = tp_overlap.describe(model, 8192)  # LoRA switched its base's norm output on
    assert "8192 tokens a micro-batch" in line and "forward all-gather overlap 1 of 2" in line
    assert "set trainer.recompute.adapter_inputs" in line and line.endswith("UB_SKIPMC 1")
    model[0].base.return_layernorm_output = False  # what adapter_inputs (norm scope) does
    line = tp_overlap.describe(model, 8192)
    assert "overlap 2 of 2" in line and "adapter_inputs" not in line


def test_context_parallelism_is_refused_by_the_trainer_too():
    """Packed batches are not split across context-parallel ranks: a hand-edited resolved recipe with
    context > 1 stops at model build (validate refuses it before submission)."""
    with pytest.raises(ConfigError, match="context > 1 is not supported yet"):
        make_transformer_config(tiny_cfg(trainer={"parallelism": {"context": 2}}), torch.device("cpu"), use_te=False)
