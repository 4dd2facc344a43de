"""Score every candidate's rewrites on the same queries → eval.json, examples.jsonl, plots.json.

Per query and candidate: the rewrite goes through the tenant's RAG provider (`rag:` in config, the same
service the data half validated against) → Hit@1 / Hit@5 / reciprocal rank of the first gold document,
top1 reranker score, mean top3, quality q (``rag.quality``: the top hit's score, or the seed's 0.6·top1 +
0.4·mean top3); Hit@k and MRR are tie-aware (``qrewrite.metrics.TIE_RULE``); the reward's judge (same provider
and model as the RL reward) on a sampled share of queries, the same queries for every candidate (sampled
by query id) so judge scores pair up; win / tie / loss against the baseline (q higher / within
reward.epsilon / lower, as in the RL win term). Latency p50 / p95 and cost per 1000 rewrites come from
the rewrite rows. Paired comparisons are listed in `eval.compare`.
"""

from __future__ import annotations

import asyncio
import logging

from ..errors import QrewriteError
from ..metrics import TIE_RULE, gold_ranking, mean_top3, retrieval_quality, top1
from ..rag.providers import make_rag
from ..reward import reward_settings
from ..reward.formula import win
from ..reward.judges import make_tenant_judge
from ..reward.verdict import judge_sampled
from ..data.summary import summary_signals
from .. import stats

log = logging.getLogger(__name__)

METRICS = ("hit_at_1", "hit_at_5", "mrr", "top1", "mean_top3", "quality", "judge")
COMPARE_METRICS = ("hit_at_1", "mrr", "quality", "judge")
JUDGE_SALT = "eval"  # judge_sampled(query_id, JUDGE_SALT, share): a per-query draw, same for every candidate


async def _score_candidate(rag, judge, rows: list[dict], rewrites: dict[str, dict], share: float,
                           quality: str, references: dict[str, str] | None = None) -> list[dict]:
    """``references``: query id → the rewrite the judge grades against (the teacher's; a gold row's checked
    rewrite); a row without one is judged on form only."""
    references = references or {}

    async def one(row: dict) -> dict:
        rw = rewrites[row["query_id"]]
        text = (rw.get("rewrite") or "").strip() if rw.get("status") == "ok" else ""
        hits = await rag.search(row["query"], text) if text else []
        has_gold = bool(row["gold_doc_ids"])
        ranking = gold_ranking(hits, row["gold_doc_ids"]) if has_gold else None
        verdict = None
        if judge_sampled(row["query_id"], JUDGE_SALT, share):
            verdict = await judge.judge(row["query"], row["profile"], row["history"], text,
                                        references.get(row["query_id"]))
        return {
            "query_id": row["query_id"], "rewrite": text, "status": rw.get("status"),
            "hits": [h["doc_id"] for h in hits], "gold_rank": ranking["gold_rank"] if has_gold else None,
            "gold_tied": ranking["gold_tied"] if has_gold else None,
            "hit_at_1": ranking["hit_at_1"] if has_gold else None,     # tie-aware: metrics.TIE_RULE
            "hit_at_5": ranking["hit_at_5"] if has_gold else None,
            "mrr": ranking["rr"] if has_gold else None,
            "top1": round(top1(hits), 6), "mean_top3": round(mean_top3(hits), 6),
            "quality": round(retrieval_quality(hits, quality), 6),
            "judge": verdict.score if verdict is not None and verdict.ok else None,
            "judge_reason": verdict.reason if verdict is not None else None,
            "judge_failed": verdict is not None and not verdict.ok,
            "latency_s": rw.get("latency_s"), "compute_s": rw.get("compute_s"), "cost_usd": rw.get("cost_usd"),
        }

    return list(await asyncio.gather(*(one(r) for r in rows)))


def _cost_per_1k(rewrites: list[dict], kind: str) -> tuple[float | None, str]:
    if kind in ("raw", "query_history"):
        return 0.0, "no rewrite call"
    costs = [r.get("cost_usd") for r in rewrites if r.get("status") == "ok"]
    basis = {"model": "eval.gpu_hour_usd x generation time", "openai": "teacher.prices x tokens",
             "teacher": "teacher rows (teacher.prices x tokens; 0 for the embedded resolve/prf teachers)",
             "release": "the released model: eval.gpu_hour_usd x generation time (0: a released rule calls nothing)"
             }[kind]
    if not costs or any(c is None for c in costs):
        return None, basis + " (unknown: a price is missing)"
    return round(1000.0 * sum(costs) / len(costs), 6), basis


