"""The tokenizer's chat template is rendered at submit against the data's first records (primus_slurm/first_records.py,
chat_template.py): a template that raises on a record is one error line naming the field, the record and the
template's message, exit 2, nothing written, instead of a job that stops in the queue. The launcher's sandboxed
render is the job's (transformers') text, so a template the job renders is never refused here."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from primus_slurm.chat_template import renderer
from primus_slurm.cli import run
from primus_slurm.errors import UserError

from test_bad_recipes import QS, _check_error
from tokenizer_fixtures import LLAMA3, LLAMA3_SPECIALS, QWEN3, QWEN3_SPECIALS, with_template

NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('system turns are not "
             "supported') }}{% endif %}{{ bos_token + m['role'] + ': ' }}{% generation %}{{ m['content'] }}"
             "{% endgeneration %}{{ eos_token }}{% endfor %}")


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def S(text):
    return {"role": "system", "content": text}


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _argv(tok, train, *sets):
    return ["validate", QS, "--set", "trainer.data.format=openai", "--set", f"trainer.tokenizer.path={tok}",
            "--set", f"trainer.data.train.path={train}", "--set", "trainer.data.validation.path=null",
            "--set", "trainer.schedule.eval_interval=null", *[a for s in sets for a in ("--set", s)]]


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    out = tmp_path_factory.mktemp("strict-tok")
    with_template(out, NO_SYSTEM, {"eos_token": "<|im_end|>"})
    return out


@pytest.mark.parametrize("template,specials", [(QWEN3, QWEN3_SPECIALS), (LLAMA3, LLAMA3_SPECIALS),
                                               (NO_SYSTEM, {"eos_token": "<|im_end|>"})])
def test_the_launcher_renders_what_the_job_renders(template, specials, tmp_path):
    """Real templates (Qwen3's namespace and reversed loop, Llama-3's bos_token and trim, a {% generation %} tag)
    render here to the text transformers' apply_chat_template gives, from the tokenizer directory's files."""
    with_template(tmp_path, template, specials)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    render = renderer(str(tmp_path), "trainer.tokenizer.path")
    for convo in ([U(" Q? "), A("<think>r</think>4"), U("b"), A("5 ")], [U("hi"), A("ok")]):
        assert render(convo) == tok.apply_chat_template(convo, tokenize=False)


def test_a_record_the_template_raises_on_is_refused_at_submit(strict, tmp_path, capsys, monkeypatch):
    train = _jsonl(tmp_path / "chat.jsonl", [{"messages": [U("hi"), A("ok")]},
                                             {"messages": [S("be brief"), U("hi"), A("ok")]}])
    line = _check_error(capsys, _argv(strict, train), "`trainer.data.train.path`")
    assert f"{train}:2: the tokenizer's chat template failed: TemplateError: system turns are not supported" in line
    assert "bad_records: error" in line
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PRIMUS_SLURM_STATE_DIR", str(work / "state"))
    monkeypatch.delenv("PRIMUS_WORKSPACE", raising=False)
    assert _check_error(capsys, ["submit", *_argv(strict, train)[1:]], "`trainer.data.train.path`") == line
    assert list(work.iterdir()) == []  # nothing submitted: no run directory, no registry


def test_with_skip_only_a_template_that_fails_every_record_is_refused(strict, tmp_path, capsys):
    every = _jsonl(tmp_path / "every.jsonl", [{"messages": [S("x"), U("hi"), A("ok")]}] * 3)
    line = _check_error(capsys, _argv(strict, every, "trainer.data.bad_records=skip"), "every one of its 3 records")
    assert f"the first: {every}:1: the tokenizer's chat template failed" in line
    some = _jsonl(tmp_path / "some.jsonl", [{"messages": [S("x"), U("hi"), A("ok")]}, {"messages": [U("a"), A("b")]}])
    assert run(_argv(strict, some, "trainer.data.bad_records=skip")) == 0
    assert run(_argv(strict, some)) == 2  # (bad_records: error: the job would stop on its first record)
    capsys.readouterr()


def test_only_the_first_records_are_read_and_a_bad_one_of_them_is_refused(strict, tmp_path, capsys):
    """A record the format's own checks refuse (no assistant turn) among the first is refused as the job would;
    past the first 64 nothing is read here (the job reads the rest)."""
    good = [{"messages": [U("hi"), A("ok")]}] * 64
    late = _jsonl(tmp_path / "late.jsonl", good + [{"messages": [S("x"), U("hi"), A("ok")]}])
    assert run(_argv(strict, late)) == 0
    early = _jsonl(tmp_path / "early.jsonl", good[:2] + [{"messages": [U("hi")]}])
    _check_error(capsys, _argv(strict, early), f"{early}:3: field 'messages': no assistant turn to learn from")


def test_a_template_that_does_not_compile_is_refused_naming_the_tokenizer(tmp_path, capsys):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    train = _jsonl(tmp_path / "chat.jsonl", [{"messages": [U("hi"), A("ok")]}])
    line = _check_error(capsys, _argv(tmp_path / "tok", train), "`trainer.tokenizer.path`")
    assert "its chat template does not compile (TemplateSyntaxError at line 1: " in line
    with pytest.raises(UserError, match=r"^`trainer\.tokenizer\.path` .*: its chat template does not compile"):
        renderer(str(tmp_path / "tok"), "trainer.tokenizer.path")


def test_eval_data_is_rendered_with_the_runs_template_at_submit(strict, tmp_path):
    """`eval RUN --data FILE` (and a pipeline's eval step): the run's chat template renders each record where the
    run's tokenizer directory is on this machine, so a record it raises on is refused before the job is queued."""
    from primus_slurm.post_training.post_cli import check_eval_data

    resolved = {"trainer": {"data": {"format": "openai", "bad_records": "error", "validation": {"split": None}},
                            "tokenizer": {"path": str(strict)}}}
    good = _jsonl(tmp_path / "good.jsonl", [{"messages": [U("hi"), A("ok")]}])
    assert check_eval_data(str(good), resolved) == good
    bad = _jsonl(tmp_path / "bad.jsonl", [{"messages": [U("hi"), A("ok")]}, {"messages": [S("x"), U("hi"), A("ok")]}])
    with pytest.raises(UserError, match=r"^--data .*bad\.jsonl:2: the tokenizer's chat template failed: "
                                        r"TemplateError: system turns are not supported"):
        check_eval_data(str(bad), resolved)
    resolved["trainer"]["tokenizer"]["path"] = str(tmp_path / "not-here")  # a tokenizer only the job sees
    assert check_eval_data(str(bad), resolved) == bad
