"""`qrewrite tenant init` (qrewrite/onboard): the tenant block proposed from a user's own Excel and KB, each proposal
with its evidence, on real files in tmp_path: a Chinese product KB where the embedded resolve teacher fits, a KB of
sights with plain titles where it cannot (an API or the sheet's own rewrites instead), an English sheet, and --write
appending the block to a copy of config.yaml with its comments kept."""

from __future__ import annotations

import difflib
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from openpyxl import load_workbook

from conftest import write_workbook
from qrewrite.cli import main
from qrewrite.config import load_config, tenant_config
from qrewrite.errors import QrewriteError
from qrewrite.onboard.block import tenant_entry
from qrewrite.onboard.columns import propose_columns
from qrewrite.onboard.config_file import append_tenant, insert_tenant
from qrewrite.onboard.kb_fields import propose_kb_fields
from qrewrite.onboard.report import render_report
from qrewrite.onboard.rows import max_query_chars, sample_rows
from qrewrite.onboard.scaffold import propose
from qrewrite.onboard.teachers import scoring_config
from qrewrite.prompts import rewrite_messages

REPO = Path(__file__).resolve().parents[1]

SIGHTS = {  # one document a sight, titled by its name alone: no "entity + aspect" titles
    "故宫": ("明清两代的皇家宫殿", "8:30", "60元", "地铁1号线天安门东站"),
    "颐和园": ("清代皇家园林，以昆明湖和万寿山为基址", "6:30", "30元", "地铁4号线北宫门站"),
    "天坛": ("明清两代帝王祭天祈谷的场所", "6:00", "15元", "地铁5号线天坛东门站"),
    "八达岭长城": ("明长城中保存最好的一段", "7:30", "40元", "S2线八达岭站"),
    "圆明园": ("清代大型皇家园林的遗址公园", "7:00", "25元", "地铁4号线圆明园站"),
}
SIGHT_ASKS = ("它几点开门", "门票多少钱", "需要预约吗", "怎么坐地铁过去")


def write_xlsx(path: Path, header: list, rows: list[list], title: str = "测试集") -> Path:
    return write_workbook(path, header, rows, title)


def read_sheet(path: Path) -> tuple[list, list[list]]:
    ws = load_workbook(path).active
    header, *rows = [[c.value for c in r] for r in ws.iter_rows()]
    return header, rows


def write_jsonl(path: Path, objs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs), encoding="utf-8")
    return path


def fivedoctors_files(root: Path, n: int = 40) -> tuple[Path, Path]:
    """The demo KB under {id, title, text} and its first `n` queries in a sheet with a user's own headers."""
    docs = [json.loads(l) for l in (REPO / "data/kb/fivedoctors.jsonl").read_text(encoding="utf-8").splitlines()]
    kb = write_jsonl(root / "kb.jsonl", [{"id": d["doc_id"], "title": d["title"], "text": d["content"]} for d in docs])
    queries = [json.loads(l) for l in
               (REPO / "data/demo/fivedoctors.queries.jsonl").read_text(encoding="utf-8").splitlines()[:n]]
    excel = write_xlsx(root / "acme.xlsx", ["编号", "用户问题", "用户画像", "对话历史", "相关文档", "备注"],
                       [[i, q["query"], q["profile"], q["history"], ",".join(q["gold_doc_ids"]), ""]
                        for i, q in enumerate(queries, 1)])
    return excel, kb


def sights_files(root: Path, rewrites: bool) -> tuple[Path, Path]:
    """A KB of sights (title: the sight) and questions naming the sight only in the history; with `rewrites`, a
    参考改写 column of people's rewrites."""
    kb = write_jsonl(root / "sights.jsonl", [
        {"id": f"s{i}", "title": name, "content": f"{name}是{about}。开放时间：每天{hours}开门。门票：{price}，需实名预约。"
                                                  f"交通：乘坐{way}下车即到。"}
        for i, (name, (about, hours, price, way)) in enumerate(SIGHTS.items(), 1)])
    rows = [[ask, "游客", f"用户此前询问了{name}的介绍", f"s{i}"]
            + ([f"{name}{ask.removeprefix('它')}"] if rewrites else [])
            for i, name in enumerate(SIGHTS, 1) for ask in SIGHT_ASKS]
    excel = write_xlsx(root / "sights.xlsx", ["用户问题", "用户画像", "对话历史", "相关文档"]
                       + (["参考改写"] if rewrites else []), rows)
    return excel, kb


