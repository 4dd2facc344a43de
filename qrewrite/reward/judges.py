"""The judge ``reward.judge.provider`` names: ``rule`` (``judge_rules.RuleJudge``, the embedded default),
``openai`` (``judge_openai.OpenAIJudge``) or ``model`` (``judge_model.ModelJudge``, the distilled judge).

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
from .judge_rules import RuleJudge


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
        return ModelJudge(path, cache, max_new_tokens=mcfg["max_new_tokens"], batch_size=mcfg["batch_size"],
                          threads=mcfg.get("threads"))
    raise QrewriteError(f"unknown reward.judge.provider {jcfg['provider']!r}", hint="use rule, openai or model")


def make_tenant_judge(settings: dict, tenant: dict, cache_dir: str | None = None, rag=None):
    """``make_judge`` for a tenant: the rule judge reads the tenant's KB (``rag``'s documents when ``rag`` is
    the local provider, so the KB is read once)."""
    retriever = getattr(rag, "retriever", None)
    docs = None
    if settings["judge"]["provider"] == "rule":
        docs = retriever.docs if retriever is not None else tenant_kb(tenant)
    return make_judge(settings, tenant.get("language", "zh"), docs, cache_dir, tenant.get("judge_rubric"),
                      tenant["name"])
