"""`qrewrite lineage show|verify <model dir>` (registered into `qrewrite` by qrewrite/cli.py)."""

from __future__ import annotations

import json
import sys

from ..errors import QrewriteError


def cmd_show(args) -> None:
    from .document import load_lineage
    from .show import render_tree, trace_sample

    if args.json:
        doc, _ = load_lineage(args.model_dir)
        sys.stdout.write(json.dumps(doc, ensure_ascii=False, indent=2) + "\n")
    elif args.trace:
        sys.stdout.write(trace_sample(args.model_dir, args.trace) + "\n")
    else:
        sys.stdout.write(render_tree(args.model_dir) + "\n")


def cmd_verify(args) -> None:
    from .document import load_lineage
    from .verify import verify_lineage

    doc, root = load_lineage(args.model_dir)
    problems = verify_lineage(args.model_dir)
    if problems:
        for path, why in problems:
            sys.stderr.write(f"MISMATCH {path}: {why}\n")
        first, why = problems[0]
        raise QrewriteError(f"lineage of {args.model_dir} does not verify: {first} no longer matches ({why})"
                            + (f"; {len(problems) - 1} more above" if len(problems) > 1 else ""),
                            hint="rerun the pipeline (snakemake / dvc repro) to rebuild from the changed input")
    n = len(doc["upstream"]) + len(doc["chained"]) + 1
    rows = sum(s["rows"] for s in (doc.get("samples") or {}).values())
    sys.stdout.write(f"OK {args.model_dir}: {n} artifacts (root {root}) and {rows} sample links match\n")


def register(sub) -> None:
    p = sub.add_parser("lineage", help="show or verify a model's lineage.json")
    lsub = p.add_subparsers(dest="lineage_command", required=True, metavar="ACTION")
    s = lsub.add_parser("show", help="print the chain from the model back to the raw Excel as a tree")
    s.add_argument("model_dir")
    s.add_argument("--trace", metavar="SAMPLE", help="trace one training sample (query id or SPLIT:LINE) to its "
                   "raw Excel row and teacher call")
    s.add_argument("--json", action="store_true", help="print the lineage document")
    s.set_defaults(func=cmd_show)
    v = lsub.add_parser("verify", help="recompute every hash; exit non-zero naming the first artifact that changed")
    v.add_argument("model_dir")
    v.set_defaults(func=cmd_verify)
