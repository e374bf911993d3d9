"""Ladders (issue 33, section 3): ``grade pipeline_1f1b --step k`` grades a smaller function, each
step with its own verdict and the command of the next; ``--list`` shows the steps."""
import ast

import pytest

from tutorials.exercises._checks_ladder import LADDERS
from tutorials.exercises.grade import HERE, grade, main

SOLUTIONS, WRONG = HERE / "solutions", HERE / "wrong"

# (exercise, wrong file, world sizes that show the mistake, reason, words the verdict must contain)
WRONG_CASES = [
    ("pipeline_1f1b_order", "pipeline_1f1b_order_no_warmup", None, "wrong",
     ["FAIL pipeline_1f1b_order: wrong order for stage s = 0 of p = 2, m = 2 micro-batches.",
      "expected F0 F1 B0 B1", "received F0 B0 F1 B1", "w = min(p - s - 1, m) = 1 warm-up forwards"]),
    ("pipeline_1f1b_order", "pipeline_1f1b_order_past_the_end", None, "crash",   # an error is a verdict too
     ["FAIL pipeline_1f1b_order: it raised for stage s = 0 of p = 3, m = 1 micro-batch", "IndexError",
      'pipeline_1f1b_order_past_the_end.py", line 9']),
    ("pipeline_1f1b_forward", "pipeline_1f1b_forward_sends_input", (3,), "wrong",
     ["wrong result with 3 ranks", "stage 2: forward(0, ...) was given micro-batch 0's input to the previous "
      "stage, not its output", "send on the y that stage.forward returns"]),
]


def told_why(name, wrong, worlds, reason, words):
    """A wrong step fails on ``worlds`` for ``reason`` with every one of ``words`` in its verdict
    (every ladder's test file checks its wrong steps with this)."""
    verdict = grade(name, str(WRONG / f"{wrong}.py"), quick=True, world_sizes=worlds)
    assert not verdict.passed
    assert verdict.reason == reason, verdict.text
    for w in words:
        assert w in verdict.text, f"{w!r} not in:\n{verdict.text}"


@pytest.mark.parametrize("name,wrong,worlds,reason,words", WRONG_CASES, ids=[c[1] for c in WRONG_CASES])
def test_wrong_step_is_told_why(name, wrong, worlds, reason, words):
    told_why(name, wrong, worlds, reason, words)


def test_every_step_is_a_stub_with_a_task_and_a_solution():
    for exercise, steps in LADDERS.items():
        assert steps[-1] == exercise, "the last step is the exercise itself"
        for k, name in enumerate(steps[:-1], 1):
            tree = ast.parse((HERE / f"{name}.py").read_text())
            doc = ast.get_docstring(tree)
            assert f"step {k} of {len(steps)} of {exercise}" in doc and "Read: chapter" in doc and "Hint" in doc
            assert f"python -m tutorials.exercises.grade {exercise} --step {k}" in doc
            [fn] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
            assert "NotImplementedError" in ast.unparse(fn.body[-1])
            assert (SOLUTIONS / f"{name}.py").exists()


def test_each_step_s_solution_passes_and_names_the_next_step():
    first = grade("pipeline_1f1b_order", str(SOLUTIONS / "pipeline_1f1b_order.py"), quick=True)
    assert first.passed and "the 1F1B order right for all 36 (p, s, m) on pipelines of 1, 2, 3, 4 stages" in first.text   # 2 + 6 + 12 + 16
    assert first.text.endswith("Step 1 of 3 of pipeline_1f1b done. Next: python -m tutorials.exercises.grade "
                               "pipeline_1f1b --step 2 (pipeline_1f1b_forward).")
    second = grade("pipeline_1f1b_forward", str(SOLUTIONS / "pipeline_1f1b_forward.py"), quick=True,
                   world_sizes=(1, 3))    # one stage that is first and last; a middle one
    assert second.passed, second.text
    assert second.text.endswith("Next: python -m tutorials.exercises.grade pipeline_1f1b --step 3 (pipeline_1f1b).")


def test_the_library_s_schedule_is_switched_off_for_step_1(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("from collectives.parallel.pipeline import one_f_one_b\n\n\n"
                      "def pipeline_1f1b_order(p, s, m):\n    return one_f_one_b(p, m, s)\n")
    verdict = grade("pipeline_1f1b_order", str(sneaky), quick=True)
    assert verdict.reason == "builtin", verdict.text
    assert ("it calls collectives.parallel.pipeline.one_f_one_b (line 5 of sneaky.py: return one_f_one_b(p, m, s))"
            in verdict.text)


def test_step_on_the_command_line(capsys):
    assert main(["pipeline_1f1b", "--step", "1", "--solution", str(SOLUTIONS / "pipeline_1f1b_order.py")]) == 0
    assert capsys.readouterr().out.startswith("PASS pipeline_1f1b_order:")
    assert main(["pipeline_1f1b", "--step", "1"]) == 1     # the stub
    assert capsys.readouterr().out.startswith("NOT WRITTEN pipeline_1f1b_order:")
    for wrong in (["all_reduce", "--step", "1"], ["pipeline_1f1b", "--step", "4"]):
        with pytest.raises(SystemExit):
            main(wrong)
    assert "pipeline_1f1b has steps 1 to 3" in capsys.readouterr().err
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("pipeline_1f1b "))
    assert lines[at + 1].split()[:6] == ["--step", "1", "16", "*..", "15", "min"] and "pipeline_1f1b_order:" in lines[at + 1]
    assert lines[at + 2].split()[:3] == ["--step", "2", "16"] and "pipeline_1f1b_forward:" in lines[at + 2]


@pytest.mark.parametrize("exercise", sorted(LADDERS))
def test_a_long_exercise_names_its_steps(exercise):
    """A learner who opens the long exercise first finds the smaller steps that climb to it."""
    text = (HERE / f"{exercise}.py").read_text()
    for k, step in enumerate(LADDERS[exercise][:-1], start=1):
        assert f"``--step {k}``" in text and f"({step}.py)" in text, f"{exercise}.py does not name step {k}"
