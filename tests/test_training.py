"""Training stages around the frameworks: RL data, the reward monitor, the env switch, the verl command.

The real ms-swift runs are in tests/test_pipeline_e2e.py (Snakemake, CPU); verl's own loaders in
tests/test_verl.py and here (our rl-data parquet through RLHFDataset).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from qrewrite.config import load_config
from qrewrite.errors import QrewriteError
from qrewrite.paths import tenant_paths
from qrewrite.reward.monitor import batch_scalars, counter_scalars
from qrewrite.reward.ground_truth import parse_ground_truth
from test_reward_frameworks import train_python
from test_verl import run_verl


def _detail(score, win, **kw):
    d = {"score": score, "judge_term": 0.0, "retrieval_term": 0.1, "win_term": 0.5 if win > 0 else -0.3 * (win < 0),
         "student_top1": 0.7, "teacher_top1": 0.6, "q_student": 0.5, "q_teacher": 0.4, "judge_sampled": 0, "win": win}
    d.update(kw)
    return d


def test_batch_scalars_means_and_rates():
    s = batch_scalars([_detail(0.5, 1, judge_sampled=1), _detail(-0.2, -1), _detail(0.0, 0), _detail(0.3, 1)])
    assert s["reward_mean"] == pytest.approx(0.15)
    assert (s["win_rate"], s["tie_rate"], s["loss_rate"]) == (0.5, 0.25, 0.25)
    assert s["judge_sampled_share"] == 0.25 and s["student_top1"] == pytest.approx(0.7)
    assert batch_scalars([]) == {}


def test_counter_scalars_sum_tenants_and_hit_rates():
    stats = {"a": {"rag_calls": 30, "rag_cache_hits": 5, "rag_disk_hits": 5, "judge_calls": 4, "judge_cache_hits": 1,
                   "judge_memo_hits": 3, "judge_provider": "rule"},
             "b": {"rag_calls": 10, "rag_cache_hits": 0, "rag_disk_hits": 0, "judge_calls": 0, "judge_cache_hits": 0,
                   "judge_memo_hits": 0}}
    c = counter_scalars(stats)
    assert c["rag_calls"] == 40 and c["judge_calls"] == 4
    assert c["rag_cache_hit_rate"] == pytest.approx(10 / 50) and c["judge_cache_hit_rate"] == pytest.approx(0.5)
    assert counter_scalars({})["rag_cache_hit_rate"] == 0.0


MONITOR_DRIVER = """
import json, os, sys
from qrewrite.reward.monitor import get_monitor
from qrewrite.training.rl.summary import summarize_curve
from tensorboard.backend.event_processing import event_accumulator
tb = os.environ["QREWRITE_TB_DIR"]
m = get_monitor()
d = lambda s, w: {"score": s, "judge_term": 0.0, "retrieval_term": s, "win_term": 0.0, "student_top1": 0.5,
                  "teacher_top1": 0.5, "q_student": 0.5, "q_teacher": 0.5, "judge_sampled": 0, "win": w}
stats = {"t": {"rag_calls": 3, "rag_cache_hits": 1, "rag_disk_hits": 0, "judge_calls": 0, "judge_cache_hits": 0,
               "judge_memo_hits": 0}}
for i in range(6):  # flush_every=4 rollouts: 12 rollouts of 2 -> 3 flushes
    m.record([d(0.1 * i, 1), d(0.1 * i, -1)], stats)
m.writer.close()
files = [os.path.join(tb, f) for f in os.listdir(tb) if "tfevents" in f]
ea = event_accumulator.EventAccumulator(files[0]); ea.Reload()
json.dump({"tags": ea.Tags()["scalars"], "reward": [e.value for e in ea.Scalars("qrewrite/reward_mean")],
           "summary": summarize_curve(tb)}, open(sys.argv[-1], "w"))
