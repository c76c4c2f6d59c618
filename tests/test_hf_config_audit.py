"""The audit of every config.json field, for every family the HF import takes: each field is flipped on a tiny
random checkpoint (tests/hf_tiny.py, Hub layout, fp32) and the result is one of
  refused F  primus_contract.hf_config refuses the checkpoint, naming config.json field F (validate, submit and
             the trainer's start all run that check);
  equal      transformers' logits change and the imported megatron model's follow them (1e-4);
  inert      transformers' logits do not change, and the imported model's still equal them (1e-4).
No flip may end otherwise: an accepted checkpoint whose logits differ from transformers', that transformers cannot
run, or that the trainer cannot build is a defect. A flip is a config value that builds the checkpoint (`build`:
the weights follow it) and/or an edit of the saved config.json (`edit`: the weights stay; DROP deletes the key).

Every field transformers writes for the family, and every field hf_config knows (KNOWN_FIELDS; any other field is
refused as unknown), must be changed by some flip or be in NOT_FLIPPED, which says why it cannot change the model.
"""
from __future__ import annotations

import json

import pytest
import torch

from primus_contract.hf_config import KNOWN_FIELDS, HFConfigError, model_fields, read_config
from tests.hf_tiny import FAMILIES, load_tiny, save_tiny, tiny_config
from tests.model_helpers import dist_session, tiny_cfg
from tests.test_hf_import_families import LLAMA3, MLA_LORA, YARN
from trainer.model import build

DROP = "<drop>"
ALL, GQA, QWEN, MOE = "llama qwen3 qwen3_moe deepseek_v2", "llama qwen3 qwen3_moe", "qwen3 qwen3_moe", "qwen3_moe"
MLA = "deepseek_v2"
NO_FACTOR = {k: v for k, v in YARN.items() if k != "factor"}


def rope(**kw) -> dict:
    return {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, **kw}}


def without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


