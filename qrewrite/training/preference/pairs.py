"""Preference pairs for the rewrite student (the pref_pairs stage), from the training rows only.

Per training row with gold documents, the merged SFT student samples `pref.samples` rewrites (seeded, with the SFT
prompt), and each sample and the teacher's rewrite is scored by tie-aware Hit@1 against gold through the tenant's
RAG (`qrewrite.metrics.gold_ranking`; retrievals go through the RAG's disk cache). A text "puts gold first" when its
Hit@1 is 1: gold alone at the top, no tie. A row gives one pair (`build_pair`): chosen is the teacher's rewrite when
it puts gold first (the text SFT already taught), else the first sample that does and is not degenerate; rejected
is the sample with the lowest Hit@1 (the first of equals, in sampling order). A row where nothing puts gold first,
or where every sample already does, gives none, and the summary counts why. Validation and test rows are never read.

The same scores give KTO's unpaired examples (`build_examples`), for tenants with too few pairs for DPO: every
distinct sample that does not put gold first is undesirable, from any row, including rows where nothing does; as
many desirable texts (each row's chosen text) are drawn, the rows that also have an undesirable sample first, then
the rest in a seeded order. Equal counts keep KTO's two loss weights at 1 (within the KTO paper's recommended ratio)
and its training steps bounded by the undesirable examples, which are what the student has to learn from.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter

from ...errors import QrewriteError
from ...io_utils import read_jsonl, write_json, write_jsonl
from ...metrics import gold_ranking

log = logging.getLogger(__name__)

GOLD_FIRST = 1.0  # tie-aware Hit@1 of a text that puts gold alone at the top

# why a row gave no pair (the summary's keys)
NO_CHOSEN = "nothing_puts_gold_first"   # neither the teacher's rewrite nor any sample
NO_REJECTED = "every_sample_puts_gold_first"


def _chosen(teacher: dict, samples: list[dict]) -> tuple[dict | None, str | None]:
    """The text a row teaches: the teacher's rewrite when it puts gold first, else the first sample that does and is
    not degenerate; with its source ('teacher' | 'sample'), or (None, None)."""
    if teacher.get("text") and teacher["hit_at_1"] >= GOLD_FIRST:
        return teacher, "teacher"
    chosen = next((s for s in samples if s["text"] and s["hit_at_1"] >= GOLD_FIRST and not s.get("degenerate")), None)
    return chosen, "sample" if chosen else None


def _losers(samples: list[dict]) -> list[dict]:
    # an empty completion has nothing for a log-probability to act on: not a rejected text
    return [s for s in samples if s["text"] and s["hit_at_1"] < GOLD_FIRST]


def build_pair(teacher: dict, samples: list[dict]) -> tuple[dict | None, str | None]:
    """(pair, None) or (None, why). `teacher` and each of `samples`: {text, hit_at_1, degenerate (samples)}.
    The pair: {chosen, rejected, chosen_source ('teacher' | 'sample'), chosen_hit_at_1, rejected_hit_at_1}."""
    chosen, source = _chosen(teacher, samples)
    losers = _losers(samples)
    if chosen is None:
        return None, NO_CHOSEN
    if not losers:
        return None, NO_REJECTED
    rejected = min(losers, key=lambda s: s["hit_at_1"])  # min keeps the first of equals
    return {"chosen": chosen["text"], "rejected": rejected["text"], "chosen_source": source,
            "chosen_hit_at_1": chosen["hit_at_1"], "rejected_hit_at_1": rejected["hit_at_1"],
            "rejected_degenerate": rejected.get("degenerate")}, None


def build_examples(scored: list[tuple[dict, dict, list[dict]]], seed: int) -> list[dict]:
    """KTO's unpaired examples from scored rows [(row, teacher, samples)] (`teacher`, `samples` as build_pair's):
    [{row, text, label, source, hit_at_1}], the undesirable ones first. Every distinct loser is undesirable; as many
    desirable chosen texts are drawn, rows that also have a loser first, then the rest in a `seed`ed order."""
    bad, with_loser, rest = [], [], []
    for row, teacher, samples in scored:
        chosen, source = _chosen(teacher, samples)
        seen, losers = {chosen["text"]} if chosen else set(), []
        for s in _losers(samples):  # one example per distinct text: a repeated sample is not new evidence
            if s["text"] not in seen:
                seen.add(s["text"])
                losers.append(s)
        bad += [{"row": row, "text": s["text"], "label": False, "source": "sample", "hit_at_1": s["hit_at_1"]}
                for s in losers]
        if chosen:
            (with_loser if losers else rest).append({"row": row, "text": chosen["text"], "label": True,
                                                     "source": source, "hit_at_1": chosen["hit_at_1"]})
    random.Random(seed).shuffle(rest)
    return bad + (with_loser + rest)[:len(bad)]


def training_rows(train: str, queries: str) -> list[dict]:
    """The training split's trainable rows with gold: the SFT prompt (messages without the assistant turn), the
    teacher's rewrite, and the query row (query, profile, history) generation and degeneracy checks read."""
    by_id = {r["id"]: r for r in read_jsonl(queries)}
    rows = []
    for i, s in enumerate(read_jsonl(train), 1):
        meta = s.get("meta") or {}
        if not meta.get("trainable", True):
            continue
        q = by_id.get(meta.get("query_id"))
        if q is None:
            raise QrewriteError(f"query id {meta.get('query_id')!r} is not in {queries}", file=train, row=i,
                                hint="the split and queries.jsonl come from different runs; rerun the data stages")
        rows.append({"query_id": q["id"], "query": q["query"], "profile": q["profile"], "history": q["history"],
                     "gold_doc_ids": list(q.get("gold_doc_ids") or []),
                     "prompt": [m for m in s["messages"] if m["role"] != "assistant"],
                     "teacher": next((m["content"] for m in s["messages"] if m["role"] == "assistant"), "")})
    return rows


