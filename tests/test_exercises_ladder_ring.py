"""ring_attention's ladder (issue 33, section 3): ``grade ring_attention --step 1`` grades one
rotation of the (k, v) blocks around the ring (in worlds of processes), ``--step 2`` the online
softmax's merge of one block (in this process, against torch's softmax attention in float64),
``--step 3`` ring_attention itself."""
import pytest

from tests.test_exercises_ladder import told_why
from tutorials.exercises.grade import HERE, grade, main

SOLUTIONS, WRONG = HERE / "solutions", HERE / "wrong"

# (exercise, wrong file, world sizes that show the mistake, reason, words the verdict must contain)
WRONG_CASES = [
    ("ring_attention_rotate", "ring_attention_rotate_wrong_way", (3,), "wrong",     # on 2 ranks left is right
     ["wrong result with 3 ranks, k float64[2, 3], v float64[2, 3] a rank, rotated N times (a full turn)",
      "rank 0: after rotation 1 of 3 this rank should hold rank 2's block (rank r - 1's",
      "k: expected [20000, 20001, 20002", "received [10000, 10001, 10002",
      "(rotation 1 sent 2 messages to rank 2; the block goes to rank r + 1 = 1 only)",
      "k holds rank 1's block, rank r + 1's: the blocks travel the wrong way round"]),
    ("ring_attention_rotate", "ring_attention_rotate_blocking_send", (2,), "deadlock",
     ["rank 0: in dist.send(dst=1) of float64[2, 3]", "rank 1: in dist.send(dst=0)",
      "A send-send cycle: ranks 0 and 1 each wait to send to the other"]),
    ("ring_attention_rotate", "ring_attention_rotate_v_like_k", (2,), "wrong",
     ["k float64[3, 4], v float64[3, 2] a rank", "v: expected float64[3, 2], found float64[3, 4]",
      "v came back shaped like k, [3, 4], not [3, 2]", "receive it into torch.empty_like(v)"]),
    ("ring_attention_rotate", "ring_attention_rotate_gathers_once", (2,), "wrong",     # right blocks, no ring
     ["rank 0: after rotation 2 of 2 this rank holds the right block (rank 0's), but rotation 2 sent 0 bytes "
      "in 0 messages", "(a rotation sends the block it was handed, k and v, 96 bytes, once, to rank r + 1 = 1",
      "each rank holds one travelling block, never all N)"]),
    ("ring_attention_merge", "ring_attention_merge_no_rescale", None, "wrong",
     ["o / l wrong after merging block 4 of 4 (block 1 folded in by the grader)",
      "this is the merge without its rescale", "multiply the old l and o by exp(m - m')"]),
    # one block from the empty state: exp(s) alone is exact until the scores pass 709
    ("ring_attention_merge", "ring_attention_merge_no_max", (1,), "wrong",
     ["o / l wrong after merging block 1 of 1 (R = 3 query rows, blocks of 3 keys, v of width 2; scores as "
      "large as 5411.1)", "received [nan, nan, nan", "exp of a score overflows float64 past 709.8",
      "exponentiate s - m', never s"]),
]


@pytest.mark.parametrize("name,wrong,worlds,reason,words", WRONG_CASES, ids=[c[1] for c in WRONG_CASES])
def test_wrong_step_is_told_why(name, wrong, worlds, reason, words):
    told_why(name, wrong, worlds, reason, words)


def test_each_step_s_solution_passes_and_names_the_next_step():
    first = grade("ring_attention_rotate", str(SOLUTIONS / "ring_attention_rotate.py"), quick=True,
                  world_sizes=(1, 2, 3))
    assert first.passed, first.text
    assert "correct in all 12 cases on worlds of 1, 2, 3 ranks" in first.text     # 4 blocks x 3 worlds
    assert "each rank sent at most 98304 bytes in 6 messages; N rotations of the ring needs N x 32768" in first.text
    assert first.text.endswith("Step 1 of 3 of ring_attention done. Next: python -m tutorials.exercises.grade "
                               "ring_attention --step 2 (ring_attention_merge).")
    second = grade("ring_attention_merge", str(SOLUTIONS / "ring_attention_merge.py"), quick=True)
    assert second.passed, second.text
    # runs of 1, 2, 3, 4 blocks, the first of each longer run folded in by the grader: 1 + 1 + 2 + 3
    # merges, on 3 shapes
    assert "after all 21 merges (runs of 1, 2, 3, 4 blocks, scores up to the thousands)" in second.text
    assert second.text.endswith("Next: python -m tutorials.exercises.grade ring_attention --step 3 (ring_attention).")


