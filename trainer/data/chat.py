"""Chat formatters: ``openai`` (``{"messages": [{"role", "content"}]}``) and ``chatml`` (multi-turn; also accepts
ShareGPT ``{"conversations": [{"from", "value"}]}``). Only assistant turns are supervised.

Rendering: with the tokenizer's chat template when it has one, else ChatML markup
(``<|im_start|>{role}\\n{content}<|im_end|>\\n``).

With a template the conversation is rendered once, and each assistant turn supervises what the template wrote of
its content plus the end-of-turn special token after it (whitespace apart); the rest (role headers, the generation
prompt, markup the template writes whatever the content, such as Qwen3's ``<think>`` opener and its empty block)
is not supervised. What the template wrote of a content is found by position, not by searching the text: it is
where the render differs from the render with that content replaced by a sentinel (`_content_span`). So a
content that also occurs in a role header, in markup or in another turn is not mistaken for it, and a content the
template rewrites is supervised as written: Llama-3 trims it; Qwen3 splits ``<think>reasoning</think>answer`` and
writes the reasoning back (as ``<think>\\n...\\n</think>\\n\\n``) only in the turns after the last user message, the
answer alone before it, as it shows a conversation's history. A turn of which the template writes nothing (Qwen3's
reasoning-only turn before the last user message) is a bad record.

Without a template the supervised text is the content plus ``<|im_end|>``. When the tokenizer has no single
``<|im_end|>`` token (a base tokenizer), EOS is supervised after it too: the closing is then only text, and the
model must learn to stop with EOS, which `generate` stops on.
"""
from __future__ import annotations

import re
from typing import Any

from primus_contract.records import messages_of, template_failure

from .segments import Segment, record_error

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_SPACE = re.compile(r"\s*")


def special_strings(tokenizer: Any) -> list[str]:
    """All special-token strings of an HF tokenizer, longest first."""
    toks = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            toks.add(str(tok))
    return sorted((t for t in toks if t), key=len, reverse=True)


def _render(tokenizer: Any, messages: list[dict], loc: str) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # noqa: BLE001 - jinja/template errors become one record-level line
        raise template_failure(loc, e) from None


def _turn_end(text: str, end: int, specials: list[str]) -> int:
    """Past the end-of-turn special token that follows the content ending at `end`, whitespace apart; `end` when
    other text follows."""
    after = _SPACE.match(text, end).end()
    return next((after + len(s) for s in specials if text.startswith(s, after)), end)


def _common_prefix(a: str, b: str, limit: int) -> int:
    """The length of the longest common prefix of a and b, at most `limit` (a binary search of C comparisons)."""
    lo, hi = 0, min(len(a), len(b), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _sentinel(full: str) -> str:
    """A private-use character that `full` does not contain: a render differs from `full` from where it writes it."""
    return next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in full)


def _content_span(full: str, messages: list[dict], i: int, loc: str, tokenizer: Any) -> tuple[int, int]:
    """[begin, end) of what the template wrote of messages[i]'s content in `full`: where `full` differs from the
    render with that content replaced by a sentinel character `full` lacks. Located by position, never by searching
    the text, so a content that also occurs in markup or in another turn is not mistaken for it, and a content the
    template rewrote (Qwen3's ``<think>`` reasoning, Llama-3's trim) is what it wrote."""
    other = _render(tokenizer, [*messages[:i], {**messages[i], "content": _sentinel(full)}, *messages[i + 1:]], loc)
    head = _common_prefix(full, other, len(full))
    tail = _common_prefix(full[::-1], other[::-1], min(len(full), len(other)) - head)
    return head, len(full) - tail


def _with_template(messages: list[dict], loc: str, tokenizer: Any) -> list[Segment]:
    """The conversation rendered once; each assistant turn supervises what the template wrote of its content, and
    the end-of-turn special token after it."""
    specials = special_strings(tokenizer)
    full = _render(tokenizer, messages, loc)
    segs: list[Segment] = []
    done = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        begin, end = _content_span(full, messages, i, loc, tokenizer)
        if begin >= end:
            raise record_error(loc, f"messages[{i}]: the chat template writes nothing of this assistant turn's "
                                    "content, so there is nothing to learn from it")
        if begin < done:
            raise record_error(loc, f"messages[{i}]: what the chat template writes of this assistant turn "
                                    "overlaps the turn before, so its loss mask cannot be placed")
        stop = _turn_end(full, end, specials)
        segs += [Segment(full[done:begin], False), Segment(full[begin:stop], True)]
        done = stop
    return [s for s in segs + [Segment(full[done:], False)] if s.text]


def _chatml_markup(messages: list[dict], tokenizer: Any) -> list[Segment]:
    eos: list[Segment] = []
    if tokenizer is not None and tokenizer.eos_token and \
            len(tokenizer(IM_END, add_special_tokens=False)["input_ids"]) != 1:
        eos = [Segment(tokenizer.eos_token, True)]  # <|im_end|> is only text here: the model learns to stop with EOS
    segs: list[Segment] = []
    for m in messages:
        head = f"{IM_START}{m['role']}\n"
        if m["role"] == "assistant":
            segs += [Segment(head, False), Segment(m["content"] + IM_END, True), *eos, Segment("\n", False)]
        else:
            segs.append(Segment(head + m["content"] + IM_END + "\n", False))
    return segs


def render_chat(messages: list[dict], loc: str, tokenizer: Any) -> list[Segment]:
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return _with_template(messages, loc, tokenizer)
    return _chatml_markup(messages, tokenizer)


def format_openai(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    return render_chat(messages_of(record, loc, allow_sharegpt=False), loc, tokenizer)


def format_chatml(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    return render_chat(messages_of(record, loc, allow_sharegpt=True), loc, tokenizer)
