"""The verl GPU check's kit and machinery (tools.gpukit, scripts/gpu_verl_check.sh), on CPU.

* the list of what stays home (envs/gpu-kit-exclude.txt) against the plan `make gpu-kit` resolved: every line
  names a resolved package and gives a reason; nothing the kit carries is on it; the kit's size limits hold;
* slimming a wheel drops exactly the named members, fixes RECORD, and is byte-for-byte repeatable;
* a run is stopped after its global_step_2 checkpoint with every process it started (also one in its own session);
* the run configs pass the project's schema; the collector judges a check's logs.
The rehearsal itself (the same script on CPU up to NCCL init) is `make gpu-rehearsal`; .ci/run builds the kit before
`make test` (and rehearses after it): with QREWRITE_REQUIRE_GPU_KIT=1 (CI) the kit tests fail
instead of skipping when .gpu/ is missing.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from qrewrite.errors import QrewriteError
from tools.gpukit import collect, kit, run_config
from tools.gpukit import wheel_stage as ws
from tools.gpukit.slim import slim_wheel

GPU = REPO / ".gpu"


def built(name: str) -> dict:
    """.gpu/<name> as `make gpu-kit` wrote it (kit.json: the check's kit; learn.json: the learning run's)."""
    if not (GPU / name).is_file():
        if os.environ.get("QREWRITE_REQUIRE_GPU_KIT"):
            pytest.fail(f"no .gpu/{name}: run `make gpu-kit` (.ci/run does, before make test)")
        pytest.skip(f"no .gpu/{name} (make gpu-kit)")
    return json.loads((GPU / name).read_text(encoding="utf-8"))


def built_kit() -> dict:
    return built("kit.json")


def test_every_exclusion_has_a_reason_and_names_a_resolved_package():
    k = built_kit()
    report = json.loads((GPU / "plan.report.json").read_text(encoding="utf-8"))
    exclude = kit.read_exclude()
    kit.check_exclude(report, exclude)  # raises on a line that matches nothing resolved
    assert all(why.startswith(("image", "unused(")) for why in exclude.values()), exclude
    carried = {c["name"] for c in k["carried"]}
    for name in carried:
        assert not any(fnmatch.fnmatchcase(name, p) for p in exclude), f"{name} is carried and excluded"
    resolved = {ws.canon(i["metadata"]["name"]) for i in report["install"]}
    home = {s["name"] for s in k["left_home"]}
    assert carried - {"payload"} | home == resolved  # every resolved package either travels or has a reason
    assert all(s["why"] for s in k["left_home"])
    for must in ("vllm", "verl", "ray", "transformers", "trl", "jieba", "bm25s"):
        assert must in carried, f"{must} must travel"


def test_kit_fits_the_device_calls():
    k = built_kit()
    assert k["total_mib"] < kit.TOTAL_MIB
    assert all(mib <= 58 for mib in k["chunks"].values()), k["chunks"]
    manifest = ws.load_manifest(GPU / "chunks")
    assert sorted(manifest["chunks"]) == sorted(k["chunks"])
    # one gather call per chunk, the last one also runs part 1, then part 2 on the warm machine
    assert len(k["calls"]) == len(k["chunks"]) + 1
    assert "PART=1" in k["calls"][-2]["command"] and "PART=2" in k["calls"][-1]["command"]
    payload = k["payload"]
    assert payload["tiny_model"]["num_hidden_layers"] == 2 and payload["rl_files"]
    assert {"train.parquet", "val.parquet"} <= set(payload["rl_files"])


def test_stale_exclusion_is_an_error(tmp_path):
    report = {"install": [{"metadata": {"name": "vllm", "version": "0.24.0"}}]}
    kit.check_exclude(report, {"vllm": "unused(x)"})
    with pytest.raises(QrewriteError, match="flashinfer-python"):
        kit.check_exclude(report, {"vllm": "unused(x)", "flashinfer-python": "unused(y)"})
    bad = tmp_path / "ex.txt"
    bad.write_text("# c\nfoo\n", encoding="utf-8")
    with pytest.raises(QrewriteError, match="no reason"):
        kit.read_exclude(bad)


def _wheel(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "x = 1\n")
        z.writestr("pkg/jars/big.jar", b"0" * 1000)
        z.writestr("pkg/jars/other.jar", b"1" * 10)
        z.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\nVersion: 1.0\n")
        z.writestr("pkg-1.0.dist-info/RECORD", "pkg/__init__.py,sha256=a,6\npkg/jars/big.jar,sha256=b,1000\n"
                                               "pkg/jars/other.jar,sha256=c,10\npkg-1.0.dist-info/RECORD,,\n")


def test_slim_wheel_drops_members_and_their_record_lines(tmp_path):
    src, a, b = tmp_path / "pkg-1.0-py3-none-any.whl", tmp_path / "a.whl", tmp_path / "b.whl"
    _wheel(src)
    gone = slim_wheel(src, a, ["pkg/jars/*"])
    assert sorted(gone) == ["pkg/jars/big.jar", "pkg/jars/other.jar"]
    with zipfile.ZipFile(a) as z:
        assert "pkg/jars/big.jar" not in z.namelist() and "pkg/__init__.py" in z.namelist()
        record = z.read("pkg-1.0.dist-info/RECORD").decode()
    assert "jars" not in record and "pkg/__init__.py" in record
    slim_wheel(src, b, ["pkg/jars/*"])
    assert a.read_bytes() == b.read_bytes()  # repeatable: the chunks' sha256 do not change between builds
    with pytest.raises(QrewriteError, match="stale"):
        slim_wheel(src, tmp_path / "c.whl", ["pkg/lib/*.a"])


FAKE_RUN = """
set -e
R=$1
( sleep 300 ) &                 # a child of the run
setsid bash -c 'sleep 301' &    # one that leaves the process group: found by the inherited mark
for s in 1 2 3 4; do
  sleep 3  # the phase polls every second: it stops the run before step 3
  mkdir -p $R/global_step_$s/actor $R/global_step_$s/critic; touch $R/global_step_$s/data.pt
  echo $s > $R/latest_checkpointed_iteration.txt
  echo "step:$s - timing_s/gen:1.5 - critic/score/mean:0.$s - timing_s/update_critic:0.25"
