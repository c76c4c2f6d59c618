#!/usr/bin/env bash
# The GPU benchmarks, in groups, each line of output one JSON object (appended to $OUT/<group>.jsonl).
#   bash bench/gpu_suite.sh 8b        Llama-3-8B shape, one GPU: ours (bf16/fp8/fp4-emulated, packed and
#                                     single-document) vs HF transformers + PEFT (single-document), GEMM peak
#   bash bench/gpu_suite.sh fp4       FP4 numerics: bit-exactness vs TE's NVFP4 reference, kernel timings
#   bash bench/gpu_suite.sh speed     the anchor, the adapter-free ceiling (bench/lora_ceiling.py), ours BF16/FP8, one call
#   bash bench/gpu_suite.sh fused     issue 31: anchor, ceiling single + packed, ours unfused vs trainer.lora.fused
#   bash bench/gpu_suite.sh fused-packed   ours packed unfused vs fused, FP8 fused + norm folded, fused FP8 profile
#   bash bench/gpu_suite.sh swiglu    trainer.lora.fused_swiglu vs the default, single + packed, BF16/FP8, anchor + ceiling,
#                                     3 interleaved repeats (bench/interleaved.py), spread + verdicts (bench/spread.py)
#   bash bench/gpu_suite.sh epilogue  the ladder: both off, fused_swiglu alone, the defaults today (bench/README.md)
#   bash bench/gpu_suite.sh kernels   the defaults against each lever of 2026-12-06 switched off, candidates on
#   bash bench/gpu_suite.sh epilogue-70b   the 70B recipe, adapters unfused vs the fused path with dropout, 3 x A B
#   bash bench/gpu_suite.sh swiglu-realtext   fused_swiglu vs the default on the real-text set, 200 iterations, against a
#                                     reseeded default (bench/loss_match.py): the condition for turning it on by default
#   bash bench/gpu_suite.sh kernels-realtext   the same for the kernels levers on by default since 2026-12-06
#   bash bench/gpu_suite.sh fp8attn-realtext   FP8 attention's loss: one document a row, on a head-dim-128 base made
#                                     first (~40 s; TE's FP8 attention runs head dim 128 only), FP8
#   bash bench/gpu_suite.sh swiglu8-realtext   fp8_swiglu_input's loss (the 70B's next lever): adapters on qkv/proj
#                                     only, so megatron's SwiGLU keeps its input in FP8; FP8 (not yet run)
#   bash bench/gpu_suite.sh swiglu8-speed   the store's kernels vs megatron's store, one 70B fc1 output, fwd/bwd ms
#   bash bench/gpu_suite.sh swiglu8k-70b   the store's kernels vs megatron's store on the 80-layer 70B (block 11), 3 x A B
#                                     (V70="kernels delayed": the kernels, tensorwise vs delayed scaling)
#   bash bench/gpu_suite.sh swiglu8k-realtext  the same with the store's own kernels (precision.fp8_swiglu_kernels)
#   bash bench/gpu_suite.sh swiglu-profile   FP8 single-document default vs fused_swiglu under torch.profiler
#   bash bench/gpu_suite.sh adapter-gemms   each LoRA adapter product at the 8B widths against its memory bound (~20 s)
#   bash bench/gpu_suite.sh levers    8B single-document: packed THD layout vs one document a row (sbhd) vs sbhd + TE's
#                                     FP8 attention, FP8 delayed (and BF16), 3 interleaved repeats, ceiling x3, spread
#   bash bench/gpu_suite.sh offload-70b   the 70B recipe (block 60) vs no recompute + activation offload, 3 x A B
#   bash bench/gpu_suite.sh 8bmem     the same shape's memory switches: chunked loss, adapter_inputs scopes, FP8 params
#   bash bench/gpu_suite.sh 70b       Llama2-70B shape, TP=2 on two GPUs, FP8 and BF16
#   bash bench/gpu_suite.sh 70b1      Llama2-70B on ONE GPU (TP=1, FP8 weights, transposes per linear): the recompute
#                                     frontier (RUNS="full block60 block40 none selective ..."; -ai adds adapter_inputs)
#   bash bench/gpu_suite.sh store-70b the 70B cut to 20 layers, no recompute: the activation stores (dropout_recompute
#                                     off / on, recompute.norm_output), interleaved x3
#   bash bench/gpu_suite.sh costs-70b the same cut: what the dropout (0.1 against 0) and fp8_swiglu_input (megatron's
#                                     casts; with the store's kernels) cost a step, interleaved x3: the planner's
#                                     dropout and SwiGLU-store prices against the GPU
#   bash bench/gpu_suite.sh 70b1-loss the 20-layer cut at TP=1 on the real-text set, with and without the release
#   bash bench/gpu_suite.sh 70bfast   fp8_param tensorwise vs delayed, with and without full recompute (RUNS=...)
#   bash bench/gpu_suite.sh 70bub     70bfast's configuration with and without TP communication overlap
#   bash bench/gpu_suite.sh 70bprofile   the fastest 70B configuration profiled: operator table + device timeline
#   bash bench/gpu_suite.sh moe-realtext   MoE/MLA proxies on the real-text set: loss falls? tokens/s (HF=1: from HF checkpoints)
#   bash bench/gpu_suite.sh hf-import   HF import on the TE spec vs transformers, fp32 and BF16, every family
#   bash bench/gpu_suite.sh profile   torch.profiler summaries of two steps + saved-tensor census: 8B BF16 keep /
#                                     adapter_inputs_scope fc2|norm|all, 8B FP8 keep / adapter_inputs, 70B
#   bash bench/gpu_suite.sh moe       MoE proxies (Qwen3-30B-A3B, DeepSeek-V2-Lite reduced depth)
#   bash bench/gpu_suite.sh moe-fp8   two MoE proxies, BF16 vs FP8 tensorwise / fp8_param / delayed fp8_param
#   bash bench/gpu_suite.sh compare   BF16 / FP8 / FP4-emulated loss curves on the quickstart data, + plot
#   bash bench/gpu_suite.sh compare-realtext   the same on recipes/compare_realtext.yaml (real English text)
#   bash bench/gpu_suite.sh fp8param-hf   fp8_param loaded from an HF checkpoint vs BF16 / FP8 on that recipe
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TP="python3 bench/trainer_throughput.py --workdir /tmp/bench-work"
R8=bench/recipes/llama3_8b_h200.yaml
R70=bench/recipes/llama2_70b_tp2.yaml

