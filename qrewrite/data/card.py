"""results/T/data_card.{md,json}: what a tenant's training data is, where it came from and what it is for.

Everything on the card is read off the pipeline's own files (nothing typed in by hand): the source files and
their sha256, the funnel from summary.json with the drops per reason, the language of the queries, the
difficulty mix per split, the gold and red-team sets, and the biases those numbers reveal (the threshold drops
per difficulty, a rule-based teacher, synthetic demo data). Models list the card in their lineage (it is an
input of SFT) and the HTML report links it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..io_utils import read_json, read_jsonl, sha256_file
from .red_team import ATTACKS, script_share
from .split import SPLITS, difficulty_label

FORMAT = "qrewrite-data-card/1"
# A gap this large between the threshold drop shares of two difficulty labels makes the kept data easier
# (or harder) than the tenant's traffic: worth a line under "known biases".
DROP_GAP = 0.05


def _source(role: str, path: str, rows: int | None = None) -> dict:
    return {"role": role, "path": path, "sha256": sha256_file(path), **({"rows": rows} if rows is not None else {})}


def _lines(path: str) -> int:
    return sum(1 for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip())


def _language(queries: list[dict], configured: str) -> dict:
    """Configured language vs the queries' script: the share of queries mostly in the configured script."""
    shares = [script_share(row["query"], configured) for row in queries]
    mostly = sum(1 for s in shares if s >= 0.6)
    return {"configured": configured, "queries": len(queries),
            "mostly_configured_script": mostly, "share": round(mostly / len(queries), 4) if queries else None}


def _difficulty(tenant: dict, queries: list[dict], splits: dict[str, list[dict]]) -> dict:
    by_id = {row["id"]: row for row in queries}
    mix = {"column": tenant["columns"].get("difficulty"),
           "ingested": dict(sorted(Counter(difficulty_label(row) for row in queries).items()))}
    for name, rows in splits.items():
        mix[name] = dict(sorted(Counter(difficulty_label(by_id[r["meta"]["query_id"]]) for r in rows).items()))
    return mix


def _biases(tenant: dict, summary: dict, gold: dict, red: dict) -> list[str]:
    out = []
    by_diff = summary.get("drops_by_difficulty") or {}
    shares = {k: v["drop_share"] for k, v in by_diff.items() if v.get("in")}
    if len(shares) > 1:
        hi, lo = max(shares, key=shares.get), min(shares, key=shares.get)
        gap = shares[hi] - shares[lo]
        detail = ", ".join(f"{k} {v:.1%}" for k, v in sorted(shares.items()))
        tail = (f": '{hi}' rows are under-represented among the training targets (gap {gap:.1%}), so the student "
                f"sees fewer of them than the tenant's traffic holds (validation and test keep every row)."
                if gap > DROP_GAP else f" (within {DROP_GAP:.0%} of each other).")
        out.append(f"The training filters would drop {detail} of the rows per difficulty label{tail}")
    elif tenant["columns"].get("difficulty") is None:
        out.append("No difficulty column is configured: whether the filters drop mostly hard rows is not measured.")
    provider = summary["teacher"]["provider"]
    if provider == "resolve":
        out.append("The teacher is the embedded rule-based resolver (not an LLM): a rewrite is the user's own words "
                   "with the KB's product/course name put in; a student learns that style and inherits its misses "
                   "(a wrong or missing referent), which the filters only catch when retrieval gets worse.")
    elif provider == "prf":
        out.append("The teacher is the embedded RM3 keyword expansion: rewrites append KB terms and are not questions "
                   "a person writes; a student learns to copy them.")
    else:
        out.append(f"The teacher is the LLM {summary['teacher'].get('model')}: its errors and style are learnt, and "
                   "validation keeps only rewrites the tenant's retriever rates well, so rewrites are biased toward "
                   "what that retriever rewards.")
    out += [f"Warning ({w['stage']} stage): {w['message']}" for w in summary.get("warnings", [])]
    hit = (summary.get("retrieval") or {}).get("hit_at_1") or {}
    if hit.get("n") is not None and summary["funnel"][0]["out"]:
        out.append(f"Gold documents exist for {hit['n']} of {summary['funnel'][0]['out']} ingested queries; retrieval "
                   "metrics cover only those.")
    if tenant.get("demo_source"):
        out.append(f"The queries are synthetic demo data ({tenant['demo_source']}, made by scripts/make_demo_data.py), "
                   "not real user traffic.")
    if gold.get("rows"):
        out.append(f"{gold['held_out_of_splits']} ingested rows (the gold set's and those asking the same questions) "
                   "are held out of every split; the gold set was chosen by a person, not sampled.")
    if red.get("rows"):
        out.append("The red-team set is hand-written and small (pass rates per attack rest on a few rows each).")
    return out


