"""`qrewrite lineage show`: a lineage file as a tree back to the raw Excel, or one sample traced to its sources."""

from __future__ import annotations

import os

from ..errors import QrewriteError
from ..io_utils import read_jsonl
from .document import load_lineage


def render_tree(model_dir: str | os.PathLike) -> str:
    """The chain as a tree: model ← rule ← inputs ← … back to the raw Excel."""
    doc, root = load_lineage(model_dir)
    seen: set[str] = set()  # chained lineage files already named
    by_key = {e["key"]: e for e in doc["upstream"] if e.get("key")}
    m = doc["model"]
    lines = [f"{m['dir']}  [{m['sha256'][:12]}]  made by rule `{m['rule']}`"
             + (f" (tenant {m['tenant']})" if m.get("tenant") else "")]
    code, run, env = doc["code"], doc["run"], doc["env"]
    dirty = "" if code.get("git_commit") is None else (" (dirty)" if code.get("dirty") else " (clean)")
    image = env.get("container")
    lines.append(f"  code: {code.get('git_commit') or 'unknown'}{dirty}; env {env['name']} "
                 f"requirements {str(env.get('requirements_sha256'))[:12]}, recipe "
                 f"{str(env.get('container_recipe_sha256'))[:12]}; "
                 + (f"image {image['digest'][:19]} ({image['runtime']} {image['image']})" if image else "no container"))
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
            query_row = next((r for r in read_jsonl(root / spec["queries"]) if r["id"] == qid), None)
            t = next((r for r in read_jsonl(root / spec["teacher"]) if r["id"] == qid), None)
            out = [f"sample {spec['path']} line {i}: query {qid}",
                   f"  assistant (target): {s['messages'][-1]['content']}",
                   f"  ← {spec['queries']}: row {query_row['row'] if query_row else '?'}: {query_row['query'] if query_row else 'NOT FOUND'}"]
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
