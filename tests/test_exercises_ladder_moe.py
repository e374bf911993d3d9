"""moe_dispatch's ladder (issue 33, section 3): ``grade moe_dispatch --step 1`` grades the counts
and their exchange, ``--step 2`` the tokens sent in uneven pieces, ``--step 3`` moe_dispatch."""
import pytest

from tests.test_exercises_ladder import told_why
from tutorials.exercises.grade import HERE, grade, main

SOLUTIONS, WRONG = HERE / "solutions", HERE / "wrong"

# (exercise, wrong file, world sizes that show the mistake, reason, words the verdict must contain)
WRONG_CASES = [
    ("moe_dispatch_counts", "moe_dispatch_counts_not_exchanged", (3,), "wrong",
     ["wrong result with 3 ranks, expert_of int64[T], T by rank from [5, 0, 7, 2, 6], random experts",
      "rank 0: send: [2, 1, 2]  ok", "recv: expected [2, 0, 5]", "received [2, 1, 2]",
      "recv is this rank's own send: the counts were not exchanged"]),
    ("moe_dispatch_counts", "moe_dispatch_counts_builtin", (2,), "builtin",
     ["it calls dist.all_to_all_single (line 9 of moe_dispatch_counts_builtin.py: "
      "dist.all_to_all_single(recv, send))"]),
    ("moe_dispatch_tokens", "moe_dispatch_tokens_unsorted", (3,), "wrong",
     ["rank 1: received: expected [400, 401, 402]", "received [200, 201, 202]",
      "a token's values are 100000 x its rank + 100 x its row + its column",
      "received holds rank 0's row 2, which rank 0 routes to expert 2, not 1",
      "tokens[expert_of.argsort(stable=True)].split(send.tolist())"]),
    ("moe_dispatch_tokens", "moe_dispatch_tokens_padded", (3,), "traffic",
     ["correct, but sends 786432 bytes (rank 0) where the dispatch of the tokens sends at most 250752 bytes",
      "no padding", "see chapter 19"]),
]


@pytest.mark.parametrize("name,wrong,worlds,reason,words", WRONG_CASES, ids=[c[1] for c in WRONG_CASES])
def test_wrong_step_is_told_why(name, wrong, worlds, reason, words):
    told_why(name, wrong, worlds, reason, words)


@pytest.mark.parametrize("name,k", [("moe_dispatch_counts", 1), ("moe_dispatch_tokens", 2)])
def test_each_step_s_solution_passes_and_names_the_next_step(name, k):
    verdict = grade(name, str(SOLUTIONS / f"{name}.py"), quick=True, world_sizes=(1, 2, 3))
    assert verdict.passed, verdict.text
    assert "correct in all 9 cases on worlds of 1, 2, 3 ranks" in verdict.text     # 3 routings x 3 worlds
    assert verdict.text.endswith(f"Step {k} of 3 of moe_dispatch done. Next: python -m tutorials.exercises.grade "
                                 f"moe_dispatch --step {k + 1} ({['moe_dispatch_tokens', 'moe_dispatch'][k - 1]}).")


def test_bincount_without_minlength_is_named(tmp_path):
    short = tmp_path / "short.py"
    short.write_text("import torch\n\n\ndef moe_dispatch_counts(expert_of, group=None):\n"
                     "    send = torch.bincount(expert_of)\n    return send, send\n")
    verdict = grade("moe_dispatch_counts", str(short), quick=True, world_sizes=(3,))
    assert verdict.reason == "wrong", verdict.text
    assert "rank 1: send: expected int64[3], found int64[0]" in verdict.text     # rank 1 has no tokens
    assert "(send has 0 entries, not N = 3: torch.bincount stops at the highest expert used; pass minlength=N)" \
        in verdict.text


def test_steps_on_the_command_line(capsys):
    assert main(["moe_dispatch", "--step", "1", "--worlds", "1"]) == 1     # the stub
    assert capsys.readouterr().out.startswith("NOT WRITTEN moe_dispatch_counts:")
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("moe_dispatch "))
    assert lines[at + 1].split()[:6] == ["--step", "1", "19", "*..", "15", "min"]
    assert "moe_dispatch_counts: Count with send = torch.bincount(expert_of, minlength=N)" in lines[at + 1]
    assert lines[at + 2].split()[:6] == ["--step", "2", "19", "**.", "25", "min"]
    assert "moe_dispatch_tokens: Sort the tokens by expert" in lines[at + 2]
