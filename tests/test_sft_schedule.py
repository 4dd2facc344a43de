"""SFT is set in epochs: the steps follow from the tenant's rows (qrewrite.training.sft.train.schedule), validation loss is
measured a few times an epoch with the best checkpoint kept and early stopping, and an optional wall-clock cap stops
the trainer's whole process group."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO, TINY_BASE, Project
from qrewrite.errors import QrewriteError
from qrewrite.training.swift import runner
from qrewrite.training.sft.train import schedule

HP = {"num_train_epochs": 2, "evals_per_epoch": 4, "per_device_train_batch_size": 4,
      "gradient_accumulation_steps": 1, "max_steps": None}


def test_steps_follow_the_rows_and_the_run_ends_on_an_evaluation():
    small, big = schedule(HP, 200), schedule(HP, 400)
    # 2 epochs of 50 steps, 8 evaluations: every 13 steps, rounded up to end on the 8th (104)
    assert (small["steps_per_epoch"], small["planned_steps"], small["eval_steps"]) == (50, 104, 13)
    assert (big["steps_per_epoch"], big["planned_steps"], big["eval_steps"]) == (100, 200, 25)
    for n in (37, 200, 400, 1001):
        for epochs in (0.5, 1, 2, 3):
            plan = schedule({**HP, "num_train_epochs": epochs}, n)
            want = math.ceil(epochs * plan["steps_per_epoch"])
            assert plan["planned_steps"] % plan["eval_steps"] == 0           # ends on an evaluation
            assert want <= plan["planned_steps"] < want + plan["planned_steps"] // plan["eval_steps"] + 1
    # the global batch grows with the processes (8 GPUs) and the accumulation
    assert schedule({**HP, "gradient_accumulation_steps": 8}, 640, world_size=8)["steps_per_epoch"] == 3
    assert schedule({**HP, "max_steps": 5}, 400)["planned_steps"] <= 5        # a smoke test's cap


def _rows(n: int) -> list[dict]:
    src = [json.loads(line) for line in (REPO / "data/demo/fivedoctors.queries.jsonl").read_text().splitlines()]
    return [{"messages": [{"role": "system", "content": "Rewrite the question."},
                          {"role": "user", "content": r["query"]},
                          {"role": "assistant", "content": r["query"]}]} for r in src[:n]]


@pytest.mark.slow
def test_a_tenant_twice_the_size_trains_twice_the_steps(tmp_path, smollm2_base):
    """Two real `qrewrite sft` runs (SmolLM2, 1 epoch, batch 4) on 8 and 16 rows: 2 and 4 optimizer steps. The
    first trains in float32, the second under bf16 autocast (train.sft.precision), and each run's args.json (what
    ms-swift records) says which: fp16 false in both, never the inert `fp16: true` it wrote for float32 runs."""
    project = Project(tmp_path / "proj")
    cfg = project.config
    cfg["base_model"] = dict(TINY_BASE)
    cfg["train"] = {"device": "cpu", "threads": 1,
                    "sft": {"num_train_epochs": 1, "evals_per_epoch": 1, "early_stop_evals": None,
                            "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4,
                            "gradient_accumulation_steps": 1, "max_length": 256, "logging_steps": 1}}
    project.set_config(cfg)
    steps = {}
    for n, precision in ((8, "float32"), (16, "bfloat16")):
        cfg["train"]["sft"]["precision"] = precision
        project.set_config(cfg)
        d = project.root / f"d{n}"
        d.mkdir()
        for name, rows in (("train", _rows(n)), ("val", _rows(4))):
            (d / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        project.qrewrite("sft", "--config", "config.yaml", "--tenant", "fivedoctors", "--base", str(smollm2_base),
                         "--train", f"d{n}/train.jsonl", "--val", f"d{n}/val.jsonl", "--out", f"d{n}/adapter",
                         "--run-dir", f"d{n}/run", "--tb", f"d{n}/tb", "--stats", f"d{n}/stats.json", "--threads", "1",
                         timeout=900)
        stats = json.loads((d / "stats.json").read_text())
        assert stats["schedule"]["train_rows"] == n and stats["stopped"] == "epochs done"
        assert stats["hparams"]["precision"] == precision
        recorded = json.loads((d / "run" / "args.json").read_text())
        assert (recorded["torch_dtype"], recorded["fp16"], recorded["bf16"]) == ("float32", False, precision == "bfloat16")
        steps[n] = stats["steps"]
    assert steps == {8: 2, 16: 4}


@pytest.mark.slow
def test_the_wall_clock_cap_stops_the_whole_process_group(tmp_path):
    """A stand-in for `swift sft` that starts a child (as swift starts its trainer) and runs forever: the cap
    stops both, and says so; without a cap the same runner is a plain run."""
    script = tmp_path / "trainer.py"
    pidfile = tmp_path / "child.pid"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
                      "print('training', flush=True)\n"
                      "time.sleep(600)\n")
    start = time.monotonic()
    wall, capped = runner.run_swift([sys.executable, str(script)], max_wall_s=3)
    assert capped and 3 <= wall < 40 and time.monotonic() - start < 45
    child = int(pidfile.read_text())
    time.sleep(0.5)
    alive = subprocess.run(["ps", "-o", "stat=", "-p", str(child)], capture_output=True, text=True).stdout.strip()
    assert alive in ("", "Z"), f"the trainer's child {child} outlived the cap ({alive})"
    assert runner.run_swift([sys.executable, "-c", "print('done')"]) < 30       # no cap: the wall time, as before
    with pytest.raises(QrewriteError, match="exit code 3"):
        runner.run_swift([sys.executable, "-c", "import sys; sys.exit(3)"], max_wall_s=60)


def test_sft_settings_are_epochs_in_the_shipped_config():
    sft = yaml.safe_load((REPO / "config.yaml").read_text())["train"]["sft"]
    assert "num_train_epochs" in sft and not {"max_steps", "eval_steps", "save_steps"} & set(sft)