def build_card(cfg: dict, tenant: dict, *, queries: str, teacher: str, validated: str, splits: dict[str, str],
               summary: str) -> dict:
    from .gold_set import tenant_gold_set
    from .red_team import tenant_red_team

    q_rows = read_jsonl(queries)
    s = read_json(summary)
    split_rows = {name: read_jsonl(splits[name]) for name in SPLITS}
    sources = [_source("raw_excel", tenant["raw_excel"])]
    if tenant.get("demo_source"):
        sources.append(_source("demo_source", tenant["demo_source"], _lines(tenant["demo_source"])))
    sources.append(_source("kb", tenant["kb"]["path"], _lines(tenant["kb"]["path"])))
    gold_rows, red_rows = tenant_gold_set(tenant), tenant_red_team(tenant)
    gold, red = {}, {}
    if gold_rows:
        sources.append(_source("gold_set", tenant["gold_set"], len(gold_rows)))
        gold = {"path": tenant["gold_set"], "rows": len(gold_rows),
                "with_gold_docs": sum(1 for r in gold_rows if r["gold_doc_ids"]),
                "held_out_of_splits": s["dropped"]["split"].get("held_out_gold_set", 0),
                "use": "eval only (eval.json gold_set); never in train, val or test"}
    if red_rows:
        sources.append(_source("red_team", tenant["red_team"], len(red_rows)))
        red = {"path": tenant["red_team"], "rows": len(red_rows),
               "by_attack": {a: sum(1 for r in red_rows if r["attack"] == a) for a in ATTACKS},
               "eval_rows": sum(1 for r in red_rows if r["use"] == "eval"),
               "rl_rows": sum(1 for r in red_rows if r["use"] == "rl"),
               "use": "half of each attack type eval-only (eval.json red_team), the other half in RL prompts "
                      f"at rl.red_team_share = {cfg['rl']['red_team_share']}"}
    if tenant.get("judge_labels"):
        sources.append(_source("judge_labels", tenant["judge_labels"], _lines(tenant["judge_labels"])))
    artifacts = [{"key": k, "path": p, "sha256": sha256_file(p), "rows": _lines(p)}
                 for k, p in (("queries", queries), ("teacher", teacher), ("validated", validated),
                              *((n, splits[n]) for n in SPLITS))]
    funnel = [{**f, "drops": s["dropped"][f["stage"]]} for f in s["funnel"]]
    return {
        "format": FORMAT,
        "tenant": tenant["name"],
        "sources": sources,
        "artifacts": artifacts,
        "funnel": funnel,
        "splits": s["splits"],
        "language": _language(q_rows, tenant["language"]),
        "difficulty": _difficulty(tenant, q_rows, split_rows),
        "drops_by_difficulty": s.get("drops_by_difficulty") or {},
        "teacher": s["teacher"],
        # the teacher against the rules a tenant has without a model, on every ingested row with gold (the gate's)
        "teacher_fit": (s.get("stages", {}).get("validate") or {}).get("teacher_fit"),
        "split_basis": (s.get("stages", {}).get("split") or {}).get("basis"),
        "not_trainable": (s.get("stages", {}).get("split") or {}).get("not_trainable"),
        "filters": {"thresholds": tenant["thresholds"], "split": cfg["split"]},
        "retrieval": s.get("retrieval"),
        "gold_set": gold or None,
        "red_team": red or None,
        "known_biases": _biases(tenant, s, gold, red),
        "intended_use": [
            f"Training and evaluating a query-rewrite model for tenant {tenant['name']}'s RAG service "
            f"(KB {tenant['kb']['name']!r}, {tenant['language']}): the rewrite is a search query, never an answer.",
            "Not for answering users' questions and not for other tenants' knowledge bases. Validation and test "
            "hold every row of their question groups (the tenant's traffic); only training rows are filtered to "
            "the teacher's good rewrites.",
        ],
    }


