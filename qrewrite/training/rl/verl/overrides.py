"""Hydra override strings for ``python -m verl.trainer.main_ppo`` (verl 0.9.x).

Pure functions, no verl import: ``build_overrides(cfg, paths)`` maps our RL config
onto verl's ``verl/trainer/config/ppo_trainer.yaml`` keys, ``build_command`` wraps
them into an argv list.  Every key used here was checked against the installed
verl 0.9.1 config tree (see ``tests/verl_compose_check.py``, which composes the
real yaml with these overrides and fails on any unknown key).

Key findings for verl 0.9.1 (keys moved between versions):

* Gradient clipping is ``<role>.optim.clip_grad``.  ``actor.grad_clip`` /
  ``critic.grad_clip`` still exist in the yaml but nothing reads them in 0.9
  (``optim.grad_clip`` is a deprecated alias of ``optim.clip_grad``).
* PPO clip: ``actor.clip_ratio`` *and* ``clip_ratio_low``/``clip_ratio_high`` (the
  low/high pair defaults to 0.2 each and is what the vanilla policy loss uses), so
  all three are set.
* Value-loss coefficient: verl has NO such knob.  The critic is a separate model
  with its own optimizer; ``core_algos.compute_value_loss`` hard-codes
  ``vf_loss = 0.5 * clipped_mse``, i.e. the design's 0.5 is already what verl does.
  ``critic.cliprange_value`` (default 0.5) is the value *clip range*, a different
  thing; we set it explicitly only if ``cfg['critic_cliprange_value']`` is given.
* Entropy bonus: ``actor.entropy_coeff``; verl computes entropy automatically
  when it is non-zero.
* Reward: 0.9 keys are ``reward.custom_reward_function.{path,name}`` and
  ``reward.reward_manager.name`` (the top-level ``custom_reward_function.*`` and
  ``reward_model.reward_manager`` are legacy aliases migrated at runtime).  The
  0.9 reward loop registry only knows ``naive``, ``dapo``, ``gdpo``, ``remote``,
  ``rate_limited``: ``batch`` composes but fails at runtime ("Unknown reward
  manager: batch"), so it is rejected here.
* Critic on/off: ``critic.enable`` (null means "on iff adv_estimator == gae").
* Checkpoints: ``trainer.save_freq`` <= 0 means verl never saves (``fit`` saves only when
  ``save_freq > 0``, the last step included), and the rule needs a checkpoint to merge, so
  it must be positive.  Resume: ``trainer.resume_mode=resume_path`` with
  ``trainer.resume_from_path=<default_local_dir>/global_step_N`` when the run directory
  holds a complete step (``qrewrite.training.resume`` picks it), else ``disable``: ``auto``
  would trust ``latest_checkpointed_iteration.txt`` as verl left it.
* FSDP2 (``strategy: fsdp2``) for the actor, reference and critic: with verl 0.9.1's default FSDP1, a LoRA
  actor cannot hand its adapter to vLLM. verl's LoRA wrap policy makes every LoRA ``Linear`` its own FSDP1 unit;
  ``collect_lora_params`` then returns nothing with ``layered_summon`` off (the units' state-dict names never
  pass peft's filter: vLLM's ``add_lora`` fails with StopIteration), and with it on its
  empty result falls back to ``summon_full_params(offload_to_cpu=True)``, which FSDP1 refuses unsharded (one
  GPU: "offload_to_cpu=True and NO_SHARD is not supported yet"). Under FSDP2 the same function returns
  every LoRA tensor under peft's names, layered or not (tests/test_verl.py runs verl's own function on CPU).
  ``layered_summon`` stays off: under FSDP2 its per-unit pass comes back empty and falls back to the full one.
* Attention: verl's default is flash_attention_2 (HFModelConfig), and flash-attn has no PyPI wheel. ``attention``
  (``train.verl_attention``: flash_attention_2 where the package is installed, else sdpa) goes to both models'
  ``override_config``; remove-padding packs a micro-batch into one sequence, which only flash-attn's varlen
  kernels keep apart, so it is on only with flash-attn. The critic's loader ignores the config
  (``verl.utils.model.load_valuehead_model`` hard-codes flash_attention_2): ``train.verl_env`` has every verl
  process import ``qrewrite.training.rl.verl.critic`` (verl's ``VERL_USE_EXTERNAL_MODULES``), which replaces that
  loader by one that honours it. (``critic.model.external_lib`` is imported only where the config object is
  built, the TaskRunner, not in the worker that loads the critic: H200 run.)
"""

from __future__ import annotations

import importlib.util
import re
import sys
from typing import Any, Mapping