"""


@pytest.mark.slow
def test_reward_monitor_writes_tensorboard_and_curve(tmp_path):
    py = train_python("swift")
    drv = tmp_path / "drv.py"
    drv.write_text(MONITOR_DRIVER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "QREWRITE_TB_DIR": str(tmp_path / "tb"),
           "QREWRITE_TB_FLUSH_EVERY": "4"}
    proc = subprocess.run([str(py), str(drv), str(tmp_path / "out.json")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "out.json").read_text())
    for tag in ("reward_mean", "win_rate", "judge_term", "retrieval_term", "win_term", "student_top1",
                "teacher_top1", "rag_calls", "judge_calls", "rag_cache_hit_rate"):
        assert f"qrewrite/{tag}" in res["tags"], tag
    assert res["reward"] == pytest.approx([0.05, 0.25, 0.45])  # means of rollouts (0,0,.1,.1), (.2,.2,.3,.3)...
    s = res["summary"]
    assert s["reward_steps"] == 3 and s["rollouts_scored"] == 12
    assert s["first"]["reward_mean"] == pytest.approx(0.05) and s["last"]["reward_mean"] == pytest.approx(0.45)
    assert s["last"]["win_rate"] == 0.5 and s["rag_calls"] == 3 and s["rag_cache_hit_rate"] == pytest.approx(0.25)


# ------------------------------------------------------------------------------------------- rl-data

@pytest.fixture(scope="module")
def data_project(tmp_path_factory):
    """fivedoctors' data half (first 80 queries) in a scratch project, plus `qrewrite rl-data`."""
    from conftest import Project

    project = Project(tmp_path_factory.mktemp("rl") / "proj")
    cfg = project.config
    cfg["tenants"] = [t for t in cfg["tenants"] if t["name"] == "fivedoctors"]
    project.set_config(cfg)
    project.keep_queries("fivedoctors", 80)
    for stage in ("build-excel", "ingest", "teacher", "validate", "split"):
        project.stage(stage)
    p = tenant_paths("fivedoctors")
    project.qrewrite("rl-data", "--config", "config.yaml", "--tenant", "fivedoctors", "--train", p["train"],
                     "--val", p["val"], "--queries", p["queries"], "--out-dir", p["rl_dir"])
    return project


@pytest.mark.slow
def test_rl_data_matches_sft_prompts_and_teacher_side(data_project):
    p = tenant_paths("fivedoctors")
    sft = data_project.read_jsonl(p["train"])
    rows = data_project.read_jsonl(p["rl_train_swift"])
    # the red-team rows mixed in at rl.red_team_share are tests/test_red_team_gold.py's; the rest are SFT's, in order
    rows = [r for r in rows if "red_team" not in parse_ground_truth(r["ground_truth"])]
    assert len(rows) == len(sft) > 15  # 80 queries: the train split after the validation floor (split.val_min)
    queries = {q["id"]: q for q in data_project.read_jsonl(p["queries"])}
    for s, r in zip(sft, rows):
        meta = s["meta"]
        # the prompt is exactly what SFT trained on, minus the answer
        assert r["messages"] == s["messages"][:-1] and s["messages"][-1]["role"] == "assistant"
        assert r["tenant"] == "fivedoctors"
        gt = parse_ground_truth(r["ground_truth"])
        q = queries[meta["query_id"]]
        assert gt["query_id"] == meta["query_id"] and gt["query"] == q["query"]
        assert (gt["profile"], gt["history"]) == (q.get("profile") or "", q.get("history") or "")
        assert gt["teacher_rewrite"] == s["messages"][-1]["content"]
        assert gt["teacher_retrieval"]["top1"] == meta["teacher_top1"]
        assert gt["teacher_retrieval"]["mean_top3"] == meta["teacher_mean_top3"]
        assert gt["gold_doc_ids"] == meta["gold_doc_ids"]


@pytest.mark.slow
def test_rl_data_unknown_query_id_names_file_and_row(data_project, tmp_path):
    p = tenant_paths("fivedoctors")
    bad = tmp_path / "train.jsonl"
    rows = data_project.read_jsonl(p["train"])
    rows[2]["meta"]["query_id"] = "q-does-not-exist"
    bad.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "rl"
    proc = data_project.qrewrite("rl-data", "--config", "config.yaml", "--tenant", "fivedoctors", "--train", str(bad),
                                 "--val", p["val"], "--queries", p["queries"], "--out-dir", str(out), check=False)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "row 3" in proc.stderr and "q-does-not-exist" in proc.stderr
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


