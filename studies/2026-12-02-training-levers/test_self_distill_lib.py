"""The pure half of retrieval-guided self-distillation (self_distill_lib.py, once qrewrite/training/self_distill.py): which samples are kept,
and the training rows they become."""

from self_distill_lib import distilled_rows, keep


def test_keep_takes_gold_first_samples_other_than_the_teacher_and_each_other():
    teacher = {"q1": "A B", "q2": "C", "q3": "E"}
    samples = {"q1": ["A B", "A B C", "A B C", "X"],      # the teacher's text, a gold-first one twice, a miss
               "q2": ["C D", "D"],                        # a tie with a duplicate of gold (0.5) is not first
               "q3": ["F", " G ", "H"]}
    hits = {"q1": {"A B": 1.0, "A B C": 1.0, "X": 0.0}, "q2": {"C D": 0.5, "D": None},
            "q3": {"F": 1.0, "G": 1.0, "H": 1.0}}
    assert keep(teacher, samples, hits, per_row=2) == {"q1": ["A B C"], "q3": ["F", "G"]}
    assert keep(teacher, samples, hits, per_row=1) == {"q1": ["A B C"], "q3": ["F"]}


def test_distilled_rows_keep_the_teachers_rows_and_add_one_per_kept_sample():
    train = [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                           {"role": "assistant", "content": "teacher 1"}], "meta": {"query_id": "q1"}},
             {"messages": [{"role": "user", "content": "u2"}, {"role": "assistant", "content": "teacher 2"}],
              "meta": {"query_id": "q2"}}]
    out = distilled_rows(train, {"q2": ["own 2a", "own 2b"]})
    assert out[:2] == train and train[1]["messages"][-1]["content"] == "teacher 2"  # not changed in place
    assert [r["messages"][-1]["content"] for r in out[2:]] == ["own 2a", "own 2b"]
    assert all(r["meta"] == {"query_id": "q2", "target": "self_distill"} and r["messages"][0]["content"] == "u2"
               for r in out[2:])
