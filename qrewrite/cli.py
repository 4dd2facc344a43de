"""`qrewrite` command line: one subcommand per pipeline stage (each Snakemake rule / DVC stage calls one)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from . import __version__
from .errors import QrewriteError

log = logging.getLogger("qrewrite")

# Modules that add subcommands for the later stages (training, eval, lineage, deploy).
SUBCOMMAND_MODULES = ("qrewrite.training.cli", "qrewrite.lineage.cli", "qrewrite.eval.cli", "qrewrite.deploy.cli")


def _common(p: argparse.ArgumentParser, *required: str | tuple[str, str], tenant: bool = True) -> None:
    """--config (and --tenant), then the command's required arguments: "--flag" or ("--flag", "help")."""
    p.add_argument("--config", default="config.yaml", help="pipeline config (default: %(default)s)")
    if tenant:
        p.add_argument("--tenant", required=True, help="tenant name from config.yaml")
    for arg in required:
        flag, help_ = (arg, None) if isinstance(arg, str) else arg
        p.add_argument(flag, required=True, help=help_)


def _load(args):
    from .config import load_config, tenant_config

    cfg = load_config(args.config)
    return cfg, (tenant_config(cfg, args.tenant) if getattr(args, "tenant", None) else None)


def cmd_build_excel(args) -> None:
    from .data.excel import build_excel

    _, tenant = _load(args)
    if not tenant["demo_source"]:
        raise QrewriteError(f"tenant {tenant['name']} has no demo_source; its raw Excel is supplied by you",
                            hint=f"put the file at {tenant['raw_excel']}")
    n = build_excel(tenant["demo_source"], args.out or tenant["raw_excel"], tenant["columns"])
    log.info("wrote %s rows to %s", n, args.out or tenant["raw_excel"])


def cmd_ingest(args) -> None:
    from .data.ingest import ingest
    from .io_utils import write_json, write_jsonl

    _, tenant = _load(args)
    rows, stats = ingest(tenant)
    write_jsonl(args.out, rows)
    write_json(args.stats, stats)
    log.info("ingest %s: %s", tenant["name"], stats)


def cmd_teacher(args) -> None:
    from .io_utils import read_jsonl, write_json, write_jsonl
    from .teacher.stage import run_teacher

    cfg, tenant = _load(args)
    rows, stats = asyncio.run(run_teacher(cfg, tenant, read_jsonl(args.queries), progress=not args.no_progress))
    write_jsonl(args.out, rows)
    write_json(args.stats, stats)
    log.info("teacher %s: %s", tenant["name"], {k: v for k, v in stats.items() if k != "dropped"})


def cmd_validate(args) -> None:
    from .io_utils import read_jsonl, write_json, write_jsonl
    from .validate import run_validation

    cfg, tenant = _load(args)
    rows, stats = asyncio.run(run_validation(cfg, tenant, read_jsonl(args.queries), read_jsonl(args.teacher),
                                             progress=not args.no_progress))
    write_jsonl(args.out, rows)
    write_json(args.stats, stats)
    log.info("validate %s: %s", tenant["name"], stats)


def cmd_split(args) -> None:
    from .gold_set import tenant_gold_set
    from .io_utils import read_jsonl, write_json, write_jsonl
    from .split import SPLITS, build_splits

    cfg, tenant = _load(args)
    splits, stats = build_splits(cfg, tenant, read_jsonl(args.queries), read_jsonl(args.teacher),
                                 read_jsonl(args.validated), tenant_gold_set(tenant))
    for name in SPLITS:
        write_jsonl(f"{args.out_dir}/{name}.jsonl", splits[name])
    write_json(args.stats, stats)
    log.info("split %s: %s", tenant["name"], stats)


def cmd_summarize(args) -> None:
    from .io_utils import read_json, write_json
    from .paths import STAGES
    from .summary import build_summary

    stats = {s: read_json(p) for s, p in zip(STAGES, args.stats)}
    write_json(args.out, build_summary(args.tenant, stats))


def cmd_data_card(args) -> None:
    from .data_card import build_card, render_md
    from .io_utils import write_json, write_text_atomic

    cfg, tenant = _load(args)
    card = build_card(cfg, tenant, queries=args.queries, teacher=args.teacher, validated=args.validated,
                      splits={"train": args.train, "val": args.val, "test": args.test}, summary=args.summary)
    write_json(args.out_json, card)
    write_text_atomic(args.out, render_md(card))
    log.info("data card %s: %s, %s", tenant["name"], args.out, args.out_json)


