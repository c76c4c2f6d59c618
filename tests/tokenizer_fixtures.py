"""Tiny local tokenizers for the data tests, and helpers to read what a formatted record supervises.

`with_template` derives one from the quickstart tokenizer with a real chat template and that family's special
tokens: Llama-3-Instruct's (it trims each content) and Qwen3's without its tool-call parts (it writes an empty
``<think>`` block only into assistant turns after the last user message). `byte_level_bpe` is a byte-level BPE
without a default BOS and without ``<|im_end|>`` (as Llama-3 base).
"""
from __future__ import annotations

import os

import numpy as np
from transformers import AutoTokenizer

from trainer.data.tokenize import tokenize_documents, tokenizer_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK_DIR = os.path.join(ROOT, "recipes", "data", "quickstart", "tokenizer")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
          "+ message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
          "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA3_SPECIALS = {"eos_token": "<|eot_id|>", "additional_special_tokens": ["<|start_header_id|>",
                                                                            "<|end_header_id|>"]}
QWEN3 = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')\
.split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + \
reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""
QWEN3_SPECIALS = {"eos_token": "<|im_end|>", "additional_special_tokens": ["<think>", "</think>"]}


def with_template(out_dir, template: str, specials: dict):
    """The quickstart tokenizer with `template` and `specials`, saved to and loaded back from out_dir."""
    tok = AutoTokenizer.from_pretrained(TOK_DIR)
    tok.add_special_tokens(specials)
    tok.chat_template = template
    tok.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def byte_level_bpe(out_dir):
    """A byte-level BPE (every string encodes) whose only special token is <|endoftext|>, BOS = EOS, not added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["hello world"] * 50, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
                            ).save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def encode(docs, t):
    info = tokenizer_info(t)
    tokens, sup, offsets = tokenize_documents(docs, t, info)
    return [(tokens[a:b], sup[a:b]) for a, b in zip(offsets[:-1], offsets[1:])], info


def supervised_spans(tokens, sup, t, specials=False):
    """Decoded maximal runs of supervised tokens (special tokens removed unless `specials`)."""
    cuts = np.flatnonzero(np.diff(sup.astype(np.int8))) + 1
    return [t.decode(ts.tolist(), skip_special_tokens=not specials, clean_up_tokenization_spaces=False)
            for ts, ss in zip(np.split(tokens, cuts), np.split(sup, cuts)) if ss[0]]
