"""Chat templates that trim the content (Llama-3-Instruct), change earlier turns with later messages (Qwen3's
``<think>`` block), or are absent on a tokenizer without a ``<|im_end|>`` token: what each assistant turn
supervises, decoded with its special tokens."""
import pytest
from transformers import AutoTokenizer

from trainer.data.chat import format_chatml, format_openai

from tokenizer_fixtures import LLAMA3, LLAMA3_SPECIALS, QWEN3, QWEN3_SPECIALS, TOK_DIR, byte_level_bpe, \
    encode, supervised_spans, with_template


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return with_template(tmp_path_factory.mktemp("llama3"), LLAMA3, LLAMA3_SPECIALS)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return with_template(tmp_path_factory.mktemp("qwen3"), QWEN3, QWEN3_SPECIALS)


def supervised(messages, t, fmt=format_openai):
    """(supervised runs decoded with special tokens, the whole document decoded, the tokens)."""
    (tokens, sup), = encode([fmt({"messages": messages}, "chat.jsonl:1", t)], t)[0]
    return supervised_spans(tokens, sup, t, specials=True), t.decode(tokens.tolist()), tokens


def test_llama3_supervises_the_trimmed_content_it_writes(llama3):
    convo = [U(" Q? "), A("The answer is 4.\n"), U("And 2+3?"), A("  5  ")]
    spans, doc, _ = supervised(convo, llama3)
    assert spans == ["The answer is 4.<|eot_id|>", "5<|eot_id|>"]  # EOS is <|eot_id|>: not appended twice
    assert doc == llama3.apply_chat_template(convo, tokenize=False)


@pytest.mark.parametrize("fmt", [format_openai, format_chatml])
def test_qwen3_multi_turn_rendered_once(qwen3, fmt):
    """Qwen3's template writes the empty <think> block only into the last turn, so its renders are not prefixes of
    each other; a user turn that quotes the answer comes before it and is not taken for it."""
    convo = [{"role": "system", "content": "Be brief."}, U("Say: Yes."), A("Yes."), U("b"), A("No."), U("c"),
             A("hi")]
    spans, doc, _ = supervised(convo, qwen3, fmt)
    assert spans == ["Yes.<|im_end|>", "No.<|im_end|>", "hi<|im_end|>"]
    full = qwen3.apply_chat_template(convo, tokenize=False)
    assert doc == qwen3.bos_token + full and full.count("<think>\n\n</think>\n\n") == 1


def test_qwen3_trailing_user_turn_changes_the_earlier_render(qwen3):
    """With a user turn after the last assistant turn no <think> block is written at all: the segments follow the
    whole render, not the render of the conversation cut after the assistant turn."""
    convo = [U("a"), A("Yes."), U("b")]
    spans, doc, _ = supervised(convo, qwen3)
    assert spans == ["Yes.<|im_end|>"] and doc == qwen3.bos_token + qwen3.apply_chat_template(convo, tokenize=False)


def test_qwen3_short_answer_is_supervised_where_it_is_not_in_think(qwen3):
    spans, doc, tokens = supervised([U("Greet me"), A("hi")], qwen3)
    assert spans == ["hi<|im_end|>"]
    think = qwen3.convert_tokens_to_ids("<think>")
    assert think in tokens.tolist() and doc.endswith("<think>\n\n</think>\n\nhi<|im_end|>\n")


def test_qwen3_content_that_is_also_a_role_header_is_located_by_position(qwen3):
    """The last answer is the word 'assistant', which the template also writes as the role header just before, then
    its <think> special token: a search of the text took the header for the answer (supervising
    'assistant\\n<think>' and learning nothing of the answer). The answer quoted in the user turn is not taken
    either."""
    convo = [U("q"), A("ok"), U("Reply with the word assistant"), A("assistant")]
    spans, doc, _ = supervised(convo, qwen3)
    assert spans == ["ok<|im_end|>", "assistant<|im_end|>"]
    assert doc == qwen3.bos_token + qwen3.apply_chat_template(convo, tokenize=False)


