"""Post-training jobs on a run directory: export (PEFT adapter / merged HF checkpoint), generate, eval.

    python -m trainer.post export|generate|eval --run RUN_DIR --out RESULT_DIR [options]

`primus-slurm export|generate|eval` renders templates/post.sh.j2 (the training job template with this command
instead of torchrun) and runs it locally or as a Slurm job. Each job prints progress lines and writes
RESULT_DIR/result.json ({"kind", "summary", ...}); bad input is one `error:` line and exit 2.
"""
