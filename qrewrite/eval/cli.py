"""`qrewrite eval-generate`, `qrewrite eval-rewrites`, `qrewrite eval` (rules of the same names)."""

from __future__ import annotations

import logging

from ..cli_args import common, load
from ..errors import QrewriteError

log = logging.getLogger("qrewrite.eval")


def cmd_eval_generate(args) -> None:
    """Rule eval_generate: a local model candidate (kind model) generates, in the swift env."""
    _rewrites(args, generate=True)


def cmd_eval_rewrites(args) -> None:
    """Rule eval_rewrites: every other candidate (raw, query_history, teacher, openai), in the data env."""
    _rewrites(args, generate=False)


def _rewrites(args, generate: bool) -> None:
    from ..io_utils import write_jsonl
    from .candidates import (MODEL_KINDS, api_rewrites, candidate_spec, eval_rows, extra_rows, model_rewrites,
                             query_history_rewrites, raw_rewrites, release_rewrites, teacher_rewrites)

    cfg, tenant = load(args)
    spec = candidate_spec(cfg, args.candidate)
    if (spec["kind"] in MODEL_KINDS) != generate:  # the two rules run in different envs and containers
        other = "eval-rewrites" if generate else "eval-generate"
        raise QrewriteError(f"candidate {spec['name']} is of kind {spec['kind']}: use `qrewrite {other}`",
                            hint="eval-generate runs the local models (kind model), eval-rewrites the others")
    if generate:
        from ..envs import ensure_env

        ensure_env("swift", args.argv)  # transformers lives in the ms-swift env
    rows = eval_rows(args.test, args.queries, cfg["eval"]["max_rows"]) + extra_rows(tenant)
    kind = spec["kind"]
    if kind == "raw":
        out = raw_rewrites(spec, rows)
    elif kind == "query_history":
        out = query_history_rewrites(spec, rows)
    elif kind == "teacher":
        if not args.teacher:
            raise QrewriteError(f"candidate {spec['name']} (kind teacher) needs --teacher results/T/teacher.jsonl")
        out = teacher_rewrites(spec, rows, args.teacher, cfg, tenant)
    elif kind == "openai":
        out = api_rewrites(spec, cfg, tenant, rows)
    elif kind == "release":
        out = release_rewrites(spec, cfg, tenant, rows, args.model, args.threads)
    else:  # model: --model is required by eval-generate's parser
        out, info = model_rewrites(spec, cfg, tenant, rows, args.model, args.threads)
        out = [{**r, "generation": info} for r in out]
    write_jsonl(args.out, out)
    errors = sum(1 for r in out if r["status"] != "ok")
    log.info("%s %s/%s: %d rows, %d errors -> %s", args.command, tenant["name"], spec["name"], len(out), errors, args.out)


def cmd_eval(args) -> None:
    from pathlib import Path

    from ..io_utils import read_json, read_jsonl, write_json, write_jsonl
    from .candidates import eval_rows, extra_rows
    from .score import evaluate

    cfg, tenant = load(args)
    rows = eval_rows(args.test, args.queries, cfg["eval"]["max_rows"])
    extra = extra_rows(tenant)
    rewrites, info = {}, {}
    for path in args.rewrites:
        rws = read_jsonl(path)
        names = {r.get("candidate") for r in rws}
        if len(names) != 1:
            raise QrewriteError(f"expected the rows of one candidate, found {sorted(map(str, names))}", file=path)
        name = names.pop()
        rewrites[name] = rws
        if rws and rws[0].get("generation"):
            info[name] = rws[0]["generation"]
    from .candidates import tenant_candidates

    missing = [c["name"] for c in tenant_candidates(cfg, tenant["name"]) if c["name"] not in rewrites]
    if missing:
        raise QrewriteError(f"no rewrites given for candidates {missing}",
                            hint="pass every candidate's results/T/eval/<candidate>.jsonl with --rewrites")
    references = {r["id"]: r["rewrite"] for r in read_jsonl(args.teacher) if r.get("status") == "ok"}
    doc, examples, plots = evaluate(cfg, tenant, rows, rewrites, info, extra=extra, references=references,
                                    reward_check=read_json(args.reward_check))
    write_json(args.out, doc)
    write_jsonl(args.examples, examples)
    write_json(args.plots, plots)
    for name, h in doc["headline"].items():
        log.info("eval %s %s: %s", tenant["name"], name, h)
    log.info("wrote %s, %s, %s", args.out, args.examples, Path(args.plots))


def register(sub) -> None:
    for name, func, what in (("eval-generate", cmd_eval_generate, "a local model's or the release's (kind model, release)"),
                             ("eval-rewrites", cmd_eval_rewrites, "a raw, query_history, teacher or API candidate's")):
        p = sub.add_parser(name, help=f"{what} rewrites of the test split, gold and red-team rows (with latency, cost)")
        common(p, ("--candidate", "eval.candidates[].name"),
               ("--test", "the SFT split evaluated on (results/T/sft/test.jsonl)"),
               ("--queries", "results/T/queries.jsonl (query, profile, history)"))
        if func is cmd_eval_generate:
            p.add_argument("--model", required=True, help="HF model folder, or the release folder (models/T/release)")
            p.add_argument("--threads", type=int, help="CPU threads for generation")
        else:
            p.add_argument("--teacher", help="results/T/teacher.jsonl (kind teacher)")
        p.add_argument("--out", required=True, help="results/T/eval/<candidate>.jsonl")
        p.set_defaults(func=func)

    p = sub.add_parser("eval", help="score every candidate: retrieval vs gold, reranker, judge, win/tie/loss, "
                       "latency, cost, paired intervals → eval.json, examples.jsonl, plots.json")
    common(p, "--test", "--queries", ("--teacher", "results/T/teacher.jsonl: the reference the judge grades against"),
           ("--reward-check", "results/T/reward_check.json: the judge's and the reward's checks, shown in eval.json"))
    p.add_argument("--rewrites", required=True, nargs="+", help="every candidate's eval-generate / eval-rewrites output")
    p.add_argument("--out", required=True, help="reports/T/eval.json")
    p.add_argument("--examples", required=True, help="reports/T/examples.jsonl")
    p.add_argument("--plots", required=True, help="reports/T/plots.json")
    p.set_defaults(func=cmd_eval)
