"""The sweep leaderboard as text (`status SWEEP`, `compare SWEEP`): a table that fits 100 columns (the swept keys
by their last name, the columns a comparison needs), every column with --wide, the reasons of trials that did not
run or failed, and the winner with the command that exports it."""
from __future__ import annotations

from primus_slurm.experiments.chain_state import short_state

WIDTH = 100


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each swept key by its last name (`trainer.schedule.lr` -> `lr`), or its last two where two share one."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (short if last.count(short) == 1 else ".".join(k.split(".")[-2:])) for k, short in zip(keys, last)}


def _fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def _then_cell(row: dict, wide: bool) -> str:
    """A trial's chain: every step with its state (--wide, and chains of one or two steps); for a longer chain, so
    that the table keeps to 100 columns, how many steps are done, then the first step not done (`1/3 generate
    FAILED`, `3/3 ok`; the reason of a failed step is on its own line below the table)."""
    chain = row.get("then") or ()
    if wide or len(chain) <= 2:
        return _fmt(row.get("then_summary"))
    done = sum(1 for s in chain if s.get("state") == "COMPLETED")
    first = next((s for s in chain if s.get("state") != "COMPLETED"), None)
    return f"{done}/{len(chain)} " + (f"{first['step']} {short_state(first.get('state'))}" if first else "ok")


def _columns(data: dict, board: list[dict], wide: bool) -> list[tuple[str, object]]:
    """(heading, cell of a row) in order; narrow: what fits 100 columns, wide: all."""
    names = {k: k for k in data["keys"]} if wide else short_keys(data["keys"])
    priced = next((r["currency"] for r in board if r.get("cost") is not None), None)
    cols = [("TRIAL", lambda r: str(r["trial"]))]
    cols += [(names[k], lambda r, k=k: _fmt(r["values"].get(k))) for k in data["keys"]]
    if wide:
        cols += [("RUN", lambda r: _fmt(r["run_id"])), ("JOB", lambda r: _fmt(r.get("job_id")))]
    cols += [("STATE", lambda r: r["state"])]
    if wide:
        cols += [("EXIT", lambda r: _fmt(r.get("exit_code")))]
    cols += [("ITER", lambda r: f"{r['iteration']}/{r['train_iters']}" if r.get("iteration") is not None else "-")]
    if wide:
        cols += [("EVAL LAST", lambda r: _fmt(r.get("last_eval_loss"), ".4f"))]
    cols += [("EVAL BEST", lambda r: _fmt(r.get("best_eval_loss"), ".4f")),
             ("TOK/S/GPU", lambda r: _fmt(r.get("tokens_per_s_gpu"), ",.0f")),
             ("GPU-H", lambda r: _fmt(r.get("gpu_hours"), ".3f"))]
    if priced:
        cols += [(f"COST {priced}", lambda r: _fmt(r.get("cost"), ",.2f"))]
    if any(r.get("then_summary") for r in board):
        cols += [("THEN", lambda r: _then_cell(r, wide))]
    return cols


def table(data: dict, board: list[dict], best: dict | None = None, wide: bool = False) -> str:
    cols = _columns(data, board, wide)
    lines = [[head for head, _ in cols]] + [[cell(r) for _, cell in cols] for r in board]
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    text = [f"sweep {data['sweep_id']} ({data['executor']}, {len(board)} trials)"]
    text += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    for r in board:  # why a trial did not run, or failed; why a step after it failed
        if r.get("error") and r["state"] not in ("RUNNING", "PENDING", "COMPLETED"):
            text.append(f"trial {r['trial']}: {r['error']}")
        for step in r.get("then") or ():
            if step.get("reason") and step.get("state") not in ("COMPLETED", "RUNNING", "PENDING"):
                text.append(f"trial {r['trial']} {step['step']}: {step['state']}: {step['reason']}")
    if best:
        values = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in best["values"].items())
        at = f" at iteration {best['iteration']}" if best["iteration"] is not None else ""
        text.append(f"best: trial {best['trial']} ({values}), eval loss {best['eval_loss']:.4f}{at}, run "
                    f"{best['run_id']} ({best['state']})")
        text.append(f"  adapter: {best['adapter'] or 'none of that iteration'}")
        text.append(f"  export:  {best['export'] or 'none (no checkpoint of that iteration kept)'}")
        if best.get("note"):
            text.append(f"  note:    {best['note']}")
    return "\n".join(text) + "\n"
