"""The data half's commands: build-excel, ingest, split, summarize, data-card (one per rule, same name)."""

from __future__ import annotations

import logging

from ..cli_args import common, load
from ..errors import QrewriteError
from ..lineage.container import with_image

log = logging.getLogger("qrewrite.data")


def cmd_build_excel(args) -> None:
    from .excel import build_excel

    _, tenant = load(args)
    if not tenant["demo_source"]:
        raise QrewriteError(f"tenant {tenant['name']} has no demo_source; its raw Excel is supplied by you",
                            hint=f"put the file at {tenant['raw_excel']}")
    n = build_excel(tenant["demo_source"], args.out or tenant["raw_excel"], tenant["columns"])
    log.info("wrote %s rows to %s", n, args.out or tenant["raw_excel"])


def cmd_ingest(args) -> None:
    from ..io_utils import write_json, write_jsonl
    from .ingest import ingest

    _, tenant = load(args)
    rows, stats = ingest(tenant)
    write_jsonl(args.out, rows)
    write_json(args.stats, with_image(stats))
    log.info("ingest %s: %s", tenant["name"], stats)


def cmd_split(args) -> None:
    from ..io_utils import read_jsonl, write_json, write_jsonl
    from .gold_set import tenant_gold_set
    from .split import SPLITS, build_splits, check_splits

    cfg, tenant = load(args)
    validated = read_jsonl(args.validated)
    splits, stats = build_splits(cfg, tenant, read_jsonl(args.queries), read_jsonl(args.teacher), validated,
                                 tenant_gold_set(tenant))
    stats["warnings"] = check_splits(stats, tenant, validated)  # an empty split raises here: nothing written
    for name in SPLITS:
        write_jsonl(f"{args.out_dir}/{name}.jsonl", splits[name])
    write_json(args.stats, with_image(stats))
    log.info("split %s: %s", tenant["name"], stats)


def cmd_summarize(args) -> None:
    from ..io_utils import read_json, write_json
    from ..paths import STAGES
    from .summary import build_summary

    files = dict(zip(STAGES, args.stats))
    write_json(args.out, build_summary(args.tenant, {s: read_json(p) for s, p in files.items()},
                                       read_json(args.reward_check), files))


def cmd_data_card(args) -> None:
    from ..io_utils import write_json, write_text_atomic
    from .card import build_card, render_md

    cfg, tenant = load(args)
    card = build_card(cfg, tenant, queries=args.queries, teacher=args.teacher, validated=args.validated,
                      splits={"train": args.train, "val": args.val, "test": args.test}, summary=args.summary)
    write_json(args.out_json, card)
    write_text_atomic(args.out, render_md(card))
    log.info("data card %s: %s, %s", tenant["name"], args.out, args.out_json)


def register(sub) -> None:
    p = sub.add_parser("build-excel", help="build a demo tenant's raw Excel from its reviewable JSONL source")
    common(p)
    p.add_argument("--out", help="output .xlsx (default: tenants[].raw_excel)")
    p.set_defaults(func=cmd_build_excel)

    p = sub.add_parser("ingest", help="raw Excel → queries.jsonl (stable ids, counted drops)")
    common(p, "--out", "--stats")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("split", help="validated.jsonl → sft/{train,val,test}.jsonl (filter, dedupe, split)")
    common(p, "--queries", "--teacher", "--validated", "--out-dir", "--stats")
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("summarize", help="per-stage stats → summary.json")
    p.add_argument("--tenant", required=True)
    p.add_argument("--stats", nargs=4, required=True, metavar="JSON", help="ingest, teacher, validate, split stats")
    p.add_argument("--reward-check", required=True, help="results/T/reward_check.json (its figures go into the summary)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("data-card", help="the dataset's card: sources and hashes, funnel, language, difficulty mix, "
                       "gold and red-team sets, known biases, intended use → data_card.md + data_card.json")
    common(p)
    for name in ("queries", "teacher", "validated", "train", "val", "test", "summary"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--out", required=True, help="results/T/data_card.md")
    p.add_argument("--out-json", required=True, help="results/T/data_card.json")
    p.set_defaults(func=cmd_data_card)
