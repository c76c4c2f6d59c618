"""`python -m trainer.post export|generate|eval --run RUN_DIR --out RESULT_DIR [options]` (one process).

Writes RESULT_DIR/result.json; exit 0, 2 with one `error:` line for bad input (missing checkpoint, no
pretrained base for --merged, a bad prompt record), 1 with a traceback for anything else."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from primus_contract.records import json_lines
from trainer.observability import quiet
from trainer.data.errors import DataError
from trainer.post import evaluate, export, generate
from trainer.post.prompts import from_text
from trainer.post.runstate import PostError, run_config, say
from trainer.runtime.signals import exit_process


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m trainer.post")
    sub = ap.add_subparsers(dest="kind", required=True)
    for kind in ("export", "generate", "eval"):
        p = sub.add_parser(kind)
        p.add_argument("--run", required=True, help="run directory")
        p.add_argument("--out", required=True, help="result directory (result.json)")
        p.add_argument("--checkpoint", type=int, default=None, help="iteration (default: latest)")
    ex = sub.choices["export"]
    ex.add_argument("--adapter", default=None)
    ex.add_argument("--merged", default=None)
    gen = sub.choices["generate"]
    gen.add_argument("--prompt", default=None)
    gen.add_argument("--input", default=None, help="with --prompt: the alpaca input / squad context")
    gen.add_argument("--prompts", default=None, help="JSONL, records in the run's data format")
    gen.add_argument("--merged", default=None, help="generate from this merged export")
    gen.add_argument("--base-only", action="store_true", help="the run's base without the adapter")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--engine", choices=("auto", "transformers", "vllm"), default="auto")
    sub.choices["eval"].add_argument("--data", default=None, help="JSONL in the run's format (default: validation)")
    return ap


def read_records(args) -> list[tuple[str, dict]]:
    cfg_fmt = args.cfg.trainer.data.format
    if args.prompt is not None:
        return [("--prompt", from_text(cfg_fmt, args.prompt, args.input))]
    with open(args.prompts, "rb") as fh:  # (the launcher read it the same way: primus_contract.records.json_lines)
        lines = list(json_lines(fh))
    for n, _, problem in lines:
        if problem:
            raise DataError(f"{args.prompts}:{n}: {problem}")
    return [(f"{args.prompts}:{n}", record) for n, record, _ in lines]


def dispatch(args) -> dict:
    cfg = args.cfg
    if args.kind == "export":
        return export.run(cfg, args.run, args.out, args.checkpoint, args.adapter, args.merged)
    if args.kind == "eval":
        return evaluate.run(cfg, args.run, args.checkpoint, args.data)
    p = generate.Params(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    return generate.run(cfg, args.run, args.out, read_records(args), p, iteration=args.checkpoint,
                        merged=args.merged, base_only=args.base_only, engine=args.engine)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    quiet.install()
    args.run, args.out = os.path.abspath(args.run), os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    try:
        args.cfg = run_config(args.run, getattr(args, "data", None))
        result = dispatch(args)
    except (PostError, DataError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1
    result = {"kind": args.kind, "seconds": round(time.time() - t0, 2), **result}
    tmp = os.path.join(args.out, "result.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, os.path.join(args.out, "result.json"))
    if quiet.summary():
        say(quiet.summary())
    say(result["summary"])
    return 0


if __name__ == "__main__":
    exit_process(main())
