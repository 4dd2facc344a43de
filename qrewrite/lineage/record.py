"""Per-model lineage: `models/T/{sft,sft-merged,rl}/lineage.json`, written by the rule that makes the model.

A lineage file records, for one model directory:

* `inputs`: the rule's direct inputs with their sha256 (a directory hashes as the sorted list of its
  files' relative paths and sha256s); an input that is itself a model directory with a lineage.json is
  *chained* (`chained`: that lineage file's path and sha256, verified recursively);
* `upstream`: every artifact back to the raw Excel (and the demo source it is built from), each with its
  sha256 and the rule + inputs that made it, walked through `qrewrite.paths.UPSTREAM`;
* `model`: the model directory's own files and their sha256 (lineage.json itself excluded);
* `samples`: row-level provenance of the training data: every SFT sample's `meta` names its query id, raw
  Excel row and teacher call key; `verify` checks each link against queries.jsonl and teacher.jsonl;
* the rule, its exact params, the validated config (secret-looking values stripped), code version (git
  commit + dirty flag), environment (hashes of the pinned requirements and the container definition),
  teacher / judge provider and model, tokens and cost spent, start / end time, host, Slurm job id.

`verify_lineage` recomputes every hash and returns the mismatches, first upstream first. Paths are stored
relative to the project root (the directory the pipeline runs in); `verify` finds the root from the
model directory's recorded path, so it works from any working directory.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

from .. import REPO
from ..errors import QrewriteError
from ..io_utils import read_json, read_jsonl, sha256_file, sha256_json, write_json
from ..paths import BASE_MODEL_KEY, OPTIONAL_INPUTS, UPSTREAM, artifact_paths
from ..reward import RULE_JUDGE_MODEL
from ..secret import assert_no_secrets, strip_secrets

FORMAT = "qrewrite-lineage/1"
LINEAGE_FILE = "lineage.json"

SAMPLE_LINKS = ("meta.query_id", "meta.raw_row", "meta.teacher_call_key")
# Bookkeeping files that are not content: Snakemake touches .snakemake_timestamp in a directory output after
# the job (i.e. after lineage.json was written) and again on `--touch`.
NOT_CONTENT = frozenset({".snakemake_timestamp"})


# ------------------------------------------------------------------------------------------------ hashing

def _dir_files(path: Path, exclude_top: tuple[str, ...] = ()) -> dict[str, str]:
    """relative path → sha256 for every regular file under `path` (symlinks: 'link:' + target)."""
    out = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name in NOT_CONTENT:
                continue
            full = Path(root) / name
            rel = full.relative_to(path).as_posix()
            if rel in exclude_top:
                continue
            out[rel] = "link:" + os.readlink(full) if full.is_symlink() else sha256_file(full)
    return out


def _files_digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel]}\n".encode("utf-8"))
    return h.hexdigest()


def hash_path(path: str | os.PathLike) -> tuple[str, str]:
    """(type, sha256) of a file or directory; raises QrewriteError if it does not exist."""
    p = Path(path)
    if p.is_file():
        return "file", sha256_file(p)
    if p.is_dir():
        return "dir", _files_digest(_dir_files(p))
    raise QrewriteError("artifact not found", file=str(path), hint="run the stage that produces it first")


# ------------------------------------------------------------------------------------------ environment

def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def code_version() -> dict:
    """Git commit of the code checkout and whether tracked files differ from it (untracked files ignored)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "dirty": None, "note": f"{REPO} is not a git checkout (or git is missing)"}
    status = _git("status", "--porcelain", "--untracked-files=no")
    from .. import __version__

    return {"git_commit": commit, "dirty": bool(status), "qrewrite_version": __version__}