# label: (families, build, edit, verdict: one string, or {family: verdict} where the families differ)
FLIPS = {
    "vocab_size": (ALL, {"vocab_size": 160}, None, "equal"),
    "hidden_size": (ALL, {"hidden_size": 96}, None, "equal"),
    "intermediate_size": (ALL, {"intermediate_size": 96}, None, {"qwen3_moe": "inert"}),  # its layers are all MoE
    "num_hidden_layers": (ALL, {"num_hidden_layers": 3}, None, "equal"),
    "num_attention_heads": (GQA, {"num_attention_heads": 8}, None, "equal"),
    "num_attention_heads_mla": (MLA, {"num_attention_heads": 8, "num_key_value_heads": 8}, None, "equal"),
    "num_key_value_heads=4": (GQA, {"num_key_value_heads": 4}, None, "equal"),
    "num_key_value_heads=1": (GQA, {"num_key_value_heads": 1}, None, "equal"),
    "num_key_value_heads_mla": (MLA, {"num_key_value_heads": 2}, None, "refused num_key_value_heads"),
    "drop_num_key_value_heads_mla": (MLA, None, {"num_key_value_heads": DROP}, "inert"),
    "head_dim": (GQA, {"head_dim": 32}, None, "equal"),
    "head_dim_mla": (MLA, None, {"head_dim": 16, "qk_head_dim": 40}, "inert"),  # transformers derives both
    "drop_head_dim": ("llama", None, {"head_dim": DROP}, "inert"),
    "rms_norm_eps": (GQA, {"rms_norm_eps": 1e-3}, None, "equal"),
    "rms_norm_eps_mla": (MLA, {"rms_norm_eps": 1e-5}, None, "refused rms_norm_eps"),
    "drop_rms_norm_eps": ("llama", None, {"rms_norm_eps": DROP}, "equal"),
    "tie_word_embeddings": (ALL, {"tie_word_embeddings": True}, None, "equal"),
    "drop_tie_word_embeddings": ("llama", None, {"tie_word_embeddings": DROP}, "inert"),
    "drop_vocab_size": ("llama", None, {"vocab_size": DROP}, "refused vocab_size"),
    "rope_theta": (ALL, rope(rope_theta=1e6), None, "equal"),
    "rope_theta_top_level": (ALL, None, {"rope_theta": 1e6}, "inert"),  # rope_parameters' own wins
    "rope_scaling_legacy": ("llama", None, {"rope_scaling": {"rope_type": "default", "rope_theta": 1e6}}, "equal"),
    "drop_rope": ("llama", None, {"rope_parameters": DROP}, "inert"),
    "partial_rotary_factor": (ALL, None, rope(partial_rotary_factor=0.5), "refused partial_rotary_factor"),
    "rope_linear": (ALL, None, rope(rope_type="linear", factor=2.0), "refused rope_scaling"),
    "rope_dynamic": (ALL, None, rope(rope_type="dynamic", factor=2.0), "refused rope_scaling"),
    "rope_llama3": (ALL, {"rope_parameters": LLAMA3}, None, {MLA: "refused rope_scaling"}),
    "rope_llama3_factor": ("llama", {"rope_parameters": {**LLAMA3, "factor": 32.0}}, None, "equal"),
    "rope_llama3_low_freq": ("llama", {"rope_parameters": {**LLAMA3, "low_freq_factor": 2.0}}, None, "refused rope_scaling"),
    "rope_llama3_original": ("llama", {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 4096}}, None,
                             "refused rope_scaling"),
    "rope_llama3_no_low_freq": ("llama", {"rope_parameters": LLAMA3},
                                {"rope_parameters": without(LLAMA3, "low_freq_factor")}, "refused rope_scaling"),
    "rope_llama3_no_factor": ("llama", {"rope_parameters": LLAMA3}, {"rope_parameters": without(LLAMA3, "factor")},
                              "refused rope_scaling"),
    "rope_llama3_partial": ("llama", {"rope_parameters": LLAMA3},
                            {"rope_parameters": {**LLAMA3, "partial_rotary_factor": 0.5}}, "refused partial_rotary_factor"),
    "rope_llama3_legacy": ("llama", None, {"rope_parameters": DROP, "rope_theta": 500000.0,
                                           "rope_scaling": without(LLAMA3, "rope_theta")}, "equal"),
    "rope_yarn": (ALL, {"rope_parameters": YARN}, None, {MLA: "equal", "*": "refused rope_scaling"}),
    "rope_yarn_factor": (MLA, {"rope_parameters": {**YARN, "factor": 8.0}}, None, "equal"),
    "rope_yarn_beta_fast": (MLA, {"rope_parameters": {**YARN, "beta_fast": 8.0}}, None, "equal"),
    "rope_yarn_beta_slow": (MLA, {"rope_parameters": {**YARN, "beta_slow": 2.0}}, None, "equal"),
    "rope_yarn_mscale": (MLA, {"rope_parameters": {**YARN, "mscale": 1.0}}, None, "equal"),
    "rope_yarn_mscale_all_dim": (MLA, {"rope_parameters": {**YARN, "mscale_all_dim": 0.0}}, None, "equal"),
    # transformers: cos/sin by the factor alone, the softmax by mscale_all_dim; megatron cannot split them
    "rope_yarn_mscale_all_dim_alone": (MLA, {"rope_parameters": {**without(YARN, "mscale"), "mscale_all_dim": 0.707}},
                                       None, "refused rope_scaling"),
    "rope_yarn_no_mscale": (MLA, {"rope_parameters": without(without(YARN, "mscale"), "mscale_all_dim")}, None, "equal"),
    "rope_yarn_original": (MLA, {"rope_parameters": {**YARN, "original_max_position_embeddings": 8}}, None, "equal"),
    "rope_yarn_no_original": (MLA, {"rope_parameters": YARN, "max_position_embeddings": 64},
                              {"rope_parameters": without(YARN, "original_max_position_embeddings")}, "equal"),
    "rope_yarn_no_factor": (MLA, None, {"rope_parameters": NO_FACTOR, "max_position_embeddings": 64},
                            "refused rope_scaling"),
    "rope_yarn_attention_factor": (MLA, {"rope_parameters": {**YARN, "attention_factor": 1.5}}, None,
                                   "refused rope_scaling"),
    "rope_yarn_truncate": (MLA, {"rope_parameters": {**YARN, "truncate": False}}, None, "refused rope_scaling"),
    "rope_yarn_partial": (MLA, {"rope_parameters": YARN}, {"rope_parameters": {**YARN, "partial_rotary_factor": 0.5}},
                          "refused partial_rotary_factor"),
    "rope_yarn_max_position": (MLA, {"rope_parameters": YARN, "max_position_embeddings": 512}, None, "equal"),
    "rope_yarn_legacy": (MLA, None, {"rope_parameters": DROP, "rope_theta": 10000.0,
                                     "rope_scaling": without(YARN, "rope_theta")}, "equal"),
    "max_position_embeddings": (ALL, None, {"max_position_embeddings": 512}, "inert"),
    "attention_bias": (ALL, None, {"attention_bias": True}, "refused attention_bias"),
    "mlp_bias": ("llama deepseek_v2", None, {"mlp_bias": True}, "refused mlp_bias"),
    "hidden_act": (ALL, None, {"hidden_act": "gelu"}, "refused hidden_act"),
    "drop_hidden_act": ("llama", None, {"hidden_act": DROP}, "inert"),
    "attention_dropout": (ALL, None, {"attention_dropout": 0.1}, "refused attention_dropout"),  # (a training change)
    "pretraining_tp": ("llama deepseek_v2", None, {"pretraining_tp": 2}, "inert"),
    "quantization_config": (ALL, None, {"quantization_config": {"quant_method": "fp8"}}, "refused quantization_config"),
    "attn_logit_softcapping": (ALL, None, {"attn_logit_softcapping": 50.0}, "refused attn_logit_softcapping"),
    "final_logit_softcapping": (ALL, None, {"final_logit_softcapping": 30.0}, "refused final_logit_softcapping"),
    "embedding_multiplier": (ALL, None, {"embedding_multiplier": 2.0}, "refused embedding_multiplier"),
    "unknown_field": (ALL, None, {"new_math_switch": 1.5}, "refused new_math_switch"),
    "model_type": (ALL, None, {"model_type": "mistral"}, "refused model_type"),
    "bookkeeping": (ALL, None, {"pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 6, "initializer_range": 0.5,
                                "use_cache": False, "dtype": "bfloat16", "torch_dtype": "bfloat16",
                                "chunk_size_feed_forward": 4}, "inert"),
    "use_sliding_window": (QWEN, None, {"use_sliding_window": True, "sliding_window": 8}, "refused use_sliding_window"),
    "sliding_window": (QWEN, None, {"sliding_window": 8, "max_window_layers": 0}, "inert"),  # without use_sliding_window
    "layer_types": (QWEN, None, {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8},
                    "refused layer_types"),
    "num_experts": (MOE, {"num_experts": 8}, None, "equal"),
    "num_experts_spelling": (MOE, None, {"num_local_experts": DROP, "num_experts": 4}, "inert"),
    "num_experts_disagree": (MOE, None, {"num_experts": 8}, "refused num_experts"),
    "drop_num_experts": (MOE, None, {"num_local_experts": DROP}, "refused num_experts"),
    "num_experts_per_tok": ("qwen3_moe deepseek_v2", {"num_experts_per_tok": 3}, None, "equal"),
    "moe_intermediate_size": ("qwen3_moe deepseek_v2", {"moe_intermediate_size": 48}, None, "equal"),
    "norm_topk_prob": (MOE, {"norm_topk_prob": False}, None, "equal"),
    "drop_norm_topk_prob": (MOE, None, {"norm_topk_prob": DROP}, "equal"),  # transformers' default: false
    "norm_topk_prob_mla": (MLA, {"norm_topk_prob": True}, None, "refused norm_topk_prob"),
    "drop_norm_topk_prob_mla": (MLA, None, {"norm_topk_prob": DROP}, "inert"),
    # dense layers among the MoE ones: the trainer builds first-k-dense / every-n-th layouts (flops.is_moe_layer)
    "decoder_sparse_step": (MOE, {"decoder_sparse_step": 2}, None, "equal"),
    "mlp_only_layers": (MOE, {"mlp_only_layers": [0]}, None, "equal"),
    "mlp_only_layers_every_2nd": (MOE, {"num_hidden_layers": 3, "mlp_only_layers": [1]}, None, "equal"),
    "mlp_only_layers_last": (MOE, {"num_hidden_layers": 3, "mlp_only_layers": [2]}, None, "refused mlp_only_layers"),
    # DeepSeek's router fields on a Qwen3-MoE config.json: transformers reads neither (they were applied: audit,
    # 2026-12-06)
    "routed_scaling_factor_qwen3_moe": (MOE, None, {"routed_scaling_factor": 2.5}, "inert"),
    "n_shared_experts_qwen3_moe": (MOE, None, {"n_shared_experts": 1}, "inert"),
    "router_aux_loss": (MOE, None, {"router_aux_loss_coef": 0.5, "output_router_logits": True}, "inert"),
    "q_lora_rank": (MLA, {"q_lora_rank": 24}, None, "equal"),
    "drop_q_lora_rank": (MLA, None, {"q_lora_rank": DROP}, "refused q_lora_rank"),
    "kv_lora_rank": (MLA, {"kv_lora_rank": 8}, None, "equal"),
    "drop_kv_lora_rank": (MLA, None, {"kv_lora_rank": DROP}, "refused kv_lora_rank"),
    "qk_nope_head_dim": (MLA, {"qk_nope_head_dim": 8}, None, "equal"),
    "qk_rope_head_dim": (MLA, {"qk_rope_head_dim": 4}, None, "equal"),
    "v_head_dim": (MLA, {"v_head_dim": 8}, None, "equal"),
    "n_routed_experts": (MLA, {"n_routed_experts": 8}, None, "equal"),
    "n_shared_experts": (MLA, {"n_shared_experts": 1}, None, "equal"),
    "n_shared_experts=0": (MLA, {"n_shared_experts": 0}, None, "refused n_shared_experts"),
    "drop_n_shared_experts": (MLA, None, {"n_shared_experts": DROP}, "refused n_shared_experts"),
    "first_k_dense_replace": (MLA, {"first_k_dense_replace": 0}, None, "equal"),
    "routed_scaling_factor": (MLA, {"routed_scaling_factor": 2.5}, None, "equal"),
    "drop_routed_scaling_factor": (MLA, None, {"routed_scaling_factor": DROP}, "inert"),  # (the base's is 1)
    "topk_method": (MLA, None, {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
                    "refused topk_method"),
    "drop_topk_method": (MLA, None, {"topk_method": DROP}, "inert"),
    "n_group": (MLA, None, {"n_group": 2, "topk_group": 1}, "inert"),  # read by group-limited routing only
    "scoring_func": (MLA, None, {"scoring_func": "sigmoid"}, "refused scoring_func"),
    "moe_layer_freq": (MLA, None, {"moe_layer_freq": 2}, "refused moe_layer_freq"),
    "aux_loss": (MLA, None, {"ep_size": 2, "aux_loss_alpha": 0.5, "seq_aux": False, "output_router_logits": True},
                 "inert"),
}
NOT_FLIPPED = {  # field: why it cannot change what the model computes
    "architectures": "names the class; model_type chooses the family", "transformers_version": "provenance",
    "_name_or_path": "provenance", "auto_map": "custom modeling code; both sides use their own model_type code",
    "output_attentions": "what forward returns", "output_hidden_states": "what forward returns",
    "return_dict": "what forward returns", "is_encoder_decoder": "encoder-decoder models only",
    "tie_encoder_decoder": "encoder-decoder models only", "id2label": "classification heads only",
    "label2id": "classification heads only", "problem_type": "classification heads only",
}
TOKENS = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))


