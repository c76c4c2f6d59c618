"""bench/spread.py and bench/interleaved.py: the interleaved order, the cells, min / median / max, the verdict rule
(a lever is kept only when its median beats the other's max), on fake rows; and one tiny real interleaved call on
CPU (slow). Logic only: no timing is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import spread  # noqa: E402


def test_interleave_runs_every_variant_once_per_repeat_in_turn():
    assert spread.interleave(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "a"), (1, "b"), (2, "a"), (2, "b")]
    with pytest.raises(ValueError):
        spread.interleave([], 3)


def _rows():
    rows = [{"anchor": "mcore_te", "fp8": None, "tokens_per_s": v} for v in (100, 102, 101)]
    rows += [{"bench": "lora_ceiling", "docs": "single", "fp8": None, "tokens_per_s": v} for v in (120, 121, 119)]
    rows.append({"bench": "lora_ceiling", "config": "packed:fp8_delayed", "error": "OutOfMemoryError: ..."})
    for rep, (d, s, e) in enumerate([(100, 103, 110), (101, 104, 111), (99, 102, 109)]):
        for name, v in (("default", d), ("swiglu", s), ("epilogue", e)):
            rows.append({"bench": "interleaved", "variant": name, "docs": "single", "precision": "bf16", "rep": rep,
                         "tokens_per_s": v, "peak_gib": 50.0, "lm_loss": 12.5})
    rows.append({"bench": "interleaved", "variant": "refused", "precision": "bf16", "error": "UserError: no"})
    rows += [{"bench": "trainer_throughput", "label": f"70b1-fused-r{k}", "docs": "packed", "rc": 0,
              "tokens_per_s_per_gpu": 2400 + k} for k in range(3)]
    rows.append({"bench": "trainer_throughput", "label": "70b1-fused-r3", "docs": "packed", "rc": 1})
    return rows


def test_summary_cells_ratios_and_failures():
    out = {(r["cell"], r["docs"], r["precision"]): r for r in spread.summarize(_rows()) if r["bench"] == "spread_cell"}
    d = out[("default", "single", "bf16")]
    assert (d["n"], d["min"], d["median"], d["max"]) == (3, 99, 100, 101)
    assert d["x_ceiling"] == round(100 / 120, 3) and d["x_anchor"] == round(100 / 101, 3)
    assert d["peak_gib_median"] == 50.0 and d["lm_loss_median"] == 12.5
    assert out[("ceiling", "packed", "fp8")] == {"bench": "spread_cell", "cell": "ceiling", "docs": "packed",
                                                 "precision": "fp8", "n": 0, "failed": 1}
    assert out[("refused", "", "bf16")]["failed"] == 1
    fused = out[("70b1-fused", "packed", "")]  # the repeat suffix is stripped; the failed run counts as a failure
    assert (fused["n"], fused["median"], fused["failed"]) == (3, 2401, 1)


def test_verdicts():
    verdicts = {r["a"]: r for r in spread.summarize(_rows()) if r["bench"] == "spread_verdict"}
    # swiglu's median 103 beats default's max 101: kept; epilogue likewise
    assert verdicts["swiglu"]["verdict"] == "swiglu kept" and verdicts["epilogue"]["verdict"] == "epilogue kept"
    assert verdicts["swiglu"]["median_gain"] == 0.03
    assert spread.verdict([1, 5, 9], [4, 5, 6], "a", "b") == "not separated"
    assert spread.verdict([1, 2, 3], [4, 5, 6], "a", "b") == "b kept"
    assert spread.verdict([7, 8], [4, 5, 6], "a", "b").startswith("too few repeats")


def test_the_fp8_attention_ceiling_is_a_reference_of_its_own():
    import spread

    rows = [{"bench": "lora_ceiling", "docs": "single", "fp8": f, "tokens_per_s": v}
            for f, v in (("delayed", 200), ("delayed_attn", 210)) for _ in range(3)]
    rows += [{"bench": "interleaved", "variant": "default", "docs": "single", "precision": "fp8", "rep": r,
              "tokens_per_s": 189} for r in range(3)]
    cells = {r["cell"]: r for r in spread.summarize(rows) if r["bench"] == "spread_cell"}
    assert cells["default"]["x_ceiling"] == 0.945 and cells["default"]["x_ceiling_attn"] == 0.9
    assert "x_ceiling" not in cells["ceiling-attn"] and "| 0.9 |" in spread.markdown(spread.summarize(rows))


def test_markdown_and_cut_lines(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in _rows()) + '\n{"bench": "interleaved", "vari\nnot json\n')
    rows = spread.read_rows([f])
    assert len(rows) == len(_rows())  # the cut line is no measurement
    text = spread.markdown(spread.summarize(rows))
    assert "| default | single | bf16 | 100 (99-101, 3) | 0.833 |  | 0.99 | 50.0 |" in text
    assert "| swiglu vs default | single | bf16 | +3.0 % | swiglu kept |" in text


def test_variant_parsing():
    import interleaved

    assert interleaved.parse_variant("default=") == ("default", [])
    assert interleaved.parse_variant("e=trainer.lora.epilogue=true,trainer.lora.dropout=0.1") == (
        "e", ["trainer.lora.epilogue=true", "trainer.lora.dropout=0.1"])
    with pytest.raises(ValueError):
        interleaved.parse_variant("=x=1")


def test_host_pauses_count_collections_and_descendant_processes():
    import gc

    from host_pauses import GcPauses, descendants

    with GcPauses() as pauses:
        gc.collect()
    gc.collect()  # outside the block: not counted
    assert pauses.count[2] == 1 and pauses.ms[2] > 0.0  # (the forced full collection, timed)
    assert pauses.row()["gc_collections"][2] == 1
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in descendants()
    finally:  # (this test's own child, by its handle)
        child.kill()
        child.wait()
    assert child.pid not in descendants()


@pytest.mark.slow  # 5-16 s on two cores (load): the real trainer step (tiny model), 2 variants + a refused one, 2 repeats
def test_interleaved_call_on_cpu(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench/interleaved.py"), "--recipe", str(ROOT / "recipes/quickstart.yaml"),
           "--set", "trainer.data.seq_length=128", "--set", "trainer.checkpoint.pretrained=null",
           "--variant", "default=", "--variant", "swiglu=trainer.lora.fused_swiglu=true",
           "--variant", "bad=trainer.lora.fused_swiglu=true,trainer.recompute.adapter_inputs=true",
           "--repeats", "2", "--warmup", "1", "--steps", "1", "--docs", "single,packed", "--workdir", str(tmp_path)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    env = rows.pop(0)  # the job's variables it ran under (the recipe's env profile: cpu)
    assert env["bench"] == "interleaved_env" and env["job_env"]["CUDA_VISIBLE_DEVICES"] == ""
    warm = rows.pop(0)  # the process's untimed first block: the first variant on the first docs kind
    assert (warm["bench"], warm["variant"], warm["docs"]) == ("interleaved_warmup", "default", "single")
    order = [(r["rep"], r["variant"], r.get("docs")) for r in rows]
    assert order == [(0, "default", "single"), (0, "default", "packed"), (0, "swiglu", "single"),
                     (0, "swiglu", "packed"), (0, "bad", None), (1, "default", "single"), (1, "default", "packed"),
                     (1, "swiglu", "single"), (1, "swiglu", "packed")]
    assert "exclude each other" in rows[4]["error"]  # the contract's refusal, once
    # the precision each kind's data gives (FP8 attention from one-document rows: GPU FP8 only), on every row
    assert {r["fp8_attention"] for r in rows if "lm_loss" in r} == {False}
    loss = {(r["rep"], r["variant"], r["docs"]): r["lm_loss"] for r in rows if "lm_loss" in r}
    # every block starts from the same weights and packs: on CPU the wired SwiGLU is the unfused ops, bit for bit
    assert len({v for k, v in loss.items() if k[2] == "single"} | {warm["lm_loss"]}) == 1  # the warm-up's too
    assert any("fused swiglu" in line for r in rows if r["variant"] == "swiglu" for line in r["transforms"])
    timed = [r for r in rows if "lm_loss" in r]  # the host's side of each timed window (bench/host_pauses.py)
    assert all(len(r["gc_collections"]) == 3 and len(r["gc_ms"]) == 3 and r["child_processes"] >= 0 for r in timed)
