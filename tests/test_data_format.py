"""Formatters, segment schema, tokenization and record validation on real HF tokenizers (built/shipped locally)."""
import json

import pytest
from transformers import AutoTokenizer

import primus_contract
from trainer.data.build import read_documents
from trainer.data.chat import format_chatml, format_openai
from trainer.data.errors import DataError
from trainer.data.formatters import format_alpaca, format_squad, format_text
from trainer.data.options import DataOptions
from trainer.data.tokenize import tokenizer_info

from tokenizer_fixtures import TOK_DIR, byte_level_bpe, encode, supervised_spans


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOK_DIR)


@pytest.fixture()
def tok_plain():
    t = AutoTokenizer.from_pretrained(TOK_DIR)
    t.chat_template = None
    return t


def test_quickstart_tokenizer_identity(tok):
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.pad_token == "<pad>"
    assert len(tok) <= 512 and tok.chat_template
    info = tokenizer_info(tok)
    assert info.add_bos and info.pad_id == tok.pad_token_id


@pytest.mark.parametrize("fmt,record,answer", [
    (format_alpaca, {"instruction": "Reverse the letters.", "input": "a b c", "output": "c b a"}, "c b a"),
    (format_alpaca, {"instruction": "Say hi", "response": "Hello, world!"}, "Hello, world!"),
    (format_squad, {"context": "Paris is in France.", "question": "Where is Paris?",
                    "answers": {"text": ["in France"], "answer_start": [9]}}, "in France"),
    (format_squad, {"context": "x", "question": "y", "answer": "z 42"}, "z 42"),
    (format_text, {"text": "just some text 123"}, "just some text 123"),
])
def test_single_answer_spans_decode_exactly(tok, fmt, record, answer):
    (tokens, sup), = encode([fmt(record, "f.jsonl:1", tok)], tok)[0]
    assert supervised_spans(tokens, sup, tok) == [answer]
    assert tokens[0] == tok.bos_token_id and (tokens == tok.bos_token_id).sum() == 1
    assert tokens[-1] == tok.eos_token_id and sup[-1] == 1 and (tokens == tok.eos_token_id).sum() == 1


CONVO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "First question?"},
         {"role": "assistant", "content": "Answer one."}, {"role": "user", "content": "Second?"},
         {"role": "assistant", "content": "Answer two, longer."}]


@pytest.mark.parametrize("template", [True, False])
@pytest.mark.parametrize("fmt", [format_openai, format_chatml])
def test_multi_turn_masks_only_assistant_turns(tok, tok_plain, template, fmt):
    t = tok if template else tok_plain
    (tokens, sup), = encode([fmt({"messages": CONVO}, "f.jsonl:3", t)], t)[0]
    assert supervised_spans(tokens, sup, t) == ["Answer one.", "Answer two, longer."]
    text = t.decode(tokens[sup == 0].tolist(), skip_special_tokens=False)
    for m in CONVO:
        if m["role"] != "assistant":
            assert m["content"] in text
    # the supervised spans end with the end-of-turn token so the model learns to stop
    im_end = t.convert_tokens_to_ids("<|im_end|>")
    assert ((tokens == im_end) & (sup == 1)).sum() == 2
    # a template-rendered conversation is byte-identical to the template output
    if template:
        full = t.apply_chat_template(CONVO, tokenize=False)
        assert t.decode(tokens.tolist(), skip_special_tokens=False) == "<s>" + full


def test_sharegpt_conversations_and_no_double_bos(tok):
    t = AutoTokenizer.from_pretrained(TOK_DIR)
    t.chat_template = "<s>" + t.chat_template  # template that renders BOS itself
    rec = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    (tokens, sup), = encode([format_chatml(rec, "f:1", t)], t)[0]
    assert (tokens == t.bos_token_id).sum() == 1 and tokens[0] == t.bos_token_id
    assert supervised_spans(tokens, sup, t) == ["yo"]


def test_tokenizer_without_default_bos(tmp_path):
    t = byte_level_bpe(tmp_path)
    [(tokens, sup)], info = encode([format_text({"text": "hello"}, "f:1")], t)
    assert not info.add_bos and info.pad_id == t.eos_token_id
    assert tokens.tolist() == t("hello", add_special_tokens=False)["input_ids"] + [t.eos_token_id]


@pytest.mark.parametrize("fmt,record,needle", [
    (format_alpaca, {"input": "x", "output": "y"}, "missing field 'instruction'"),
    (format_alpaca, {"instruction": "x", "output": 3}, "field 'output' must be a string"),
    (format_alpaca, {"instruction": "x", "output": "  "}, "field 'output' is empty"),
    (format_squad, {"context": "c", "question": "q", "answers": {"text": []}}, "answers.text' has no answer"),
    (format_openai, {"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role': unknown role 'bot'"),
    (format_openai, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
     "messages[1].content': empty assistant turn"),
    (format_openai, {"messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
    (format_chatml, {"conversations": [{"from": "alien", "value": "x"}]}, "conversations[0].from': unknown role"),
    (format_text, ["not", "a", "dict"], "expected a JSON object"),
])
def test_bad_records_name_location_and_field(fmt, record, needle):
    with pytest.raises(DataError) as e:
        fmt(record, "data/train.jsonl:17", None)
    msg = str(e.value)
    assert msg.startswith("data/train.jsonl:17: ") and needle in msg and "\n" not in msg


def _opts(path, bad_records):
    cfg = {"trainer": {"tokenizer": {"path": TOK_DIR}, "data": {
        "format": "alpaca", "train": {"path": str(path)}, "seq_length": 64, "bad_records": bad_records}}}
    return DataOptions.from_config(cfg)


def test_bad_record_policy_error_and_skip(tmp_path, tok):
    path = tmp_path / "train.jsonl"
    good = {"instruction": "a", "output": "b"}
    lines = [json.dumps(good), "{not json", json.dumps({"instruction": "a"}), "", json.dumps(good)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:2: invalid JSON"):
        read_documents(_opts(path, "error"), _opts(path, "error").train, "trainer.data.train", tok)
    opts = _opts(path, "skip")
    docs, counts = read_documents(opts, opts.train, "trainer.data.train", tok)
    assert len(docs) == 2 and counts == {"records": 4, "skipped_bad_records": 2}
    path.write_text(json.dumps({"instruction": "a"}) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:1: missing field 'output'$"):
        read_documents(_opts(path, "error"), _opts(path, "error").train, "trainer.data.train", tok)


@pytest.mark.parametrize("patch,field", [
    ({"format": "csv"}, "trainer.data.format"),
    ({"seq_length": "long"}, "trainer.data.seq_length"),
    ({"overlong": "wrap"}, "trainer.data.overlong"),
    ({"bad_records": "ignore"}, "trainer.data.bad_records"),
    ({"train": {"path": None}}, "trainer.data.train.path"),
    ({"pad_to_multiple_of": 0}, "trainer.data.pad_to_multiple_of"),
])
def test_bad_options_name_the_key(patch, field):
    """The data options are the contract's to check: the trainer runs it at start (trainer/runtime/start_check.py),
    before DataOptions reads them."""
    data = {"format": "alpaca", "train": {"path": "x.jsonl"}, "seq_length": 64, **patch}
    with pytest.raises(primus_contract.ContractError) as e:
        primus_contract.check_resolved({"trainer": {"tokenizer": {"path": TOK_DIR}, "data": data}})
    assert e.value.field == field and "\n" not in str(e.value), str(e.value)
