"""trainer.data.single_document_sbhd (default true): with packing true, a micro-batch whose rows each hold at most one
document runs the plain causal sbhd layout (no PackedSeqParams, trainer/model/inputs.py `batch_layout`), which is
exact there: the same per-token losses and LoRA gradients as THD on tiny real megatron-core models (dense, MoE,
MLA). A row of several documents, the key false, and context / pipeline parallelism keep THD."""
from types import SimpleNamespace

import pytest
import torch

from tests.model_helpers import DEEPSEEK_MLA, QWEN3_MOE, arch_sections, dist_session, perturb_adapters, tiny_cfg
from tests.test_attention_layout import SEQ, _dataset
from trainer.data.batching import collate
from trainer.model import build_model, forward_losses
from trainer.model.inputs import LAYOUT_ATTR, attention_layout, batch_layout, model_inputs

ONE_DOC_ROWS = [32, 28, 20]  # packed (best-fit decreasing) into one document a row: one full row, two padded ones
# fp32 on CPU, measured (dense, MoE, MLA): the per-token losses are bitwise equal; each adapter gradient differs by at
# most 5e-7 of that tensor's largest entry (<= 1.4e-6 absolute, entries up to ~3): the token sums run in another order
LOSS_TOL, GRAD_RTOL = 1e-6, 1e-5


def _losses_and_grads(model, batch, layout: str):
    setattr(model, LAYOUT_ATTR, layout)
    model.zero_grad(set_to_none=True)
    losses = forward_losses(model, batch)
    (losses * batch["loss_mask"]).sum().backward()
    return losses.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("arch", [None, QWEN3_MOE, DEEPSEEK_MLA], ids=["dense", "moe", "mla"])
def test_one_document_rows_run_sbhd_and_equal_thd(arch):
    cfg = tiny_cfg(trainer=arch_sections(arch) if arch else {})
    assert cfg.trainer.data.packing and cfg.trainer.data.single_document_sbhd
    batch = collate(list(_dataset(ONE_DOC_ROWS, packed=True)))
    assert batch["row_documents"] == 1
    for row, n in enumerate(sorted(ONE_DOC_ROWS, reverse=True)):  # the document's own positions, then the padding's
        assert batch["position_ids"][row].tolist() == list(range(n)) + list(range(SEQ - n))
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert getattr(model, LAYOUT_ATTR) == "auto" and batch_layout(model, batch) == "sbhd"
        inputs = model_inputs(model, batch)
        assert inputs["packed_seq_params"] is None and tuple(inputs["input_ids"].shape) == (3, SEQ)
        perturb_adapters(model, seed=3)
        l_thd, g_thd = _losses_and_grads(model, batch, "thd")  # the same model forced to THD
        l_auto, g_auto = _losses_and_grads(model, batch, "auto")
    mask = batch["loss_mask"].bool()
    loss_err = (l_auto[mask] - l_thd[mask]).abs().max().item()
    assert g_thd.keys() == g_auto.keys() and len(g_thd) > 0
    assert any(g.abs().sum() > 0 for g in g_thd.values())
    grad_err = max((g_auto[n] - g_thd[n]).abs().max().item() for n in g_thd)
    print(f"{arch and arch['family'] or 'dense'}: max |loss diff| {loss_err:.2e}, max |grad diff| {grad_err:.2e}")
    torch.testing.assert_close(l_auto[mask], l_thd[mask], rtol=0, atol=LOSS_TOL)
    for name, g in g_thd.items():  # relative to the tensor's scale: elementwise rtol would trip on entries near 0
        assert (g_auto[name] - g).abs().max() <= GRAD_RTOL * g.abs().max() + 1e-12, name


def _is_thd(model, batch) -> bool:
    inputs = model_inputs(model, batch)
    b, s = batch["tokens"].shape
    return inputs["packed_seq_params"] is not None and tuple(inputs["input_ids"].shape) == (1, b * s)