def render_md(card: dict) -> str:
    t = card["tenant"]
    out = [f"# Data card: {t}", "",
           f"Generated by `qrewrite data-card` ({card['format']}); every number is read off the pipeline's files.", "",
           "## Intended use", "", *[f"- {x}" for x in card["intended_use"]], "",
           "## Sources", "", "| role | path | rows | sha256 |", "|---|---|---|---|",
           *[f"| {s['role']} | `{s['path']}` | {s.get('rows', '–')} | `{s['sha256'][:16]}…` |" for s in card["sources"]],
           "", "## Funnel", "", "| stage | in | out | dropped | drops per reason |", "|---|---|---|---|---|",
           *[f"| {f['stage']} | {f['in']} | {f['out']} | {f['dropped']} | "
             f"{', '.join(f'{k} {v}' for k, v in f['drops'].items()) or '–'} |" for f in card["funnel"]],
           "", f"Splits: {', '.join(f'{k} {v}' for k, v in card['splits'].items())}.", "",
           "## Artifacts", "", "| artifact | path | rows | sha256 |", "|---|---|---|---|",
           *[f"| {a['key']} | `{a['path']}` | {a['rows']} | `{a['sha256'][:16]}…` |" for a in card["artifacts"]],
           ""]
    lang = card["language"]
    out += ["## Language", "",
            f"Configured `{lang['configured']}`; {lang['mostly_configured_script']} of {lang['queries']} queries are "
            f"mostly in its script ({lang['share']:.1%}).", ""]
    d = card["difficulty"]
    labels = sorted({k for part in ("ingested", *SPLITS) for k in d.get(part, {})})
    out += ["## Difficulty mix", "", f"Column: `{d['column']}`.", "",
            "| label | ingested | " + " | ".join(SPLITS) + " | threshold drop share |", "|---" * (len(SPLITS) + 3) + "|",
            *[f"| {lab} | {d['ingested'].get(lab, 0)} | " + " | ".join(str(d[s].get(lab, 0)) for s in SPLITS)
              + f" | {card['drops_by_difficulty'].get(lab, {}).get('top1_drop_share', '–')} |" for lab in labels], ""]
    tch = card["teacher"]
    out += ["## Teacher", "", f"{tch['provider']}/{tch['model']}: {tch['new_calls']} new calls, {tch['cache_hits']} "
            f"cached, {tch['failed_calls']} failed; tokens {tch['tokens']}; cost {tch['cost_usd']}.", ""]
    fit = card.get("teacher_fit")
    if fit and fit.get("n"):
        def cell(k: str) -> str:
            m = fit[k]
            return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
        d = fit["teacher_minus_query_history"]
        out += ["Tie-aware Hit@1 on every ingested row with gold (" + str(fit["n"]) + " rows; a failed teacher call "
                "is a miss): what the teacher gives against what the tenant has without a model. A teacher below "
                "query + history stops the run before SFT (the training gate).", "",
                "| raw query | query + history | teacher | teacher − query + history |", "|---|---|---|---|",
                f"| {cell('raw')} | {cell('query_history')} | {cell('teacher')} | "
                f"{d['diff']} [{d['ci_low']}, {d['ci_high']}] |", ""]
    if card.get("not_trainable"):
        nt = card["not_trainable"]
        out += [f"Validation and test keep every row of their groups; rows that are no training target (kept, "
                f"measured like any other): " + "; ".join(f"{k}: " + (", ".join(f"{r} {n}" for r, n in v.items())
                                                                    or "none") for k, v in nt.items()) + ".", ""]
    if card["gold_set"]:
        g = card["gold_set"]
        out += ["## Gold set", "", f"`{g['path']}`: {g['rows']} rows with a rewrite a person checked "
                f"({g['with_gold_docs']} with gold documents); {g['held_out_of_splits']} ingested rows held out of "
                f"every split. Use: {g['use']}.", ""]
    if card["red_team"]:
        r = card["red_team"]
        out += ["## Red-team set", "", f"`{r['path']}`: {r['rows']} adversarial rows "
                f"({', '.join(f'{k} {v}' for k, v in r['by_attack'].items())}); {r['eval_rows']} eval-only, "
                f"{r['rl_rows']} for RL. Use: {r['use']}.", ""]
    out += ["## Known biases", "", *[f"- {x}" for x in card["known_biases"]], ""]
    return "\n".join(out)
