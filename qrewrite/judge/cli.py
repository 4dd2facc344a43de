"""The distilled judge's subcommands (rules judge_data, judge_sft, judge_grpo, judge_eval; `snakemake judge`)."""

from __future__ import annotations

import logging
import time

from ..cli_args import common, load

log = logging.getLogger("qrewrite.judge")


def _lineage(out: str, *, rule: str, tenant: dict, inputs: dict, params: dict, cfg: dict, started: float) -> None:
    """lineage.json in the judge model folder just written, as every model has (qrewrite.lineage)."""
    from ..workflow.record import write_lineage

    write_lineage(out, rule=rule, tenant=tenant["name"], inputs=inputs, params=params, config=cfg, env="swift",
                  started=started, ended=time.time())


def _rewrites(paths: list[str]) -> dict[str, dict[str, str]]:
    """{candidate name: {query_id: rewrite}} of eval rewrite files results/T/eval/<name>.jsonl."""
    from pathlib import Path

    from ..io_utils import read_jsonl

    return {Path(p).stem: {r["query_id"]: (r.get("rewrite") or "") for r in read_jsonl(p) if r.get("status") == "ok"}
            for p in paths}


def cmd_judge_data(args) -> None:
    from ..envs import ensure_env

    cfg, tenant = load(args)
    ensure_env("swift", args.argv)  # the student's samples need the model
    import asyncio

    from ..data.red_team import tenant_red_team
    from ..io_utils import read_jsonl, write_json, write_jsonl
    from ..rag.providers import make_rag
    from ..reward import reward_settings
    from ..reward.judges import key_terms_of, make_tenant_judge, tenant_docs
    from ..text import normalize
    from . import data, items as it

    queries, validated = read_jsonl(args.queries), read_jsonl(args.validated)
    context = {q["id"]: q for q in queries}
    test_ids = [r["meta"]["query_id"] for r in read_jsonl(args.test)]
    test_questions = {normalize(context[i]["query"]) for i in test_ids if i in context}
    references = {v["id"]: v["rewrite"] for v in validated if (v.get("rewrite") or "").strip()}
    jcfg = cfg["judge"]
    # the student's own kinds of mistakes: samples of train questions (not held out), a deterministic subset
    train_ids = [q["id"] for q in queries if q["id"] in references and q.get("gold_doc_ids")
                 and normalize(q["query"]) not in test_questions]
    train_ids = sorted(train_ids, key=lambda i: it.item_id(i, "student"))[:jcfg["max_questions"]]
    samples = data.sample_rewrites(args.student, tenant, [{"query_id": i, **context[i]} for i in train_ids],
                                   n=jcfg["student_samples"], threads=args.threads, progress=not args.no_progress) \
        if jcfg["student_samples"] else []
    rewrites = _rewrites(args.rewrites)
    student_own = [{"query_id": i, "rewrite": rewrites.get("sft", {}).get(i, "")} for i in test_ids]
    settings = reward_settings(cfg)
    llm = settings["judge"]["provider"] == "openai"  # the strong judge labels; else rules and retrieval do
    judge_settings = {**settings, "judge": {**settings["judge"], "provider": "openai" if llm else "rule"}}

    async def build():
        rag = make_rag(cfg, tenant)
        judge = make_tenant_judge(judge_settings, tenant, rag=rag)
        try:
            pairs = {(s["query_id"], s["rewrite"]) for s in samples + student_own if s["rewrite"].strip()
                     and s["query_id"] in context}
            hits = dict(zip(pairs, await asyncio.gather(*(rag.search(context[q]["query"], text) for q, text in pairs))))
            retrieve = lambda qid, text: hits[(qid, text)]  # noqa: E731
            rows = it.base_items(validated, queries)
            rows += it.student_items(samples, context, references, retrieve)
            rows += it.red_team_items(tenant_red_team(tenant, use=None), rewrites)
            await it.rationales(rows, judge, llm_labels=llm)
            # what the model judge will be shown beside the reference (reward.judge.model.key_terms)
            k = settings["judge"]["model"]["key_terms"]
            terms = key_terms_of(tenant_docs(tenant, rag), tenant.get("language", "zh"), k) if k else None
            it.attach_key_terms(rows, terms)
            # the student's own test rewrites, labelled by retrieval: what judge-eval's `student` set measures
            return rows, it.student_items(student_own, context, references, retrieve)
        finally:
            await rag.aclose()
            await judge.aclose()

    rows, student_test = asyncio.run(build())
    items = it.assign(rows, test_questions)
    counts = data.write(items, {"items": args.judgements, "sft_train": args.sft_train, "sft_val": args.sft_val,
                                "grpo_train": args.grpo_train}, student_share=jcfg["student_share"])
    write_jsonl(args.student_test, student_test)
    stats = {"tenant": tenant["name"], "items": len(items), "by_split": it.counts(items), "files": counts,
             "student_samples": len(samples), "student_test": len(student_test),
             "rationale_source": "llm" if settings["judge"]["provider"] == "openai" else "rule",
             "note": None if settings["judge"]["provider"] == "openai" else
             "labels from retrieval and the derived kinds, rationales from the rule judge: a judge distilled "
             "from rules and retrieval, not from an LLM"}
    write_json(args.stats, stats)
    log.info("judge items %s: %d (%s)", tenant["name"], len(items), stats["by_split"])


