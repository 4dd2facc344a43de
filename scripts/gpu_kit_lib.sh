# Sourced by scripts/gpu_verl_check.sh and scripts/gpu_rl_learn.sh: the device's environment, the kit's install and
# the runs' bookkeeping. Needs PY, W (the work folder), STAGE (the gathered wheel chunks), PART, DEADLINE_S (seconds,
# counted by SECONDS); kit_install sets SITE and PYTHONPATH.

# bm25s (the reward's RAG) runs jax at import: with jax on CUDA, XLA would take 75 % of the GPU (docs/gpu-check.md).
# vLLM's FlashInfer sampler is on by default and FlashInfer stays home (envs/gpu-kit-exclude.txt).
export JAX_PLATFORMS=cpu VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DISABLE_DOCKER_CPU_WARNING=1

say() { echo "[${LABEL:-check} ${SECONDS}s] $*"; }
mark() { echo "{\"event\": \"$1\", \"part\": \"$PART\", \"t_s\": $SECONDS}" >> "$W/timeline.jsonl"; }
left() { echo $(( DEADLINE_S - SECONDS )); }
phase() {  # NAME [phase options] -- COMMAND: stopped by the deadline at the latest
  local name=$1; shift
  $PY -m tools.gpukit.phase --name "$name" --log "$W/logs/$name.log" --status "$W/status/$name.json" \
    --budget "$(left)" "$@"
}

kit_install() {  # the wheels into $W/site, once per machine and kit (part 2 and reruns find them installed)
  SITE=$W/site
  local stamp
  stamp=$(sha256sum "$STAGE/chunk-00/manifest.json" | cut -d' ' -f1)
  if [ "$(cat "$SITE/.kit" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$SITE" "$W/files"
    $PY -m tools.gpukit.wheel_stage install "$STAGE" --target "$SITE" --files-to "$W/files" | tail -1 || return 1
    # bytecode once here, in parallel, instead of in each of the runs' many processes
    $PY -m compileall -q -j 0 "$SITE" >/dev/null 2>&1
    echo "$stamp" > "$SITE/.kit"
    say "installed"
  else
    say "kit already installed here ($stamp)"
  fi
  export PYTHONPATH=$SITE
}

gpu_sampler() {  # nvidia-smi every 500 ms into $W/nvsmi.csv, stopped on exit
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 500 \
      >> "$W/nvsmi.csv" 2>/dev/null &
    SMI=$!
    trap 'kill $SMI 2>/dev/null' EXIT
  fi
}
