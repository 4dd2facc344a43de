#!/usr/bin/env bash
# The verl GPU check (docs/gpu-check.md): the pipeline's own `qrewrite rl` with rl.backend verl on one GPU, from the
# kit `make gpu-kit` staged (.gpu/):
#   part 1: install (once per machine) -> import check -> PPO (GAE + critic, LoRA) stopped after its global_step_2
#           checkpoint, and beside it GRPO (16 generations a prompt, 4 steps, merged model + lineage)
#   part 2: the PPO command again: it must resume from global_step_2 and end at step 4 (merged model + lineage)
#   -> $OUT: summary.json (per-step times, reward, GPU memory, resume, models, failures), logs, nvidia-smi samples.
# A verl + vLLM start takes minutes on the lent GPU (docs/notes/2026-11-26-verl-on-one-gpu-fixes-and-leases.md), so
# the two parts are two device calls, each within the 10 minutes one call may run; PART=all runs both in one go (a cluster node).
#
#   device:    PART=1 bash scripts/gpu_verl_check.sh STAGE OUT; then PART=2 ... (STAGE: the gathered chunks)
#   rehearsal: bash scripts/gpu_verl_check.sh --rehearse .gpu/chunks OUT   (CPU, `make gpu-rehearsal`: the same kit in
#              .venvs/gpu-rehearsal, Python 3.12 + the image's packages; each run goes until a GPU is needed)
# Part 2 and any rerun on the same warm machine find the kit installed: a fix costs one call, not a new transfer.
# Env: PART (all | 1 | 2), DEADLINE_S (the part's runs are stopped by then: 420 for part 1, 330 for part 2, 720 for
#      all), TENANT (fivedoctors), QRW_GPU_WORK (/tmp/qrw-gpu), GRPO_DELAY_S (5), ONLY=ppo (one PPO run, no resume).
set -uo pipefail
REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
[ $# -eq 2 ] || { echo "usage: [PART=1|2|all] $0 [--rehearse] STAGE OUT" >&2; exit 2; }
STAGE=$(realpath "$1"); OUT=$(realpath -m "$2")
PART=${PART:-all}
case $PART in 1) DEFAULT_DEADLINE=420;; 2) DEFAULT_DEADLINE=330;; all) DEFAULT_DEADLINE=720;;
  *) echo "PART must be 1, 2 or all" >&2; exit 2;; esac
DEADLINE_S=${DEADLINE_S:-$DEFAULT_DEADLINE}
TENANT=${TENANT:-fivedoctors}
if [ $REHEARSE = 1 ]; then PY=${PY:-.venvs/gpu-rehearsal/bin/python}; W=${QRW_GPU_WORK:-/tmp/qrw-gpu-rehearsal}
else PY=${PY:-python3}; W=${QRW_GPU_WORK:-/tmp/qrw-gpu}; fi
SECONDS=0

source "$(dirname "$0")/gpu_kit_lib.sh"

# a previous call's runs on this machine (their own process sessions outlive a call): stop them first
$PY -m tools.gpukit.phase --stop-all 2>/dev/null
mkdir -p "$OUT"
if [ "$PART" != 2 ]; then
  rm -rf "$W"/{logs,status,stats,cfg,runs,models,tb,kit,timeline.jsonl,env.json}  # the check's scratch only
fi
mkdir -p "$W"/{logs,status,stats,cfg,kit}
mark start

kit_install || exit 1
[ -f "$W/kit/model/config.json" ] || tar xzf "$W/files/kit-payload.tar.gz" -C "$W/kit" || exit 1
gpu_sampler
mark installed

finish() {  # collect what there is, judge it, exit with the verdict
  cp "$W/nvsmi.csv" "$OUT/" 2>/dev/null
  $PY -m tools.gpukit.collect "$W" "$OUT" --part "$PART" $([ $REHEARSE = 1 ] && echo --rehearsal)
  local rc=$?
  say "done (part $PART, rc $rc)"
  exit $rc
}

if [ "$PART" != 2 ]; then
  if [ -z "${SKIP_IMPORTS:-}" ]; then
    $PY -m tools.gpukit.imports --out "$W/env.json" $([ $REHEARSE = 1 ] && echo --cpu) || {
      say "import check failed"; finish; }
    mark imports
  fi
  $PY -m tools.gpukit.run_config --tenant "$TENANT" --out "$W/cfg" $([ $REHEARSE = 1 ] && echo --rehearse) \
    >/dev/null || exit 1
fi

rl() {  # RL=( the rl rule's command, as Snakemake runs it, on the kit's model and data )
  RL=("$PY" -m qrewrite rl --config "$W/cfg/$1.yaml" --tenant "$TENANT" --model "$W/kit/model" --data-dir "$W/kit/rl"
      --reward-check "$W/kit/reward_check.json" --out "$W/models/$1" --run-dir "$W/runs/$1" --tb "$W/tb/$1"
      --stats "$W/stats/$1.json" --threads 8)
}

if [ "${ONLY:-}" = ppo ]; then  # a short look at one PPO run, no resume (a lease's last minutes)
  rl ppo; phase ppo -- "${RL[@]}"; finish; fi

if [ "$PART" != 2 ]; then
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
  if [ "$PART" = 1 ]; then wait $G; mark grpo_done; finish; fi
fi
if [ $REHEARSE = 0 ] && grep -q '"step_at_kill": [0-9]' "$W/status/ppo_a.json" 2>/dev/null; then
  say "ppo_b: the same command again: it must resume from global_step_2"
  rl ppo
  phase ppo_b -- "${RL[@]}"
  mark ppo_b_done
else
  say "ppo_a ended without a checkpoint: no resume to check"
fi
if [ -n "${G:-}" ]; then wait $G; mark grpo_done; fi
finish
