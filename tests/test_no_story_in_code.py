"""Comments say why, notes say when. The repository ships without its issue tracker, so an issue number in a comment
means nothing to its reader; a date or one machine's timing in a comment is a story that goes stale. Both belong in
a note (docs/notes/<date>-<slug>.md), which a comment can link to. Checked here: the comments and docstrings of the
Python code, the comments of the config, shell, make, container and env files, and the reference pages (README.md,
docs/*.md; not the notes, which are dated records). Dates that are data pass: a note's file name in a link, a
result file's name (bench/results/...), a value in a page's code span (a config key's date, as `prices_read`), and
the figure blocks bench/figures.py renders from the result files, each of which names its measurement's date."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from conftest import REPO

# An issue of this project's tracker: the word issue with its number (with or without a hash), a tracker's URL, or
# a bare hash and number. Not an upstream tracker's owner/repo plus hash and number, an HTML entity, or a Markdown
# anchor link (the planted cases below show each).
ISSUE = re.compile(r"\bissues?[ _-]?(?:#|no\.? ?)?\d+|\bissues/\d+|(?<![\w/&#])(?<!\]\()#\d{1,4}\b", re.I)
# A date (year, month, day), or a month of a year, written the ISO way; not the start of a file's name (a result
# file, a note).
DATE = re.compile(r"(?<![\w.-])20\d\d-(?:0[1-9]|1[0-2])(?:-(?:0[1-9]|[12]\d|3[01]))?(?![\w.-]*\.(?:md|json|jsonl))"
                  r"(?!\d)")
# Where a date is a name, not a story: a note's file (a link to it, or its path in a comment), result files and the
# dated study folders.
NAMES = re.compile(r"(?:docs/)?notes/20\d\d-\d\d-\d\d[\w.-]*|bench/results/[\w./*<>{}-]+|studies/[\w./*<>{}-]+")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# The blocks bench/figures.py writes from the result files (each with the date its figures were measured).
RENDERED = re.compile(r"<!-- figures:(?P<name>[\w-]+)[^>]*-->.*?<!-- /figures:(?P=name) -->"
                      r"|<!-- bench-table:begin -->.*?<!-- bench-table:end -->", re.S)

PYTHON = ["qrewrite", "tools", "tests", "scripts", "bench", "studies", "slurm"]
HASH_COMMENTED = ["config.yaml", "bench/*.yaml", "Makefile", "Snakefile", "rules/*.smk", ".ci/run", ".ci/*.yaml",
                  "scripts/*.sh", "slurm/*.sh", "slurm/*.yaml", "containers/*", "envs/*", "qrewrite/**/*.yaml"]
PAGES = ["README.md", "docs/*.md"]


def stories(text: str, dates: bool = True) -> list[str]:
    """Each issue number and (with `dates`) each date in a piece of prose, names of notes and result files left
    out."""
    prose = NAMES.sub(" ", text)
    return [m.group(0) for m in ISSUE.finditer(prose)] + ([m.group(0) for m in DATE.finditer(prose)] if dates else [])


def python_prose(source: str) -> list[tuple[int, str, bool]]:
    """(line, text, dates checked) of each comment and docstring of a Python source."""
    out = [(t.start[0], t.string, True) for t in tokenize.generate_tokens(io.StringIO(source).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.append((first.lineno, first.value.value, True))
    return out


def hash_comments(text: str) -> list[tuple[int, str, bool]]:
    """(line, text, dates checked) of each `#` comment of a shell, make, YAML or requirements file (a `#` that
    starts the line or follows a blank)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(?:^|\s)#(.*)$", line)
        if m:
            out.append((n, m.group(1), True))
    return out


def page_prose(text: str) -> list[tuple[int, str, bool]]:
    """(line, text, dates checked) of a reference page, the rendered figure blocks blanked (their lines kept, so
    numbers match). Code spans are data (a config value, a command): their dates pass, their issue numbers do not."""
    text = RENDERED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        out.append((n, CODE_SPAN.sub(" ", line), True))
        out += [(n, m.group(2), False) for m in CODE_SPAN.finditer(line)]
    return out


