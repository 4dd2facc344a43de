"""`make gpu-kit`'s second half: the GPU learning run's student and data (docs/gpu-check.md "The learning run").

Beside the wheels (.gpu/chunks, kit.py), this stages under .gpu/learn/ what scripts/gpu_rl_learn.sh needs to train a
real student on the device and score it there, cut into its own chunks (.gpu/learn-chunks):

  base.gguf            the Qwen2.5 GGUF the base_model rule converted (cache/gguf, 491 MB, sha256 pinned)
  learn-payload.tar.gz config.yaml   config.yaml (+ --configfile) resolved, this one tenant (schema defaults filled)
                       kb.jsonl      the tenant's KB
                       sft/          models/T/sft: the SFT stage's LoRA adapter and its lineage
                       data/rl/      results/T/rl (the rl-data stage's prompts), data/reward_check.json
                       data/*.jsonl  the val and test splits, queries, teacher rows; the CPU eval's SFT rewrites
                                     (results/T/eval/sft.jsonl) where the eval ran
                       reference.json the first test rows rewritten by models/T/sft-merged on this CPU (the eval's
                                     generation): the rebuilt student must write the same (gpukit.student)

and the device calls with their seconds (`plan`): the chunk calls, then one call that runs the learning script, sized
by the measured start-up and an assumed step time, checked against the lease budget.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
from pathlib import Path

import yaml

from qrewrite import REPO
from qrewrite.config import merged_config_files, validate_config
from qrewrite.errors import QrewriteError
from qrewrite.io_utils import write_json, write_jsonl, write_tar_gz
from qrewrite.paths import tenant_paths
from qrewrite.training.base_model.qwen_wheels import QWEN_PINS

from . import wheel_stage as ws
from .run_config import LEARN, learn_steps

PAYLOAD = "learn-payload.tar.gz"
GGUF = "base.gguf"

# Lease seconds. Measured on the H200 (docs/gpu-check.md): the first call's machine start (~27 s), a chunk call
# (~5 s), the kit's install (14-15 s), verl + vLLM start-up (200-260 s with the tiny policy; 260 taken). Measured here
# on 2 CPU cores and taken as the device's: the student's conversion and merge (44 s). Planning figures for a 0.5B
# policy, to be replaced by the first run's: a GRPO step (16 prompts x 8 rollouts of <= 40 tokens) 12 s, the RL
# merge 40 s, the eval's SFT half (two generations of the validation rows, two of the test rows, the float32
# agreement pass) 90 s, its RL half 45 s.
SECONDS = {"machine_start": 30, "chunk_call": 5, "install": 20, "student": 45, "eval_sft": 90,
           "verl_start": 260, "step": 12, "merge": 40, "eval_rl": 45, "collect": 10}
BUDGET_S = 720  # of the lease's 900: a failed start or a rerun needs the rest
CALL_LIMIT_S = 600


def kit_config(root: Path, configfiles: list[str], tenant: str) -> tuple[dict, dict]:
    """(the resolved config with only `tenant`, its tenant block), schema defaults filled, KB path kb.jsonl."""
    raw = merged_config_files([root / f for f in ["config.yaml", *configfiles]])  # an absolute f stays itself
    names = [t["name"] for t in raw.get("tenants", [])]
    if tenant not in names:
        raise QrewriteError(f"tenant {tenant!r} is not in the config (tenants: {names})",
                            hint="pass the tenant's --configfile (e.g. data/durdev/config.yaml)")
    raw["tenants"] = [t for t in raw["tenants"] if t["name"] == tenant]
    cfg = validate_config(raw, source="gpu-kit learn config")
    if cfg["base_model"]["source"] != "qwen2.5-0.5b":
        raise QrewriteError(f"the learning run's student is the Qwen2.5 GGUF's; base_model.source is "
                            f"{cfg['base_model']['source']!r}", hint="base_model.source: qwen2.5-0.5b (config.yaml)")
    t = cfg["tenants"][0]
    kb = t["kb"]["path"]
    t["kb"]["path"] = "kb.jsonl"
    return cfg, {**t, "kb_source": kb}


def inputs(root: Path, tenant: str, kb: str) -> dict[str, Path]:
    """arcname -> file the payload takes (errors name what is missing and the command that makes it)."""
    p = {k: root / v for k, v in tenant_paths(tenant).items()}
    files = {"kb.jsonl": root / kb, "data/reward_check.json": p["reward_check"],
             "data/sft_val.jsonl": p["val"], "data/sft_test.jsonl": p["test"],
             "data/queries.jsonl": p["queries"], "data/teacher.jsonl": p["teacher"]}
    for f in ("train.parquet", "val.parquet", "train.swift.jsonl", "val.swift.jsonl"):
        files[f"data/rl/{f}"] = p["rl_dir"] / f
    for f in ("adapter_config.json", "adapter_model.safetensors", "lineage.json"):
        files[f"sft/{f}"] = p["sft_model"] / f
    missing = [str(v) for v in files.values() if not v.is_file()]
    if missing:
        raise QrewriteError(f"the learning kit needs what the pipeline makes: missing {', '.join(missing)}",
                            hint=f"snakemake --cores 2 models/{tenant}/sft-merged results/{tenant}/rl/train.parquet "
                                 f"results/{tenant}/reward_check.json (make gpu-kit does)")
    cpu = root / "results" / tenant / "eval" / "sft.jsonl"
    if cpu.is_file():
        files["data/cpu_eval_sft.jsonl"] = cpu
    return files


def reference(root: Path, tenant: str, cfg: dict, kb_source: str, work: Path, python: str) -> Path:
    """reference.json: models/T/sft-merged's rewrites of the first test rows, by the CPU eval's env (swift)."""
    from qrewrite.eval.candidates import eval_rows

    p = tenant_paths(tenant)
    merged = root / p["sft_merged"]
    if not (merged / "config.json").is_file():
        raise QrewriteError(f"no merged SFT model at {merged}", hint=f"snakemake --cores 2 models/{tenant}/sft-merged")
    work.mkdir(parents=True, exist_ok=True)
    rows = eval_rows(str(root / p["test"]), str(root / p["queries"]), None)
    write_jsonl(work / "rows.jsonl", rows)
    local = copy.deepcopy(cfg)
    local["tenants"][0]["kb"]["path"] = str(root / kb_source)
    (work / "config.yaml").write_text(yaml.safe_dump(local, allow_unicode=True, sort_keys=False), encoding="utf-8")
    out = work / "reference.json"
    proc = subprocess.run([python, "-m", "tools.gpukit.student", "reference", "--model", str(merged),
                           "--tenant-config", str(work / "config.yaml"), "--rows", str(work / "rows.jsonl"),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise QrewriteError(f"the CPU reference rewrites failed ({python}):\n{proc.stderr[-2000:]}")
    return out


def build_payload(dest: Path, cfg: dict, files: dict[str, Path], ref: Path) -> dict:
    write_tar_gz(dest, {**files, "reference.json": ref,
                        "config.yaml": yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False).encode()})
    return {"files": sorted(["config.yaml", "reference.json", *files]), "mib": round(dest.stat().st_size / ws.MIB, 2)}


def plan(check_chunks: dict[str, float], learn_chunks: dict[str, float], n_prompts: int) -> dict:
    """The device calls, back to back, with the MiB each carries and the seconds each is planned to take
    (chunk name -> MiB, for the wheels' chunks and the learning kit's)."""
    s = SECONDS
    steps = learn_steps(n_prompts)
    rl_s = s["verl_start"] + steps * s["step"] + s["merge"]  # from GRPO's start, in part 1, to its merged model
    part1 = s["install"] + s["student"] + s["eval_sft"] + s["collect"]
    part2 = max(0, rl_s - s["eval_sft"]) + s["eval_rl"] + s["collect"]
    calls = [{"carry": [f".gpu/chunks/{c}"], "mib": mib, "timeout_s": 120, "planned_s": s["chunk_call"],
              "command": f"python3 -m tools.gpukit.wheel_stage gather .gpu/chunks/{c} /tmp/qrw-gpu/stage"}
             for c, mib in check_chunks.items()]
    *head, last = learn_chunks
    calls += [{"carry": [f".gpu/learn-chunks/{c}"], "mib": learn_chunks[c], "timeout_s": 120,
               "planned_s": s["chunk_call"],
               "command": f"python3 -m tools.gpukit.wheel_stage gather .gpu/learn-chunks/{c} "
                          f"/tmp/qrw-gpu/learn-stage"} for c in head]
    run = "bash scripts/gpu_rl_learn.sh /tmp/qrw-gpu/stage /tmp/qrw-gpu/learn-stage $OUT"
    rl_budget = CALL_LIMIT_S - 30 + s["eval_sft"]  # GRPO may run on into part 2's call, not past it
    calls.append({"carry": [f".gpu/learn-chunks/{last}"], "mib": learn_chunks[last], "timeout_s": part1 + 120,
                  "planned_s": part1,
                  "command": f"python3 -m tools.gpukit.wheel_stage gather .gpu/learn-chunks/{last} "
                             f"/tmp/qrw-gpu/learn-stage && PART=1 DEADLINE_S={part1 + 100} RL_BUDGET_S={rl_budget} "
                             + run})
    calls.append({"carry": [], "mib": 0.0, "timeout_s": CALL_LIMIT_S, "planned_s": part2,
                  "command": f"PART=2 DEADLINE_S={CALL_LIMIT_S - 15} " + run})
    total = s["machine_start"] + sum(c["planned_s"] for c in calls)
    return {"calls": calls, "mib": round(sum(c["mib"] for c in calls), 1), "steps": steps, "prompts": n_prompts, "prompts_per_step": LEARN["train_batch_size"],
            "rollouts_per_prompt": LEARN["rollout_n"], "seconds": s, "planned_s": total, "budget_s": BUDGET_S,
            "rl_s": rl_s, "fits": total <= BUDGET_S and part2 + 60 <= CALL_LIMIT_S}


def build(out: Path, *, tenant: str, root: Path, configfiles: list[str], swift_python: str, max_mib: float,
          check_chunks: dict[str, float]) -> dict:
    cfg, t = kit_config(root, configfiles, tenant)
    files = inputs(root, tenant, t["kb_source"])
    gguf = root / "cache" / "gguf" / QWEN_PINS.gguf_name
    if not gguf.is_file() or gguf.stat().st_size != QWEN_PINS.gguf_bytes:
        raise QrewriteError(f"no complete base GGUF at {gguf}", hint="snakemake --cores 2 models/base (make gpu-kit)")
    work, carry = out / "learn", out / "learn" / "carry"
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir(parents=True)
    ref = reference(root, tenant, cfg, t["kb_source"], work, swift_python)
    payload = build_payload(carry / PAYLOAD, cfg, files, ref)
    (carry / GGUF).unlink(missing_ok=True)
    try:
        (carry / GGUF).hardlink_to(gguf)
    except OSError:  # another file system
        shutil.copy2(gguf, carry / GGUF)
    manifest = ws.split(carry, out / "learn-chunks", max_mib=max_mib)
    n_prompts = sum(1 for _ in open(files["data/rl/train.swift.jsonl"], encoding="utf-8"))
    sizes = {c: round(sum(f.stat().st_size for f in (out / "learn-chunks" / c).iterdir()) / ws.MIB, 2)
             for c in manifest["chunks"]}
    calls = plan(check_chunks, sizes, n_prompts)
    if not calls["fits"]:
        raise QrewriteError(f"the learning run's calls are planned at {calls['planned_s']} s, over the "
                            f"{BUDGET_S} s budget (or its last call within a minute of {CALL_LIMIT_S} s)",
                            hint="fewer RL prompts (rl.val_share, the split) or a larger train_batch_size (LEARN)")
    learn = {"tenant": tenant, "configfiles": configfiles, "gguf": {"file": str(gguf), "sha256": QWEN_PINS.gguf_sha256,
                                                                   "mib": round(gguf.stat().st_size / ws.MIB, 1)},
             "payload": payload, "chunks": manifest["chunks"],
             "mib": round(sum(f["size"] for f in manifest["files"]) / ws.MIB, 1), "plan": calls,
             "reference_rows": len(json.loads(ref.read_text(encoding="utf-8"))["rewrites"])}
    write_json(out / "learn.json", learn)
    return learn


def print_plan(learn: dict) -> None:
    p = learn["plan"]
    mib = learn["mib"]
    print(f"learning run ({learn['tenant']}): student + data {mib} MiB in {len(learn['chunks'])} chunks; "
          f"GRPO {p['steps']} steps x {p['prompts_per_step']} prompts x {p['rollouts_per_prompt']} rollouts "
          f"(one epoch of {p['prompts']} prompts)")
    print(f"device calls, back to back: {len(p['calls'])} carrying {p['mib']} MiB, planned {p['planned_s']} s of the "
          f"{p['budget_s']} s budget ({math.ceil(p['planned_s'] / 60)} min, machine start included):")
    for c in p["calls"]:
        print(f"  ~{c['planned_s']:>4} s {c['mib']:6.2f} MiB  carry={c['carry']} timeout_s={c['timeout_s']}: "
              f"{c['command']}")
