"""The committed demo files (data/kb/*.jsonl, data/demo/*.queries.jsonl) are exactly what
scripts/make_demo_data.py writes from the tables in data/demo/tables/: an edit to a table that is not
followed by a regeneration fails here, and so does a hand edit to a generated file."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

GENERATED = [f"data/kb/{t}.jsonl" for t in ("fivedoctors", "chengla")] + \
            [f"data/demo/{t}.queries.jsonl" for t in ("fivedoctors", "chengla")]


def test_demo_files_are_what_the_tables_generate(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts/make_demo_data.py"), "--out-root", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(GENERATED)
    for rel in GENERATED:
        assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), \
            f"{rel} differs from what data/demo/tables/ generates: run python scripts/make_demo_data.py"
