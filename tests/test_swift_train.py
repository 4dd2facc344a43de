"""ms-swift 4.x training commands: the pure argv builders (the real CPU run of the same chain, through the
Snakemake rules, is tests/test_pipeline_e2e.py).
"""

from __future__ import annotations

import os

import pytest

from qrewrite.errors import QrewriteError
from qrewrite.training.swift import commands as sc

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
    from qrewrite.training.sft.train import sft_hparams

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


def test_grpo_precision_resolves_like_sfts_for_the_student_and_the_judge(monkeypatch):
    """rl.swift_grpo.precision: auto is bf16 autocast on a CPU with bf16 units and float32 on one without, for the
    student's GRPO and the judge's (rl.swift_grpo under judge.grpo); null stays float32 on a CPU."""
    from qrewrite import hardware
    from qrewrite.config import load_config
    from qrewrite.judge.train import grpo_hparams as judge_grpo
    from qrewrite.training.rl.swift_grpo import grpo_hparams

    cfg = load_config(str(REPO / "config.yaml"))
    cfg["rl"]["swift_grpo"]["precision"] = None
    assert grpo_hparams(cfg)["precision"] == judge_grpo(cfg)["precision"] == "float32"
    cfg["rl"]["swift_grpo"]["precision"] = "auto"
    for has, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(hardware, "cpu_has_bf16", lambda has=has: has)
        for hp in (grpo_hparams(cfg), judge_grpo(cfg)):
            assert hp["precision"] == want
            argv = sc.grpo_cmd({**hp, "model": "/m", "train_file": "/t.jsonl", "output_dir": "/o", "plugin": "/p.py",
                                "reward_funcs": ["r"], "swift_bin": "swift", "num_layers": 24})
            assert _opt(argv, "--bf16") == ("true" if has else "false") and _opt(argv, "--torch_dtype") == "float32"
    assert judge_grpo(cfg)["max_steps"] == cfg["judge"]["grpo"]["max_steps"], "the judge's overrides still apply"
    cfg["train"]["device"] = "cuda"
    assert grpo_hparams(cfg)["precision"] == "bfloat16"


def test_a_run_says_what_a_cpu_without_bf16_units_costs():
    """rules/common.smk prints `speed_note` when a run starts: the shipped config (auto) on a CPU without bf16 units
    is told float32 and the measured slowdown; a setting of bfloat16 there is told it is emulated; nothing is said
    on a CPU with the units, on cuda, or where both settings ask for float32."""
    from qrewrite.config import load_config
    from qrewrite.hardware import speed_note

    cfg = load_config(str(REPO / "config.yaml"))
    assert {cfg["train"]["sft"]["precision"], cfg["rl"]["swift_grpo"]["precision"],
            cfg["eval"]["generation"]["dtype"]} == {"auto"}
    assert speed_note(cfg, has_bf16=True) is None
    assert "float32" in speed_note(cfg, has_bf16=False) and "docs/benchmarks.md" in speed_note(cfg, has_bf16=False)
    cfg["eval"]["generation"]["dtype"] = "bfloat16"
    note = speed_note(cfg, has_bf16=False)
    assert note.startswith("eval.generation.dtype bfloat16") and "emulated" in note
    assert speed_note(cfg, has_bf16=True) is None
    cfg["rl"]["swift_grpo"]["precision"] = "bfloat16"
    assert speed_note(cfg, has_bf16=False).startswith("rl.swift_grpo.precision, eval.generation.dtype bfloat16")
    cfg["train"]["sft"]["precision"] = cfg["eval"]["generation"]["dtype"] = "float32"
    cfg["rl"]["swift_grpo"]["precision"] = "float32"
    assert speed_note(cfg, has_bf16=False) is None
    cfg["train"]["sft"]["precision"] = "auto"
    cfg["train"]["device"] = "cuda"
    assert speed_note(cfg, has_bf16=False) is None
    text = (REPO / "rules" / "common.smk").read_text(encoding="utf-8")
    onstart = text.split("\nonstart:\n", 1)[1].split("\n\n", 1)[0]
    assert "speed_note(config)" in onstart, "printed when the run starts (never on a dry run)"


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
