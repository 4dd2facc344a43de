"""Command lines for ms-swift 4.x (``swift sft`` / ``swift export`` / ``swift infer`` /
``swift rlhf --rlhf_type grpo``) built from plain dicts of hyper-parameters. Running one and reading what the run
left is ``runner``.

The builders are pure: they only turn a dict into an argv list, so the pipeline's
config can fill them and tests can check them without ms-swift installed.

Verified with ms-swift 4.6.0 / transformers 5.19.0 / trl 0.29.1 / peft 0.20.0 on CPU
(see envs/swift.txt). Notes that shaped these command lines:

* ms-swift 4.x calls the LoRA/full switch ``--tuner_type`` (``--train_type`` is gone).
* A local SmolLM2 folder is not in ms-swift's model registry: pass
  ``--model_type llama --template chatml``.
* ``--add_version false`` keeps ``output_dir`` exactly as given (otherwise swift adds a
  ``v0-<timestamp>`` sub-directory); ``--create_checkpoint_symlink true`` adds
  ``output_dir/best`` and ``output_dir/last`` symlinks to the checkpoints.
* ``--check_model false``: otherwise the trainer asks ModelScope whether the local
  model is the latest version (4 network retries, all lost on a machine without the network).
* float32 weights on CPU; ``precision: bfloat16`` trains them under bf16 autocast there (``--bf16 true
  --use_cpu true``), bf16 weights on GPU; ``--fp16 false`` always (``_dtype_args``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from qrewrite.errors import QrewriteError
from qrewrite.hardware import resolve_dtype

# --------------------------------------------------------------------------- defaults

SFT_DEFAULTS: dict[str, Any] = {
    "model_type": "llama",
    "template": "chatml",
    "device": "cpu",              # "cpu" or "cuda"; with precision, decides dtype / bf16
    "precision": None,            # float32 or bfloat16 (None: bfloat16 on cuda, float32 on cpu)
    "lora_rank": 8,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "target_modules": "all-linear",
    "lora_layers": None,          # LoRA on the top N decoder layers only; needs num_layers (see lora_target_regex)
    "num_layers": None,
    "gradient_checkpointing": True,
    "learning_rate": 1e-4,
    "num_train_epochs": 3,
    "max_steps": None,            # overrides epochs when set (> 0)
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "max_length": 512,
    "warmup_ratio": 0.05,
    "eval_steps": 50,
    "save_steps": 50,
    "save_total_limit": 2,
    "logging_steps": 5,
    "load_best_model_at_end": True,
    "metric_for_best_model": "eval_loss",
    "early_stop_interval": None,  # stop after this many evaluations without a better validation loss
    "seed": 42,
    "dataloader_num_workers": 0,
    "dataset_num_proc": 1,
    "system": None,               # default system prompt (rows carry their own)
}

GRPO_DEFAULTS: dict[str, Any] = {
    "model_type": "llama",
    "template": "chatml",
    "device": "cpu",
    "lora_rank": 8,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "target_modules": "all-linear",
    "lora_layers": None,
    "num_layers": None,
    "gradient_checkpointing": True,
    "learning_rate": 1e-5,
    "num_train_epochs": 1,
    "max_steps": None,
    "per_device_train_batch_size": 4,   # completions per device per step; multiple of num_generations
    "gradient_accumulation_steps": 1,
    "num_generations": 4,
    "max_completion_length": 64,
    "max_length": 512,
    "temperature": 0.9,
    "beta": 0.04,                 # KL coefficient; 0 -> no reference model (cheaper)
    "epsilon": 0.2,               # PPO clip range
    "reward_weights": None,       # list aligned with reward_funcs
    "dynamic_sample": False,      # resample prompts whose group has zero reward spread (DAPO)
    "max_resample_times": 3,
    "warmup_ratio": 0.0,
    "save_steps": 50,
    "save_total_limit": 2,
    "logging_steps": 1,
    "log_completions": True,
    "seed": 42,
    "dataloader_num_workers": 0,
    "dataset_num_proc": 1,
}


def _merged(defaults: Mapping[str, Any], hp: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    cfg = dict(defaults)
    cfg.update({k: v for k, v in hp.items() if v is not None})
    missing = [k for k in required if not cfg.get(k)]
    if missing:
        raise QrewriteError(f"missing hyper-parameter(s) {missing} for the swift command")
    return cfg


def _b(value: Any) -> str:
    return "true" if bool(value) else "false"


def _list(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _model_data_args(cfg: Mapping[str, Any]) -> list[str]:
    """Model, template and train data, as `swift sft` and `swift rlhf` both take them; the split is ours
    (split_dataset_ratio 0) and the checkpoint is local (check_model false: no hub lookup)."""
    return ["--model", str(cfg["model"]),
            "--model_type", str(cfg["model_type"]),
            "--template", str(cfg["template"]),
            "--dataset", str(cfg["train_file"]),
            "--split_dataset_ratio", "0",
            "--check_model", "false",
            "--dataset_num_proc", str(cfg["dataset_num_proc"]),
            "--dataloader_num_workers", str(cfg["dataloader_num_workers"])]


def _optim_args(cfg: Mapping[str, Any]) -> list[str]:
    return ["--learning_rate", str(cfg["learning_rate"]),
            *_schedule_args(cfg),
            "--per_device_train_batch_size", str(cfg["per_device_train_batch_size"]),
            "--gradient_accumulation_steps", str(cfg["gradient_accumulation_steps"]),
            "--warmup_ratio", str(cfg["warmup_ratio"])]


def _output_args(cfg: Mapping[str, Any]) -> list[str]:
    """Checkpoints every save_steps (the resume points), TensorBoard scalars, one run folder (no version dirs)."""
    out_dir = str(cfg["output_dir"])
    return ["--save_strategy", "steps",
            "--save_steps", str(cfg["save_steps"]),
            "--save_total_limit", str(cfg["save_total_limit"]),
            "--logging_steps", str(cfg["logging_steps"]),
            "--seed", str(cfg["seed"]),
            "--output_dir", out_dir,
            "--add_version", "false",
            "--report_to", "tensorboard",
            "--logging_dir", str(cfg.get("logging_dir") or os.path.join(out_dir, "runs"))]


def _dtype_args(cfg: Mapping[str, Any]) -> list[str]:
    """The weights' dtype first (export and infer take only it), then the mixed precision, always said: ms-swift
    turns a float32 run into `fp16: true` (inert on a CPU, but what its args.json records). `precision` (resolved
    by the caller, never auto here): bfloat16 is bf16 weights on cuda, float32 weights under bf16 autocast on a CPU
    (the master weights and the optimizer stay float32; transformers needs use_cpu for bf16 there)."""
    device = str(cfg.get("device", "cpu"))
    if cfg.get("precision") not in (None, "float32", "bfloat16"):
        raise QrewriteError(f"precision {cfg.get('precision')!r}: float32 or bfloat16 (auto is resolved by the "
                            "caller: qrewrite.hardware.resolve_dtype)")
    cuda, precision = device.startswith("cuda"), resolve_dtype(cfg.get("precision"), device)
    if precision == "float32":
        return ["--torch_dtype", "float32", "--fp16", "false", "--bf16", "false"]
    if cuda:
        return ["--torch_dtype", "bfloat16", "--fp16", "false", "--bf16", "true"]
    return ["--torch_dtype", "float32", "--fp16", "false", "--bf16", "true", "--use_cpu", "true"]


# The linear layers of a Llama/Qwen2 decoder block, as named under `model.layers.N.`.
_BLOCK_LINEARS = r"(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


def lora_target_regex(top_layers: int, num_layers: int) -> str:
    """peft target regex for the linear layers of the top ``top_layers`` of ``num_layers`` decoder blocks.

    Why: with no trainable weight and no gradient checkpointing below block ``num_layers - top_layers``,
    autograd stops there, so a step's backward pass costs ``top_layers / num_layers`` of the full one
    (on Qwen2.5-0.5B, the top 12 of 24 blocks: about 0.7 of a full step;
    docs/notes/2026-11-23-base-model-and-training-budget.md).
    """
    if not 1 <= top_layers <= num_layers:
        raise QrewriteError(f"lora_layers must be between 1 and the model's {num_layers} layers, got {top_layers}")
    first = num_layers - top_layers
    layers = "|".join(str(i) for i in range(first, num_layers))
    return rf"^model\.layers\.({layers})\.{_BLOCK_LINEARS}$"


def model_num_layers(model_dir: str | os.PathLike) -> int:
    """``num_hidden_layers`` of a Hugging Face model folder (what ``lora_layers`` counts down from)."""
    path = Path(model_dir) / "config.json"
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["num_hidden_layers"])
    except (OSError, ValueError, KeyError) as exc:
        raise QrewriteError(f"cannot read num_hidden_layers: {exc}", file=str(path),
                            hint="lora_layers needs a Hugging Face model folder with a config.json") from None


def _lora_args(cfg: Mapping[str, Any]) -> list[str]:
    argv = ["--tuner_type", "lora",
            "--lora_rank", str(cfg["lora_rank"]),
            "--lora_alpha", str(cfg["lora_alpha"]),
            "--lora_dropout", str(cfg["lora_dropout"])]
    if cfg.get("lora_layers"):
        if not cfg.get("num_layers"):
            raise QrewriteError("lora_layers needs the model's num_layers (config.json num_hidden_layers)")
        argv += ["--target_regex", lora_target_regex(int(cfg["lora_layers"]), int(cfg["num_layers"]))]
    else:
        argv += ["--target_modules", *_list(cfg["target_modules"])]
    # Checkpointing trades compute for memory; off, and with LoRA on top layers only, the backward pass
    # also stops early (peft makes the input embeddings require grad only when it is on).
    return argv + ["--gradient_checkpointing", _b(cfg["gradient_checkpointing"])]


def _schedule_args(cfg: Mapping[str, Any]) -> list[str]:
    out = ["--num_train_epochs", str(cfg["num_train_epochs"])]
    if cfg.get("max_steps"):
        out += ["--max_steps", str(int(cfg["max_steps"]))]
    return out


def _resume_args(cfg: Mapping[str, Any]) -> list[str]:
    # transformers restores weights, optimizer, scheduler, RNG and the step, and skips the batches already
    # seen; the caller passes only a checkpoint it found complete (qrewrite.training.resume).
    ck = cfg.get("resume_from_checkpoint")
    return ["--resume_from_checkpoint", str(ck)] if ck else []


def swift_bin(hp: Mapping[str, Any] | None = None) -> str:
    """The ``swift`` executable: ``hp['swift_bin']``, else next to this Python, else PATH."""
    if hp and hp.get("swift_bin"):
        return str(hp["swift_bin"])
    here = Path(sys.executable).parent / "swift"
    if here.exists():
        return str(here)
    return shutil.which("swift") or "swift"


# --------------------------------------------------------------------------- builders

def sft_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift sft`` with LoRA on a local chat jsonl (rows: ``{"messages": [...]}``).

    Required: model, train_file, val_file, output_dir. Optional: logging_dir (default
    ``output_dir/runs``), resume_from_checkpoint (a ``checkpoint-N`` folder) and everything in
    SFT_DEFAULTS.
    """
    cfg = _merged(SFT_DEFAULTS, hp, ["model", "train_file", "val_file", "output_dir"])
    if cfg["load_best_model_at_end"] and int(cfg["save_steps"]) % int(cfg["eval_steps"]):
        raise QrewriteError(f"save_steps ({cfg['save_steps']}) must be a multiple of eval_steps "
                            f"({cfg['eval_steps']}) when load_best_model_at_end is set")
    argv = [swift_bin(hp), "sft",
            *_model_data_args(cfg),
            "--val_dataset", str(cfg["val_file"]),
            *_dtype_args(cfg),
            *_lora_args(cfg),
            *_optim_args(cfg),
            "--per_device_eval_batch_size", str(cfg["per_device_eval_batch_size"]),
            "--max_length", str(cfg["max_length"]),
            "--eval_strategy", "steps",
            "--eval_steps", str(cfg["eval_steps"]),
            "--load_best_model_at_end", _b(cfg["load_best_model_at_end"]),
            "--metric_for_best_model", str(cfg["metric_for_best_model"]),
            "--greater_is_better", _b(not str(cfg["metric_for_best_model"]).endswith("loss")),
            *_output_args(cfg),
            "--create_checkpoint_symlink", "true"]
    if cfg.get("early_stop_interval"):
        argv += ["--early_stop_interval", str(int(cfg["early_stop_interval"]))]
    if cfg.get("system"):
        argv += ["--system", str(cfg["system"])]
    return argv + _resume_args(cfg)


