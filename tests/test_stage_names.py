"""One name per stage: rule `merge_sft` runs `qrewrite merge-sft`, whose handler is `cmd_merge_sft`, and the DVC
stage is `merge_sft` too. A newcomer goes from a rule to its code in one hop, and a table keyed by one name
(e.g. the Slurm test's subcommand -> rule) cannot miss a stage. Failed before: rule `teacher` ran `teach`,
`merge_sft` ran `merge`, `eval_generate` ran `eval-rewrites`, `deploy_check` ran `deploy`."""

from __future__ import annotations

import argparse
import re

import yaml

from conftest import REPO
from qrewrite.cli import build_parser


def _rules() -> dict[str, list[str]]:
    """rule name -> the `qrewrite` subcommands its shell runs (rules without a shell are aggregate targets)."""
    out = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        blocks = re.split(r"^\s*rule (\w+):", smk.read_text(encoding="utf-8"), flags=re.M)
        for name, body in zip(blocks[1::2], blocks[2::2]):
            out[name] = re.findall(r"\bqrewrite ([a-z][\w-]*)", body.split("shell:", 1)[1]) if "shell:" in body else []
    return out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    """`qrewrite`'s subcommand name -> its parser, as the CLI dispatches it."""
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def command(rule: str) -> str:
    return rule.replace("_", "-")


def test_every_rule_runs_the_subcommand_of_its_name():
    rules = _rules()
    assert len(rules) >= 17, sorted(rules)
    wrong = {r: cmds for r, cmds in rules.items() if cmds != [command(r)]}
    assert not wrong, f"rule -> qrewrite subcommands run, expected exactly the rule's name with '-': {wrong}"


def test_every_subcommand_handler_is_named_after_its_rule():
    sub = _subcommands()
    for rule in _rules():
        func = sub[command(rule)].get_default("func")
        assert func.__name__ == f"cmd_{rule}", (rule, f"{func.__module__}.{func.__name__}")


def test_every_dvc_stage_is_named_like_its_rule_and_command():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    rules = _rules()
    for name, stage in stages.items():
        cmd = stage.get("do", stage)["cmd"]
        assert name in rules and cmd.split()[:2] == ["qrewrite", command(name)], (name, cmd)


def test_readme_maps_every_rule_to_its_handler():
    """README "Where the code is": one row per rule, naming the file that holds its handler."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Where the code is", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `(rules/\w+\.smk)` \| `qrewrite ([\w-]+)` \| `([\w/]+\.py)` `(\w+)` \|",
                      section, flags=re.M)
    sub = _subcommands()
    rules = {r for r, cmds in _rules().items() if cmds}
    assert {r[0] for r in rows} == rules, sorted(rules ^ {r[0] for r in rows})
    for rule, smk, cmd, path, handler in rows:
        func = sub[cmd].get_default("func")
        assert f"rule {rule}:" in (REPO / smk).read_text(encoding="utf-8"), (rule, smk)
        assert (cmd, handler) == (command(rule), func.__name__), rule
        assert func.__module__ == path.removesuffix(".py").replace("/", "."), (rule, path, func.__module__)
        for logic in re.findall(r"`(qrewrite/[\w/]+\.py)`", section.split(f"| `{rule}` |", 1)[1].split("\n", 1)[0]):
            assert (REPO / logic).is_file(), (rule, logic)
