#!/usr/bin/env bash
# The GPU learning run (docs/gpu-check.md "The learning run"): verl GRPO with LoRA on a tenant's real SFT student, the
# project's reward and vLLM rollouts, then the project's eval of RL beside its SFT parent, from the kit `make gpu-kit`
# staged (.gpu/chunks: the wheels; .gpu/learn-chunks: the base GGUF, the SFT adapter, the tenant's data).
#   part 1: install (once per machine) -> student: GGUF -> base, + the SFT adapter (gpukit.student) -> GRPO started
#           in its own session (one epoch of the RL prompts: `qrewrite rl`, rl.backend verl, run_config.LEARN), and
#           while verl starts: the student checked against the CPU's rewrites, and the SFT half of the eval
#   part 2: wait for GRPO (it outlives part 1's call), then the eval with RL (gpukit.learn_eval: the release
#           chosen on validation; test Hit@1 of query + history, teacher, SFT, RL, release; RL − SFT), collect
#   -> $OUT: summary.json (student, steps, reward, times, GPU memory, eval, verdict), eval.json, grpo.log.gz,
#      nvsmi.csv, results.tar.gz (the rest: learn_collect): 5 files of the 8 a call brings back.
# Two calls of a warm machine: each stays under a call's 10 minutes and part 1's work overlaps verl's start-up.
# Everything a rerun needs stays in $W (/tmp/qrw-gpu): the installed kit, the converted base, the merged student and
# the generations made so far (memo.json): a fix costs one call.
#
#   device:    PART=1 bash scripts/gpu_rl_learn.sh STAGE LEARN_STAGE OUT; then PART=2 ... (PART=all: both, a node)
#   rehearsal: bash scripts/gpu_rl_learn.sh --rehearse .gpu/chunks .gpu/learn-chunks OUT  (CPU, `make gpu-rehearsal`:
#              the student is rebuilt and checked, the eval runs on a few rows, GRPO goes until a GPU is needed)
# Env: PART (all | 1 | 2), DEADLINE_S (the call's work stops by then: 540), RL_BUDGET_S (GRPO's, from its start: 560),
#      QRW_GPU_WORK, EVAL_ROWS (rehearsal: 4).
set -uo pipefail
REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
[ $# -eq 3 ] || { echo "usage: $0 [--rehearse] STAGE LEARN_STAGE OUT" >&2; exit 2; }
STAGE=$(realpath "$1"); LSTAGE=$(realpath "$2"); OUT=$(realpath -m "$3")
PART=${PART:-all}
case $PART in 1|2|all) ;; *) echo "PART must be 1, 2 or all" >&2; exit 2;; esac
DEADLINE_S=${DEADLINE_S:-540}; RL_BUDGET_S=${RL_BUDGET_S:-560}
if [ $REHEARSE = 1 ]; then PY=${PY:-.venvs/gpu-rehearsal/bin/python}; W=${QRW_GPU_WORK:-/tmp/qrw-gpu-rehearsal}
  DEV=cpu; EVAL_ROWS=${EVAL_ROWS:-4}
else PY=${PY:-python3}; W=${QRW_GPU_WORK:-/tmp/qrw-gpu}; DEV=cuda; EVAL_ROWS=; fi
SECONDS=0
LABEL=learn
source "$(dirname "$0")/gpu_kit_lib.sh"
R=(--rehearse); [ $REHEARSE = 1 ] || R=()

mkdir -p "$OUT"
if [ "$PART" != 2 ]; then
  $PY -m tools.gpukit.phase --stop-all 2>/dev/null  # a previous attempt's runs (they outlive its call)
  # this run's scratch only; the installed kit, the converted base and the merged student stay for a rerun
  rm -rf "$W"/{logs,status,stats,cfg,runs,tb,timeline.jsonl,eval.json,eval-sft.json,memo.json} "$W/models/rl"