def findings(path: Path, text: str) -> list[str]:
    """`path:line: what` for each issue number or date in the file's comments, docstrings or (a page) prose."""
    if path.suffix == ".py":
        parts = python_prose(text)
    elif path.suffix == ".md":
        parts = page_prose(text)
    else:
        parts = hash_comments(text)
    return [f"{path}:{line}: {hit}" for line, part, dates in parts for hit in stories(part, dates)]


def _files() -> list[Path]:
    files: set[Path] = set()
    for top in PYTHON:
        files.update((REPO / top).rglob("*.py"))
    for pattern in HASH_COMMENTED + PAGES:
        files.update(p for p in REPO.glob(pattern) if p.is_file())
    skip = (".venv", "__pycache__", "bench/work", "tests/data")
    return sorted(p for p in files if not any(s in p.relative_to(REPO).as_posix() for s in skip))


def test_no_issue_numbers_or_dates_in_comments_docstrings_or_reference_pages():
    bad = []
    for path in _files():
        bad += findings(path.relative_to(REPO), path.read_text(encoding="utf-8"))
    assert bad == [], "say why; the story (when, which issue) goes to a note under docs/notes/:\n" + "\n".join(bad)


@pytest.mark.parametrize("name, text, found", [
    ("a.py", '"""The judge (issue 31): a small model."""\n', ["issue 31"]),
    ("a.py", "x = 1  # since #45 was closed\n", ["#45"]),
    ("a.py", "def f():\n    \"\"\"Measured 2026-11-29 on 2 cores.\"\"\"\n", ["2026-11-29"]),
    ("a.py", "# the CJK share, measured 2026-12\n", ["2026-12"]),
    ("a.py", "# see https://github.com/o/r/issues/7\n", ["issues/7"]),
    ("Makefile", "all:  # ran out of disk on 2026-12-02\n", ["2026-12-02"]),
    ("p.md", "It was re-decided on 2026-12-07 by a rule ([note](notes/2026-12-07-x.md)).\n", ["2026-12-07"]),
    ("p.md", "## verl on one GPU (Issue 29)\n", ["Issue 29"]),
    ("p.md", "the branch `issue-22-guards`\n", ["issue-22"]),
])
def test_the_check_finds_a_planted_issue_number_or_date(name, text, found):
    assert [f.split(": ", 1)[1] for f in findings(Path(name), text)] == found


@pytest.mark.parametrize("name, text", [
    ("a.py", "# why: see docs/notes/2026-12-02-ci-disk.md\n"),
    ("a.py", 'STAMP = "2020-01-01T00:00:00Z"  # a fixture\'s fixed time\n'),  # a date in code, not in the comment
    ("a.py", "# upstream: treeverse/dvc#9021\n"),
    ("a.py", "# the tenant's results: bench/results/tenant_2026-12-06.json\n"),
    ("Makefile", 'x:\n\techo "$$#"\n'),
    ("p.md", "[the note](notes/2026-11-27-make-run-timing.md), [a heading](#the-learning-run)\n"),
    ("p.md", "<!-- figures:timings -->\n| `make run` | 18.6 min | 2026-12-07 |\n<!-- /figures:timings -->\n"),
    ("p.md", "an HTML entity &#12; is no issue, nor a config value `prices_read: 2025-10`\n"),
])
def test_the_check_passes_names_and_data(name, text):
    assert findings(Path(name), text) == []


def test_the_check_reads_every_kind_of_file():
    """The scan reaches each kind it names (a glob that matched nothing would pass quietly)."""
    files = {p.relative_to(REPO).as_posix() for p in _files()}
    for expected in ["config.yaml", "qrewrite/cli.py", "qrewrite/schemas/config.schema.yaml", "tests/conftest.py",
                     "Makefile", "Snakefile", ".ci/run", "containers/verl.Containerfile", "envs/verl.txt", "README.md",
                     "docs/code.md"]:
        assert expected in files, expected
    assert not any(f.startswith("docs/notes/") for f in files)