done
sleep 100
"""


def _sleepers() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    # the two this test starts, not any `sleep 30...` on the machine (another worker's, a user's)
    return [p for p in ps if p.strip() in ("sleep 300", "sleep 301") or "sleep 301" in p and "bash -c" in p]


@pytest.mark.slow
def test_phase_stops_the_run_after_its_checkpoint_with_every_process(tmp_path):
    run = tmp_path / "run"
    script = tmp_path / "fake.sh"
    script.write_text(FAKE_RUN, encoding="utf-8")
    status = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, "-m", "tools.gpukit.phase", "--name", "ppo_a", "--log",
                           str(tmp_path / "ppo_a.log"), "--status", str(status), "--budget", "60",
                           "--kill-after-step", "2", "--run-dir", str(run), "--critic", "--",
                           "bash", str(script), str(run)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(status.read_text())
    assert st["step_at_kill"] == 2 and st["killed"].startswith("after complete global_step_2")
    assert st["wall_s"] < 30
    assert not _sleepers(), _sleepers()
    rows = collect.step_metrics(tmp_path / "ppo_a.log")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["critic/score/mean"] == pytest.approx(0.2) and rows[1]["timing_s/update_critic"] == 0.25


def test_phase_budget_stops_a_run_that_hangs(tmp_path):
    status = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, "-m", "tools.gpukit.phase", "--name", "grpo", "--log",
                           str(tmp_path / "g.log"), "--status", str(status), "--budget", "2", "--",
                           "bash", "-c", "echo start; sleep 302"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1  # a budget stop is a failure of the run
    st = json.loads(status.read_text())
    assert st["killed"] == "budget of 2 s" and st["step_at_kill"] is None
    assert "sleep 302" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.mark.parametrize("rehearse", [False, True])
def test_run_configs_pass_the_schema(tmp_path, rehearse):
    from qrewrite.config import load_config

    base = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    for name in ("ppo", "grpo"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(run_config.run_config(base, "fivedoctors", name, rehearse=rehearse),
                                       allow_unicode=True), encoding="utf-8")
        cfg = load_config(path)
        v = cfg["rl"]["verl"]
        assert cfg["rl"]["backend"] == "verl" and cfg["train"]["device"] == "cuda"
        assert [t["name"] for t in cfg["tenants"]] == ["fivedoctors"]
        assert v["algorithm"] == name and v["n_gpus_per_node"] == 1 and v["save_freq"] == 2
        assert v["total_training_steps"] == 4
        assert (v["rollout_n"], name) in ((1, "ppo"), (16, "grpo"))
        assert any("kv_cache_memory_bytes" in o for o in v["extra_overrides"])
        assert any(o.endswith(f"qrw-ray-{name}") for o in v["extra_overrides"])  # a Ray folder of its own
        assert any("num_gpus=1" in o for o in v["extra_overrides"]) is rehearse


def _check_dir(tmp_path: Path, *, resumed: int | None, steps_b: list[int]) -> Path:
    w = tmp_path / "w"
    for d in ("logs", "status", "stats", "models/ppo", "models/grpo"):
        (w / d).mkdir(parents=True, exist_ok=True)
    line = lambda s: f"[ 10.0] (TaskRunnerV1 pid=1) step:{s} - timing_s/gen:1.0 - critic/score/mean:-0.5"  # noqa: E731
    # verl's validation before training (val_before_train), logged under the step it starts from: the H200's format
    val = lambda s: (f"[  5.0] (TaskRunnerV1 pid=1) step:{s} - val-core/fivedoctors/reward/mean@1:"  # noqa: E731
                     "np.float64(-0.8444883538329083) - val-aux/fivedoctors/score/mean@1:np.float64(-0.8444)")
    (w / "logs/ppo_a.log").write_text("\n".join([val(0)] + [line(s) for s in (1, 2)]) + "\n")
    (w / "logs/ppo_b.log").write_text("[  1.0] + python -m verl.trainer.main_ppo a=b trainer.resume_mode=resume_path "
                                      "trainer.resume_from_path=/tmp/qrw-gpu/runs/ppo/global_step_2\n"
                                      + "\n".join([val(steps_b[0] - 1)] + [line(s) for s in steps_b]) + "\n")
    (w / "logs/grpo.log").write_text("\n".join([val(0)] + [line(s) for s in (1, 2, 3, 4)]) + "\n")
    for name, st in {"ppo_a": {"rc": None, "step_at_kill": 2, "killed": "after complete global_step_2"},
                     "ppo_b": {"rc": 0, "step_at_kill": None, "killed": None},
                     "grpo": {"rc": 0, "step_at_kill": None, "killed": None}}.items():
        (w / f"status/{name}.json").write_text(json.dumps({"name": name, "wall_s": 1.0, "tail": [], **st}))
    (w / "stats/ppo.json").write_text(json.dumps({"resumed_from_step": resumed}))
    for m in ("ppo", "grpo"):
        (w / f"models/{m}/model.safetensors").write_bytes(b"x")
        (w / f"models/{m}/lineage.json").write_text("{}")
    return w


def test_collect_passes_a_complete_check_and_fails_a_resume_that_started_over(tmp_path):
    good = _check_dir(tmp_path / "a", resumed=2, steps_b=[3, 4])
    s = collect.collect(good, tmp_path / "a" / "out")
    checks = collect.verdict(s, good, rehearsal=False)
    assert all(ok for _, ok, _ in checks), [c for c in checks if not c[1]]
    assert [r["step"] for r in s["steps"]["grpo"]] == [1, 2, 3, 4]  # the validation line is not a step
    assert s["validation"]["grpo"] == [{"step": 0, "t_s": 5.0, "val-core/fivedoctors/reward/mean@1": -0.8445}]
    assert [v["step"] for v in s["validation"]["ppo_b"]] == [2]
    bad = _check_dir(tmp_path / "b", resumed=None, steps_b=[1, 2, 3, 4])
    failed = {c for c, ok, _ in collect.verdict(collect.collect(bad, tmp_path / "b" / "out"), bad, rehearsal=False)
              if not ok}
    assert failed == {"ppo_b resumed from step 2 (trainer.resume_from_path in its command)",
                      "ppo_b trained steps 3 and 4 only"}
    part1 = {c for c, _, _ in collect.verdict(s, good, rehearsal=False, part="1")}
    assert part1 == {"ppo_a stopped after its global_step_2", "grpo trained its 4 steps",
                     "models/grpo: merged model with lineage"}


def test_rehearsal_verdict_wants_the_gpu_boundary(tmp_path):
    w = tmp_path / "w"
    (w / "logs").mkdir(parents=True)
    (w / "status").mkdir()
    ok_log = ("[validate_config] All configuration checks passed successfully!\nINFO -- Started a local Ray instance.\n"
              "INFO create worker group dict_keys(['actor_rollout'])\n")
    for name, err in (("ppo_a", "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"),
                      ("grpo", "ModuleNotFoundError: No module named 'qrewrite'")):
        (w / f"logs/{name}.log").write_text(ok_log + err + "\n")
        (w / f"status/{name}.json").write_text(json.dumps({"name": name, "rc": 2, "wall_s": 1.0, "killed": None,
                                                           "step_at_kill": None, "tail": [err]}))
    s = collect.collect(w, tmp_path / "out")
    checks = {c: ok for c, ok, _ in collect.verdict(s, w, rehearsal=True)}
    assert all(ok for c, ok in checks.items() if c.startswith("ppo_a"))
    assert not checks["grpo: stopped where a GPU is needed"]
    assert not checks["grpo: not stopped by an import or config error"]