def test_qwen3_reasoning_in_the_content_is_supervised_as_the_template_writes_it(qwen3):
    """Reasoning traces in the assistant content (<think>...</think>, written in any spacing) are data, not a bad
    record: Qwen3's template keeps a turn's reasoning after the last user message (re-spaced) and the answer alone
    before it; each turn supervises what the template wrote. The <think> opener the template writes whatever the
    content is context, as the empty block of a turn without reasoning is."""
    convo = [U("2+2?"), A("<think>add</think>4"), U("3+3?"), A("<think>add again</think>6")]
    spans, doc, _ = supervised(convo, qwen3)
    assert spans == ["4<|im_end|>", "add again\n</think>\n\n6<|im_end|>"]
    full = qwen3.apply_chat_template(convo, tokenize=False)
    assert doc == qwen3.bos_token + full and "<think>add</think>" not in full and "\nadd\n" not in full
    spans, _, _ = supervised([U("q"), A("<think>\nplan\n</think>\n\nanswer")], qwen3, format_chatml)
    assert spans == ["plan\n</think>\n\nanswer<|im_end|>"]


def test_a_turn_the_template_drops_whole_is_a_bad_record(qwen3):
    """A reasoning-only turn before the last user message: Qwen3 writes nothing of it, so nothing can be learned
    from it; one bad-record line naming the message."""
    from primus_contract.records import DataError

    with pytest.raises(DataError, match=r"^f\.jsonl:2: messages\[1\]: the chat template writes nothing"):
        format_openai({"messages": [U("a"), A("<think>only thoughts</think>"), U("b"), A("c")]}, "f.jsonl:2", qwen3)


def test_chatml_markup_supervises_eos_when_im_end_is_not_a_token(tmp_path):
    t = byte_level_bpe(tmp_path)
    assert t.chat_template is None and len(t("<|im_end|>", add_special_tokens=False)["input_ids"]) > 1
    spans, doc, tokens = supervised([U("Say hi"), A("hi"), U("Again"), A("hello")], t)
    assert spans == ["hi<|im_end|><|endoftext|>", "hello<|im_end|><|endoftext|>"]
    assert (tokens == t.eos_token_id).sum() == 2
    assert doc == ("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nhi<|im_end|><|endoftext|>\n"
                   "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\nhello<|im_end|><|endoftext|>\n")
    quickstart = AutoTokenizer.from_pretrained(TOK_DIR)  # <|im_end|> is one token there: it ends the turn, no EOS
    quickstart.chat_template = None
    assert supervised([U("Say hi"), A("hi")], quickstart)[0] == ["hi<|im_end|>"]


def test_a_lone_surrogate_in_a_chat_record_is_a_bad_record_naming_its_field():
    """The chat formatters take their messages from primus_contract.records (the launcher's check too): a string
    that cannot be written as UTF-8 is one bad record naming the field, not a tokenizer's TypeError later."""
    from primus_contract.records import DataError

    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok \ud800"}]}
    for fmt in (format_openai, format_chatml):
        with pytest.raises(DataError, match=r"f\.jsonl:3.*messages\[1\]\.content"):
            fmt(record, "f.jsonl:3")


def test_a_template_that_raises_is_one_bad_record_line(tmp_path):
    """A chat template that raises (here Jinja's `raise_exception`, as templates that refuse a role order do) is the
    record's error: one line naming the record and the template's message, which `bad_records` handles."""
    from primus_contract.records import DataError

    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('system turns are not "
              "supported') }}{% endif %}{{ m['content'] }}{% endfor %}")
    tok = with_template(tmp_path, strict, {})
    record = {"messages": [{"role": "system", "content": "be brief"}, U("hi"), A("ok")]}
    with pytest.raises(DataError) as err:
        format_openai(record, "f.jsonl:7", tok)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("f.jsonl:7") and "chat template failed" in str(err.value)
    assert "system turns are not supported" in str(err.value)
    assert format_openai({"messages": [U("hi"), A("ok")]}, "f.jsonl:8", tok)  # the same template renders the rest