def flips_of(family: str) -> dict:
    out = {}
    for label, (families, build_kw, edit, verdict) in FLIPS.items():
        if family in families.split():
            if isinstance(verdict, dict):
                verdict = verdict.get(family, verdict.get("*", "equal"))
            out[label] = (build_kw or {}, edit or {}, verdict)
    return out


def edited(path, edit: dict) -> dict:
    """Apply `edit` to the config.json in `path`; the config as written."""
    hf = read_config(path)
    for key, value in edit.items():
        if value == DROP:
            hf.pop(key, None)
        else:
            hf[key] = value
    (path / "config.json").write_text(json.dumps(hf))
    return hf


def trainer_logits(path, device):
    """The trainer's import of `path`, as `trainer.model.preset: checkpoint` reads it."""
    hf = read_config(path)
    model = {**model_fields(hf), "max_position_embeddings": int(hf.get("max_position_embeddings", 4096))}
    sections = {"model": model, "checkpoint": {"pretrained": str(path)}}
    if model["multi_latent_attention"]:
        sections["lora"] = {"target_modules": MLA_LORA}
    with torch.no_grad():
        return build(tiny_cfg(trainer=sections), device).model.eval()(input_ids=TOKENS, position_ids=None,
                                                                      attention_mask=None)


def transformers_logits(path):
    with torch.no_grad():
        return load_tiny(path)(TOKENS).logits