def init(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["tenant", "init", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def block_of(out: str) -> dict:
    """The tenant block the report prints, read back as YAML."""
    text = out.split("Tenant block", 1)[1].split("\n", 1)[1].split("\nNext:", 1)[0]
    if "\nwrote tenant" in text:
        text = text.split("\nwrote tenant", 1)[0]
    (tenant,) = yaml.safe_load(text)
    return tenant


def figure(out: str, label: str) -> float:
    return float(re.search(rf"^  {re.escape(label)} +([0-9.]+)", out, flags=re.M).group(1))


# ------------------------------------------------------------------------------------------------ (a) resolve fits
def test_a_chinese_product_sheet_gets_its_columns_zh_and_the_resolve_teacher_with_its_figure(tmp_path, capsys):
    excel, kb = fivedoctors_files(tmp_path)
    rc, out, _ = init(capsys, "acme", "--excel", str(excel), "--kb", str(kb), "--config", str(REPO / "config.yaml"))
    assert rc == 0, out
    tenant = block_of(out)
    assert tenant["columns"] == {"query": "用户问题", "profile": "用户画像", "history": "对话历史", "gold": "相关文档",
                                 "difficulty": None, "rewrite": None}
    assert tenant["kb"] == {"path": str(kb.resolve()), "name": "acme_kb",
                            "fields": {"doc_id": "id", "title": "title", "content": "text"}}
    assert tenant["language"] == "zh" and tenant["system_prompt"].startswith("你是 acme 知识库的检索查询改写助手")
    assert (tenant["sheet"], tenant["thresholds"], tenant["student"]) == (None, {"top1": 0.1}, "auto")
    assert tenant["teacher"] == {"provider": "resolve"}
    assert "header '相关文档'; 40 of 40 ids" in out and "gold ids: 40 of 40 cited" in out
    assert re.search(r"CJK share 0\.9\d\d", out)
    resolve, qh = figure(out, "resolve"), figure(out, "query + history")
    assert resolve >= qh and "resolve fits" in out and "on 40 rows with gold" in out
    assert ".venv/bin/snakemake --cores 2 -n data --config only=acme" in out


# ------------------------------------------------------------------------------------------------ (b) resolve cannot
def test_b_plain_titles_resolve_does_not_fit_and_an_api_is_recommended(tmp_path, capsys):
    excel, kb = sights_files(tmp_path, rewrites=False)
    rc, out, _ = init(capsys, "sights", "--excel", str(excel), "--kb", str(kb), "--config", str(REPO / "config.yaml"))
    assert rc == 0, out
    assert "resolve does not fit: KB titles name no product or course" in out
    assert f"resolve found a referent in 0 of {len(SIGHTS) * len(SIGHT_ASKS)} rows" in out
    assert figure(out, "query + history") > figure(out, "raw query")
    assert block_of(out)["teacher"] == {"provider": "openai"} and "OPENAI_API_KEY" in out


def test_b_with_peoples_rewrites_the_column_teacher_is_proposed_with_its_figure(tmp_path, capsys):
    excel, kb = sights_files(tmp_path, rewrites=True)
    rc, out, _ = init(capsys, "sights", "--excel", str(excel), "--kb", str(kb), "--config", str(REPO / "config.yaml"))
    assert rc == 0, out
    tenant = block_of(out)
    assert tenant["columns"]["rewrite"] == "参考改写" and tenant["teacher"] == {"provider": "column"}
    assert "resolve does not fit" in out
    assert figure(out, "column") >= figure(out, "query + history") > figure(out, "raw query")


def test_without_gold_documents_no_figure_is_measured_and_an_api_is_recommended(tmp_path, capsys):
    _, kb = sights_files(tmp_path, rewrites=False)
    excel = write_xlsx(tmp_path / "nogold.xlsx", ["问题", "历史摘要"],
                       [[ask, f"用户此前询问了{name}"] for name in SIGHTS for ask in SIGHT_ASKS])
    rc, out, _ = init(capsys, "sights", "--excel", str(excel), "--kb", str(kb), "--config", str(REPO / "config.yaml"))
    assert rc == 0, out
    assert "no teacher's figure can be measured" in out and "Hit@1 cannot be measured on this sheet" in out
    tenant = block_of(out)
    assert tenant["teacher"] == {"provider": "openai"} and tenant["columns"]["gold"] is None


# ------------------------------------------------------------------------------------------------ (c) English
def test_c_an_english_sheet_is_en_with_english_labels(tmp_path):
    courses = ("Python Basics", "Data Science Bootcamp", "Web Design Studio")
    aspects = {"fees": "costs {n}00 dollars, refunds within 14 days", "schedule": "meets on evening {n} of each week",
               "audience": "is made for learners of level {n}"}
    docs = [{"_id": f"c{i}{a[0]}", "name": f"{c} {a}", "body": f"The {c} {t.format(n=i + 2)}."}
            for i, c in enumerate(courses) for a, t in aspects.items()]
    kb = write_jsonl(tmp_path / "courses.jsonl", docs)
    excel = write_xlsx(tmp_path / "en.xlsx", ["question", "context", "gold"],
                       [[q, f"the user asked about the {c}", f"c{i}{a[0]}"] for i, c in enumerate(courses)
                        for a, q in zip(aspects, ("how much is it", "when does it meet", "who is it for"))],
                       title="eval")
    p = propose("learn", excel, kb, config=REPO / "config.yaml", sample=9)
    assert p["columns"] == {"query": "question", "profile": None, "history": "context", "gold": "gold",
                            "difficulty": None, "rewrite": None}
    assert p["fields"] == {"doc_id": "_id", "title": "name", "content": "body"}
    assert p["language"]["language"] == "en" and p["language"]["cjk_share"] == 0.0
    tenant = p["tenant"]
    assert tenant["system_prompt"].startswith("You rewrite search queries for the learn knowledge base.")
    cfg = scoring_config(load_config(REPO / "config.yaml"), tenant, "config.yaml")
    row = {"query": "how much is it", "profile": "", "history": "the user asked about the Python Basics"}
    assert rewrite_messages(tenant_config(cfg, "learn"), row)[1]["content"].splitlines() == [
        "Question: how much is it", "User profile: none", "History summary: the user asked about the Python Basics"]
    assert "Language: en" in render_report(p)



def test_questions_over_max_query_chars_are_left_out_as_ingest_drops_them(tmp_path, capsys):
    """The rows come from ingest's own builder: a question ingest would drop (longer than the schema's
    max_query_chars, which the block leaves as it is) is in no figure and the report says so."""
    excel, kb = fivedoctors_files(tmp_path, n=12)
    header, rows = read_sheet(excel)
    rows[3][1] = "鱼" * (max_query_chars() + 1)   # one character over
    excel = write_xlsx(tmp_path / "long.xlsx", header, rows)
    rc, out, _ = init(capsys, "acme", "--excel", str(excel), "--kb", str(kb), "--config", str(REPO / "config.yaml"))
    assert rc == 0, out
    assert f"left out: 1 questions longer than tenants[].thresholds.max_query_chars ({max_query_chars()} characters)" \
        in out
    assert "11 questions" in out and "on 11 rows with gold" in out and "gold ids: 11 of 11 cited" in out


# ------------------------------------------------------------------------------------------------ (d) --write
def test_d_write_appends_the_block_keeping_the_comments_and_refuses_a_second_time(tmp_path, capsys):
    excel, kb = sights_files(tmp_path, rewrites=True)
    config = tmp_path / "config.yaml"
    shutil.copy(REPO / "config.yaml", config)
    old = config.read_text(encoding="utf-8")
    rc, out, err = init(capsys, "sights", "--excel", str(excel), "--kb", str(kb), "--config", str(config), "--write")
    assert rc == 0, err
    new = config.read_text(encoding="utf-8")
    # one block inserted, every other line (comments too) kept as it was
    ops = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False).get_opcodes()
    (insert,) = [op for op in ops if op[0] != "equal"]
    added = new.splitlines()[insert[3]:insert[4]]
    assert insert[0] == "insert" and "  - name: sights" in added
    assert new.index("  - name: chengla") < new.index("  - name: sights") < new.index("\nteacher:")
    cfg = load_config(config)
    tenant = tenant_config(cfg, "sights")
    # the files sit in the project (the config's folder): named from there, as config.yaml names them
    assert (tenant["raw_excel"], tenant["kb"]["path"]) == ("sights.xlsx", "sights.jsonl")
    assert tenant["teacher"] == {"provider": "column"} and [t["name"] for t in cfg["tenants"]][-1] == "sights"
    assert "wrote tenant sights" in out
    rc, out, err = init(capsys, "sights", "--excel", str(excel), "--kb", str(kb), "--config", str(config), "--write")
    assert rc == 2 and "a tenant named 'sights' is already in the config: nothing written" in err
    assert config.read_text(encoding="utf-8") == new


def test_insert_keeps_the_comments_of_the_next_key_and_refuses_layouts_it_does_not_know():
    tenant = {"name": "b", "system_prompt": "p", "raw_excel": "b.xlsx", "kb": {"path": "b.jsonl"}}
    text = "tenants:\n- name: a   # first\n  system_prompt: p\n\n# --- the teacher\nteacher: {provider: resolve}\n"
    new = insert_tenant(text, tenant_block(tenant), "c.yaml")
    assert new.index("- name: b") < new.index("# --- the teacher") and "- name: a   # first" in new
    assert yaml.safe_load(new)["tenants"][-1] == tenant_block(tenant)
    last = insert_tenant("x: 1\ntenants:\n  - name: a\n    system_prompt: p\n", tenant_block(tenant), "c.yaml")
    assert yaml.safe_load(last)["tenants"][1]["name"] == "b" and last.startswith("x: 1\n")
    for bad in ("tenants: [{name: a}]\n", "teacher: {}\n", "tenants:\n  - name: a\ntenants:\n  - name: c\n"):
        with pytest.raises(QrewriteError, match="nothing written"):
            insert_tenant(bad, tenant_block(tenant), "c.yaml")


def test_a_written_config_that_does_not_load_is_put_back(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    shutil.copy(REPO / "config.yaml", config)
    old = config.read_bytes()

    def refuse(path):
        raise QrewriteError("config key x: refused", file=str(path))

    monkeypatch.setattr("qrewrite.config.load_config", refuse)
    tenant = tenant_block({"name": "b", "raw_excel": "b.xlsx", "kb": {"path": "b.jsonl"}})
    with pytest.raises(QrewriteError, match="does not validate, so it was left as it was"):
        append_tenant(config, tenant)
    assert config.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def tenant_block(t: dict) -> dict:
    """A tenant with every key the block has (tenant_yaml writes them all)."""
    return tenant_entry(t["name"], language="zh", raw_excel=t["raw_excel"], sheet=None,
                                 columns={"query": "问题"}, kb_path=t["kb"]["path"],
                                 fields={"doc_id": "id", "title": None, "content": "text"}, teacher="resolve")


# ------------------------------------------------------------------------------------------------ cells and errors
def test_columns_and_fields_from_the_values_where_no_name_says():
    header = ["#", "内容", "refs", "说明"]
    rows = [[str(i), q, f"d{i % 3}", ""] for i, q in enumerate(("它几点开门", "门票多少", "要预约吗", "怎么去"))]
    columns, evidence = propose_columns(header, rows, {"d0", "d1", "d2"})
    assert (columns["query"], columns["gold"], columns["history"]) == ("内容", "refs", None)
    assert evidence["gold"].startswith("cells: 4 of 4 ids") and evidence["query"].startswith("cells:")
    objs = [{"key": f"k{i}", "cat": "faq", "txt": "一段很长的正文" * (i + 2)} for i in range(5)]
    fields, evidence = propose_kb_fields(objs, Path("kb.jsonl"))
    assert fields == {"doc_id": "key", "title": None, "content": "txt"} and "unique" in evidence["doc_id"]


def test_the_sample_is_seeded_and_holds_only_rows_with_gold():
    rows = [{"id": str(i), "gold_doc_ids": ["d"] if i % 2 else []} for i in range(200)]
    a, b = sample_rows(rows, 30), sample_rows(rows, 30)
    assert a == b and len(a) == 30 and all(r["gold_doc_ids"] for r in a)
    assert [r["id"] for r in a] == sorted((r["id"] for r in a), key=int)  # in sheet order


@pytest.mark.parametrize("case", ["excel", "query", "kb_content", "kb_id", "name"])
def test_errors_name_the_file_and_what_to_do_with_exit_code_2(tmp_path, capsys, case):
    excel, kb = sights_files(tmp_path, rewrites=False)
    name = "sights"
    if case == "excel":
        excel = tmp_path / "missing.xlsx"
        want = [f"file {excel}: Excel test set not found", "--excel"]
    elif case == "query":
        excel = write_xlsx(tmp_path / "numbers.xlsx", ["编号", "分数"], [[1, 3], [2, 5]])
        want = [f"file {excel}, row 1: no column of sheet '测试集' reads as the questions", "hint: name the question"]
    elif case == "kb_content":
        kb = write_jsonl(tmp_path / "ids.jsonl", [{"id": "s1", "rank": 1}, {"id": "s2", "rank": 2}])
        want = [f"file {kb}, row 1: no field holds the document text", "'rank'"]
    elif case == "kb_id":
        kb = write_jsonl(tmp_path / "noid.jsonl", [{"text": "故宫几点开门", "tag": "x"}, {"text": "门票", "tag": "x"}])
        want = [f"file {kb}, row 1: no field reads as the document id", "hint: every document needs a unique id"]
    else:
        name = "Sights"
        want = ["tenant name 'Sights' is not allowed"]
    rc, _, err = init(capsys, name, "--excel", str(excel), "--kb", str(kb), "--config", str(REPO / "config.yaml"))
    assert rc == 2, err
    for w in want:
        assert w in err
