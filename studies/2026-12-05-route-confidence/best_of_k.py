"""Best of k by the retriever's confidence: does sampling the SFT student k times per row give `route_by_retrieval`
texts it could not reach from the greedy rewrite? Per validation row: the texts the shipped lever routes among
(the greedy rewrite, it + the history, query + history), then k samples (temperature T) and each sample + the
history; every text retrieved once. Reported: the greedy rewrite, the shipped routing, routing among those texts
plus the samples, and the ceiling of each set (any text that puts gold first: reads gold, not a rule). Validation
rows only: a set whose ceiling does not move has nothing to offer a test split.

    PYTHONPATH=. .venvs/swift/bin/python bench/best_of_k.py --project ../run --tenant durdev --k 4 --temperature 0.7
    PYTHONPATH=. .venvs/swift/bin/python bench/best_of_k.py --table

Writes bench/results/best_of_k_<tenant>.json. It only reports; nothing here is a pipeline setting.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, study_args, write_result  # noqa: E402
from route_confidence import student_texts  # noqa: E402

from qrewrite.config import load_config, tenant_config  # noqa: E402
from qrewrite.eval.candidates import eval_rows  # noqa: E402
from qrewrite.runtime.degenerate import trim_loop  # noqa: E402
from qrewrite.runtime.route import PARTS, choose, part_texts, with_history  # noqa: E402
from qrewrite.metrics import gold_ranking  # noqa: E402
from qrewrite.paths import artifact_paths  # noqa: E402
from qrewrite.prompts import rewrite_messages  # noqa: E402
from qrewrite.rag.providers import make_rag  # noqa: E402

CONFIG = "results/.config.resolved.yaml"


def sample(model_dir: str, tenant: dict, rows: list[dict], k: int, temperature: float, max_new_tokens: int,
           threads: int, seed: int) -> dict[str, list[str]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    out: dict[str, list[str]] = {}
    for i in range(0, len(rows), 8):
        batch = rows[i:i + 8]
        prompts = [tok.apply_chat_template(rewrite_messages(tenant, r), add_generation_prompt=True, tokenize=False)
                   for r in batch]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                 num_return_sequences=k, max_new_tokens=max_new_tokens,
                                 pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for j, r in enumerate(batch):
            out[r["query_id"]] = [trim_loop(t.strip()) for t in texts[j * k:(j + 1) * k]]
    return out


def route(scored: dict[str, tuple[float, float]], names: list[str]) -> float:
    """Hit@1 of the text whose top hit scores highest among `names` (route.choose: a tie keeps the earlier)."""
    return scored[choose({n: scored[n][0] for n in names})][1]


def measure(project: Path, tenant_name: str, k: int, temperature: float, threads: int, seed: int) -> dict:
    os.chdir(project)
    cfg = load_config(CONFIG)
    tenant = tenant_config(cfg, tenant_name)
    paths = artifact_paths(tenant)
    rows = [r for r in eval_rows(paths["val"], paths["queries"], None) if r["gold_doc_ids"]]
    greedy = student_texts(tenant_name)[("val", "sft")]  # the greedy rewrites the release scored
    start = time.perf_counter()
    samples = sample(paths["sft_merged"], tenant, rows, k, temperature,
                     cfg["eval"]["generation"]["max_new_tokens"], threads, seed)
    sample_s = time.perf_counter() - start
    plain, hist = [f"s{i}" for i in range(k)], [f"s{i}+h" for i in range(k)]

    async def score() -> list[dict]:
        rag = make_rag(cfg, tenant)
        out = []
        try:
            for r in rows:
                texts = part_texts(greedy.get(r["query_id"]) or "", r)
                for i, t in enumerate(samples[r["query_id"]]):
                    texts[f"s{i}"], texts[f"s{i}+h"] = t, with_history(t, r)
                scored = {}
                for name, t in texts.items():
                    hits = await rag.search(r["query"], t) if t else []
                    scored[name] = (max((float(h["reranker_score"]) for h in hits), default=0.0),
                                    gold_ranking(hits, r["gold_doc_ids"])["hit_at_1"])
                out.append(scored)
        finally:
            await rag.aclose()
        return out

    recs = asyncio.run(score())
    n = len(recs)
    sets = {"shipped": list(PARTS), "+samples": [*PARTS, *plain], "+samples+history": [*PARTS, *plain, *hist]}
    figures = {"greedy": sum(r["own"][1] for r in recs) / n, "query_history": sum(r["query_history"][1] for r in recs) / n}
    for name, names in sets.items():
        figures[f"routed {name}"] = sum(route(r, names) for r in recs) / n
        figures[f"ceiling {name}"] = sum(max(r[x][1] for x in names) for r in recs) / n
    return {"tenant": tenant_name, "project": str(project), "split": "val", "n": n, "k": k,
            "temperature": temperature, "seed": seed, "threads": threads, "sample_s": round(sample_s, 1),
            "figures": {key: round(v, 6) for key, v in figures.items()}}


def table() -> str:
    lines = []
    for f in sorted(RESULTS.glob("best_of_k_*.json")):
        doc = json.loads(f.read_text())
        keys = list(doc["figures"])
        if not lines:
            lines = ["| tenant (val rows) | k, T | " + " | ".join(keys) + " | sampling |",
                     "|---|---|" + "---|" * (len(keys) + 1)]
        lines.append(f"| {doc['tenant']} ({doc['n']}) | {doc['k']}, {doc['temperature']} | "
                     + " | ".join(f"{doc['figures'][x]:.3f}" for x in keys) + f" | {doc['sample_s']} s |")
    return "\n".join(lines)


def main() -> None:
    def add(ap):
        ap.add_argument("--k", type=int, default=4, help="samples per row (default 4)")
        ap.add_argument("--temperature", type=float, default=0.7)
        ap.add_argument("--threads", type=int, default=2)
        ap.add_argument("--seed", type=int, default=0)

    args = study_args(__doc__, add=add, table=table)
    if args:
        write_result(f"best_of_k_{args.tenant}", measure(args.project.resolve(), args.tenant, args.k,
                                                         args.temperature, args.threads, args.seed))
        print(table())


if __name__ == "__main__":
    main()