def cmd_serve_rag(args) -> None:
    from .rag.server import serve

    cfg, _ = _load(args)
    serve(cfg, args.host or cfg["rag"]["serve"]["host"], args.port or cfg["rag"]["serve"]["port"])


def cmd_config(args) -> None:
    import yaml

    cfg, _ = _load(args)
    # Config holds only env var *names* for secrets, so the full dump is safe to print.
    sys.stdout.write(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))


def cmd_dvc_yaml(args) -> None:
    from . import dvc_gen

    if args.check:
        diff = dvc_gen.check(args.out, args.config)
        if diff is not None:
            sys.stderr.write(diff)
            fix = "qrewrite dvc-yaml" + (f" --config {args.config}" if args.config != "config.yaml" else "") \
                + (f" --out {args.out}" if args.out != "dvc.yaml" else "")
            raise QrewriteError(f"{args.out} is stale (differs from what qrewrite/paths.py and {args.config} "
                                "generate: a tenant or eval candidate was added, removed or renamed?)",
                                hint=f"regenerate it with `{fix}` and commit the result (README: "
                                "\"Your own tenant in five minutes\")")
        log.info("%s is up to date", args.out)
    else:
        changed = dvc_gen.write(args.out, args.config)
        log.info("%s %s", "wrote" if changed else "unchanged:", args.out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qrewrite", description="Train query-rewrite models for RAG: raw Excel → teacher → RAG-validated "
        "SFT data → LoRA SFT → RL → eval. Each subcommand is one pipeline stage.")
    parser.add_argument("--version", action="version", version=f"qrewrite {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("build-excel", help="build a demo tenant's raw Excel from its reviewable JSONL source")
    _common(p)
    p.add_argument("--out", help="output .xlsx (default: tenants[].raw_excel)")
    p.set_defaults(func=cmd_build_excel)

    p = sub.add_parser("ingest", help="raw Excel → queries.jsonl (stable ids, counted drops)")
    _common(p, "--out", "--stats")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("teacher", help="queries.jsonl → teacher.jsonl (cached teacher rewrites)")
    _common(p, "--queries", "--out", "--stats")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_teacher)

    p = sub.add_parser("validate", help="teacher.jsonl → validated.jsonl (RAG results, rewrite vs raw query)")
    _common(p, "--queries", "--teacher", "--out", "--stats")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("split", help="validated.jsonl → sft/{train,val,test}.jsonl (filter, dedupe, split)")
    _common(p, "--queries", "--teacher", "--validated", "--out-dir", "--stats")
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("summarize", help="per-stage stats → summary.json")
    p.add_argument("--tenant", required=True)
    p.add_argument("--stats", nargs=4, required=True, metavar="JSON", help="ingest, teacher, validate, split stats")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("data-card", help="the dataset's card: sources and hashes, funnel, language, difficulty mix, "
                       "gold and red-team sets, known biases, intended use → data_card.md + data_card.json")
    _common(p)
    for name in ("queries", "teacher", "validated", "train", "val", "test", "summary"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--out", required=True, help="results/T/data_card.md")
    p.add_argument("--out-json", required=True, help="results/T/data_card.json")
    p.set_defaults(func=cmd_data_card)

    p = sub.add_parser("serve-rag", help="serve the local BM25 retriever over the tenant RAG HTTP API")
    _common(p, tenant=False)
    p.add_argument("--host", help="bind address (default rag.serve.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default rag.serve.port)")
    p.set_defaults(func=cmd_serve_rag)

    p = sub.add_parser("dvc-yaml", help="generate dvc.yaml (the data half as DVC stages) from paths.py + config")
    _common(p, tenant=False)
    p.add_argument("--out", default="dvc.yaml", help="output file (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="write nothing; exit non-zero if --out is stale")
    p.set_defaults(func=cmd_dvc_yaml)

    p = sub.add_parser("config", help="print the validated config with defaults filled in")
    _common(p, tenant=False)
    p.set_defaults(func=cmd_config)

    # Later stages register their own subcommands (each module: `register(sub, common)`). By name, not by
    # import statement: dvc.yaml's code deps follow import statements from main (qrewrite/code_deps.py), and
    # every stage would depend on every other stage's code.
    import importlib

    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).register(sub, _common)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # commands that need another env (qrewrite.envs) re-run themselves with it
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):  # httpx2: the OpenAI SDK 3.x transport
        logging.getLogger(noisy).setLevel(logging.WARNING)
    start = time.perf_counter()
    try:
        args.func(args)
    except QrewriteError as exc:
        print(f"qrewrite {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"qrewrite {args.command}: interrupted; rerun to resume (cached calls are kept)", file=sys.stderr)
        return 130
    log.debug("%s took %.2fs", args.command, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
