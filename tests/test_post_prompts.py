"""trainer.post.prompts: a generation prompt is exactly the unsupervised text training put before the answer, for
every formatter, tokenized as in training (BOS once, no EOS), and stops where training supervised the end; the
launcher refuses at submit the prompt records the job would refuse (primus_contract.prompts, one check)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.data.errors import DataError
from trainer.data.formatters import get_formatter
from trainer.data.tokenize import load_tokenizer, tokenize_documents, tokenizer_info
from trainer.post.prompts import answer_text, char_accuracy, encode, from_text, prompt_segments, score, stops

from tokenizer_fixtures import byte_level_bpe

TOKENIZER = Path(__file__).resolve().parents[1] / "recipes" / "data" / "quickstart" / "tokenizer"
CASES = [
    ("alpaca", {"instruction": "Reverse the letters.", "input": "a b c", "output": "c b a"}, "c b a"),
    ("alpaca", {"instruction": "Say hi.", "response": "hi"}, "hi"),
    ("squad", {"context": "Paris is in France.", "question": "Where is Paris?", "answers": {"text": ["France"]}},
     "France"),
    ("openai", {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                             {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"},
                             {"role": "assistant", "content": "6"}]}, "6"),
    ("chatml", {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}, "hello"),
    ("text", {"text": "reverse: a b", "reference": "b a"}, "b a"),
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(TOKENIZER))


@pytest.mark.parametrize("fmt,record,answer", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_prompt_is_what_training_put_before_the_answer(fmt, record, answer, tok):
    segs, closing, ref = prompt_segments(fmt, record, f"{fmt}:1", tok)
    assert ref == answer and all(not s.supervise for s in segs)
    if fmt == "text":  # all supervised in training: the prompt is the text, the reference comes apart
        assert "".join(s.text for s in segs) == record["text"] and closing == ""
        return
    trained = get_formatter(fmt)(record, f"{fmt}:1", tok)
    last = max(i for i, s in enumerate(trained) if s.supervise)
    assert "".join(s.text for s in segs) == "".join(s.text for s in trained[:last])
    assert trained[last].text == answer + closing  # the chat template's end-of-turn token, or nothing (EOS)
    ids = encode(segs, tok)
    full, sup, _ = tokenize_documents([trained], tok, tokenizer_info(tok))
    assert list(full[:len(ids)]) == ids and sup[len(ids)] == 1  # (earlier assistant turns were supervised too)
    assert ids.count(tok.bos_token_id) == 1 and tok.eos_token_id not in ids
    expected = {tok.eos_token_id} | ({tok.convert_tokens_to_ids("<|im_end|>")} if closing else set())
    assert set(stops(tok, closing)[0]) == expected and stops(tok, closing)[1] == []


def test_prompt_text_and_bad_records(tok):
    segs, _, ref = prompt_segments("alpaca", from_text("alpaca", "Sort the digits."), "--prompt", tok)
    assert segs[0].text.startswith("### Instruction:\nSort the digits.\n\n") and ref is None
    segs, closing, _ = prompt_segments("openai", from_text("openai", "hi"), "--prompt", tok)
    assert segs[-1].text.endswith("<|im_start|>assistant\n") and closing == "<|im_end|>"
    with pytest.raises(DataError, match="--prompt"):
        from_text("squad", "x")
    with pytest.raises(DataError, match="p.jsonl:3: missing field 'instruction'"):
        prompt_segments("alpaca", {"input": "x"}, "p.jsonl:3", tok)
    with pytest.raises(DataError, match="unknown role"):
        prompt_segments("openai", {"messages": [{"role": "robot", "content": "x"}]}, "p.jsonl:1", tok)


def test_scores():
    assert char_accuracy("c b a", "c b a") == 1.0 and char_accuracy("", "abc") == 0.0
    assert char_accuracy("c b x", "c b a") == pytest.approx(0.8)
    rows = [{"answer": "c b a", "reference": "c b a"}, {"answer": "c b", "reference": "c b a"},
            {"answer": "?", "reference": None}]
    assert score(rows) == {"scored": 2, "exact_match": 0.5, "char_accuracy": pytest.approx((1 + 3 / 5) / 2)}


def test_prompt_with_input_is_laid_out_as_a_record_with_one(tok):
    """`generate --prompt "Reverse the letters." --input "a b c"` (the README's example answered '' without the
    Alpaca input): the same prompt text as the record {"instruction", "input"}; SQuAD takes --input as context."""
    record = {"instruction": "Reverse the letters.", "input": "a b c"}
    assert from_text("alpaca", "Reverse the letters.", "a b c") == record
    text = lambda fmt, rec: "".join(s.text for s in prompt_segments(fmt, rec, "x", tok)[0])  # noqa: E731
    assert text("alpaca", from_text("alpaca", "Reverse the letters.", "a b c")) == text("alpaca", record)
    assert "### Input:\na b c\n\n### Response:\n" in text("alpaca", record)
    assert from_text("squad", "Who?", "Ann wrote it.") == {"question": "Who?", "context": "Ann wrote it."}
    with pytest.raises(DataError, match="--input: format openai has no input field"):
        from_text("openai", "hi", "x")


@pytest.mark.parametrize("record,says", [
    ({"reference": "b a"}, "missing field 'text'"), ({"text": None}, "missing field 'text'"),
    ({"text": 123}, "field 'text' must be a string, got int"), ({"text": " "}, "field 'text' is empty"),
])
def test_a_text_prompt_is_a_text_string(record, says, tok):
    """`str(rec.get("text", ""))` made a missing text '' (a traceback in the job once generation started), 123 '123'
    and null 'None'."""
    with pytest.raises(DataError, match=f"^p.jsonl:4: {says}$"):
        prompt_segments("text", record, "p.jsonl:4", tok)
    with pytest.raises(DataError, match="^--prompt: field 'text' is empty$"):
        prompt_segments("text", from_text("text", ""), "--prompt", tok)


GOOD = {fmt: record for fmt, record, _ in reversed(CASES)}
BAD = [
    ("alpaca", {"input": "x"}, "missing field 'instruction'"),
    ("alpaca", {"instruction": "Sort.", "output": 4}, "field 'output' must be a string, got int"),
    ("squad", {"question": "Who?"}, "missing field 'context'"),
    ("openai", {"messages": [{"role": "robot", "content": "x"}]}, "field 'messages[0].role': unknown role 'robot'"),
    ("chatml", {"conversations": [{"from": "human", "value": 5}]}, "field 'conversations[0].value' must be a string"),
    ("text", {"text": "t", "reference": 7}, "field 'reference' must be a string, got int"),
    ("alpaca", {"instruction": "\ud800"}, "field 'instruction' is not UTF-8 text (a lone surrogate \\ud800"),
    ("openai", {"messages": [{"role": "user", "content": "\udcff"}]}, "field 'messages[0].content' is not UTF-8"),
    ("alpaca", {"instruction": "Sort.", "note": "\ud800"}, "a string of the record is not UTF-8 text"),
]


@pytest.mark.parametrize("fmt,record,says", BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD)])
def test_the_launcher_refuses_the_prompt_records_the_job_refuses(fmt, record, says, tok, tmp_path):
    """`generate --prompts`: read_prompts checked only that each line is a JSON object, so these were refused in the
    queue (or, the last, written nowhere: generations.jsonl could not hold it)."""
    from types import SimpleNamespace

    from primus_slurm.errors import UserError
    from primus_slurm.post_training.post_cli import read_prompts
    from trainer.post.__main__ import read_records
    from trainer.post.generate import build_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(GOOD[fmt]) + "\n" + json.dumps(record) + "\n")
    cfg = SimpleNamespace(trainer=SimpleNamespace(data=SimpleNamespace(format=fmt)))
    with pytest.raises(DataError) as job:
        build_prompts(cfg, read_records(SimpleNamespace(cfg=cfg, prompt=None, prompts=str(path))), tok)
    assert str(job.value).startswith(f"{path}:2: {says}"), str(job.value)
    with pytest.raises(UserError) as launcher:
        read_prompts(str(path), fmt=fmt)
    assert str(launcher.value) == f"--prompts {job.value}"
    path.write_text(json.dumps(GOOD[fmt]) + "\n")
    read_prompts(str(path), fmt=fmt)


def test_a_closing_of_several_tokens_is_a_stop_string(tmp_path):
    """The ChatML markup closes a turn with `<|im_end|>`; where that is several tokens generate stopped only on EOS
    (the closing was kept only as one token) and the answer kept the `<|im_end|>` text."""
    t = byte_level_bpe(tmp_path)  # no <|im_end|> token, no chat template (a base tokenizer)
    _, closing, _ = prompt_segments("openai", from_text("openai", "hello"), "--prompt", t)
    assert closing.startswith("<|im_end|>") and len(t("<|im_end|>", add_special_tokens=False)["input_ids"]) > 1
    assert stops(t, closing) == ([t.eos_token_id], ["<|im_end|>"])


def test_generation_stops_at_a_stop_string(tok):
    """transformers' generate with stop_strings (engine transformers), and the answer cut before it."""
    from trainer.post.generate import Params, hf_generate

    base = str(TOKENIZER.parent / "base")
    prompt = {"ids": tok("reverse:\na b c d e f g h\n")["input_ids"], "stop": [tok.eos_token_id], "stop_strings": [],
              "pad": tok.pad_token_id}
    free = hf_generate(base, None, [prompt], Params(max_new_tokens=12), "cpu", tok)[0]
    stop = tok.decode(free[2:4])  # two tokens: no stop id can say it
    assert len(tok(stop, add_special_tokens=False)["input_ids"]) == 2 and stop not in tok.decode(free[:3])
    got = hf_generate(base, None, [{**prompt, "stop_strings": [stop]}], Params(max_new_tokens=12), "cpu", tok)[0]
    assert got == free[:4] and len(free) > 4
    assert answer_text(tok, got, prompt["stop"], [stop]) == tok.decode(free[:2]).strip()