def sample_rewrites(model_dir: str, tenant: dict, rows: list[dict], *, k: int, temperature: float, top_p: float,
                    max_new_tokens: int, batch_size: int, seed: int, device: str, threads: int | None,
                    dtype: str | None, trim_loops: bool) -> list[list[dict]]:
    """`k` sampled rewrites per row ([{text, degenerate}] per row, in sampling order) from the merged student,
    prompted with the row's SFT prompt and cleaned as the eval cleans a rewrite (`finish_completion`). The model,
    tokenizer and dtype are the eval's (`LocalRewriter`); only the decoding differs: sampling, seeded once."""
    import torch
    from transformers import set_seed

    from ...runtime.generate import LocalRewriter, finish_completion

    rw = LocalRewriter(model_dir, tenant, max_new_tokens=max_new_tokens, device=device, threads=threads,
                       trim_loops=trim_loops, dtype=dtype, prefix_cache=False)
    tok, model = rw.tok, rw.model
    set_seed(seed)
    out: list[list[dict]] = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.inference_mode():
            gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=None,
                                 num_return_sequences=k, max_new_tokens=max_new_tokens,
                                 pad_token_id=tok.pad_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        for j, row in enumerate(batch):
            got = []
            for ids in new[j * k:(j + 1) * k]:  # generate returns each prompt's k sequences together
                raw = tok.decode(ids, skip_special_tokens=False)
                fin = finish_completion(raw, row, finished=any(int(x) in rw.eos_ids for x in ids),
                                        trim_loops=trim_loops)
                got.append({"text": fin["rewrite"], "degenerate": fin["degenerate"]})
            out.append(got)
        log.info("sampled %d/%d rows", min(i + batch_size, len(rows)), len(rows))
    return out


async def _score(rag, rows: list[dict], samples: list[list[dict]]) -> tuple[list[float], list[list[float]]]:
    """Tie-aware Hit@1 of each row's teacher rewrite and samples; one retrieval per distinct text of a row."""
    async def hit(row: dict, text: str) -> float:
        return gold_ranking(await rag.search(row["query"], text), row["gold_doc_ids"])["hit_at_1"] if text else 0.0

    async def one(row: dict, got: list[dict]) -> tuple[float, list[float]]:
        texts = list(dict.fromkeys([row["teacher"], *(s["text"] for s in got)]))
        scores = dict(zip(texts, await asyncio.gather(*(hit(row, t) for t in texts))))
        return scores[row["teacher"]], [scores[s["text"]] for s in got]

    res = await asyncio.gather(*(one(r, g) for r, g in zip(rows, samples)))
    return [t for t, _ in res], [s for _, s in res]