fi
mkdir -p "$W"/{logs,status,stats,cfg,models}
mark start

kit_install || exit 1
L=$W/learn
LSTAMP=$(sha256sum "$LSTAGE/chunk-00/manifest.json" | cut -d' ' -f1)
if [ "$(cat "$L/.kit" 2>/dev/null)" != "$LSTAMP" ]; then
  rm -rf "$L" "$W/learn-files" "$W/models/sft" "$W/models/base"
  $PY -m tools.gpukit.wheel_stage install "$LSTAGE" --target "$W/site" --files-to "$W/learn-files" | tail -1 \
    || exit 1
  mkdir -p "$L" && tar xzf "$W/learn-files/learn-payload.tar.gz" -C "$L" || exit 1
  echo "$LSTAMP" > "$L/.kit"
fi
gpu_sampler
mark installed
TENANT=$($PY -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['tenants'][0]['name'])" "$L/config.yaml")
$PY -m tools.gpukit.run_config --learn "$L" --out "$W/cfg" "${R[@]}" >/dev/null || exit 1

finish() {
  cp "$W/nvsmi.csv" "$OUT/" 2>/dev/null
  $PY -m tools.gpukit.learn_collect "$W" "$OUT" --part "$PART" "${R[@]}"
  local rc=$?
  say "done (part $PART, rc $rc)"
  exit $rc
}
EVAL=($PY -m tools.gpukit.learn_eval --config "$W/cfg/learn.yaml" --data "$L/data" --memo "$W/memo.json"
      ${EVAL_ROWS:+--max-rows $EVAL_ROWS})

if [ "$PART" != 2 ]; then
  if [ ! -f "$W/models/sft/config.json" ]; then
    say "student: $TENANT's SFT student from the base GGUF and its adapter"
    phase student -- $PY -m tools.gpukit.student build --gguf "$W/learn-files/base.gguf" --adapter "$L/sft" \
      --base-dir "$W/models/base" --out "$W/models/sft" --tenant-config "$W/cfg/learn.yaml" --stats "$W/stats/student.json" || finish
  fi
  mark student
  say "grpo: one epoch of the RL prompts, in its own session (budget ${RL_BUDGET_S} s)"
  setsid $PY -m tools.gpukit.phase --name grpo --log "$W/logs/grpo.log" --status "$W/status/grpo.json" \
    --budget "$RL_BUDGET_S" -- $PY -m qrewrite rl --config "$W/cfg/learn.yaml" --tenant "$TENANT" \
    --model "$W/models/sft" --data-dir "$L/data/rl" --reward-check "$L/data/reward_check.json" --out "$W/models/rl" \
    --run-dir "$W/runs/grpo" --tb "$W/tb/grpo" --stats "$W/stats/grpo.json" --threads 8 \
    > "$W/logs/grpo.phase.log" 2>&1 < /dev/null &
  say "student check: its rewrites against the CPU's"
  phase student_check -- $PY -m tools.gpukit.student compare --model "$W/models/sft" \
    --tenant-config "$W/cfg/learn.yaml" --reference "$L/reference.json" --out "$W/stats/student_check.json" \
    --device "$DEV"
  say "eval, SFT half (while verl starts)"
  phase eval_sft -- "${EVAL[@]}" --model "sft=$W/models/sft" --out "$W/eval-sft.json"
  mark eval_sft_done
  [ "$PART" = 1 ] && finish
fi
say "waiting for grpo"
while [ ! -f "$W/status/grpo.json" ] && [ "$(left)" -gt 60 ]; do sleep 5; done
mark grpo_done
MODELS=(--model "sft=$W/models/sft")
[ -f "$W/models/rl/config.json" ] && MODELS+=(--model "rl=$W/models/rl")
say "eval: release on validation, test Hit@1 (${MODELS[*]})"
phase eval -- "${EVAL[@]}" "${MODELS[@]}" --out "$W/eval.json"
mark eval_done
finish
