#!/usr/bin/env bash
# The verl GPU check (docs/gpu-check.md): the pipeline's own `qrewrite rl` with rl.backend verl on one GPU, from the
# kit `make gpu-kit` staged (.gpu/), in at most 8 minutes:
#   install (once per machine) -> import check -> PPO (GAE + critic, LoRA) killed after its global_step_2 checkpoint
#   and rerun: it must resume from step 2 and end at step 4; beside it GRPO (16 generations a prompt), 4 steps;
#   each ends with its merged model and lineage -> $OUT: summary.json, the logs, nvidia-smi samples, results.tar.gz.
#
#   device:    bash scripts/gpu_verl_check.sh STAGE OUT             STAGE = the gathered chunks (/tmp/qrw-gpu/stage)
#   rehearsal: bash scripts/gpu_verl_check.sh --rehearse .gpu/chunks OUT   (CPU, `make gpu-rehearsal`: the same kit
#              in .venvs/gpu-rehearsal, Python 3.12 + the image's packages; each run goes until a GPU is needed)
# A rerun on the same warm machine skips the install: a fix costs one call, not a new transfer.
# Env: DEADLINE_S (460: the runs are stopped by then), TENANT (fivedoctors), QRW_GPU_WORK (/tmp/qrw-gpu),
#      GRPO_DELAY_S (5: GRPO starts this long after PPO, so the two do not import and allocate at the same instant).
set -uo pipefail
REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
[ $# -eq 2 ] || { echo "usage: $0 [--rehearse] STAGE OUT" >&2; exit 2; }
STAGE=$(realpath "$1"); OUT=$(realpath -m "$2")
W=${QRW_GPU_WORK:-/tmp/qrw-gpu}
DEADLINE_S=${DEADLINE_S:-460}
TENANT=${TENANT:-fivedoctors}
SECONDS=0
say() { echo "[check ${SECONDS}s] $*"; }
mark() { echo "{\"event\": \"$1\", \"t_s\": $SECONDS}" >> "$W/timeline.jsonl"; }
left() { echo $(( DEADLINE_S - SECONDS )); }

# bm25s (the reward's RAG) runs jax at import: with jax on CUDA, XLA would take 75 % of the GPU (docs/gpu-check.md).
# vLLM's FlashInfer sampler is on by default and FlashInfer stays home (envs/gpu-kit-exclude.txt).
export JAX_PLATFORMS=cpu VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DISABLE_DOCKER_CPU_WARNING=1

if [ $REHEARSE = 1 ]; then PY=${PY:-.venvs/gpu-rehearsal/bin/python}; W=${QRW_GPU_WORK:-/tmp/qrw-gpu-rehearsal}; else PY=${PY:-python3}; fi
# a previous call's runs on this machine (their own process sessions outlive a call): stop them first
$PY -m qrewrite.gpucheck.phase --stop-all 2>/dev/null
rm -rf "$W"/{logs,status,stats,cfg,runs,models,tb,kit,timeline.jsonl,env.json}  # the check's scratch only
mkdir -p "$OUT" "$W"/{logs,status,stats,cfg,kit}
mark start

SITE=$W/site
STAMP=$(sha256sum "$STAGE/chunk-00/manifest.json" | cut -d' ' -f1)
if [ "$(cat "$SITE/.kit" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$SITE" "$W/files"
  $PY -m qrewrite.training.wheel_stage install "$STAGE" --target "$SITE" --files-to "$W/files" | tail -1 || exit 1
  # bytecode once here, in parallel, instead of in each of the runs' many processes
  $PY -m compileall -q -j 0 "$SITE" >/dev/null 2>&1
  echo "$STAMP" > "$SITE/.kit"
  say "installed"
else
  say "kit already installed here ($STAMP)"
fi
export PYTHONPATH=$SITE
tar xzf "$W/files/kit-payload.tar.gz" -C "$W/kit" || exit 1
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 500 \
    > "$OUT/nvsmi.csv" 2>/dev/null &
  SMI=$!
  trap 'kill $SMI 2>/dev/null' EXIT
fi
mark installed

[ -n "${SKIP_IMPORTS:-}" ] || $PY -m qrewrite.gpucheck.imports --out "$W/env.json" $([ $REHEARSE = 1 ] && echo --cpu) || {
  say "import check failed"; $PY -m qrewrite.gpucheck.collect "$W" "$OUT"; exit 1; }
mark imports
$PY -m qrewrite.gpucheck.run_config --tenant "$TENANT" --out "$W/cfg" $([ $REHEARSE = 1 ] && echo --rehearse) >/dev/null || exit 1

rl() {  # RL=( the rl rule's command, as Snakemake runs it, on the kit's model and data )
  RL=("$PY" -m qrewrite rl --config "$W/cfg/$1.yaml" --tenant "$TENANT" --model "$W/kit/model" --data-dir "$W/kit/rl"
      --reward-check "$W/kit/reward_check.json" --out "$W/models/$1" --run-dir "$W/runs/$1" --tb "$W/tb/$1"
      --stats "$W/stats/$1.json" --threads 8)
}
phase() {  # NAME [phase options] -- COMMAND: stopped by the deadline at the latest
  local name=$1; shift
  $PY -m qrewrite.gpucheck.phase --name "$name" --log "$W/logs/$name.log" --status "$W/status/$name.json" \
    --budget "$(left)" "$@"
}

if [ "${ONLY:-}" = ppo ]; then  # a short look at one PPO run, no resume (a lease's last minutes)
  rl ppo; phase ppo -- "${RL[@]}"; $PY -m qrewrite.gpucheck.collect "$W" "$OUT"; exit; fi
say "ppo_a: PPO until its global_step_2 checkpoint, then stopped"
rl ppo
phase ppo_a --kill-after-step 2 --run-dir "$W/runs/ppo" --critic -- "${RL[@]}" &
A=$!
sleep "${GRPO_DELAY_S:-5}"
say "grpo: GRPO, 4 steps"
rl grpo
phase grpo -- "${RL[@]}" &
G=$!
wait $A
mark ppo_a_done
if [ $REHEARSE = 0 ] && grep -q '"step_at_kill": [0-9]' "$W/status/ppo_a.json" 2>/dev/null; then
  say "ppo_b: the same command again: it must resume from global_step_2"
  rl ppo
  phase ppo_b -- "${RL[@]}"
  mark ppo_b_done
else
  say "ppo_a ended without a checkpoint: no resume to check"
fi
wait $G
mark grpo_done
$PY -m qrewrite.gpucheck.collect "$W" "$OUT" $([ $REHEARSE = 1 ] && echo --rehearsal)
RC=$?
say "done (rc $RC)"
exit $RC
