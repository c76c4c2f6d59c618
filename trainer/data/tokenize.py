"""Segments -> token ids + per-token supervise flags, with HF tokenizers.

Rules (one place, so no double BOS and exactly one EOS):
- every segment is tokenized on its own with ``add_special_tokens=False`` (so a supervised span decodes to
  exactly its text); special-token strings inside the text (chat markup) map to their ids;
- BOS is prepended when the tokenizer adds one by default (probed once) and the document does not already start
  with it (chat templates often render it);
- EOS is appended, supervised, when the last segment is supervised and does not already end with EOS.
A token's flag ``sup[i] = 1`` means token i is a training target (predicted from tokens < i).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from primus_contract.rules_data import HUB_PREFIX, hub_id

from .errors import DataError
from .segments import Segment

IGNORE_INDEX = -100


@dataclass(frozen=True)
class TokenizerInfo:
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    add_bos: bool
    identity: str
    vocab_size: int


def load_tokenizer(path: str) -> Any:
    """A local tokenizer directory, or `hf://org/name` from the Hub (primus_contract.rules_data.HUB_PREFIX)."""
    from transformers import AutoTokenizer

    source = hub_id(path) if path.startswith(HUB_PREFIX) else path
    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as e:  # noqa: BLE001 - any load failure is a bad trainer.tokenizer.path
        reason = " ".join(str(e).split())[:400] or type(e).__name__  # the whole reason, on one line
        raise DataError(f"trainer.tokenizer.path: cannot load tokenizer {path!r}: {reason}") from None


def tokenizer_info(tok: Any) -> TokenizerInfo:
    bos, eos, pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    probe = tok("a", add_special_tokens=True)["input_ids"]
    add_bos = bos is not None and len(probe) > 0 and probe[0] == bos
    if pad is None:
        pad = eos if eos is not None else 0
    backend = getattr(tok, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    ident = hashlib.sha256("\0".join([
        type(tok).__name__, body, str(getattr(tok, "chat_template", None)), str(bos), str(eos), str(pad),
        str(add_bos)]).encode()).hexdigest()
    return TokenizerInfo(bos, eos, int(pad), add_bos, ident, len(tok))


def _encode_many(tok: Any, texts: list[str], chunk: int = 2048) -> list[list[int]]:
    out: list[list[int]] = []
    for i in range(0, len(texts), chunk):
        part = texts[i:i + chunk]
        out.extend(tok(part, add_special_tokens=False)["input_ids"] if part else [])
    return out


def tokenize_documents(docs: Sequence[list[Segment]], tok: Any, info: TokenizerInfo
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int32 [T], sup uint8 [T], offsets int64 [N+1]) for N documents, concatenated."""
    texts = [s.text for d in docs for s in d]
    ids = _encode_many(tok, texts)
    tokens: list[int] = []
    sup: list[int] = []
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    k = 0
    for n, doc in enumerate(docs):
        start = len(tokens)
        for seg in doc:
            seg_ids = ids[k]
            k += 1
            if info.add_bos and len(tokens) == start and (not seg_ids or seg_ids[0] != info.bos_id):
                tokens.append(info.bos_id)
                sup.append(0)
            tokens.extend(seg_ids)
            sup.extend([int(seg.supervise)] * len(seg_ids))
        if doc and doc[-1].supervise and info.eos_id is not None and (len(tokens) == start or
                                                                     tokens[-1] != info.eos_id):
            tokens.append(info.eos_id)
            sup.append(1)
        offsets[n + 1] = len(tokens)
    if tokens and max(tokens) >= 2**31:
        raise DataError("trainer.tokenizer.path: token ids do not fit in int32")
    return np.asarray(tokens, dtype=np.int32), np.asarray(sup, dtype=np.uint8), offsets
