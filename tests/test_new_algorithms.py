"""The newest algorithms' schedules (issue 34): properties of the peers their papers
prove, checked for every size the simulator tests run (the sums themselves are checked
on the door by test_collectives.py and in the simulator by test_sim.py, as for every
registered algorithm)."""
import pytest
import torch

from collectives.algorithms import all_reduce_swing as swing
from collectives.sim import simulate


def test_swing_distances_are_the_papers():
    # rho(k) = sum_{i<=k} (-2)^i (De Sensi et al., NSDI'24)
    assert [swing.rho(k) for k in range(6)] == [1, -1, 3, -5, 11, -21]


@pytest.mark.parametrize("p", [2, 4, 8, 16, 32, 64, 128])
def test_swing_peers_pair_up_and_reach_every_rank_exactly_once(p):
    reached = [{v} for v in range(p)]
    for k in range(p.bit_length() - 1):
        peers = [swing.peer(v, k, p) for v in range(p)]
        assert all(peers[peers[v]] == v and peers[v] != v for v in range(p))
        # disjoint: no tensor is combined twice into one rank's result
        assert all(not (reached[v] & reached[peers[v]]) for v in range(p))
        reached = [reached[v] | reached[peers[v]] for v in range(p)]
    assert all(r == set(range(p)) for r in reached)


@pytest.mark.parametrize("p", [8, 16, 32, 64])
def test_swing_hops_are_shorter_than_recursive_doublings_on_a_ring(p):
    # the point of Swing: on a ring (one torus dimension) of p ranks, the step-k peer is
    # |rho(k)| <= 2^k hops away, while recursive doubling's is 2^k (the last step: p/2)
    def hops(d):
        d %= p
        return min(d, p - d)
    sw = sum(hops(swing.peer(0, k, p)) for k in range(p.bit_length() - 1))
    rd = sum(hops(1 << k) for k in range(p.bit_length() - 1))
    assert sw < rd


def test_paper_claims_benchmark_runs_on_a_small_torus(capsys):
    from benchmarks import paper_claims
    paper_claims.main(["--claim", "swing", "--dims", "2x4", "-s", "0,4K"])
    out = capsys.readouterr().out
    assert "torus 2x4 (8 ranks)" in out and len(out.splitlines()) == 4


def random_inputs(algorithm):
    """``algorithm`` called on random float32 data (seeded by rank) instead of the
    simulator's small integers, whose sums are exact in any order."""
    def call(comm, tensor, op):
        g = torch.Generator().manual_seed(1000 + comm.rank)
        tensor.copy_(torch.randn(tensor.shape, generator=g, dtype=tensor.dtype) * 10 ** (comm.rank % 7))
        algorithm(comm, tensor, op)
    return call


@pytest.mark.parametrize("n", [8, 12, 16])
@pytest.mark.parametrize("elements", [1, 7, 1000])
def test_swing_float_sum_is_bitwise_equal_on_every_rank(n, elements):
    # the simulator runs the unchanged algorithm on real tensors; the magnitudes differ
    # by rank (10^0 .. 10^6) so that any two orders of summation round differently
    r = simulate("all_reduce", random_inputs(swing.all_reduce), n, 4 * elements, device="cpu", check=False)
    first = r.outputs[0][0]
    for rank, (out,) in enumerate(r.outputs):
        assert torch.equal(out, first), f"rank {rank} differs from rank 0"
    want = sum(torch.randn(elements, generator=torch.Generator().manual_seed(1000 + q)) * 10 ** (q % 7)
               for q in range(n))
    # float32 rounding of terms up to 10^6: absolute error about n * 10^6 * 2^-24
    torch.testing.assert_close(first, want, rtol=1e-5, atol=n)


@pytest.mark.parametrize("p", [2, 4, 8, 16, 32, 64, 128, 256])
def test_swing_reached_sets_are_contiguous_runs_in_slot_order(p):
    # the bandwidth variant sends one slice per step only because every R(v, k) is a run
    assert sorted(swing.slots(p)) == list(range(p))
    for k in range(p.bit_length()):
        for v in range(p):
            lo, hi = swing.run(v, k, p)
            assert hi - lo == len(swing.reached(v, k, p)) == p >> k
