"""Every figure of the README and the reference pages comes from a result file under bench/results/ (bench/figures.py):
the tables between `<!-- figures:NAME -->` markers are what the renderers write from those files, a changed figure
fails, and a measured figure outside a table (a Hit@1, a time in minutes) is not left in the README's prose unless
it carries its mark. A figure in prose, and every figure of a note, carries a mark naming its result file and key
(`0.884<!-- fig: tenant_cqr.json test.release.mean -->`), and the value there is the one printed, at its precision
and in its unit. A note is a dated record: it holds no rendered block, and the files it cites are kept."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from bench import figures
from conftest import REPO


def test_every_figures_block_is_what_its_result_files_say():
    proc = subprocess.run([sys.executable, str(REPO / "bench/figures.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    blocks = [m.group("name") for p in figures.DOCS for m in figures.BLOCK.finditer(p.read_text(encoding="utf-8"))]
    assert {"tenants", "timings"} <= set(blocks), blocks
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tenants = next(m for m in figures.BLOCK.finditer(readme) if m.group("name") == "tenants")
    assert tenants.group("body").count("\n| ") >= 2, "the README's tenant table is empty: no tenant_*.json"


def test_a_changed_figure_fails_the_check(tmp_path):
    """Both ways: a figure edited by hand in the page, and a result file that moved under the page."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tenants = next(m for m in figures.BLOCK.finditer(readme) if m.group("name") == "tenants")
    body = tenants.group("body")
    number = re.search(r"\*\*(0\.\d{3})", body).group(1)
    edited = readme.replace(body, body.replace(number, f"{float(number) - 0.001:.3f}", 1))
    page = tmp_path / "README.md"
    page.write_text(edited, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(REPO / "bench/figures.py"), "--check", str(page)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "stale figures" in proc.stderr and number in proc.stdout
    # the page as it is, rendered from a result file that changed: the check fails too
    assert figures.render_file(readme) == readme
    name = re.search(r"`bench/results/(tenant_\w+)\.json`", body).group(1)
    saved = figures.RESULTS / f"{name}.json"
    backup = tmp_path / "backup.json"
    shutil.copy(saved, backup)
    try:
        text = saved.read_text(encoding="utf-8")
        saved.write_text(text.replace('"n_test_with_gold": ', '"n_test_with_gold": 1', 1), encoding="utf-8")
        assert figures.render_file(readme) != readme
    finally:
        shutil.copy(backup, saved)


FIGURE = re.compile(r"\b0\.\d{3}\b|\b\d+(?:\.\d+)? ?min\b|\b\d+\.\d+ ?[x×]")
BENCH_TABLE = re.compile(r"<!-- bench-table:begin -->.*?<!-- bench-table:end -->", re.S)


def test_no_measured_figure_outside_a_figures_block_in_the_readme():
    """A Hit@1 or an interval bound (0.xxx), a time in minutes or a multiple (1.8x) outside the generated blocks is a
    figure nothing checks: the README's prose refers to the tables instead."""
    text = figures.MARKED.sub("", figures.BLOCK.sub("", (REPO / "README.md").read_text(encoding="utf-8")))
    assert FIGURE.findall(text) == []


@pytest.mark.parametrize("page", [p.name for p in figures.DOCS if p.parent.name == "docs"])
def test_a_reference_page_names_the_source_of_each_figure(page):
    """In a reference page a paragraph (or table) with a measured figure names where it comes from: a result file
    under bench/results/ or a study's folder under studies/ (or it is a generated block), or the settings file its values
    are (a Slurm time limit)."""
    text = BENCH_TABLE.sub("", figures.BLOCK.sub("", (REPO / "docs" / page).read_text(encoding="utf-8")))
    unsourced = [p[:120] for p in re.split(r"\n\s*\n", text)
                 if FIGURE.search(p)
                 and not re.search(r"bench/results/|studies/[\w-]+/|slurm/config\.yaml|config\.yaml|<!-- fig:", p)]
    assert unsourced == []


def test_the_bench_tables_are_what_the_results_say():
    from bench import report

    table = report.render()
    for page in report.PAGES:
        block = BENCH_TABLE.search(page.read_text(encoding="utf-8")).group(0)
        assert table in block, f"{page}: stale bench table: run .venv/bin/python -m bench.report"



NOTE_SERVE = REPO / "docs/notes/2026-12-07-serving-engine.md"
NOTE_SPLIT = REPO / "docs/notes/2026-12-06-splits-of-every-row.md"


def test_every_marked_figure_is_what_its_file_says():
    """README, reference pages and notes: each mark's file exists, holds the key, and its value is the printed one."""
    bad = [x for p in [*figures.DOCS, *figures.NOTES]
           for x in figures.check_marks(p.read_text(encoding="utf-8"), str(p.relative_to(REPO)))]
    assert bad == [], "\n".join(bad)
    # the prose figures of these pages are marked (a page that lost its marks would pass the line above)
    for page, at_least in [("docs/training.md", 25), (NOTE_SERVE, 50), (NOTE_SPLIT, 45)]:
        assert len(figures.MARKED.findall((REPO / page).read_text(encoding="utf-8"))) >= at_least, page


def test_a_note_is_not_rendered_and_the_files_it_cites_are_kept():
    """A note's figures are as written on its date: no block bench/figures.py would re-render from a newer run, and
    each result file it names under bench/results/ is there (a run that overwrote it kept it as <name>_<commit>.json)."""
    assert not any(p.parent.name == "notes" for p in figures.DOCS)
    blocks = [f"{p.name}: {m.group('name')}" for p in figures.NOTES for m in figures.BLOCK.finditer(p.read_text("utf-8"))]
    assert blocks == []
    missing = [f"{p.name}: {name}" for p in figures.NOTES
               for name in re.findall(r"bench/results/([\w.-]+\.json)", p.read_text(encoding="utf-8"))
               if not (figures.RESULTS / name).is_file()]
    assert missing == []


@pytest.mark.parametrize("printed, expr, value, ok", [
    ("0.884", "v", 0.884058, True),
    ("0.885", "v", 0.884058, False),
    ("+0.116", "v", 0.11594, True),
    ("−0.007", "v", -0.0071, True),
    ("-0.007", "v", 0.0071, False),
    ("5.1 s", "v", 5.104, True),
    ("5.10 s", "v", 5.104, True),
    ("5.2 s", "v", 5.104, False),
    ("2.94x", "v", 2.9412, True),
    ("x2.95", "v", 2.9412, False),
    ("88 %", "100 * v", 0.88, True),
    ("88 %", "v", 0.88, False),
    ("31 ms", "1000 * v", 0.0312, True),
    ("18.6 min", "v / 60", 1116.0, True),
    ("3.30 requests/s", "v", 3.3045, True),
    ("48", "v", 48, True),
    ("47", "v", 48, False),
])
def test_a_mark_holds_its_figure_at_the_printed_precision_and_unit(tmp_path, printed, expr, value, ok):
    src = tmp_path / "r.json"
    src.write_text(json.dumps({"a": {"v": value}, "l": [{"name": "x", "v": value}]}), encoding="utf-8")
    for e in (expr.replace("v", "a.v"), expr.replace("v", "l.name=x.v")):
        bad = figures.check_marks(f"was {printed}<!-- fig: {src} {e} --> here\n", "p.md")
        assert (bad == []) is ok, bad


def test_a_wrong_figure_a_stale_file_and_a_missing_file_fail(tmp_path):
    """In a copy of each note: a figure edited by hand; the marks re-pointed at the newer run of the same bench (the
    stale reference a re-render would make); a cited file that is not there; a mark with no figure before it."""
    serve = NOTE_SERVE.read_text(encoding="utf-8")
    assert "1.37x<!-- fig: serve_engine_b8d70b0.json" in serve
    wrong = figures.check_marks(serve.replace("1.37x<!--", "1.38x<!--"), "note")
    assert len(wrong) == 1 and "1.38x" in wrong[0] and "1.372" in wrong[0]
    stale = figures.check_marks(serve.replace("fig: serve_engine_b8d70b0.json", "fig: serve_engine.json"), "note")
    # the newer run differs in most figures, and has no vLLM gateway at all
    assert len([x for x in stale if "serve_engine.json says" in x]) >= 10, stale
    assert all("serve_engine.json" in x for x in stale), stale
    split = NOTE_SPLIT.read_text(encoding="utf-8")
    assert "tenant_cqr_afb97c5.json" in split
    gone = figures.check_marks(split.replace("tenant_cqr_afb97c5.json", "tenant_cqr_0000000.json"), "note")
    assert gone and all("tenant_cqr_0000000.json is no file" in x for x in gone)
    assert figures.check_marks(split.replace("fig: tenant_cqr_afb97c5.json test.", "fig: tenant_cqr_afb97c5.json tst."),
                               "note")
    lost = figures.check_marks("the rule<!-- fig: tenant_cqr_afb97c5.json test.release.mean -->\n", "p.md")
    assert len(lost) == 1 and "no figure right before it" in lost[0]
    assert figures.check_marks("the syntax: `0.5<!-- fig: tenant_cqr_0000000.json a.b -->`\n", "p.md") == []
    # the command the docs give catches it too, in a copy of a page
    page = tmp_path / "page.md"
    page.write_text(serve.replace("1.37x<!--", "1.38x<!--"), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(REPO / "bench/figures.py"), "--check", str(page)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "1.38x" in proc.stderr, proc.stderr