RLHF_DRIVER = """
import json, os, sys
repo, parquet, out_path = sys.argv[1], sys.argv[2], sys.argv[-1]
from transformers import AutoTokenizer
from qrewrite.training.base_model.convert import find_gguf
from verl_compose_check import compose_verl_config
from qrewrite.training.rl.verl.overrides import build_overrides
from omegaconf import open_dict
g = find_gguf()
tok_dir = os.path.join(os.path.dirname(out_path), "tok")
AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(tok_dir)
from verl.utils import hf_tokenizer
tok = hf_tokenizer(tok_dir)
cfg = compose_verl_config(build_overrides({"algorithm": "ppo"}, dict(model=tok_dir, train_files=parquet,
      val_files=parquet, reward_fn=repo + "/qrewrite/reward/verl_reward.py", checkpoint_dir="/tmp/ck")))
with open_dict(cfg):
    cfg.data.cache_dir = os.path.join(os.path.dirname(out_path), "cache")
from verl.utils.dataset.rl_dataset import RLHFDataset
ds = RLHFDataset(data_files=cfg.data.train_files, tokenizer=tok, config=cfg.data)
it = ds[0]
json.dump({"len": len(ds), "raw_prompt": list(it["raw_prompt"]), "data_source": it["data_source"],
           "gt": it["reward_model"]["ground_truth"], "extra": dict(it["extra_info"])}, open(out_path, "w"),
          ensure_ascii=False, default=str)
"""


@pytest.mark.slow
def test_rl_data_parquet_loads_with_verl_rlhfdataset(data_project, tmp_path):
    p = tenant_paths("fivedoctors")
    res = run_verl(RLHF_DRIVER, tmp_path, str(data_project.root / p["rl_train"]))
    sft = data_project.read_jsonl(p["train"])
    swift = data_project.read_jsonl(p["rl_train_swift"])  # the same rows in ms-swift's layout
    n_red = sum("red_team" in parse_ground_truth(r["ground_truth"]) for r in swift)
    assert n_red > 0 and res["len"] == len(swift) == len(sft) + n_red  # red-team rows mixed in at rl.red_team_share
    assert res["raw_prompt"] == sft[0]["messages"][:-1] and res["data_source"] == "fivedoctors"
    assert parse_ground_truth(res["gt"])["teacher_rewrite"] == sft[0]["messages"][-1]["content"]
    assert res["extra"]["query_id"] == sft[0]["meta"]["query_id"] and res["extra"]["split"] == "train"


# ---------------------------------------------------------------------------------------- env switch

@pytest.mark.slow
def test_training_command_without_its_env_says_how_to_build_it(data_project):
    env = {"QREWRITE_SWIFT_PYTHON": "/nonexistent/python"}
    proc = data_project.qrewrite("base-model", "--config", "config.yaml", "--out", "models/base", env=env, check=False)
    if proc.returncode == 0:
        pytest.fail("base-model ran although ms-swift is importable in the test env? " + proc.stderr[-500:])
    assert "needs the swift environment" in proc.stderr and "make .venvs/swift/.installed" in proc.stderr
    assert not (data_project.root / "models" / "base").exists()


@pytest.mark.slow
def test_base_model_from_path_links_a_local_folder(data_project, tmp_path):
    folder = tmp_path / "Qwen3-tiny"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    cfg = data_project.config
    cfg["base_model"] = {"source": "path", "path": str(folder), "model_type": "qwen3", "template": "qwen3"}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    out = tmp_path / "models" / "base"
    out.parent.mkdir()
    data_project.qrewrite("base-model", "--config", str(path), "--out", str(out))
    assert out.is_symlink() and out.resolve() == folder.resolve()
    (folder / "config.json").unlink()
    proc = data_project.qrewrite("base-model", "--config", str(path), "--out", str(out), check=False)
    assert proc.returncode == 2 and "not a Hugging Face model folder" in proc.stderr
    cfg["base_model"]["layers"] = 2  # a linked folder is used as it is: cutting it is refused, not ignored
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    proc = data_project.qrewrite("base-model", "--config", str(path), "--out", str(out), check=False)
    assert proc.returncode == 2 and "base_model.layers" in proc.stderr


