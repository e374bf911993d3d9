"""Refusals that only a message can reveal arrive on every rank at once.

A rank whose own arguments look fine cannot know that a peer's differ; when the
algorithm needs them to agree, the ranks exchange what they hold first, and
every rank raises the same ValueError well before COLLECTIVES_TIMEOUT.
"""
import time

import pytest
import torch

import collectives
from tests.worlds import run_world

TIMEOUT = "20"   # COLLECTIVES_TIMEOUT: the refusals must come long before it
FAST = 10.0      # seconds: far below the timeout, generous on a loaded 2-core machine


def _attempt(fn):
    start = time.monotonic()
    try:
        fn()
        return "ok", time.monotonic() - start, ""
    except Exception as exc:
        return type(exc).__name__, time.monotonic() - start, str(exc)


# piece sizes per rank (one list per rank, what rank r sends to each rank)
# case: (sizes, the ranks the error names)
BRUCK_CASES = {
    "rank0_uneven": ([[2, 3], [3, 3]], "rank 0 "),
    # rank 1's 3s land in every rank's outputs, so every rank holds uneven pieces
    "every_rank_receives_uneven": ([[2, 2, 2], [3, 3, 3], [2, 2, 2]], "ranks [0, 1, 2]"),
    "one_rank_of_three": ([[1, 1, 1], [1, 1, 1], [1, 0, 1]], "ranks [1, 2]"),
}


def _bruck_world(rank, world_size, sizes):
    torch.set_num_threads(1)
    ins = [torch.full((k,), float(10 * rank + j)) for j, k in enumerate(sizes[rank])]
    outs = [torch.zeros(sizes[j][rank]) for j in range(world_size)]
    return _attempt(lambda: collectives.all_to_all(outs, ins, algorithm="bruck"))


@pytest.mark.parametrize("case", sorted(BRUCK_CASES))
def test_bruck_uneven_pieces_refused_on_every_rank(case):
    sizes, named = BRUCK_CASES[case]
    results = run_world(_bruck_world, len(sizes), sizes, timeout=120,
                        env={"COLLECTIVES_TIMEOUT": TIMEOUT})
    texts = {text for _, _, text in results}
    assert len(texts) == 1, texts           # the same words on every rank
    for kind, seconds, text in results:
        assert kind == "ValueError", (kind, text)
        assert "algorithm='bruck' needs pieces of one size" in text
        assert seconds < FAST, seconds
    assert f"they differ on {named}" in text, text


def _bruck_even_world(rank, world_size):
    torch.set_num_threads(1)
    ins = [torch.full((3,), float(10 * rank + j)) for j in range(world_size)]
    outs = [torch.zeros(3) for _ in range(world_size)]
    collectives.all_to_all(outs, ins, algorithm="bruck")
    return [o[0].item() for o in outs]


@pytest.mark.parametrize("n", [1, 3])
def test_bruck_even_pieces_still_work(n):
    for rank, got in enumerate(run_world(_bruck_even_world, n, timeout=120)):
        assert got == [10.0 * j + rank for j in range(n)]