peak() {  # measured bf16 GEMM peak of this GPU, the MFU denominator
  python3 - <<'PY'
import json, torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter(); n = 20
for _ in range(n): a @ b
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / n
print(json.dumps({"bench": "bf16_gemm_peak", "shape": [8192, 8192, 8192], "tflops": round(2 * 8192**3 / dt / 1e12, 1),
                  "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
PY
}

interleaved_call() {  # $1: the group; then bench/interleaved.py --variant arguments. One call, about 9 minutes:
  # bench/kernel_check.py (the adapters' Triton kernels on this GPU vs the torch ops); the anchor and the adapter-free
  # ceiling (single + packed), each 3 times, interleaved inside their processes; then per precision (PRECISIONS,
  # default "bf16 fp8") one bench/interleaved.py process running the variants A B C A B C (REPEATS, default 3) on
  # single-document and packed batches; bench/spread.py prints min / median / max per cell and the verdicts. Every
  # process has its share of the call's time (BUDGET_S, default 560 s: anchor 1/4, ceiling 7/20, ours the rest, 3:2
  # between BF16 and FP8 (SHARES)): no block starts that would end past it, so one device call (600 s) returns.
  # ANCHOR=0 skips the anchor (a short call that compares variants and the ceiling only; its time goes to ours).
  # PROCESS_WARMUP=0 drops ours' untimed first block (bench/interleaved.py --process-warmup, on since 2026-12-07c).
  local name=$1; shift
  local end=$(( $(date +%s) + ${BUDGET_S:-560} )) r=${REPEATS:-3} precs=(${PRECISIONS:-bf16 fp8})
  local anchor=() ceiling=()
  for _ in $(seq "$r"); do  # the ceiling's cells for the precisions timed (PRECISIONS=fp8: FP8 only)
    anchor+=(bf16 fp8_delayed)
    for p in "${precs[@]}"; do q=$p; [ "$p" = fp8 ] && q=fp8_delayed; ceiling+=("$q" "packed:$q"); done
    [[ " ${precs[*]} " == *" fp8 "* ]] && ceiling+=(fp8_delayed_attn)  # FP8 one-document: ours runs FP8 attention
  done
  { timeout 90 python3 bench/kernel_check.py  # the Triton kernels on this GPU against the torch ops, first (~20 s)
    budget=$(( end - $(date +%s) ))
    [ "${ANCHOR:-1}" = 0 ] || timeout $(( budget / 4 )) python3 .gpu/bin/anchor_mcore_te.py "${anchor[@]}"
    timeout $(( budget * 7 / 20 )) python3 bench/lora_ceiling.py "${ceiling[@]}"
    weights=(${SHARES:-3 2}); i=0  # BF16 gets 3 parts of the time, FP8 2
    for p in "${precs[@]}"; do
      set_p=(); [ "$p" = fp8 ] && set_p=(--set trainer.precision.fp8=hybrid)
      wsum=0; for w in "${weights[@]:i:${#precs[@]}-i}"; do wsum=$((wsum + w)); done
      share=$(( (end - $(date +%s)) * ${weights[i]:-1} / (wsum > 0 ? wsum : 1) )); i=$((i + 1))
      timeout $((share + 60)) python3 bench/interleaved.py --recipe $R8 --label "8b-$p" "${set_p[@]}" "$@" \
        --repeats "$r" --warmup 2 --steps "${STEPS:-4}" --process-warmup "${PROCESS_WARMUP:-1}" \
        --deadline $(( $(date +%s) + share )) --workdir /tmp/bench-work
    done
  } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/$name.jsonl"
  python3 bench/spread.py "$OUT/$name.jsonl" | tee "$OUT/$name-spread.jsonl"
  python3 bench/spread.py --markdown "$OUT/$name.jsonl" > "$OUT/$name-spread.md"
}

case "${1:-}" in
  8b)
    { peak
      $TP --recipe $R8 --docs packed --label 8b-bf16-packed
      $TP --recipe $R8 --docs single --label 8b-bf16-single
      $TP --recipe $R8 --docs packed --label 8b-fp8-packed --set trainer.precision.fp8=hybrid
      $TP --recipe $R8 --docs single --label 8b-fp8-single --set trainer.precision.fp8=hybrid
      $TP --recipe $R8 --docs single --label 8b-fp4emu-single --set trainer.precision.fp4=e2m1 \
          --set trainer.precision.fp4_emulation=true --set trainer.schedule.train_iters=12
      python3 bench/hf_peft_baseline.py --preset llama3_8b --seq 8192 --iters 10 --warmup 3
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/8b.jsonl" ;;
  speed)  # issue 25, one call: the bare anchor (../shared/bench, staged into .gpu/bin), the adapter-free ceiling
          # (bench/lora_ceiling.py: the most any adapter-side lever can give), ours single-document BF16 and FP8
    { python3 .gpu/bin/anchor_mcore_te.py bf16 fp8_delayed
      python3 bench/lora_ceiling.py bf16 fp8_delayed
      $TP --recipe $R8 --docs single --label 8b-bf16-single
      $TP --recipe $R8 --docs single --label 8b-fp8-single --set trainer.precision.fp8=hybrid
      [ -n "${SPEED_MORE:-}" ] || exit 0
      # SPEED_MORE=1: where ours trails the anchor in FP8 (80.1 vs 72.1 ms of adapters on 2026-12-03): the same run
      # with the RMSNorm folded into A (no BF16 norm output next to TE's FP8 one), a profile, and the packed rows
      $TP --recipe $R8 --docs single --label 8b-fp8-single-norm-folded --set trainer.precision.fp8=hybrid \
          --set trainer.recompute.adapter_inputs=true --set trainer.recompute.adapter_inputs_scope=norm
      $TP --recipe $R8 --docs single --label 8b-fp8-single-profile --profile 8-9 --set trainer.precision.fp8=hybrid
      $TP --recipe $R8 --docs packed --label 8b-bf16-packed
      $TP --recipe $R8 --docs packed --label 8b-fp8-packed --set trainer.precision.fp8=hybrid
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/speed.jsonl" ;;
  fused)  # issue 31, one call: the anchor, the adapter-free ceiling single-document AND packed, ours single-document
          # BF16/FP8 with the unfused adapters and with trainer.lora.fused (trainer/model/lora/fused.py)
    { python3 .gpu/bin/anchor_mcore_te.py bf16 fp8_delayed
      python3 bench/lora_ceiling.py bf16 fp8_delayed
      python3 bench/lora_ceiling.py --packed bf16 fp8_delayed
      for f in false true; do
        $TP --recipe $R8 --docs single --label "8b-bf16-single-fused-$f" --set trainer.lora.fused=$f
        $TP --recipe $R8 --docs single --label "8b-fp8-single-fused-$f" --set trainer.precision.fp8=hybrid \
            --set trainer.lora.fused=$f
      done
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/fused.jsonl" ;;
  fused-packed)  # the second call: ours packed with and without the fused adapters, FP8 with the norm folded into A,
                 # and a profile of the fused FP8 step
    { for f in false true; do
        $TP --recipe $R8 --docs packed --label "8b-bf16-packed-fused-$f" --set trainer.lora.fused=$f
        $TP --recipe $R8 --docs packed --label "8b-fp8-packed-fused-$f" --set trainer.precision.fp8=hybrid \
            --set trainer.lora.fused=$f
      done
      $TP --recipe $R8 --docs single --label 8b-fp8-single-fused-norm-folded --set trainer.precision.fp8=hybrid \
          --set trainer.lora.fused=true --set trainer.recompute.adapter_inputs=true \
          --set trainer.recompute.adapter_inputs_scope=norm
      $TP --recipe $R8 --docs single --label 8b-fp8-single-fused-profile --profile 8-9 \
          --set trainer.precision.fp8=hybrid --set trainer.lora.fused=true
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/fused-packed.jsonl" ;;
  swiglu)  # issue 37 item 1: trainer.lora.fused_swiglu against it off, interleaved (see interleaved_call); `default`
           # is fused_swiglu off, what the default was when these cells were first measured (on by default since
           # 2026-12-05), so the labels and verdicts read as in bench/results/2026-12-05_h200_speed
    interleaved_call swiglu --variant default=trainer.lora.fused_swiglu=false,trainer.lora.epilogue=false \
      --variant swiglu=trainer.lora.epilogue=false ;;
  epilogue)  # issue 37: the levers' ladder, interleaved (see interleaved_call): `default` (fused_swiglu and the
             # epilogue off: the default when these cells were first measured), `swiglu` (fused_swiglu alone: the
             # default from 2026-12-05 until the epilogue's auto), `ours` (the recipe's defaults today: in BF16 on an
             # NVIDIA GPU fused_swiglu + the epilogue; in FP8 the epilogue stays off, so ours = swiglu there)
    interleaved_call epilogue --variant default=trainer.lora.fused_swiglu=false,trainer.lora.epilogue=false \
      --variant swiglu=trainer.lora.epilogue=false --variant ours= ${EXTRA_VARIANTS:-} ;;
  kernels)  # issue 37: the levers timed on 2026-12-06 (H100) and on by default since, each switched OFF against the
            # defaults (`default`), and all three off together, interleaved (see interleaved_call): the chunked loss's
            # Triton passes (ce-off: chunked_loss_kernel), the unmasked adapter products in Triton (products-off:
            # lora.triton_products), the epilogue's auto (epilogue-off; BF16 only: in FP8 it equals default), the
            # norm-fed linears in it (norm-off: lora.epilogue_norm, null by default since the twelfth session; in
            # FP8 it equals default); and the candidate still opt-in switched ON: ainorm-on (the RMSNorm-fed
            # adapters norm x themselves, recompute.adapter_inputs scope norm: in FP8 TE then fuses its norm with
            # the quantize; lost 2.4-3.0 % in FP8 on 2026-12-06, saves 6 GiB); epi-on (FP8: lora.epilogue true, the base
            # GEMMs in FP8 through TE's functional linear, trainer/model/lora/base_gemm.py; in BF16 it equals default);
            # buckets-on (data.max_seqlen_buckets: THD's max_seqlen a power of two, so cuDNN builds a few graphs;
            # -0.2 to +0.0 % on an H100, 2026-12-06g: off; the ceiling follows PRIMUS_CEILING_BUCKETS=1).
            # `default` kept against an -off variant: that lever still
            # pays; an -on variant kept against `default`: it goes on by default (its median above default's max).
            # VARIANTS="default all-off norm-off" keeps only those (a short call)
    picked=()
    for v in default= ce-off=trainer.recompute.chunked_loss_kernel=false \
        products-off=trainer.lora.triton_products=false epilogue-off=trainer.lora.epilogue=false \
        norm-off=trainer.lora.epilogue_norm=false \
        ainorm-on=trainer.recompute.adapter_inputs=true,trainer.recompute.adapter_inputs_scope=norm \
        epi-on=trainer.lora.epilogue=true buckets-on=trainer.data.max_seqlen_buckets=true \
        all-off=trainer.recompute.chunked_loss_kernel=false,trainer.lora.triton_products=false,trainer.lora.epilogue=false; do
      [ -z "${VARIANTS:-}" ] || [[ " $VARIANTS " == *" ${v%%=*} "* ]] && picked+=(--variant "$v")
    done
    interleaved_call kernels "${picked[@]}" ${EXTRA_VARIANTS:-} ;;
  swiglu-realtext)  # issue 37 item 2, the condition for fused_swiglu on by default (bench/realtext_ab.sh): the
                    # unfused SwiGLU (a, c: another seed) against fused_swiglu (b), per precision
    bash bench/realtext_ab.sh swiglu-realtext trainer.lora.fused_swiglu=false trainer.lora.fused_swiglu=true \
      trainer.lora.fused_swiglu=true ;;
  kernels-realtext)  # the kernels levers kept on 2026-12-06 (H100) against them off: BF16 the chunked loss's Triton
                     # passes + the Triton products + the epilogue; FP8 the chunked loss's passes
    bash bench/realtext_ab.sh kernels-realtext \
      "trainer.recompute.chunked_loss_kernel=false trainer.lora.triton_products=false trainer.lora.epilogue=false" \
      "trainer.recompute.chunked_loss_kernel=true trainer.lora.triton_products=true trainer.lora.epilogue=null" \
      trainer.recompute.chunked_loss_kernel=true ;;
  swiglu8-realtext)  # the 70B's next lever, precision.fp8_swiglu_input (megatron-core keeps the SwiGLU input in FP8
                     # e4m3 without a scale): does the loss stay within the spread? Adapters on qkv/proj only, as in
                     # the 70B recipe, so the MLP runs megatron's SwiGLU and its store; FP8 only
    PRECISIONS=fp8 bash bench/realtext_ab.sh swiglu8-realtext "trainer.lora.target_modules=[linear_qkv,linear_proj]" "" \
      "trainer.precision.fp8_swiglu_input=true trainer.precision.fp8_swiglu_kernels=false" ;;
  swiglu8-speed)  # the store's kernels against megatron's store on one 70B fc1 output, interleaved (~30 s)
    python3 bench/swiglu_fp8_speed.py | tee -a "$OUT/swiglu8-speed.jsonl" ;;
  swiglu8k-realtext)  # the same with the store's own kernels (precision.fp8_swiglu_kernels, seventeenth session: the
                      # same FP8 bytes as megatron's cast, the activation and its gradient in fp32 registers)
    PRECISIONS=fp8 bash bench/realtext_ab.sh swiglu8k-realtext "trainer.lora.target_modules=[linear_qkv,linear_proj]" \
      "" "trainer.precision.fp8_swiglu_input=true trainer.precision.fp8_swiglu_kernels=true" ;;
  fp8attn-realtext)  # the condition for FP8 attention on by default in FP8 one-document runs: the real-text set with
                     # packing false, on a base of the same widths with one head (head dim 128, made first by
                     # scripts/make_realtext_base.py: the committed base's 4 heads of 32 have no FP8 attention backend,
                     # 2026-12-06), a and c without FP8 attention, b with it; FP8 only
    HD=/tmp/realtext-hd128/base
    [ -f "$HD/config.json" ] || python3 scripts/make_realtext_base.py --heads 1 --out "$HD" --threads 8 \
      | tee -a "$OUT/fp8attn-realtext-base.jsonl"
    PRECISIONS=fp8 bash bench/realtext_ab.sh fp8attn-realtext "trainer.data.packing=false \
trainer.precision.fp8_dot_product_attention=false trainer.model.num_attention_heads=1 trainer.model.num_query_groups=1 trainer.checkpoint.pretrained=$HD" "" \
      trainer.precision.fp8_dot_product_attention=true ;;
  adapter-gemms)  # issue 37: which of the adapters' skinny GEMMs is furthest from its bytes' bound (~20 s)
    python3 bench/adapter_gemms.py 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/adapter-gemms.jsonl" ;;
  swiglu-profile)  # issue 37: why fused_swiglu gave nothing in FP8 single-document (2026-12-04, one run a cell): the
                   # FP8 default and fused_swiglu profiled over iterations 8-9 (profile-<label>.txt), ~2 min
    { for f in false true; do
        $TP --recipe $R8 --docs single --label "8b-fp8-single-swiglu-$f-profile" --profile 8-9 \
            --set trainer.precision.fp8=hybrid --set trainer.lora.fused_swiglu=$f
      done
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/swiglu-profile.jsonl"
    (cd "$OUT" && tar czf swiglu-profile-files.tar.gz profile-*.txt saved-tensors-*.txt && rm -f profile-*.txt saved-tensors-*.txt) ;;
  swiglu8k-70b)  # seventeenth session: the FP8 SwiGLU store's kernels (precision.fp8_swiglu_kernels) on the 80-layer 70B
                 # at its fastest measured setting (block 11, recompute.norm_output, precision.fp8_swiglu_input:
                 # 2,785 tokens/s, 2026-12-06i) against megatron's store: A B A B A B, one process a run (~55 s each)
    S11=(--set trainer.recompute.method=block --set "trainer.recompute.num_layers=${BLOCK70:-11}"
         --set trainer.recompute.norm_output=true --set trainer.precision.fp8_swiglu_input=true)
    # V70 picks the variants, the first the baseline: megatron (fp8_swiglu_kernels off), kernels (on: the default),
    # delayed (the kernels under FP8 delayed scaling, not the recipe's tensorwise: no amax pass before each cast; the
    # planner gives it +5.9 % at block 11, and the TP=2 70B ran delayed 4 % over tensorwise on 2026-11-30)
    end=$(( $(date +%s) + ${BUDGET_S:-560} ))  # a run starts only with 90 s left, and ends by the budget
    read -ra vs <<< "${V70:-megatron kernels}"
    for rep in 0 1 2; do
      for v in "${vs[@]}"; do
        case $v in
          megatron) vset=(--set trainer.precision.fp8_swiglu_kernels=false) ;;
          kernels) vset=(--set trainer.precision.fp8_swiglu_kernels=true) ;;
          delayed) vset=(--set trainer.precision.fp8_swiglu_kernels=true --set trainer.precision.fp8_recipe=delayed) ;;
          *) echo "{\"bench\": \"error\", \"label\": \"70b1-s8-$v\", \"error\": \"unknown V70 variant\"}"; continue ;;
        esac
        left=$(( end - $(date +%s) ))
        if [ "$left" -lt 90 ]; then echo "{\"bench\": \"skipped\", \"label\": \"70b1-s8-$v-r$rep\"}"; continue; fi
        $TP --recipe bench/recipes/llama2_70b_1xh200.yaml --nproc 1 --docs packed --label "70b1-s8-$v-r$rep" \
            --timeout $(( left < 150 ? left : 150 )) "${S11[@]}" "${vset[@]}"
      done
    done 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/swiglu8k-70b.jsonl"
    python3 bench/spread.py --baseline "70b1-s8-${vs[0]}" "$OUT/swiglu8k-70b.jsonl" | tee "$OUT/swiglu8k-70b-spread.jsonl" ;;
  epilogue-70b)  # the 70B recipe (block 60, as recipes/llama2_70b_1xh200.yaml; dropout 0.1 on qkv/proj) with the
                 # adapters unfused (what ran before: dropout kept proj off the fused path) against the default, whose
                 # fused path now takes pre-dropout (fused into A); A B A B A B, one process a run (~75 s each); then,
                 # with time left, one run without dropout: the planner's dropout cost (primus_contract/plan) is fitted
                 # on 70B rows that all had dropout 0.1, so it also holds whatever else the 70B costs (3.5 s of the
                 # 27.6 s step planned; the passes it counts would take ~0.3 s at the H200's bandwidth)
    B60=(--set trainer.recompute.method=block --set trainer.recompute.num_layers=60)
    end=$(( $(date +%s) + ${BUDGET_S:-560} ))  # a run starts only with 90 s left, and ends by the budget
    for rep in 0 1 2 3; do
      for v in unfused fused; do
        [ $rep = 3 ] && { [ $v = fused ] && continue; v=nodrop; }
        left=$(( end - $(date +%s) ))
        if [ "$left" -lt 90 ]; then echo "{\"bench\": \"skipped\", \"label\": \"70b1-$v-r$rep\"}"; continue; fi
        set_v=(); [ $v = unfused ] && set_v=(--set trainer.lora.fused=false)
        [ $v = nodrop ] && set_v=(--set trainer.lora.dropout=0.0)
        $TP --recipe bench/recipes/llama2_70b_1xh200.yaml --nproc 1 --docs packed --label "70b1-$v-r$rep" \
            --timeout $(( left < 150 ? left : 150 )) "${B60[@]}" "${set_v[@]}"
      done
    done 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/epilogue-70b.jsonl"
    python3 bench/spread.py --baseline 70b1-unfused "$OUT/epilogue-70b.jsonl" | tee "$OUT/epilogue-70b-spread.jsonl" ;;
  levers)  # issue 37 item 4 (built 2026-12-05, not yet measured): ours single-document in the packed THD layout (what
           # ran so far; the ceiling and the anchor run plain causal attention without PackedSeqParams) against one
           # document a row in sbhd (trainer.data.packing=false) and sbhd + TE's FP8 attention
           # (precision.fp8_dot_product_attention), FP8 delayed then BF16 (where the contract refuses FP8 attention: one
           # error row), REPEATS (3) interleaved repeats each (bench/interleaved.py), the ceiling single-document x3
           # per precision first. Estimated from the 2026-12-03/04 calls: ceiling ~75 s, FP8 9 blocks + BF16 6 blocks
           # of ~25-30 s (the 8B build inside one process is unmeasured); every process has its share of BUDGET_S
           # (default 540 s, 3:2 FP8:BF16) and starts no block past it, so the call returns within 600 s
    end=$(( $(date +%s) + ${BUDGET_S:-540} )) precs=(${PRECISIONS:-fp8 bf16}) weights=(3 2) i=0
    # (FP8 attention is null, on by default in FP8 one-document rows since the twelfth session: sbhd switches it off)
    LV=(--variant thd= --variant sbhd=trainer.data.packing=false,trainer.precision.fp8_dot_product_attention=false
        --variant sbhd-fp8attn=trainer.data.packing=false,trainer.precision.fp8_dot_product_attention=true
        --variant auto-fp8attn=trainer.precision.fp8_dot_product_attention=true)  # packed rows, FP8 attention per
                                                                                   # one-document micro-batch
    { timeout 150 python3 bench/lora_ceiling.py fp8_delayed fp8_delayed fp8_delayed bf16 bf16 bf16
      for p in "${precs[@]}"; do
        set_p=(); [ "$p" = fp8 ] && set_p=(--set trainer.precision.fp8=hybrid)
        wsum=0; for w in "${weights[@]:i:${#precs[@]}-i}"; do wsum=$((wsum + w)); done
        share=$(( (end - $(date +%s)) * ${weights[i]:-1} / (wsum > 0 ? wsum : 1) )); i=$((i + 1))
        timeout $((share + 60)) python3 bench/interleaved.py --recipe $R8 --label "8b-$p" "${set_p[@]}" "${LV[@]}" \
          --docs single --repeats "${REPEATS:-3}" --warmup 2 --steps "${STEPS:-4}" \
          --deadline $(( $(date +%s) + share )) --workdir /tmp/bench-work
      done
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/levers.jsonl"
    python3 bench/spread.py --baseline thd "$OUT/levers.jsonl" | tee "$OUT/levers-spread.jsonl"
    python3 bench/spread.py --baseline thd --markdown "$OUT/levers.jsonl" > "$OUT/levers-spread.md" ;;
  offload-70b)  # issue 37 item 5 (built 2026-12-05, not yet measured): the 70B recipe as shipped (block-60 recompute)
                # against no recompute with the first OFFLOAD70 (default 48) layers' activations in pinned host memory
                # (trainer.recompute.activation_offload_layers: megatron-core cpu_offloading through TE). `primus-slurm
                # plan` puts N=48 (the fewest that fit) at 126.7 GiB on the GPU and 85.6 GiB of host memory and
                # predicts PCIe-bound copies (2,228 tok/s at an assumed 50 GB/s): this call measures both. A B A B A B, one process a run (~75 s each, 10 steps)
    B60=(--set trainer.recompute.method=block --set trainer.recompute.num_layers=60)
    OFF=(--set trainer.recompute.granularity=null --set "trainer.recompute.activation_offload_layers=${OFFLOAD70:-48}")
    end=$(( $(date +%s) + ${BUDGET_S:-560} ))  # a run starts only with 90 s left, and ends by the budget
    for rep in 0 1 2; do
      for v in block60 offload; do
        left=$(( end - $(date +%s) ))
        if [ "$left" -lt 90 ]; then echo "{\"bench\": \"skipped\", \"label\": \"70b1-$v-r$rep\"}"; continue; fi
        set_v=("${B60[@]}"); [ $v = offload ] && set_v=("${OFF[@]}")
        $TP --recipe bench/recipes/llama2_70b_1xh200.yaml --nproc 1 --docs packed --label "70b1-$v-r$rep" \
            --timeout $(( left < 150 ? left : 150 )) "${set_v[@]}"
      done
    done 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/offload-70b.jsonl"
    python3 bench/spread.py --baseline 70b1-block60 "$OUT/offload-70b.jsonl" | tee "$OUT/offload-70b-spread.jsonl" ;;
  8bmem)  # memory switches at the same shape: chunked loss (default) on/off, adapter_inputs scopes, FP8 params
    AI=(--set trainer.recompute.adapter_inputs=true)
    { $TP --recipe $R8 --docs packed --label 8b-bf16-packed-defaults
      $TP --recipe $R8 --docs packed --label 8b-bf16-packed-no-chunked-loss --set trainer.recompute.chunked_loss=false
      for scope in norm fc2 all; do
        $TP --recipe $R8 --docs packed --label "8b-bf16-packed-adapter-inputs-$scope" "${AI[@]}" \
            --set trainer.recompute.adapter_inputs_scope=$scope
      done
      $TP --recipe $R8 --docs packed --label 8b-fp8-packed-defaults --set trainer.precision.fp8=hybrid
      $TP --recipe $R8 --docs packed --label 8b-fp8-packed-fp8param-tensorwise --set trainer.precision.fp8=hybrid \
          --set trainer.precision.fp8_param=true --set trainer.precision.fp8_recipe=tensorwise "${AI[@]}"
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/8bmem.jsonl" ;;
  fp4)
    timeout 400 python3 bench/fp4_gpu_check.py --out "$OUT/fp4_gpu_check.json" > /dev/null 2>"$OUT/fp4_gpu_check.err"
    python3 -c "import json;d=json.load(open('$OUT/fp4_gpu_check.json'));print(json.dumps({k:(v if k!='nvfp4_bitexact' else {kk:vv for kk,vv in v.items() if kk!='failing_cases'}) for k,v in d.items()})[:4000])" ;;
  70b1)  # one GPU: RUNS picks recompute settings: full | none | selective | blockN (N layers recomputed), -ai suffix:
         # + adapter_inputs (SwiGLU recomputed, RMSNorm folded into A); ITERS70 overrides train_iters; EXTRA70 adds
         # trainer_throughput arguments to every run and TAG70 names them in the label, e.g. TAG70=nodrop
         # EXTRA70="--set trainer.lora.dropout=0.0" (what LoRA dropout costs the 70B: the planner's fitted dropout
         # term holds 3.5 s of its 27.6 s step, the passes it counts ~0.3 s), or TAG70=prof EXTRA70="--profile 8-9"
    for r in ${RUNS:-full block60 block40 none}; do
      base=${r%-ai}; set_r=()
      case $base in
        full) ;;
        none) set_r=(--set trainer.recompute.granularity=null) ;;
        selective) set_r=(--set trainer.recompute.granularity=selective) ;;
        block[0-9]*) set_r=(--set trainer.recompute.method=block --set "trainer.recompute.num_layers=${base#block}") ;;
        *) echo "70b1: unknown run '$r' (full none selective blockN, optional -ai)" >&2; exit 2 ;;
      esac
      [ "$r" != "$base" ] && set_r+=(--set trainer.recompute.adapter_inputs=true)
      [ -n "${ITERS70:-}" ] && set_r+=(--set "trainer.schedule.train_iters=$ITERS70")
      [ -n "${EXTRA70:-}" ] && { read -ra extra <<<"$EXTRA70"; set_r+=("${extra[@]}"); }
      $TP --recipe bench/recipes/llama2_70b_1xh200.yaml --nproc 1 --docs packed --label "70b-1gpu-$r${TAG70:+-$TAG70}" \
          --timeout 420 "${set_r[@]}"
    done 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70b1.jsonl" ;;
  store-70b)  # the 70B's activation stores (sixteenth session, 2026-12-06): the recipe (FP8 tensorwise, fp8_param,
              # dropout 0.1 on qkv/proj) cut to LAYERS70C layers (default 20: an H100's 80 GB) with no recompute, so
              # every layer keeps its activations: the dropped copy and byte mask kept (trainer.lora.dropout_recompute
              # false, what ran before) against the default (the input and the mask's bits kept, the copy recomputed)
              # and with trainer.recompute.norm_output (qkv's norm output recomputed too), interleaved, 3 repeats
              # (bench/interleaved.py). Planned at 20 layers on an H100: 54.8 / 50.1 / 47.6 GiB, the same speed
    timeout $(( ${BUDGET_S:-420} + 60 )) python3 bench/interleaved.py --recipe bench/recipes/llama2_70b_1xh200.yaml \
      --label "70b-${LAYERS70C:-20}layers-store" --set "trainer.model.num_layers=${LAYERS70C:-20}" \
      --set trainer.recompute.granularity=null --docs packed --repeats "${REPEATS:-3}" --warmup 2 \
      --steps "${STEPS:-6}" \
      --variant drop-kept=trainer.lora.dropout_recompute=false --variant default= \
      --variant norm-output=trainer.recompute.norm_output=true --deadline $(( $(date +%s) + ${BUDGET_S:-420} )) \
      --workdir /tmp/bench-work 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/store-70b.jsonl"
    python3 bench/spread.py --baseline drop-kept "$OUT/store-70b.jsonl" | tee "$OUT/store-70b-spread.jsonl" ;;
  costs-70b)  # seventeenth session: the planner prices the 70B's pre-dropout at 0.42 s of its 3.3 s step (the fitted
              # dropout_pre_elementwise cost, ~114 bytes an element at the H200's bandwidth, from 2026-11-30's unfused
              # TP=2 rows) and fp8_swiglu_input's casts at nothing, while block 44 with the store ran 7.5 % under its
              # plan. The same 20-layer cut as store-70b, no recompute: the defaults, the dropout off, the SwiGLU store
    # VARIANTS70C picks some (2026-12-07b: "swiglu8 swiglu8k", megatron's store against the kernels, ~75 s on an H100;
    # "swiglu8k swiglu8k-delayed": the recipe's tensorwise scaling against delayed, on an H100 where no H200 comes);
    # the spread's baseline is the first picked
    declare -A costs=([default]= [no-dropout]=trainer.lora.dropout=0.0
      [swiglu8]=trainer.precision.fp8_swiglu_input=true,trainer.precision.fp8_swiglu_kernels=false
      [swiglu8k]=trainer.precision.fp8_swiglu_input=true,trainer.precision.fp8_swiglu_kernels=true
      [swiglu8k-delayed]=trainer.precision.fp8_swiglu_input=true,trainer.precision.fp8_swiglu_kernels=true,trainer.precision.fp8_recipe=delayed)
    picked=(); base70c=""
    for v in ${VARIANTS70C:-default no-dropout swiglu8 swiglu8k}; do
      [ -n "${costs[$v]+x}" ] || { echo "costs-70b: unknown variant '$v' (${!costs[*]})" >&2; exit 2; }
      picked+=(--variant "$v=${costs[$v]}"); base70c=${base70c:-$v}
    done
    timeout $(( ${BUDGET_S:-420} + 60 )) python3 bench/interleaved.py --recipe bench/recipes/llama2_70b_1xh200.yaml \
      --label "70b-${LAYERS70C:-20}layers-costs" --set "trainer.model.num_layers=${LAYERS70C:-20}" \
      --set trainer.recompute.granularity=null --docs packed --repeats "${REPEATS:-3}" --warmup 2 \
      --steps "${STEPS:-6}" "${picked[@]}" --deadline $(( $(date +%s) + ${BUDGET_S:-420} )) \
      --workdir /tmp/bench-work 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/costs-70b.jsonl"
    python3 bench/spread.py --baseline "${base70c}" "$OUT/costs-70b.jsonl" | tee "$OUT/costs-70b-spread.jsonl" ;;
  70b1-loss)
    python3 bench/fp8_release_loss.py --layers 20 --iters 24 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70b1-loss.jsonl" ;;
  70b)
    { $TP --recipe $R70 --nproc 2 --docs packed --label 70b-tp2-fp8-packed --timeout 560
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70b.jsonl" ;;
  70bbf16)
    { $TP --recipe $R70 --nproc 2 --docs packed --label 70b-tp2-bf16-packed --set trainer.precision.fp8=null \
        --set trainer.precision.fp8_param=false --timeout 560
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70b.jsonl" ;;
  70bfast)  # fp8_param, tensorwise against delayed scaling (own-scale weights since the fifth session's fix), with
            # and without full recompute; RUNS picks some (names below), WITH_BF16=1 adds BF16 without recompute
    ALL="keep adapter-inputs full delayed-keep delayed-full"
    [ -n "${WITH_BF16:-}" ] && ALL="$ALL bf16-keep"
    for r in ${RUNS:-}; do
      case " $ALL bf16-keep " in *" $r "*) ;; *) echo "70bfast: unknown run '$r' ($ALL bf16-keep)" >&2; exit 2 ;; esac
    done
    NR=(--set trainer.recompute.granularity=null)
    for r in ${RUNS:-$ALL}; do
      case $r in
        keep) set_r=("${NR[@]}") ;;  # fastest, 124 GiB
        adapter-inputs) set_r=("${NR[@]}" --set trainer.recompute.adapter_inputs=true) ;;
        full) set_r=() ;;
        delayed-keep) set_r=("${NR[@]}" --set trainer.precision.fp8_recipe=delayed) ;;
        delayed-full) set_r=(--set trainer.precision.fp8_recipe=delayed) ;;
        bf16-keep) set_r=("${NR[@]}" --set trainer.precision.fp8=null --set trainer.precision.fp8_param=false) ;;
      esac
      $TP --recipe $R70 --nproc 2 --docs packed --label "70b-tp2-$r" --timeout 300 "${set_r[@]}"
    done 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70bfast.jsonl" ;;
  70bub)  # TE userbuffers: the sequence-parallel all-gathers / reduce-scatters overlapped with the GEMMs
    NR=(--set trainer.recompute.granularity=null)
    P8=(--set trainer.precision.fp8_param=true --set trainer.recompute.adapter_inputs=true)
    UB=(--set trainer.parallelism.tp_comm_overlap=true)
    { $TP --recipe $R70 --nproc 2 --docs packed --label 70b-fp8param-norecompute --timeout 300 "${NR[@]}" "${P8[@]}"
      $TP --recipe $R70 --nproc 2 --docs packed --label 70b-fp8param-norecompute-ub --timeout 300 "${NR[@]}" "${P8[@]}" "${UB[@]}"
      $TP --recipe $R70 --nproc 2 --docs packed --label 70b-fp8param-fullrecompute-ub --timeout 300 "${P8[@]}" "${UB[@]}"
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70bub.jsonl" ;;
  70bprofile)  # where the 70B step goes: busy vs idle device time (profile-<label>.txt ends with the timeline)
    { $TP --recipe $R70 --nproc 2 --docs packed --label 70b-keep-profile --profile 8-9 --timeout 300 \
          --set trainer.recompute.granularity=null --set trainer.precision.fp8_param=true
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/70bprofile.jsonl" ;;
  profile)  # where the time and memory go: top kernels of two steps (profile-<label>.txt) and what one
            # micro-batch's forward keeps for backward (saved-tensors-<label>.txt), in $OUT
    AI=(--set trainer.recompute.adapter_inputs=true)
    { $TP --recipe $R8 --docs packed --label 8b-bf16-keep --profile 8-9
      for scope in fc2 norm all; do
        $TP --recipe $R8 --docs packed --label "8b-bf16-adapter-inputs-$scope" --profile 8-9 "${AI[@]}" \
            --set trainer.recompute.adapter_inputs_scope=$scope
      done
      $TP --recipe $R8 --docs packed --label 8b-fp8-keep --profile 8-9 --set trainer.precision.fp8=hybrid
      $TP --recipe $R8 --docs packed --label 8b-fp8-adapter-inputs --profile 8-9 --set trainer.precision.fp8=hybrid "${AI[@]}"
      $TP --recipe $R70 --nproc 2 --docs packed --label 70b-fp8param-norecompute --profile 8-9 --timeout 300 \
          --set trainer.recompute.granularity=null --set trainer.precision.fp8_param=true \
          --set trainer.precision.fp8_recipe=tensorwise "${AI[@]}"
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/profile.jsonl"
    # a device call returns only a few files: ship the per-run summaries as one archive
    (cd "$OUT" && tar czf profile-files.tar.gz profile-*.txt saved-tensors-*.txt && rm -f profile-*.txt saved-tensors-*.txt) ;;
  moe)
    { for r in recipes/proxies/*.yaml; do
        $TP --recipe "$r" --nproc "${NPROC:-1}" --docs packed --label "$(basename "$r" .yaml)" \
            --set cluster.nproc_per_node="${NPROC:-1}" --set trainer.distributed.device=cuda \
            --set trainer.distributed.backend=nccl --timeout 300
      done
    } 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/moe.jsonl" ;;
  moe-fp8)  # MoE/MLA proxies (one GPU) in BF16 and FP8: tensorwise with BF16 / FP8-only (fp8_param) weights, and
            # delayed with fp8_param (TE grouped expert linears under each); same synthetic data, so lm loss compares
    for r in recipes/proxies/qwen3_30b_a3b_proxy.yaml recipes/proxies/deepseek_v2_lite_proxy.yaml; do
      for p in bf16 fp8 fp8param delayed-fp8param; do
        F8=(--set trainer.precision.fp8=hybrid --set trainer.precision.fp8_recipe=tensorwise)
        case $p in
          bf16) set_p=() ;;
          fp8) set_p=("${F8[@]}") ;;
          fp8param) set_p=("${F8[@]}" --set trainer.precision.fp8_param=true) ;;
          delayed-fp8param) set_p=(--set trainer.precision.fp8=hybrid --set trainer.precision.fp8_param=true) ;;
        esac
        $TP --recipe "$r" --nproc 1 --docs packed --label "$(basename "$r" .yaml)-$p" --timeout 300 "${set_p[@]}"
      done
    done 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/moe-fp8.jsonl" ;;
  hf-import)  # the HF import on the TE spec vs transformers (tiny checkpoints of every family, fp32 and BF16);
              # then the MoE/MLA proxies from proxy-sized HF checkpoints made here: HF=1 bash bench/gpu_suite.sh moe-realtext
    python3 bench/hf_import_gpu_check.py 2>&1 | grep --line-buffered '^{' | tee -a "$OUT/hf-import.jsonl" ;;
  moe-realtext)  # proxies, LoRA, on the real-text set (its 1536-token BPE fits any vocab); random weights, or with
                 # HF=1 imported from a random HF checkpoint of the proxy written first (scripts/make_hf_checkpoint.py)
    i=0  # PROXIES="a.yaml b.yaml" picks some
    for r in ${PROXIES:-recipes/proxies/*.yaml}; do
      n=$(basename "$r" .yaml); i=$((i + 1)); hf=()
      [ "${NPROC:-1}" = 1 ] && hf=(--set trainer.parallelism.expert=1)  # the 235B proxy's EP=2 needs two GPUs
      if [ -n "${HF:-}" ]; then
        python3 scripts/make_hf_checkpoint.py "$r" "/tmp/hf-proxy/$n" >> "$OUT/hf-proxy-checkpoints.jsonl" 2>&1
        hf+=(--set "trainer.checkpoint.pretrained=/tmp/hf-proxy/$n")
      fi
      python3 -m primus_slurm submit "$r" --executor local --follow --run-id "20261130-000000-00000$i" "${hf[@]}" \
        --set experiment.workspace=/tmp/moe-rt --set trainer.data.format=text --set trainer.data.packing=true \
        --set "trainer.data.train.path=$PWD/recipes/data/realtext/train.jsonl" \
        --set "trainer.tokenizer.path=$PWD/recipes/data/realtext/tokenizer" \
        --set trainer.schedule.train_iters=30 --set trainer.schedule.lr=1.0e-3 --set trainer.logging.log_interval=1 \
        --set cluster.nproc_per_node="${NPROC:-1}" --set cluster.gpus_per_node="${NPROC:-1}" > "$OUT/moe-rt-$n.log" 2>&1
      rc=$?
      python3 - "$n" "$rc" "$OUT/moe-rt-$n.log" <<'PY'
import json, re, sys
name, rc, log = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], errors="replace").read()
loss = [float(x) for x in re.findall(r"\] iteration \d+/\d+ \| lm loss ([0-9.eE+-]+)", log)]
avg = re.findall(r"\] training summary \| iterations averaged \d+ \| tokens/s/GPU ([0-9.]+)", log)
print(json.dumps({"bench": "moe-realtext", "proxy": name, "rc": rc, "first_loss": loss[:1], "last_loss": loss[-1:],
                  "n_logged": len(loss), "tokens_per_s_per_gpu_avg": [float(x) for x in avg[-1:]],
                  "pretrained": re.findall(r"(pretrained \| path .*)", log)[:1],
                  "tail": log[-1500:] if rc else ""}))
PY
    done | tee -a "$OUT/moe-realtext.jsonl" ;;
  fp8param-hf)  # fp8_param from an HF checkpoint (recipes/data/realtext/base): the load check's summary line and
                # the loss against BF16 and FP8 with BF16 weights, same data order (60 iterations)
    i=0; runs=()
    # RUNS picks some; delayed-fp8param-tp2 loads the checkpoint into TP=2 shards (run when two GPUs are visible)
    ALL="bf16 fp8 fp8param delayed-fp8param"
    [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ] && ALL="$ALL delayed-fp8param-tp2"
    rm -rf /tmp/f8hf  # fixed run ids: a second call on a warm machine starts clean
    for p in ${RUNS:-$ALL}; do
      F8=(--set trainer.precision.fp8=hybrid)
      case $p in
        bf16) set_p=() ;;
        fp8) set_p=("${F8[@]}" --set trainer.precision.fp8_recipe=tensorwise) ;;
        fp8param) set_p=("${F8[@]}" --set trainer.precision.fp8_recipe=tensorwise --set trainer.precision.fp8_param=true) ;;
        delayed-fp8param) set_p=("${F8[@]}" --set trainer.precision.fp8_param=true) ;;
        delayed-fp8param-tp2) set_p=("${F8[@]}" --set trainer.precision.fp8_param=true --set trainer.parallelism.tensor=2
                                     --set cluster.nproc_per_node=2 --set cluster.gpus_per_node=2) ;;
        *) echo "fp8param-hf: unknown run '$p' (bf16 fp8 fp8param delayed-fp8param delayed-fp8param-tp2)" >&2; exit 2 ;;
      esac
      i=$((i + 1)); id="20261130-000000-00000$i"; runs+=("/tmp/f8hf/compare_realtext/$id")
      python3 -m primus_slurm submit recipes/compare_realtext.yaml --executor local --follow --run-id "$id" \
        --set experiment.workspace=/tmp/f8hf --set trainer.schedule.train_iters=60 --set trainer.precision.bf16=true \
        --set trainer.distributed.device=cuda --set trainer.distributed.backend=nccl --set cluster.env_profile=h200 \
        "${set_p[@]}" > "$OUT/f8hf-$p.log" 2>&1
      rc=$?
      python3 - "$p" "$rc" "$OUT/f8hf-$p.log" <<'PY' | tee -a "$OUT/fp8param-hf.jsonl"
import json, re, sys
name, rc, log = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], errors="replace").read()
lines = [m for m in re.findall(r"\] ((?:pretrained|precision|fp8_param) \|.*)", log)]
print(json.dumps({"bench": "fp8param-hf", "run": name, "rc": rc, "lines": lines, "tail": log[-800:] if rc else ""}))
PY
    done
    python3 -m primus_slurm compare "${runs[@]}" | tee "$OUT/fp8param-hf.txt" ;;
  compare|compare-realtext)
    R=quickstart; [ "$1" = compare-realtext ] && R=compare_realtext
    for p in bf16 fp8 fp4emu; do
      case $p in
        bf16) set_p=() ;;
        fp8) set_p=(--set trainer.precision.fp8=hybrid) ;;
        fp4emu) set_p=(--set trainer.precision.fp4=e2m1 --set trainer.precision.fp4_emulation=true) ;;
      esac
      python3 -m primus_slurm submit "recipes/$R.yaml" --executor local --follow --run-id "20261130-000000-0000$(printf %02d ${#p})" \
        --set experiment.workspace=/tmp/cmp --set trainer.precision.bf16=true --set trainer.distributed.device=cuda \
        --set trainer.distributed.backend=nccl --set cluster.env_profile=h200 "${set_p[@]}" > "$OUT/cmp-$R-$p.log" 2>&1
      echo "{\"bench\": \"compare-run\", \"precision\": \"$p\", \"rc\": $?}"
    done | tee -a "$OUT/$1.jsonl"
    python3 -m primus_slurm compare /tmp/cmp/$R/20261130-000000-000004 /tmp/cmp/$R/20261130-000000-000003 /tmp/cmp/$R/20261130-000000-000006 \
      --plot "$OUT/$1.png" | tee "$OUT/$1.txt"
    python3 -m primus_slurm verify-fp4 /tmp/cmp/$R/20261130-000000-000006 --fp8-run /tmp/cmp/$R/20261130-000000-000003 \
      2>&1 | tee -a "$OUT/$1.txt" ;;
  *) echo "usage: $0 8b|8bmem|swiglu|epilogue|kernels|epilogue-70b|swiglu-profile|levers|offload-70b|fp8attn-realtext|swiglu8-realtext|fp4|70b|70bbf16|70bfast|70bub|70bprofile|profile|moe|moe-fp8|moe-realtext|compare|compare-realtext|fp8param-hf" >&2; exit 2 ;;
esac
