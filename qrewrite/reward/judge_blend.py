"""The distilled judge beside the rule judge (``reward.judge.model.rule_weight`` w > 0): the score is
``(1 - w) * model + w * rule``, both on the judges' 1-5 scale.

Why: on every tenant measured the distilled judge alone ranks the student's sampled rewrites below the rule judge
(docs/signals.md), while the two disagree often enough (correlation 0.44 on fivedoctors' held-out samples) that
their mean ranked them better than either there. The rule judge is free next to a generation, so the blend costs
what the model judge costs. A failed model judgement stays a failed judgement (judge term 0, counted): never the
rule's score alone, which would hide the model's failures.
"""

from __future__ import annotations

import asyncio

from .verdict import Verdict


def blend(model_score: float | None, rule_score: float | None, rule_weight: float) -> float | None:
    """The blended score; None when either judge failed."""
    if model_score is None or rule_score is None:
        return None
    return round((1.0 - rule_weight) * float(model_score) + rule_weight * float(rule_score), 4)


class BlendedJudge:
    """``model`` (a ModelJudge) and ``rule`` (a RuleJudge) asked the same question, their scores blended."""

    provider = "model"

    def __init__(self, model, rule, rule_weight: float):
        if not 0.0 < rule_weight < 1.0:
            raise ValueError(f"rule_weight must be in (0, 1), got {rule_weight}")
        self.model_judge, self.rule_judge, self.rule_weight = model, rule, float(rule_weight)
        self.model = f"{model.model}+rule*{self.rule_weight:g}"

    def __getattr__(self, name):  # model_dir, key_terms, fp...: the model judge's
        if name in ("model_judge", "rule_judge"):
            raise AttributeError(name)
        return getattr(self.model_judge, name)

    async def judge(self, query: str, profile: str, history: str, rewrite: str,
                    reference: str | None = None) -> Verdict:
        m, r = await asyncio.gather(self.model_judge.judge(query, profile, history, rewrite, reference),
                                    self.rule_judge.judge(query, profile, history, rewrite, reference))
        score = blend(m.score, r.score, self.rule_weight)
        if score is None:
            return Verdict(None, m.reason if m.score is None else r.reason, m.cached)
        return Verdict(score, f"{m.reason} | rule: {r.reason}", m.cached)

    def stats(self) -> dict:
        out = dict(self.model_judge.stats())
        out.update({f"rule_{k}": v for k, v in self.rule_judge.stats().items()})
        return out

    async def aclose(self) -> None:
        for j in (self.model_judge, self.rule_judge):
            close = getattr(j, "aclose", None)
            if close is not None:
                await close()
