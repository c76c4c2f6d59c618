#!/usr/bin/env bash
# Does a lever keep the loss? recipes/compare_realtext.yaml (200 iterations, real English text) per precision
# (PRECISIONS, default "bf16 fp8"), three runs side by side on one GPU: a (A_SET), b (A_SET + the lever) and c (a with
# another seed: the run-to-run spread); bench/loss_match.py says whether b stays as close to a as c does (tail mean of
# the lm loss, last eval). Appends to $OUT/<name>.jsonl.
#   bash bench/realtext_ab.sh NAME "A_SET" "B_SET (bf16)" "B_SET (fp8)"   (each a space-separated list of key=value)
# e.g. bench/gpu_suite.sh swiglu-realtext and kernels-realtext.
set -uo pipefail
cd "$(dirname "$0")/.."
name=$1 a_set=$2 b_bf16=$3 b_fp8=$4 OUT=${OUT:-/tmp/bench-out} W=/tmp/realtext-ab
rm -rf "$W"; mkdir -p "$OUT"
sets() { for kv in $1; do printf -- '--set\n%s\n' "$kv"; done; }
for p in ${PRECISIONS:-bf16 fp8}; do
  pid=$([ "$p" = fp8 ] && echo 0f08 || echo 0b16)  # the precision in the run ids: one registry holds all six
  b=$([ "$p" = fp8 ] && echo "$b_fp8" || echo "$b_bf16")
  prec=""; [ "$p" = fp8 ] && prec="trainer.precision.fp8=hybrid"
  for v in "a:1234:" "b:1234:$b" "c:4321:"; do
    IFS=: read -r k seed extra <<<"$v"
    mapfile -t args < <(sets "$a_set $prec $extra")
    timeout 240 python3 -m primus_slurm submit recipes/compare_realtext.yaml --executor local --follow \
      --run-id "20261205-000000-${pid}0$k" --set experiment.workspace="$W/$p" \
      --set trainer.precision.bf16=true --set trainer.distributed.device=cuda --set trainer.distributed.backend=nccl \
      --set cluster.env_profile=h200 --set experiment.seed="$seed" "${args[@]}" > "$OUT/$name-$p-$k.log" 2>&1 &
  done
  wait
  d="$W/$p/compare_realtext/20261205-000000-${pid}0"
  python3 bench/loss_match.py --a "${d}a" --b "${d}b" --spread "${d}c" --label "$name-$p"
done | tee -a "$OUT/$name.jsonl"
