"""``Cost.total_messages``: the messages of one whole call, every rank together, exactly
(issue 34, item 8: the simulator's progress line says "messages X of Y" with it).

``Cost.messages`` is the busiest rank's count; N times it is the whole call's only where every
rank sends alike (a ring on enough elements). Here every registered algorithm runs in the
simulator (``meta`` tensors: only the traffic counts) at N = 1, 2, 3, 5, 8 and 12, on sizes of
0 elements, fewer elements than ranks, uneven pieces, and for all_reduce and broadcast sizes
large enough that pipelines cut segments and Rabenseifner sends block by block, with roots
0, N // 2 and N - 1 where the collective has one: the messages its ranks sent, all together,
must equal ``cost().total_messages``. (tests/test_sim.py and tests/test_traffic.py check the
busiest rank's figures the same way.)
"""
import pytest

from collectives import observers
from collectives.algorithms import cost
from collectives.sim import simulate
from collectives.sim.collective import ROOTED
from tests.test_sim import CASES, ELEM, LARGE, SIZES, nbytes   # the sizes and cases test_sim.py runs

WORLDS = (1, 2, 3, 5, 8, 12)
BIG = ("all_reduce", "broadcast")            # LARGE sizes: segments, Rabenseifner's blocks


def roots(collective, n):
    return sorted({0, n // 2, n - 1}) if collective in ROOTED else [0]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_the_messages_the_simulator_moves_are_cost_total_messages(collective, algorithm):
    for n in WORLDS:
        for e in SIZES + (LARGE if collective in BIG else ()):
            if collective == "barrier" and e:
                continue
            for root in roots(collective, n):
                with observers.trace() as records:
                    r = simulate(collective, algorithm, n, nbytes(collective, n, e), root=root,
                                 device="meta", topology="ethernet-100g")
                sent = sum(x["sent_messages"] for x in r.ranks)
                where = f"{collective}/{algorithm} N={n} root={root} elements={e}"
                assert sent == sum(x["recv_messages"] for x in r.ranks), where
                assert sent == sum(m.kind == "send" for m in records.messages), where
                assert cost(collective, algorithm, n, r.bytes, ELEM).total_messages == sent, where


def test_total_messages_is_every_rank_together_not_n_times_the_busiest():
    """A binomial tree's root sends log N messages, its leaves none: N - 1 in all, fewer than
    N x the busiest rank's; a ring's ranks send alike: the two agree."""
    tree = cost("broadcast", "binomial_tree", 8, 4096, ELEM)
    assert (tree.messages, tree.total_messages) == (3, 7)
    ring = cost("all_reduce", "ring", 8, 4096, ELEM)
    assert ring.total_messages == 8 * ring.messages == 2 * 8 * 7
    assert cost("all_reduce", "ring", 1, 4096, ELEM).total_messages == 0
