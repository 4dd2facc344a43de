"""What the GPU check sends back: summary.json (phases, per-step metrics, resume, models, GPU memory, failures),
the logs and a tarball of the stats, lineage and run folders (at most 8 files come back from a device call).

Per-step figures are verl's own console metrics (``step:N - timing_s/gen:... - critic/score/mean:...``): timing_s/gen
(rollout generation), timing_s/reward, timing_s/update_actor, timing_s/update_critic (PPO), timing_s/step, the
reward (critic/score/mean) and the actor's and critic's perf/max_memory_allocated_gb. verl's validation lines
(``step:0 - val-core/...``, before training and on resume) are kept apart: they are not training steps.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import tarfile
from pathlib import Path

from qrewrite.io_utils import write_json

STEP = re.compile(r"step:(\d+) - (.*)$")
ERROR = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)|error)\b[:(]")
KEYS = ("timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/values",
        "timing_s/adv", "timing_s/update_critic", "timing_s/update_actor", "timing_s/update_weights",
        "timing_s/save_checkpoint", "timing_s/step", "critic/score/mean", "critic/rewards/mean",
        "critic/score/min", "critic/score/max", "critic/vf_loss", "actor/pg_loss", "actor/kl_loss",
        "actor/grad_norm", "critic/grad_norm", "actor/entropy", "response_length/mean",
        "actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb",
        "critic/perf/max_memory_allocated_gb", "perf/throughput",  # verl 0.9.1's names, as its logs write them
        # the rollout engine's log-probs against the actor's: near 0 once the weight sync reached vLLM
        "training/rollout_probs_diff_max")


NUMBER = re.compile(r"^(?:np\.float\d+\()?\s*(-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)\)?$")


def _log_lines(log: Path) -> list[tuple[int, float | None, dict[str, str]]]:
    """(step, console seconds, {metric: raw value}) of each of verl's ``step:N - k:v - ...`` lines."""
    out = []
    if not log.is_file():
        return out
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = STEP.search(line)
        if not m:
            continue
        kv = {}
        for part in m.group(2).split(" - "):
            k, _, v = part.partition(":")
            kv[k.strip()] = v.strip()
        t = re.match(r"\[\s*([\d.]+)\]", line)
        out.append((int(m.group(1)), float(t.group(1)) if t else None, kv))
    return out


def _number(v: str) -> float | None:
    m = NUMBER.match(v)  # verl prints validation means as np.float64(-0.84)
    if not m:
        return None
    x = float(m.group(1))
    return round(x, 4) if abs(x) >= 1e-3 else float(f"{x:.3g}")  # keep a 2e-08 log-prob difference visible


def _is_validation(kv: dict) -> bool:
    # verl logs validation before training (and on resume) as a line of its own, under the step it starts from:
    # `step:0 - val-core/...`; it is not a training step
    return bool(kv) and all(k.startswith("val-") for k in kv)


def step_metrics(log: Path) -> list[dict]:
    """verl's training steps from its console lines, the KEYS of each (in step order; a resumed run's own steps
    only); validation-only lines are left to validation_metrics."""
    rows = {}
    for step, t_s, kv in _log_lines(log):
        if _is_validation(kv):
            continue
        vals = {k: x for k, v in kv.items() if k in KEYS and (x := _number(v)) is not None}
        rows.setdefault(step, {"step": step, "t_s": t_s}).update(vals)
    return [rows[k] for k in sorted(rows)]


def validation_metrics(log: Path) -> list[dict]:
    """verl's validation lines: the step it ran at and the validation reward (val-core/<source>/reward/mean@N)."""
    out = []
    for step, t_s, kv in _log_lines(log):
        if _is_validation(kv):
            rew = {k: x for k, v in kv.items() if k.startswith("val-core/") and "/reward/mean@" in k
                   and (x := _number(v)) is not None}
            out.append({"step": step, "t_s": t_s, **rew})
    return out


def first_error(lines: list[str]) -> str | None:
    """The last exception line of a log tail (the one a traceback ends with)."""
    hits = [ln for ln in lines if ERROR.search(ln) and "Warning" not in ln]
    return hits[-1].strip()[:400] if hits else None


def gpu_memory(csv: Path) -> dict:
    used = []
    if csv.is_file():
        for ln in csv.read_text().splitlines():
            parts = [p.strip() for p in ln.split(",")]
            if len(parts) >= 2 and parts[1].isdigit():
                used.append(int(parts[1]))
    return {"samples": len(used), "peak_mib": max(used, default=None), "idle_mib": min(used, default=None)}


