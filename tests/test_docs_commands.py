"""Every command the README and the reference docs show runs as typed from a fresh clone: each `snakemake` command
names its cores or a profile (the pinned Snakemake refuses to run locally without), or is one that executes nothing
(a dry run, a listing); each `make TARGET` is a target of the Makefile. Notes (docs/notes/) are dated records of what
was run then, and are left as written."""

from __future__ import annotations

import re

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
# snakemake invocations that execute nothing, so need no --cores
NO_EXECUTION = ("-n", "--dry-run", "--dryrun", "--list-rules", "--list", "-l", "--version", "--help", "-h",
                "--lint", "--dag", "--rulegraph", "--summary", "--report")


def commands(text: str) -> list[str]:
    """Fenced code lines and inline code spans (a command per line; `\\` continuations joined). Generated figure
    blocks (`<!-- figures:... -->`, the bench table) are left out: they quote the command a stored result was made by, as run."""
    text = re.sub(r"<!-- figures:.*?<!-- /figures:[a-z_]* -->", "", text, flags=re.S)
    text = re.sub(r"<!-- bench-table:begin -->.*?<!-- bench-table:end -->", "", text, flags=re.S)
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        out += [ln.split("  #")[0].strip() for ln in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    out += re.findall(r"`([^`\n]+)`", prose)
    return [c for c in out if c]


def snakemake_calls(cmd: str) -> list[str]:
    """The snakemake invocations in one command line (after `&&`, `;` or a pipe too)."""
    return [part.strip() for part in re.split(r"&&|;|\|", cmd)
            if re.match(r"^(\S*/)?snakemake(\s|$)", part.strip().split("=", 1)[-1] if part.strip().startswith(
                ("PATH=",)) else part.strip())]


def test_every_snakemake_command_in_the_docs_names_cores_or_a_profile():
    bad = []
    for doc in DOCS:
        for cmd in commands(doc.read_text(encoding="utf-8")):
            for call in snakemake_calls(cmd):
                words = call.split()
                if len(words) == 1 and "snakemake" in words[0]:
                    continue  # the tool's name in prose, not a command
                if any(w in NO_EXECUTION for w in words) or any(w.startswith(("--cores", "-c", "--jobs", "-j",
                                                                               "--profile")) for w in words):
                    continue
                bad.append(f"{doc.relative_to(REPO)}: {call}")
    assert not bad, "snakemake commands that would refuse to run (no --cores or --profile):\n" + "\n".join(bad)


def test_every_make_target_in_the_docs_exists():
    targets = set(re.findall(r"^([a-zA-Z0-9_.-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), flags=re.M))
    bad = []
    for doc in DOCS:
        for cmd in commands(doc.read_text(encoding="utf-8")):
            m = re.match(r"^make\s+(?:-\S+\s+)*([a-z][a-z0-9_-]*)", cmd)
            if m and m.group(1) not in targets:
                bad.append(f"{doc.relative_to(REPO)}: {cmd}")
    assert not bad, "make targets the Makefile does not have:\n" + "\n".join(bad)


def test_the_scanner_catches_a_command_without_cores():
    """The check above can fail: a planted command is caught, its fixed form is not."""
    planted = "Run it:\n\n```bash\nsnakemake reports/acme/deploy.json\n```\n"
    assert snakemake_calls(commands(planted)[0]) == ["snakemake reports/acme/deploy.json"]
    fixed = commands("`.venv/bin/snakemake --cores 2 deploy`")[0]
    assert any(w.startswith("--cores") for w in snakemake_calls(fixed)[0].split())
