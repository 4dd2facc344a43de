"""Malformed inputs, run through the CLI the way a user (or a Snakemake rule) runs a stage.

Every case either fails cleanly -- exit code 2, the file (and row / column where it means something)
named on stderr, a hint, no traceback and no output file left behind -- or, where the design is to
drop the bad row, succeeds with the drop counted in the stage's stats under the right reason.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import openpyxl
import pytest

from qrewrite.paths import tenant_paths

TENANT = "fivedoctors"
REPO = Path(__file__).resolve().parents[1]
# the appended bad line is the demo file's next row, whatever its length
DEMO_ROWS = len((REPO / "data" / "demo" / f"{TENANT}.queries.jsonl").read_bytes().splitlines())
RAW = "data/raw/fivedoctors.xlsx"
KB = "data/kb/fivedoctors.jsonl"
HEADER = ["问题", "用户画像", "历史摘要", "相关文档"]

GOOD = [
    ["深海鱼油每天吃几粒", "男, 40岁", "", "fd-001"],
    ["氨糖夏天怎么存放", "", "用户此前询问了氨糖的适用人群", "fd-052"],
    ["喂奶期间能吃藻油DHA吗", "女, 30岁, 哺乳期", "", "fd-055"],
]
PATHS = tenant_paths(TENANT)
STAGE_OUTPUTS = {
    "ingest": [PATHS["queries"], PATHS["stats_ingest"]],
    "teacher": [PATHS["teacher"], PATHS["stats_teacher"]],
    "build-excel": [RAW],
}


@pytest.fixture
def project(project):
    """The demo tenants' config without the difficulty column: the workbooks here are written by hand with the
    four columns above (a configured column missing from a workbook is an error)."""
    project.update_tenant(None, columns={"difficulty": None})
    return project


def write_xlsx(root: Path, rows: list[list], header: list | None = HEADER, post: Callable | None = None,
               rel: str = RAW) -> None:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "queries"
    if header is not None:
        ws.append(header)
    for r in rows:
        ws.append(r)
    if post:
        post(ws)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    wb.save(path)


def write_bytes(root: Path, rel: str, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def good_xlsx(project) -> None:
    write_xlsx(project.root, GOOD)


def kb_lines(project) -> list[str]:
    return (project.root / KB).read_text(encoding="utf-8").splitlines()


def set_kb(project, lines: list[str], extra: bytes = b"") -> None:
    (project.root / KB).write_bytes(("\n".join(lines) + "\n").encode("utf-8") + extra)


# ---- setups: each builds one malformed input in the scratch project --------------------------------------

def missing_column(project):
    write_xlsx(project.root, [r[1:] for r in GOOD], header=HEADER[1:])


def renamed_column(project):
    write_xlsx(project.root, GOOD, header=["用户问题", *HEADER[1:]])


def empty_sheet(project):
    write_xlsx(project.root, [], header=None)


def header_only(project):
    write_xlsx(project.root, [], header=HEADER)


def random_bytes(project):
    write_bytes(project.root, RAW, bytes(range(7, 256)) * 40)


def csv_renamed(project):
    text = ",".join(HEADER) + "\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in GOOD) + "\n"
    write_bytes(project.root, RAW, text.encode("utf-8"))


def csv_gbk_renamed(project):
    text = "\t".join(HEADER) + "\r\n" + "\r\n".join("\t".join(r) for r in GOOD) + "\r\n"
    write_bytes(project.root, RAW, text.encode("gbk"))  # what "save as text" in a Chinese Excel produces


def zero_bytes(project):
    write_bytes(project.root, RAW, b"")


def ole_file(project):
    write_bytes(project.root, RAW, b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00\x3e\x00\x03\x00\xfe\xff" * 300)


def corrupt_zip(project):
    write_bytes(project.root, RAW, b"PK\x03\x04" + b"\x00garbage" * 100)


def zip_not_workbook(project):
    import zipfile

    path = project.root / RAW
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("notes.txt", "not a workbook")


def merged_cells(project):
    write_xlsx(project.root, [*GOOD, ["", "女, 25岁", "", ""]], post=lambda ws: ws.merge_cells("A4:A5"))


def formula_cell(project):
    def post(ws):
        ws["A3"] = '=CONCATENATE(B3,"怎么吃")'

    write_xlsx(project.root, GOOD, post=post)


def wrong_sheet(project):
    good_xlsx(project)
    cfg = project.config
    cfg["tenants"][0]["sheet"] = "测试集"
    project.set_config(cfg)


def empty_query(project):
    write_xlsx(project.root, [*GOOD, ["", "男, 50岁", "问过鱼油", ""], ["   ", "女, 20岁", "", "fd-001"]])


def duplicate_rows(project):
    # an exact copy, and a copy that only differs in surrounding whitespace (same normalised content)
    write_xlsx(project.root, [*GOOD, GOOD[0], [" 深海鱼油每天吃几粒\t", "男, 40岁 ", "", "fd-001"]])


def very_long_query(project):
    write_xlsx(project.root, [*GOOD, ["鱼油" * 300, "", "", "fd-001"]])


def gold_mostly_not_in_kb(project):
    # 2 of the 6 gold ids cited are not in the KB: above tenants[].thresholds.max_missing_gold_share (0.1)
    write_xlsx(project.root, [*GOOD, ["鱼油和维生素D能一起吃吗", "", "", "fd-001,fd-999、nosuch"]])


def gold_not_in_kb(project):
    gold_mostly_not_in_kb(project)
    project.update_tenant(TENANT, thresholds={"max_missing_gold_share": 0.5})  # 2 of 6: dropped, with a warning


def english_queries_for_zh(project):
    write_xlsx(project.root, [["How many fish oil capsules should I take a day", "", "", "fd-001"],
                              ["Can I take DHA while breastfeeding", "", "", "fd-055"],
                              ["How do I store glucosamine in summer", "", "", "fd-052"]])


def chinese_queries_for_en(project):
    good_xlsx(project)
    project.update_tenant(TENANT, language="en")


def kb_not_utf8(project):
    good_xlsx(project)
    lines = kb_lines(project)
    set_kb(project, lines, extra='{"doc_id": "fd-900", "title": "鱼油", "content": "深海鱼油"}\n'.encode("gbk"))


def kb_invalid_json(project):
    good_xlsx(project)
    lines = kb_lines(project)
    lines.insert(4, '{"doc_id": "fd-900", "content": ')
    set_kb(project, lines)


def kb_duplicate_ids(project):
    good_xlsx(project)
    lines = kb_lines(project)
    dup = json.loads(lines[1])
    dup["title"] = "another doc with the same id"
    lines.insert(6, json.dumps(dup, ensure_ascii=False))  # line 7 repeats the id of line 2
    set_kb(project, lines)


def kb_missing_content(project):
    good_xlsx(project)
    lines = kb_lines(project)
    lines[2] = json.dumps({"doc_id": "fd-003", "title": "no content here"})
    set_kb(project, lines)


def kb_missing_file(project):
    good_xlsx(project)
    (project.root / KB).unlink()


def schema_violation(project):
    good_xlsx(project)
    project.update(teacher={"provider": "gpt"})


def schema_violation_nested(project):
    good_xlsx(project)
    cfg = project.config
    cfg["tenants"][0]["thresholds"]["top1"] = 1.5
    project.set_config(cfg)


def config_missing(project):
    good_xlsx(project)
    project.config_path.unlink()


def config_not_yaml(project):
    good_xlsx(project)
    project.config_path.write_text("tenants: [\n  - name: x\n", encoding="utf-8")


def raw_missing(project):
    pass  # nothing built: data/raw/fivedoctors.xlsx does not exist


def demo_source_not_utf8(project):
    src = project.root / "data" / "demo" / f"{TENANT}.queries.jsonl"
    src.write_bytes(src.read_bytes() + '{"query": "鱼油怎么吃", "gold_doc_ids": []}\n'.encode("gbk"))


def queries_missing(project):
    pass  # teach before ingest: results/fivedoctors/queries.jsonl does not exist


def queries_not_utf8(project):
    path = project.root / PATHS["queries"]
    path.parent.mkdir(parents=True, exist_ok=True)
    line = '{"id": "q-%d", "query": "鱼油"}\n'
    path.write_bytes((line % 1).encode("utf-8") + (line % 2).encode("gbk"))


@dataclass
class Case:
    id: str
    setup: Callable
    stage: str = "ingest"
    # error cases: substrings stderr must contain (the file is always required)
    file: str | None = RAW
    expect: list[str] = field(default_factory=list)
    args: list[str] | None = None  # raw CLI args instead of project.stage(stage)
    # drop cases: {stats key path: value}
    stats: dict | None = None
    out_rows: int | None = None


CASES = [
    Case("missing-column", missing_column, expect=["row 1", "column '问题'", "missing column '问题'",
                                                   "columns found: ['用户画像', '历史摘要', '相关文档']",
                                                   "tenants[].columns.query"]),
    Case("renamed-column", renamed_column, expect=["row 1", "column '问题'", "'用户问题'", "columns found"]),
    Case("empty-sheet", empty_sheet, expect=["is empty", "column headers"]),
    Case("header-only", header_only, expect=["no data rows", "has no queries"]),
    Case("random-bytes", random_bytes, expect=["not an Excel .xlsx file", "is not a zip archive"]),
    Case("csv-renamed-xlsx", csv_renamed,
         expect=["not an Excel .xlsx file", "looks like text (a CSV?)", "export the sheet as .xlsx"]),
    Case("gbk-tsv-renamed-xlsx", csv_gbk_renamed, expect=["not an Excel .xlsx file", "looks like text (a CSV?)"]),
    Case("zero-byte-file", zero_bytes, expect=["not an Excel .xlsx file", "is empty"]),
    Case("ole-password-protected", ole_file, expect=["password-protected", "save as .xlsx"]),
    Case("corrupt-zip", corrupt_zip, expect=["cannot read workbook", "re-save"]),
    Case("zip-not-workbook", zip_not_workbook, expect=["cannot read workbook", "re-save"]),
    Case("merged-cells", merged_cells, expect=["row 4", "column '问题'", "merged cells A4:A5", "unmerge"]),
    Case("formula-cell", formula_cell, expect=["row 3", "column '问题'", "formula", "paste the column as values"]),
    Case("wrong-sheet-name", wrong_sheet, expect=["sheet '测试集' not found", "queries"]),
    Case("empty-query", empty_query, stats={"dropped.empty_query": 2, "in": 5, "out": 3}, out_rows=3),
    Case("duplicate-rows", duplicate_rows, stats={"dropped.duplicate_row": 2, "in": 5, "out": 3}, out_rows=3),
    Case("very-long-query", very_long_query, stats={"dropped.query_too_long": 1, "in": 4, "out": 3}, out_rows=3),
    Case("gold-not-in-kb", gold_not_in_kb, stats={"gold_ids_not_in_kb": 2, "gold_ids": 6, "dropped": {}, "out": 4,
                                                   "with_gold": 4}, out_rows=4),
    Case("gold-mostly-not-in-kb", gold_mostly_not_in_kb,
         expect=["row 5", "column '相关文档'", "2 of the 6 gold ids", "(33%)", "tenants[].thresholds.max_missing_gold_share",
                 "'fd-999'", "fd-999 (row 5), nosuch (row 5)", "tenants[].kb.path"]),
    Case("language-zh-but-english-queries", english_queries_for_zh,
         expect=["column '问题'", "tenants[].language of tenant fivedoctors is zh", "mostly Latin letters",
                 "CJK ideographs are 0%", "set tenants[].language: en", "tenants[].columns.query"]),
    Case("language-en-but-chinese-queries", chinese_queries_for_en,
         expect=["column '问题'", "tenants[].language of tenant fivedoctors is en", "mostly Chinese characters",
                 "set tenants[].language: zh"]),
    Case("kb-not-utf8", kb_not_utf8, file=KB, expect=["row 73", "UTF-8", "hint"]),
    Case("kb-invalid-json", kb_invalid_json, file=KB, expect=["row 5", "invalid JSON"]),
    Case("kb-duplicate-ids", kb_duplicate_ids, file=KB, expect=["row 7", "duplicate doc_id 'fd-002'",
                                                                "first seen on row 2", "unique"]),
    Case("kb-missing-content", kb_missing_content, file=KB, expect=["row 3", "column 'content'", "missing"]),
    Case("kb-missing-file", kb_missing_file, file=KB, expect=["knowledge base not found", "kb.path"]),
    Case("config-schema-violation", schema_violation, file="config.yaml",
         expect=["teacher.provider", "'gpt' is not one of", "config.schema.yaml"]),
    Case("config-schema-violation-nested", schema_violation_nested, file="config.yaml",
         expect=["tenants.0.thresholds.top1", "1.5"]),
    Case("unknown-tenant", good_xlsx, file=None, args=["ingest", "--tenant", "nosuch", "--out", PATHS["queries"],
                                                        "--stats", PATHS["stats_ingest"]],
         expect=["unknown tenant 'nosuch'", "fivedoctors, chengla", "tenants:"]),
    Case("config-missing", config_missing, file="config.yaml", expect=["config file not found", "--config"]),
    Case("config-not-yaml", config_not_yaml, file="config.yaml", expect=["not valid YAML"]),
    Case("raw-excel-missing", raw_missing, expect=["raw Excel file not found", "raw_excel"]),
    Case("demo-source-not-utf8", demo_source_not_utf8, stage="build-excel",
         file=f"data/demo/{TENANT}.queries.jsonl", expect=[f"row {DEMO_ROWS + 1}", "UTF-8"]),
    Case("teach-queries-missing", queries_missing, stage="teacher", file=PATHS["queries"], expect=["not found"]),
    Case("teach-queries-not-utf8", queries_not_utf8, stage="teacher", file=PATHS["queries"], expect=["row 2", "UTF-8"]),
]


def _get(stats: dict, dotted: str):
    for part in dotted.split("."):
        stats = stats.get(part, 0) if isinstance(stats, dict) else stats
    return stats


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(project, case: Case):
    case.setup(project)
    if case.args is not None:
        proc = project.qrewrite(*case.args, "--config", "config.yaml", check=False, timeout=120)
    else:
        proc = project.stage(case.stage, check=False, timeout=120)
    err = proc.stderr

    if case.stats is not None:  # the design drops the row: the stage succeeds and counts the drop
        assert proc.returncode == 0, err
        stats = json.loads((project.root / PATHS["stats_ingest"]).read_text(encoding="utf-8"))
        for key, want in case.stats.items():
            assert _get(stats, key) == want, (key, stats)
        assert stats["in"] == stats["out"] + sum(stats["dropped"].values()), stats
        rows = project.read_jsonl(PATHS["queries"])
        assert len(rows) == case.out_rows
        if case.id == "gold-not-in-kb":
            assert rows[-1]["gold_doc_ids"] == ["fd-001"]
            # the warning names each missing id with its Excel row (summary.json collects it, the card shows it)
            (warning,) = stats["warnings"]
            assert warning["code"] == "gold_ids_not_in_kb"
            assert warning["missing"] == [{"id": "fd-999", "row": 5}, {"id": "nosuch", "row": 5}]
            assert "fd-999 (row 5), nosuch (row 5)" in warning["message"] and "column '相关文档'" in warning["message"]
            assert "fd-999 (row 5)" in err  # and it is logged
        else:
            assert stats["warnings"] == []
        assert stats["language_check"]["language"] == "zh" and stats["language_check"]["cjk_share"] > 0.8
        assert _leftovers(project.root) == []
        return

    assert proc.returncode == 2, f"rc={proc.returncode}\n{err}"
    assert "Traceback" not in err and "Traceback" not in proc.stdout, err
    assert err.startswith(f"qrewrite {case.args[0] if case.args else case.stage}: error:"), err
    assert "hint:" in err, f"no hint:\n{err}"
    if case.file is not None:
        assert f"file {case.file}" in err, err
    for s in case.expect:
        assert s in err, f"{s!r} not in stderr:\n{err}"
    outputs = STAGE_OUTPUTS[case.stage if case.args is None else case.args[0]]
    for rel in outputs:
        assert not (project.root / rel).exists(), f"{rel} left behind"
    assert _leftovers(project.root) == []


@pytest.mark.slow
def test_100k_rows_ingest(project, capsys):
    t0 = time.perf_counter()
    wb = openpyxl.Workbook(write_only=True)
    ws = wb.create_sheet("queries")
    ws.append(HEADER)
    golds = ["fd-001", "fd-002,fd-003", "", "fd-010、fd-011"]
    for i in range(100_000):
        ws.append([f"深海鱼油每天吃几粒 第{i}个问题", f"男, {20 + i % 60}岁", f"用户此前问过{i % 97}号产品",
                   golds[i % 4]])
    (project.root / "data" / "raw").mkdir(parents=True)
    wb.save(project.root / RAW)
    t_build = time.perf_counter() - t0

    t0 = time.perf_counter()
    project.stage("ingest", timeout=300)
    t_ingest = time.perf_counter() - t0
    stats = json.loads((project.root / PATHS["stats_ingest"]).read_text(encoding="utf-8"))
    assert stats["in"] == stats["out"] == 100_000
    assert stats["with_gold"] == 75_000
    rows = project.read_jsonl(PATHS["queries"])
    assert rows[0]["row"] == 2 and rows[-1]["row"] == 100_001
    assert len({r["id"] for r in rows}) == 100_000
    with capsys.disabled():
        print(f"\n100k-row Excel: build {t_build:.1f}s, `qrewrite ingest` {t_ingest:.1f}s")
    assert t_ingest < 120, f"ingest of 100k rows took {t_ingest:.1f}s"
