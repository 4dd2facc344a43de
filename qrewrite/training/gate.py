"""The training gate (stage training_gate, before SFT): is there a student worth training on this data?

Two checks, each from the data half's own figures (results/T/summary.json):

* **the teacher fits**: its rewrites' tie-aware Hit@1 over every ingested row with gold (a failed call a miss) is
  not below query + history's (the validate stage's `teacher_fit`). A student learns to imitate its teacher: taught
  by one that retrieves worse than pasting the history, it cannot give the tenant more than the rule it already has.
* **enough training rows**: the split kept at least `gate.min_train_rows` training targets.

With `tenants[].student: auto` a failed check stops the run before SFT; the error's first lines give the figures
and what to set. `always` trains anyway (the findings are warnings in gate.json and the log); `never` has no gate:
the tenant runs the rules only.
"""

from __future__ import annotations

import logging

from ..errors import QrewriteError

log = logging.getLogger(__name__)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def findings(cfg: dict, tenant: dict, summary: dict) -> tuple[list[dict], dict]:
    """([{check, message, fix}], the figures read) of the gate's checks on `summary` (summary.json)."""
    from ..config import tenant_teacher

    gate = cfg["gate"]
    teacher = tenant_teacher(cfg, tenant)
    fit = (summary.get("stages", {}).get("validate") or {}).get("teacher_fit") or {}
    split = summary.get("stages", {}).get("split") or {}
    train = summary["splits"].get("train", 0)
    figures = {"teacher_provider": teacher["provider"], "teacher_fit": fit, "train_rows": train,
               "min_train_rows": gate["min_train_rows"]}
    out = []
    t, qh, raw = ((fit.get(k) or {}).get("mean") for k in ("teacher", "query_history", "raw"))
    if gate["teacher_vs_query_history"] and fit.get("n") and t is not None and qh is not None and t < qh:
        diff = fit.get("teacher_minus_query_history") or {}
        out.append({
            "check": "teacher_vs_query_history",
            "message": (f"the teacher ({teacher['provider']}) puts a gold document first for {_pct(t)} of the "
                        f"{fit['n']} rows with gold, below query + history's {_pct(qh)} (raw query {_pct(raw)}; "
                        f"teacher − query + history {diff.get('diff')} [{diff.get('ci_low')}, {diff.get('ci_high')}]"
                        f"{'; ' + str(fit['teacher_failed']) + ' calls failed' if fit.get('teacher_failed') else ''}): "
                        "a student that imitates it would retrieve worse than pasting the history"),
            "fix": ("use a teacher that fits this tenant: teacher.provider: openai with an API (README, \"Pointing at "
                    "real services\"), or teacher.provider: column with people's rewrites (tenants[].columns."
                    "rewrite); `qrewrite tenant init` says which teachers fit a KB (resolve needs product or course "
                    "titles: entity + aspect)")})
    if train < gate["min_train_rows"]:
        dropped = {k: v for k, v in (split.get("dropped") or {}).items() if k != "held_out_gold_set"}
        most = max(dropped, key=dropped.get) if dropped else None
        out.append({
            "check": "min_train_rows",
            "message": (f"the split kept {train} training rows, under gate.min_train_rows ({gate['min_train_rows']})"
                        + (f"; not training targets in its training groups: "
                           + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items(), key=lambda kv: -kv[1]))
                           if dropped else "")),
            "fix": (f"the most rows were lost to {most} (summary.json → stages.split; the split stage's warning "
                    "names its setting); a better-fitting teacher keeps more rows; or add rows to the Excel"
                    if most else "add rows to the tenant's Excel")})
    return out, figures


def run_gate(cfg: dict, tenant: dict, summary: dict) -> dict:
    """gate.json's document; raises QrewriteError where tenants[].student is auto and a check failed."""
    found, figures = findings(cfg, tenant, summary)
    mode = tenant.get("student") or "auto"
    name = tenant["name"]
    if found and mode == "auto":
        lines = [f"tenant {name}: stopped before SFT: {f['message']}." for f in found]
        fixes = "; ".join(f["fix"] for f in found)
        raise QrewriteError(
            "\n".join(lines),
            hint=(f"{fixes}. Or set tenants[].student: never for {name} to run the rules only (data half, the eval of "
                  "the rules and the teacher, a release chosen among the rules), or tenants[].student: always to "
                  "train anyway. The figures: results/{name}/summary.json, data_card.md (the teacher's fit)")
            .replace("{name}", name))
    for f in found:
        log.warning("tenant %s: %s (tenants[].student: always: training anyway)", name, f["message"])
    return {"tenant": name, "student": mode, "passed": not found, "findings": found, **figures}
