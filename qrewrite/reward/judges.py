"""The judge ``reward.judge.provider`` names: ``rule`` (``judge_rules.RuleJudge``, the embedded default),
``openai`` (``judge_openai.OpenAIJudge``) or ``model`` (``judge_model.ModelJudge``, the distilled judge; with
``reward.judge.model.rule_weight`` blended with the rule judge: ``judge_blend.BlendedJudge``).

Both have the face the scorer and eval use: ``async judge(query, profile, history, rewrite, reference=None) ->
Verdict`` (``reference``: the teacher's rewrite of the same question, what the rewrite is graded against),
``stats()`` (judge_calls, judge_cache_hits, judge_failures[_<kind>]) and ``async aclose()``.
"""

from __future__ import annotations

import os

from ..errors import QrewriteError
from ..kb import tenant_kb
from ..cache import DiskCache
from .judge_openai import OpenAIJudge
from .judge_rules import RuleJudge, UnitWeights


def make_judge(settings: dict, language: str, docs: list | None = None, cache_dir: str | None = None,
               rubric: str | None = None, tenant: str | None = None):
    """The judge named by ``reward.judge.provider`` (``settings`` = ``reward_settings(cfg)``); ``docs``:
    the tenant's KB, whose word frequencies weight the rule judge's comparison with the reference;
    ``rubric``: the tenant's judge_rubric (OpenAI judge only); ``tenant``: fills ``{tenant}`` in the distilled
    judge's path."""
    jcfg = settings["judge"]
    if jcfg["provider"] == "rule":
        return RuleJudge(language, docs)
    if jcfg["provider"] == "openai":
        cache = DiskCache(os.path.join(cache_dir or settings["cache_dir"], "judge"))
        return OpenAIJudge(jcfg["openai"], cache, rubric)
    if jcfg["provider"] == "model":
        from .judge_model import ModelJudge

        mcfg = jcfg["model"]
        path = mcfg["path"].replace("{tenant}", tenant or "")
        cache = DiskCache(os.path.join(cache_dir or settings["cache_dir"], "judge"))
        judge = ModelJudge(path, cache, max_new_tokens=mcfg["max_new_tokens"], batch_size=mcfg["batch_size"],
                           threads=mcfg.get("threads"), key_terms=key_terms_of(docs, language, mcfg.get("key_terms")))
        if mcfg.get("rule_weight"):
            from .judge_blend import BlendedJudge

            return BlendedJudge(judge, RuleJudge(language, docs), mcfg["rule_weight"])
        return judge
    raise QrewriteError(f"unknown reward.judge.provider {jcfg['provider']!r}", hint="use rule, openai or model")


def key_terms_of(docs: list | None, language: str, k: int | None):
    """reference -> its `k` key terms by the KB's word frequencies (what the distilled judge is shown,
    reward.judge.model.key_terms); None when `k` is 0/None (the judge was trained without them)."""
    if not k:
        return None
    if not docs:
        raise QrewriteError("reward.judge.model.key_terms needs the tenant's KB", hint="set tenants[].kb.path")
    weights = UnitWeights([d.text for d in docs], language)
    return lambda reference: weights.key_terms(reference, int(k))


def tenant_docs(tenant: dict, rag=None) -> list:
    """The tenant's KB: ``rag``'s documents when ``rag`` is the local provider (the KB read once), else the file."""
    retriever = getattr(rag, "retriever", None)
    return retriever.docs if retriever is not None else tenant_kb(tenant)


def make_tenant_judge(settings: dict, tenant: dict, cache_dir: str | None = None, rag=None):
    """``make_judge`` for a tenant: the rule judge, and the model judge shown key terms, read the tenant's KB
    (``tenant_docs``)."""
    jcfg = settings["judge"]
    docs = None
    if jcfg["provider"] == "rule" or (jcfg["provider"] == "model"
                                      and (jcfg["model"].get("key_terms") or jcfg["model"].get("rule_weight"))):
        docs = tenant_docs(tenant, rag)
    return make_judge(settings, tenant.get("language", "zh"), docs, cache_dir, tenant.get("judge_rubric"),
                      tenant["name"])
