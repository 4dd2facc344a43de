"""ms-swift GRPO plugin for the distilled judge: ORMs ``judge_format`` and ``judge_verdict``
(``qrewrite.judge.rewards``). Loaded by file path (``--external_plugins``), as the rewrite reward's plugin is
(qrewrite/reward/swift_plugin.py: how ms-swift 4.6 calls it); the dataset's ``label`` column arrives aligned with
the completions."""

from __future__ import annotations

import os
import sys
from typing import List

from swift.rewards import ORM, orms

try:
    from qrewrite.judge.rewards import format_reward, verdict_reward
except ImportError:  # the checkout this file is in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from qrewrite.judge.rewards import format_reward, verdict_reward


class JudgeFormat(ORM):
    def __call__(self, completions, **kwargs) -> List[float]:
        return [format_reward(c) for c in completions]


class JudgeVerdict(ORM):
    def __call__(self, completions, label=None, **kwargs) -> List[float]:
        labels = label if label is not None else [None] * len(completions)
        return [verdict_reward(c, lab) for c, lab in zip(completions, labels)]


orms["judge_format"] = JudgeFormat
orms["judge_verdict"] = JudgeVerdict
