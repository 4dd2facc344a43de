"""`qrewrite report` (rule report): reports/index.html over every tenant."""

from __future__ import annotations

import logging

from ..cli_args import common, load

log = logging.getLogger("qrewrite.report")


def cmd_report(args) -> None:
    from .build import build_report

    cfg, _ = load(args)
    build_report(cfg, args.out)
    log.info("wrote %s", args.out)


def register(sub) -> None:
    p = sub.add_parser("report", help="reports/index.html: self-contained offline report over every tenant "
                       "(eval tables, metric bars with intervals, reward curves, data funnel)")
    common(p, ("--out", "reports/index.html"), tenant=False)
    p.set_defaults(func=cmd_report)
