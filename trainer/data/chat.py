"""Chat formatters: ``openai`` (``{"messages": [{"role", "content"}]}``) and ``chatml`` (multi-turn; also accepts
ShareGPT ``{"conversations": [{"from", "value"}]}``). Only assistant turns are supervised.

Rendering: with the tokenizer's chat template when it has one, else ChatML markup
(``<|im_start|>{role}\\n{content}<|im_end|>\\n``). With a template the conversation is rendered turn by turn;
for each assistant turn the part up to the generation prompt is unsupervised, the content plus the template's
end-of-turn special token right after it is supervised, and anything else (newlines, BOS) is unsupervised.
"""
from __future__ import annotations

from typing import Any

from .segments import Segment, record_error

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def messages_of(record: Any, loc: str, allow_sharegpt: bool) -> list[dict]:
    if not isinstance(record, dict):
        raise record_error(loc, f"expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        raw, key, rkey, ckey, rolemap = record["messages"], "messages", "role", "content", None
    elif allow_sharegpt and "conversations" in record:
        raw, key, rkey, ckey, rolemap = record["conversations"], "conversations", "from", "value", SHAREGPT_ROLES
    else:
        raise record_error(loc, "missing field 'messages'" + (" (or 'conversations')" if allow_sharegpt else ""))
    if not isinstance(raw, list) or not raw:
        raise record_error(loc, f"field '{key}' must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise record_error(loc, f"field '{where}' must be an object")
        role = m.get(rkey)
        role = rolemap.get(role, role) if rolemap and isinstance(role, str) else role
        if role not in ROLES:
            allowed = "|".join(rolemap) if rolemap else "|".join(ROLES)
            raise record_error(loc, f"field '{where}.{rkey}': unknown role {m.get(rkey)!r} (expected {allowed})")
        content = m.get(ckey)
        if not isinstance(content, str):
            raise record_error(loc, f"field '{where}.{ckey}' must be a string")
        if role == "assistant" and not content.strip():
            raise record_error(loc, f"field '{where}.{ckey}': empty assistant turn")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise record_error(loc, f"field '{key}': no assistant turn to learn from")
    return out


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


def _with_template(messages: list[dict], loc: str, tokenizer: Any) -> list[Segment]:
    specials = special_strings(tokenizer)
    segs: list[Segment] = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = _render(tokenizer, messages[:i], True, loc)
        full = _render(tokenizer, messages[: i + 1], False, loc)
        if not prefix.startswith(done) or not full.startswith(prefix):
            raise record_error(loc, f"messages[{i}]: the tokenizer's chat template is not prefix-stable; "
                                    "cannot locate the assistant turn")
        tail = full[len(prefix):]
        at = tail.find(m["content"])
        if at < 0:
            raise record_error(loc, f"messages[{i}]: chat template output does not contain the assistant content")
        end = at + len(m["content"])
        closing = next((s for s in specials if tail.startswith(s, end)), "")
        segs += [Segment(prefix[len(done):] + tail[:at], False),
                 Segment(tail[at:end + len(closing)], True)]
        done = prefix + tail[:end + len(closing)]
    full = _render(tokenizer, messages, False, loc)
    if full.startswith(done) and len(full) > len(done):
        segs.append(Segment(full[len(done):], False))
    return [s for s in segs if s.text]


def _chatml_markup(messages: list[dict]) -> list[Segment]:
    segs: list[Segment] = []
    for m in messages:
        head = f"{IM_START}{m['role']}\n"
        if m["role"] == "assistant":
            segs += [Segment(head, False), Segment(m["content"] + IM_END, True), Segment("\n", False)]
        else:
            segs.append(Segment(head + m["content"] + IM_END + "\n", False))
    return segs


def render_chat(messages: list[dict], loc: str, tokenizer: Any) -> list[Segment]:
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return _with_template(messages, loc, tokenizer)
    return _chatml_markup(messages)


def format_openai(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    return render_chat(messages_of(record, loc, allow_sharegpt=False), loc, tokenizer)


def format_chatml(record: Any, loc: str, tokenizer: Any = None) -> list[Segment]:
    return render_chat(messages_of(record, loc, allow_sharegpt=True), loc, tokenizer)