def cmd_judge_sft(args) -> None:
    from ..envs import ensure_env

    cfg, tenant = load(args)
    ensure_env("swift", args.argv)
    from ..io_utils import write_json
    from .train import run_judge_sft, sft_config

    started = time.time()
    stats = run_judge_sft(cfg, base=args.base, train=args.train, val=args.val, adapter=args.adapter,
                          merged=args.out, run_dir=args.run_dir, tb_dir=args.tb, log_file=None, threads=args.threads)
    for out in (args.adapter, args.out):
        _lineage(out, rule="judge_sft", tenant=tenant, inputs={"base": args.base, "train": args.train, "val": args.val},
                 params={"judge.sft": sft_config(cfg)["train"]["sft"]}, cfg=cfg, started=started)
    write_json(args.stats, {"tenant": tenant["name"], **stats})
    log.info("judge SFT %s: %s steps, best eval loss %s", tenant["name"], stats["steps"], stats["best_eval_loss"])


def cmd_judge_grpo(args) -> None:
    from ..envs import ensure_env

    cfg, tenant = load(args)
    ensure_env("swift", args.argv)
    from ..io_utils import write_json
    from .train import grpo_hparams, run_judge_grpo

    started = time.time()
    stats = run_judge_grpo(cfg, model=args.model, train_jsonl=args.train, out=args.out, run_dir=args.run_dir,
                           tb_dir=args.tb, threads=args.threads)
    _lineage(args.out, rule="judge_grpo", tenant=tenant, inputs={"model": args.model, "train": args.train},
             params={"judge.grpo": grpo_hparams(cfg)}, cfg=cfg, started=started)
    write_json(args.stats, {"tenant": tenant["name"], **stats})
    last = stats["curve"][-1] if stats["curve"] else {}
    log.info("judge GRPO %s: %s s, last step %s", tenant["name"], stats["wall_s"], last)


def cmd_judge_eval(args) -> None:
    from ..envs import ensure_env

    cfg, tenant = load(args)
    ensure_env("swift", args.argv)
    import os
    import tempfile

    from ..cache import DiskCache
    from ..io_utils import read_jsonl, write_json
    from ..reward import reward_settings
    from ..reward.judge_model import ModelJudge
    from ..reward.judges import key_terms_of, make_tenant_judge, tenant_docs
    from ..signals import heldout, load_judge_labels
    from .evaluate import SETS, eval_sets, evaluate_judges

    hand = []
    if tenant.get("judge_labels"):
        hand = [{"query": r["query"], "profile": r.get("profile") or "", "history": r.get("history") or "",
                 "reference": r.get("reference"), "candidate": r["rewrite"], "label": r["label"]}
                for r in load_judge_labels(tenant["judge_labels"]) if heldout(r["query"])]
    # per set at most eval_max_items: every item costs each local judge a generation
    sets = eval_sets(read_jsonl(args.judgements), hand, read_jsonl(args.student_test),
                     cap=cfg["judge"]["eval_max_items"])
    settings = reward_settings(cfg)
    ecfg = cfg["eval"]
    bkw = dict(samples=ecfg["bootstrap"]["samples"], seed=ecfg["bootstrap"]["seed"],
               confidence=ecfg["bootstrap"]["confidence"])
    mcfg = cfg["reward"]["judge"]["model"]
    # every model judge is shown what the trained ones were trained with (the base model too: same prompt)
    terms = key_terms_of(tenant_docs(tenant), tenant.get("language", "zh"), mcfg["key_terms"]) \
        if mcfg["key_terms"] else None
    with tempfile.TemporaryDirectory(prefix="qrw-judge-eval-") as tmp:  # fresh: timings are of real judgements
        # the reward's settings (reward/judges.py): the judges are measured as RL would run them
        mk = lambda path: ModelJudge(path, DiskCache(os.path.join(tmp, os.path.basename(path))),  # noqa: E731
                                     max_new_tokens=mcfg["max_new_tokens"], batch_size=mcfg["batch_size"],
                                     threads=args.threads, key_terms=terms)
        judges = {"base": mk(args.base), "sft": mk(args.sft), "grpo": mk(args.grpo),
                  "rule": make_tenant_judge({**settings, "judge": {**settings["judge"], "provider": "rule"}}, tenant)}
        # the configured API judge's list price, whether or not it judges here: what a local judge saves
        api_price = _api_cost_per_1k(cfg, args.base, sets)
        if settings["judge"]["provider"] == "openai":
            judges["api"] = make_tenant_judge(settings, tenant)
        w = mcfg["rule_weight"]  # the blend the reward would use, from the same judgements
        res = evaluate_judges(judges, sets, bkw, gpu_hour_usd=ecfg["gpu_hour_usd"],
                              api_cost_per_1k=api_price if "api" in judges else None, progress=not args.no_progress,
                              blends={"sft+rule": ("sft", w), "grpo+rule": ("grpo", w)} if w else None)
    doc = {"tenant": tenant["name"], "sets": {k: {"n": len(v), "good": sum(r["label"] == "good" for r in v)}
                                               for k, v in sets.items()},
           "judges": res, "bootstrap": ecfg["bootstrap"],
           "api_judge_price": {"model": cfg["reward"]["judge"]["openai"]["model"], "usd_per_1k": api_price,
                               "note": "list price of these sets' prompts and a 40-token reply, tokens counted with "
                                       "the base model's tokenizer: an estimate; null when no price is configured"},
           "note": "AUC: P(a good candidate outscores a bad one), ties one half, a failed judgement the lowest score"}
    write_json(args.out, doc)
    for name, r in res.items():
        aucs = " | ".join(f"{s} AUC {((r.get(s) or {}).get('auc') or {}).get('value')}" for s in SETS)
        log.info("judge %-9s heldout accuracy %s | %s | %.3f s/judgement", name,
                 ((r.get("heldout") or {}).get("accuracy") or {}).get("value"), aucs, r["seconds_per_judgement"] or 0)


