"""Retrieval-guided self-distillation on a tenant's own split (qrewrite/training/self_distill.py): the
pipeline's SFT student samples k rewrites of every training question, the tenant's retriever keeps those that put a
gold document first, and a LoRA SFT from the SFT student trains one more pass on the teacher's rows plus the kept
samples. The refined student is then chosen or not on validation against the SFT student and query + history (each
with and without the history pasted after the rewrite, the release's levers); its test figures are measured after
the choice, for the record. All settings are fixed before the run (below, and --k / --temperature / --epochs).

    # in a project where the tenant's pipeline has run (here dur-dev, `make durdev`), in the swift env:
    PYTHONPATH=. .venvs/swift/bin/python bench/self_distill.py --project . --tenant durdev

Work files go to <project>/results/<tenant>/self_distill/ (samples.json, the training file, the SFT run, the
merged model): a rerun reuses the samples and resumes the SFT. Writes bench/results/self_distill_<tenant>.json;
`--table` prints every result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, study_args, write_result  # noqa: E402

from qrewrite.config import merged_config_files, tenant_config, validate_config  # noqa: E402
from qrewrite import stats  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.route import with_history  # noqa: E402
from qrewrite.eval.hits import hit_at_1  # noqa: E402
from qrewrite.io_utils import read_json, read_jsonl, write_json, write_jsonl  # noqa: E402
from qrewrite.paths import artifact_paths  # noqa: E402
from qrewrite.release.score import rewrites  # noqa: E402
import self_distill_lib as sd  # noqa: E402  (the module lived in qrewrite/training/ at the commit this ran)


def sampled_hits(cfg: dict, tenant: dict, rows: list[dict], samples: dict[str, list[str]]) -> dict[str, dict]:
    """query id → {sampled text: tie-aware Hit@1}, one retrieval per distinct text."""
    k = max(len(v) for v in samples.values())
    texts = {f"s{i}": {r["query_id"]: samples[r["query_id"]][i] for r in rows} for i in range(k)}
    per = hit_at_1(cfg, tenant, rows, texts)
    return {r["query_id"]: {texts[f"s{i}"][r["query_id"]].strip(): per[f"s{i}"][n] for i in range(k)}
            for n, r in enumerate(rows)}


def candidates(cfg: dict) -> list[dict]:
    """query + history, then each student plain and with the history pasted after its rewrite (greedy, the eval's
    generation): what the release would weigh, the refined student among them."""
    out = [{"name": "query_history", "kind": "query_history", "artifact": None, "decoding": None}]
    for name in ("sft", "refined"):
        for lever in ({}, {"append_history": True}):
            out.append({"name": name + ("+history" if lever else ""), "kind": "model", "artifact": name,
                        "decoding": {**cfg["eval"]["generation"], **lever}})
    return out


def score_split(cfg, tenant, rows, models, threads) -> tuple[dict, dict]:
    cands, generated, texts = candidates(cfg), {}, {}
    for c in cands:
        texts[c["name"]] = rewrites(c, cfg, tenant, rows, models.get(c["artifact"]), threads, generated)
    per_row = hit_at_1(cfg, tenant, rows, texts)
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    figs = {c["name"]: stats.mean_ci(per_row[c["name"]], **bkw) for c in cands}
    vs = {f"{a}_vs_{b}": stats.paired(per_row[a], per_row[b], **bkw)
          for a, b in (("refined", "sft"), ("refined", "query_history"), ("refined+history", "sft+history"),
                       ("refined+history", "query_history"), ("sft", "query_history"))}
    return figs, vs


def choose(figs: dict) -> str:
    """The release's rule on validation: the best Hit@1, ties to the cheaper (the list's order)."""
    order = ["query_history", "sft", "sft+history", "refined", "refined+history"]
    best = max(figs[n]["mean"] for n in order)
    return next(n for n in order if figs[n]["mean"] == best)


def measure(project: Path, tenant_name: str, configs: list[str], k: int, temperature: float, epochs: float,
            per_row: int, threads: int) -> dict:
    os.chdir(project)
    cfg = validate_config(merged_config_files(configs), source=" + ".join(configs))
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    work = project / "results" / tenant_name / "self_distill"  # git-ignored, beside the run it reads
    work.mkdir(parents=True, exist_ok=True)
    timings = {}
    train = read_jsonl(paths["train"])
    rows = [r for r in eval_rows(paths["train"], paths["queries"], None) if r["gold_doc_ids"]]
    teacher = {s["meta"]["query_id"]: s["messages"][-1]["content"] for s in train}

    # 1. sample (kept on disk: a rerun samples nothing again)
    sample_file = work / "samples.json"
    settings = {"k": k, "temperature": temperature, "top_p": 1.0, "max_new_tokens":
                cfg["eval"]["generation"]["max_new_tokens"], "seed": 0, "model": paths["sft_merged"]}
    cached = read_json(sample_file) if sample_file.is_file() else None
    if cached and cached["settings"] == settings:
        samples, timings["sample_s"] = cached["samples"], cached["wall_s"]
    else:
        start = time.monotonic()
        samples = sd.sample_rewrites(paths["sft_merged"], tenant, rows, k=k, temperature=temperature, top_p=1.0,
                                     max_new_tokens=settings["max_new_tokens"], batch_size=8, threads=threads,
                                     seed=0)
        timings["sample_s"] = round(time.monotonic() - start, 1)
        write_json(sample_file, {"settings": settings, "samples": samples, "wall_s": timings["sample_s"]})

    # 2. keep what retrieval rewards
    start = time.monotonic()
    hits = sampled_hits(cfg, tenant, rows, samples)
    teacher_hit = dict(zip([r["query_id"] for r in rows],
                           hit_at_1(cfg, tenant, rows, {"t": {r["query_id"]: teacher[r["query_id"]] for r in rows}})["t"]))
    kept = sd.keep(teacher, samples, hits, per_row)
    timings["score_s"] = round(time.monotonic() - start, 1)
    n_samples = sum(len(v) for v in samples.values())
    gold_first = sum(1 for q in hits for t, h in hits[q].items() if (h or 0) >= 1.0)
    sample_stats = {
        "rows": len(rows), "samples": n_samples,
        "distinct_from_teacher": sum(1 for r in rows for t in samples[r["query_id"]]
                                     if t.strip() != teacher[r["query_id"]].strip()),
        "rows_any_sample_gold_first": sum(1 for q in hits if any((h or 0) >= 1.0 for h in hits[q].values())),
        "distinct_texts_gold_first": gold_first,
        "teacher_gold_first_rows": sum(1 for h in teacher_hit.values() if (h or 0) >= 1.0),
        "rows_kept": len(kept), "samples_kept": sum(len(v) for v in kept.values()),
        "rows_kept_where_teacher_missed": sum(1 for q in kept if (teacher_hit.get(q) or 0) < 1.0)}
    train_file = work / "train.jsonl"
    write_jsonl(train_file, sd.distilled_rows(train, kept))

    # 3. one more SFT pass from the SFT student on teacher rows + kept samples, then merge
    from qrewrite.training.swift.merge import merge_lora
    from qrewrite.training.sft.train import run_sft

    scfg = json.loads(json.dumps(cfg))
    scfg["train"]["sft"]["num_train_epochs"] = epochs
    merged = work / "merged"
    if not (merged / "config.json").is_file():
        start = time.monotonic()
        st = run_sft(scfg, base=paths["sft_merged"], train=str(train_file), val=paths["val"], out=str(work / "adapter"),
                     run_dir=str(work / "run"), tb_dir=str(work / "tb"), log_file=str(work / "sft.log"),
                     threads=threads)
        write_json(work / "sft_stats.json", st)
        merge_lora(scfg, base=paths["sft_merged"], adapter=str(work / "adapter"), out=str(merged), threads=threads)
        timings["sft_s"] = round(time.monotonic() - start, 1)
    st = read_json(work / "sft_stats.json")
    timings.setdefault("sft_s", st["wall_s"])

    # 4. choose on validation; then test, for the record
    models = {"sft": paths["sft_merged"], "refined": str(merged)}
    out = {}
    for split in ("val", "test"):
        srows = [r for r in eval_rows(paths[split], paths["queries"], None) if r["gold_doc_ids"]]
        figs, vs = score_split(cfg, tenant, srows, models, threads)
        out[split] = {"n": len(srows), "hit_at_1": figs, "comparisons": vs}
    chosen = choose(out["val"]["hit_at_1"])
    return {"tenant": tenant_name, "project": str(project), "settings": {**settings, "per_row": per_row,
            "epochs": epochs, "base": "the SFT student (sft_merged)", "threads": threads},
            "train_rows": len(train), "sample_stats": sample_stats, "timings_s": timings,
            "refine_sft": {k: st.get(k) for k in ("best_checkpoint", "first_eval_loss", "best_eval_loss", "steps",
                                                    "stopped", "schedule")},
            "chosen_on_validation": chosen, "val": out["val"], "test": out["test"]}


def fmt(m: dict) -> str:
    return f"{m['mean']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"


def table() -> str:
    lines = ["| tenant | candidate | validation | test | chosen on validation |", "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("self_distill_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for name, v in doc["val"]["hit_at_1"].items():
            lines.append(f"| {doc['tenant']} | {name} | {fmt(v)} | {fmt(doc['test']['hit_at_1'][name])} | "
                         f"{'**yes**' if name == doc['chosen_on_validation'] else ''} |")
        s, t = doc["sample_stats"], doc["timings_s"]
        lines.append(f"| {doc['tenant']} | cost | sample {t['sample_s']:.0f} s, score {t['score_s']:.0f} s, "
                     f"SFT + merge {t['sft_s']:.0f} s for {doc['train_rows']} training rows | kept "
                     f"{s['samples_kept']} of {s['samples']} samples ({s['rows_kept']} rows) | |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--config", nargs="+", default=["results/.config.resolved.yaml"],
                        help="the config files the run used, merged in order (relative to --project)")
        ap.add_argument("--k", type=int, default=4, help="samples per training question (default 4)")
        ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
        ap.add_argument("--per-row", type=int, default=1, help="kept samples per question at most (default 1)")
        ap.add_argument("--epochs", type=float, default=1.0, help="epochs of the refining SFT (default 1)")
        ap.add_argument("--threads", type=int, default=2)

    args = study_args(__doc__, add=add, table=table)
    if args:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        write_result(f"self_distill_{args.tenant}", measure(args.project.resolve(), args.tenant, args.config,
                                                            args.k, args.temperature, args.epochs, args.per_row,
                                                            args.threads))
        print(table())


if __name__ == "__main__":
    main()
