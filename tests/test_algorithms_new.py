"""PAT and Bine (issue 34): the properties of their schedules that the cards state, and the
bounded aggregation, which the registry-driven tests (test_collectives, test_traffic,
test_sim, test_memory) never reach because their calls are small.

The sums themselves are checked against torch by test_collectives.py on the real door and
in the simulator by test_sim.py, as for every registered algorithm.
"""
import pytest

from collectives.algorithms import all_gather_pat as pat
from collectives.algorithms import broadcast_bine as bine
from collectives.algorithms import all_gather_bine, gather_bine
from collectives.algorithms import reduce_scatter_pat as pat_rs
from collectives.algorithms._util import ceil_log2

from .test_sim import check_case


def aggregations(n):
    p = 1 << ceil_log2(n)
    return [1 << i for i in range(p.bit_length())]


@pytest.mark.parametrize("n", list(range(1, 34)) + [63, 64, 65, 100, 128, 130])
def test_pat_every_block_arrives_once_from_a_rank_that_holds_it(n):
    for a in aggregations(n):
        held = {0}
        for d, sent, got in pat.schedule(n, a):
            assert all(x in held for x in sent), (n, a, d)
            assert not held & set(got), (n, a, d)
            assert [g - x for g, x in zip(got, sent)] == [d] * len(got)
            assert len(sent) <= max(1, a // 2)
            held |= set(got)
        assert held == set(range(n)), (n, a)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 64, 100])
def test_pat_steps_are_log_when_aggregated_fully_and_n_minus_1_when_not(n):
    p = 1 << ceil_log2(n)
    assert len(pat.schedule(n, p)) == ceil_log2(n)
    assert len(pat.schedule(n, 1)) == n - 1
    # far hops first inside the one window
    distances = [d for d, _, _ in pat.schedule(n, p)]
    assert distances == sorted(distances, reverse=True)


def test_pat_aggregation_is_bounded_by_agg_bytes():
    assert pat.aggregation(64, 0) == 64                    # empty blocks: one window
    assert pat.aggregation(64, 1024) == 64                 # 32 blocks of 1 KiB fit in 1 MiB
    assert pat.aggregation(64, 64 << 10) == 32             # 16 blocks of 64 KiB
    assert pat.aggregation(64, 4 << 20) == 2               # a block over the bound: one per message
    for n in (5, 64, 1000):
        for block in (1, 100, 4096, 1 << 20, 1 << 24):
            a = pat.aggregation(n, block)
            assert max(len(s) for _, s, _ in pat.schedule(n, a)) * block <= max(pat.AGG_BYTES, block)


@pytest.mark.parametrize("n", [7, 64, 100, 1000, 4096])
def test_pat_reduce_scatter_pool_is_a_window_plus_a_log(n):
    # the point of PAT's order: partial results of one window and its root's ancestors only
    for a in aggregations(n)[:-1]:
        w = -(-n // a)
        assert pat_rs.pool_slots(n, a) <= a + ceil_log2(w), (n, a)


@pytest.mark.parametrize("limit", [1, 60, 1000])
@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_pat_bounded_aggregation_in_the_simulator(monkeypatch, collective, limit):
    # a small bound makes 7- and 100-element blocks travel in windows: results against the
    # closed form and traffic against cost(), as test_sim checks every algorithm
    monkeypatch.setattr(pat, "AGG_BYTES", limit)
    for n in list(range(1, 18)) + [31, 33]:
        for e in (7, 100):
            check_case(collective, "pat", n, e)


@pytest.mark.parametrize("n", list(range(1, 34)) + [64, 100, 128, 129])
def test_bine_tree_spans_every_rank_in_ceil_log2_steps(n):
    for far_first in (True, False):
        for root in sorted({0, min(1, n - 1), n // 2, n - 1}):
            parent = bine.tree(n, root, far_first)
            assert set(parent) == set(range(n)) - {root}
            steps = [k for _, k in parent.values()]
            assert max(steps, default=-1) + 1 == ceil_log2(n)
            for v in parent:            # a parent holds the data before it sends it
                q, k = parent[v]
                assert q == root or parent[q][1] < k
            sends = [(q, k) for q, k in parent.values()]
            assert len(sends) == len(set(sends)), "a rank sends one message per step"


@pytest.mark.parametrize("p", [8, 16, 32, 64, 128])
def test_bine_hops_are_shorter_than_the_binomial_trees(p):
    # on a ring of p ranks the Bine tree's edges span fewer hops in all than the binomial's
    def hops(a, b):
        d = (a - b) % p
        return min(d, p - d)
    bine_hops = sum(hops(v, q) for v, (q, _) in bine.tree(p, 0).items())
    binomial = sum(hops(v, v - (v & -v)) for v in range(1, p))
    assert bine_hops < binomial


@pytest.mark.parametrize("n", list(range(1, 34)) + [64, 100, 128])
def test_bine_gather_layout_makes_every_subtree_one_range(n):
    # gather_bine and scatter_bine send a subtree's pieces as one slice of the pre-order buffer
    for root in sorted({0, min(1, n - 1), n // 2, n - 1}):
        order, index, size = gather_bine.layout(n, root)
        assert sorted(order) == list(range(n)) and order[0] == root
        parent = bine.tree(n, root)
        for q in order:
            below, v = set(), None
            for v in parent:                 # v is below q if q is on its way to the root
                u = v
                while u != root and u != q:
                    u = parent[u][0]
                if u == q:
                    below.add(v)
            assert set(order[index[q]:index[q] + size[q]]) == below | {q}, (n, root, q)
            if n & (n - 1) == 0:             # the card: on a power of two, a run of ranks (mod N)
                assert any({(a + i) % n for i in range(size[q])} == below | {q} for a in below | {q})


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 128])
def test_bine_all_gather_sends_its_half_of_the_output_to_a_neighbour(n):
    # the card: the largest (last) step of all_gather_bine (and the first of
    # reduce_scatter_bine, the same exchanges reversed) is between neighbours, where
    # recursive doubling's is n/2 ranks apart
    last = max(step for step, _, _, _ in all_gather_bine.exchanges(n))
    for step, v, q, (lo, hi) in all_gather_bine.exchanges(n):
        assert (hi - lo == n // 2) == (step == last), (n, step, v, q)
        if step == last:
            assert (v - q) % n in (1, n - 1), (n, v, q)


def test_paper_claims_bine_and_pat_run_small(capsys):
    from benchmarks import paper_claims
    paper_claims.main(["--claim", "bine,pat", "--bine-ranks", "16", "--bine-roots", "2",
                       "--pat-ranks", "8", "--pat-sizes", "1K,64K", "--pat-topologies", "ethernet-100g"])
    out = capsys.readouterr().out
    assert "dragonfly" in out and "crossover on ethernet-100g" in out


@pytest.mark.parametrize("n", [5, 8, 12])
def test_bine_all_reduce_float_sum_is_bitwise_equal_on_every_rank(n):
    import torch

    from collectives.algorithms import all_reduce_bine
    from collectives.sim import simulate

    from .test_new_algorithms import random_inputs
    r = simulate("all_reduce", random_inputs(all_reduce_bine.all_reduce), n, 4 * 1000, device="cpu", check=False)
    first = r.outputs[0][0]
    assert all(torch.equal(out, first) for (out,) in r.outputs)
    want = sum(torch.randn(1000, generator=torch.Generator().manual_seed(1000 + q)) * 10 ** (q % 7)
               for q in range(n))
    torch.testing.assert_close(first, want, rtol=1e-5, atol=n)
