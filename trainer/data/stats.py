"""Dataset statistics reported by build_datasets and `python -m trainer.data inspect`."""
from __future__ import annotations

from .dataset import PackedDataset


def summarize(ds: PackedDataset, **counts) -> dict:
    """samples, packs, tokens, supervised tokens/fraction, fill rate, doc length extremes + given counters."""
    doc_len = ds.doc_lengths()
    tokens = int(doc_len.sum())
    sup = ds.supervised_tokens()
    packs = len(ds)
    out = {
        "samples": int(ds.num_documents),
        "packs": packs,
        "sample_length": ds.sample_length,
        "tokens": tokens,
        "supervised_tokens": sup,
        "supervised_fraction": round(sup / tokens, 6) if tokens else 0.0,
        "fill_rate": round(tokens / (packs * ds.sample_length), 6) if packs else 0.0,
        "max_doc_tokens": int(doc_len.max()) if doc_len.size else 0,
        "mean_doc_tokens": round(float(doc_len.mean()), 2) if doc_len.size else 0.0,
    }
    out.update({k: int(v) if isinstance(v, (int, bool)) else v for k, v in counts.items()})
    return out
