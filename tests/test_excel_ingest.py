"""build-excel determinism and the Excel → queries.jsonl round trip (rows, ids, gold ids, column mapping)."""

from __future__ import annotations

import json
import re
import zipfile

import openpyxl
import pytest

from conftest import REPO, write_workbook
from qrewrite.config import load_config, tenant_config
from qrewrite.data.ingest import ingest, query_id
from qrewrite.paths import tenant_paths

HEADER = ["问题", "用户画像", "历史摘要", "相关文档"]


@pytest.fixture
def project(project):
    """The demo tenants' config without the difficulty column: the workbooks here are written by hand with the
    four columns above (a configured column missing from a workbook is an error)."""
    project.update_tenant(None, columns={"difficulty": None})
    return project


def write_xlsx(path, rows, header=HEADER, title="queries"):
    write_workbook(path, header, rows, title)


def run_ingest(project, monkeypatch, name="fivedoctors"):
    """In-process ingest (same code the CLI runs), with the project's relative paths."""
    monkeypatch.chdir(project.root)
    return ingest(tenant_config(load_config("config.yaml"), name))


# ---- build-excel -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tenant", ["fivedoctors", "chengla"])
def test_build_excel_is_byte_identical(project, tenant):
    project.qrewrite("build-excel", "--config", "config.yaml", "--tenant", tenant, "--out", "a.xlsx")
    project.qrewrite("build-excel", "--config", "config.yaml", "--tenant", tenant, "--out", "b.xlsx")
    a, b = (project.root / "a.xlsx").read_bytes(), (project.root / "b.xlsx").read_bytes()
    assert a == b
    # ... because every timestamp is pinned, not because both runs fell in the same 2-second zip tick
    with zipfile.ZipFile(project.root / "a.xlsx") as z:
        assert {i.date_time for i in z.infolist()} == {(2020, 1, 1, 0, 0, 0)}
        core = z.read("docProps/core.xml").decode()
    stamps = re.findall(r"<dcterms:(created|modified)[^>]*>([^<]*)<", core)
    assert sorted(stamps) == [("created", "2020-01-01T00:00:00Z"), ("modified", "2020-01-01T00:00:00Z")], core
    # and it holds the demo source, in order
    src = project.read_jsonl(f"data/demo/{tenant}.queries.jsonl")
    ws = openpyxl.load_workbook(project.root / "a.xlsx").active
    assert [c.value for c in ws[1]] == HEADER
    assert ws.max_row == len(src) + 1
    assert ws.cell(2, 1).value == src[0]["query"] and ws.cell(ws.max_row, 1).value == src[-1]["query"]
    assert ws.cell(2, 4).value == ",".join(src[0]["gold_doc_ids"])


def test_build_excel_default_out_is_raw_excel_and_stage_is_atomic(project):
    project.stage("build-excel")
    raw = project.root / "data" / "raw" / "fivedoctors.xlsx"
    first = raw.read_bytes()
    project.stage("build-excel")
    assert raw.read_bytes() == first
    assert not [p for p in raw.parent.iterdir() if p.name.endswith(".tmp")]


# ---- ingest round trip -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_ingest_round_trip_rows_and_stable_ids(project):
    project.stage("build-excel")
    project.stage("ingest")
    p = tenant_paths("fivedoctors")
    rows = project.read_jsonl(p["queries"])
    stats = json.loads((project.root / p["stats_ingest"]).read_text(encoding="utf-8"))
    src = project.read_jsonl("data/demo/fivedoctors.queries.jsonl")
    assert stats["in"] == len(src) and stats["out"] == len(rows) == stats["in"] - sum(stats["dropped"].values())

    ws = openpyxl.load_workbook(project.root / "data/raw/fivedoctors.xlsx").active
    for r in rows:  # `row` is the Excel row number: the cell there holds this very query
        assert " ".join(str(ws.cell(r["row"], 1).value).split()) == r["query"]
        assert (ws.cell(r["row"], 2).value or "") == r["profile"]
        assert (ws.cell(r["row"], 3).value or "") == r["history"]
        assert r["id"] == query_id(r["query"], r["profile"], r["history"])
        assert r["tenant"] == "fivedoctors"
    assert rows[0]["row"] == 2
    assert len({r["id"] for r in rows}) == len(rows)

    first = (project.root / p["queries"]).read_bytes()
    project.stage("ingest")
    assert (project.root / p["queries"]).read_bytes() == first  # a rerun is byte-identical


