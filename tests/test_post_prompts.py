"""trainer.post.prompts: a generation prompt is exactly the unsupervised text training put before the answer, for
every formatter, tokenized as in training (BOS once, no EOS), and stops where training supervised the end."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer.data.errors import DataError
from trainer.data.formatters import get_formatter
from trainer.data.tokenize import load_tokenizer, tokenize_documents, tokenizer_info
from trainer.post.prompts import char_accuracy, encode, from_text, prompt_segments, score, stop_ids

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
    assert set(stop_ids(tok, closing)) == expected


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
