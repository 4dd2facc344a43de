"""Each tenant's release restated under the half-row margin, from the validation figures its last run recorded.

The tenant files (bench/results/tenant_<name>_<commit>.json, copies of the runs' own release.json figures) hold
every candidate's validation tie-aware Hit@1 and the rows scored. This applies qrewrite.release.select.choose with
release.margin_rows 0.5 to them, beside the release those runs made under the old rule (any gain, margin 0). The
teacher candidate is not in them (it did not exist): where the tenant's teacher is a column of people's rewrites it
is left out anyway; the demo tenants' restatement with it comes from their new run, not from here.

    .venv/bin/python -m studies.2026-12-07-release-margin.restate   (from the repo root)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.common import machine
from qrewrite.io_utils import write_json
from qrewrite.release.select import choose

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "bench" / "results"
TENANTS = {"fivedoctors": "tenant_fivedoctors_f4f0352.json", "chengla": "tenant_chengla_f4f0352.json",
           "cqr": "tenant_cqr_afb97c5.json", "durdev": "tenant_durdev_feb4cbc.json", "sights": "tenant_sights_afb97c5.json"}


def restate(doc: dict, margin_rows: float) -> dict:
    rel = doc["release"]
    n = rel["val_hit_at_1"]["n"] if isinstance(rel.get("val_hit_at_1"), dict) else doc["with_gold"]["val"]
    figures = [{"name": k, "mean": v, "n": n} for k, v in rel["val_candidates"].items()]
    d = choose(figures, margin_rows)
    return {"n_val_with_gold": n, "old": rel["name"], "new": d["name"], "changed": d["name"] != rel["name"],
            "why": d["why"], "val_candidates": rel["val_candidates"], "teacher": doc["teacher"]["provider"]}


def main() -> None:
    out = {name: {"source": f"bench/results/{f}", **restate(json.loads((RESULTS / f).read_text()), 0.5)}
           for name, f in TENANTS.items()}
    write_json(HERE / "restate.json", {"bench": "release_margin_restate", "machine": machine(),
                                       "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "margin_rows": 0.5,
                                       "tenants": out})
    for name, r in out.items():
        print(f"{name}: {r['old']} -> {r['new']} ({r['why']})")


if __name__ == "__main__":
    main()
