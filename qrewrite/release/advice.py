"""What a tenant's owner could try next, read off the release's validation figures alone (pure).

The release protects the tenant (never below its first candidate, query + history, on validation); this says where
the student itself falls short of that rule and which `sft_targets` setting trains it on what retrieval wants
(docs/training.md). It changes nothing: release.json and the report carry the lines, the log warns.
"""

from __future__ import annotations

from .score import is_plain


def advise(figures: list[dict], cands: list[dict], sft_targets: str) -> list[str]:
    """Lines of advice. `figures` and `cands` as the release scored them (in release order, the rule first);
    `sft_targets` what the tenant's student learnt (config.tenant_sft_targets)."""
    if not figures or cands[0]["kind"] == "model" or figures[0].get("mean") is None:
        return []
    rule, rule_mean = figures[0]["name"], figures[0]["mean"]
    # the students as they are (no lever that pastes or routes text after them)
    plain = [(c["name"], f["mean"]) for c, f in zip(cands, figures) if is_plain(c) and f.get("mean") is not None]
    trailing = [(n, m) for n, m in plain if m < rule_mean]
    if not plain or len(trailing) < len(plain):
        return []
    who = ", ".join(f"{n} {m:.3f}" for n, m in trailing)
    line = (f"the student alone trails {rule} on validation ({who} vs {rule_mean:.3f}): what the tenant gets is "
            f"the release's choice, which pastes, routes or ships the rule where that retrieves better")
    # the student + the history, pasted at serving time: where that beats the rule, BM25 wants the history, and
    # `history` targets teach the student to write it (docs/training.md, "the history on every row")
    pasted = [(c["name"], f["mean"]) for c, f in zip(cands, figures)
              if (c.get("decoding") or {}).get("append_history") and f.get("mean") is not None and f["mean"] >= rule_mean]
    if sft_targets != "history" and pasted:
        best = max(pasted, key=lambda p: p[1])
        line += (f"; `sft_targets: history` on this tenant (config.yaml tenants[]) trains the student to write its "
                 f"rewrite + the history, which retrieved at least as well as the rule here ({best[0]} {best[1]:.3f}) "
                 "(docs/training.md, `sft_targets`)")
    elif sft_targets == "teacher":
        line += ("; `sft_targets: retrieval` on this tenant (config.yaml tenants[]) trains the student on the "
                 "retrieval-chosen targets instead of the teacher's rewrites (docs/training.md, `sft_targets`)")
    return [line]
