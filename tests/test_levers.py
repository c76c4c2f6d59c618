"""The step's levers (primus_contract/rules_levers.py, trainer/model/levers.py): activation offload reaches
megatron-core's TransformerConfig as its layer-level cpu_offloading fields, or is refused in one line; FP8 attention
reaches it as fp8_dot_product_attention; CUDA graphs are refused, naming why. No model is built."""
import pytest
import torch

from primus_contract.machine import Environment, at_start
from primus_slurm.config.recipe import deep_merge
from primus_slurm.config.schema import apply_schema
from tests.model_helpers import TINY
from trainer.config import Config
from trainer.runtime.start_check import StartRefused, pre_start

H200 = Environment(device="cuda", device_name="NVIDIA H200", cuda_cc=(9, 0), te_version=(2, 20, 2))
H200_NO_TE = Environment(device="cuda", device_name="NVIDIA H200", cuda_cc=(9, 0))
GPU = {"cluster": {"env_profile": "h200", "gpus_per_node": 1, "nproc_per_node": 1},
       "trainer": {"distributed": {"device": "cuda"}, "model": {"num_layers": 4},
                   "data": {"train": {"path": "/data/t"}}, "tokenizer": {"path": "/tok"}}}


def resolved(**trainer) -> dict:
    return apply_schema(deep_merge(deep_merge(TINY, GPU), {"trainer": trainer}))


def transformer_config(r: dict, env: Environment = H200):
    from trainer.model.build import make_transformer_config
    from trainer.precision import resolve

    cfg = Config.from_dict(r)
    return make_transformer_config(cfg, torch.device("cuda"), False, resolve(cfg, env))


def test_offload_reaches_megatron_as_layer_level_cpu_offloading():
    c = transformer_config(resolved(recompute={"activation_offload_layers": 3}))
    assert (c.cpu_offloading, c.cpu_offloading_num_layers, c.cpu_offloading_activations,
            c.cpu_offloading_weights) == (True, 3, True, False)
    assert transformer_config(resolved()).cpu_offloading is False
    assert [n for n, _ in at_start(resolved(recompute={"activation_offload_layers": 3}))] == ["activation_offload"]


def test_the_fp8_epilogue_is_listed_among_the_start_checks():
    """lora.epilogue true under FP8 needs TE's functional linear on the node: `validate` lists it with the machine
    rules the trainer checks at start (null is chosen there, never refused)."""
    names = lambda r: [n for n, _ in at_start(r)]  # noqa: E731
    assert "fp8_epilogue" in names(resolved(precision={"fp8": "hybrid"}, lora={"epilogue": True}))
    assert "fp8_epilogue" not in names(resolved(precision={"fp8": "hybrid"}))
    assert "fp8_epilogue" not in names(resolved(lora={"epilogue": True}))


def test_offload_needs_te_on_the_node():
    cfg = Config.from_dict(resolved(recompute={"activation_offload_layers": 3}))
    pre_start(cfg, H200)
    with pytest.raises(StartRefused) as err:
        pre_start(cfg, H200_NO_TE)
    assert err.value.field == "trainer.recompute.activation_offload_layers" and "needs Transformer Engine" in str(
        err.value)


def test_fp8_attention_reaches_megatron_with_one_document_rows():
    r = resolved(precision={"fp8": "hybrid", "fp8_dot_product_attention": True}, data={"packing": False})
    assert transformer_config(r).fp8_dot_product_attention is True
    assert transformer_config(resolved(precision={"fp8": "hybrid"})).fp8_dot_product_attention is False


HD128 = {"hidden_size": 256, "num_attention_heads": 2, "num_query_groups": 1}  # head dim 128: TE's FP8 attention's
L40S = Environment(device="cuda", device_name="NVIDIA L40S", cuda_cc=(8, 9), te_version=(2, 20, 2))


def test_fp8_attention_null_is_on_for_fp8_one_document_rows_where_te_runs_it():
    """fp8_dot_product_attention null (the default): on for FP8 delayed|tensorwise, packing false, head dim 128 on a
    compute capability >= 9.0 node; off (never refused) elsewhere, as the contract's fp8_attention_on plans it."""
    from primus_contract.rules_precision import fp8_attention_on
    from trainer.precision import describe, resolve

    one_doc = resolved(precision={"fp8": "hybrid"}, data={"packing": False}, model=HD128)
    assert one_doc["trainer"]["precision"]["fp8_dot_product_attention"] is None
    assert transformer_config(one_doc).fp8_dot_product_attention is True
    assert fp8_attention_on(one_doc["trainer"], "h200") is True
    assert "| attention fp8" in describe(resolve(Config.from_dict(one_doc), H200))
    assert transformer_config(one_doc, L40S).fp8_dot_product_attention is False  # FP8 runs there, its attention not
    assert "| attention bf16" in describe(resolve(Config.from_dict(one_doc), L40S))
    for other in (resolved(precision={"fp8": "hybrid"}, model=HD128),                            # packed (THD)
                  resolved(precision={"fp8": "hybrid"}, data={"packing": False}),                # head dim 32
                  resolved(precision={"fp8": "hybrid", "fp8_recipe": "blockwise"}, data={"packing": False}, model=HD128),
                  resolved(precision={"fp8": "hybrid", "fp8_recipe": "tensorwise"}, data={"packing": False},
                           model=HD128),                                # current scaling: Blackwell only in TE
                  resolved(precision={"fp8": "hybrid", "fp8_dot_product_attention": False}, data={"packing": False},
                           model=HD128)):
        assert transformer_config(other).fp8_dot_product_attention is False
        assert fp8_attention_on(other["trainer"], "h200") is False
    bf16 = resolved(data={"packing": False}, model=HD128)
    assert fp8_attention_on(bf16["trainer"], "h200") is False and "attention" not in describe(
        resolve(Config.from_dict(bf16), H200))
    assert fp8_attention_on(one_doc["trainer"], "mi300x") is False  # NVIDIA only (cuDNN's FP8 attention)