def export_merge_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift export --merge_lora true``: base model + LoRA checkpoint -> full HF folder.

    Required: adapter (a checkpoint dir holding adapter_config.json + args.json),
    output_dir. ``model`` is optional (swift reads it from the checkpoint's args.json)
    but passing it avoids depending on that file's absolute paths.
    """
    cfg = _merged({"model_type": "llama", "template": "chatml", "device": "cpu"}, hp,
                  ["adapter", "output_dir"])
    argv = [swift_bin(hp), "export", "--adapters", str(cfg["adapter"])]
    if cfg.get("model"):
        argv += ["--model", str(cfg["model"]), "--model_type", str(cfg["model_type"]),
                 "--template", str(cfg["template"])]
    argv += ["--merge_lora", "true", *_dtype_args(cfg)[:2],
             "--output_dir", str(cfg["output_dir"]), "--exist_ok", "true"]
    return argv


def infer_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift infer --infer_backend transformers`` on a jsonl (``val_dataset``) or model only.

    Required: model. Optional: adapter, val_file, result_path, max_new_tokens,
    max_batch_size.
    """
    cfg = _merged({"model_type": "llama", "template": "chatml", "device": "cpu",
                   "max_new_tokens": 64, "temperature": 0.0, "max_batch_size": 8}, hp, ["model"])
    argv = [swift_bin(hp), "infer", "--model", str(cfg["model"]),
            "--model_type", str(cfg["model_type"]), "--template", str(cfg["template"]),
            "--infer_backend", "transformers", *_dtype_args(cfg)[:2],
            "--max_new_tokens", str(cfg["max_new_tokens"]),
            "--temperature", str(cfg["temperature"]),
            "--max_batch_size", str(cfg["max_batch_size"]),
            "--stream", "false"]
    if cfg.get("adapter"):
        argv += ["--adapters", str(cfg["adapter"])]
    if cfg.get("val_file"):
        argv += ["--val_dataset", str(cfg["val_file"])]
    if cfg.get("result_path"):
        argv += ["--result_path", str(cfg["result_path"])]
    return argv


def grpo_cmd(hp: Mapping[str, Any]) -> list[str]:
    """``swift rlhf --rlhf_type grpo`` with LoRA and plugin reward functions.

    Required: model (e.g. the merged SFT folder), train_file (jsonl rows with
    ``messages`` = system+user prompt plus any extra columns, which reach the reward
    functions as keyword arguments), output_dir, plugin (path of the reward plugin
    file), reward_funcs (names registered in ``swift.rewards.orms`` by the plugin).
    Optional: logging_dir, val_file, adapter (start from base + SFT adapter instead of
    a merged model), resume_from_checkpoint, GRPO_DEFAULTS.
    """
    cfg = _merged(GRPO_DEFAULTS, hp, ["model", "train_file", "output_dir", "plugin", "reward_funcs"])
    bs, ng = int(cfg["per_device_train_batch_size"]), int(cfg["num_generations"])
    if ng < 2:
        raise QrewriteError(f"num_generations must be >= 2 for GRPO, got {ng}")
    if (bs * int(cfg["gradient_accumulation_steps"])) % ng:
        raise QrewriteError(
            f"per_device_train_batch_size*gradient_accumulation_steps ({bs}x{cfg['gradient_accumulation_steps']})"
            f" must be a multiple of num_generations ({ng})")
    argv = [swift_bin(hp), "rlhf", "--rlhf_type", "grpo",
            *_model_data_args(cfg),
            "--external_plugins", str(cfg["plugin"]),
            "--reward_funcs", *_list(cfg["reward_funcs"]),
            *_dtype_args(cfg),
            *_lora_args(cfg),
            "--use_vllm", "false",
            "--num_generations", str(ng),
            "--max_completion_length", str(cfg["max_completion_length"]),
            "--max_length", str(cfg["max_length"]),
            "--temperature", str(cfg["temperature"]),
            "--beta", str(cfg["beta"]),
            "--epsilon", str(cfg["epsilon"]),
            *_optim_args(cfg),
            "--log_completions", _b(cfg["log_completions"]),
            *_output_args(cfg)]
    # --create_checkpoint_symlink needs a best checkpoint, i.e. an eval set: without one
    # swift 4.6 crashes at the very end (os.symlink(None, ...)) after training.
    if cfg.get("val_file"):
        argv += ["--create_checkpoint_symlink", "true"]
    if cfg.get("reward_weights"):
        argv += ["--reward_weights", *_list(cfg["reward_weights"])]
    if cfg.get("dynamic_sample"):
        argv += ["--dynamic_sample", "true", "--max_resample_times", str(cfg["max_resample_times"])]
    if cfg.get("adapter"):
        argv += ["--adapters", str(cfg["adapter"])]
    if cfg.get("val_file"):
        argv += ["--val_dataset", str(cfg["val_file"])]
    return argv + _resume_args(cfg)
