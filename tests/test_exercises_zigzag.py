"""The grader on chapter 20's zig-zag exercise: the right answer computed with the fully masked
blocks (twice the work) fails on its work, the contiguous layout and an off-by-one mirror chunk
fail on their numbers with the mistake named, the library's zigzag_ring_attention is switched off,
blocking sends deadlock, and collecting every chunk first fails on memory (the reference solution passes in
tests/test_exercises.py, which grades every exercise in EXERCISES)."""
import math

import pytest
import torch
import torch.nn.functional as F

from tutorials.exercises._checks_zigzag import _macs
from tutorials.exercises.grade import HERE, grade

WRONG = HERE / "wrong"

# (exercise, wrong file, world sizes that show the mistake, reason, words the verdict must contain)
WRONG_CASES = [
    ("ring_attention_zigzag", "ring_attention_zigzag_no_skip", (2,), "work",
     ["correct, but rank 0 computed 8 blocks' worth of attention products", "zig-zag computes 2N + 1 = 5 on "
      "every rank", "skip it, do not compute it and mask it", "Blocks per rank: rank 0: 8, rank 1: 8.",
      "See chapter 20", "failed on 2 (work)"]),
    ("ring_attention_zigzag", "ring_attention_zigzag_contiguous", (2,), "wrong",
     ["wrong result with 2 ranks", "rank 1: out: expected", "the contiguous layout; here rank 1 holds chunks 1 "
      "and 2 of 2N = 4"]),
    ("ring_attention_zigzag", "ring_attention_zigzag_library", (2,), "builtin",
     ["it calls collectives.parallel.ring_attention_zigzag.zigzag_ring_attention",
      "line 6 of ring_attention_zigzag_library.py"]),
    ("ring_attention_zigzag", "ring_attention_zigzag_mirror_off_by_one", (2,), "wrong",
     ["wrong result with 2 ranks", "rank 0: out: [", "  ok", "the rows of chunk 1's queries (positions 1 to 1) are "
      "right, those of chunk 2 (positions 2 to 2) wrong", "rank r's second chunk is 2N-1-r"]),
    ("ring_attention_zigzag", "ring_attention_zigzag_blocking_send", (2,), "deadlock",
     ["rank 0: in dist.send(dst=1) of float64[2, 3]", "rank 1: in dist.send(dst=0)",
      "A send-send cycle: ranks 0 and 1 each wait to send to the other"]),
    ("ring_attention_zigzag", "ring_attention_zigzag_gathers_all", (4,), "schedule",
     ["correct, but rank 0 held the keys or values of 3 other ranks at once (4 ranks", "the ring holds at most two"]),
]


@pytest.mark.parametrize("name,wrong,worlds,reason,words", WRONG_CASES, ids=[c[1] for c in WRONG_CASES])
def test_wrong_solution_is_told_why(name, wrong, worlds, reason, words):
    verdict = grade(name, str(WRONG / f"{wrong}.py"), quick=True, world_sizes=worlds)
    assert not verdict.passed
    assert verdict.reason == reason, verdict.text
    for w in words:
        assert w in verdict.text, f"{w!r} not in:\n{verdict.text}"


def test_work_hidden_from_the_counter_fails_too(tmp_path):
    """Scores from elementwise products and sums are right, and invisible to the work counter: the
    counter's floor (half of 2N + 1 blocks) fails them rather than letting them pass unmeasured."""
    text = (HERE / "solutions" / "ring_attention_zigzag.py").read_text()
    hidden = text.replace("s = q @ k.T /", "s = (q.unsqueeze(1) * k.unsqueeze(0)).sum(-1) /").replace(
        "add_(p @ v)", "add_((p.unsqueeze(-1) * v.unsqueeze(0)).sum(1))")
    assert hidden.count("unsqueeze(0)") == 2
    (tmp_path / "hidden.py").write_text(hidden)
    verdict = grade("ring_attention_zigzag", str(tmp_path / "hidden.py"), quick=True, world_sizes=(2,))
    assert verdict.reason == "work", verdict.text
    assert "rank 0 computed 0 blocks' worth of matrix products where zig-zag computes 2N + 1 = 5" in verdict.text
    assert "not with elementwise products and sums" in verdict.text


def test_the_work_counted_is_every_form_of_matrix_product():
    """The work rule counts multiply-adds however the product is spelled: a solution cannot step
    around it with einsum, bmm or the fused attention."""
    a, b = torch.ones(2, 5, 3), torch.ones(2, 3, 4)
    q, k, v = torch.ones(1, 2, 5, 3), torch.ones(1, 2, 7, 3), torch.ones(1, 2, 7, 6)
    counted = {
        "@": (torch.Tensor.__matmul__, (a[0], b[0]), 5 * 3 * 4),
        "rmatmul": (torch.Tensor.__rmatmul__, (b[0], a[0]), 5 * 3 * 4),
        "matmul batched": (torch.matmul, (a, b), 2 * 5 * 3 * 4),
        "matmul broadcast": (torch.matmul, (a, b[0]), 2 * 5 * 3 * 4),
        "mm": (torch.mm, (a[0], b[0]), 60),
        "bmm": (torch.bmm, (a, b), 120),
        "einsum": (torch.einsum, ("bik,bkj->bij", a, b), 120),
        "einsum list": (torch.einsum, ("ik,kj->ij", [a[0], b[0]]), 60),
        "sdpa": (F.scaled_dot_product_attention, (q, k, v), 2 * 5 * 7 * (3 + 6)),
        "matrix-vector": (torch.matmul, (a[0], b[0, :, 0]), 15),
        "elementwise": (torch.mul, (a, a), 0),
    }
    for what, (func, args, macs) in counted.items():
        assert _macs(func, args, {}) == macs, what
    assert math.prod((2, 5, 3, 4)) == _macs(torch.baddbmm, (torch.zeros(2, 5, 4), a, b), {})