def test_fp8_attention_null_follows_packed_data_of_one_document_a_row():
    """With packing, null turns FP8 attention on where the loaded train split holds one document in every row (the
    'auto' layout then runs every micro-batch sbhd, as packing false does); not for rows of several documents, not
    where the layout is thd (single_document_sbhd false), not where it was written false, not where TE's FP8
    attention cannot run. The recipe alone (validate, plan) says off."""
    import numpy as np

    from primus_contract.rules_precision import fp8_attention_fits, fp8_attention_on
    from trainer.data.dataset import PackedDataset
    from trainer.precision import describe, follow_data, resolve

    packed = resolved(precision={"fp8": "hybrid"}, model=HD128)
    cfg = Config.from_dict(packed)
    p = resolve(cfg, H200)
    assert p.settings.fp8_dot_product_attention is False and fp8_attention_on(packed["trainer"], "h200") is False
    on = follow_data(p, cfg, one_document_rows=True)
    assert on.settings.fp8_dot_product_attention is True and "| attention fp8" in describe(on)
    assert follow_data(p, cfg, one_document_rows=False) is p
    assert fp8_attention_fits(packed["trainer"], one_document_rows=True) is True
    assert transformer_config(packed).fp8_dot_product_attention is False  # before the data is seen
    for other, env in ((resolved(precision={"fp8": "hybrid"}, model=HD128, data={"single_document_sbhd": False}), H200),
                       (resolved(precision={"fp8": "hybrid", "fp8_dot_product_attention": False}, model=HD128), H200),
                       (resolved(precision={"fp8": "hybrid"}), H200),                        # head dim 32
                       (resolved(model=HD128), H200),                                        # BF16
                       (packed, L40S)):                                                      # no FP8 attention there
        q = resolve(Config.from_dict(other), env)
        assert follow_data(q, Config.from_dict(other), one_document_rows=True) is q
    rows = lambda docs: PackedDataset(np.arange(8), np.ones(8), np.arange(9), np.arange(8),  # noqa: E731
                                      np.concatenate([[0], np.cumsum(docs)]), 8, 0).max_pack_documents()
    assert rows([1] * 8) == 1 and rows([2, 1, 1, 1, 1, 1, 1]) == 2


def test_fp8_attention_that_follows_the_packs_says_how_many_it_can_take():
    """precision.fp8_dot_product_attention true on packed data runs FP8 only on micro-batches whose rows hold one
    document each: the trainer logs how many train packs do, and a note where none does (audit, 2026-12-07: such a
    run was all BF16 attention with nothing said)."""
    import numpy as np

    from trainer.data.dataset import PackedDataset
    from trainer.precision import fp8_attention_coverage
    from trainer.precision.settings import FP8_ATTENTION_ATTR

    packs = lambda docs: PackedDataset(np.arange(8), np.ones(8), np.arange(9), np.arange(8),  # noqa: E731
                                       np.concatenate([[0], np.cumsum(docs)]), 8, 0)
    follows, fixed = torch.nn.Module(), torch.nn.Module()
    setattr(follows, FP8_ATTENTION_ATTR, True)
    assert fp8_attention_coverage(fixed, packs([2, 2, 2, 2])) is None
    assert fp8_attention_coverage(follows, None) is None
    none = fp8_attention_coverage(follows, packs([2, 2, 2, 2]))
    assert none.startswith("note | fp8 attention | none of the 4 train packs") and "BF16" in none
    assert fp8_attention_coverage(follows, packs([2, 1, 1, 4])) == (
        "fp8 attention | 2 of 4 train packs hold one document (FP8 where a micro-batch's rows all do)")


def test_plan_moves_offloaded_activations_to_the_host():
    from primus_contract.plan import plan
    from primus_contract.plan.memory import offloaded_bytes
    from primus_contract.plan.shapes import layout_of
    from primus_slurm.config.recipe import load_recipe
    from primus_slurm.resources import recipes_dir

    path = str(recipes_dir() / "llama2_70b_1xh200.yaml")
    none = plan(load_recipe(path, ["trainer.recompute.granularity=null"]).resolved)
    r = load_recipe(path, ["trainer.recompute.granularity=null", "trainer.recompute.activation_offload_layers=56"]
                    ).resolved
    off = plan(r)
    kept = lambda p: sum(v for k, v in p.breakdown.items() if k.startswith("activations"))  # noqa: E731
    host = offloaded_bytes(r, layout_of(r)) / (1 << 30)
    assert 56 * 1.5 < host < 56 * 2.5  # GiB: the 70B's layers at 8192 tokens
    assert kept(none) - kept(off) == pytest.approx(host - off.breakdown["activations (offload in flight)"], rel=1e-6)
    assert off.time_parts["activation offload (copies not hidden)"] > 0
    assert any(f"activation offload: 56 layers, {host:.1f} GiB of pinned host memory" in n for n in off.notes)
    assert "activations (offload in flight)" not in none.breakdown
