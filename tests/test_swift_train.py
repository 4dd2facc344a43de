"""ms-swift 4.x training commands: the pure argv builders (the real CPU run of the same chain, through the
Snakemake rules, is tests/test_pipeline_e2e.py).
"""

from __future__ import annotations

import os

import pytest

from qrewrite.errors import QrewriteError
from qrewrite.training import swift_cmds as sc

from conftest import REPO

PLUGIN = REPO / "qrewrite" / "reward" / "swift_plugin.py"


# ----------------------------------------------------------------------------------- pure builders

def _sft_hp(**kw):
    return {"model": "/m", "train_file": "/t.jsonl", "val_file": "/v.jsonl", "output_dir": "/o",
            "swift_bin": "swift", **kw}


def _grpo_hp(**kw):
    return {"model": "/m", "train_file": "/t.jsonl", "output_dir": "/o", "plugin": str(PLUGIN),
            "reward_funcs": ["qrewrite_reward"], "swift_bin": "swift", **kw}


def _opt(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("build,hp", [(sc.sft_cmd, _sft_hp()), (sc.grpo_cmd, _grpo_hp())])
def test_lora_and_model_args(build, hp):
    argv = build(hp)
    assert _opt(argv, "--tuner_type") == "lora" and "--train_type" not in argv
    assert _opt(argv, "--model_type") == "llama" and _opt(argv, "--template") == "chatml"
    assert _opt(argv, "--add_version") == "false" and _opt(argv, "--report_to") == "tensorboard"
    assert _opt(argv, "--logging_dir") == os.path.join("/o", "runs")


@pytest.mark.parametrize("build,hp", [(sc.sft_cmd, _sft_hp), (sc.grpo_cmd, _grpo_hp)])
def test_dtype_args_cpu_vs_cuda(build, hp):
    cpu, cuda = build(hp(device="cpu")), build(hp(device="cuda"))
    # fp16 said false: ms-swift would otherwise record `fp16: true` for a float32 run (inert on a CPU)
    assert [_opt(cpu, k) for k in ("--torch_dtype", "--fp16", "--bf16")] == ["float32", "false", "false"]
    assert "--use_cpu" not in cpu
    assert [_opt(cuda, k) for k in ("--torch_dtype", "--fp16", "--bf16")] == ["bfloat16", "false", "true"]


def test_precision_bf16_on_cpu_is_autocast_over_float32_weights():
    argv = sc.sft_cmd(_sft_hp(device="cpu", precision="bfloat16"))
    assert [_opt(argv, k) for k in ("--torch_dtype", "--fp16", "--bf16", "--use_cpu")] == ["float32", "false", "true", "true"]
    assert _opt(sc.sft_cmd(_sft_hp(device="cuda", precision="float32")), "--torch_dtype") == "float32"
    with pytest.raises(QrewriteError, match="resolved by the caller"):
        sc.sft_cmd(_sft_hp(precision="auto"))


def test_sft_precision_auto_follows_the_cpu(monkeypatch):
    """train.sft.precision: auto is bfloat16 where bf16 is native (cuda, a CPU with bf16 units), float32 elsewhere;
    the schema's default (null) is float32 on a CPU, bfloat16 on cuda, as before the setting existed."""
    from qrewrite import hardware
    from qrewrite.config import load_config
    from qrewrite.training.sft import sft_hparams

    cfg = load_config(str(REPO / "config.yaml"))
    cfg["train"]["sft"].pop("precision", None)
    assert sft_hparams(cfg)["precision"] == "float32"
    cfg["train"]["sft"]["precision"] = "auto"
    assert sft_hparams(cfg)["precision"] == ("bfloat16" if hardware.cpu_has_bf16() else "float32")
    for has, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(hardware, "cpu_has_bf16", lambda has=has: has)
        assert sft_hparams(cfg)["precision"] == want
    cfg["train"]["device"] = "cuda"
    assert sft_hparams(cfg)["precision"] == "bfloat16"
    cfg["train"]["sft"]["precision"] = None
    assert sft_hparams(cfg)["precision"] == "bfloat16"


def test_export_and_infer_dtype():
    exp = sc.export_merge_cmd({"adapter": "/ck", "output_dir": "/m", "model": "/b", "swift_bin": "swift"})
    assert _opt(exp, "--merge_lora") == "true" and _opt(exp, "--torch_dtype") == "float32"
    assert "--bf16" not in sc.infer_cmd({"model": "/m", "device": "cuda", "swift_bin": "swift"})


def test_grpo_batch_must_be_multiple_of_generations():
    with pytest.raises(QrewriteError, match="multiple of num_generations"):
        sc.grpo_cmd(_grpo_hp(per_device_train_batch_size=3, num_generations=2))
    with pytest.raises(QrewriteError, match=">= 2"):
        sc.grpo_cmd(_grpo_hp(num_generations=1))
    argv = sc.grpo_cmd(_grpo_hp(per_device_train_batch_size=4, num_generations=4))
    assert _opt(argv, "--rlhf_type") == "grpo" and _opt(argv, "--use_vllm") == "false"
    assert _opt(argv, "--external_plugins") == str(PLUGIN) and _opt(argv, "--reward_funcs") == "qrewrite_reward"


@pytest.mark.parametrize("build,hp", [(sc.sft_cmd, _sft_hp), (sc.grpo_cmd, _grpo_hp)])
def test_resume_flag_only_when_a_checkpoint_is_given(build, hp):
    assert "--resume_from_checkpoint" not in build(hp())
    argv = build(hp(resume_from_checkpoint="/o/checkpoint-8"))
    assert _opt(argv, "--resume_from_checkpoint") == "/o/checkpoint-8"


@pytest.mark.parametrize("build,hp", [(sc.sft_cmd, _sft_hp), (sc.grpo_cmd, _grpo_hp)])
def test_lora_on_the_top_layers_only(build, hp):
    import re

    argv = build(hp(lora_layers=2, num_layers=24, gradient_checkpointing=False))
    assert "--target_modules" not in argv and _opt(argv, "--gradient_checkpointing") == "false"
    rx = _opt(argv, "--target_regex")
    names = [f"model.layers.{i}.{m}" for i in range(24)
             for m in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")]
    hit = {n.split(".")[2] for n in names if re.fullmatch(rx, n)}
    assert hit == {"22", "23"} and not re.fullmatch(rx, "lm_head") and not re.fullmatch(rx, "model.layers.2.mlp")
    every = build(hp())
    assert _opt(every, "--target_modules") == "all-linear" and _opt(every, "--gradient_checkpointing") == "true"
    with pytest.raises(QrewriteError, match="num_layers"):
        build(hp(lora_layers=2))
    with pytest.raises(QrewriteError, match="between 1 and"):
        build(hp(lora_layers=25, num_layers=24))


def test_model_num_layers_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 30}')
    assert sc.model_num_layers(tmp_path) == 30
    with pytest.raises(QrewriteError, match="num_hidden_layers"):
        sc.model_num_layers(tmp_path / "missing")
