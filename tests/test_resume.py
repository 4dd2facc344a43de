"""Resuming killed training runs (qrewrite/training/resume.py) and how sft, swift GRPO and verl use it.

The frameworks' own checkpoint layouts are rebuilt here on disk (what transformers and verl 0.9.1 write, in the
order they write it); the trainer process itself is replaced by a recorder of its command line, which also
leaves the checkpoints a real run would. The real ms-swift runs are tests/test_pipeline_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from qrewrite.config import load_config
from qrewrite.errors import QrewriteError
from qrewrite.training import resume
from qrewrite.training.rl import swift_grpo as rl_swift
from qrewrite.training.rl.verl import train as rl_verl
from qrewrite.training.sft import train as sft
from qrewrite.training.swift import runner


def hf_checkpoint(run: Path, step: int, *, complete: bool = True) -> Path:
    ck = run / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "adapter_model.safetensors").write_bytes(b"w")
    (ck / "adapter_config.json").write_text("{}")
    (ck / "optimizer.pt").write_bytes(b"o")
    # transformers writes trainer_state.json last: a kill before it leaves the folder without it
    if complete:
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step, "best_model_checkpoint": None}))
    return ck


def verl_step(run: Path, step: int, *, critic: bool = True, data: bool = True, track: bool = True) -> Path:
    d = run / f"global_step_{step}"
    (d / "actor").mkdir(parents=True)
    if critic:
        (d / "critic").mkdir()
    if data:
        (d / "data.pt").write_bytes(b"d")
    if track:
        (run / resume.VERL_TRACKER).write_text(str(step))
    return d


# ----------------------------------------------------------------------------------- what "complete" means

def test_hf_last_complete_checkpoint_skips_a_half_written_one(tmp_path):
    assert resume.last_complete_hf_checkpoint(tmp_path) is None
    hf_checkpoint(tmp_path, 4)
    hf_checkpoint(tmp_path, 8)
    hf_checkpoint(tmp_path, 12, complete=False)  # killed while saving
    (tmp_path / "checkpoint-16").mkdir()  # killed right after mkdir
    assert resume.last_complete_hf_checkpoint(tmp_path) == tmp_path / "checkpoint-8"
    (tmp_path / "checkpoint-8" / "trainer_state.json").write_text('{"global_st')  # cut off mid-write
    assert resume.last_complete_hf_checkpoint(tmp_path) == tmp_path / "checkpoint-4"
    (tmp_path / "last").symlink_to(tmp_path / "checkpoint-4")  # swift's symlink is no checkpoint of its own
    assert resume.last_complete_hf_checkpoint(tmp_path) == tmp_path / "checkpoint-4"


def test_verl_resume_step_follows_the_tracker_and_drops_cut_off_saves(tmp_path):
    assert resume.prepare_verl_resume(tmp_path, critic=True) is None
    verl_step(tmp_path, 2)
    verl_step(tmp_path, 4, track=False)  # killed before the tracker was written: actor/critic may be partial
    assert resume.last_complete_verl_step(tmp_path, critic=True) == 2
    assert resume.prepare_verl_resume(tmp_path, critic=True) == 2
    assert not (tmp_path / "global_step_4").exists()  # verl would save step 4 into it again
    assert (tmp_path / resume.VERL_TRACKER).read_text() == "2"


def test_verl_empty_tracker_falls_back_to_the_newest_folder_with_all_parts(tmp_path):
    verl_step(tmp_path, 2)
    verl_step(tmp_path, 4)
    verl_step(tmp_path, 6, data=False)  # data.pt is written after actor/ and critic/
    (tmp_path / resume.VERL_TRACKER).write_text("")  # verl writes it in place: a kill can leave it empty
    assert resume.prepare_verl_resume(tmp_path, critic=True) == 4
    assert (tmp_path / resume.VERL_TRACKER).read_text() == "4"  # verl's int('') would crash otherwise
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_2", "global_step_4"]


def test_verl_ppo_needs_the_critic_grpo_does_not(tmp_path):
    verl_step(tmp_path, 3, critic=False)
    assert resume.last_complete_verl_step(tmp_path, critic=True) is None
    assert resume.last_complete_verl_step(tmp_path, critic=False) == 3


def test_run_dir_is_kept_only_for_an_unfinished_run_of_the_same_command(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("a\n")
    run = tmp_path / "run"
    fp = resume.fingerprint(["swift", "sft"], [data])
    assert resume.prepare_run_dir(run, fp) is False  # fresh
    hf_checkpoint(run, 2)
    assert resume.prepare_run_dir(run, fp) is True and (run / "checkpoint-2").is_dir()
    data.write_text("b\n")  # new data: the old run is not continued
    fp2 = resume.fingerprint(["swift", "sft"], [data])
    assert fp2 != fp and resume.prepare_run_dir(run, fp2) is False and not (run / "checkpoint-2").exists()
    assert resume.fingerprint(["swift", "sft", "--learning_rate", "1"], [data]) != fp2
    hf_checkpoint(run, 2)
    resume.mark_finished(run)
    assert resume.prepare_run_dir(run, fp2) is False and not (run / "checkpoint-2").exists()


# ----------------------------------------------------------------------------------- the stages

@pytest.fixture
def cfg():
    return load_config(REPO / "config.yaml")


class FakeTrainer:
    """Stands in for `run_swift`: records each command; the first call dies after saving checkpoint-2 and
    half of checkpoint-4, later calls finish with checkpoint-4 complete (and what sft's checks read)."""

    def __init__(self, run_dir: Path, tb_dir: Path):
        self.run_dir, self.tb_dir, self.calls = run_dir, tb_dir, []

    def __call__(self, argv, **kw):
        self.calls.append([str(a) for a in argv])
        if len(self.calls) == 1:
            hf_checkpoint(self.run_dir, 2)
            hf_checkpoint(self.run_dir, 4, complete=False)
            raise QrewriteError("`swift sft` failed with exit code -9 after 60s")  # preempted
        import shutil
        shutil.rmtree(self.run_dir / "checkpoint-4", ignore_errors=True)
        hf_checkpoint(self.run_dir, 4)
        self.tb_dir.mkdir(parents=True, exist_ok=True)
        (self.tb_dir / "events.out.tfevents.1.host").write_bytes(b"e")
        return 1.0


def _resume_arg(argv):
    return argv[argv.index("--resume_from_checkpoint") + 1] if "--resume_from_checkpoint" in argv else None


def _inputs(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    # what lora_layers counts down from (the embedded config puts LoRA on the top blocks only)
    (base / "config.json").write_text('{"num_hidden_layers": 24}')
    for name in ("train.jsonl", "val.jsonl"):
        (tmp_path / name).write_text('{"messages": []}\n')
    return base, tmp_path / "train.jsonl", tmp_path / "val.jsonl"


def test_sft_resumes_a_killed_run_from_its_last_complete_checkpoint(cfg, tmp_path, monkeypatch):
    base, train, val = _inputs(tmp_path)
    run, tb, out = tmp_path / "run", tmp_path / "tb", tmp_path / "adapter"
    fake = FakeTrainer(run, tb)
    monkeypatch.setattr(runner, "run_swift", fake)
    kw = dict(base=str(base), train=str(train), val=str(val), out=str(out), run_dir=str(run), tb_dir=str(tb))
    with pytest.raises(QrewriteError):
        sft.run_sft(cfg, **kw)
    assert _resume_arg(fake.calls[0]) is None  # nothing to resume from in a fresh run dir
    stats = sft.run_sft(cfg, **kw)  # the rerun (Slurm requeue, Snakemake rerun)
    assert _resume_arg(fake.calls[1]) == str(run / "checkpoint-2")  # not the half-written checkpoint-4
    assert stats["resumed_from"] == "checkpoint-2" and (out / "adapter_model.safetensors").is_file()
    sft.run_sft(cfg, **kw)  # the finished run is not resumed: a forced rerun trains from step 0
    assert _resume_arg(fake.calls[2]) is None


def test_sft_does_not_resume_when_the_data_changed(cfg, tmp_path, monkeypatch):
    base, train, val = _inputs(tmp_path)
    run, tb = tmp_path / "run", tmp_path / "tb"
    fake = FakeTrainer(run, tb)
    monkeypatch.setattr(runner, "run_swift", fake)
    kw = dict(base=str(base), train=str(train), val=str(val), out=str(tmp_path / "a"), run_dir=str(run),
              tb_dir=str(tb))
    with pytest.raises(QrewriteError):
        sft.run_sft(cfg, **kw)
    train.write_text('{"messages": [{"role": "user", "content": "new"}]}\n')
    sft.run_sft(cfg, **kw)
    assert _resume_arg(fake.calls[1]) is None and not (run / "checkpoint-2").exists()


def _grpo_run(tmp_path, monkeypatch, trainer=FakeTrainer):
    """run_swift_grpo's arguments with `trainer` as ms-swift and a recorded merge: (fake, merged, kw)."""
    base, train, _ = _inputs(tmp_path)
    run, tb = tmp_path / "run", tmp_path / "tb"
    fake = trainer(run, tb)
    monkeypatch.setattr(runner, "run_swift", fake)
    merged = []
    monkeypatch.setattr(rl_swift, "merge_lora", lambda cfg, **kw: merged.append(kw) or {"wall_s": 0.1})
    conf = tmp_path / "config.yaml"
    conf.write_text((REPO / "config.yaml").read_text())
    kw = dict(config_path=str(conf), model=str(base), train_jsonl=str(train), out=str(tmp_path / "rl"),
              run_dir=str(run), tb_dir=str(tb))
    return fake, merged, kw


def test_swift_grpo_resumes_from_its_last_complete_checkpoint(cfg, tmp_path, monkeypatch):
    fake, merged, kw = _grpo_run(tmp_path, monkeypatch)
    run = tmp_path / "run"
    with pytest.raises(QrewriteError):
        rl_swift.run_swift_grpo(cfg, **kw)
    stats = rl_swift.run_swift_grpo(cfg, **kw)
    assert fake.calls[1][1:3] == ["rlhf", "--rlhf_type"] and _resume_arg(fake.calls[1]) == str(run / "checkpoint-2")
    assert stats["resumed_from"] == "checkpoint-2" and merged[-1]["adapter"] == str(run / "checkpoint-4")


class CurveTrainer(FakeTrainer):
    """FakeTrainer whose reward plugin logs one curve row per step where `qrewrite rl` says ($QREWRITE_CURVE_FILE):
    the killed run gets to step 3 (checkpoint-2 saved), the resumed one trains steps 3 and 4 again."""

    def __call__(self, argv, **kw):
        from qrewrite.reward.monitor import CURVE_ENV

        steps = (1, 2, 3) if not self.calls else (3, 4)
        with open(kw["env"][CURVE_ENV], "a", encoding="utf-8") as fh:
            for s in steps:
                fh.write(json.dumps({"step": s, "n": 8, "run": len(self.calls)}) + "\n")
        return super().__call__(argv, **kw)


def test_swift_grpo_resumed_keeps_the_reward_curve_from_step_1(cfg, tmp_path, monkeypatch):
    """The tb folder is a rule output (Snakemake deletes it with an interrupted job, and the stage starts it
    afresh): the curve survives in the run folder, the steps after the checkpoint once, from the resumed run."""
    _, _, kw = _grpo_run(tmp_path, monkeypatch, CurveTrainer)
    tb = tmp_path / "tb"
    with pytest.raises(QrewriteError):
        rl_swift.run_swift_grpo(cfg, **kw)
    import shutil
    shutil.rmtree(tb, ignore_errors=True)  # what Snakemake does to an incomplete output
    rl_swift.run_swift_grpo(cfg, **kw)
    rows = [json.loads(ln) for ln in (tb / "reward_curve.jsonl").read_text().splitlines()]
    assert [(r["step"], r["run"]) for r in rows] == [(1, 0), (2, 0), (3, 1), (4, 1)]


def test_verl_resumes_from_the_last_complete_global_step(cfg, tmp_path, monkeypatch):
    cfg["rl"]["backend"] = "verl"
    cfg["rl"]["verl"]["n_gpus_per_node"] = 1
    model, train, val = _inputs(tmp_path)
    run, tb, out = tmp_path / "ckpt", tmp_path / "tb", tmp_path / "rl"
    calls = []

    def fake_verl(argv, **kw):  # main_ppo: first run killed during the step-4 save, the rerun ends at step 6
        calls.append(dict(a.split("=", 1) for a in argv[3:]))
        if len(calls) == 1:
            verl_step(run, 2)
            verl_step(run, 4, track=False)
            raise QrewriteError("`python -m` failed with exit code -9")
        assert not (run / "global_step_4").exists()
        verl_step(run, 6)
        return 2.0

    monkeypatch.setattr(rl_verl, "run_swift", fake_verl)
    merges = []
    def fake_merger(argv, **kw):  # python -m verl.model_merger merge ... --target_dir HF
        merges.append(argv)
        Path(argv[argv.index("--target_dir") + 1]).mkdir()

    monkeypatch.setattr(rl_verl.subprocess, "run", fake_merger)
    monkeypatch.setattr(rl_verl, "fold_lora", lambda hf, final: final.mkdir() or (final / "config.json").write_text("{}"))
    conf = tmp_path / "config.yaml"
    conf.write_text("tenants: []\n")
    kw = dict(config_path=str(conf), model=str(model), train=str(train), val=str(val), out=str(out),
              run_dir=str(run), tb_dir=str(tb))
    with pytest.raises(QrewriteError):
        rl_verl.run_verl(cfg, **kw)
    assert calls[0]["trainer.resume_mode"] == "disable" and "trainer.resume_from_path" not in calls[0]
    assert calls[0]["trainer.default_local_dir"] == str(run.resolve())
    stats = rl_verl.run_verl(cfg, **kw)
    assert calls[1]["trainer.resume_mode"] == "resume_path"
    assert calls[1]["trainer.resume_from_path"] == str(run.resolve() / "global_step_2")
    assert stats["resumed_from_step"] == 2 and stats["checkpoint"] == "global_step_6"
    assert merges[-1][merges[-1].index("--local_dir") + 1] == str(run / "global_step_6" / "actor")
    assert (out / "config.json").is_file()


def test_trainer_pythonpath_keeps_a_staged_site_dir(monkeypatch, cfg, tmp_path):
    """On the GPU machine vLLM/verl live in a pip --target folder on PYTHONPATH: the verl env must keep it."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/verl-site")
    env = rl_verl.verl_env(cfg, config_path=str(REPO / "config.yaml"), tb_dir=str(tmp_path / "tb"))
    assert env["PYTHONPATH"].split(":") == [str(REPO), "/tmp/verl-site"]
