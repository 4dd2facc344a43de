"""`qrewrite validate` (rule validate: the teacher's rewrites against the tenant's RAG service) and
`qrewrite serve-rag` (the local retriever behind the RAG HTTP API, for tests and demos)."""

from __future__ import annotations

import asyncio
import logging

from ..cli_args import common, load
from ..lineage.container import with_image

log = logging.getLogger("qrewrite.rag")


def cmd_validate(args) -> None:
    from ..io_utils import read_jsonl, write_json, write_jsonl
    from .validate import run_validation

    cfg, tenant = load(args)
    rows, stats = asyncio.run(run_validation(cfg, tenant, read_jsonl(args.queries), read_jsonl(args.teacher),
                                             progress=not args.no_progress))
    write_jsonl(args.out, rows)
    write_json(args.stats, with_image(stats))
    log.info("validate %s: %s", tenant["name"], stats)


def cmd_serve_rag(args) -> None:
    from .server import serve

    cfg, _ = load(args)
    serve(cfg, args.host or cfg["rag"]["serve"]["host"], args.port or cfg["rag"]["serve"]["port"])


def register(sub) -> None:
    p = sub.add_parser("validate", help="teacher.jsonl → validated.jsonl (RAG results, rewrite vs raw query)")
    common(p, "--queries", "--teacher", "--out", "--stats")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("serve-rag", help="serve the local BM25 retriever over the tenant RAG HTTP API")
    common(p, tenant=False)
    p.add_argument("--host", help="bind address (default rag.serve.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default rag.serve.port)")
    p.set_defaults(func=cmd_serve_rag)