def _api_cost_per_1k(cfg: dict, tokenizer_dir: str, sets: dict) -> float | None:
    """The API judge's list price for 1,000 judgements: its prompt (judge_openai.judge_messages) counted with the
    base model's tokenizer, and a 40-token reply; an estimate."""
    from transformers import AutoTokenizer

    from ..reward.judge_openai import judge_messages

    price = cfg["teacher"]["prices"].get(cfg["reward"]["judge"]["openai"]["model"])
    rows = [r for v in sets.values() for r in v]
    if not price or not rows:
        return None
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    # the rendered prompt's token count (apply_chat_template(tokenize=True) returns a BatchEncoding in transformers 5)
    texts = [tok.apply_chat_template(judge_messages(r["query"], r.get("profile") or "", r.get("history") or "",
                                                    r["candidate"], None, r.get("reference")), tokenize=False)
             for r in rows]
    n_in = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts) / len(rows)
    return round((n_in * price["input_per_1m"] + 40 * price["output_per_1m"]) / 1e6 * 1000, 4)


def register(sub) -> None:
    p = sub.add_parser("judge-data", help="the distilled judge's items: labelled judgements from the tenant's data, "
                       "held out by question, and its SFT / GRPO files")
    common(p, ("--queries", "results/T/queries.jsonl"), ("--validated", "results/T/validated.jsonl"),
           ("--test", "the eval split (its questions are held out)"), ("--student", "the SFT model (its samples)"),
           ("--judgements", "results/T/judge/items.jsonl"), ("--sft-train", "SFT rows"), ("--sft-val", "SFT val rows"),
           ("--grpo-train", "GRPO prompt rows"), ("--student-test", "the student's own test rewrites, labelled"),
           ("--stats", "stats json"))
    p.add_argument("--rewrites", nargs="+", required=True, help="results/T/eval/<candidate>.jsonl: red-team outputs "
                   "and the student's test rewrites")
    p.add_argument("--threads", type=int)
    p.add_argument("--no-progress", action="store_true", help="no progress bar while the student samples")
    p.set_defaults(func=cmd_judge_data)

    p = sub.add_parser("judge-sft", help="LoRA SFT of the judge on reason + score, merged")
    common(p, ("--base", "models/base"), ("--train", "SFT rows"), ("--val", "SFT val rows"),
           ("--adapter", "models/T/judge-sft"), ("--out", "models/T/judge-sft-merged"), ("--run-dir", "swift output"),
           ("--tb", "TensorBoard dir"), ("--stats", "stats json"))
    p.add_argument("--threads", type=int)
    p.set_defaults(func=cmd_judge_sft)

    p = sub.add_parser("judge-grpo", help="GRPO of the SFT judge with the format and verdict rewards, merged")
    common(p, ("--model", "models/T/judge-sft-merged"), ("--train", "GRPO prompt rows"), ("--out", "models/T/judge"),
           ("--run-dir", "swift output"), ("--tb", "TensorBoard dir"), ("--stats", "stats json"))
    p.add_argument("--threads", type=int)
    p.set_defaults(func=cmd_judge_grpo)

    p = sub.add_parser("judge-eval", help="base vs SFT vs GRPO judge (and the rule / API judge) on held-out items, "
                       "the hand labels and the student's own rewrites → reports/T/judge.json")
    common(p, ("--judgements", "results/T/judge/items.jsonl"), ("--student-test", "results/T/judge/student_test.jsonl"),
           ("--base", "models/base"), ("--sft", "models/T/judge-sft-merged"), ("--grpo", "models/T/judge"),
           ("--out", "reports/T/judge.json"))
    p.add_argument("--threads", type=int)
    p.add_argument("--no-progress", action="store_true", help="no progress bar per judge and set")
    p.set_defaults(func=cmd_judge_eval)
