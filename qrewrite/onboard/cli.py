"""`qrewrite tenant init`: propose (and with --write, add) the config block of a tenant of one's own."""

from __future__ import annotations

import argparse
from pathlib import Path

from .rows import DEFAULT_SAMPLE


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return n


def cmd_tenant_init(args) -> None:
    from .config_file import append_tenant, refuse_existing
    from .inputs import check_name
    from .report import next_commands, render_report
    from .scaffold import propose

    check_name(args.name)
    if args.write:  # before any work: a second --write of a name is refused at once
        refuse_existing(Path(args.config), args.name)
    proposal = propose(args.name, args.excel, args.kb, sheet=args.sheet, config=args.config, sample=args.sample)
    print(render_report(proposal))
    if args.write:
        append_tenant(Path(args.config), proposal["tenant"], proposal["notes"])
        print(f"\nwrote tenant {args.name} to {args.config} (after its last tenant; comments kept; it validates)")
    print("\nNext:")
    print("\n".join(f"  {c}" for c in next_commands(proposal, written=args.write)))


def register(sub) -> None:
    p = sub.add_parser(
        "tenant", help="onboard a tenant of your own: `tenant init` proposes its config block",
        description="Tools for a tenant of your own (README \"Your own tenant in five minutes\").")
    tsub = p.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    s = tsub.add_parser(
        "init", help="read the Excel and the KB, propose the tenant block (columns, KB fields, language, teacher)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Read the test set (.xlsx) and the knowledge base (JSONL) and propose the tenant's config block, each\n"
            "proposal with its evidence:\n"
            "  columns    the sheet's header names (问题/query, 用户画像/profile, 历史摘要/history, 相关文档/gold,\n"
            "             难度/difficulty, 参考改写/rewrite), else its cells (gold: KB doc ids; query: the fullest\n"
            "             text column); a field not found is null\n"
            "  kb.fields  the JSONL's key names (id, title, content), else its values (unique short ids, the\n"
            "             longest text)\n"
            "  language   zh or en from the queries' CJK share (ingest's rule)\n"
            "  teacher    the embedded resolve teacher scored on a seeded sample of rows with gold (tie-aware\n"
            "             Hit@1 through the local BM25, beside the raw query and query + history); where it\n"
            "             does not fit, the sheet's own rewrites (column) or an API (openai)\n"
            "Prints a report and the block as YAML; --write appends the block to the config's tenants (its\n"
            "comments kept) and checks that the config still validates."),
        epilog="example: qrewrite tenant init acme --excel data/raw/acme.xlsx --kb data/kb/acme.jsonl --write")
    s.add_argument("name", metavar="NAME", help="the tenant's name: lower-case letters, digits, _ and - "
                   "(results/NAME, models/NAME)")
    s.add_argument("--excel", required=True, metavar="F", help="the test set, an .xlsx workbook")
    s.add_argument("--kb", required=True, metavar="F", help="the knowledge base, JSONL (one document a line)")
    s.add_argument("--sheet", metavar="S", help="sheet name (default: the first sheet)")
    s.add_argument("--config", default="config.yaml", metavar="FILE",
                   help="pipeline config the tenant joins (default: %(default)s)")
    s.add_argument("--write", action="store_true",
                   help="append the block to --config's tenants (refused when the name exists)")
    s.add_argument("--sample", type=_positive, default=DEFAULT_SAMPLE, metavar="N",
                   help="rows with gold the teachers are scored on (default: %(default)s)")
    s.set_defaults(func=cmd_tenant_init)