ALGORITHMS = ("ppo", "grpo")
# reward managers registered in verl 0.9.1 verl.experimental.reward_loop.reward_manager
REWARD_MANAGERS = ("naive", "dapo", "gdpo", "remote", "rate_limited")

DEFAULTS: dict[str, Any] = {
    "algorithm": "ppo",  # "ppo" (GAE + critic) | "grpo" (group baseline, no critic)
    "rollout_n": None,  # None -> 1 for ppo, 16 for grpo
    "ppo_epochs": 4,
    "clip_ratio": 0.2,
    "value_loss_coef": 0.5,  # verl: hard-coded 0.5, only 0.5 accepted (see module doc)
    "critic_cliprange_value": None,  # verl default 0.5 when None
    "entropy_coeff": 0.01,
    "max_grad_norm": 0.5,
    # None -> 1e-4 with LoRA, 1e-5 (the design's full fine-tune lr) without: verl's LoRA guide
    # (docs/advance/ppo_lora.rst) advises raising the lr by an order of magnitude for LoRA.
    "actor_lr": None,
    "critic_lr": 1e-4,
    "gamma": 0.99,
    "lam": 0.95,
    "train_batch_size": 32,  # prompts per step (32-64)
    "ppo_mini_batch_size": None,  # prompts per mini-batch; None -> train_batch_size // 4
    "micro_batch_size_per_gpu": 4,
    "max_prompt_length": 512,
    "max_response_length": 128,
    "lora_rank": 16,
    "lora_alpha": 32,
    "target_modules": "all-linear",
    "critic_lora_rank": 0,  # 0 = full fine-tune of the critic (see report: LoRA critic + value head)
    "use_kl_loss": None,  # None -> True for grpo (k=low_var_kl), False for ppo
    "kl_loss_coef": 0.001,
    "rollout_name": "vllm",
    "tensor_model_parallel_size": 1,
    "gpu_memory_utilization": 0.5,
    "temperature": 1.0,
    "n_gpus_per_node": 1,
    "nnodes": 1,
    "total_epochs": 1,
    "total_training_steps": None,
    "save_freq": 10,  # steps between checkpoints (verl also saves the last step); must be > 0
    "test_freq": -1,
    "val_before_train": True,
    "logger": ["console", "tensorboard"],
    "project_name": "qrewrite",
    "experiment_name": "rl",
    "reward_manager": "naive",
    "reward_fn_name": "compute_score",
    "reward_num_workers": None,
    "extra_overrides": [],  # raw "key=value" strings appended last
}

# characters Hydra accepts in an unquoted override value (conservative subset)
_SAFE = re.compile(r"[A-Za-z0-9_./~+@:%-]+")

REQUIRED_PATHS = ("model", "train_files", "val_files", "reward_fn", "checkpoint_dir")
FLASH = "flash_attention_2"
ATTENTION = (FLASH, "sdpa", "eager")
CRITIC_LIB = "qrewrite.training.rl.verl.critic"  # imported by every verl process: the critic loader honouring attention
STRATEGY = "fsdp2"  # LoRA weight sync into vLLM works under FSDP2 only (module doc)


def have_flash_attn() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def pick_attention(configured: str | None, flash_available: bool) -> str:
    """The configured attention; flash_attention_2 (verl's default) only where flash-attn is installed, else sdpa."""
    if configured in (None, "", FLASH):
        return FLASH if flash_available else "sdpa"
    return configured


