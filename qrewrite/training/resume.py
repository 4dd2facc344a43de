"""Resume a killed training run (Slurm preemption, requeue, a crash) from its last complete checkpoint.

A run directory (`--run-dir`, a rule param, so Snakemake never deletes it) holds `qrewrite-run.json`: the
fingerprint of the command and of its inputs' files. A rerun resumes only when the fingerprint matches and the
earlier run did not finish; any other run directory is wiped, so a changed config, new data or a forced rerun
never continues an old run.

What "complete" means follows what each framework writes last:

* transformers / ms-swift (`checkpoint-N/`): `Trainer._save_checkpoint` writes the weights, optimizer,
  scheduler and RNG state first and `trainer_state.json` last, so a checkpoint counts when that file parses and
  its `global_step` is N and the weights are there.
* verl (`global_step_N/`): `RayPPOTrainer._save_checkpoint` saves `actor/`, `critic/` (PPO) and `data.pt`, and
  only then writes N into `latest_checkpointed_iteration.txt` (verl calls it the tracker "for atomic usage").
  Steps up to the tracker's count; a newer folder is a save that was cut off. The tracker itself is written
  in place, so a kill can leave it empty, and verl then crashes on `int('')` in `find_latest_ckpt_path` even
  in resume_path mode: without a readable tracker the newest folder holding actor/, critic/ (PPO) and data.pt
  is taken, and the tracker is rewritten (atomically) to the step chosen.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterable, Sequence

from ..io_utils import write_text_atomic
from ..reward.monitor import CURVE_FILE

STATE_FILE = "qrewrite-run.json"
VERL_TRACKER = "latest_checkpointed_iteration.txt"
HF_WEIGHTS = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json", "adapter_model.bin",
              "pytorch_model.bin")


HASH_BELOW = 4 * 1024 * 1024


def _file_signature(p: Path) -> str | list:
    # Small files (data, configs: the resolved config is rewritten by every Snakemake call) by content;
    # model weights by size and mtime, as Snakemake's own rerun test does, not to read GBs on every start.
    st = p.stat()
    if st.st_size < HASH_BELOW:
        return hashlib.sha256(p.read_bytes()).hexdigest()
    return [st.st_size, st.st_mtime_ns]


def _stat_signature(path: Path) -> dict:
    path = Path(path)
    if path.is_file():
        return {path.name: _file_signature(path)}
    out = {}
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs.sort()
        for f in sorted(files):
            p = Path(root) / f
            out[str(p.relative_to(path))] = _file_signature(p)
    return out


def fingerprint(argv: Sequence[str], inputs: Iterable[str | os.PathLike]) -> str:
    """The command (without any resume argument) and its inputs' files."""
    blob = {"argv": [str(a) for a in argv],
            "inputs": {str(Path(p).resolve()): _stat_signature(Path(p)) for p in inputs}}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _read_state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def prepare_run_dir(run_dir: str | os.PathLike, fp: str) -> bool:
    """True when `run_dir` holds an unfinished run of this very command (keep it); else wipe it and start one."""
    run_dir = Path(run_dir)
    state = _read_state(run_dir)
    if state.get("fingerprint") == fp and not state.get("finished"):
        return True
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / STATE_FILE, json.dumps({"fingerprint": fp, "finished": False,
                                                         "started": time.time()}) + "\n")
    return False


def mark_finished(run_dir: str | os.PathLike) -> None:
    """After the model was written: a later run of the rule is a new run, not a resume."""
    run_dir = Path(run_dir)
    state = _read_state(run_dir)
    write_text_atomic(run_dir / STATE_FILE, json.dumps({**state, "finished": True, "ended": time.time()}) + "\n")


def curve_for_run(run_dir: str | os.PathLike, step: int) -> Path:
    """The reward curve's file for a run: in the run folder, which outlives an interrupted job (the tb folder is a
    rule output, deleted with it). Rows after `step` (the checkpoint the run resumes from; 0 for a fresh start) are
    dropped: those steps are trained again, and their rows come again."""
    path = Path(run_dir) / CURVE_FILE
    if path.is_file():
        keep = [ln for ln in path.read_text(encoding="utf-8").splitlines()
                if ln.strip() and int(json.loads(ln).get("step") or 0) <= step]
        write_text_atomic(path, "".join(ln + "\n" for ln in keep))
    return path


def publish_curve(curve: Path, tb_dir: str | os.PathLike) -> None:
    """After training: the run's whole curve beside the TensorBoard events, where the summary and report read it."""
    if curve.is_file():
        os.makedirs(tb_dir, exist_ok=True)
        write_text_atomic(Path(tb_dir) / CURVE_FILE, curve.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- transformers / ms-swift

def hf_checkpoint_complete(ck: Path) -> bool:
    m = re.fullmatch(r"checkpoint-(\d+)", ck.name)
    if not m or not ck.is_dir() or ck.is_symlink():
        return False
    try:
        state = json.loads((ck / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return state.get("global_step") == int(m.group(1)) and any((ck / w).is_file() for w in HF_WEIGHTS)


def last_complete_hf_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """Newest `checkpoint-N` that transformers finished writing, or None."""
    cks = [p for p in Path(run_dir).glob("checkpoint-*") if hf_checkpoint_complete(p)]
    return max(cks, key=lambda p: int(p.name.split("-")[1]), default=None)


# --------------------------------------------------------------------------- verl

def _verl_steps(run_dir: Path) -> list[int]:
    steps = [int(m.group(1)) for p in run_dir.glob("global_step_*")
             if (m := re.fullmatch(r"global_step_(\d+)", p.name)) and p.is_dir()]
    return sorted(steps)


def _verl_step_has_files(run_dir: Path, step: int, critic: bool) -> bool:
    d = run_dir / f"global_step_{step}"
    return (d / "actor").is_dir() and (not critic or (d / "critic").is_dir()) and (d / "data.pt").is_file()


def last_complete_verl_step(run_dir: str | os.PathLike, *, critic: bool) -> int | None:
    """The step verl can resume from: the tracker's, else the newest folder with all its parts, else None."""
    run_dir = Path(run_dir)
    try:
        tracked = int((run_dir / VERL_TRACKER).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        tracked = None
    if tracked is not None and _verl_step_has_files(run_dir, tracked, critic):
        return tracked
    done = [s for s in _verl_steps(run_dir) if (tracked is None or s < tracked)
            and _verl_step_has_files(run_dir, s, critic)]
    return done[-1] if done else None


def prepare_verl_resume(run_dir: str | os.PathLike, *, critic: bool) -> int | None:
    """Pick the step to resume from, point verl's tracker at it, delete the cut-off saves after it."""
    run_dir = Path(run_dir)
    step = last_complete_verl_step(run_dir, critic=critic)
    for s in _verl_steps(run_dir):
        if step is None or s > step:  # a half-written save; verl would write into it again
            shutil.rmtree(run_dir / f"global_step_{s}", ignore_errors=True)
    if step is None:
        (run_dir / VERL_TRACKER).unlink(missing_ok=True)
    else:
        write_text_atomic(run_dir / VERL_TRACKER, str(step))
    return step
