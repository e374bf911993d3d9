"""The grader on the exercises of chapters 17, 19 and 20: each wrong solution fails with words a
learner can act on (the reference solutions pass in tests/test_exercises.py, which grades every
exercise in EXERCISES)."""
import pytest

from tutorials.exercises.grade import HERE, grade

WRONG = HERE / "wrong"

# (exercise, wrong file, world sizes that show the mistake, reason, words the verdict must contain)
WRONG_CASES = [
    ("tensor_parallel_mlp", "tensor_parallel_mlp_no_f", (2,), "wrong",
     ["wrong result with 2 ranks", "x.grad: expected", "x.grad holds only this rank's part",
      "must all_reduce the gradient in its backward"]),
    ("tensor_parallel_mlp", "tensor_parallel_mlp_gather", (3,), "traffic",
     ["correct, but sends 896000 bytes (rank 0) where Megatron's f and g on the ring sends "
      "2 x 2(N-1)/N x S = 716800 bytes", "see chapter 17"]),
    ("moe_dispatch", "moe_dispatch_padded", (3,), "traffic",
     ["correct, but sends 537632 bytes (rank 0) where the dispatch sends at most 250768 bytes",
      "no padding", "see chapter 19"]),
    ("moe_dispatch", "moe_dispatch_drops_own", (2,), "wrong",
     ["rank 0: received: expected float64[2, 3], found float64[0, 3]",
      "the tokens rank 0 routes to its own expert stay here",
      "The test values: a token holds 100000 x its rank + 100 x its row + its column"]),
    ("ring_attention", "ring_attention_no_rescale", (2,), "wrong",
     ["wrong result with 2 ranks", "rank 0: out: expected", "the online softmax without its rescale",
      "by exp(m - m_new)"]),
    ("ring_attention", "ring_attention_gather_all", (3,), "traffic",
     ["correct, but sends 98304 bytes (rank 0) where ring attention sends 2(N-1) x S/N x d x 8 = 65536 bytes",
      "see chapter 20"]),
]


@pytest.mark.parametrize("name,wrong,worlds,reason,words", WRONG_CASES, ids=[c[1] for c in WRONG_CASES])
def test_wrong_solution_is_told_why(name, wrong, worlds, reason, words):
    # none of these deadlock: the default 15 s without progress, not 3, so that a loaded machine
    # (each case computes before its first message) is not mistaken for a stuck one
    verdict = grade(name, str(WRONG / f"{wrong}.py"), quick=True, world_sizes=worlds)
    assert not verdict.passed
    assert verdict.reason == reason, verdict.text
    for w in words:
        assert w in verdict.text, f"{w!r} not in:\n{verdict.text}"
