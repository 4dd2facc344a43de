"""Training subcommands (registered into `qrewrite` by qrewrite/cli.py)."""

from __future__ import annotations


def register(sub, common) -> None:
    pass