def grep(log: Path, pattern: str) -> list[str]:
    if not log.is_file():
        return []
    rx, out = re.compile(pattern), []
    for ln in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = rx.search(ln)
        if m:  # the match in its context: a command line is thousands of characters long
            out.append(ln[max(0, m.start() - 80):m.end() + 160])
    return out


def model_record(folder: Path) -> dict:
    if not folder.is_dir():
        return {"exists": False}
    lineage = folder / "lineage.json"
    rec = {"exists": True, "files": sorted(p.name for p in folder.iterdir()), "lineage": lineage.is_file()}
    if lineage.is_file():
        lin = json.loads(lineage.read_text(encoding="utf-8"))
        rec["lineage_keys"] = sorted(lin)[:30]
    return rec


def read_phases(work: Path) -> dict[str, dict]:
    """name -> each phase's status (tools.gpukit.phase), its error line where it failed (its log tail kept)."""
    phases = {}
    for status in sorted((work / "status").glob("*.json")):
        st = json.loads(status.read_text(encoding="utf-8"))
        st["error"] = None if st["rc"] == 0 or st.get("step_at_kill") is not None else first_error(st.get("tail", []))
        if not st["error"]:
            st.pop("tail", None)
        phases[st["name"]] = st
    return phases


def read_timeline(work: Path) -> list[dict]:
    t = work / "timeline.jsonl"
    return [json.loads(ln) for ln in t.read_text().splitlines()] if t.is_file() else []


def keep_logs(work: Path, out: Path, names) -> None:
    """Each named phase's log, gzipped into out (a device call brings back at most 8 files)."""
    for name in names:
        log = work / "logs" / f"{name}.log"
        if log.is_file():
            with open(log, "rb") as fin, gzip.open(out / f"{name}.log.gz", "wb") as fout:
                shutil.copyfileobj(fin, fout)


def conclude(s: dict, checks: list[tuple[str, bool, str]], out: Path) -> int:
    """The verdict into summary.json and on the console; 0 when every check passed."""
    s["verdict"] = [{"check": c, "passed": ok, "detail": d} for c, ok, d in checks]
    write_json(out / "summary.json", s)
    for c, ok, d in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {c}" + (f"  ({d})" if d and not ok else ""))
    return 0 if all(ok for _, ok, _ in checks) else 1


