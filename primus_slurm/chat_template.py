"""A tokenizer directory's chat template, rendered here as the job's tokenizer renders it, so a template that raises
on the data (Jinja's `raise_exception`, as templates that refuse a system turn or an order of roles do) is refused
at submit instead of in the queue (primus_slurm/first_records.py).

The template is read as transformers reads it: ``chat_template.jinja`` in the directory, else the
``chat_template`` of tokenizer_config.json (a string, or the entry named ``default`` of a list of named ones). It
is rendered in Jinja's immutable sandbox with what transformers' `apply_chat_template` gives it: trim_blocks and
lstrip_blocks, loop controls, the ``{% generation %}`` tag (its body as is), `raise_exception`, `strftime_now`, a
`tojson` that does not escape HTML, the tokenizer's special-token strings (``bos_token`` ...) and
``add_generation_prompt`` false. A special token the files do not name is given as "" (never refused here for a
token a tokenizer class supplies by default).
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Callable, Optional

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from primus_slurm.errors import UserError

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class _Generation(Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (it marks assistant text for a mask): the body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _json_file(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return {}  # (unreadable: the job's tokenizer load judges it)
    return value if isinstance(value, dict) else {}


def _source(folder: str, config: dict) -> Optional[str]:
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    template = config.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    return template if isinstance(template, str) and template else None


def _token(value) -> Optional[str]:
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _specials(folder: str, config: dict) -> dict:
    mapped = _json_file(os.path.join(folder, "special_tokens_map.json"))
    return {name: _token(config.get(name)) or _token(mapped.get(name)) or "" for name in SPECIAL_NAMES}


def renderer(folder: str, field: str) -> Optional[Callable[[list], str]]:
    """`render(messages) -> text` of the chat template of the tokenizer directory `folder` (the recipe's `field`);
    None when it has none (the job writes ChatML markup). A template that does not compile is refused here: the job
    would fail on every record."""
    config = _json_file(os.path.join(folder, "tokenizer_config.json"))
    source = _source(folder, config)
    if source is None:
        return None
    try:
        template = _environment().from_string(source)
    except TemplateError as exc:
        where = f" at line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise UserError(f"`{field}` {folder}: its chat template does not compile ({type(exc).__name__}{where}: "
                        f"{' '.join(str(exc).split())[:200]}); the job could render no record with it") from None
    specials = _specials(folder, config)
    return lambda messages: template.render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=False, **specials)
