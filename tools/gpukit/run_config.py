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

from qrewrite.io_utils import write_text_atomic

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
        # its own Ray folder: the check stops a run by what lives there (tools.gpukit.phase)
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


# The learning run (scripts/gpu_rl_learn.sh): GRPO with LoRA on the tenant's real SFT student. Sized to learn, from
# what was measured (docs/gpu-check.md "The learning run: settings and why"):
LEARN = {
    "algorithm": "grpo",
    # 8 samples a prompt: the CPU RL check's (the one RL run that beat its SFT parent, CQR +0.059): a spread the
    # group baseline can rank; 16 prompts a step: 128 rollouts, one vLLM batch, 2x fewer steps than 8
    "rollout_n": 8, "train_batch_size": 16, "ppo_mini_batch_size": 16, "micro_batch_size_per_gpu": 32,
    "ppo_epochs": 1,
    # the CPU check's LoRA learning rate (1e-4, verl's LoRA default: 10x full fine-tuning's); no KL term and no
    # reference pass, as the CPU check (beta 0): LoRA r16 on a merged SFT model stays close by construction
    "actor_lr": 1.0e-4, "use_kl_loss": False, "kl_loss_coef": 0.0, "entropy_coeff": 0.0,
    "lora_rank": 16, "lora_alpha": 32,
    # a rewrite is 5-30 tokens; eval.generation.max_new_tokens is 40: a longer sample is one the eval would cut
    "max_prompt_length": 256, "max_response_length": 40, "temperature": 1.0,
    # one epoch of the RL prompts (drop_last: rows // 16 steps); one checkpoint, the last, which the rule merges
    "total_epochs": 1, "total_training_steps": None, "save_freq": 1000, "test_freq": -1,
    "val_before_train": False,  # the release compares RL with SFT on validation after training: no minutes here
    "n_gpus_per_node": 1, "nnodes": 1, "gpu_memory_utilization": 0.3, "reward_num_workers": 4,
}


def learn_steps(n_prompts: int) -> int:
    """verl's steps for one epoch of n RL prompts (its train dataloader drops the last partial batch)."""
    return max(1, n_prompts // LEARN["train_batch_size"])


def learn_config(kit_cfg: dict, *, kb: str, rehearse: bool = False) -> dict:
    """The learning run's config: the kit's (one tenant, config.yaml's values), the KB where the kit put it, verl
    GRPO with LEARN on one GPU, the eval generating on the GPU (CPU in a rehearsal)."""
    cfg = copy.deepcopy(kit_cfg)
    (tenant,) = cfg["tenants"]
    tenant["kb"]["path"] = kb
    cfg["train"] = {**cfg.get("train", {}), "device": "cuda", "threads": 8}
    cfg["eval"]["generation"] = {**cfg["eval"].get("generation", {}), "device": "cpu" if rehearse else "cuda"}
    overrides = [o for o in extra_overrides("learn", rehearse=rehearse) if "agent.num_workers" not in o]
    cfg["rl"] = {**{k: v for k, v in cfg.get("rl", {}).items() if k not in ("swift_grpo", "verl")},
                 "backend": "verl", "compare_with_parent": False,  # learn_eval compares, on val and test
                 "verl": {**LEARN, "extra_overrides": overrides}}
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.run_config", description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--tenant", default="fivedoctors")
    ap.add_argument("--out", required=True, help="folder for ppo.yaml and grpo.yaml (--learn: learn.yaml)")
    ap.add_argument("--rehearse", action="store_true", help="CPU rehearsal: a pretend GPU for Ray")
    ap.add_argument("--learn", metavar="KIT_DIR", help="the learning run's config from the kit's (KIT_DIR/config.yaml "
                    "and kb.jsonl) -> OUT/learn.yaml")
    args = ap.parse_args(argv)
    if args.learn:
        kit = Path(args.learn).resolve()
        base = yaml.safe_load((kit / "config.yaml").read_text(encoding="utf-8"))
        cfg = learn_config(base, kb=str(kit / "kb.jsonl"), rehearse=args.rehearse)
        write_text_atomic(Path(args.out) / "learn.yaml", yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))
        print(Path(args.out) / "learn.yaml")
        return 0
    base = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    for name in ALGOS:
        text = yaml.safe_dump(run_config(base, args.tenant, name, rehearse=args.rehearse), allow_unicode=True,
                              sort_keys=False)
        write_text_atomic(Path(args.out) / f"{name}.yaml", text)
        print(Path(args.out) / f"{name}.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