def verdict(path, base_logits, device) -> str:
    try:
        model_fields(read_config(path))
    except HFConfigError as e:
        return f"refused {e.field.removeprefix('config.json ')}"
    try:
        ref = transformers_logits(path)
    except Exception as e:  # noqa: BLE001 - a verdict, reported
        return f"accepted, but transformers fails: {type(e).__name__}: {e}"[:200]
    try:
        got = trainer_logits(path, device)
    except Exception as e:  # noqa: BLE001
        return f"accepted, but the trainer fails: {type(e).__name__}: {e}"[:200]
    if got.shape != ref.shape or not torch.allclose(got, ref, rtol=1e-4, atol=1e-4):
        return f"accepted, but the logits differ from transformers' by {float((got - ref).abs().max()):.3g}"
    changed = ref.shape != base_logits.shape or not torch.allclose(ref, base_logits, rtol=0, atol=1e-6)
    return "equal" if changed else "inert"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_config_json_field_equals_transformers_or_is_refused(tmp_path, family):
    flips = flips_of(family)
    base = save_tiny(family, tmp_path / "base", seed=3)
    got = {}
    with dist_session(tiny_cfg()) as info:
        base_logits = transformers_logits(base)
        torch.testing.assert_close(trainer_logits(base, info.device), base_logits, rtol=1e-4, atol=1e-4)
        for i, (label, (build_kw, edit, _)) in enumerate(flips.items()):
            path = save_tiny(family, tmp_path / f"flip{i}", seed=3, **build_kw)
            edited(path, edit)
            got[label] = verdict(path, base_logits, info.device)
    assert got == {label: want for label, (_, _, want) in flips.items()}


def test_the_audit_changes_every_field_it_does_not_explain(tmp_path):
    """Each field transformers writes for a family is changed by one of that family's flips (or explained in
    NOT_FLIPPED), and so is every field hf_config knows; no flip is a no-op on config.json."""
    changed_anywhere = set()
    for family in FAMILIES:
        tiny_config(family).save_pretrained(tmp_path / family)
        base = read_config(tmp_path / family)
        changed = set()
        for i, (label, (build_kw, edit, _)) in enumerate(flips_of(family).items()):
            path = tmp_path / f"{family}-{i}"
            tiny_config(family, **build_kw).save_pretrained(path)
            hf = edited(path, edit)
            diff = {k for k in {*base, *hf} if base.get(k, DROP) != hf.get(k, DROP)}
            assert diff, f"{family} {label} changes nothing in config.json"
            changed |= diff
        assert set(base) - changed - set(NOT_FLIPPED) == set(), family
        changed_anywhere |= changed
    assert KNOWN_FIELDS - changed_anywhere - set(NOT_FLIPPED) == set()
