"""Write lineage.json for the model a rule just made (what it holds: qrewrite.lineage.document)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import QrewriteError
from ..io_utils import read_jsonl, sha256_file, sha256_json, write_json
from ..reward import RULE_JUDGE_MODEL
from ..secret import assert_no_secrets, strip_secrets
from ..lineage.container import in_image
from ..lineage.document import FORMAT, LINEAGE_FILE, model_files
from ..lineage.environment import code_version, env_fingerprint, run_info
from ..lineage.hashing import files_digest
from .upstream import artifact_entry, artifact_key, upstream_closure

SAMPLE_LINKS = ("meta.query_id", "meta.raw_row", "meta.teacher_call_key")


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


def sample_provenance(closure: list[dict]) -> dict:
    """Row-level provenance of the SFT splits in the chain: where each sample's links point."""
    by_key = {e["key"]: e for e in closure}
    out = {}
    for split in ("train", "val"):
        if split not in by_key or "queries" not in by_key or "teacher" not in by_key:
            continue
        # the training targets: validation also holds the rows the teacher failed on (measured, never learnt)
        rows = [r for r in read_jsonl(by_key[split]["path"]) if (r.get("meta") or {}).get("trainable", True)]
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
    """Write `model_dir`/lineage.json for the model `rule` just made (its fields: `qrewrite.lineage.document`).

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
        key = artifact_key(rel, tcfg)
        direct[name] = artifact_entry(key, rel)
        if in_image(rel):
            direct[name]["in_image"] = True
        if key is not None:
            start_keys.append(key)
        if "lineage" in direct[name]:
            lin = direct[name]["lineage"]
            chained.append({"path": lin, "sha256": sha256_file(lin)})
    closure = upstream_closure(tcfg, start_keys)
    files = model_files(mdir)
    clean_config = strip_secrets(config)
    doc = {
        "format": FORMAT,
        "model": {"dir": _rel(mdir), "rule": rule, "tenant": tenant, "files": files,
                  "sha256": files_digest(files)},
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
