"""`qrewrite deploy-check` (rule deploy_check)."""

from __future__ import annotations

import logging

from ..cli_args import common, load

log = logging.getLogger("qrewrite.deploy")


def cmd_deploy_check(args) -> None:
    from ..envs import ensure_env

    cfg, tenant = load(args)
    ensure_env("swift", args.argv)  # the gateway's in-process model (transformers) or a model server
    from ..eval.candidates import eval_rows
    from ..io_utils import write_json
    from .check import run_check

    rows = eval_rows(args.test, args.queries, cfg["eval"]["max_rows"])
    doc = run_check(cfg, tenant, rows, config_path=args.config, release_folder=args.model, eval_json=args.eval_json,
                    eval_rewrites=args.eval_rewrites, server_log=args.server_log, threads=args.threads)
    write_json(args.out, doc)
    h = doc["hit_at_1"]
    if not h["eval_json_reproduced"]:
        log.warning("eval.json records Hit@1 %s for the release, but its rewrites score %s through the RAG now: the "
                    "RAG service or KB changed since the eval; the paired difference uses the rescored value",
                    h["eval_json"], h["eval"])
    log.info("deploy %s: %s through the gateway (%s): Hit@1 served %s vs eval %s (paired diff %s), texts identical "
             "to the eval's: %s -> %s", tenant["name"], doc["release_id"], doc["gateway"]["backend"], h["served"],
             h["eval"], h["paired_served_minus_eval"]["diff"], doc["texts_identical_to_eval"], args.out)


def register(sub) -> None:
    p = sub.add_parser("deploy-check", help="serve a tenant's release through the gateway on loopback, send every "
                       "test row as its RAG would, compare with the eval's release rows → deploy.json (texts, Hit@1, "
                       "latency and throughput per concurrency, the production commands); every server is stopped")
    common(p, ("--model", "the release folder (models/T/release: a model or a rule)"),
           ("--test", "the eval split (results/T/sft/test.jsonl)"),
           ("--queries", "results/T/queries.jsonl"),
           ("--eval-json", "reports/T/eval.json (the eval's release figure)"),
           ("--eval-rewrites", "results/T/eval/release.jsonl (the eval's release rows)"),
           ("--server-log", "the gateway's output (logs/T/deploy_server.log)"))
    p.add_argument("--threads", type=int, help="CPU threads of the gateway's model (default: those the eval "
                   "generated the release's rows at)")
    p.add_argument("--out", required=True, help="reports/T/deploy.json")
    p.set_defaults(func=cmd_deploy_check)
