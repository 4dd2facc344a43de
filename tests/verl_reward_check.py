"""Drive verl 0.9's reward loader on CPU with a tiny DataProto (no Ray, no GPU).

Mirrors what verl does at train time:

1. ``verl.trainer.ppo.reward.load_reward_manager(config, tokenizer)`` loads the
   function named by ``reward.custom_reward_function.{path,name}`` from a file
   (``load_extern_object``) and instantiates the manager registered under
   ``reward.reward_manager.name`` in ``verl.experimental.reward_loop.reward_manager``.
2. ``RewardLoopWorker.compute_score_batch`` calls ``manager.run_single(data[i:i+1])``
   per sample (async); each returns ``{"reward_score", "reward_extra_info"}``.
3. ``RewardLoopManager.compute_rm_score`` puts the score on the last valid
   response token (``assemble_rm_scores``) and stacks every ``reward_extra_info``
   key into ``non_tensor_batch`` with ``meta_info["reward_extra_keys"]``.

Also shows the legacy batch form (``verl.workers.reward_manager.BatchRewardManager``)
and that ``reward_manager.name=batch`` is not resolvable in 0.9's reward loop.

Run (verl env):  QREWRITE_CONFIG=config.yaml PYTHONPATH=.:tests .venvs/verl/bin/python tests/verl_reward_check.py TOKENIZER_DIR MODEL_DIR
MODEL_DIR only has to hold config.json + tokenizer (used by compose validation; not loaded here).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Sequence

# the real qrewrite reward (needs QREWRITE_CONFIG pointing at a config.yaml with the tenant's KB)
REWARD_FN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reward", "verl_reward.py")


def make_tiny_dataproto(tokenizer, rows: Sequence[dict[str, Any]], prompt_len: int = 16, resp_len: int = 16):
    """DataProto shaped like a rollout batch: left-padded prompts, right-padded responses.

    rows: dicts with ``prompt``, ``response`` (text), ``data_source``, ``ground_truth``, ``extra_info``.
    """
    import numpy as np
    import torch

    from verl import DataProto

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    B = len(rows)
    prompts = torch.full((B, prompt_len), pad, dtype=torch.long)
    responses = torch.full((B, resp_len), pad, dtype=torch.long)
    attn = torch.zeros((B, prompt_len + resp_len), dtype=torch.long)
    for i, r in enumerate(rows):
        p = tokenizer.encode(r["prompt"], add_special_tokens=False)[-prompt_len:]
        s = tokenizer.encode(r["response"], add_special_tokens=False)[:resp_len] or [pad]
        prompts[i, prompt_len - len(p) :] = torch.tensor(p)
        attn[i, prompt_len - len(p) : prompt_len] = 1
        responses[i, : len(s)] = torch.tensor(s)
        attn[i, prompt_len : prompt_len + len(s)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attn,
            "input_ids": torch.cat([prompts, responses], dim=1),
        },
        non_tensors={
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "reward_model": np.array(
                [{"style": "rule", "ground_truth": r["ground_truth"]} for r in rows], dtype=object
            ),
            "extra_info": np.array([dict(r.get("extra_info") or {}) for r in rows], dtype=object),
        },
    )


def run_reward_loop(config, tokenizer, data):
    """Score ``data`` the way verl 0.9's reward loop does; returns (rm_scores, extra_info dict, raw outputs)."""
    import numpy as np

    from verl.trainer.ppo.reward import load_reward_manager, resolve_reward_manager_cls

    manager = load_reward_manager(config, tokenizer)

    async def _all():
        return await asyncio.gather(*[manager.run_single(data[i : i + 1]) for i in range(len(data))])

    outputs = manager.loop.run_until_complete(_all())
    scores = [o["reward_score"] for o in outputs]
    rm_scores = resolve_reward_manager_cls(config).assemble_rm_scores(data, scores)
    infos = [o.get("reward_extra_info", {}) for o in outputs]
    extra = {k: np.array([info[k] for info in infos]) for k in infos[0]}
    return rm_scores, extra, outputs


def run_legacy_batch_manager(tokenizer, data, reward_path: str = REWARD_FN, fn_name: str = "compute_score_batch"):
    """Legacy ``BatchRewardManager`` (``verl.workers.reward_manager``) with the batch signature."""
    from verl.utils.import_utils import load_extern_object
    from verl.workers.reward_manager.batch import BatchRewardManager

    fn = load_extern_object(module_path=reward_path, object_name=fn_name)
    mgr = BatchRewardManager(tokenizer=tokenizer, num_examine=0, compute_score=fn)
    return mgr(data, return_dict=True)


def main(argv: Sequence[str] | None = None) -> int:
    import json

    from verl_compose_check import compose_verl_config
    from qrewrite.training.rl.verl.overrides import build_overrides
    from verl.utils import hf_tokenizer

    args = list(sys.argv[1:] if argv is None else argv)
    tok_dir, model_dir = args[0], args[1] if len(args) > 1 else args[0]
    tokenizer = hf_tokenizer(tok_dir)
    paths = dict(
        model=model_dir, train_files="/tmp/x.parquet", val_files="/tmp/x.parquet",
        reward_fn=REWARD_FN, checkpoint_dir="/tmp/ckpt",
    )
    config = compose_verl_config(build_overrides({"algorithm": "grpo"}, paths))
    query = "奶蓟草护肝片啥时候吃效果好"
    gt = json.dumps({"teacher_rewrite": "奶蓟草护肝片 服用时间 饭后",
                     "teacher_retrieval": {"top1": 1.0, "mean_top3": 1.0, "doc_ids": ["fd-058"]},
                     "gold_doc_ids": ["fd-058"]}, ensure_ascii=False)
    extra = {"query_id": "q1", "tenant": "fivedoctors", "query": query}
    rows = [
        dict(prompt=query, response="奶蓟草护肝片 服用时间 饭后", data_source="fivedoctors",
             ground_truth=gt, extra_info=dict(extra, index=0)),
        dict(prompt=query, response="今天天气怎么样", data_source="fivedoctors",
             ground_truth=gt, extra_info=dict(extra, index=1)),
    ]
    data = make_tiny_dataproto(tokenizer, rows)
    rm_scores, extra, outputs = run_reward_loop(config, tokenizer, data)
    print("manager:", config.reward.reward_manager.name, "fn:", config.reward.custom_reward_function.name)
    print("rm_scores row sums:", rm_scores.sum(-1).tolist())
    print("reward_extra_keys:", list(extra), {k: v.tolist() for k, v in extra.items()})
    legacy = run_legacy_batch_manager(tokenizer, data)
    print("legacy batch:", legacy["reward_tensor"].sum(-1).tolist(), dict(legacy["reward_extra_info"]))
    try:
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

        get_reward_manager_cls("batch")
        print("'batch' resolvable in the 0.9 reward loop")
    except ValueError as e:
        print("'batch' in 0.9 reward loop ->", e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
