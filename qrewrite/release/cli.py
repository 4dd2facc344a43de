"""`qrewrite release` (rule release): what the tenant gets, chosen on the validation split only."""

from __future__ import annotations

import logging
import sys
import time

from ..cli_args import common, load
from ..errors import QrewriteError

log = logging.getLogger("qrewrite.release")


def cmd_release(args) -> None:
    from ..envs import ensure_env

    ensure_env("swift", args.argv)  # the student models generate with transformers, in the swift env
    from ..config import tenant_sft_targets
    from .. import stats
    from ..eval.candidates import eval_rows
    from ..workflow.record import write_lineage
    from .advice import advise
    from .folder import RULE_TEXT, write_release
    from ..runtime.rules import ENTITIES_FILE, STATEFUL
    from .score import release_candidates, score, tenant_lexicon
    from .select import choose

    cfg, tenant = load(args)
    started = time.time()
    rows = eval_rows(args.val, args.queries, None)
    gold_rows = [r for r in rows if r["gold_doc_ids"]]  # only these can be scored: the others need no rewrite
    from ..config import has_student

    # a rules-only tenant (tenants[].student: never) chooses among the rules: it has no student
    cands, left_out = release_candidates(cfg, tenant, rules_only=not has_student(tenant))
    for name, why in left_out.items():
        log.info("release %s: %s left out: %s", tenant["name"], name, why)
    models = {"sft_merged": args.sft, "pref_merged": args.pref, "rl_model": args.rl}
    wanted = {c["artifact"] for c in cands if c["artifact"]}
    missing = sorted(k for k in wanted if not models.get(k))
    if missing:
        raise QrewriteError(f"the release candidates need {', '.join(missing)}: pass --sft / --pref / --rl",
                            hint="snakemake passes them for a tenant with a student (tenants[].student auto/always)")
    margin_rows = cfg["release"]["margin_rows"]
    if gold_rows:
        figures, per_row = score(cfg, tenant, gold_rows, cands, models, args.threads, reuse_from=args.rl_rewrites)
    else:
        figures, per_row = [{"name": c["name"], "mean": None, "ci_low": None, "ci_high": None, "n": 0}
                            for c in cands], {}
    decision = choose(figures, margin_rows)
    advice = advise(figures, cands, tenant_sft_targets(cfg, tenant))
    won = cands[decision["index"]]
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])

    def paired(a: str, b: str) -> dict | None:
        return stats.paired(per_row[a], per_row[b], **bkw) if per_row else None

    table = [{**f, "source": c["source"], "kind": c["kind"], "artifact": c["artifact"], "decoding": c["decoding"],
              f"minus_{cands[0]['name']}": paired(c["name"], cands[0]["name"]) if i else None}
             for i, (f, c) in enumerate(zip(figures, cands))]
    released = {"name": won["name"], "source": won["source"],
                "kind": "rule" if won["kind"] != "model" else "model"}
    if released["kind"] == "model":
        from ..runtime.backends import ENGINE_NAME

        # the engine that serves it in process and generates the eval's release rows (qrewrite.runtime.engine)
        released |= {"artifact": won["artifact"], "model_dir": models[won["artifact"]], "decoding": won["decoding"],
                     "engine": ENGINE_NAME}
    else:
        released |= {"rule": won["kind"], "sends": RULE_TEXT[won["kind"]]}
        if won["kind"] in STATEFUL:
            released["state"] = ENTITIES_FILE
    doc = {"tenant": tenant["name"], "split": "val", "split_path": args.val, "n_val_rows": len(rows),
           "n_with_gold": len(gold_rows),
           "basis": "tie-aware Hit@1 of each candidate's rewrites of the validation rows with gold documents, "
                    "through the tenant's RAG provider (test rows are never read)",
           "released": released, "decision": {**decision, "margin_rows": margin_rows},
           "candidates": table, "left_out": left_out,
           "released_minus": {c["name"]: paired(won["name"], c["name"]) for c in cands if c is not won},
           "advice": advice}
    state = ({ENTITIES_FILE: tenant_lexicon(tenant).to_json()} if released.get("state") == ENTITIES_FILE else None)
    write_release(args.out, doc, models[won["artifact"]] if released["kind"] == "model" else None, state)
    # The choice is made and written. What follows only records lineage: it hashes every upstream artifact, the
    # test split among them (the data card summarizes it), and reads none of it. tests/test_release.py listens
    # for this event to check that nothing before it opened the test split.
    sys.audit("qrewrite.release.decided", args.out)
    write_lineage(args.out, rule="release", tenant=tenant["name"],
                  inputs={"val": args.val, "queries": args.queries,
                          **{k: v for k, v in (("sft", args.sft), ("pref", args.pref), ("rl", args.rl)) if v}},
                  params={"release": cfg["release"], "released": released, "decision": doc["decision"],
                          "validation": [{k: f[k] for k in ("name", "mean", "ci_low", "ci_high", "n")}
                                         for f in figures]},
                  config=cfg, env="swift", started=started, ended=time.time())
    log.info("release %s: %s (%s) -> %s", tenant["name"], won["name"], decision["why"], args.out)
    for line in advice:
        log.warning("release %s: %s", tenant["name"], line)


def register(sub) -> None:
    p = sub.add_parser("release", help="choose what the tenant gets on the validation split, among "
                       "release.candidates (shipped: query + history, the query alone, the teacher where it is the "
                       "embedded rule, the SFT, preference and RL students, each with its decoding levers); a later "
                       "candidate must beat every earlier one by more than release.margin_rows → models/T/release "
                       "(release.json, the model's files or none for a rule, lineage.json)")
    common(p, ("--val", "the validation split (results/T/sft/val.jsonl): the only rows the choice sees"),
           ("--queries", "results/T/queries.jsonl (query, profile, history, gold)"),
           ("--out", "models/T/release"))
    p.add_argument("--sft", help="the merged SFT model (models/T/sft-merged); none for a rules-only tenant")
    p.add_argument("--rl", help="the merged RL model (models/T/rl); none for a rules-only tenant")
    p.add_argument("--pref", help="the merged preference model (models/T/pref-merged); only with pref.enabled")
    p.add_argument("--rl-rewrites", help="results/T/train/rl-val-rewrites.json: the rl stage's rewrites of these "
                   "rows by both models, taken where the generation is exactly the one the release would run")
    p.add_argument("--threads", type=int, help="CPU threads for generation")
    p.set_defaults(func=cmd_release)