async def _score_all(cfg: dict, tenant: dict, rows: list[dict], rewrites: dict[str, list[dict]],
                     gold_rows: list[dict] | None = None, references: dict[str, str] | None = None) -> dict:
    settings = reward_settings(cfg)
    rag = make_rag(cfg, tenant)
    judge = make_tenant_judge(settings, tenant, settings["cache_dir"], rag)
    share = cfg["eval"]["judge_sample_share"]
    try:
        out = {}
        for name, by_id in _by_id(rewrites, rows, "eval queries").items():
            out[name] = await _score_candidate(rag, judge, rows, by_id, share, cfg["rag"]["quality"], references)
        gold = {}
        if gold_rows:  # after the split's rows, so the judge counters above stay the split's own
            from .sets import CHECKED

            checked = {r["query_id"]: {"status": "ok", "rewrite": r["checked_rewrite"]} for r in gold_rows}
            gold_refs = {r["query_id"]: r["checked_rewrite"] for r in gold_rows}  # what a person checked
            for name, rws in [(CHECKED, None), *rewrites.items()]:
                by_id = checked if rws is None else {r["query_id"]: r for r in rws}
                missing = [r["query_id"] for r in gold_rows if r["query_id"] not in by_id]
                if missing:
                    raise QrewriteError(f"candidate {name} has no rewrite for {len(missing)} gold-set rows "
                                        f"(first: {missing[0]})", hint="rerun its eval-rewrites step")
                gold[name] = await _score_candidate(rag, judge, gold_rows, by_id, share, cfg["rag"]["quality"],
                                                    gold_refs)
        judge_stats = judge.stats() if hasattr(judge, "stats") else {}
        if getattr(judge, "calls", 0) and getattr(judge, "refused_everything", lambda: False)():
            raise judge.refusal_error()  # no judge score came back: an eval without them must not exit 0
        return {"scored": out, "gold": gold, "judge_stats": judge_stats, "judge_model": getattr(judge, "model", None),
                "judge_provider": getattr(judge, "provider", None)}
    finally:
        await rag.aclose()
        await judge.aclose()


