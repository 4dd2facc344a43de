"""`qrewrite` command line: one subcommand per pipeline stage, named like its rule (rule `merge_sft` runs
`qrewrite merge-sft`, handled by `cmd_merge_sft` in the `cli.py` of the stage's package)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from . import __version__
from .data import cli as data_cli
from .deploy import cli as deploy_cli
from .errors import QrewriteError
from .eval import cli as eval_cli
from .judge import cli as judge_cli
from .lineage.cli import register as register_lineage
from .onboard import cli as onboard_cli
from .rag import cli as rag_cli
from .report import cli as report_cli
from .release import cli as release_cli
from .reward import cli as reward_cli
from .serve import cli as serve_cli
from .teacher import cli as teacher_cli
from .training import cli as training_cli
from .workflow import cli as workflow_cli

log = logging.getLogger("qrewrite")

# Each stage package's `cli` module adds its subcommands, in pipeline order. Their handlers import the stage's
# logic inside the function, so `qrewrite split` loads only the split's code; and dvc.yaml's code deps
# (qrewrite/workflow/code_deps.py) follow a stage's own handler, not the other stages' registrations.
STAGE_CLIS = (data_cli.register, teacher_cli.register, rag_cli.register, reward_cli.register, training_cli.register,
              release_cli.register, eval_cli.register, judge_cli.register,
              report_cli.register, serve_cli.register, deploy_cli.register, onboard_cli.register, register_lineage,
              workflow_cli.register)


class _Parser(argparse.ArgumentParser):
    """`qrewrite --help` lists the stages in pipeline order (the stage table's), then the tools (serve-rag,
    lineage, config, ...) in registration order. Sorted when help is printed, so a plain command does not
    load the table."""

    def format_help(self) -> str:
        from .workflow.stages import STAGES

        order = {name.replace("_", "-"): i for i, name in enumerate(STAGES)}
        for action in self._subparsers._group_actions if self._subparsers else ():
            action._choices_actions.sort(key=lambda choice: order.get(choice.dest, len(order)))
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qrewrite", description="Train query-rewrite models for RAG: raw Excel → teacher → RAG-validated "
        "SFT data → LoRA SFT → RL → eval. Each subcommand is one pipeline stage.")
    parser.add_argument("--version", action="version", version=f"qrewrite {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in STAGE_CLIS:
        register(sub)
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
        # In a container, name its image before any work: the stage's stats and lineage record it.
        from .lineage.container import running_image

        running_image()
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
