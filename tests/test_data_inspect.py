"""`python -m trainer.data inspect`: stats + decoded pack with supervised spans marked; exit 2 on bad input."""
import json
import os
import subprocess
import sys

import yaml

from trainer.data.inspect import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QS = os.path.join(ROOT, "recipes", "data", "quickstart")


def run(*args):
    return subprocess.run([sys.executable, "-m", "trainer.data", *args], cwd=ROOT, capture_output=True, text=True)


def write_cfg(tmp_path, **data):
    d = {"format": "alpaca", "train": {"path": os.path.join(QS, "train.jsonl"), "limit": 50},
         "validation": {"path": os.path.join(QS, "validation.jsonl"), "limit": 20}, "seq_length": 128, **data}
    cfg = {"experiment": {"workspace": str(tmp_path), "seed": 1},
           "trainer": {"tokenizer": {"path": os.path.join(QS, "tokenizer")}, "data": d}}
    path = tmp_path / "recipe.resolved.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_inspect_prints_stats_and_marked_pack(tmp_path):
    r = run("inspect", "--config", write_cfg(tmp_path), "--split", "validation")
    assert r.returncode == 0, r.stderr
    stats_text, _, view = r.stdout.partition("=== validation pack 0 of ")
    stats = json.loads(stats_text)
    assert stats["train"]["samples"] == 50 and stats["validation"]["samples"] == 20
    for key in ("tokens", "supervised_fraction", "fill_rate", "truncated", "dropped_overlong"):
        assert key in stats["train"]
    records = [json.loads(line) for line in open(os.path.join(QS, "validation.jsonl"))][:20]
    header, _, body = view.partition("\n")
    assert header.endswith("(supervised spans in ⟦ ⟧) ===")
    marked = [seg.split("⟧")[0] for seg in body.split("⟦")[1:]]
    assert marked and all(m.endswith("</s>") for m in marked)
    assert {m[:-len("</s>")] for m in marked} <= {r["output"] for r in records}
    assert "### Instruction:" in body and "⟦###" not in body and body.startswith("--- document 0 (")


def test_inspect_bad_input_one_line_exit_2(tmp_path, capsys):
    def err(*args):
        rc = main(list(args))
        return rc, capsys.readouterr().err

    rc, msg = err("inspect", "--config", write_cfg(tmp_path, overlong="wrap"))
    assert rc == 2 and msg.splitlines() == ["error: `trainer.data.overlong` is 'wrap'; expected one of truncate, drop"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "x", "output": "y"}\n{"instruction": "x"}\n')
    rc, msg = err("inspect", "--config", write_cfg(tmp_path, train={"path": str(bad)}))
    assert rc == 2 and msg.strip() == f"error: {bad}:2: missing field 'output'"
    rc, msg = err("inspect", "--config", str(tmp_path / "absent.yaml"))
    assert rc == 2 and msg.startswith("error: --config: cannot read")
    rc, msg = err("inspect", "--config", write_cfg(tmp_path), "--pack", "999")
    assert rc == 2 and msg.startswith("error: --pack: 999 out of range")
