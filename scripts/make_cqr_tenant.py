#!/usr/bin/env python3
"""An English tenant nobody on this project wrote: the public CQR set (Regan et al. 2019; MIT-0), in-car
dialogues (calendar, weather, navigation) whose driver turns were rewritten by the dataset's authors.

From one CQR file (``../shared/data/cqr/cqr_kvret_{dev,test}_public.json``) it writes, under ``--out``:

* ``cqr.xlsx``: one row per rewritten turn: ``utterance`` (the driver's last utterance, what the RAG service
  receives), ``history`` (the turns before it, ``user: … | assistant: …``), ``gold_doc_ids``, ``reference``
  (the authors' gold rewrite: the teacher of ``teacher.provider: column``, or of the test teacher server) and
  ``flag`` (CQR's reformulation type, as the difficulty label: ``zero``, ``locative``, ``none`` …);
* ``kb.jsonl``: an FAQ-style knowledge base with one entry per rewritten turn, the fully specified request as
  a *crowd worker* wrote it (one of CQR's ``mturk_reformulations``, chosen by a hash of the turn), no title.
  So the teacher's gold rewrite must find a paraphrase by another writer, not itself; every other turn's entry
  is a distractor, many of them from the same dialogue and sharing its slots ("the address of Chevron" against
  "the quickest route to Chevron"). A turn's gold documents are its own entry and those of turns with the same
  gold rewrite. Turns without a gold rewrite or without a crowd rewrite are left out and counted;
* ``judge_labels.jsonl``: a labelled set for the judge that no rule was tuned on: the turn's *other* crowd
  rewrites (good), its raw utterance where it differs from the gold rewrite (bad, ``unresolved``) and another
  turn's crowd rewrite (bad, ``other_turn``: fluent, wrong referent);
* ``config.yaml``: a Snakemake ``--configfile`` with this one tenant and the gold rewrites as the teacher
  (``teacher.provider: column``); it replaces config.yaml's tenant list, the rest of config.yaml applies.

    python -m scripts.make_cqr_tenant --split test --out data/cqr     # make cqr runs this
    snakemake --cores 2 --configfile data/cqr/config.yaml
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

from qrewrite.data.excel import build_excel
from qrewrite.io_utils import publish_changed, write_text_atomic, write_jsonl

SHARED = ROOT.parent / "shared" / "data" / "cqr"
COLUMNS = {"query": "utterance", "profile": None, "history": "history", "gold": "gold_doc_ids",
           "difficulty": "flag", "rewrite": "reference"}
SYSTEM_PROMPT = ("You rewrite a driver's request to an in-car assistant into one complete, standalone request: "
                 "resolve what it refers to from the conversation (place, event, day, time), keep what is asked. "
                 "Output only the rewritten request.")


def _pick(key: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % n


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def turns(dialogues: list[dict], name: str) -> tuple[list[dict], Counter]:
    """Every rewritten driver turn: {id, query, history, gold, crowd, flag}; and what was left out, by reason."""
    out, skipped = [], Counter()
    for d, dialogue in enumerate(dialogues):
        said = dialogue["dialogue"]
        for i, turn in enumerate(said):
            ref = turn["data"].get("reformulation") or turn.get("reformulation")
            if not ref:
                continue
            gold = (ref.get("reformulated_utt") or "").strip()
            crowd = [c.strip() for c in ref.get("mturk_reformulations") or [] if c and c.strip()]
            if not gold:
                skipped["no gold rewrite"] += 1
                continue
            if not crowd:
                skipped["no crowd rewrite"] += 1
                continue
            if i == 0 or said[i - 1]["turn"] != "driver":
                skipped["no driver utterance before the rewrite"] += 1
                continue
            history = " | ".join(f"{'user' if t['turn'] == 'driver' else 'assistant'}: {t['data']['utterance'].strip()}"
                                 for t in said[: i - 1])
            out.append({"id": f"cqr-{name}-{d:03d}-{i:02d}", "query": said[i - 1]["data"]["utterance"].strip(),
                        "history": history, "gold": gold, "crowd": crowd,
                        "flag": ((ref.get("flag") or "none").split(";")[0].split() or ["none"])[0]})
    return out, skipped


def build(sources: list[Path], out: Path, name: str = "cqr") -> dict:
    rows, skipped = [], Counter()
    for source in sources:  # ids name the file: cqr-dev-…, cqr-test-…
        part, left_out = turns(json.loads(source.read_text(encoding="utf-8")),
                               source.stem.split("_")[2] if source.stem.count("_") >= 2 else source.stem)
        rows += part
        skipped.update(left_out)
    docs, labels = [], []
    by_gold: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        k = _pick(r["id"], len(r["crowd"]))
        r["doc_text"], r["other_crowd"] = r["crowd"][k], r["crowd"][:k] + r["crowd"][k + 1:]
        docs.append({"id": r["id"], "text": r["doc_text"]})
        by_gold[_norm(r["gold"])].append(r["id"])
    for i, r in enumerate(rows):
        r["gold_doc_ids"] = sorted(by_gold[_norm(r["gold"])])
        ctx = {"query": r["query"], "profile": "", "history": r["history"]}
        labels += [{**ctx, "rewrite": c, "label": "good", "failure": None, "note": "crowd rewrite"}
                   for c in r["other_crowd"]]
        if _norm(r["query"]) != _norm(r["gold"]):
            labels.append({**ctx, "rewrite": r["query"], "label": "bad", "failure": "unresolved",
                           "note": "the raw utterance"})
        other = rows[(i + 1 + _pick("other" + r["id"], len(rows) - 1)) % len(rows)]
        if _norm(other["gold"]) != _norm(r["gold"]):
            labels.append({**ctx, "rewrite": other["doc_text"], "label": "bad", "failure": "other_turn",
                           "note": f"crowd rewrite of {other['id']}"})
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        stage = Path(tmp)
        source_rows = stage / "queries.jsonl"
        write_jsonl(source_rows, [{"query": r["query"], "profile": "", "history": r["history"],
                                   "gold_doc_ids": r["gold_doc_ids"], "difficulty": r["flag"], "rewrite": r["gold"]}
                                  for r in rows])
        build_excel(source_rows, stage / f"{name}.xlsx", COLUMNS)  # pinned timestamps: the same rows, the same bytes
        write_jsonl(stage / "kb.jsonl", docs)
        write_jsonl(stage / "judge_labels.jsonl", labels)
        tenant = {"name": name, "language": "en", "system_prompt": SYSTEM_PROMPT,
                  "raw_excel": str(out / f"{name}.xlsx"), "sheet": None, "columns": COLUMNS,
                  "kb": {"path": str(out / "kb.jsonl"), "name": f"{name}_kb",
                         "fields": {"doc_id": "id", "title": None, "content": "text"}},
                  "judge_labels": str(out / "judge_labels.jsonl")}  # paths under `out`, where they are published
        config = {"tenants": [tenant], "teacher": {"provider": "column"}}
        write_text_atomic(stage / "config.yaml", "# written by scripts/make_cqr_tenant.py\n"
                          + yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
        kept = publish_changed(stage, out)
    return {"sources": [str(s) for s in sources], "turns": len(rows), "docs": len(docs), "skipped": dict(skipped),
            "unchanged": kept,
            "labels": dict(Counter(f"{x['label']}:{x['failure'] or ''}".rstrip(":") for x in labels))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--split", choices=["dev", "test", "all"], default="test",
                    help="which CQR file of ../shared/data/cqr/ (default test: the documented figures; all = both)")
    ap.add_argument("--source", type=Path, help="a CQR JSON file instead of --split's (e.g. a slice of it)")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "cqr", help="output folder (default data/cqr)")
    ap.add_argument("--name", default="cqr", help="tenant name (default cqr)")
    args = ap.parse_args(argv)
    sources = [args.source] if args.source else \
        [SHARED / f"cqr_kvret_{s}_public.json" for s in (("dev", "test") if args.split == "all" else (args.split,))]
    for source in sources:
        if not source.exists():
            ap.error(f"{source} not found: the CQR files are in ../shared/data/cqr/ beside the project (README there)")
    print(json.dumps(build(sources, args.out, args.name), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