def test_ids_follow_content_not_position(project, monkeypatch):
    rows = [["鱼油每天吃几粒", "男, 40岁", "", "fd-001"], ["氨糖怎么存放", "", "问过氨糖", "fd-052"],
            ["维生素D和钙一起吃吗", "女, 60岁", "", ""]]
    raw = project.root / "data/raw/fivedoctors.xlsx"
    write_xlsx(raw, rows)
    before, _ = run_ingest(project, monkeypatch)
    write_xlsx(raw, [["", "", "", ""], *reversed(rows)])  # shuffled, with a blank row on top
    after, _ = run_ingest(project, monkeypatch)
    assert {r["id"]: r["query"] for r in before} == {r["id"]: r["query"] for r in after}
    assert [r["row"] for r in before] == [2, 3, 4]
    assert {r["query"]: r["row"] for r in after} == {"维生素D和钙一起吃吗": 3, "氨糖怎么存放": 4, "鱼油每天吃几粒": 5}


BASE = ("这个怎么吃", "男, 40岁", "用户此前询问了鱼油")
ID_CASES = [
    ("identical", BASE, True),
    ("surrounding-whitespace", ("  这个怎么吃 ", " 男, 40岁", "用户此前询问了鱼油\n"), True),
    ("inner-whitespace-runs", ("这个 怎么吃", "男,   40岁", "用户此前询问了鱼油"), False),
    ("full-width-ascii", ("这个怎么吃", "男, ４０岁", "用户此前询问了鱼油"), True),
    ("upper-case", ("DHA怎么吃", "", ""), None),
    ("different-history", ("这个怎么吃", "男, 40岁", "用户此前询问了氨糖"), False),
    ("no-history", ("这个怎么吃", "男, 40岁", ""), False),
    ("different-profile", ("这个怎么吃", "女, 30岁", "用户此前询问了鱼油"), False),
    ("fields-shifted", ("这个怎么吃", "", "男, 40岁用户此前询问了鱼油"), False),
]


@pytest.mark.parametrize("name,other,same", ID_CASES, ids=[c[0] for c in ID_CASES])
def test_query_id_is_derived_from_content(name, other, same):
    if same is None:  # case folding: "DHA" and "dha" are the same question
        assert query_id("DHA怎么吃", "", "") == query_id("dha怎么吃", "", "")
        return
    assert query_id(*BASE).startswith("q-") and len(query_id(*BASE)) == 18
    assert (query_id(*other) == query_id(*BASE)) is same


GOLD_CASES = [
    ("fd-001,fd-002", ["fd-001", "fd-002"], 0),
    ("fd-001、fd-002", ["fd-001", "fd-002"], 0),
    ("fd-001，fd-002", ["fd-001", "fd-002"], 0),
    ("fd-001; fd-002；fd-003", ["fd-001", "fd-002", "fd-003"], 0),
    ("fd-001 fd-002\nfd-003", ["fd-001", "fd-002", "fd-003"], 0),
    (" fd-001 , ", ["fd-001"], 0),
    ("fd-001,,fd-002,", ["fd-001", "fd-002"], 0),
    ("", [], 0),
    (None, [], 0),
    ("fd-001,fd-999", ["fd-001"], 1),
    ("nosuch、fd-999", [], 2),
]


def test_gold_ids_parsed(project, monkeypatch):
    rows = [[f"鱼油问题{i}", "", "", gold] for i, (gold, _, _) in enumerate(GOLD_CASES)]
    write_xlsx(project.root / "data/raw/fivedoctors.xlsx", rows)
    project.update_tenant("fivedoctors", thresholds={"max_missing_gold_share": 0.2})  # 3 of 19 ids are missing
    out, stats = run_ingest(project, monkeypatch)
    assert len(out) == len(GOLD_CASES)
    for r, (gold, want, _) in zip(out, GOLD_CASES):
        assert r["gold_doc_ids"] == want, (gold, r)
    assert stats["gold_ids_not_in_kb"] == sum(c[2] for c in GOLD_CASES)
    assert stats["gold_ids"] == sum(len(c[1]) + c[2] for c in GOLD_CASES) == 19
    assert stats["with_gold"] == sum(1 for c in GOLD_CASES if c[1])
    (warning,) = stats["warnings"]
    assert warning["missing"] == [{"id": "fd-999", "row": 11}, {"id": "nosuch", "row": 12}, {"id": "fd-999", "row": 12}]


def _gold_rows(n_rows: int, missing: int) -> list[list[str]]:
    """n_rows rows citing one gold id each (fd-001), the last `missing` of them an id the KB lacks."""
    return [[f"鱼油问题{i}", "", "", f"nosuch-{i}" if i >= n_rows - missing else "fd-001"] for i in range(n_rows)]


