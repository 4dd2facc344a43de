"""`qrewrite teacher` (rule teacher): every query's teacher rewrite, cached call by call."""

from __future__ import annotations

import asyncio
import logging

from ..cli_args import common, load
from ..lineage.container import with_image

log = logging.getLogger("qrewrite.teacher")


def cmd_teacher(args) -> None:
    from ..io_utils import read_jsonl, write_json, write_jsonl
    from .stage import run_teacher

    cfg, tenant = load(args)
    rows, stats = asyncio.run(run_teacher(cfg, tenant, read_jsonl(args.queries), progress=not args.no_progress))
    write_jsonl(args.out, rows)
    write_json(args.stats, with_image(stats))
    log.info("teacher %s: %s", tenant["name"], {k: v for k, v in stats.items() if k != "dropped"})


def register(sub) -> None:
    p = sub.add_parser("teacher", help="queries.jsonl → teacher.jsonl (cached teacher rewrites)")
    common(p, "--queries", "--out", "--stats")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_teacher)
