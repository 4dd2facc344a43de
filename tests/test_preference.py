"""The preference stages (qrewrite/training/preference/): which pair a training row gives, the stage table's switch,
the too-few-pairs stop, and a real `swift rlhf --rlhf_type dpo` step of the stage's own command on the tiny model."""

from __future__ import annotations

import json

import pytest

from qrewrite.errors import QrewriteError
from qrewrite.training.preference.dpo import check_pairs, dpo_cmd, loss_history
from qrewrite.training.preference.pairs import NO_CHOSEN, NO_REJECTED, build_pair

from conftest import REPO


def _s(text, hit, degenerate=None):
    return {"text": text, "hit_at_1": hit, "degenerate": degenerate}


def test_teacher_is_chosen_when_it_puts_gold_first():
    pair, why = build_pair({"text": "T", "hit_at_1": 1.0}, [_s("a", 1.0), _s("b", 0.0), _s("c", 0.5)])
    assert why is None
    assert (pair["chosen"], pair["rejected"], pair["chosen_source"]) == ("T", "b", "teacher")
    assert (pair["chosen_hit_at_1"], pair["rejected_hit_at_1"]) == (1.0, 0.0)


def test_a_sample_is_chosen_when_the_teacher_misses():
    # a tie at the top (Hit@1 0.5) is not gold first; a degenerate sample is never the chosen text
    pair, why = build_pair({"text": "T", "hit_at_1": 0.5},
                           [_s("loop loop", 1.0, "loop"), _s("good", 1.0), _s("tied", 0.5), _s("miss", 0.5)])
    assert why is None
    assert (pair["chosen"], pair["rejected"], pair["chosen_source"]) == ("good", "tied", "sample")


def test_rows_without_a_pair_say_why():
    assert build_pair({"text": "T", "hit_at_1": 1.0}, [_s("a", 1.0), _s("b", 1.0)]) == (None, NO_REJECTED)
    assert build_pair({"text": "T", "hit_at_1": 0.0}, [_s("a", 0.0), _s("b", 0.5)]) == (None, NO_CHOSEN)
    # an empty completion is no rejected text (nor a chosen one)
    assert build_pair({"text": "T", "hit_at_1": 1.0}, [_s("", 0.0), _s("a", 1.0)]) == (None, NO_REJECTED)
    assert build_pair({"text": "", "hit_at_1": 1.0}, [_s("b", 0.0)]) == (None, NO_CHOSEN)


def test_the_pref_stages_run_only_when_switched_on():
    from qrewrite.config import load_config
    from qrewrite.workflow.stages import STAGES, job_files, jobs

    cfg = load_config(str(REPO / "config.yaml"))
    for on in (False, True):
        cfg["pref"]["enabled"] = on
        for name in ("pref_pairs", "pref"):
            assert bool(jobs(STAGES[name], cfg)) is on
        # nothing downstream asks for the preference model while its stage is off: no eval job, no release input
        scored = {c["name"] for _, c in jobs(STAGES["eval_generate"], cfg)}
        assert ("pref" in scored) is on
        release_inputs = {k for t, _ in jobs(STAGES["release"], cfg)
                          for k in job_files(STAGES["release"], "in", t, cfg)}
        assert ("pref" in release_inputs) is on


def test_too_few_pairs_stop_the_stage_with_the_counts(tmp_path):
    from qrewrite.config import load_config

    cfg = load_config(str(REPO / "config.yaml"))
    pairs, summary = tmp_path / "pairs.jsonl", tmp_path / "summary.json"
    pairs.write_text("{}\n" * 3, encoding="utf-8")
    summary.write_text(json.dumps({"rows_with_gold": 40, "no_pair": {NO_REJECTED: 37}}), encoding="utf-8")
    cfg["pref"]["min_pairs"] = 4
    with pytest.raises(QrewriteError, match=r"3 preference pair\(s\), fewer than pref.min_pairs \(4\).*40 training"):
        check_pairs(cfg, str(pairs), str(summary))
    cfg["pref"]["min_pairs"] = 3
    assert check_pairs(cfg, str(pairs), str(summary)) == 3


def test_dpo_argv_keeps_the_sft_term_and_no_reference_model():
    argv = dpo_cmd({"model": "/m", "train_file": "/p.jsonl", "output_dir": "/o", "swift_bin": "swift",
                    "beta": 0.2, "rpo_alpha": 0.5})
    opt = lambda k: argv[argv.index(k) + 1]  # noqa: E731
    assert argv[1:4] == ["rlhf", "--rlhf_type", "dpo"]
    assert (opt("--beta"), opt("--rpo_alpha"), opt("--loss_type"), opt("--tuner_type")) == ("0.2", "0.5", "sigmoid",
                                                                                            "lora")
    assert "--ref_model" not in argv  # with LoRA the reference is the model with the adapter off
    assert "--rpo_alpha" not in dpo_cmd({"model": "/m", "train_file": "/p", "output_dir": "/o", "rpo_alpha": None})


@pytest.mark.slow
def test_swift_trains_a_dpo_step_from_the_stages_command(smollm2_base, tmp_path):
    """The stage's argv, run by ms-swift on the tiny model: one DPO step with the SFT term, a LoRA checkpoint."""
    from qrewrite.training.swift.runner import run_swift

    swift = REPO / ".venvs" / "swift" / "bin" / "swift"
    system = {"role": "system", "content": "Rewrite the question as a standalone search query."}
    rows = [{"messages": [system, {"role": "user", "content": f"question {i}: and its price?"},
                          {"role": "assistant", "content": f"product {i} price"}],
             "rejected_response": f"price of it {i} {i}"} for i in range(4)]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = tmp_path / "run"
    run_swift(dpo_cmd({"model": str(smollm2_base), "train_file": str(pairs), "output_dir": str(run),
                       "swift_bin": str(swift), "max_steps": 1, "per_device_train_batch_size": 2,
                       "save_steps": 1, "max_length": 128, "rpo_alpha": 1.0}), log_file=tmp_path / "dpo.log")
    assert (run / "checkpoint-1" / "adapter_model.safetensors").is_file()
    (step,) = loss_history(run)
    assert step["step"] == 1 and {"loss", "nll_loss", "rewards/margins"} <= set(step)
