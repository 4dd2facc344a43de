"""The distilled judge: a small model that learns the strong judge's verdicts, to judge RL rollouts
locally instead of calling an API on a sampled share of them.

Modules, one job each (what the judge model reads and writes is ``qrewrite.reward.judge_prompt``, a layer below,
beside the reward's judge that serves it): ``items`` (judgement items from what the
pipeline already has, labelled and split by question), ``data`` (SFT and GRPO files from the items), ``rewards``
(the GRPO rewards: format, verdict), ``evaluate`` (base vs SFT vs GRPO vs the rule judge on the held-out items);
the judge itself is ``qrewrite.reward.judge_model.ModelJudge`` (``reward.judge.provider: model``).
"""