@pytest.mark.parametrize("n_rows,missing,limit,stops", [
    (20, 2, 0.1, False),    # 10 %: at the limit, a warning
    (20, 3, 0.1, True),     # 15 %: above it
    (20, 1, 0.0, True),     # 0: any missing id stops ingest
    (20, 20, 1.0, False),   # 1: never stops
])
def test_missing_gold_ids_warn_then_stop_at_max_missing_gold_share(project, monkeypatch, n_rows, missing, limit,
                                                                    stops):
    from qrewrite.errors import QrewriteError

    write_xlsx(project.root / "data/raw/fivedoctors.xlsx", _gold_rows(n_rows, missing))
    project.update_tenant("fivedoctors", thresholds={"max_missing_gold_share": limit})
    if stops:
        with pytest.raises(QrewriteError) as exc:
            run_ingest(project, monkeypatch)
        err = exc.value
        first_row = n_rows - missing + 2  # Excel rows start at 2, under the header
        assert (err.file, err.row, err.column) == ("data/raw/fivedoctors.xlsx", first_row, "相关文档")
        assert f"{missing} of the {n_rows} gold ids" in str(err) and f"nosuch-{n_rows - missing}" in str(err)
        assert "tenants[].thresholds.max_missing_gold_share" in str(err) and "tenants[].kb" in err.hint
        return
    out, stats = run_ingest(project, monkeypatch)
    assert len(out) == n_rows and stats["gold_ids_not_in_kb"] == missing
    (warning,) = stats["warnings"]
    listed = warning["missing"]
    assert len(listed) == min(missing, 10)  # the first 10, each with its row
    assert listed[0] == {"id": f"nosuch-{n_rows - missing}", "row": n_rows - missing + 2}
    assert (f"and {missing - 10} more" in warning["message"]) is (missing > 10)


def test_no_missing_gold_no_warning(project, monkeypatch):
    write_xlsx(project.root / "data/raw/fivedoctors.xlsx", _gold_rows(5, 0))
    _, stats = run_ingest(project, monkeypatch)
    assert stats["warnings"] == [] and stats["gold_ids_not_in_kb"] == 0 and stats["gold_ids"] == 5


# ---- tenants[].language against the text -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,cjk,latin", [
    ("深海鱼油DHA怎么吃", 7, 3), ("ＤＨＡ", 0, 3),  # full-width letters are Latin (NFKC)
    ("café 123 !?", 0, 4), ("ひらがな한글Кирилл", 0, 0),  # other scripts, digits, punctuation: not counted
    ("㐀豈𠀀", 3, 0),  # extension A, compatibility ideographs, extension B
])
def test_script_counts(text, cjk, latin):
    from qrewrite.data.ingest import script_counts

    assert script_counts([text]) == (cjk, latin)


def _shares() -> dict[str, float]:
    """CJK share of the queries of the tenants the thresholds were chosen on (ingest.py's comment)."""
    from qrewrite.data.ingest import script_counts

    def share(texts):
        cjk, latin = script_counts(texts)
        return cjk / (cjk + latin)

    out = {f"demo {t}": share(r["query"] for r in map(json.loads, (REPO / f"data/demo/{t}.queries.jsonl")
                                                     .read_text(encoding="utf-8").splitlines()))
           for t in ("fivedoctors", "chengla")}
    cqr = json.loads((REPO / "tests/data/cqr/cqr_kvret_dev_slice.json").read_text(encoding="utf-8"))
    out["cqr"] = share(t["data"]["utterance"] for d in cqr for t in d["dialogue"] if t["turn"] == "driver")
    durdev = REPO.parent / "shared" / "data" / "dur-dev" / "dur-dev.xlsx"
    if durdev.exists():
        ws = openpyxl.load_workbook(durdev, read_only=True).active
        rows = ws.iter_rows(values_only=True)
        col = next(rows).index("问题")
        out["dur-dev"] = share(str(r[col]) for r in rows if r[col])
    return out


def test_the_language_thresholds_leave_every_known_tenant_room():
    from qrewrite.data.ingest import EN_MAX_CJK_SHARE, ZH_MIN_CJK_SHARE

    shares = _shares()
    for name, share in shares.items():
        if name == "cqr":  # English
            assert share <= EN_MAX_CJK_SHARE - 0.4, (name, share)
        else:  # Chinese
            assert share >= ZH_MIN_CJK_SHARE + 0.7, (name, share)


