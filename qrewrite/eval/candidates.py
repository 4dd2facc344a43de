"""One candidate's rewrites of the eval rows (`results/T/eval/<candidate>.jsonl`).

Kinds (config `eval.candidates[].kind`):

* `raw`: the query itself, no rewrite (latency 0, cost 0);
* `query_history`: the query with the history summary pasted after it, no model (latency 0, cost 0):
  what a user tries before training anything;
* `teacher`: the data half's teacher rows (results/T/teacher.jsonl): recorded rewrite, latency and cost;
* `openai`: any OpenAI-compatible API, called now and cached under `eval.cache_dir` like the teacher
  (same prompt), cost from `teacher.prices` (a model missing there costs null: unknown, not 0);
* `model`: a local HF model folder, greedy decoding (`qrewrite.runtime.generate`), cost charged at
  `eval.gpu_hour_usd` per hour of generation time.

A failed call is a row with `status: error`, never the query passed off as a rewrite; `qrewrite eval`
scores it as an empty rewrite (nothing retrieved, judge 1) and counts it. An API candidate none of whose rows
got a rewrite stops with the reason (exit 2) instead of writing them.
"""

from __future__ import annotations

import asyncio

from ..errors import QrewriteError
from ..io_utils import read_jsonl
from ..paths import artifact_paths
from ..runtime.release_file import load_release
from ..runtime.route import client_rows
from ..runtime.rules import rule_text

# Kinds that eval_generate rewrites (in the swift env): a local model, and the release, which is a model or a
# rule (models/T/release/release.json says which).
MODEL_KINDS = ("model", "release")
# the students a release can hand over: release.candidates name → the artifact key of its model folder
STUDENTS = {"sft": "sft_merged", "pref": "pref_merged", "rl": "rl_model"}


def rules_only(cfg: dict, tenant: str) -> bool:
    """Whether tenant `tenant` (a name; a placeholder is none) trains no student (tenants[].student: never)."""
    from ..config import has_student

    t = next((t for t in cfg["tenants"] if t["name"] == tenant), None)
    return t is not None and not has_student(t)


def tenant_candidates(cfg: dict, tenant: str) -> list[dict]:
    """The eval candidates of tenant `tenant`: all, less the local models for a rules-only tenant."""
    rules = rules_only(cfg, tenant)
    pref_off = not (cfg.get("pref") or {}).get("enabled")  # no preference model to score without its stage
    return [c for c in cfg["eval"]["candidates"] if not (rules and c["kind"] == "model")
            and not (pref_off and c["kind"] == "model" and c.get("artifact") == "pref_merged")]


def eval_rows(test_path: str, queries_path: str, max_rows: int | None) -> list[dict]:
    """The test split's queries in file order (first `max_rows`), joined with their queries.jsonl row."""
    queries = {row["id"]: row for row in read_jsonl(queries_path)}
    rows = []
    for i, s in enumerate(read_jsonl(test_path), 1):
        meta = s.get("meta") or {}
        query_row = queries.get(meta.get("query_id"))
        if query_row is None:
            raise QrewriteError(f"query id {meta.get('query_id')!r} is not in {queries_path}", file=test_path, row=i,
                                hint="the split and queries.jsonl come from different runs; rerun the data stages")
        rows.append({"query_id": query_row["id"], "raw_row": query_row["row"], "query": query_row["query"],
                     "profile": query_row["profile"],
                     "history": query_row["history"], "gold_doc_ids": list(query_row.get("gold_doc_ids") or [])})
        if max_rows is not None and len(rows) >= max_rows:
            break
    if not rows:
        raise QrewriteError("the eval split has no rows", file=test_path,
                            hint="the tenant needs more queries passing the filters, or lower thresholds.top1")
    return rows


def extra_rows(tenant: dict) -> list[dict]:
    """The rows every candidate rewrites besides the split: the gold set (`set: gold`) and the eval half of the
    red-team set (`set: red_team`, with its attack and checks); [] for a tenant with neither."""
    from ..data.gold_set import tenant_gold_set
    from ..data.red_team import tenant_red_team

    gold = [{**r, "set": "gold"} for r in tenant_gold_set(tenant)]
    red = [{"query_id": r["query_id"], "raw_row": None, "query": r["query"], "profile": r["profile"],
            "history": r["history"], "gold_doc_ids": [], "set": "red_team", "attack": r["attack"],
            "expect": r["expect"]} for r in tenant_red_team(tenant, use="eval")]
    return gold + red


def candidate_spec(cfg: dict, name: str) -> dict:
    for c in cfg["eval"]["candidates"]:
        if c["name"] == name:
            return c
    raise QrewriteError(f"no eval candidate named {name!r}",
                        hint=f"candidates in config: {[c['name'] for c in cfg['eval']['candidates']]}")


