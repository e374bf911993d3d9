"""The simulator against SimGrid 3.32 (``benchmarks.sim_vs_simgrid``): the same schedules, the
same links and routes, the alpha-beta model with max-min sharing on both sides.

Tolerance, and why: where every flow that shares a link has the same route latency (a flat
switch, the fat tree, whose routes all cost alpha; a torus ring, whose flows never share a
link), SimGrid's CM02 shares links exactly as ours does, so each rank's end time must agree to
rounding: 1e-9 relative (SimGrid runs here with its time precision at 1e-13 s; the worst
difference measured by ``python -m benchmarks.sim_vs_simgrid`` on flat and fat tree was 4e-15). Where flows of different route latencies share a link (a torus, whose
routes cost 0.1 us more per hop), CM02 weights each flow's share by 1 / its latency (TCP's
round-trip unfairness) and ours does not: there the test only bounds the difference, and
states it (``test_torus_shares_differ_by_latency_weighting``). The same holds in a perturbed
world (a slow host, a late rank, a slow NIC: ``job`` hands each to SimGrid): exact where the
flows sharing a link have equal latencies, and where a slow host's longer latency shares a
link with others, the difference CM02's weighting makes, in closed form
(``test_a_slow_hosts_longer_latency_loses_it_a_share_in_simgrid``).
"""
import pytest

from benchmarks import sim_vs_simgrid as peer

OK, WHY = peer.available()
if not OK:
    pytest.skip(f"SimGrid: {WHY}", allow_module_level=True)

from collectives.sim import simulate  # noqa: E402

from .test_sim_model import flows  # noqa: E402  (every rank posts the listed messages at once)

EXACT = 1e-9


def agree(spec, n, collective, algorithm, nbytes):
    r = simulate(collective, algorithm, n, nbytes, spec, schedule=True, check=False)
    ours = [x["time"] for x in r.ranks]
    theirs = peer.play(spec, n, r.schedule)
    return ours, theirs


@pytest.mark.parametrize("topology", ["flat", "fat-tree"])
@pytest.mark.parametrize("collective, algorithm", peer.CASES)
@pytest.mark.parametrize("n, nbytes", [(5, 4096), (8, 1 << 20)])
def test_every_rank_ends_when_simgrid_says(topology, collective, algorithm, n, nbytes):
    ours, theirs = agree(peer.spec_for(topology, n), n, collective, algorithm, nbytes)
    assert ours == pytest.approx(theirs, rel=EXACT, abs=0)


def test_torus_ring_agrees_exactly():
    ours, theirs = agree(peer.spec_for("torus", 8), 8, "all_reduce", "ring", 1 << 20)
    assert ours == pytest.approx(theirs, rel=EXACT, abs=0)


def test_torus_shares_differ_by_latency_weighting():
    """Linear broadcast on a 2x2 torus: flows to ranks 1 (1 hop, 1.1 us) and 3 (2 hops, 1.2 us)
    share the root's +x link. Ours: half each. CM02: in proportion to 1/1.1 and 1/1.2, so rank
    1's message lands sooner there; the last message, and so the call, end together."""
    ours, theirs = agree(peer.spec_for("torus", 4), 4, "broadcast", "linear", 4096)
    assert max(ours) == pytest.approx(max(theirs), rel=EXACT)
    b, size = 6.8e9, 4096
    moved = 0.1e-6 * b                                  # rank 1's bytes before rank 3's flow joins
    share = (1 / 1.1) / (1 / 1.1 + 1 / 1.2)             # CM02's share for the 1.1 us flow
    assert theirs[1] == pytest.approx(1.2e-6 + (size - moved) / (share * b), rel=EXACT)
    assert ours[1] == pytest.approx(1.2e-6 + (size - moved) / (b / 2), rel=EXACT)


@pytest.mark.parametrize("name, n, pairs, sizes", [
    # three flows over two links that differ (tests/test_sim_model.py): a gets 3/4 of X
    ("two links", 6, [(0, 1), (0, 3), (2, 4)], None),
    # a change passed on along a chain of links
    ("chain", 6, [(0, 1), (3, 1), (2, 1), (2, 4)], [1 << 14, 1 << 14, 1 << 16, 1 << 16]),
    # everyone to everyone through oversubscribed uplinks, of uneven sizes
    ("crowd", 8, [(s, d) for s in range(8) for d in range(8) if s != d],
     [1 << (10 + (s * 3 + d) % 7) for s in range(8) for d in range(8) if s != d]),
])
def test_max_min_sharing_agrees_with_simgrid(name, n, pairs, sizes):
    spec = dict(peer.spec_for("fat-tree", n), ranks_per_leaf=3, oversubscription=6)
    ours, theirs = agree(spec, n, "all_reduce", flows(pairs, sizes), 1 << 18)
    assert ours == pytest.approx(theirs, rel=EXACT, abs=0)


PERTURBED = dict(stragglers={2: 2.0}, delays={0: 3e-6}, slow_links={4: 4.0})


@pytest.mark.parametrize("algorithm, nbytes", [("ring", 4096), ("recursive_doubling", 1 << 20)])
def test_a_perturbed_world_ends_when_simgrid_says(algorithm, nbytes):
    """A slow host, a late rank and a slow NIC reach SimGrid (``job``): the two agree to
    rounding, and SimGrid played without the perturbation would not."""
    n, spec = 5, peer.spec_for("flat", 5)
    r = simulate("all_reduce", algorithm, n, nbytes, spec, schedule=True, **PERTURBED)
    ours = [x["time"] for x in r.ranks]
    theirs = peer.play(spec, n, r.schedule, stragglers=PERTURBED["stragglers"],
                       slow_links=PERTURBED["slow_links"])
    assert ours == pytest.approx(theirs, rel=EXACT, abs=0)
    unperturbed = peer.play(spec, n, r.schedule)          # the late rank's delay alone is in the schedule
    assert max(unperturbed) < max(theirs) * (1 - 1e-3)


def test_a_slow_hosts_longer_latency_loses_it_a_share_in_simgrid():
    """Linear broadcast of S on 4 ranks, rank 3 a host twice as slow: its message's latency is
    2 alpha, the others' alpha, and all three leave by the root's uplink. Ours shares it
    equally among the flows on it; CM02 in proportion to 1 / latency, so rank 3 gets half the
    share of each other flow there and ranks 1 and 2 end sooner. The call ends at the same time
    in both: the uplink is busy until the last byte is out."""
    n, size = 4, 1 << 20
    spec = peer.spec_for("flat", n)
    r = simulate("broadcast", "linear", n, size, spec, schedule=True, stragglers={3: 2.0})
    ours = [x["time"] for x in r.ranks]
    theirs = peer.play(spec, n, r.schedule, stragglers={3: 2.0})
    alpha, b = spec["alpha"], spec["bandwidth"]
    early = alpha * b / 2                                   # bytes each fast flow moves before rank 3's starts
    assert ours[1] == ours[2] == pytest.approx(2 * alpha + (size - early) * 3 / b, rel=EXACT)
    assert theirs[1] == theirs[2] == pytest.approx(2 * alpha + (size - early) * 2.5 / b, rel=EXACT)
    assert max(ours) == pytest.approx(max(theirs), rel=EXACT)
    assert max(ours) == pytest.approx(alpha + 3 * size / b, rel=EXACT)
