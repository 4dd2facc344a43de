"""What every stage's command line shares: `--config`, `--tenant`, required paths, and the one config loader."""

from __future__ import annotations

import argparse


def common(p: argparse.ArgumentParser, *required: str | tuple[str, str], tenant: bool = True) -> None:
    """--config (and --tenant), then the command's required arguments: "--flag" or ("--flag", "help")."""
    p.add_argument("--config", default="config.yaml", help="pipeline config (default: %(default)s)")
    if tenant:
        p.add_argument("--tenant", required=True, help="tenant name from config.yaml")
    for arg in required:
        flag, help_ = (arg, None) if isinstance(arg, str) else arg
        p.add_argument(flag, required=True, help=help_)


def load(args) -> tuple[dict, dict | None]:
    """The validated config of `--config` and the `--tenant` entry of it (None for commands without one)."""
    from .config import load_config, tenant_config

    cfg = load_config(args.config)
    return cfg, (tenant_config(cfg, args.tenant) if getattr(args, "tenant", None) else None)
