"""The learning run's eval, on the device: the project's own scoring of the RL model beside its SFT parent.

Validation decides, test reports (the release protocol): the release candidates (release.candidates x
release.decoding: query + history, SFT, RL, each student with its levers) rewrite the validation rows and
`release.select.choose` picks one; then on the test rows query + history, the teacher (its recorded rewrites),
SFT, RL and the chosen release are scored with tie-aware Hit@1 through the tenant's RAG (`eval.hits`), with
bootstrap intervals and paired differences (`qrewrite.stats`). Where the CPU eval's SFT rewrites travelled with the kit
(results/T/eval/sft.jsonl), the SFT student also rewrites the test rows in float32 here and both are scored the same
way: the device's figure against the CPU's, row by row.

  python -m tools.gpukit.learn_eval --config C --data D --model sft=DIR [--model rl=DIR] --out E.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from qrewrite import stats
from qrewrite.errors import QrewriteError
from qrewrite.eval.candidates import eval_rows, teacher_rewrites
from qrewrite.io_utils import read_jsonl, write_json
from qrewrite.release.score import is_plain, release_candidates, rewrites, score
from qrewrite.release.select import choose

log = logging.getLogger(__name__)

# the kit's data folder (tools.gpukit.learn_kit writes it)
DATA = {"val": "sft_val.jsonl", "test": "sft_test.jsonl", "queries": "queries.jsonl", "teacher": "teacher.jsonl",
        "cpu_sft": "cpu_eval_sft.jsonl"}
COMPARE = (("rl", "sft"), ("rl", "query_history"), ("rl", "teacher"), ("sft", "query_history"),
           ("release", "query_history"), ("release", "teacher"), ("release", "sft"))


def _rows(data: Path, split: str, max_rows: int | None) -> list[dict]:
    return eval_rows(str(data / DATA[split]), str(data / DATA["queries"]), max_rows)


def load_memo(path: Path | None) -> dict:
    """split -> `release.score.rewrites`' memo ((model folder, generation key) -> texts), from a JSON file."""
    if not path or not path.is_file():
        return {"val": {}, "test": {}}
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {split: {(k["model"], tuple(k["key"])): k["texts"] for k in rows} for split, rows in raw.items()}


def save_memo(path: Path | None, memo: dict) -> None:
    if path:
        write_json(path, {split: [{"model": m, "key": list(k), "texts": t} for (m, k), t in rows.items()]
                          for split, rows in memo.items()})


