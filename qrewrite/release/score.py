"""The release candidates' rewrites of the validation rows, and their tie-aware Hit@1 through the tenant's RAG.

A candidate is a rule (raw / query_history: the eval's own rewrite functions; teacher: the tenant's teacher where
it is the embedded resolver, qrewrite/referent.py, which needs no model and no paid call) or a student (sft: models/T/sft-merged,
rl: models/T/rl) with one of `release.decoding`'s levers over eval.generation. Only the validation
split is read: the stage is given no path to the test split (the stage table, tests/test_release.py).
"""

from __future__ import annotations

import json
import logging

from ..config import tenant_teacher
from ..entities import EntityLexicon
from .. import stats
from ..eval import reuse
from ..eval.candidates import RULE_REWRITES as RULES
from ..eval.candidates import STUDENTS, generation_key, model_rewrites
from ..eval.hits import hit_at_1
from ..kb import tenant_kb
from ..runtime.route import client_rows
from ..runtime.rules import STATEFUL, resolver_rule

log = logging.getLogger(__name__)


def lever_name(decoding: dict) -> str:
    """A decoding lever as a name suffix: '' for eval.generation as it is, else '+copy_bias=1.0'."""
    return "".join(f"+{k}={json.dumps(v)}" for k, v in sorted(decoding.items()))


def is_plain(cand: dict) -> bool:
    """A student with eval.generation as it is (the empty lever, so its name is its source's): the model alone."""
    return cand["kind"] == "model" and cand["name"] == cand["source"]


# the teachers a release can serve as a rule: those that run wherever the gateway runs, without a paid call (prf
# needs a retriever over the KB, which a gateway in front of an HTTP RAG does not have; openai is a paid call;
# column is the sheet's own rewrites, which do not exist for a new request)
RULE_TEACHERS = {"resolve": "resolve"}


def teacher_rule(cfg: dict, tenant: dict) -> tuple[str | None, str]:
    """(the rule the tenant's teacher is, or None, why)."""
    provider = tenant_teacher(cfg, tenant)["provider"]
    if provider in RULE_TEACHERS:
        return RULE_TEACHERS[provider], f"the tenant's teacher is the embedded {provider} rule: no model, no paid call"
    why = {"openai": "an API model: a paid call per request", "prf": "it needs a retriever over the KB, which a "
           "gateway in front of an HTTP RAG does not have", "column": "the sheet's own rewrites: none exist for a new "
           "request"}.get(provider, "it does not run at serving time")
    return None, f"the tenant's teacher is {provider} ({why}): not a release candidate"


def release_candidates(cfg: dict, tenant: dict, rules_only: bool = False) -> tuple[list[dict], dict[str, str]]:
    """(release.candidates × release.decoding, in release order: {name, source, kind, artifact, decoding}; the
    candidates left out, name → why). `rules_only`: the rules alone (a tenant without a student)."""
    out, left_out = [], {}
    for name in cfg["release"]["candidates"]:
        if name in RULES:
            out.append({"name": name, "source": name, "kind": name, "artifact": None, "decoding": None})
            continue
        if name == "teacher":
            rule, why = teacher_rule(cfg, tenant)
            if rule is None:
                left_out[name] = why
            else:
                out.append({"name": name, "source": name, "kind": rule, "artifact": None, "decoding": None})
            continue
        if rules_only:
            continue
        if name == "pref" and not (cfg.get("pref") or {}).get("enabled"):
            left_out[name] = "pref.enabled is false: the preference stage did not run"
            continue
        for lever in cfg["release"]["decoding"]:
            out.append({"name": name + lever_name(lever), "source": name, "kind": "model",
                        "artifact": STUDENTS[name], "decoding": {**cfg["eval"]["generation"], **lever}})
    return out, left_out


