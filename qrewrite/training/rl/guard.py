"""Did RL harm its SFT parent? Checked by the rl stage before it hands over models/T/rl.

Both models rewrite the RL validation prompts (greedy decoding, the eval's generation and prompt), and each rewrite
goes through the reward RL optimised (``reward.scorer``, every rollout judged) and, for a prompt with gold
documents, tie-aware Hit@1 through the tenant's RAG. The paired difference RL − SFT with its bootstrap interval
(``qrewrite.stats.paired``) says whether RL is worse beyond noise: the interval's upper end below 0 on Hit@1 (on the
reward where no prompt has gold). The model is kept either way; the verdict goes to the console, stats_rl and the
report. What the tenant gets is not decided here: the release stage chooses among query + history, SFT and RL on
validation (qrewrite.release). Both models' degenerate rewrites (qrewrite.runtime.degenerate) are counted.
"""

from __future__ import annotations

import logging

from ... import stats
from ...eval import reuse
from ...eval.candidates import generation_key
from ...runtime.generate import generate_rewrites, generation_kwargs
from ...io_utils import read_jsonl
from ...metrics import gold_ranking
from ...reward.adapter import sample_from_ground_truth
from ...reward.ground_truth import parse_ground_truth
from ...reward.scorer import RewardScorer

log = logging.getLogger(__name__)


def validation_rows(val_swift: str) -> list[dict]:
    """The RL validation prompts (rl-data's ms-swift layout) as generation rows, red-team rows left out (their
    checks are not a retrieval score)."""
    rows = []
    for rec in read_jsonl(val_swift):
        gt = parse_ground_truth(rec["ground_truth"])
        if gt.get("red_team"):
            continue
        rows.append({"query_id": gt["query_id"], "query": gt["query"], "profile": gt["profile"],
                     "history": gt["history"], "ground_truth": rec["ground_truth"],
                     "gold_doc_ids": gt.get("gold_doc_ids") or []})
    return rows


def compare_with_parent(cfg: dict, tenant: dict, *, parent: str, child: str, val_swift: str,
                        threads: int | None = None, generations: list | None = None) -> dict:
    """{n, reward: paired RL − SFT, hit_at_1: paired (rows with gold), worse_beyond_noise, basis, examples}.
    `generations`: each model's rewrites are appended to it (qrewrite.eval.reuse records) for the release."""
    rows = validation_rows(val_swift)
    if not rows:
        return {"n": 0, "worse_beyond_noise": None, "basis": None, "note": "no validation prompts"}
    gen = cfg["eval"]["generation"]
    device = "cuda" if cfg["train"]["device"] == "cuda" else "cpu"
    rewrites, degenerate = {}, {}
    for name, model in (("sft", parent), ("rl", child)):
        out, _ = generate_rewrites(model, tenant, rows, **generation_kwargs(gen, threads=threads, device=device))
        degenerate[name] = [r["degenerate"] for r in out]
        rewrites[name] = [r["rewrite"] for r in out]
        if generations is not None:
            generations.append(reuse.record(name, model, tenant, rows, generation_key(gen), device, rewrites[name]))
    scorer = RewardScorer(cfg, tenant)
    scorer.sample_share = 1.0  # judge every rewrite: the two models compared on the same terms
    try:
        scored = {name: scorer.score_batch([sample_from_ground_truth(r["ground_truth"], rollout=text)
                                            for r, text in zip(rows, texts)])
                  for name, texts in rewrites.items()}
        hits = {name: [scorer.run(scorer.retrieve(r["query"], text)) if r["gold_doc_ids"] else None
                       for r, text in zip(rows, texts)] for name, texts in rewrites.items()}
    finally:
        scorer.close()
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    hit1 = {name: [gold_ranking(h, r["gold_doc_ids"])["hit_at_1"] if h is not None else None
                   for r, h in zip(rows, hs)] for name, hs in hits.items()}
    reward = stats.paired([s["score"] for s in scored["rl"]], [s["score"] for s in scored["sft"]], **bkw)
    hit = stats.paired(hit1["rl"], hit1["sft"], **bkw)
    basis, diff = ("hit_at_1", hit) if hit["n"] else ("reward", reward)
    worse = diff["ci_high"] is not None and diff["ci_high"] < 0
    changed = [{"query": r["query"], "sft": a, "rl": b} for r, a, b in zip(rows, rewrites["sft"], rewrites["rl"])
               if a != b]
    from ...runtime.degenerate import summarize

    out = {"n": len(rows), "basis": basis, "worse_beyond_noise": worse, "reward": reward, "hit_at_1": hit,
           "degenerate": {name: summarize(degenerate[name], [r["query_id"] for r in rows], rewrites[name])
                          for name in ("sft", "rl")},
           "means": {name: {"reward": round(sum(s["score"] for s in scored[name]) / len(rows), 4),
                            "hit_at_1": (round(sum(x for x in hit1[name] if x is not None) / hit["n"], 4)
                                         if hit["n"] else None)} for name in ("sft", "rl")},
           "changed_rewrites": len(changed), "examples": changed[:5]}
    if worse:
        log.warning("RL is worse than its SFT parent beyond noise on the validation prompts: %s RL − SFT %.3f "
                    "[%.3f, %.3f] over %d prompts. models/%s/rl is kept; compare the two in the eval report and "
                    "consider the SFT model", basis, diff["diff"], diff["ci_low"], diff["ci_high"], diff["n"],
                    tenant["name"])
    else:
        log.info("RL vs its SFT parent on %d validation prompts: %s RL − SFT %s [%s, %s], %d rewrites changed",
                 len(rows), basis, diff["diff"], diff["ci_low"], diff["ci_high"], len(changed))
    log.info("degenerate rewrites on validation: SFT %d, RL %d (what the tenant gets: the release stage)",
             out["degenerate"]["sft"]["n"], out["degenerate"]["rl"]["n"])
    return out