def test_a_row_of_several_documents_stays_thd():
    cfg = tiny_cfg()
    several = collate(list(_dataset([20, 9, 3], packed=True)))  # one row of 3 documents
    mixed = collate([_dataset([32, 28], packed=True)[0], _dataset([20, 9], packed=True)[0]])  # 1 and 2
    assert several["row_documents"] == 3 and mixed["row_documents"] == 2
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert getattr(model, LAYOUT_ATTR) == "auto"
        assert _is_thd(model, several) and _is_thd(model, mixed)


def test_the_key_false_keeps_thd_on_one_document_rows():
    cfg = tiny_cfg(trainer={"data": {"single_document_sbhd": False}})
    batch = collate(list(_dataset(ONE_DOC_ROWS, packed=True)))
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert getattr(model, LAYOUT_ATTR) == "thd"
        assert _is_thd(model, batch)


def test_the_decision_keeps_thd_where_sbhd_is_not_allowed():
    assert attention_layout(tiny_cfg()) == "auto"
    assert attention_layout(tiny_cfg(trainer={"data": {"packing": False}})) == "sbhd"
    for par in ({"context": 2}, {"pipeline": 2}):
        assert attention_layout(tiny_cfg(trainer={"parallelism": par})) == "thd", par
    assert attention_layout(tiny_cfg(trainer={"data": {"packing": False, "single_document_sbhd": False}})) == "sbhd"

    one = collate(list(_dataset(ONE_DOC_ROWS, packed=True)))

    def model(layout="auto", **config):
        base = dict(context_parallel_size=1, pipeline_model_parallel_size=1, tensor_model_parallel_size=1,
                    sequence_parallel=False)
        return SimpleNamespace(**{LAYOUT_ATTR: layout, "config": SimpleNamespace(**{**base, **config})})

    assert batch_layout(model(), one) == "sbhd"
    assert batch_layout(model("thd"), one) == "thd"
    assert batch_layout(model(context_parallel_size=2), one) == "thd"  # a model config the recipe check missed
    assert batch_layout(model(pipeline_model_parallel_size=2), one) == "thd"
    assert batch_layout(model(tensor_model_parallel_size=2, sequence_parallel=True), one) == "sbhd"  # 32 % 2 == 0
    assert batch_layout(model(tensor_model_parallel_size=3, sequence_parallel=True), one) == "thd"   # S split by TP
    assert batch_layout(model(tensor_model_parallel_size=3), one) == "sbhd"  # no sequence parallelism: no S split
    assert batch_layout(model(), {k: v for k, v in one.items() if k != "row_documents"}) == "thd"  # not collated


def test_fp8_attention_follows_each_micro_batch_layout_on_an_auto_model():
    """An 'auto' model built with FP8 attention (fp8_dot_product_attention true, packing true) runs it on the sbhd
    micro-batches only: the TransformerConfig flag megatron makes each forward's FP8 recipe from follows the layout.
    (FP8 itself needs a GPU: the flag is set by hand on this CPU model, as the build sets it from the recipe.)"""
    from trainer.model import levers
    from trainer.model.inputs import FP8_ATTENTION_ATTR

    one = collate(list(_dataset(ONE_DOC_ROWS, packed=True)))
    several = collate(list(_dataset([20, 9, 3], packed=True)))
    cfg = tiny_cfg()
    with dist_session(cfg) as info:
        model = build_model(cfg, info.device)
        assert getattr(model, FP8_ATTENTION_ATTR) is False  # built without FP8 attention: nothing follows
        model.config.fp8_dot_product_attention = True
        assert levers.mark_layout(model, cfg) == "auto" and getattr(model, FP8_ATTENTION_ATTR) is True
        seen = []
        for batch in (one, several, one, several):
            inputs = model_inputs(model, batch)
            seen.append((inputs["packed_seq_params"] is None, model.config.fp8_dot_product_attention))
        assert seen == [(True, True), (False, False), (True, True), (False, False)]
        model.config.fp8_dot_product_attention = True  # a model built for sbhd (packing false) keeps it on throughout
        levers.mark_layout(model, tiny_cfg(trainer={"data": {"packing": False}}))
        assert getattr(model, FP8_ATTENTION_ATTR) is False
        model_inputs(model, one)
        assert model.config.fp8_dot_product_attention is True