def collect(work: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    phases = read_phases(work)
    logs = work / "logs"
    summary = {
        "env": json.loads((work / "env.json").read_text()) if (work / "env.json").is_file() else None,
        "timeline": read_timeline(work),
        "phases": phases,
        "steps": (steps := {name: step_metrics(logs / f"{name}.log") for name in phases}),
        "validation": {name: validation_metrics(logs / f"{name}.log") for name in phases},
        "resume": {
            "killed_after_step": (phases.get("ppo_a") or {}).get("step_at_kill"),
            "resume_lines": grep(logs / "ppo_b.log", r"trainer\.resume_from_path=|[Rr]esum(e|ing) from|Load from checkpoint")[:6],
            "resumed_from_step": _stat(work, "ppo", "resumed_from_step"),
            "steps_after_resume": [r["step"] for r in steps.get("ppo_b", [])],
        },
        "critic_built": grep(logs / "ppo_a.log", r"critic model engine initialized")[:1],
        "models": {n: model_record(work / "models" / n) for n in ("ppo", "grpo")},
        "stats": {n: _stats(work, n) for n in ("ppo", "grpo")},
        "gpu_memory": gpu_memory(work / "nvsmi.csv"),
    }
    summary["failures"] = {n: p["error"] for n, p in phases.items() if p.get("error")}
    write_json(out / "summary.json", summary)
    keep_logs(work, out, phases)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for sub in ("stats", "status", "cfg", "tb"):
            if (work / sub).is_dir():
                tar.add(work / sub, arcname=sub)
        for name in ("ppo", "grpo"):
            lin = work / "models" / name / "lineage.json"
            if lin.is_file():
                tar.add(lin, arcname=f"models/{name}/lineage.json")
            run = work / "runs" / name
            if run.is_dir():  # the checkpoints' layout, not their weights
                listing = "\n".join(str(p.relative_to(run)) for p in sorted(run.rglob("*")))
                (work / f"{name}-run-files.txt").write_text(listing + "\n")
                tar.add(work / f"{name}-run-files.txt", arcname=f"runs/{name}-files.txt")
    return summary


# A rehearsal (CPU) run must get as far as a GPU is needed and fail there, not before: on a wrong override, a
# missing module or a config key verl does not know.
EARLY = re.compile(r"ModuleNotFoundError|ImportError|ConfigAttributeError|ConfigKeyError|ConfigCompositionException|"
                   r"InterpolationResolutionError|Could not override|ValidationError|QrewriteError|qrewrite rl: error: "
                   r"(?!`)")
GPU_BOUNDARY = re.compile(r"NCCL|nccl|CUDA|cuda|GPU|[Nn]o accelerator")


def verdict(s: dict, work: Path, *, rehearsal: bool, part: str = "all") -> list[tuple[str, bool, str]]:
    """(check, passed, detail) for what the check (or one part of it) must show."""
    logs, out = work / "logs", []
    if rehearsal:
        for name in ("ppo_a", "grpo"):
            log = logs / f"{name}.log"
            text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
            err = (s["phases"].get(name) or {}).get("error") or ""
            early = EARLY.search(err)
            out += [(f"{name}: verl's validate_config passed", "All configuration checks passed" in text, ""),
                    (f"{name}: Ray started and the trainer built its workers",
                     "Started a local Ray instance" in text and "create worker group" in text, ""),
                    (f"{name}: not stopped by an import or config error", early is None, err[:200]),
                    (f"{name}: stopped where a GPU is needed", bool(GPU_BOUNDARY.search(err)), err[:200])]
        return out
    ppo_b, grpo = s["phases"].get("ppo_b") or {}, s["phases"].get("grpo") or {}
    r, models = s["resume"], s["models"]
    grpo_steps = [x["step"] for x in s["steps"].get("grpo", [])]

    def merged(n: str) -> bool:
        m = models[n]
        return bool(m.get("exists") and m.get("lineage") and "model.safetensors" in m.get("files", []))

    if part in ("1", "all"):
        out += [("ppo_a stopped after its global_step_2", r["killed_after_step"] == 2, str(r["killed_after_step"])),
                ("grpo trained its 4 steps", grpo.get("rc") == 0 and grpo_steps == [1, 2, 3, 4],
                 str(grpo.get("error") or grpo_steps)),
                ("models/grpo: merged model with lineage", merged("grpo"), "")]
    if part in ("2", "all"):
        out += [("ppo_b finished", ppo_b.get("rc") == 0, str(ppo_b.get("error") or ppo_b.get("rc"))),
                ("ppo_b resumed from step 2 (trainer.resume_from_path in its command)",
                 r["resumed_from_step"] == 2 and any("resume_from_path=" in ln and "global_step_2" in ln
                                                      for ln in r["resume_lines"]), str(r["resumed_from_step"])),
                ("ppo_b trained steps 3 and 4 only", r["steps_after_resume"] == [3, 4], str(r["steps_after_resume"])),
                ("models/ppo: merged model with lineage", merged("ppo"), "")]
    return out


def _stats(work: Path, name: str) -> dict | None:
    p = work / "stats" / f"{name}.json"
    if not p.is_file():
        return None
    s = json.loads(p.read_text(encoding="utf-8"))
    s.pop("overrides", None)
    return s


def _stat(work: Path, name: str, key: str):
    s = _stats(work, name)
    return s.get(key) if s else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.collect", description=__doc__.split("\n")[0])
    ap.add_argument("work")
    ap.add_argument("out")
    ap.add_argument("--rehearsal", action="store_true", help="judge a CPU rehearsal (runs end at the GPU boundary)")
    ap.add_argument("--part", choices=("1", "2", "all"), default="all", help="which part of the check to judge")
    args = ap.parse_args(argv)
    s = collect(Path(args.work), Path(args.out))
    checks = verdict(s, Path(args.work), rehearsal=args.rehearsal, part=args.part)
    for name, p in s["phases"].items():
        print(f"{name}: rc {p['rc']} {p['wall_s']} s" + (f" stopped {p['killed']}" if p["killed"] else "")
              + (f" ERROR {p['error']}" if p.get("error") else "") + f"; steps {[r['step'] for r in s['steps'][name]]}")
    print("resume:", json.dumps(s["resume"], ensure_ascii=False)[:600])
    print("models:", {n: m.get("exists") and m.get("lineage") for n, m in s["models"].items()})
    print("gpu memory:", s["gpu_memory"])
    return conclude(s, checks, Path(args.out))


if __name__ == "__main__":
    raise SystemExit(main())
