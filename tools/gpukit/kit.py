"""`make gpu-kit`: everything the verl GPU check needs, cut into chunks a device call can carry (docs/gpu-check.md).

The lent GPU machine has torch 2.11.0+cu130 and no network; one call carries at most 64 MiB (the ~2.5 MiB
working tree included). So this builds, under .gpu/ (git-ignored):

  plan       envs/verl-gpu.txt + envs/verl.txt resolved for CPython 3.12 / manylinux x86-64 (pip's resolver,
             metadata only); left home: the image's torch stack, what envs/gpu-image.txt lists at the resolved
             version, and envs/gpu-kit-exclude.txt (each name with its reason; a name that matches nothing
             resolved is an error: the list must follow the plan)
  wheels     the rest downloaded (sha256 checked against the plan); ray and xgrammar slimmed (gpukit.slim)
  payload    kit-payload.tar.gz: a tiny random Qwen2 with the base model's real tokenizer (gpukit.tiny_model),
             one tenant's RL data (results/T/rl) and reward check, as the pipeline made them
  chunks     chunk-00 .. chunk-NN of at most --max-mib (tools.gpukit.wheel_stage split), each with the
             manifest of every piece's sha256; kit.json says what travels, what stays and why, and the calls

The project's own code is not in the kit: each device call sends the working tree, so scripts/gpu_verl_check.sh,
qrewrite/ and this package (tools/gpukit/) are always the checkout's. The scripts run it as `python -m tools.gpukit.X`
from the repo root, which puts the root, and so both packages, on sys.path without an install.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from qrewrite import REPO
from qrewrite.errors import QrewriteError
from qrewrite.io_utils import atomic_path, write_json, write_tar_gz

from . import learn_kit
from . import wheel_stage as ws
from .slim import SLIM, slim_wheel

REQUIREMENTS = ("envs/verl-gpu.txt", "envs/verl.txt")
HAVE = "envs/gpu-image.txt"
EXCLUDE = "envs/gpu-kit-exclude.txt"
UNPIN = ("numpy",)  # envs/verl.txt's numpy 2.4.6 cannot go with vLLM 0.24.0's pins (mistral-common, numba)
PAYLOAD = "kit-payload.tar.gz"
MAX_MIB = 57.5  # + the working tree (~2.5 MiB) stays under a call's 64 MiB
TOTAL_MIB = 420


def read_exclude(path: str | Path = REPO / EXCLUDE) -> dict[str, str]:
    """name-or-glob -> reason, from `NAME REASON` lines."""
    out = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, why = line.partition(" ")
        if not why.strip():
            raise QrewriteError(f"line {n}: {name} has no reason", file=str(path), hint="write `NAME reason(...)`")
        out[ws.canon(name) if not any(c in name for c in "*?[") else name.lower()] = why.strip()
    return out


def check_exclude(report: dict, exclude: dict[str, str]) -> None:
    """Every exclusion must match a resolved package: a stale line hides what the list is for."""
    names = [ws.canon(i["metadata"]["name"]) for i in report.get("install", [])]
    stale = [p for p in exclude if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if stale:
        raise QrewriteError(f"{EXCLUDE} names packages the plan does not resolve: {', '.join(stale)}",
                            hint="remove them (or fix the name): the list records what is left home and why")


def _inputs_key(unpin: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for f in (*REQUIREMENTS, HAVE):
        h.update((REPO / f).read_bytes())
    h.update(json.dumps([ws.PYTHON_VERSION, ws.PLATFORMS, sorted(unpin)]).encode())
    return h.hexdigest()


def resolve_report(out: Path, pip_python: str) -> dict:
    """pip's install report, reused while the requirement files are unchanged (a resolve takes minutes)."""
    report, key_file = out / "plan.report.json", out / "plan.inputs"
    key = _inputs_key(UNPIN)
    if report.is_file() and key_file.is_file() and key_file.read_text().strip() == key:
        return json.loads(report.read_text(encoding="utf-8"))
    pins = [p for p in ws.read_pins([REPO / f for f in REQUIREMENTS]) if ws._pin_name(p) not in UNPIN]
    rep = ws.resolve(pins, out / "plan.built", pip=(pip_python, "-m", "pip"))
    with atomic_path(report) as tmp:
        tmp.write_text(json.dumps(rep) + "\n", encoding="utf-8")
    key_file.write_text(key + "\n")
    return rep