def evaluate(cfg: dict, tenant: dict, data: Path, models: dict[str, str], *, max_rows: int | None = None,
             threads: int | None = None, memo_path: Path | None = None) -> dict:
    """{validation: {figures, release}, test: {figures, compare}, agreement}; `models`: sft / rl -> folder.
    memo_path: the generations of an earlier call (the SFT student's, made while RL trained) are read from it and
    this call's are added, so a model's rows are generated once."""
    if "sft" not in models:
        raise QrewriteError("the learning run's eval needs the SFT student (--model sft=DIR)")
    t0 = time.monotonic()
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    arts = {"sft_merged": models.get("sft"), "rl_model": models.get("rl")}
    cands, _ = release_candidates(cfg, tenant)  # a candidate left out (a paid teacher) is the release stage's too
    cands = [c for c in cands if c["artifact"] is None or arts.get(c["artifact"])]
    memo = load_memo(memo_path)
    val = _rows(data, "val", max_rows)
    figures, _ = score(cfg, tenant, val, cands, arts, threads, memo["val"])
    pick = choose(figures, cfg["release"]["margin_rows"])
    released = cands[pick["index"]]
    t_val = time.monotonic()

    test = _rows(data, "test", max_rows)
    generated = memo["test"]
    # the eval's own readers: a test row without a teacher row is an error, a failed teacher call an empty rewrite
    teacher = teacher_rewrites({"name": "teacher", "kind": "teacher"}, test, str(data / DATA["teacher"]))
    texts = {"query_history": rewrites({"name": "query_history", "kind": "query_history"}, cfg, tenant, test, None,
                                       threads),
             "teacher": {r["query_id"]: r["rewrite"] or "" for r in teacher}}
    plain = {c["source"]: c for c in cands if is_plain(c)}
    for name, cand in plain.items():
        texts[name] = rewrites(cand, cfg, tenant, test, arts[cand["artifact"]], threads, generated)
    texts["release"] = rewrites(released, cfg, tenant, test, arts.get(released["artifact"]), threads, generated)
    save_memo(memo_path, memo)
    cpu = data / DATA["cpu_sft"]
    if cpu.is_file():
        from .student import rewrite

        cpu_rows = {r["query_id"]: r.get("rewrite") or "" for r in read_jsonl(cpu)}
        texts["sft_cpu_eval"] = {r["query_id"]: cpu_rows.get(r["query_id"], "") for r in test}
        texts["sft_float32"] = rewrite(models["sft"], cfg, tenant, test,
                                       device=cfg["eval"]["generation"]["device"], dtype="float32")
    from qrewrite.eval.hits import hit_at_1

    per_row = hit_at_1(cfg, tenant, test, texts)
    test_figs = {n: stats.mean_ci(v, **bkw) for n, v in per_row.items()}
    comp = {f"{a}_vs_{b}": stats.paired(per_row[a], per_row[b], **bkw)
            for a, b in COMPARE if a in per_row and b in per_row}
    out = {"tenant": tenant["name"], "rows": {"val": len(val), "test": len(test)}, "max_rows": max_rows,
           "device": cfg["eval"]["generation"]["device"],
           "validation": {"figures": figures, "release": {**pick, "candidate": released}},
           "test": {"figures": test_figs, "compare": comp}, "seconds": {"validation": round(t_val - t0, 1),
                                                                          "test": round(time.monotonic() - t_val, 1)}}
    if "sft_cpu_eval" in texts:
        same = sum(texts["sft_cpu_eval"][q] == texts["sft_float32"][q] for q in texts["sft_cpu_eval"])
        out["agreement"] = {"rows": len(test), "same_rewrite": same,
                            "cpu_eval_hit_at_1": test_figs["sft_cpu_eval"]["mean"],
                            "device_float32_hit_at_1": test_figs["sft_float32"]["mean"],
                            "device_bfloat16_hit_at_1": test_figs["sft"]["mean"],
                            "float32_vs_cpu": stats.paired(per_row["sft_float32"], per_row["sft_cpu_eval"], **bkw)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.learn_eval", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the run's config (one tenant; eval.generation.device set)")
    ap.add_argument("--data", required=True, help="the kit's data folder (sft_val/sft_test/queries/teacher JSONL)")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=DIR", help="sft=DIR, rl=DIR")
    ap.add_argument("--max-rows", type=int, help="first N rows of each split (the CPU rehearsal)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--memo", help="JSON of generations kept between calls (read, then extended)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from .student import tenant_from

    try:
        models = dict(m.split("=", 1) for m in args.model)
        bad = sorted(set(models) - {"sft", "rl"})
        if bad:
            raise QrewriteError(f"--model names {bad}: only sft and rl")
        missing = [d for d in models.values() if not (Path(d) / "config.json").is_file()]
        if missing:
            raise QrewriteError(f"no model folder at {missing}", hint="the student / RL phase did not finish")
        cfg, tenant = tenant_from(args.config)
        out = evaluate(cfg, tenant, Path(args.data), models, max_rows=args.max_rows, threads=args.threads,
                       memo_path=Path(args.memo) if args.memo else None)
    except QrewriteError as e:
        print(f"learn_eval: error: {e}", file=sys.stderr)
        return 2
    write_json(args.out, out)
    for n, f in out["test"]["figures"].items():
        print(f"test Hit@1 {n:16s} {f['mean']} [{f['ci_low']}, {f['ci_high']}] n={f['n']}")
    for n, c in out["test"]["compare"].items():
        print(f"  {n:28s} {c['diff']} [{c['ci_low']}, {c['ci_high']}] p={c['p_value']}")
    print(f"released on validation: {out['validation']['release']['name']} ({out['validation']['release']['why']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
