"""The reward's command: reward-check (rule ``reward_check``)."""

from __future__ import annotations

import logging

from ..cli_args import common, load

log = logging.getLogger("qrewrite.reward")


def cmd_reward_check(args) -> None:
    from ..io_utils import read_jsonl, write_json
    from ..lineage.container import with_image
    from ..data.summary import summary_signals
    from .check import reward_check

    cfg, tenant = load(args)
    doc = reward_check(cfg, tenant, read_jsonl(args.queries), read_jsonl(args.teacher), read_jsonl(args.validated))
    write_json(args.out, with_image(doc))
    sig = summary_signals(doc)
    log.info("reward check %s: judge AUC on derived labels %s %s, on hand labels %s (held-out %s); reward prefers "
             "the good rewrite in %s of %s pairs", tenant["name"], sig["judge_auc_derived"],
             sig["judge_auc_derived_by_kind"], sig["judge_auc_labelled"], sig["judge_auc_labelled_heldout"],
             sig["reward_preference"], (doc["reward"] or {}).get("pairs"))
    if doc["refusal"]:  # RL will refuse this reward: say so now, on the console, not only in the JSON
        log.warning("RL would refuse this reward: %s", doc["refusal"])


def register(sub) -> None:
    p = sub.add_parser("reward-check", help="the judge's AUC and the reward's preference on labels derived from "
                       "the tenant's data (and its hand labels) → reward_check.json; RL refuses a reward failing it")
    common(p, "--queries", "--teacher", "--validated", ("--out", "results/T/reward_check.json"))
    p.set_defaults(func=cmd_reward_check)