def test_keep_layers_cuts_the_decoder_blocks_and_refuses_more_than_there_are():
    """base_model.layers (the tests' TINY_BASE): the first N blocks, config to match; embeddings and head stay."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from qrewrite.training.base_model.convert import keep_layers

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=5, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    first = [p.detach().clone() for p in model.model.layers[1].parameters()]
    keep_layers(model, 2)
    assert len(model.model.layers) == 2 and model.config.num_hidden_layers == 2
    assert all(torch.equal(a, b) for a, b in zip(first, model.model.layers[1].parameters()))
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 64)
    for n in (0, 3):
        with pytest.raises(QrewriteError, match="decoder blocks"):
            keep_layers(model, n)


def test_a_conversion_is_reused_only_with_the_settings_it_was_made_with(tmp_path):
    """convert_gguf keeps a complete folder only when its .conversion.json names the same layers and tie: the GPU
    kit's student rebuild reuses its base folder across kits, and a base cut to 4 blocks is not the full one."""
    from qrewrite.training.base_model.convert import CONVERSION_FILE, REQUIRED_FILES, conversion_matches

    for name in REQUIRED_FILES:
        (tmp_path / name).write_text("{}", encoding="utf-8")
    assert not conversion_matches(tmp_path, layers=None, tie=True)  # converted before the file existed: again
    (tmp_path / CONVERSION_FILE).write_text(json.dumps({"gguf": "q.gguf", "layers": 4, "tie": True}), encoding="utf-8")
    assert conversion_matches(tmp_path, layers=4, tie=True)
    assert not conversion_matches(tmp_path, layers=None, tie=True)
    assert not conversion_matches(tmp_path, layers=2, tie=True)
    assert not conversion_matches(tmp_path, layers=4, tie=False)
    (tmp_path / "model.safetensors").unlink()
    assert not conversion_matches(tmp_path, layers=4, tie=True)  # incomplete


# --------------------------------------------------------------------------------------------- verl

def test_verl_rl_command_from_the_cluster_config(tmp_path):
    """The schema defaults are the design's cluster values; the generated verl command carries them."""
    from qrewrite.training.rl.verl.train import verl_env, verl_paths
    from qrewrite.training.rl.verl.overrides import build_command

    cfg = load_config(REPO / "config.yaml")
    cfg["rl"] = load_config(REPO / "config.yaml")["rl"] | {"backend": "verl"}
    cluster = json.loads(json.dumps(cfg["rl"]["verl"]))
    argv = build_command(cluster, verl_paths(model="models/fd/sft-merged", train="t.parquet", val="v.parquet",
                                             run_dir="ck"), python=sys.executable)
    ov = dict(a.split("=", 1) for a in argv[3:])
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert ov["algorithm.adv_estimator"] == "gae" and ov["critic.enable"] == "true"
    assert ov["actor_rollout_ref.actor.ppo_epochs"] == "4" and ov["actor_rollout_ref.actor.clip_ratio"] == "0.2"
    assert ov["actor_rollout_ref.actor.entropy_coeff"] == "0.01"
    assert ov["actor_rollout_ref.actor.optim.clip_grad"] == "0.5" and ov["critic.optim.clip_grad"] == "0.5"
    # LoRA actor: 10x the design's full fine-tune 1e-5, as verl's LoRA guide advises; the critic is fully tuned
    assert ov["actor_rollout_ref.actor.optim.lr"] == "0.0001" and ov["critic.optim.lr"] == "0.0001"
    assert ov["actor_rollout_ref.model.lora_rank"] == "16" and ov["critic.model.lora_rank"] == "0"
    assert ov["trainer.save_freq"] == "10" and ov["trainer.resume_mode"] == "disable"
    assert ov["algorithm.gamma"] == "0.99" and ov["algorithm.lam"] == "0.95"
    assert ov["data.train_batch_size"] == "32" and ov["actor_rollout_ref.rollout.name"] == "vllm"
    assert ov["trainer.logger"] == "['console','tensorboard']"
    assert ov["reward.custom_reward_function.path"].endswith("qrewrite/reward/verl_reward.py")
    env = verl_env(cfg, config_path="config.yaml", tb_dir=str(tmp_path / "tb"))
    assert env["TENSORBOARD_DIR"] == env["QREWRITE_TB_DIR"] == str(tmp_path / "tb")
    assert env["QREWRITE_TB_FLUSH_EVERY"] == "32"  # 32 prompts x 1 rollout (ppo) per step