def carry_wheels(plan: dict, wheels: Path, carry: Path) -> list[dict]:
    """The plan's wheels into `carry` (hard links), the SLIM ones rewritten; one record per wheel."""
    rows = []
    for w in plan["wheels"]:
        src, dest = wheels / w["filename"], carry / w["filename"]
        row = {"name": w["name"], "version": w["version"], "file": w["filename"], "sha256_pypi": w["sha256"],
               "image_version": w["image_version"]}
        if w["name"] in SLIM:
            globs = [g for g, _ in SLIM[w["name"]]]
            dropped = slim_wheel(src, dest, globs)
            row["slimmed"] = {"dropped": dropped, "why": [why for _, why in SLIM[w["name"]]],
                              "mib_before": round(src.stat().st_size / ws.MIB, 2)}
        else:
            dest.unlink(missing_ok=True)
            os.link(src, dest)
        row["mib"] = round(dest.stat().st_size / ws.MIB, 2)
        row["sha256"] = ws.sha256_file(dest)
        rows.append(row)
    return rows


def build_payload(dest: Path, *, tenant: str, base: Path, model_python: str, work: Path, root: Path = REPO) -> dict:
    """kit-payload.tar.gz: model/ (tiny Qwen2), rl/ (the tenant's RL data), reward_check.json."""
    rl, check = root / "results" / tenant / "rl", root / "results" / tenant / "reward_check.json"
    missing = [str(p) for p in (rl / "train.parquet", rl / "val.parquet", rl / "val.swift.jsonl", check,
                                base / "config.json") if not p.is_file()]
    if missing:
        raise QrewriteError(f"the kit needs what the pipeline makes: missing {', '.join(missing)}",
                            hint=f"snakemake --cores 2 models/base results/{tenant}/rl/train.parquet "
                                 f"results/{tenant}/reward_check.json (make gpu-kit does)")
    if json.loads((base / "config.json").read_text(encoding="utf-8")).get("model_type") != "qwen2":
        raise QrewriteError(f"{base} is not the Qwen2.5 base: the check wants its real tokenizer",
                            hint="base_model.source: qwen2.5-0.5b (config.yaml's default)")
    model = work / "tiny-model"
    proc = subprocess.run([model_python, "-m", "tools.gpukit.tiny_model", str(base), str(model)],
                          cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise QrewriteError(f"tiny model: {model_python} failed:\n{proc.stderr[-2000:]}")
    tiny = json.loads(proc.stdout.strip().splitlines()[-1])
    write_tar_gz(dest, {"model": model, "rl": rl, "reward_check.json": check})
    return {"tenant": tenant, "tiny_model": tiny, "rl_files": sorted(p.name for p in rl.iterdir()),
            "mib": round(dest.stat().st_size / ws.MIB, 2)}


def calls(chunks: list[str]) -> list[dict]:
    """The device calls, back to back (the machine goes back after 30 s idle): one per chunk, the last one also runs
    part 1 of the check (install, imports, PPO to its step-2 checkpoint beside GRPO), then part 2 (the PPO resume)
    on the same machine, carrying nothing."""
    out = [{"carry": [f".gpu/chunks/{c}"], "timeout_s": 120,
            "command": f"python3 -m tools.gpukit.wheel_stage gather .gpu/chunks/{c} /tmp/qrw-gpu/stage"}
           for c in chunks[:-1]]
    out.append({"carry": [f".gpu/chunks/{chunks[-1]}"], "timeout_s": 480,
                "command": f"python3 -m tools.gpukit.wheel_stage gather .gpu/chunks/{chunks[-1]} /tmp/qrw-gpu/stage"
                           " && PART=1 bash scripts/gpu_verl_check.sh /tmp/qrw-gpu/stage $OUT"})
    out.append({"carry": [], "timeout_s": 390, "command": "PART=2 bash scripts/gpu_verl_check.sh /tmp/qrw-gpu/stage $OUT"})
    return out


def build(out: Path, *, tenant: str, base: Path, pip_python: str, model_python: str, max_mib: float,
          root: Path = REPO) -> dict:
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    report = resolve_report(out, pip_python)
    exclude = read_exclude()
    check_exclude(report, exclude)
    plan = ws.make_plan(report, exclude=list(exclude), have=ws.read_have(REPO / HAVE), build_dir=out / "plan.built")
    write_json(out / "plan.json", plan)
    wheels, carry = out / "wheels", out / "carry"
    ws.download(plan, wheels, pip=(pip_python, "-m", "pip"))
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir()
    carried = carry_wheels(plan, wheels, carry)
    payload = build_payload(carry / PAYLOAD, tenant=tenant, base=base, model_python=model_python, work=out, root=root)
    manifest = ws.split(carry, out / "chunks", max_mib=max_mib)
    where = {p["wheel"]: sorted({q["chunk"] for q in manifest["pieces"] if q["wheel"] == p["wheel"]})
             for p in manifest["pieces"]}
    for row in carried:
        row["chunks"] = where[row["file"]]
    total = sum(f["size"] for f in manifest["files"]) / ws.MIB
    sizes = {c: round(sum(f.stat().st_size for f in (out / "chunks" / c).iterdir()) / ws.MIB, 2)
             for c in manifest["chunks"]}
    if total > TOTAL_MIB:
        raise QrewriteError(f"the kit is {total:.1f} MiB, over the {TOTAL_MIB} MiB budget",
                            hint=f"leave more at home ({EXCLUDE}) or slim more (tools/gpukit/slim.py)")
    def reason(s: dict) -> str:
        if s["why"] != "--exclude":
            return s["why"]
        return next(r for p, r in exclude.items() if fnmatch.fnmatchcase(s["name"], p))

    kit = {"made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": ws.PYTHON_VERSION,
           "requirements": list(REQUIREMENTS), "have": HAVE, "exclude": EXCLUDE, "unpinned": list(UNPIN),
           "total_mib": round(total, 1), "chunks": sizes, "max_mib": max_mib,
           "carried": carried + [{"name": "payload", "file": PAYLOAD, "mib": payload["mib"],
                                  "chunks": where[PAYLOAD]}],
           "payload": payload,
           "left_home": [{"name": s["name"], "version": s["version"], "why": reason(s)} for s in plan["skipped"]],
           "calls": calls(manifest["chunks"]), "build_s": round(time.monotonic() - t0, 1)}
    write_json(out / "kit.json", kit)
    # the CPU rehearsal's stand-in for the GPU image: what the kit leaves home because the image has it
    standin = sorted(f"{s['name']}=={s['version']}" for s in kit["left_home"]
                     if s["why"].startswith("image") or s["why"] == "the image's torch stack")
    text = "# what the GPU image holds (tools.gpukit.kit): the rehearsal's venv\n" + "\n".join(standin) + "\n"
    path = out / "image-standin.txt"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:  # unchanged: the venv is not rebuilt
        path.write_text(text, encoding="utf-8")
    return kit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.kit",
                                 description="Build the verl GPU check's kit under .gpu/ (docs/gpu-check.md).")
    ap.add_argument("--out", default=str(REPO / ".gpu"))
    ap.add_argument("--tenant", default="fivedoctors", help="whose RL data travels (results/T/rl)")
    ap.add_argument("--base", help="model folder whose tokenizer the tiny model takes (default ROOT/models/base: "
                    "the Qwen2.5 base the pipeline converts)")
    ap.add_argument("--pip-python", default=str(REPO / ".venvs" / "kit" / "bin" / "python"),
                    help="a Python whose pip resolves for the device (pip >= 25 reads metadata only: fast)")
    ap.add_argument("--model-python", default=str(REPO / ".venvs" / "verl" / "bin" / "python"),
                    help="a Python with transformers (the verl env: the version the device runs)")
    ap.add_argument("--max-mib", type=float, default=MAX_MIB)
    ap.add_argument("--learn-tenant", help="whose SFT student the learning run trains (default: --tenant)")
    ap.add_argument("--configfile", action="append", default=[],
                    help="config over config.yaml for the learning tenant, as snakemake --configfile (repeatable)")
    ap.add_argument("--swift-python", default=str(REPO / ".venvs" / "swift" / "bin" / "python"),
                    help="the CPU eval's Python (the swift env): it writes the student's reference rewrites")
    ap.add_argument("--root", default=str(REPO), help="the pipeline run whose results/, models/ and cache/gguf the "
                    "kit takes (default: this checkout)")
    ap.add_argument("--no-learn", action="store_true", help="the check's kit only, no learning run")
    args = ap.parse_args(argv)
    try:
        root = Path(args.root)
        kit = build(Path(args.out), tenant=args.tenant, base=Path(args.base or root / "models" / "base"),
                    pip_python=args.pip_python, model_python=args.model_python, max_mib=args.max_mib, root=root)
        learn = None if args.no_learn else learn_kit.build(
            Path(args.out), tenant=args.learn_tenant or args.tenant, root=root, configfiles=args.configfile,
            swift_python=args.swift_python, max_mib=args.max_mib, check_chunks=kit["chunks"])
    except (QrewriteError, subprocess.CalledProcessError) as e:
        print(f"gpu-kit: error: {e}", file=sys.stderr)
        return 2
    for c, mib in kit["chunks"].items():
        print(f"{c}  {mib:6.2f} MiB")
    print(f"{len(kit['carried'])} files, {kit['total_mib']} MiB in {len(kit['chunks'])} chunks; "
          f"{len(kit['left_home'])} resolved packages left home ({args.out}/kit.json says why); "
          f"built in {kit['build_s']} s")
    print("the check's device calls, back to back (docs/gpu-check.md):")
    for c in kit["calls"]:
        print(f"  carry={c['carry']} timeout_s={c['timeout_s']}: {c['command']}")
    if learn:
        learn_kit.print_plan(learn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