def model_path(spec: dict, tenant: dict) -> str:
    """A model candidate's folder: an artifact key (base_model, sft_merged, pref_merged, rl_model) or a literal path; the
    release's is models/T/release."""
    if spec["kind"] == "release":
        return artifact_paths(tenant)["release"]
    if spec.get("artifact"):
        paths = artifact_paths(tenant)
        if spec["artifact"] not in paths:
            raise QrewriteError(f"eval candidate {spec['name']}: unknown artifact {spec['artifact']!r}",
                                hint="use base_model, sft_merged, pref_merged or rl_model, or give `path:`")
        return paths[spec["artifact"]]
    return spec["path"].format(tenant=tenant["name"])


def _base(spec: dict, row: dict) -> dict:
    return {"query_id": row["query_id"], "set": row.get("set", "test"), "candidate": spec["name"], "kind": spec["kind"]}


def raw_rewrites(spec: dict, rows: list[dict]) -> list[dict]:
    return [{**_base(spec, r), "status": "ok", "reason": None, "rewrite": r["query"], "model": None,
             "latency_s": 0.0, "compute_s": 0.0, "cost_usd": 0.0, "usage": None} for r in rows]


def query_history_rewrites(spec: dict, rows: list[dict]) -> list[dict]:
    """The baseline a user tries first: the query with the history summary pasted after it, no model."""
    return [{**_base(spec, r), "status": "ok", "reason": None,
             "rewrite": rule_text("query_history", r), "model": None,
             "latency_s": 0.0, "compute_s": 0.0, "cost_usd": 0.0, "usage": None} for r in rows]


# The rules: rewrites without a model (what a release can be when no trained model beats them on validation).
RULE_REWRITES = {"raw": raw_rewrites, "query_history": query_history_rewrites}


def teacher_rewrites(spec: dict, rows: list[dict], teacher_path: str, cfg: dict | None = None,
                     tenant: dict | None = None) -> list[dict]:
    """The recorded teacher rows; gold and red-team rows the data half never saw (a red-team query, a gold row
    outside the Excel) are rewritten now by the same teacher stage code (cached like the data half's calls),
    which needs `cfg` and `tenant`. A split row missing from teacher.jsonl is an error."""
    teacher = {t["id"]: t for t in read_jsonl(teacher_path)}
    unseen = [r for r in rows if r["query_id"] not in teacher and r.get("set") in ("gold", "red_team")]
    if unseen and cfg is not None:
        from ..teacher.stage import run_teacher

        live, _ = asyncio.run(run_teacher(cfg, tenant, [{"id": r["query_id"], "query": r["query"],
                                                          "profile": r["profile"], "history": r["history"]}
                                                         for r in unseen], progress=False))
        teacher.update({t["id"]: t for t in live})
    out = []
    for r in rows:
        t = teacher.get(r["query_id"])
        if t is None:
            raise QrewriteError(f"no teacher row for query {r['query_id']}", file=teacher_path,
                                hint="teacher.jsonl and the split come from different runs; rerun the data stages")
        ok = t.get("status") == "ok"
        out.append({**_base(spec, r), "status": t.get("status"), "reason": t.get("reason"),
                    "rewrite": t.get("rewrite") if ok else None, "model": f"{t.get('provider')}/{t.get('model')}",
                    "latency_s": t.get("latency_s"), "compute_s": None, "cost_usd": t.get("cost_usd"),
                    "usage": t.get("usage"), "call_key": t.get("call_key")})
    return out


async def _api_rewrites(spec: dict, cfg: dict, tenant: dict, rows: list[dict]) -> list[dict]:
    from ..prompts import rewrite_messages
    from ..cache import DiskCache, call_key
    from ..openai_chat import CallFailed, nothing_usable
    from ..teacher.openai_teacher import OpenAITeacher

    teacher = OpenAITeacher(spec["openai"], cfg["teacher"]["prices"])
    cache = DiskCache(cfg["eval"]["cache_dir"])
    sem = asyncio.Semaphore(spec.get("concurrency", 8))

    async def one(r: dict) -> dict:
        messages = rewrite_messages(tenant, r)
        key = call_key("openai", teacher.model, messages, teacher.params)
        base = {**_base(spec, r), "model": f"openai/{teacher.model}", "call_key": key, "compute_s": None}
        hit = cache.get(key)
        if hit is None:
            async with sem:
                try:
                    hit = await teacher.rewrite(messages)
                except CallFailed as exc:
                    return {**base, "status": "error", "reason": exc.reason, "rewrite": None, "latency_s": None,
                            "cost_usd": None, "usage": None}
            hit["cost_usd"] = teacher.cost(hit["usage"])
            cache.put(key, hit)  # the recorded latency travels with the cached reply
        return {**base, "status": "ok", "reason": None, "rewrite": hit["rewrite"], "latency_s": hit["latency_s"],
                "cost_usd": hit.get("cost_usd"), "usage": hit["usage"]}

    try:
        out = list(await asyncio.gather(*(one(r) for r in rows)))
    finally:
        await teacher.aclose()
    error = nothing_usable(teacher, out, f"eval candidate {spec['name']}")
    if error is not None:
        raise error
    return out


def api_rewrites(spec: dict, cfg: dict, tenant: dict, rows: list[dict]) -> list[dict]:
    return asyncio.run(_api_rewrites(spec, cfg, tenant, rows))