def env_fingerprint(env: str) -> dict:
    """Hashes of the pinned requirements (envs/torch.txt + envs/<env>.txt) and containers/<env>.def."""
    files = {f"envs/{name}": REPO / "envs" / name for name in ("torch.txt", f"{env}.txt")}
    reqs = {rel: (sha256_file(p) if p.is_file() else None) for rel, p in files.items()}
    container = REPO / "containers" / f"{env}.def"
    return {
        "name": env,
        "requirements": reqs,
        "requirements_sha256": sha256_json(reqs) if all(reqs.values()) else None,
        "container_def": f"containers/{env}.def",
        "container_def_sha256": sha256_file(container) if container.is_file() else None,
        "in_container": bool(os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")),
    }


def run_info(started: float, ended: float) -> dict:
    iso = lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")  # noqa: E731
    return {"started": iso(started), "ended": iso(ended), "duration_s": round(ended - started, 3),
            "host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_cluster": os.environ.get("SLURM_CLUSTER_NAME")}


# ------------------------------------------------------------------------------------------- the chain

def _rel(path: str | os.PathLike) -> str:
    """Path as recorded: relative to the working directory (the project root) when inside it."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            return str(p)
    return os.path.normpath(p.as_posix())


def _tenant_cfg(config: dict, tenant: str | None) -> dict | None:
    if tenant is None:
        return None
    for t in config.get("tenants") or []:
        if t.get("name") == tenant:
            return t
    raise QrewriteError(f"tenant {tenant!r} is not in the config", hint="check tenants[] in config.yaml")


def _entry(key: str | None, path: str) -> dict:
    kind, digest = hash_path(path)
    entry = {"key": key, "path": path, "type": kind, "sha256": digest}
    lin = Path(path) / LINEAGE_FILE
    if kind == "dir" and lin.is_file():
        entry["lineage"] = lin.as_posix()
    return entry


def upstream_closure(tenant_cfg: dict | None, start_keys: list[str]) -> list[dict]:
    """Every artifact that `start_keys` derive from (themselves included), most upstream first.

    Each entry: key, path, type, sha256 and `made_by` ({rule, inputs: [keys]}) when a pipeline rule makes it.
    """
    if tenant_cfg is None:
        return []
    paths = artifact_paths(tenant_cfg)
    order: list[str] = []
    seen: set[str] = set()

    def visit(key: str) -> None:
        if key in seen:
            return
        seen.add(key)
        rule = UPSTREAM.get(key)
        if _made_here(rule, paths):
            for dep in rule[1]:
                if dep in paths:
                    visit(dep)
        order.append(key)

    for k in start_keys:
        visit(k)
    out = []
    for key in order:
        if key not in paths:
            continue
        entry = _entry(key, paths[key])
        rule = UPSTREAM.get(key)
        if _made_here(rule, paths):
            entry["made_by"] = {"rule": rule[0], "inputs": [k for k in rule[1] if k in paths]}
        out.append(entry)
    return out


def _made_here(rule: tuple | None, paths: dict) -> bool:
    """Whether a pipeline rule makes the artifact for this tenant: every required input exists (a tenant without
    demo_source supplies its raw Excel; a missing gold or red-team set is simply not an input)."""
    return bool(rule) and all(k in paths for k in rule[1] if k not in OPTIONAL_INPUTS)


def _key_of(path: str, tenant_cfg: dict | None) -> str | None:
    if tenant_cfg is None:
        from ..paths import BASE_MODEL

        return BASE_MODEL_KEY if os.path.normpath(path) == os.path.normpath(BASE_MODEL) else None
    for key, p in artifact_paths(tenant_cfg).items():
        if os.path.normpath(p) == os.path.normpath(path):
            return key
    return None


def sample_provenance(closure: list[dict]) -> dict:
    """Row-level provenance of the SFT splits in the chain: where each sample's links point."""
    by_key = {e["key"]: e for e in closure}
    out = {}
    for split in ("train", "val"):
        if split not in by_key or "queries" not in by_key or "teacher" not in by_key:
            continue
        rows = read_jsonl(by_key[split]["path"])
        out[split] = {"path": by_key[split]["path"], "rows": len(rows), "links": list(SAMPLE_LINKS),
                      "queries": by_key["queries"]["path"], "teacher": by_key["teacher"]["path"],
                      "raw_excel": by_key["raw_excel"]["path"] if "raw_excel" in by_key else None}
    return out


def _providers(config: dict, closure: list[dict]) -> dict:
    teacher_cfg = config.get("teacher") or {}
    judge_cfg = ((config.get("reward") or {}).get("judge")) or {}
    provider = teacher_cfg.get("provider")
    teacher: dict = {"provider": provider,
                     "model": (teacher_cfg.get("openai") or {}).get("model") if provider == "openai" else None,
                     "base_url": (teacher_cfg.get("openai") or {}).get("base_url") if provider == "openai" else None}
    by_key = {e["key"]: e for e in closure}
    if "teacher" in by_key:  # what actually answered, from the teacher rows (provider/model per call)
        seen: dict[str, int] = {}
        for row in read_jsonl(by_key["teacher"]["path"]):
            name = f"{row.get('provider')}/{row.get('model')}"
            seen[name] = seen.get(name, 0) + 1
        teacher["calls_by_model"] = seen
        if provider != "openai" and len(seen) == 1:
            teacher["model"] = next(iter(seen)).split("/", 1)[1]
    jprov = judge_cfg.get("provider", "rule")
    judge = {"provider": jprov,
             "model": (judge_cfg.get("openai") or {}).get("model") if jprov == "openai" else RULE_JUDGE_MODEL,
             "base_url": (judge_cfg.get("openai") or {}).get("base_url") if jprov == "openai" else None}
    return {"teacher": teacher, "judge": judge}


def _upstream_usage(closure: list[dict]) -> dict:
    """Teacher tokens and cost behind the chain's data, summed over the teacher rows."""
    by_key = {e["key"]: e for e in closure}
    if "teacher" not in by_key:
        return {}
    rows = read_jsonl(by_key["teacher"]["path"])
    usage = [r.get("usage") or {} for r in rows]
    costs = [r.get("cost_usd") for r in rows if r.get("status") == "ok"]
    return {"teacher": {
        "calls": len(rows), "ok": sum(1 for r in rows if r.get("status") == "ok"),
        "prompt_tokens": sum(int(u.get("prompt_tokens") or 0) for u in usage),
        "completion_tokens": sum(int(u.get("completion_tokens") or 0) for u in usage),
        # a call whose price is unknown (model missing from the price table) makes the total unknown
        "cost_usd": None if any(c is None for c in costs) else round(sum(costs), 6)}}


def write_lineage(model_dir: str, *, rule: str, tenant: str | None, inputs: dict[str, str], params: dict,
                  config: dict, env: str, started: float, ended: float, usage: dict | None = None) -> Path:
    """Write `model_dir`/lineage.json for the model `rule` just made (see the module docstring).

    `inputs`: name → path of the rule's direct inputs; `params`: the exact hyper-parameters; `config`: the
    validated config; `env`: "swift" | "verl"; `started`/`ended`: epoch seconds; `usage`: tokens / cost / calls
    spent by the rule. Relative paths are relative to the working directory (the project root).
    """
    mdir = Path(model_dir)
    if not mdir.is_dir():
        raise QrewriteError("model directory not found", file=str(model_dir), hint="write the model first")
    tcfg = _tenant_cfg(config, tenant)
    direct, chained, start_keys = {}, [], []
    for name, path in sorted(inputs.items()):
        rel = _rel(path)
        key = _key_of(rel, tcfg)
        direct[name] = _entry(key, rel)
        if key is not None:
            start_keys.append(key)
        if "lineage" in direct[name]:
            lin = direct[name]["lineage"]
            chained.append({"path": lin, "sha256": sha256_file(lin)})
    closure = upstream_closure(tcfg, start_keys)
    model_files = _dir_files(mdir, exclude_top=(LINEAGE_FILE,))
    clean_config = strip_secrets(config)
    doc = {
        "format": FORMAT,
        "model": {"dir": _rel(mdir), "rule": rule, "tenant": tenant, "files": model_files,
                  "sha256": _files_digest(model_files)},
        "params": strip_secrets(params),
        "inputs": direct,
        "chained": chained,
        "upstream": closure,
        "samples": sample_provenance(closure),
        "providers": _providers(config, closure),
        "usage": {"rule": usage or {}, "upstream": _upstream_usage(closure)},
        "code": code_version(),
        "env": env_fingerprint(env),
        "run": run_info(started, ended),
        "config_sha256": sha256_json(clean_config),
        "config": clean_config,
    }
    assert_no_secrets(json.dumps(doc, ensure_ascii=False), str(mdir / LINEAGE_FILE))
    out = mdir / LINEAGE_FILE
    write_json(out, doc)
    return out


# ------------------------------------------------------------------------------------------------ verify

def load_lineage(model_dir: str | os.PathLike) -> tuple[dict, Path]:
    """(lineage document, project root) for `model_dir`."""
    path = Path(model_dir) / LINEAGE_FILE
    if not path.is_file():
        raise QrewriteError(f"no {LINEAGE_FILE} in the model directory", file=str(model_dir),
                            hint="lineage is written by the rule that makes the model; rerun it")
    try:
        doc = read_json(path)
    except ValueError as exc:
        raise QrewriteError(f"not valid JSON: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise QrewriteError(f"not a {FORMAT} document", file=str(path))
    return doc, project_root(model_dir, doc["model"]["dir"])


def project_root(model_dir: str | os.PathLike, recorded: str) -> Path:
    """The directory the recorded relative paths are relative to: `model_dir` minus the recorded dir."""
    here = Path(model_dir).resolve()
    rec = Path(recorded)
    if rec.is_absolute():
        return Path("/")
    parts = rec.parts
    if tuple(here.parts[-len(parts):]) != parts:
        return Path.cwd()  # moved or renamed: paths are taken relative to the working directory
    return here.parents[len(parts) - 1]


def _check(entry: dict, root: Path) -> str | None:
    p = root / entry["path"]
    try:
        kind, digest = hash_path(p)
    except QrewriteError:
        return "missing"
    if kind != entry["type"]:
        return f"was a {entry['type']}, is a {kind}"
    return None if digest == entry["sha256"] else f"sha256 {digest[:12]}… != recorded {entry['sha256'][:12]}…"


def _check_samples(doc: dict, root: Path) -> list[tuple[str, str]]:
    """Row-level links of every SFT sample: query id → queries.jsonl row (same raw row) → teacher call."""
    problems = []
    for split, spec in (doc.get("samples") or {}).items():
        try:
            queries = {q["id"]: q for q in read_jsonl(root / spec["queries"])}
            teacher = {t["id"]: t for t in read_jsonl(root / spec["teacher"])}
            rows = read_jsonl(root / spec["path"])
        except QrewriteError as exc:
            problems.append((spec["path"], str(exc)))
            continue
        for i, s in enumerate(rows, 1):
            meta = s.get("meta") or {}
            qid = meta.get("query_id")
            q, t = queries.get(qid), teacher.get(qid)
            where = f"{spec['path']} line {i} (query {qid})"
            if q is None:
                problems.append((where, f"query id not in {spec['queries']}"))
            elif q.get("row") != meta.get("raw_row"):
                problems.append((where, f"raw_row {meta.get('raw_row')} but {spec['queries']} says row {q.get('row')}"))
            elif t is None or t.get("call_key") != meta.get("teacher_call_key") or t.get("status") != "ok":
                problems.append((where, f"teacher call {str(meta.get('teacher_call_key'))[:12]}… not an ok row "
                                        f"of {spec['teacher']}"))
            if problems:
                break
    return problems


def verify_lineage(model_dir: str | os.PathLike, _seen: set | None = None) -> list[tuple[str, str]]:
    """Recompute every hash; [(artifact, problem)], most upstream first; [] if everything matches."""
    seen = _seen if _seen is not None else set()
    doc, root = load_lineage(model_dir)
    problems: list[tuple[str, str]] = []
    for entry in doc["upstream"]:
        why = _check(entry, root)
        if why:
            problems.append((entry["path"], why))
    for name, entry in doc["inputs"].items():
        if entry["path"] not in {e["path"] for e in doc["upstream"]}:
            why = _check(entry, root)
            if why:
                problems.append((entry["path"], why))
    for ch in doc["chained"]:
        lin = root / ch["path"]
        if not lin.is_file():
            problems.append((ch["path"], "missing"))
            continue
        if sha256_file(lin) != ch["sha256"]:
            problems.append((ch["path"], "chained lineage file changed"))
        key = str(lin.resolve())
        if key not in seen:
            seen.add(key)
            problems += [(p, f"{why} (via {ch['path']})") for p, why in verify_lineage(lin.parent, seen)]
    mdir = root / doc["model"]["dir"]
    files = _dir_files(mdir, exclude_top=(LINEAGE_FILE,)) if mdir.is_dir() else {}
    if files != doc["model"]["files"]:
        changed = sorted(set(files) ^ set(doc["model"]["files"]) |
                         {f for f in files if f in doc["model"]["files"] and files[f] != doc["model"]["files"][f]})
        problems.append((f"{doc['model']['dir']}/{changed[0]}" if changed else doc["model"]["dir"],
                         "model file changed, added or removed"))
    if not problems:
        problems += _check_samples(doc, root)
    # first upstream first, each artifact once
    out, named = [], set()
    for p, why in problems:
        if p not in named:
            named.add(p)
            out.append((p, why))
    return out


# -------------------------------------------------------------------------------------------------- show

def render_tree(model_dir: str | os.PathLike, _depth: int = 0, _seen: set | None = None) -> str:
    """The chain as a tree: model ← rule ← inputs ← … back to the raw Excel."""
    doc, root = load_lineage(model_dir)
    seen = _seen if _seen is not None else set()
    by_key = {e["key"]: e for e in doc["upstream"] if e.get("key")}
    m = doc["model"]
    lines = [f"{m['dir']}  [{m['sha256'][:12]}]  made by rule `{m['rule']}`"
             + (f" (tenant {m['tenant']})" if m.get("tenant") else "")]
    if _depth == 0:
        code, run, env = doc["code"], doc["run"], doc["env"]
        dirty = "" if code.get("git_commit") is None else (" (dirty)" if code.get("dirty") else " (clean)")
        lines.append(f"  code: {code.get('git_commit') or 'unknown'}{dirty}; env {env['name']} "
                     f"requirements {str(env.get('requirements_sha256'))[:12]}, container "
                     f"{str(env.get('container_def_sha256'))[:12]}")
        lines.append(f"  run: {run['started']} → {run['ended']} on {run['host']}"
                     + (f", Slurm job {run['slurm_job_id']}" if run.get("slurm_job_id") else ""))
        pv = doc["providers"]
        lines.append(f"  teacher: {pv['teacher'].get('provider')}/{pv['teacher'].get('model')}; judge: "
                     f"{pv['judge'].get('provider')}/{pv['judge'].get('model')}")
        if doc["usage"].get("rule") or doc["usage"].get("upstream"):
            lines.append(f"  usage: {doc['usage']}")
        if doc.get("params"):
            lines.append(f"  params: {doc['params']}")

    shown: set[str] = set()

    def node(key_or_entry, indent: str, last: bool) -> None:
        e = key_or_entry if isinstance(key_or_entry, dict) else by_key.get(key_or_entry)
        if e is None:
            return
        branch = "└── " if last else "├── "
        made = f"  ← {e['made_by']['rule']}" if e.get("made_by") else ""
        again = e["path"] in shown and bool(e.get("made_by"))
        lines.append(f"{indent}{branch}{e['path']}  [{e['sha256'][:12]}]{made}" + ("  (see above)" if again else ""))
        if again:
            return
        shown.add(e["path"])
        sub = indent + ("    " if last else "│   ")
        if e.get("lineage") and str((root / e["lineage"]).resolve()) not in seen:
            seen.add(str((root / e["lineage"]).resolve()))
            lines.append(f"{sub}(chained lineage: {e['lineage']})")
        deps = e["made_by"]["inputs"] if e.get("made_by") else []
        deps = [d for d in deps if d in by_key]
        for i, d in enumerate(deps):
            node(d, sub, i == len(deps) - 1)

    entries = list(doc["inputs"].values())
    for i, e in enumerate(entries):
        node(by_key.get(e["key"], e) if e.get("key") else e, "  ", i == len(entries) - 1)
    if doc.get("samples"):
        for split, s in doc["samples"].items():
            lines.append(f"  rows: {s['path']}: {s['rows']} samples, each linked by {', '.join(s['links'])} "
                         f"to {s['queries']}, {s['raw_excel']} and {s['teacher']}")
    return "\n".join(lines)


def trace_sample(model_dir: str | os.PathLike, sample: str) -> str:
    """One training sample back to its raw Excel row and teacher call. `sample`: a query id or SPLIT:LINE."""
    doc, root = load_lineage(model_dir)
    for split, spec in (doc.get("samples") or {}).items():
        rows = read_jsonl(root / spec["path"])
        for i, s in enumerate(rows, 1):
            meta = s.get("meta") or {}
            if sample not in (meta.get("query_id"), f"{split}:{i}"):
                continue
            qid = meta.get("query_id")
            q = next((r for r in read_jsonl(root / spec["queries"]) if r["id"] == qid), None)
            t = next((r for r in read_jsonl(root / spec["teacher"]) if r["id"] == qid), None)
            out = [f"sample {spec['path']} line {i}: query {qid}",
                   f"  assistant (target): {s['messages'][-1]['content']}",
                   f"  ← {spec['queries']}: row {q['row'] if q else '?'}: {q['query'] if q else 'NOT FOUND'}"]
            if spec.get("raw_excel") and (root / spec["raw_excel"]).is_file():
                from ..config import tenant_config
                from ..data.excel import read_excel

                tcfg = tenant_config(doc["config"], doc["model"]["tenant"])
                cells = next((r for r in read_excel(root / spec["raw_excel"], tcfg["columns"], tcfg.get("sheet"))
                              if r["row"] == meta.get("raw_row")), None)
                out.append(f"  ← {spec['raw_excel']} row {meta.get('raw_row')}: {cells}")
            out.append(f"  ← {spec['teacher']}: call {meta.get('teacher_call_key')} "
                       f"({t.get('provider')}/{t.get('model')}, status {t.get('status')}, "
                       f"tokens {((t.get('usage') or {}).get('total_tokens'))})" if t else "  ← teacher call NOT FOUND")
            return "\n".join(out)
    raise QrewriteError(f"no training sample {sample!r} in this model's lineage",
                        hint="give a query id (q-...) or SPLIT:LINE, e.g. train:1")
