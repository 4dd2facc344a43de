"""`qrewrite deploy-check` (rule deploy_check)."""

from __future__ import annotations

import logging

from ..cli_args import common, load

log = logging.getLogger("qrewrite.deploy")


def cmd_deploy_check(args) -> None:
    from ..envs import ensure_env

    cfg, tenant = load(args)
    ensure_env("swift", args.argv)  # the server (ms-swift or vllm) and transformers live in the swift env
    from ..eval.candidates import eval_rows
    from ..io_utils import write_json
    from .check import run_check

    rows = eval_rows(args.test, args.queries, cfg["eval"]["max_rows"])
    doc = run_check(cfg, tenant, rows, model=args.model, eval_json=args.eval_json, eval_rewrites=args.eval_rewrites,
                    server_log=args.server_log, threads=args.threads)
    write_json(args.out, doc)
    h = doc["hit_at_1"]
    if not h["eval_json_reproduced"]:
        log.warning("eval.json records Hit@1 %s for %s, but its rewrites score %s through the RAG now: the RAG "
                    "service or KB changed since the eval; the paired difference uses the rescored value",
                    h["in_process_eval_json"], doc["candidate"], h["in_process"])
    if doc["serves"] == "rule":
        log.info("deploy %s: the release is a rule (%s), nothing to serve; Hit@1 through the RAG %s vs eval %s -> %s",
                 tenant["name"], doc["released"]["rule"], h["served"], h["in_process_eval_json"], args.out)
        return
    log.info("deploy %s: Hit@1 served %s vs in-process %s (paired diff %s, within noise: %s) -> %s", tenant["name"],
             h["served"], h["in_process"], h["paired_served_minus_in_process"]["diff"], h["within_noise"], args.out)


def register(sub) -> None:
    p = sub.add_parser("deploy-check", help="serve a tenant's model as an OpenAI-compatible endpoint on loopback, run the "
                       "eval split through it and the RAG service → deploy.json (latency, throughput, Hit@1, "
                       "the production command); the server is always stopped")
    common(p, ("--model", "the release folder (models/T/release: a model or a rule) or a merged HF model folder"),
           ("--test", "the eval split (results/T/sft/test.jsonl)"),
           ("--queries", "results/T/queries.jsonl"),
           ("--eval-json", "reports/T/eval.json (the in-process Hit@1)"),
           ("--eval-rewrites", "results/T/eval/<deploy.candidate>.jsonl"),
           ("--server-log", "the model server's output (logs/T/deploy_server.log)"))
    p.add_argument("--threads", type=int, help="CPU threads of the server (default eval.generation.threads)")
    p.add_argument("--out", required=True, help="reports/T/deploy.json")
    p.set_defaults(func=cmd_deploy_check)
