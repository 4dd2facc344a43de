"""RL on the cluster: verl PPO/GRPO (`python -m verl.trainer.main_ppo`), then an HF folder of the result.

verl 0.9 checkpoints are FSDP shards under `<run_dir>/global_step_N/actor`; `python -m
verl.model_merger merge --backend fsdp` turns them into an HF folder, writing a LoRA run as base
weights + `lora_adapter/`, which we fold into the weights with peft so `models/T/rl` is one plain model.
Needs GPUs and vLLM: it cannot run on CPU (tests check the command and its Hydra composition instead).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from qrewrite.envs import REPO, repo_pythonpath
from qrewrite.errors import QrewriteError
from qrewrite.io_utils import atomic_dir
from qrewrite.reward.monitor import CURVE_ENV, FLUSH_EVERY_ENV, STEP_OFFSET_ENV, TB_DIR_ENV
from qrewrite.reward.adapter import CONFIG_ENV, PROJECT_ROOT_ENV
from .overrides import CRITIC_LIB, build_command, have_flash_attn, pick_attention, resolve_config
from qrewrite.training import resume
from qrewrite.training.swift.runner import run_swift, swift_env

REWARD_FILE = REPO / "qrewrite" / "reward" / "verl_reward.py"


def verl_attention() -> str:
    """flash_attention_2 where flash-attn is installed (verl's default), else sdpa: verl's workers run in this
    Python's environment (the verl image on the cluster, the staged site on the GPU check)."""
    return pick_attention(None, have_flash_attn())


def verl_paths(*, model: str, train: str, val: str, run_dir: str) -> dict:
    return {"model": str(Path(model).resolve()), "train_files": str(Path(train).resolve()),
            "val_files": str(Path(val).resolve()), "reward_fn": str(REWARD_FILE),
            "checkpoint_dir": str(Path(run_dir).resolve())}


def verl_env(cfg: dict, *, config_path: str, tb_dir: str) -> dict[str, str]:
    c = resolve_config(cfg["rl"]["verl"])
    return {CONFIG_ENV: str(Path(config_path).resolve()), TB_DIR_ENV: str(Path(tb_dir).resolve()),
            "TENSORBOARD_DIR": str(Path(tb_dir).resolve()),  # verl's own tensorboard logger
            FLUSH_EVERY_ENV: str(int(c["train_batch_size"]) * int(c["rollout_n"])),  # one flush per step
            "PYTHONPATH": repo_pythonpath(), PROJECT_ROOT_ENV: os.getcwd(),
            # every verl process (Ray workers inherit it) imports the critic loader that honours the attention
            "VERL_USE_EXTERNAL_MODULES": CRITIC_LIB}


def latest_actor_checkpoint(run_dir: str | Path, *, critic: bool) -> Path:
    run = Path(run_dir)
    step = resume.last_complete_verl_step(run, critic=critic)
    if step is None:
        raise QrewriteError(f"no complete verl checkpoint under {run}",
                            hint="rl.verl.save_freq must be > 0 (verl saves nothing otherwise); check the training log")
    return run / f"global_step_{step}" / "actor"


def fold_lora(hf_dir: Path, out_dir: Path) -> None:
    """HF folder (+ optional lora_adapter/) -> one merged model in out_dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.bfloat16)
    lora = hf_dir / "lora_adapter"
    if lora.is_dir():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, lora).merge_and_unload()
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(hf_dir).save_pretrained(out_dir)


def check_allocation(verl_cfg: dict, environ=os.environ) -> None:
    """Inside a Slurm job, the nodes and GPUs per node verl will ask Ray for must be what Slurm granted."""
    granted = {"nnodes": environ.get("SLURM_JOB_NUM_NODES"), "n_gpus_per_node": environ.get("SLURM_GPUS_ON_NODE")}
    for key, value in granted.items():
        if value and value.isdigit() and int(value) != int(verl_cfg[key]):
            raise QrewriteError(
                f"rl.verl.{key} is {verl_cfg[key]} but this Slurm job has {value}",
                hint="set QREWRITE_SLURM_RL_NODES / QREWRITE_SLURM_GPUS (slurm/config.yaml) to match rl.verl, "
                     "or change rl.verl")


def run_verl(cfg: dict, *, config_path: str, model: str, train: str, val: str, out: str, run_dir: str,
             tb_dir: str, log_file: str | None = None) -> dict:
    check_allocation(cfg["rl"]["verl"])
    shutil.rmtree(tb_dir, ignore_errors=True)
    os.makedirs(tb_dir, exist_ok=True)
    critic = resolve_config(cfg["rl"]["verl"])["algorithm"] == "ppo"
    paths = verl_paths(model=model, train=train, val=val, run_dir=run_dir)
    attention = verl_attention()
    argv = build_command(cfg["rl"]["verl"], paths, python=sys.executable, attention=attention)
    # same command and inputs as an interrupted run: continue from its last complete global_step_N
    fp = resume.fingerprint(argv[1:], [model, train, val, config_path, REWARD_FILE])
    step = resume.prepare_verl_resume(run_dir, critic=critic) if resume.prepare_run_dir(run_dir, fp) else None
    if step is not None:
        paths["resume_from"] = str(Path(run_dir).resolve() / f"global_step_{step}")
        argv = build_command(cfg["rl"]["verl"], paths, python=sys.executable, attention=attention)
    curve = resume.curve_for_run(run_dir, step or 0)  # a resumed curve starts at step 1
    env = {**verl_env(cfg, config_path=config_path, tb_dir=tb_dir), CURVE_ENV: str(curve.resolve()),
           STEP_OFFSET_ENV: str(step or 0)}
    wall = run_swift(argv, log_file=log_file, env=env)  # same streaming runner: any command works
    resume.publish_curve(curve, tb_dir)
    actor = latest_actor_checkpoint(run_dir, critic=critic)
    with atomic_dir(out) as tmp:
        hf = Path(tmp) / "hf"
        subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                        "--local_dir", str(actor), "--target_dir", str(hf)], check=True, env=swift_env(env))
        final = Path(tmp) / "final"
        fold_lora(hf, final)
        shutil.rmtree(hf)
        for p in final.iterdir():
            shutil.move(str(p), Path(tmp) / p.name)
        final.rmdir()
    resume.mark_finished(run_dir)
    return {"backend": "verl", "algorithm": cfg["rl"]["verl"]["algorithm"], "wall_s": round(wall, 1),
            "resumed_from_step": step, "attention": attention,
            "checkpoint": str(actor.parent.name), "overrides": argv[3:]}
