"""A job for tests/test_reliability_secrets.py, run by torchrun as `-m primus_secretjob` (cluster.entrypoint).

It prints the sha256 of each secret it finds in its environment (never the value), so a test can prove that
the job saw HF_TOKEN / WANDB_API_KEY without any file of the run having to contain them.
"""
import argparse
import hashlib
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.parse_args()
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        value = os.environ.get(name)
        digest = hashlib.sha256(value.encode()).hexdigest() if value is not None else "unset"
        print(f"secret {name} sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
