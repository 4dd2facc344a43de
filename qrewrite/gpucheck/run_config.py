"""The GPU check's two run configs: the project's config.yaml, one tenant, `rl.backend: verl` on one GPU.

ppo: GAE + critic, LoRA actor, 4 steps with a checkpoint every 2 (the check kills the run after global_step_2
and reruns it: `qrewrite rl` resumes from that checkpoint). grpo: 16 generations a prompt, 4 steps. Both are sized
for minutes of a lent H200, not for learning: a random 2-layer policy (tiny_model), 32-token answers.

What differs from a cluster run is in `extra_overrides`, each for a stated reason; a rehearsal (CPU, no GPU)
adds a pretend GPU to Ray so that the run gets as far as a GPU is needed (NCCL init).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml

from ..io_utils import write_text_atomic

KV_CACHE_BYTES = 4 * 1024 ** 3

COMMON = {"n_gpus_per_node": 1, "nnodes": 1, "lora_rank": 16, "lora_alpha": 32, "ppo_epochs": 1,
          "max_prompt_length": 256, "max_response_length": 32, "gpu_memory_utilization": 0.2,
          "total_training_steps": 4, "save_freq": 2, "test_freq": -1, "val_before_train": True,
          "reward_num_workers": 1}
ALGOS = {
    "ppo": {"algorithm": "ppo", "rollout_n": 1, "train_batch_size": 8, "ppo_mini_batch_size": 8,
            "micro_batch_size_per_gpu": 8},
    "grpo": {"algorithm": "grpo", "rollout_n": 16, "train_batch_size": 4, "ppo_mini_batch_size": 4,
             "micro_batch_size_per_gpu": 16},
}


def extra_overrides(name: str, *, rehearse: bool) -> list[str]:
    out = [
        # no CUDA-graph capture: a 4-step check would spend more on capturing than on decoding
        "actor_rollout_ref.rollout.enforce_eager=true",
        # verl starts 8 agent-loop workers (Ray actors) by default: 2 serve 4-8 prompts a step
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "data.dataloader_num_workers=0",
        # Ray's CPUs are a count of slots, not cores: verl's TaskRunner, workers, TransferQueue storage units
        # and agent loops want more than a small machine has (with 2 a run waits forever for its placement)
        "ray_kwargs.ray_init.num_cpus=32",
        # its own Ray folder: the check stops a run by what lives there (qrewrite.gpucheck.phase)
        f"++ray_kwargs.ray_init._temp_dir=/tmp/qrw-ray-{name}",
        # a fixed KV cache instead of one sized by profiling free memory, which the other run's allocations
        # would skew (the two vLLM engines may start at the same time on the one GPU)
        f"++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={KV_CACHE_BYTES}",
    ]
    if rehearse:  # Ray sees no GPU on a CPU machine: pretend one, so the run goes on until CUDA is needed
        out.append("++ray_kwargs.ray_init.num_gpus=1")
    return out


def run_config(base: dict, tenant: str, name: str, *, rehearse: bool = False) -> dict:
    cfg = copy.deepcopy(base)
    tenants = [t for t in cfg["tenants"] if t["name"] == tenant]
    if not tenants:
        raise SystemExit(f"tenant {tenant!r} is not in the config")
    cfg["tenants"] = tenants
    cfg["train"] = {**cfg.get("train", {}), "device": "cuda", "threads": 8}
    cfg["rl"] = {**{k: v for k, v in cfg.get("rl", {}).items() if k not in ("swift_grpo", "verl")},
                 "backend": "verl",
                 # the RL-vs-SFT check after training is the rl stage's, not verl's: off, for the minutes it costs
                 "compare_with_parent": False,
                 "verl": {**COMMON, **ALGOS[name],
                          "extra_overrides": extra_overrides(name, rehearse=rehearse)}}
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qrewrite.gpucheck.run_config", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--tenant", default="fivedoctors")
    ap.add_argument("--out", required=True, help="folder for ppo.yaml and grpo.yaml")
    ap.add_argument("--rehearse", action="store_true", help="CPU rehearsal: a pretend GPU for Ray")
    args = ap.parse_args(argv)
    base = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    for name in ALGOS:
        text = yaml.safe_dump(run_config(base, args.tenant, name, rehearse=args.rehearse), allow_unicode=True,
                              sort_keys=False)
        write_text_atomic(Path(args.out) / f"{name}.yaml", text)
        print(Path(args.out) / f"{name}.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