@pytest.mark.parametrize("language,queries,stops", [
    ("zh", ["How many fish oil capsules a day", "Can I take DHA while breastfeeding"], True),
    ("en", ["How many fish oil capsules a day", "Can I take DHA while breastfeeding"], False),
    ("en", ["深海鱼油每天吃几粒", "喂奶期间能吃藻油DHA吗"], True),
    ("zh", ["深海鱼油每天吃几粒", "Omega-3鱼油软胶囊怎么吃", "DHA和EPA有什么区别"], False),  # names in Latin
    ("zh", ["深海鱼油每天吃几粒", "Omega-3 fish oil softgels: how many a day for adults"], True),  # 9 of 49: 18 %
    ("zh", ["ok", "DHA?"], False),  # 6 letters: too few to judge
])
def test_language_is_checked_against_the_queries(project, monkeypatch, language, queries, stops):
    from qrewrite.errors import QrewriteError

    write_xlsx(project.root / "data/raw/fivedoctors.xlsx", [[q, "", "", "fd-001"] for q in queries])
    project.update_tenant("fivedoctors", language=language)
    if stops:
        with pytest.raises(QrewriteError, match=rf"tenants\[\]\.language of tenant fivedoctors is {language}") as exc:
            run_ingest(project, monkeypatch)
        assert (exc.value.file, exc.value.column) == ("data/raw/fivedoctors.xlsx", "问题")
        assert f"set tenants[].language: {'en' if language == 'zh' else 'zh'}" in exc.value.hint
        return
    _, stats = run_ingest(project, monkeypatch)
    check = stats["language_check"]
    assert check["language"] == language and check["cjk"] + check["latin"] > 0
    assert check["checked"] is (check["cjk"] + check["latin"] >= 20)


@pytest.mark.slow
def test_demo_tenant_ingest_records_its_language_check(project, monkeypatch):
    project.stage("build-excel")
    _, stats = run_ingest(project, monkeypatch)
    check = stats["language_check"]
    assert check["language"] == "zh" and check["checked"] and check["cjk_share"] > 0.95, check
    assert stats["warnings"] == [] and stats["gold_ids_not_in_kb"] == 0


MAPPINGS = [
    ("english", {"query": "Question", "profile": "Profile", "history": "History", "gold": "Gold"}, None),
    ("reordered-extra-cols", {"query": "用户问题", "profile": "画像", "history": "上下文", "gold": "标注文档"}, None),
    ("no-gold-column", {"query": "Q", "profile": "P", "history": "H", "gold": None}, None),
    ("named-sheet", {"query": "Question", "profile": "Profile", "history": "History", "gold": "Gold"}, "testset"),
]


@pytest.mark.parametrize("name,columns,sheet", MAPPINGS, ids=[m[0] for m in MAPPINGS])
def test_configurable_column_mapping(project, name, columns, sheet):
    data = [["鱼油每天吃几粒", "男, 40岁", "", "fd-001"], ["这个怎么存放", "", "问过氨糖", "fd-052、fd-001"]]
    keys = ["query", "profile", "history", "gold"]
    if columns["gold"] is None:
        keys = keys[:3]
    header = [columns[k] for k in keys]
    body = [r[:len(keys)] for r in data]
    if name == "reordered-extra-cols":  # columns in another order, with unrelated columns around them
        order = [3, 2, 0, 1]
        header = ["编号", *[header[i] for i in order], "备注"]
        body = [[n, *[r[i] for i in order], "x"] for n, r in enumerate(body, 1)]
    wb = openpyxl.Workbook()
    if sheet:  # the data is on a second sheet; the first one is a cover page
        wb.active.title = "说明"
        wb.active.append(["这是封面"])
        ws = wb.create_sheet(sheet)
    else:
        ws = wb.active
    ws.append(header)
    for r in body:
        ws.append(r)
    (project.root / "data/raw").mkdir(parents=True)
    wb.save(project.root / "data/raw/fivedoctors.xlsx")
    cfg = project.config
    cfg["tenants"][0]["columns"] = columns
    cfg["tenants"][0]["sheet"] = sheet
    project.set_config(cfg)

    project.stage("ingest")
    rows = project.read_jsonl(tenant_paths("fivedoctors")["queries"])
    assert [(r["row"], r["query"], r["profile"], r["history"]) for r in rows] == [
        (2, "鱼油每天吃几粒", "男, 40岁", ""), (3, "这个怎么存放", "", "问过氨糖")]
    want_gold = [[], []] if columns["gold"] is None else [["fd-001"], ["fd-052", "fd-001"]]
    assert [r["gold_doc_ids"] for r in rows] == want_gold


def test_default_column_names_no_longer_match_after_rename(project):
    """Renaming in config but not in the workbook fails, naming the configured column."""
    write_xlsx(project.root / "data/raw/fivedoctors.xlsx", [["鱼油每天吃几粒", "", "", ""]])
    cfg = project.config
    cfg["tenants"][0]["columns"]["query"] = "Question"
    project.set_config(cfg)
    proc = project.stage("ingest", check=False)
    assert proc.returncode == 2
    assert "missing column 'Question'" in proc.stderr and "'问题'" in proc.stderr