def test_adding_exp_s_to_a_state_kept_under_a_maximum_is_named():
    verdict = grade("ring_attention_merge", str(WRONG / "ring_attention_merge_no_max.py"), quick=True,
                    world_sizes=(2,))
    assert verdict.reason == "wrong", verdict.text
    assert "o / l wrong after merging block 2 of 2 (block 1 folded in by the grader)" in verdict.text
    assert "this adds exp(s), not exp(s - m')" in verdict.text


def test_a_merge_that_keeps_the_blocks_instead_of_the_state_fails(tmp_path):
    keeper = tmp_path / "keeper.py"
    keeper.write_text("import torch\n\nSEEN = []\n\n\ndef ring_attention_merge(o, m, l, s, v):\n"
                      "    if bool(torch.isinf(m).all()):\n        SEEN.clear()\n    SEEN.append((s, v))\n"
                      "    scores, values = torch.cat([b[0] for b in SEEN], -1), torch.cat([b[1] for b in SEEN])\n"
                      "    m_new = scores.amax(-1)\n    p = torch.exp(scores - m_new.unsqueeze(-1))\n"
                      "    return p @ values, m_new, p.sum(-1)\n")
    verdict = grade("ring_attention_merge", str(keeper), quick=True)
    assert verdict.reason == "wrong", verdict.text
    assert verdict.text.startswith("FAIL ring_attention_merge: o / l wrong after merging block 2 of 2 (block 1 "
                                   "folded in by the grader)")


def test_the_library_is_switched_off_for_the_merge(tmp_path):
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("from collectives.parallel.ring_attention import start_online_softmax\n\n\n"
                      "def ring_attention_merge(o, m, l, s, v):\n    start_online_softmax(s, s, v)\n"
                      "    return o, m, l\n")
    verdict = grade("ring_attention_merge", str(sneaky), quick=True)
    assert verdict.reason == "builtin", verdict.text
    assert ("it calls collectives.parallel.ring_attention.start_online_softmax (line 5 of sneaky.py: "
            "start_online_softmax(s, s, v))") in verdict.text


def test_steps_on_the_command_line(capsys):
    assert main(["ring_attention", "--step", "2"]) == 1     # the stub, graded in this process
    assert capsys.readouterr().out.startswith("NOT WRITTEN ring_attention_merge:")
    assert main(["ring_attention", "--step", "1", "--worlds", "1"]) == 1
    assert capsys.readouterr().out.startswith("NOT WRITTEN ring_attention_rotate:")
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ring_attention "))
    assert lines[at + 1].split()[:6] == ["--step", "1", "20", "*..", "15", "min"]
    assert "ring_attention_rotate: Post the four messages together in one dist.batch_isend_irecv" in lines[at + 1]
    assert lines[at + 2].split()[:6] == ["--step", "2", "20", "**.", "20", "min"]
    assert "ring_attention_merge: Rescale what was summed under the old maximum." in lines[at + 2]


def test_a_state_of_the_wrong_shape_is_named(tmp_path):
    keepdim = tmp_path / "keepdim.py"
    keepdim.write_text("import torch\n\n\ndef ring_attention_merge(o, m, l, s, v):\n"
                       "    m_new = torch.maximum(m.unsqueeze(-1), s.amax(-1, keepdim=True))\n"
                       "    p, fade = torch.exp(s - m_new), torch.exp(m.unsqueeze(-1) - m_new)\n"
                       "    return o * fade + p @ v, m_new, l.unsqueeze(-1) * fade + p.sum(-1, keepdim=True)\n")
    verdict = grade("ring_attention_merge", str(keepdim), quick=True)
    assert verdict.reason == "wrong", verdict.text
    assert ("returned o float64[2, 3], m float64[2, 1], l float64[2, 1] after merging block 1 of 1" in verdict.text
            and "the state is o float64[2, 3], m and l float64[2] (one value per query row: no keepdim)"
            in verdict.text)


def test_a_merge_that_writes_into_the_block_s_scores_is_told(tmp_path):
    in_place = tmp_path / "in_place.py"
    in_place.write_text("import torch\n\n\ndef ring_attention_merge(o, m, l, s, v):\n"
                        "    m_new = torch.maximum(m, s.amax(-1))\n    p = s.sub_(m_new.unsqueeze(-1)).exp_()\n"
                        "    fade = torch.exp(m - m_new)\n"
                        "    return o * fade.unsqueeze(-1) + p @ v, m_new, l * fade + p.sum(-1)\n")
    verdict = grade("ring_attention_merge", str(in_place), quick=True)
    assert verdict.reason == "changed_input", verdict.text
    assert verdict.text.startswith("FAIL ring_attention_merge: it changes its input after merging block 1 of 1")
    assert "s held [" in verdict.text and "s and v are read, never written" in verdict.text
