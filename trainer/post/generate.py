"""`generate`: answers from the run's base + the adapter of a checkpoint (exported from it first), from a merged
export, or from the base alone (--base-only: the "before" of a fine-tune), with the prompt laid out as in
training (trainer.post.prompts). Greedy (temperature 0) or sampled (temperature, top-p, seed).

Engines: transformers + peft (CPU or the GPU), or vLLM when it is importable and a GPU is there (--engine auto);
the vLLM path serves the base with the adapter as a LoRA request (or the merged directory). It is written
against vLLM's LLM / SamplingParams / LoRARequest API and not run in this project's CPU CI."""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

from primus_contract.serving import VLLM_LORA_RANKS, vllm_lora_rank, vllm_memory_fraction
from trainer.data.tokenize import load_tokenizer, tokenizer_info
from trainer.post.export import export_adapter
from trainer.post.prompts import answer_text, char_accuracy, encode, prompt_segments, score, stops
from trainer.post.runstate import PostError, say


@dataclass
class Params:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


def pick_engine(choice: str, device: str, rank: Optional[int] = None) -> str:
    """`rank`: the adapter's (None: no adapter). auto takes vLLM on a GPU where it is importable and serves the rank
    (primus_contract.serving), else transformers + peft."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    if choice == "vllm" and not has_vllm:
        raise PostError("--engine vllm: vllm is not importable in the job's environment")
    servable = rank is None or vllm_lora_rank(rank) is not None
    if choice == "vllm" and not servable:  # (the launcher refuses it before submit)
        raise PostError(f"--engine vllm: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; this adapter's is {rank}")
    if choice == "auto":
        return "vllm" if has_vllm and device == "cuda" and servable else "transformers"
    return choice


def hf_generate(model_dir: str, adapter_dir: Optional[str], prompts: list[dict], p: Params, device: str,
                tokenizer) -> list[list[int]]:
    """The new token ids of each prompt; it stops at a stop id or once the text ends with a stop string."""
    from transformers import AutoModelForCausalLM, set_seed

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").to(device)
    if adapter_dir:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    sampled = p.temperature > 0
    answers = []
    for i, pr in enumerate(prompts):
        set_seed(p.seed + i)  # one stream per prompt: an answer does not depend on the prompts before it
        ids = torch.tensor([pr["ids"]], device=device)
        strings = {"stop_strings": pr["stop_strings"], "tokenizer": tokenizer} if pr["stop_strings"] else {}
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=p.max_new_tokens,
                                 do_sample=sampled, temperature=p.temperature if sampled else None,
                                 top_p=p.top_p if sampled else None, top_k=None, eos_token_id=pr["stop"],
                                 pad_token_id=pr["pad"], **strings)
        answers.append(out[0, len(pr["ids"]):].tolist())
        say(f"generate | {i + 1}/{len(prompts)} | {len(answers[-1])} tokens")
    return answers


def vllm_generate(model_dir: str, adapter_dir: Optional[str], prompts: list[dict], p: Params, rank: int) -> list:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    # max_lora_rank must be one of vLLM's set (an adapter of rank 12 asked for 12 and was refused); the memory share is
    # what this process left free (primus_contract.serving.vllm_memory_fraction)
    share = vllm_memory_fraction(*torch.cuda.mem_get_info())
    llm = LLM(model=model_dir, enable_lora=adapter_dir is not None, max_lora_rank=vllm_lora_rank(rank), seed=p.seed,
              gpu_memory_utilization=share)
    lora = LoRARequest("run-adapter", 1, adapter_dir) if adapter_dir else None
    params = [SamplingParams(max_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                             seed=p.seed + i, stop_token_ids=pr["stop"], stop=pr["stop_strings"] or None)
              for i, pr in enumerate(prompts)]
    outs = llm.generate([{"prompt_token_ids": pr["ids"]} for pr in prompts], params, lora_request=lora)
    return [list(o.outputs[0].token_ids) for o in outs]


def build_prompts(cfg, records: list[tuple[str, dict]], tokenizer) -> list[dict]:
    fmt, pad = cfg.trainer.data.format, tokenizer_info(tokenizer).pad_id
    out = []
    for loc, rec in records:
        segs, closing, ref = prompt_segments(fmt, rec, loc, tokenizer)
        stop, strings = stops(tokenizer, closing)
        out.append({"record": rec, "text": "".join(s.text for s in segs), "ids": encode(segs, tokenizer),
                    "stop": stop, "stop_strings": strings, "pad": pad, "reference": ref})
    return out


def run(cfg, run_dir: str, out: str, records: list[tuple[str, dict]], p: Params, *, iteration: Optional[int],
        merged: Optional[str], base_only: bool, engine: str) -> dict:
    tokenizer = load_tokenizer(cfg.trainer.tokenizer.path)
    prompts = build_prompts(cfg, records, tokenizer)
    base = cfg.trainer.checkpoint.pretrained
    if not merged and not base:
        raise PostError("generate needs the run's pretrained base (trainer.checkpoint.pretrained) or --merged DIR")
    adapter, it, source = None, None, merged or base
    if not merged and not base_only:
        adapter = os.path.join(out, "adapter")
        it = export_adapter(cfg, run_dir, iteration, adapter)
    want_cuda = cfg.trainer.distributed.device != "cpu" and torch.cuda.is_available()
    device = "cuda" if want_cuda else "cpu"
    engine = pick_engine(engine, device, None if adapter is None else int(cfg.trainer.lora.dim))
    what = "merged export" if merged else ("base only" if base_only else f"base + adapter of iteration {it}")
    say(f"generate | {len(prompts)} prompt(s) | {what} | engine {engine} on {device} | "
        f"{'greedy' if p.temperature <= 0 else f'sampled T={p.temperature} top-p={p.top_p} seed={p.seed}'}")
    if engine == "vllm":
        ids = vllm_generate(source, adapter, prompts, p, int(cfg.trainer.lora.dim))
    else:
        ids = hf_generate(source, adapter, prompts, p, device, tokenizer)
    rows = []
    for pr, new in zip(prompts, ids):
        text = answer_text(tokenizer, new, pr["stop"], pr["stop_strings"])
        row = {"prompt": pr["record"], "prompt_text": pr["text"], "answer": text, "reference": pr["reference"]}
        if pr["reference"] is not None:
            row["char_accuracy"] = char_accuracy(text, pr["reference"].strip())
        rows.append(row)
        shown = {k: v for k, v in pr["record"].items() if k not in ("output", "response", "answers", "reference")}
        say(f"  {json.dumps(shown, ensure_ascii=False)[:120]} -> {text!r}"
            + (f" (reference {pr['reference']!r})" if pr["reference"] is not None else ""))
    with open(os.path.join(out, "generations.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    scores = score(rows)
    summary = f"generate | {len(rows)} prompt(s) | {what}"
    if scores:
        summary += f" | exact match {scores['exact_match']:.3f} | char accuracy {scores['char_accuracy']:.3f}"
    return {"iteration": it, "source": what, "engine": engine, "device": device, "params": vars(p),
            "generations": os.path.join(out, "generations.jsonl"), "scores": scores, "summary": summary}