def test_verl_run_checks_the_slurm_allocation():
    from qrewrite.errors import QrewriteError
    from qrewrite.training.rl.verl.train import check_allocation

    check_allocation({"nnodes": 2, "n_gpus_per_node": 8}, {"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "8"})
    check_allocation({"nnodes": 2, "n_gpus_per_node": 8}, {})  # outside Slurm: nothing to compare
    with pytest.raises(QrewriteError, match="rl.verl.nnodes is 2 but this Slurm job has 1"):
        check_allocation({"nnodes": 2, "n_gpus_per_node": 8}, {"SLURM_JOB_NUM_NODES": "1"})


@pytest.mark.slow
def test_multinode_verl_rule_runs_through_the_ray_launcher(project):
    """nnodes > 1: the rl rule drops Snakemake's container and wraps the command in slurm/ray_on_slurm.sh."""
    project.update(rl={"backend": "verl", "verl": {"nnodes": 2, "n_gpus_per_node": 8}})
    exe = os.path.join(os.path.dirname(sys.executable), "snakemake")
    proc = subprocess.run([exe, "-s", str(REPO / "Snakefile"), "-d", str(project.root), "--configfile",
                           str(project.config_path), "-n", "-p", "--forceall", "models/fivedoctors/rl"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if "qrewrite rl " in l)
    launcher = f"{REPO}/slurm/ray_on_slurm.sh --image containers/verl.sif -- qrewrite rl "
    assert line.removeprefix("Shell command: ").startswith(launcher), line
    assert os.access(REPO / "slurm" / "ray_on_slurm.sh", os.X_OK)


def test_reward_trend_needs_two_steps_per_third_and_compares_the_rise_with_its_noise():
    from qrewrite.training.rl.summary import reward_trend

    assert reward_trend([0.1, 0.2])["rise"] is None  # no third to compare
    few = reward_trend([0.0, 0.1, 0.5, 0.2, 0.3])  # one step per third: a rise, no verdict
    assert few["rise"] == pytest.approx(0.3) and few["rose_beyond_noise"] is None
    steady = reward_trend([0.0, 0.02, 0.01, 0.2, 0.3, 0.4, 0.61, 0.6, 0.62])
    assert steady["rose_beyond_noise"] is True and steady["rise"] == pytest.approx(0.6, abs=1e-3)
    noisy = reward_trend([0.5, -0.5, 0.0, 0.1, 0.0, 0.2, -0.4, 0.6, 0.3])
    assert noisy["rose_beyond_noise"] is False and noisy["se"] > 0


def test_report_rolling_mean():
    from qrewrite.report.build import rolling_mean

    assert rolling_mean([(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)], 2) == [(2, 0.5), (3, 1.5), (4, 2.5)]
    assert rolling_mean([(1, 0.0)], 4) == []


def test_gguf_read_once_shares_one_reader_and_name_map_and_restores_gguf(tmp_path):
    """The conversion's speed-up (base_model.gguf_read_once): inside it, every GGUFReader of one file is the same
    parsed reader and the tensor-name map is built once per (arch, layers); outside, gguf is as it was."""
    import gguf
    import numpy as np

    from qrewrite.training.base_model.convert import gguf_read_once

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    arch = gguf.MODEL_ARCH.LLAMA
    with gguf_read_once():
        a, b = gguf.GGUFReader(str(path)), gguf.GGUFReader(str(tmp_path / "." / "tiny.gguf"))
        assert a is b and isinstance(a, reader) and a.tensors[0].name == "token_embd.weight"
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 2).get_name("model.embed_tokens") == "token_embd"
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))
