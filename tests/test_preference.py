"""The preference stages (qrewrite/training/preference/): which pair a training row gives, the stage table's switch,
KTO's unpaired examples and the choice between DPO and KTO, the too-few stop, and a real `swift rlhf` step (DPO and
KTO) of the stage's own command on the tiny model."""

from __future__ import annotations

import json

import pytest

from qrewrite.errors import QrewriteError
from qrewrite.training.preference.pairs import NO_CHOSEN, NO_REJECTED, build_examples, build_pair
from qrewrite.training.preference.train import choose_method, dpo_cmd, kto_cmd, loss_history

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


def test_kto_examples_take_every_distinct_loser_and_as_many_chosen_texts():
    rows = [({"id": "r1"}, {"text": "T1", "hit_at_1": 1.0}, [_s("a", 0.0), _s("a", 0.0), _s("T1", 1.0), _s("b", 0.5)]),
            ({"id": "r2"}, {"text": "T2", "hit_at_1": 0.0}, [_s("x", 0.0), _s("", 0.0)]),  # nothing puts gold first
            ({"id": "r3"}, {"text": "T3", "hit_at_1": 1.0}, [_s("T3", 1.0)]),
            ({"id": "r4"}, {"text": "T4", "hit_at_1": 1.0}, [_s("T4", 1.0)])]
    ex = build_examples(rows, seed=1)
    bad = [(e["row"]["id"], e["text"]) for e in ex if not e["label"]]
    good = [(e["row"]["id"], e["text"], e["source"]) for e in ex if e["label"]]
    # a repeated sample and an empty one are no new evidence; the row without a winner still gives its loser
    assert bad == [("r1", "a"), ("r1", "b"), ("r2", "x")]
    # as many desirable as undesirable: the row that also has a loser first, then the others in a seeded order
    assert len(good) == 3 and good[0] == ("r1", "T1", "teacher") and {g[0] for g in good[1:]} == {"r3", "r4"}
    assert build_examples(rows, seed=1) == ex  # the seed fixes the draw
    # more losers than chosen texts: every chosen text, no more
    assert sum(e["label"] for e in build_examples(rows[:2], seed=1)) == 1


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_the_method_is_dpo_with_enough_pairs_else_kto_else_a_stop_with_the_counts(tmp_path):
    from qrewrite.config import load_config

    cfg = load_config(str(REPO / "config.yaml"))
    assert cfg["pref"]["method"] == "auto"
    cfg["pref"].update(min_pairs=4, min_undesirable=5)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"rows_with_gold": 40, "no_pair": {NO_REJECTED: 37}}), encoding="utf-8")
    examples = _write(tmp_path / "ex.jsonl", [{"label": False}] * 5 + [{"label": True}] * 5)
    few = _write(tmp_path / "few.jsonl", [{}] * 3)
    enough = _write(tmp_path / "enough.jsonl", [{}] * 4)
    assert choose_method(cfg, enough, examples)[0] == "dpo"
    method, n = choose_method(cfg, few, examples, str(summary))
    assert (method, n) == ("kto", {"pairs": 3, "desirable": 5, "undesirable": 5})
    cfg["pref"]["min_undesirable"] = 6
    with pytest.raises(QrewriteError, match=r"3 preference pair\(s\), 5 undesirable and 5 desirable example\(s\) "
                       r"\(40 training rows with gold.*needs pref.min_pairs \(4\) pairs or pref.min_undesirable \(6\)"):
        choose_method(cfg, few, examples, str(summary))
    cfg["pref"].update(method="dpo", min_undesirable=1)  # a method named is that method or a stop
    with pytest.raises(QrewriteError, match=r"pref.method dpo needs pref.min_pairs \(4\) pairs:"):
        choose_method(cfg, few, examples)
    cfg["pref"]["method"] = "kto"
    assert choose_method(cfg, enough, examples)[0] == "kto"


def test_dpo_argv_keeps_the_sft_term_and_no_reference_model():
    argv = dpo_cmd({"model": "/m", "train_file": "/p.jsonl", "output_dir": "/o", "swift_bin": "swift",
                    "beta": 0.2, "rpo_alpha": 0.5})
    opt = lambda k: argv[argv.index(k) + 1]  # noqa: E731
    assert argv[1:4] == ["rlhf", "--rlhf_type", "dpo"]
    assert (opt("--beta"), opt("--rpo_alpha"), opt("--loss_type"), opt("--tuner_type")) == ("0.2", "0.5", "sigmoid",
                                                                                            "lora")
    assert "--ref_model" not in argv  # with LoRA the reference is the model with the adapter off
    assert "--rpo_alpha" not in dpo_cmd({"model": "/m", "train_file": "/p", "output_dir": "/o", "rpo_alpha": None})


def test_kto_argv_has_its_weights_and_no_dpo_terms():
    argv = kto_cmd({"model": "/m", "train_file": "/e.jsonl", "output_dir": "/o", "swift_bin": "swift",
                    "desirable_weight": 1.5, "rpo_alpha": 1.0, "loss_type": "sigmoid"})
    opt = lambda k: argv[argv.index(k) + 1]  # noqa: E731
    assert argv[1:4] == ["rlhf", "--rlhf_type", "kto"]
    assert (opt("--desirable_weight"), opt("--undesirable_weight"), opt("--beta")) == ("1.5", "1.0", "0.1")
    assert "--rpo_alpha" not in argv and "--loss_type" not in argv and "--ref_model" not in argv
    with pytest.raises(QrewriteError, match="KTO needs at least 2 examples per step"):
        kto_cmd({"model": "/m", "train_file": "/e", "output_dir": "/o", "per_device_train_batch_size": 1})


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dpo", "kto"])
def test_swift_trains_a_step_from_the_stages_command(method, smollm2_base, tmp_path):
    """The stage's argv, run by ms-swift on the tiny model: one DPO step with the SFT term, or one KTO step on
    unpaired examples, and a LoRA checkpoint."""
    from qrewrite.training.swift.runner import run_swift

    swift = REPO / ".venvs" / "swift" / "bin" / "swift"
    system = {"role": "system", "content": "Rewrite the question as a standalone search query."}

    def row(i, answer):
        return {"messages": [system, {"role": "user", "content": f"question {i}: and its price?"},
                             {"role": "assistant", "content": answer}]}

    if method == "dpo":
        rows = [{**row(i, f"product {i} price"), "rejected_response": f"price of it {i} {i}"} for i in range(4)]
    else:
        rows = [{**row(i, f"product {i} price" if i % 2 else f"price of it {i} {i}"), "label": bool(i % 2)}
                for i in range(4)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = tmp_path / "run"
    make = {"dpo": dpo_cmd, "kto": kto_cmd}[method]
    run_swift(make({"model": str(smollm2_base), "train_file": str(data), "output_dir": str(run),
                    "swift_bin": str(swift), "max_steps": 1, "per_device_train_batch_size": 2,
                    "save_steps": 1, "max_length": 128, "rpo_alpha": 1.0}), log_file=tmp_path / f"{method}.log")
    assert (run / "checkpoint-1" / "adapter_model.safetensors").is_file()
    (step,) = loss_history(run)
    assert step["step"] == 1 and "loss" in step
    assert {"nll_loss", "rewards/margins"} <= set(step) if method == "dpo" else "kl" in step