def evaluate(cfg: dict, tenant: dict, rows: list[dict], rewrites: dict[str, list[dict]],
             info: dict[str, dict] | None = None, extra: list[dict] | None = None,
             references: dict[str, str] | None = None,
             reward_check: dict | None = None) -> tuple[dict, list[dict], list[dict]]:
    """(eval.json document, examples rows, plots rows) for `rewrites` = {candidate: rewrite rows}. `extra`: gold
    and red-team rows (`candidates.extra_rows`), reported apart under `gold_set` / `red_team`. `references`:
    query id → the teacher's rewrite, which the judge grades every candidate against; `reward_check`: the
    reward_check stage's document, whose judge and reward figures eval.json repeats under `signals`."""
    from .sets import gold_section, red_team_section

    gold_rows = [r for r in extra or [] if r["set"] == "gold"]
    red_rows = [r for r in extra or [] if r["set"] == "red_team"]
    ecfg = cfg["eval"]
    kinds = {c["name"]: c["kind"] for c in ecfg["candidates"]}
    unknown = sorted(set(rewrites) - set(kinds))
    if unknown:
        raise QrewriteError(f"rewrites given for candidates not in eval.candidates: {unknown}")
    baseline = ecfg["baseline"]
    if baseline not in rewrites:
        raise QrewriteError(f"eval.baseline {baseline!r} is not among the evaluated candidates {sorted(rewrites)}",
                            hint="set eval.baseline to a candidate name (default: teacher)")
    if cfg["rag"]["top_k"] < 5:
        raise QrewriteError(f"rag.top_k is {cfg['rag']['top_k']}: Hit@5 needs at least 5 retrieved documents",
                            hint="set rag.top_k: 5 or more")
    res = asyncio.run(_score_all(cfg, tenant, rows, rewrites, gold_rows, references))
    scored = res["scored"]
    boot = ecfg["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    eps = reward_settings(cfg)["epsilon"]
    base_q = [s["quality"] for s in scored[baseline]]

    candidates = {}
    split_ids = {r["query_id"] for r in rows}
    for name, per in scored.items():
        rws = [r for r in rewrites[name] if r["query_id"] in split_ids]  # gold / red-team rows are reported apart
        outcomes = [win(s["quality"], bq, eps) for s, bq in zip(per, base_q)]
        n = len(per)
        cost, basis = _cost_per_1k(rws, kinds[name])
        candidates[name] = {
            "kind": kinds[name],
            "model": next((r.get("model") for r in rws if r.get("model")), None),
            **({"released": rws[0]["released"]} if rws and rws[0].get("released") else {}),
            "n": n,
            "errors": sum(1 for r in rws if r.get("status") != "ok"),
            **{m: stats.mean_ci([s[m] for s in per], **bkw) for m in METRICS},
            "judge_failures": sum(1 for s in per if s["judge_failed"]),
            f"vs_{baseline}": {"win": outcomes.count(1), "tie": outcomes.count(0), "loss": outcomes.count(-1),
                               "win_rate": round(outcomes.count(1) / n, 6),
                               "loss_rate": round(outcomes.count(-1) / n, 6)},
            "latency_s": {"p50": stats.percentile([s["latency_s"] for s in per], 50),
                          "p95": stats.percentile([s["latency_s"] for s in per], 95),
                          "n": sum(1 for s in per if s["latency_s"] is not None)},
            "cost_per_1k_usd": cost, "cost_basis": basis,
            **({"generation": info[name]} if info and name in info else {}),
        }
        if any("degenerate" in r for r in rws):  # a local model: loops, cut-off and empty rewrites, counted
            candidates[name].update(_degenerate(name, rws, rows, per, scored.get("query_history"), bkw))

    comparisons = {}
    for a, b in ecfg["compare"]:
        if a not in scored or b not in scored:
            continue
        comparisons[f"{a}_vs_{b}"] = {m: stats.paired([s[m] for s in scored[a]], [s[m] for s in scored[b]], **bkw)
                                      for m in COMPARE_METRICS}

    headline = {}
    for name in ecfg["headline"]:
        if name in candidates:
            c = candidates[name]
            headline[name] = {"judge": c["judge"]["mean"], "hit_at_1": c["hit_at_1"]["mean"],
                              "top1": c["top1"]["mean"], "latency_p50_s": c["latency_s"]["p50"],
                              "latency_p95_s": c["latency_s"]["p95"], "cost_per_1k_usd": c["cost_per_1k_usd"]}

    doc = {
        "tenant": tenant["name"], "split": ecfg["split"], "n_queries": len(rows),
        "n_with_gold": sum(1 for r in rows if r["gold_doc_ids"]),
        "baseline": baseline,
        "rag": {"provider": cfg["rag"]["provider"], "top_k": cfg["rag"]["top_k"], "quality": cfg["rag"]["quality"],
                **({"score": cfg["rag"]["local"]["score"]} if cfg["rag"]["provider"] == "local" else {})},
        "tie_rule": TIE_RULE,
        "judge": {"provider": res["judge_provider"], "model": res["judge_model"],
                  "sample_share": ecfg["judge_sample_share"],
                  "judged_queries": sum(1 for r in rows if judge_sampled(r["query_id"], JUDGE_SALT,
                                                                         ecfg["judge_sample_share"])),
                  **res["judge_stats"]},
        "bootstrap": boot,
        # the judge's AUC (derived labels per kind of bad; hand labels, all and held-out) and the reward's
        # preference, from results/T/reward_check.json: what the judge column above can be trusted for
        "signals": {"reward_check": summary_signals(reward_check) if reward_check else None,
                    "judge": (reward_check or {}).get("judge"), "reward": (reward_check or {}).get("reward")},
        "headline": headline,
        "candidates": candidates,
        "comparisons": comparisons,
        "gold_set": gold_section(gold_rows, res["gold"], bkw) if gold_rows else None,
        "red_team": red_team_section(red_rows, _by_id(rewrites, red_rows, "red-team rows")) if red_rows else None,
    }
    return doc, _examples(cfg, rows, scored, rewrites), _plot_rows(candidates, baseline)


def _degenerate(name: str, rws: list[dict], rows: list[dict], per: list[dict], fallback: list[dict] | None,
                bkw: dict) -> dict:
    """A model's degenerate rewrites (qrewrite.runtime.degenerate), scored as generated in its own figures; beside
    them `with_fallback`: its Hit@1 / top1 had each degenerate rewrite been replaced by the stated fallback, the
    query with its history pasted after it (the query_history candidate's row)."""
    from ..runtime.degenerate import degeneracy, source_text, summarize

    by_id = {r["query_id"]: r for r in rws}

    def reason(row: dict) -> str | None:  # asked again here: the rule of the code that scores, not of the one that generated
        rw = by_id.get(row["query_id"], {})
        if rw.get("status") != "ok":
            return None
        # the model's own text (a lever or a fallback may send another); a trimmed loop ended where the loop began:
        # judged as finished
        return degeneracy(rw.get("model_rewrite", rw.get("rewrite")) or "", source=source_text(row),
                          finished=True if rw.get("loop_trimmed") else rw.get("finished"))

    reasons = [reason(row) for row in rows]
    out = {"degenerate": summarize(reasons, [s["query_id"] for s in per], [s["rewrite"] for s in per]),
           "loops_trimmed": sum(bool(by_id.get(r["query_id"], {}).get("loop_trimmed")) for r in rows)}
    routed = [by_id.get(r["query_id"], {}).get("routed_to") for r in rows]  # route_by_retrieval: what each row sent
    if any(routed):
        out["routed_to"] = {p: routed.count(p) for p in dict.fromkeys(p for p in routed if p)}
    # rows that sent query + history instead of the model's text (qrewrite.runtime.route: an empty rewrite), by why
    fell = [by_id.get(r["query_id"], {}).get("fallback") for r in rows]
    out["fallbacks"] = {f: fell.count(f) for f in dict.fromkeys(f for f in fell if f)}
    if out["degenerate"]["n"] and fallback is not None:
        mixed = [fb if why else s for s, fb, why in zip(per, fallback, reasons)]
        out["with_fallback"] = {"fallback": "query_history", "replaced": out["degenerate"]["n"],
                                **{m: stats.mean_ci([s[m] for s in mixed], **bkw) for m in ("hit_at_1", "top1")}}
        log.info("%s: %d degenerate rewrite(s) %s; with the query+history fallback Hit@1 would be %s (own: %s)",
                 name, out["degenerate"]["n"], out["degenerate"]["by_reason"],
                 out["with_fallback"]["hit_at_1"]["mean"], stats.mean_ci([s["hit_at_1"] for s in per], **bkw)["mean"])
    return out


def _by_id(rewrites: dict[str, list[dict]], rows: list[dict], what: str) -> dict[str, dict[str, dict]]:
    """{candidate: {query_id: rewrite row}}, every row of `rows` present (else a clear error)."""
    out = {}
    for name, rws in rewrites.items():
        by_id = {r["query_id"]: r for r in rws}
        missing = [r["query_id"] for r in rows if r["query_id"] not in by_id]
        if missing:
            raise QrewriteError(f"candidate {name} has no rewrite for {len(missing)} {what} (first: "
                                f"{missing[0]})", hint="rerun its eval-rewrites step")
        out[name] = by_id
    return out


def _examples(cfg: dict, rows: list[dict], scored: dict, rewrites: dict) -> list[dict]:
    """Biggest wins and losses of each compared pair by retrieval quality, every candidate side by side."""
    k = cfg["eval"]["examples"]
    out = []
    for a, b in cfg["eval"]["compare"]:
        if a not in scored or b not in scored:
            continue
        deltas = [(sa["quality"] - sb["quality"], i) for i, (sa, sb) in enumerate(zip(scored[a], scored[b]))]
        wins = sorted((d for d in deltas if d[0] > 0), key=lambda d: (-d[0], d[1]))[:k]
        losses = sorted((d for d in deltas if d[0] < 0), key=lambda d: (d[0], d[1]))[:k]
        for kind, picked in (("win", wins), ("loss", losses)):
            for delta, i in picked:
                row = rows[i]
                out.append({
                    "pair": f"{a}_vs_{b}", "a": a, "b": b, "outcome": kind, "delta_quality": round(delta, 6),
                    "query_id": row["query_id"], "raw_row": row["raw_row"], "query": row["query"],
                    "profile": row["profile"], "history": row["history"], "gold_doc_ids": row["gold_doc_ids"],
                    "candidates": {n: {"rewrite": s[i]["rewrite"], "gold_rank": s[i]["gold_rank"],
                                       "top1": s[i]["top1"], "quality": s[i]["quality"], "judge": s[i]["judge"],
                                       "hits": s[i]["hits"][:3]} for n, s in scored.items()},
                })
    return out


def _plot_rows(candidates: dict, baseline: str) -> list[dict]:
    """One flat record per candidate (DVC plots: bar charts across candidates)."""
    rows = []
    for name, c in candidates.items():
        rows.append({"candidate": name, **{m: c[m]["mean"] for m in METRICS},
                     "win_rate": c[f"vs_{baseline}"]["win_rate"], "latency_p50_s": c["latency_s"]["p50"],
                     "cost_per_1k_usd": c["cost_per_1k_usd"]})
    return rows