def score_rows(cfg: dict, tenant: dict, rows: list[dict], samples: list[list[dict]]):
    from ...rag.providers import make_rag

    async def run():
        rag = make_rag(cfg, tenant)
        try:
            return await _score(rag, rows, samples)
        finally:
            await rag.aclose()

    return asyncio.run(run())


def pref_settings(cfg: dict) -> dict:
    """The pref block's sampling settings, with the eval's generation settings where pref names none."""
    p, gen = cfg["pref"], cfg["eval"]["generation"]
    return {"k": p["samples"], "temperature": p["temperature"], "top_p": p["top_p"], "seed": p["seed"],
            "max_new_tokens": p.get("max_new_tokens") or gen["max_new_tokens"],
            "batch_size": p["sample_batch_size"], "dtype": gen.get("dtype"), "trim_loops": bool(gen.get("trim_loops"))}


def write_pairs(cfg: dict, tenant: dict, *, train: str, queries: str, model: str, out: str, examples: str,
                summary: str, threads: int | None = None) -> dict:
    """Sample, score, pair; write `out` (ms-swift's DPO rows: the SFT prompt + chosen as the assistant turn,
    `rejected_response`, and `meta`), `examples` (ms-swift's KTO rows: the SFT prompt + a text as the assistant
    turn, `label`, and `meta`) and `summary`. Returns the summary."""
    started = time.monotonic()
    every = training_rows(train, queries)
    rows = [r for r in every if r["gold_doc_ids"]]
    s = pref_settings(cfg)
    device = "cuda" if cfg["train"]["device"] == "cuda" else "cpu"
    t0 = time.monotonic()
    samples = sample_rewrites(model, tenant, rows, k=s["k"], temperature=s["temperature"], top_p=s["top_p"],
                              max_new_tokens=s["max_new_tokens"], batch_size=s["batch_size"], seed=s["seed"],
                              device=device, threads=threads, dtype=s["dtype"],
                              trim_loops=s["trim_loops"]) if rows else []
    sample_s = time.monotonic() - t0
    teacher_hits, sample_hits = score_rows(cfg, tenant, rows, samples) if rows else ([], [])
    pairs, why, scored_rows = [], Counter(), []
    for row, got, th, sh in zip(rows, samples, teacher_hits, sample_hits):
        scored = [{**g, "hit_at_1": h} for g, h in zip(got, sh)]
        scored_rows.append((row, {"text": row["teacher"], "hit_at_1": th}, scored))
        pair, reason = build_pair(*scored_rows[-1][1:])
        if pair is None:
            why[reason] += 1
            continue
        pairs.append({"messages": [*row["prompt"], {"role": "assistant", "content": pair["chosen"]}],
                      "rejected_response": pair["rejected"],
                      "meta": {"query_id": row["query_id"], **{k: v for k, v in pair.items()
                                                               if k not in ("chosen", "rejected")}}})
    kto = build_examples(scored_rows, s["seed"])
    write_jsonl(out, pairs)
    write_jsonl(examples, [{"messages": [*e["row"]["prompt"], {"role": "assistant", "content": e["text"]}],
                            "label": e["label"], "meta": {"query_id": e["row"]["query_id"], "source": e["source"],
                                                         "hit_at_1": e["hit_at_1"]}} for e in kto])
    n_samples = sum(len(g) for g in samples)
    doc = {"tenant": tenant["name"], "rows": len(every), "rows_with_gold": len(rows), "pairs": len(pairs),
           "kto_examples": {"desirable": sum(e["label"] for e in kto), "undesirable": sum(not e["label"] for e in kto)},
           "no_pair": {"no_gold": len(every) - len(rows), **{k: why.get(k, 0) for k in (NO_CHOSEN, NO_REJECTED)}},
           "chosen_source": dict(Counter(p["meta"]["chosen_source"] for p in pairs)),
           "teacher_gold_first": sum(h >= GOLD_FIRST for h in teacher_hits),
           "samples": n_samples, "sample_gold_first_share":
               round(sum(h >= GOLD_FIRST for hs in sample_hits for h in hs) / n_samples, 4) if n_samples else None,
           "degenerate_samples": sum(bool(x["degenerate"]) for g in samples for x in g),
           "settings": s, "sample_wall_s": round(sample_s, 1), "wall_s": round(time.monotonic() - started, 1)}
    write_json(summary, doc)
    return doc
