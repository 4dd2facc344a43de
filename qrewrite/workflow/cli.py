"""Project commands around the stage table: `qrewrite dvc-yaml` (dvc.yaml from the table) and `qrewrite config`."""

from __future__ import annotations

import logging
import sys

from ..cli_args import common, load
from ..errors import QrewriteError

log = logging.getLogger("qrewrite.workflow")


def cmd_config(args) -> None:
    import yaml

    from ..secret import redact_env_values, redact_values, strip_secrets

    cfg, _ = load(args)
    # Config holds only env var *names* for secrets (load refuses a key where a name belongs, or a value shaped
    # like a credential); what is printed is redacted all the same: values under secret-looking keys, credential-
    # shaped values and the value of any secret-looking environment variable.
    dump = yaml.safe_dump(redact_values(strip_secrets(cfg)), allow_unicode=True, sort_keys=False)
    sys.stdout.write(redact_env_values(dump))


def cmd_dvc_yaml(args) -> None:
    from . import dvc_gen

    if args.check:
        diff = dvc_gen.check(args.out, args.config)
        if diff is not None:
            sys.stderr.write(diff)
            fix = "qrewrite dvc-yaml" + (f" --config {args.config}" if args.config != "config.yaml" else "") \
                + (f" --out {args.out}" if args.out != "dvc.yaml" else "")
            raise QrewriteError(f"{args.out} is stale (differs from what the stage table, qrewrite/workflow/stages.py, "
                                f"and {args.config} generate: a tenant or eval candidate was added, removed or renamed?)",
                                hint=f"regenerate it with `{fix}` and commit the result (README: "
                                "\"Your own tenant in five minutes\")")
        log.info("%s is up to date", args.out)
    else:
        changed = dvc_gen.write(args.out, args.config)
        log.info("%s %s", "wrote" if changed else "unchanged:", args.out)


def register(sub) -> None:
    p = sub.add_parser("dvc-yaml", help="generate dvc.yaml (every stage as a DVC stage) from the stage table + config")
    common(p, tenant=False)
    p.add_argument("--out", default="dvc.yaml", help="output file (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="write nothing; exit non-zero if --out is stale")
    p.set_defaults(func=cmd_dvc_yaml)

    p = sub.add_parser("config", help="print the validated config with defaults filled in")
    common(p, tenant=False)
    p.set_defaults(func=cmd_config)