def tenant_lexicon(tenant: dict) -> EntityLexicon:
    """The entity lexicon the resolve rule runs over, read off the tenant's KB as the teacher stage reads it; the
    release freezes it in its folder (rules.ENTITIES_FILE)."""
    return EntityLexicon.from_docs(tenant_kb(tenant))


def rewrites(cand: dict, cfg: dict, tenant: dict, rows: list[dict], model_dir: str | None,
             threads: int | None, generated: dict | None = None, reuse_from: str | None = None,
             reused: set | None = None) -> dict[str, str]:
    """query id → the candidate's rewrite of each row: a rule's, or the eval's model generation (no latency
    timing: nothing here reports latency). `generated` remembers each model's own texts by its decoding, so a
    lever that only chooses what is sent after them (append_history, route_by_retrieval: qrewrite.runtime.route)
    generates nothing again; `reuse_from` is the rl stage's record of the same generation (qrewrite.eval.reuse),
    taken when it is exactly this one (its memo key then added to `reused`)."""
    spec = {"name": cand["name"], "kind": cand["kind"]}
    if cand["kind"] in RULES:
        return {r["query_id"]: r["rewrite"] for r in RULES[cand["kind"]](spec, rows)}
    if cand["kind"] in STATEFUL:
        text = resolver_rule(tenant_lexicon(tenant))
        return {r["query_id"]: text(r) for r in rows}
    generated = {} if generated is None else generated
    key = (model_dir, generation_key(cand["decoding"]))
    if key not in generated:
        device = cand["decoding"].get("device") or cfg["train"]["device"]
        taken = reuse.reusable(reuse_from, model_dir, tenant, rows, key[1], device)
        if taken is not None:
            log.info("release candidate %s: the rl stage's rewrites of these rows by %s, same weights, prompts and "
                     "decoding (%s): not generated again", cand["name"], model_dir, reuse_from)
            generated[key] = taken
            if reused is not None:
                reused.add(key)
    if key not in generated:
        out, _ = model_rewrites({**spec, "generation": {**cand["decoding"], "latency_sample": 0,
                                                        "append_history": False, "route_by_retrieval": False}},
                                cfg, tenant, rows, model_dir, threads)
        generated[key] = {r["query_id"]: r["rewrite"] for r in out}
    own = generated[key]
    sent = client_rows(cand["decoding"], cfg, tenant, rows, [own[r["query_id"]] for r in rows])
    return {r["query_id"]: f["rewrite"] for r, f in zip(rows, sent)}


def score(cfg: dict, tenant: dict, rows: list[dict], cands: list[dict], models: dict[str, str],
          threads: int | None, generated: dict | None = None,
          reuse_from: str | None = None) -> tuple[list[dict], dict[str, list]]:
    """(figures in release order: {name, mean, ci_low, ci_high, n}, per-row Hit@1 by name) on `rows`.
    `models`: artifact key → model folder; `generated`: `rewrites`' memo of these rows (a caller's, to keep);
    `reuse_from`: the rl stage's rewrites (`rewrites`). A candidate whose texts came from it says so
    (`reused_from`)."""
    texts, generated, reused = {}, {} if generated is None else generated, set()
    for c in cands:
        log.info("release candidate %s: rewriting %d validation rows", c["name"], len(rows))
        texts[c["name"]] = rewrites(c, cfg, tenant, rows, models.get(c["artifact"]), threads, generated, reuse_from,
                                    reused)
    taken = {c["name"] for c in cands
             if c["kind"] == "model" and (models.get(c["artifact"]), generation_key(c["decoding"])) in reused}
    per_row = hit_at_1(cfg, tenant, rows, texts)
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    figures = [{"name": c["name"], **stats.mean_ci(per_row[c["name"]], **bkw),
                **({"reused_from": reuse_from} if c["name"] in taken else {})} for c in cands]
    for f in figures:
        log.info("validation Hit@1 %s: %s [%s, %s] over %d rows", f["name"], f["mean"], f["ci_low"], f["ci_high"],
                 f["n"])
    return figures, per_row