def _fmt(v: Any) -> str:
    """Format a python value as a Hydra override value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_quote(x) if isinstance(x, str) else _fmt(x) for x in v) + "]"
    if isinstance(v, str):
        return v if _SAFE.fullmatch(v) else _quote(v)
    return str(v)


def _quote(v: str) -> str:
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fmt_path(v: Any) -> Any:
    # Lists of files -> Hydra list of quoted strings; single path -> string.
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v]
    return str(v)


def resolve_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``cfg`` (flat, or with an ``rl`` sub-dict) over DEFAULTS and validate."""
    src = dict(cfg.get("rl", cfg)) if isinstance(cfg.get("rl", None), Mapping) else dict(cfg)
    unknown = sorted(set(src) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown RL config keys: {unknown}")
    c = {**DEFAULTS, **src}
    algo = str(c["algorithm"]).lower()
    if algo not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {c['algorithm']!r}")
    c["algorithm"] = algo
    if c["rollout_n"] is None:
        c["rollout_n"] = 16 if algo == "grpo" else 1
    if algo == "grpo" and int(c["rollout_n"]) < 2:
        raise ValueError("grpo needs rollout_n >= 2 (design: 16 or 32)")
    if c["use_kl_loss"] is None:
        c["use_kl_loss"] = algo == "grpo"
    if c["actor_lr"] is None:
        c["actor_lr"] = 1e-4 if int(c["lora_rank"]) > 0 else 1e-5
    if int(c["save_freq"]) <= 0:
        raise ValueError(f"save_freq must be > 0: verl saves no checkpoint at all otherwise (got {c['save_freq']})")
    if c["ppo_mini_batch_size"] is None:
        c["ppo_mini_batch_size"] = max(1, int(c["train_batch_size"]) // 4)
    if int(c["train_batch_size"]) % int(c["ppo_mini_batch_size"]):
        raise ValueError("train_batch_size must be a multiple of ppo_mini_batch_size")
    if float(c["value_loss_coef"]) != 0.5:
        raise ValueError(
            "verl 0.9 has no value-loss coefficient knob (compute_value_loss hard-codes 0.5); "
            f"got value_loss_coef={c['value_loss_coef']}"
        )
    if c["reward_manager"] not in REWARD_MANAGERS:
        raise ValueError(
            f"reward_manager {c['reward_manager']!r} is not registered in verl 0.9's reward loop; "
            f"use one of {REWARD_MANAGERS} ('batch' only exists in the legacy verl.workers.reward_manager)"
        )
    return c


def build_overrides(cfg: Mapping[str, Any], paths: Mapping[str, Any], *, attention: str = "sdpa") -> list[str]:
    """Hydra override strings for ``python -m verl.trainer.main_ppo``.

    cfg: RL hyper-parameters (keys of DEFAULTS; may be nested under ``"rl"``).
    paths: ``model`` (merged SFT model dir; actor, ref, rollout and critic start
    from it), ``train_files`` / ``val_files`` (parquet path or list),
    ``reward_fn`` (python file with the reward function), ``checkpoint_dir``
    (trainer.default_local_dir); optional ``tokenizer``, ``rollout_data_dir``,
    ``resume_from`` (a complete ``global_step_N`` folder under checkpoint_dir).
    attention: the actor's, reference's and critic's attn_implementation (flash_attention_2 needs flash-attn).
    """
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    missing = [k for k in REQUIRED_PATHS if not paths.get(k)]
    if missing:
        raise ValueError(f"missing paths: {missing}")
    c = resolve_config(cfg)
    grpo = c["algorithm"] == "grpo"
    lora = int(c["lora_rank"]) > 0
    mbs = int(c["micro_batch_size_per_gpu"])
    packed = attention == FLASH  # remove-padding needs flash-attn's varlen kernels (module doc)
    A = "actor_rollout_ref"
    o: list[tuple[str, Any]] = [
        # --- algorithm
        ("algorithm.adv_estimator", "grpo" if grpo else "gae"),
        ("algorithm.gamma", float(c["gamma"])),
        ("algorithm.lam", float(c["lam"])),
        ("algorithm.use_kl_in_reward", False),
        # --- data
        ("data.train_files", _fmt_path(paths["train_files"])),
        ("data.val_files", _fmt_path(paths["val_files"])),
        ("data.prompt_key", "prompt"),
        ("data.reward_fn_key", "data_source"),
        ("data.train_batch_size", int(c["train_batch_size"])),
        ("data.max_prompt_length", int(c["max_prompt_length"])),
        ("data.max_response_length", int(c["max_response_length"])),
        ("data.filter_overlong_prompts", True),
        ("data.truncation", "error"),
        # --- policy model (LoRA on top of the merged SFT model)
        (f"{A}.model.path", str(paths["model"])),
        (f"{A}.model.lora_rank", int(c["lora_rank"])),
        (f"{A}.model.lora_alpha", int(c["lora_alpha"])),
        (f"{A}.model.target_modules", c["target_modules"]),
        (f"{A}.model.use_remove_padding", packed),
        (f"++{A}.model.override_config.attn_implementation", attention),
        (f"{A}.model.enable_gradient_checkpointing", True),
        # --- actor
        (f"{A}.actor.strategy", STRATEGY),  # the reference model's follows it
        (f"{A}.actor.optim.lr", float(c["actor_lr"])),
        (f"{A}.actor.optim.clip_grad", float(c["max_grad_norm"])),
        (f"{A}.actor.ppo_epochs", int(c["ppo_epochs"])),
        (f"{A}.actor.ppo_mini_batch_size", int(c["ppo_mini_batch_size"])),
        (f"{A}.actor.ppo_micro_batch_size_per_gpu", mbs),
        (f"{A}.actor.clip_ratio", float(c["clip_ratio"])),
        (f"{A}.actor.clip_ratio_low", float(c["clip_ratio"])),
        (f"{A}.actor.clip_ratio_high", float(c["clip_ratio"])),
        (f"{A}.actor.entropy_coeff", float(c["entropy_coeff"])),
        (f"{A}.actor.use_kl_loss", bool(c["use_kl_loss"])),
        (f"{A}.actor.kl_loss_coef", float(c["kl_loss_coef"])),
        (f"{A}.actor.kl_loss_type", "low_var_kl"),
        # --- reference policy (only instantiated when use_kl_loss)
        (f"{A}.ref.log_prob_micro_batch_size_per_gpu", mbs),
        # --- rollout
        (f"{A}.rollout.name", c["rollout_name"]),
        (f"{A}.rollout.n", int(c["rollout_n"])),
        (f"{A}.rollout.temperature", float(c["temperature"])),
        (f"{A}.rollout.tensor_model_parallel_size", int(c["tensor_model_parallel_size"])),
        (f"{A}.rollout.gpu_memory_utilization", float(c["gpu_memory_utilization"])),
        (f"{A}.rollout.log_prob_micro_batch_size_per_gpu", mbs),
    ]
    if lora:
        # vLLM serves the LoRA as an adapter; base weights must be the real ones
        # (default load_format=dummy relies on a full weight sync).
        o += [(f"{A}.rollout.load_format", "safetensors"), (f"{A}.rollout.layered_summon", False)]
    # --- critic (PPO only)
    o.append(("critic.enable", not grpo))
    if not grpo:
        o += [
            ("critic.strategy", STRATEGY),
            ("critic.model.path", str(paths["model"])),
            ("critic.model.lora_rank", int(c["critic_lora_rank"])),
            ("critic.model.lora_alpha", int(c["lora_alpha"])),
            ("critic.model.target_modules", c["target_modules"]),
            ("critic.model.use_remove_padding", packed),
            ("++critic.model.override_config.attn_implementation", attention),
            ("critic.model.enable_gradient_checkpointing", True),
            ("critic.optim.lr", float(c["critic_lr"])),
            ("critic.optim.clip_grad", float(c["max_grad_norm"])),
            ("critic.ppo_micro_batch_size_per_gpu", mbs),
            # critic.ppo_epochs / ppo_mini_batch_size interpolate from the actor.
        ]
        if c["critic_cliprange_value"] is not None:
            o.append(("critic.cliprange_value", float(c["critic_cliprange_value"])))
        if paths.get("tokenizer"):
            o.append(("critic.model.tokenizer_path", str(paths["tokenizer"])))
    if paths.get("tokenizer"):
        o.append((f"{A}.model.tokenizer_path", str(paths["tokenizer"])))
    # --- reward (0.9 keys)
    o += [
        ("reward.custom_reward_function.path", str(paths["reward_fn"])),
        ("reward.custom_reward_function.name", c["reward_fn_name"]),
        ("reward.reward_manager.name", c["reward_manager"]),
    ]
    if c["reward_num_workers"] is not None:
        o.append(("reward.num_workers", int(c["reward_num_workers"])))
    # --- trainer
    o += [
        ("trainer.logger", list(c["logger"])),
        ("trainer.project_name", c["project_name"]),
        ("trainer.experiment_name", c["experiment_name"]),
        ("trainer.n_gpus_per_node", int(c["n_gpus_per_node"])),
        ("trainer.nnodes", int(c["nnodes"])),
        ("trainer.default_local_dir", str(paths["checkpoint_dir"])),
        ("trainer.total_epochs", int(c["total_epochs"])),
        ("trainer.save_freq", int(c["save_freq"])),
        ("trainer.test_freq", int(c["test_freq"])),
        ("trainer.val_before_train", bool(c["val_before_train"])),
    ]
    if paths.get("resume_from"):
        o += [("trainer.resume_mode", "resume_path"), ("trainer.resume_from_path", str(paths["resume_from"]))]
    else:
        o.append(("trainer.resume_mode", "disable"))
    if c["total_training_steps"] is not None:
        o.append(("trainer.total_training_steps", int(c["total_training_steps"])))
    if paths.get("rollout_data_dir"):
        o.append(("trainer.rollout_data_dir", str(paths["rollout_data_dir"])))

    out = [f"{k}={_fmt(v)}" for k, v in o]
    out += [str(x) for x in c["extra_overrides"]]
    return out


def build_command(
    cfg: Mapping[str, Any], paths: Mapping[str, Any], python: str | None = None, *, attention: str = "sdpa"
) -> list[str]:
    """argv for launching verl's PPO entry point with our overrides."""
    return [python or sys.executable, "-m", "verl.trainer.main_ppo", *build_overrides(cfg, paths, attention=attention)]
