"""What the learning run sends back: summary.json (phases, the student's rebuild and check, verl's per-step reward,
KL and times, GPU memory, both eval halves, the verdict), eval.json, GRPO's log, nvidia-smi's samples and
results.tar.gz (stats, status, configs, TensorBoard, the other phases' logs, RL lineage): 5 files, within the 8 a
device call brings back. For a CPU rehearsal, the verdict that every step before the GPU ran and GRPO stopped where
a GPU is needed, not before.

  python -m tools.gpukit.learn_collect WORK OUT [--part 1|2|all] [--rehearse]
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

from qrewrite.io_utils import write_json
from .collect import (EARLY, GPU_BOUNDARY, conclude, gpu_memory, keep_logs, model_record, read_phases, read_timeline,
                      step_metrics)


def _json(p: Path):
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def reward_trend(steps: list[dict], key: str = "critic/score/mean") -> dict:
    """First and last third of the per-step reward, and whether the rise clears the steps' own spread (the last
    third's mean minus the first's, against twice the standard error of that difference)."""
    r = [s[key] for s in steps if s.get(key) is not None]
    if len(r) < 3:
        return {"n": len(r), "values": r}
    k = max(1, len(r) // 3)
    a, b = r[:k], r[-k:]

    def mean(x):
        return sum(x) / len(x)

    def var(x):
        m = mean(x)
        return sum((v - m) ** 2 for v in x) / max(1, len(x) - 1)

    se = (var(a) / len(a) + var(b) / len(b)) ** 0.5
    rise = mean(b) - mean(a)
    return {"n": len(r), "values": r, "first_third": round(mean(a), 4), "last_third": round(mean(b), 4),
            "rise": round(rise, 4), "rise_se": round(se, 4), "rose_beyond_noise": bool(rise > 2 * se)}


def collect(work: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    phases = read_phases(work)
    steps = step_metrics(work / "logs" / "grpo.log")
    ev, ev_sft = _json(work / "eval.json"), _json(work / "eval-sft.json")
    s = {"timeline": read_timeline(work), "phases": phases, "student": _json(work / "stats" / "student.json"),
         "student_check": _json(work / "stats" / "student_check.json"),
         "steps": steps, "reward": reward_trend(steps), "rl_stats": _json(work / "stats" / "grpo.json"),
         "models": {n: model_record(work / "models" / n) for n in ("sft", "rl")},
         "gpu_memory": gpu_memory(work / "nvsmi.csv"), "eval": ev, "eval_sft": ev_sft}
    s["failures"] = {n: p["error"] for n, p in phases.items() if p.get("error")}
    keep_logs(work, out, ["grpo"])
    if ev:
        write_json(out / "eval.json", ev)
    with tarfile.open(out / "results.tar.gz", "w:gz") as tar:
        for sub in ("stats", "status", "cfg", "tb", "logs"):
            if (work / sub).is_dir():  # GRPO's log travels on its own (gzipped above)
                tar.add(work / sub, arcname=sub, filter=lambda m: None if m.name == "logs/grpo.log" else m)
        lin = work / "models" / "rl" / "lineage.json"
        if lin.is_file():
            tar.add(lin, arcname="models/rl/lineage.json")
    return s


def _eval_check(ev: dict, phase: dict, want: set[str], what: str) -> tuple[str, bool, str]:
    figs = (ev.get("test") or {}).get("figures") or {}
    return (f"{what}: the release chosen on validation, test Hit@1 of " + ", ".join(sorted(want)),
            bool(ev) and want <= set(figs) and bool((ev.get("validation") or {}).get("release")),
            str(phase.get("error") or sorted(figs)))


def verdict(s: dict, work: Path, *, rehearsal: bool, part: str = "all") -> list[tuple[str, bool, str]]:
    """(check, passed, detail): part 1 (the student and the SFT half of the eval), part 2 (GRPO and the eval with
    RL), all; a rehearsal's GRPO must stop where a GPU is needed, and its eval has no RL model."""
    ph, chk = s["phases"], s["student_check"] or {}
    student_ok = (ph.get("student") or {"rc": 0}).get("rc") == 0 and s["models"]["sft"].get("exists", False)
    out = [("the student was rebuilt from the GGUF and the SFT adapter", student_ok,
            str((ph.get("student") or {}).get("error"))),
           ("the rebuilt student writes the CPU's rewrites",
            bool(chk) and chk["equal"] == chk["rows"], f"{chk.get('equal')}/{chk.get('rows')}")]
    base = {"query_history", "teacher", "sft", "release"}
    if part in ("1", "all"):
        out.append(_eval_check(s["eval_sft"] or {}, ph.get("eval_sft") or {}, base, "eval (SFT half)"))
    if part == "1":
        return out
    grpo = ph.get("grpo") or {}
    err = grpo.get("error") or ""
    if rehearsal:
        log = work / "logs" / "grpo.log"
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        out += [("grpo: verl's validate_config passed", "All configuration checks passed" in text, ""),
                ("grpo: Ray started and the trainer built its workers",
                 "Started a local Ray instance" in text and "create worker group" in text, ""),
                ("grpo: not stopped by an import or config error", EARLY.search(err) is None, err[:200]),
                ("grpo: stopped where a GPU is needed", bool(GPU_BOUNDARY.search(err)), err[:200])]
    else:
        out += [("grpo trained its epoch and merged", grpo.get("rc") == 0 and s["models"]["rl"].get("lineage", False),
                 err[:200] or f"steps {[x['step'] for x in s['steps']]}")]
    out.append(_eval_check(s["eval"] or {}, ph.get("eval") or {}, base | (set() if rehearsal else {"rl"}), "eval"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.learn_collect", description=__doc__.split("\n")[0])
    ap.add_argument("work")
    ap.add_argument("out")
    ap.add_argument("--rehearse", action="store_true", help="judge a CPU rehearsal (GRPO ends at the GPU boundary)")
    ap.add_argument("--part", choices=("1", "2", "all"), default="all")
    args = ap.parse_args(argv)
    s = collect(Path(args.work), Path(args.out))
    checks = verdict(s, Path(args.work), rehearsal=args.rehearse, part=args.part)
    for name, p in s["phases"].items():
        print(f"{name}: rc {p['rc']} {p['wall_s']} s" + (f" ERROR {p['error']}" if p.get("error") else ""))
    print("reward per step:", s["reward"])
    print("gpu memory:", s["gpu_memory"])
    return conclude(s, checks, Path(args.out))


if __name__ == "__main__":
    raise SystemExit(main())
