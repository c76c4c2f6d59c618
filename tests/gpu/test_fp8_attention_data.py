"""precision.fp8_dot_product_attention null on packed data whose every row holds one document
(trainer.precision.follow_data): the run trains with TE's FP8 attention on every micro-batch, as packing false would,
says so in its log, records it in its checkpoint's metadata, and the `eval` step after it builds the same model from
that record, so its loss equals the logged eval loss. A minute on a GPU."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import lifecycle_support as ls

if ls.device() != "cuda":
    pytest.skip("needs a CUDA device with Transformer Engine", allow_module_level=True)
pytestmark = pytest.mark.gpu

QUICKSTART = ls.ROOT / "recipes" / "quickstart.yaml"
ITERS = 20


def test_fp8_attention_null_runs_on_packed_rows_of_one_document_and_eval_follows(tmp_path, record):
    from trainer.data.mlperf import write_single_documents

    data = tmp_path / "one-document-rows"
    write_single_documents(str(data), 64, 256, 512, seed=3)  # 8 validation packs: one global batch of 8
    env = ls.env_for(tmp_path)
    entry = ls.submit(env, f"cluster.python={sys.executable}", "cluster.env_profile=h200",
                      "trainer.distributed.device=cuda", "trainer.distributed.backend=nccl",
                      # head dim 128 (TE's FP8 attention), a random base of that shape, FP8 delayed scaling
                      "trainer.model.num_attention_heads=1", "trainer.model.num_query_groups=1",
                      "trainer.checkpoint.pretrained=null", "trainer.precision.bf16=true",
                      "trainer.precision.fp8=hybrid", "trainer.data.format=mlperf_npy",
                      f"trainer.data.train.path={data}", f"trainer.data.validation.path={data}",
                      f"trainer.schedule.train_iters={ITERS}", f"trainer.schedule.eval_interval={ITERS}",
                      "trainer.schedule.eval_iters=1", f"trainer.checkpoint.save_interval={ITERS}",
                      recipe=QUICKSTART, then=("eval",))
    row = ls.wait_pipeline(env, entry["run_id"])
    run_dir = Path(row["run_dir"])
    assert row["state"] == "COMPLETED" and [s["state"] for s in row["pipeline"]] == ["COMPLETED"], row
    log = (run_dir / "logs" / "rank-0" / "debug.log").read_text()
    meta = json.loads((run_dir / "checkpoints" / f"iter_{ITERS:07d}" / "metadata.json").read_text())
    step = Path(row["pipeline"][0]["dir"])
    evaluated = json.loads((step / "result.json").read_text())
    logged = ls.logged_eval(run_dir, ITERS)
    rel = abs(evaluated["eval_loss"] - logged) / logged
    post_line = next((ln for ln in (step / "job.out").read_text().splitlines() if "precision |" in ln), "")
    record(eval_loss=evaluated["eval_loss"], logged=logged, rel=rel, post_precision=post_line,
           fp8_attention_meta=meta.get("fp8_attention"))
    assert "note | fp8 attention | on: every row of the train split holds one document" in log
    assert "| attention fp8 (one-document micro-batches)" in log
    assert meta.get("fp8_attention") is True, meta
    assert "| attention fp8 (one-document micro-batches)" in post_line, post_line
    assert rel <= 1e-3, (evaluated["eval_loss"], logged)  # test_lifecycle's EVAL_RTOL for FP8
