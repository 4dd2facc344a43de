#!/usr/bin/env python3
"""dur-dev, the development slice of real Chinese chit-chat (../shared/data/dur-dev/, README there), as a tenant
the way a user adds one: its Excel and KB copied into ``--out`` (git-ignored: the corpus is not shipped), and a
Snakemake ``--configfile`` naming the sheet's columns, the title-less KB, its own teacher (the people's
rewrites, ``teacher: {provider: column}``) and its SFT targets (``--sft-targets``, default ``teacher``: re-decided by
the release's validation rule over three draws of its split, docs/notes/2026-12-07-durdev-sft-targets-redecided.md),
so it also sits beside the demo tenants in one config. Run again, it leaves files whose bytes are the same untouched
(their mtimes too), so Snakemake redoes nothing.

    python -m scripts.make_durdev_tenant --out data/durdev        # make durdev-data runs this
    snakemake --cores 2 --configfile data/durdev/config.yaml       # make durdev: its whole pipeline
    # another arm on another draw of the split (docs/training.md): make durdev DURDEV_ARGS="--sft-targets
    # history" DURDEV_CONFIGFILES=studies/2026-12-07-durdev-split-seed11/split_seed11.yaml

A row's gold document is its own human rewrite; the other rewrites of the same utterance are distractors in the
KB, so the utterance alone cannot find its document: only the history can.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

from qrewrite.io_utils import publish_changed, write_text_atomic

SOURCE = ROOT.parent / "shared" / "data" / "dur-dev"
SYSTEM_PROMPT = ("你是闲聊对话的改写助手。把用户最后一句话改写成完整独立的句子：用对话历史补全其中的指代和省略，"
                 "保留原意。只输出改写后的句子。")
# the release's validation Hit@1 summed over seeds 42, 7 and 11: teacher 2.630, retrieval 2.616, history 2.614, by a
# rule written before seed 11 ran (docs/notes/2026-12-07-durdev-sft-targets-redecided.md)
SFT_TARGETS = "teacher"


def tenant(name: str, out: Path, sft_targets: str = SFT_TARGETS) -> dict:
    return {"name": name, "language": "zh", "system_prompt": SYSTEM_PROMPT,
            "raw_excel": f"{out.as_posix()}/dur-dev.xlsx", "sheet": None,
            "columns": {"query": "问题", "profile": "用户画像", "history": "历史摘要", "gold": "gold_doc_ids",
                        "rewrite": "参考改写", "difficulty": None},
            "kb": {"path": f"{out.as_posix()}/kb.jsonl", "name": f"{name}_kb",
                   "fields": {"doc_id": "id", "title": None, "content": "text"}},
            "teacher": {"provider": "column"},
            "sft_targets": sft_targets}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=SOURCE, help=f"the dur-dev folder (default {SOURCE})")
    ap.add_argument("--out", type=Path, default=Path("data/durdev"), help="output folder, relative to the project "
                    "root you run it in: the config names the files by this path (default data/durdev)")
    ap.add_argument("--name", default="durdev", help="tenant name (default durdev)")
    ap.add_argument("--sft-targets", choices=("history", "retrieval", "teacher"), default=SFT_TARGETS,
                    help="what its student learns (the tenant's sft_targets): the people's rewrites as they are "
                         "(teacher, the default: re-decided on validation over three draws of the split), them + the "
                         "history on every row (history), or per row whichever of those retrieves gold most surely "
                         "(retrieval)")
    args = ap.parse_args(argv)
    for f in ("dur-dev.xlsx", "kb.jsonl"):
        if not (args.source / f).is_file():
            print(f"make_durdev_tenant: {args.source / f} not found (the team's shared/data/dur-dev)", file=sys.stderr)
            return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        for f in ("dur-dev.xlsx", "kb.jsonl"):
            shutil.copyfile(args.source / f, Path(tmp) / f)
        config = {"tenants": [tenant(args.name, args.out, args.sft_targets)]}
        write_text_atomic(Path(tmp) / "config.yaml", "# written by scripts/make_durdev_tenant.py\n"
                          + yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
        kept = publish_changed(tmp, out)
    print(f"wrote {out}/: dur-dev.xlsx, kb.jsonl, config.yaml (tenant {args.name}"
          + (f"; unchanged: {', '.join(kept)}" if kept else "") + "); run: "
          f"snakemake --cores 2 --configfile {args.out.as_posix()}/config.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
