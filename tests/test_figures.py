"""Every figure of the README and the reference pages comes from a result file under bench/results/ (bench/figures.py):
the tables between `<!-- figures:NAME -->` markers are what the renderers write from those files, a changed figure
fails, and a measured figure outside a table (a Hit@1, a time in minutes) is not left in the README's prose."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import figures  # noqa: E402


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
    text = figures.BLOCK.sub("", (REPO / "README.md").read_text(encoding="utf-8"))
    assert FIGURE.findall(text) == []


@pytest.mark.parametrize("page", [p.name for p in figures.DOCS if p.parent.name == "docs"])
def test_a_reference_page_names_the_source_of_each_figure(page):
    """In a reference page a paragraph (or table) with a measured figure names where it comes from: a result file
    under bench/results/ (or it is a generated block), or the settings file its values are (a Slurm time limit)."""
    text = BENCH_TABLE.sub("", figures.BLOCK.sub("", (REPO / "docs" / page).read_text(encoding="utf-8")))
    unsourced = [p[:120] for p in re.split(r"\n\s*\n", text)
                 if FIGURE.search(p) and not re.search(r"bench/results/|slurm/config\.yaml|config\.yaml", p)]
    assert unsourced == []


def test_the_bench_tables_are_what_the_results_say():
    import report

    table = report.render()
    for page in report.PAGES:
        block = BENCH_TABLE.search(page.read_text(encoding="utf-8")).group(0)
        assert table in block, f"{page}: stale bench table: run .venv/bin/python bench/report.py"
