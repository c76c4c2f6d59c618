"""Chat formatters: ``openai`` (``{"messages": [{"role", "content"}]}``) and ``chatml`` (multi-turn; also accepts
ShareGPT ``{"conversations": [{"from", "value"}]}``). Only assistant turns are supervised.

Rendering: with the tokenizer's chat template when it has one, else ChatML markup
(``<|im_start|>{role}\\n{content}<|im_end|>\\n``).

With a template, each assistant turn supervises its content as the template wrote it (the exact content, else its
stripped form: Llama-3's template trims) plus the end-of-turn special token after it (whitespace apart); what
comes before (the generation prompt, Qwen3's empty ``<think>`` block) and after (newlines, BOS) is not supervised.
A prefix-stable template is rendered turn by turn: the turn is what its render adds to the render, with generation
prompt, of the messages before it, and its content is the last occurrence there. A template whose earlier turns
change with later messages (Qwen3 writes ``<think>`` only after the last user message) is rendered once: each
message is located in order from the end of the one before, an assistant turn at the first occurrence that only
whitespace and an end-of-turn special token (or the end of the text) follow.

Without a template the supervised text is the content plus ``<|im_end|>``. When the tokenizer has no single
``<|im_end|>`` token (a base tokenizer), EOS is supervised after it too: the closing is then only text, and the
model must learn to stop with EOS, which `generate` stops on.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from primus_contract.records import messages_of

from .segments import Segment, record_error

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_SPACE = re.compile(r"\s*")
Span = Optional[tuple[int, int]]


def special_strings(tokenizer: Any) -> list[str]:
    """All special-token strings of an HF tokenizer, longest first."""
    toks = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            toks.add(str(tok))
    return sorted((t for t in toks if t), key=len, reverse=True)


def _render(tokenizer: Any, messages: list[dict], gen: bool, loc: str) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    except Exception as e:  # noqa: BLE001 - jinja/template errors become one record-level line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise record_error(loc, f"the tokenizer's chat template failed: {type(e).__name__}: {first}") from None


def _needles(content: str) -> tuple[str, ...]:
    """The assistant content as a template may write it: exact, else stripped (Llama-3's ``| trim``)."""
    return tuple(dict.fromkeys((content, content.strip())))


def _turn_end(text: str, end: int, specials: list[str]) -> Optional[int]:
    """Past the end-of-turn special token that follows the content ending at `end`, whitespace apart (`end` itself
    at the end of the text); None when other text follows."""
    after = _SPACE.match(text, end).end()
    if after == len(text):
        return end
    return next((after + len(s) for s in specials if text.startswith(s, after)), None)


def _last(text: str, content: str, start: int, specials: list[str]) -> Span:
    """(begin, turn end) of the content's last occurrence in text[start:], the text of one turn: what the template
    writes before the content may contain it too (a short answer in Qwen3's ``<think>``), what follows it may not."""
    for needle in _needles(content):
        at = text.rfind(needle, start)
        if at >= 0:
            end = at + len(needle)
            return at, _turn_end(text, end, specials) or end
    return None


def _occurrences(text: str, content: str, start: int):
    """(begin, end) of each occurrence in text[start:] of the content, then of its stripped form, in order."""
    for needle in _needles(content):
        at = text.find(needle, start)
        while at >= 0:
            yield at, at + len(needle)
            at = text.find(needle, at + 1)


def _first_closed(text: str, content: str, start: int, specials: list[str]) -> Span:
    """(begin, turn end) of the content's first occurrence in text[start:] that only whitespace and an end-of-turn
    special token (or the end of the text) follow."""
    ends = ((at, _turn_end(text, end, specials)) for at, end in _occurrences(text, content, start))
    return next(((at, end) for at, end in ends if end is not None), None)


def _missing(loc: str, i: int) -> Exception:
    return record_error(loc, f"messages[{i}]: chat template output does not contain the assistant content")


def _turn_by_turn(messages: list[dict], loc: str, tokenizer: Any, specials: list[str]) -> Optional[list[Segment]]:
    """The segments of a prefix-stable template, rendered turn by turn; None when the renders are not prefixes of
    each other."""
    segs: list[Segment] = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], True, loc)
        turn = _render(tokenizer, messages[: i + 1], False, loc)
        if not prefix.startswith(done) or not turn.startswith(prefix):
            return None
        span = _last(turn, m["content"], len(prefix), specials)
        if span is None:
            raise _missing(loc, i)
        segs += [Segment(turn[len(done):span[0]], False), Segment(turn[span[0]:span[1]], True)]
        done = turn[:span[1]]
    full = _render(tokenizer, messages, False, loc)
    if not full.startswith(done):
        return None
    return segs + [Segment(full[len(done):], False)]


def _in_one_render(messages: list[dict], loc: str, tokenizer: Any, specials: list[str]) -> list[Segment]:
    """The segments of the whole conversation rendered once, each message located from the end of the one before
    (a non-assistant message the template rewrote is passed over)."""
    full = _render(tokenizer, messages, False, loc)
    segs: list[Segment] = []
    done = cursor = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            cursor = next((end for _, end in _occurrences(full, m["content"], cursor)), cursor)
            continue
        span = _first_closed(full, m["content"], cursor, specials)
        if span is None:
            raise _missing(loc, i)
        segs += [Segment(full[done:span[0]], False), Segment(full[span[0]:span[1]], True)]
        done = cursor = span[1]
    return segs + [Segment(full[done:], False)]


def _with_template(messages: list[dict], loc: str, tokenizer: Any) -> list[Segment]:
    specials = special_strings(tokenizer)
    segs = _turn_by_turn(messages, loc, tokenizer, specials)
    if segs is None:
        segs = _in_one_render(messages, loc, tokenizer, specials)
    return [s for s in segs if s.text]


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