def model_rewrites(spec: dict, cfg: dict, tenant: dict, rows: list[dict], model_dir: str,
                   threads: int | None) -> tuple[list[dict], dict]:
    from ..runtime.generate import generate_rewrites, generation_kwargs

    gen = {**cfg["eval"]["generation"], **(spec.get("generation") or {})}
    device = gen["device"] or cfg["train"]["device"]
    results, info = generate_rewrites(model_dir, tenant, rows, **generation_kwargs(
        gen, threads=threads or gen["threads"], device=device, latency_sample=gen["latency_sample"]))
    price = spec.get("gpu_hour_usd", cfg["eval"]["gpu_hour_usd"])
    sent = client_rows(gen, cfg, tenant, rows, [g["rewrite"] for g in results])
    out = []
    for r, g, fields in zip(rows, results, sent):
        out.append({**_base(spec, r), "status": "ok", "reason": None, **fields,
                    "raw_completion": g["raw_completion"], "finished": g["finished"], "loop_trimmed": g["loop_trimmed"],
                    "degenerate": g["degenerate"],
                    "model": model_dir,
                    "latency_s": g["latency_s"],
                    "compute_s": g["compute_s"], "cost_usd": round(price * g["compute_s"] / 3600.0, 10),
                    "usage": {"completion_tokens": g["new_tokens"]}})
    return out, {**info, "gpu_hour_usd": price}


# the decoding settings that make two greedy generations of the same model on the same rows the same
# (append_history and route_by_retrieval only choose what is sent after the generation: release_rewrites applies
# them to reused rows)
DECODING_KEYS = ("max_new_tokens", "batch_size", "repetition_penalty", "no_repeat_ngram_size", "copy_bias",
                 "trim_loops", "dtype")


def generation_key(decoding: dict) -> tuple:
    """What makes two greedy generations of one model on the same rows the same (DECODING_KEYS' values)."""
    return tuple(decoding.get(k) for k in DECODING_KEYS)


def release_rewrites(spec: dict, cfg: dict, tenant: dict, rows: list[dict], folder: str,
                     threads: int | None) -> list[dict]:
    """The release's rewrites, by the runtime the gateway (`qrewrite serve`) answers with
    (`qrewrite.runtime.release`): its rule's, or its model's through the serving engine, one row at a time (each
    finds the engine idle and is generated alone, as a request at concurrency 1 is), then sent as the release's
    decoding sends it. Each row names what was released (`released`) and the engine. The deploy check asks the
    gateway for the same rows and compares text for text."""
    from ..runtime.release import load_served

    released = load_release(folder)["released"]
    if released["kind"] == "rule":
        from ..runtime.rules import load_rule

        text = load_rule(released["rule"], folder)  # the gateway's rule, from the release folder alone
        return [{**_base(spec, r), "status": "ok", "reason": None, "rewrite": text(r), "model": None,
                 "latency_s": 0.0, "compute_s": 0.0, "cost_usd": 0.0, "usage": None, "released": released["name"]}
                for r in rows]
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    served = load_served(cfg, tenant, folder, check=False, for_eval=True)
    price = spec.get("gpu_hour_usd", cfg["eval"]["gpu_hour_usd"])

    async def run() -> list[dict]:
        try:
            return [await served.answer(r, timeout_s=86400.0, on_backend_error="raise", on_rag_error="raise")
                    for r in rows]
        finally:
            await served.aclose()

    answers = asyncio.run(run())
    info = {"device": served.info.get("device"), "threads": torch.get_num_threads(), "batch_size": 1,
            "engine": served.info.get("engine"), "dtype": served.info.get("dtype"),
            "max_new_tokens": served.decoding["max_new_tokens"], "torch": torch.__version__, "gpu_hour_usd": price}
    out = []
    for r, a in zip(rows, answers):
        g = a["generation"]
        sent = {k: a[k] for k in ("rewrite", "model_rewrite", "routed_to", "route_top1", "fallback")
                if a.get(k) is not None}
        out.append({**_base(spec, r), "status": "ok", "reason": None, **sent,
                    "raw_completion": g["raw_completion"], "finished": g["finished"],
                    "loop_trimmed": g["loop_trimmed"], "degenerate": g["degenerate"], "model": folder,
                    "latency_s": g["latency_s"], "compute_s": g["compute_s"],
                    "cost_usd": round(price * g["compute_s"] / 3600.0, 10),
                    "usage": {"completion_tokens": g["new_tokens"]}, "generation": info,
                    "released": released["name"]})
    return out


def deploy_candidate(cfg: dict) -> dict:
    """The eval candidate the deploy check compares with: the release (deploy.candidate)."""
    spec = candidate_spec(cfg, cfg["deploy"]["candidate"])
    if spec["kind"] != "release":
        raise QrewriteError(f"deploy.candidate {spec['name']!r} is an eval candidate of kind {spec['kind']}, not the "
                            "release", hint="the deploy check serves the release through the gateway: keep "
                                            "{name: release, kind: release} in eval.candidates")
    return spec
