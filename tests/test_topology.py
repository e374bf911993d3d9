"""The algorithms that use the topology (issue 25): ``hierarchical`` and ``double_binary_tree``
all_reduce, Bruck's all_gather and all_to_all.

test_collectives.py, test_traffic.py and test_memory.py check every registered
algorithm on one host (our launcher sets ``LOCAL_WORLD_SIZE`` to the world
size). Here: the hierarchical all_reduce on real layouts (2x2, 3x2, 2x3, ranks
interleaved, a group of some of the world's ranks), that it moves exactly its
``cost(..., ranks_per_host)`` there and S over each host's link where the flat
ring moves 1.5 S, that a layout that does not tile the group is refused on
every rank before any message (and the group stays usable); the double binary
tree's two trees, and its pipeline with many chunks; Bruck's step counts.
"""
import json
import os

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import reduce_ops, settings
from collectives.algorithms import REGISTRY, cost
from collectives.algorithms import all_reduce_double_binary_tree as dbt
from collectives.algorithms import all_reduce_hierarchical as hier
from collectives.algorithms._util import ceil_log2
from collectives.p2p_communications import Comm

from .worlds import run_world

ELEM = 4
SIZES = (0, 1, 3, 7, 1000, 300_001)     # empty, fewer elements than ranks, uneven, several segments


# -- without a world ------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 41))
def test_double_binary_tree_is_two_spanning_trees(n):
    roots = []
    for t in range(2):
        children_of = {r: dbt.tree(n, r, t)[1] for r in range(n)}
        for r in range(n):
            parent, _ = dbt.tree(n, r, t)
            if parent is None:
                roots.append(r)
            else:
                assert r in children_of[parent], (t, r, parent)
            assert dbt.depth(n, r, t) <= ceil_log2(n), (t, r)     # reaches the root, in log N hops
        assert sum(len(c) for c in children_of.values()) == n - 1
    assert len(roots) == 2 and (n == 1 or roots[0] != roots[1])
    # complementary: with N even no rank is inner in both trees (at most 2 children in all)
    most = max(len(dbt.tree(n, r, 0)[1]) + len(dbt.tree(n, r, 1)[1]) for r in range(n))
    assert most <= (2 if n % 2 == 0 else 3)


@pytest.mark.parametrize("n", range(2, 34))
def test_bruck_takes_ceil_log2_steps_for_any_n(n):
    s = n * 64 * ELEM
    ag = cost("all_gather", "bruck", n, s, ELEM)
    assert (ag.steps, ag.messages, ag.sent_bytes) == (ceil_log2(n), ceil_log2(n), (n - 1) * s // n)
    a2a = cost("all_to_all", "bruck", n, s, ELEM)
    # and as many steps before, of 16 bytes per rank's pair, that agree on the pieces
    assert (a2a.steps, a2a.messages) == (2 * ceil_log2(n), 2 * ceil_log2(n))
    assert a2a.sent_bytes == (sum(len([i for i in range(n) if i & (1 << k)]) for k in range(ceil_log2(n))) * s // n
                              + 16 * (n - 1))


def test_hierarchical_layout():
    assert hier.layout(4, 2, ranks_per_host=2) == ([[0, 1], [2, 3]], 1, 0)
    assert hier.layout(4, 2, hosts=[0, 1, 0, 1]) == ([[0, 2], [1, 3]], 0, 1)     # interleaved
    assert hier.layout(3, 1) == ([[0, 1, 2]], 0, 1)                               # one host
    assert hier.layout(2, 1, hosts=(0, 1)) == ([[0], [1]], 1, 0)
    assert hier.layout(5, 4, ranks_per_host=2) == ([[0, 1], [2, 3], [4]], 2, 0)     # uneven
    with pytest.raises(ValueError, match="ranks_per_host must be a positive int"):
        hier.layout(4, 0, ranks_per_host=0)
    with pytest.raises(ValueError, match="names 3 ranks, the group has 4"):
        hier.layout(4, 0, hosts=[0, 0, 1])


def test_local_world_size_setting(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert settings.local_world_size() is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert settings.local_world_size() == 4
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with pytest.raises(ValueError, match=f"LOCAL_WORLD_SIZE='{bad}' is not valid: it must be a positive"):
            settings.local_world_size()


def test_hierarchical_bytes_over_the_host_links():
    """The card's figures: 2 hosts x 2 ranks send S over each host's link, where the flat
    ring sends 1.5 S over the link of each host it crosses; more hosts, 2(H-1)/H S."""
    s = 16 << 20
    c = cost("all_reduce", "hierarchical", 4, s, ELEM)     # one host: a ring's bytes
    assert c.sent_bytes == cost("all_reduce", "ring", 4, s, ELEM).sent_bytes
    two = hier.cost(4, s, ELEM, ranks_per_host=2)
    # each rank: S inside its host (reduce-scatter + all-gather of halves), S/2 across
    assert two.sent_bytes == s + s // 2


# -- in worlds ---------------------------------------------------------------------------


def expect(n, e):
    return torch.arange(e, dtype=torch.float64) * n + n * (n - 1) / 2


def check_all_reduce(rank, n, algorithm, **direct):
    """Closed-form sums over SIZES, through the API (or the algorithm itself with ``direct``)."""
    red = reduce_ops.reduction(dist.ReduceOp.SUM, torch.float64, "test")
    for e in SIZES:
        x = torch.arange(e, dtype=torch.float64) + rank
        if direct:
            REGISTRY["all_reduce"][algorithm](Comm(None, "all_reduce", algorithm), x, red, **direct)
        else:
            collectives.all_reduce(x, algorithm=algorithm)
        assert torch.equal(x, expect(n, e)), (algorithm, direct, e)
    if direct:
        return
    # a product on integers, and bitwise equal results from random floats
    y = torch.full((11,), rank + 1, dtype=torch.int64)
    collectives.all_reduce(y, op=dist.ReduceOp.PRODUCT, algorithm=algorithm)
    assert torch.equal(y, torch.full((11,), int(torch.arange(1, n + 1).prod())))
    z = torch.randn(50_003, generator=torch.Generator().manual_seed(rank))
    collectives.all_reduce(z, algorithm=algorithm)
    everyone = [torch.empty_like(z) for _ in range(n)]
    dist.all_gather(everyone, z)
    assert all(torch.equal(everyone[0], o) for o in everyone), "ranks differ bitwise"


def across(rank, host_of, fn):
    """Bytes this rank sent to ranks on other hosts, and its traffic, while ``fn`` runs."""
    with collectives.count_traffic() as t, collectives.trace() as messages:
        fn()
    crossing = sum(m.nbytes for m in messages.messages
                   if m.kind == "send" and host_of(m.dst) != host_of(m.src))
    sends = [(m.step, m.nbytes) for m in messages.messages if m.kind == "send"]
    return crossing, (t.sent_messages, t.recv_messages, t.sent_bytes, t.recv_bytes, sends)


def busiest(rows):
    largest = {}
    for *_, sends in rows:
        for step, nbytes in sends:
            largest[step] = max(largest.get(step, 0), nbytes)
    return dict(steps=len(largest), messages=max(max(r[0], r[1]) for r in rows),
                sent_bytes=max(r[2] for r in rows), recv_bytes=max(r[3] for r in rows),
                critical_bytes=sum(largest.values()))


LARGE = 1 << 20     # elements: 4 MiB, four segments


def layout_world(rank, n, local):
    torch.set_num_threads(1)
    os.environ["LOCAL_WORLD_SIZE"] = str(local)
    check_all_reduce(rank, n, "hierarchical")
    check_all_reduce(rank, n, "hierarchical", ranks_per_host=local, segment_bytes=256)
    x = lambda: torch.ones(LARGE)   # noqa: E731
    host_of = lambda g: g // local  # noqa: E731
    out = {"hier": across(rank, host_of, lambda: collectives.all_reduce(x(), algorithm="hierarchical")),
           "ring": across(rank, host_of, lambda: collectives.all_reduce(x(), algorithm="ring"))}
    if n == 4:
        # ranks interleaved over two hosts (0, 2 and 1, 3): the hierarchy follows the hosts
        check_all_reduce(rank, n, "hierarchical", hosts=[0, 1, 0, 1], segment_bytes=1000)
        red = reduce_ops.reduction(dist.ReduceOp.SUM, torch.float32, "test")
        out["interleaved"] = across(rank, lambda g: g % 2, lambda: REGISTRY["all_reduce"]["hierarchical"](
            Comm(None, "all_reduce", "hierarchical"), x(), red, hosts=[0, 1, 0, 1]))
        out["interleaved ring"] = across(rank, lambda g: g % 2, lambda: collectives.all_reduce(x(), algorithm="ring"))
        # groups of some of the world's ranks take their layout from their global ranks
        pair = dist.new_group([0, 2])           # hosts 0 and 1, one rank each
        three = dist.new_group([0, 1, 2])       # 2 ranks on host 0, 1 on host 1: uneven
        if rank in (0, 2):
            t = torch.arange(5.0) + rank
            collectives.all_reduce(t, group=pair, algorithm="hierarchical")
            assert torch.equal(t, 2 * torch.arange(5.0) + 2)
        if rank < 3:
            t = torch.ones(5)
            collectives.all_reduce(t, group=three, algorithm="hierarchical")
            assert torch.equal(t, torch.full((5,), 3.0))
    return out


@pytest.mark.parametrize("n,local", [(4, 2), (6, 2), (6, 3)])
def test_hierarchical_on_hosts(n, local):
    per_rank = run_world(layout_world, n, local, env={"COLLECTIVES_TIMEOUT": "20"})
    s = LARGE * ELEM
    hosts = n // local
    for name in per_rank[0]:
        rows = [r[name][1] for r in per_rank]
        host_link = [sum(r[name][0] for g, r in enumerate(per_rank) if g // local == h) for h in range(hosts)]
        slack = 4 * n * ELEM * hier.MAX_SEGMENTS    # pieces differ by an element where N does not divide
        if name == "hier":
            # exactly the stated cost for this layout, and 2(H-1)/H S over each host's link
            want = hier.cost(n, s, ELEM, ranks_per_host=local)
            assert busiest(rows) == {k: getattr(want, k) for k in busiest(rows)}
            assert all(abs(b - 2 * (hosts - 1) * s / hosts) <= slack for b in host_link), host_link
        elif name == "ring":
            # host by host, the flat ring crosses into the next host once: 2(N-1)/N S
            assert all(abs(b - 2 * (n - 1) * s / n) <= slack for b in host_link), host_link
    if n == 4:
        assert [sum(r["interleaved"][0] for g, r in enumerate(per_rank) if g % 2 == h) for h in (0, 1)] == [s, s]
        # ranks interleaved, every hop of the flat ring crosses: 2 x 1.5 S out of each host
        assert [sum(r["interleaved ring"][0] for g, r in enumerate(per_rank) if g % 2 == h)
                for h in (0, 1)] == [3 * s, 3 * s]


def refuse_world(rank, n):
    os.environ["LOCAL_WORLD_SIZE"] = "2"        # hosts of 2, 2, 1: the unpipelined scheme
    t = torch.ones(8)
    collectives.all_reduce(t, algorithm="hierarchical")
    assert torch.equal(t, torch.full((8,), 5.0))
    os.environ["LOCAL_WORLD_SIZE"] = "0"
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='0' is not valid"):
        collectives.all_reduce(torch.ones(8), algorithm="hierarchical")
    with collectives.count_traffic() as traffic, pytest.raises(ValueError, match="is not valid"):
        collectives.all_reduce(torch.ones(8), algorithm="hierarchical", async_op=True)  # at the call
    assert traffic.sent_messages == traffic.recv_messages == 0
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    t = torch.ones(8)
    collectives.all_reduce(t, algorithm="ring")  # nothing was sent: the next call pairs up
    assert torch.equal(t, torch.full((8,), 5.0))
    # algorithm=None: a measured table that names hierarchical (COLLECTIVES_TUNING_TABLE, set
    # by the test) is followed on even and uneven hosts alike
    for local, want in (("2", "hierarchical"), ("5", "hierarchical")):
        os.environ["LOCAL_WORLD_SIZE"] = local
        t = torch.ones(1024)
        with collectives.trace() as messages:
            collectives.all_reduce(t)
        assert torch.equal(t, torch.full((1024,), 5.0))
        assert {m.algorithm for m in messages.messages} == {want}, (local, messages.messages[:1])
    check_all_reduce(rank, n, "hierarchical")
    os.environ["LOCAL_WORLD_SIZE"] = "1"        # five hosts of one: a ring across hosts
    check_all_reduce(rank, n, "hierarchical", segment_bytes=512)
    return True


def test_hierarchical_uneven_hosts_and_bad_settings(tmp_path):
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"choices": {"all_reduce": {"5": [[4096, "hierarchical"]]}}}))
    env = {"COLLECTIVES_TIMEOUT": "20", "COLLECTIVES_TUNING_TABLE": str(table)}
    assert run_world(refuse_world, 5, env=env) == [True] * 5


def small_world(rank, n):
    torch.set_num_threads(1)
    check_all_reduce(rank, n, "hierarchical")
    check_all_reduce(rank, n, "hierarchical", ranks_per_host=1)
    check_all_reduce(rank, n, "double_binary_tree")
    # many chunks through the trees, and a single inbox slot per child
    check_all_reduce(rank, n, "double_binary_tree", chunk_bytes=512, depth_slots=1)
    check_all_reduce(rank, n, "double_binary_tree", chunk_bytes=4096)
    return True


@pytest.mark.parametrize("n", [1, 3, 4, 5])
def test_double_binary_tree_and_hierarchical_small_worlds(n):
    assert run_world(small_world, n, env={"COLLECTIVES_TIMEOUT": "20"}) == [True] * n


@pytest.mark.slow     # a fresh world of 4 processes through the launcher: ~40 s on 2 busy cores
def test_hierarchy_benchmark_reports_the_bytes_over_the_host_links(tmp_path, capsys):
    """benchmarks/hierarchy.py on one machine in the 2 x 2 shape: results right, and the traced
    bytes out of the busiest host: S for hierarchical, 1.5 S (host by host) and 3 S
    (interleaved) for the ring."""
    from benchmarks import hierarchy
    hierarchy.main(["--world-size", "4", "--ranks-per-host", "2", "-b", "64K", "-n", "1", "-w", "0",
                    "--algorithm", "ring,hierarchical,builtin", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    got = {(r["placement"], r["algorithm"]): (r["link_over_S"], r["wrong"]) for r in rows}
    assert got == {("host-by-host", "ring"): (1.5, 0), ("host-by-host", "hierarchical"): (1.0, 0),
                   ("-", "builtin"): (None, 0),
                   ("interleaved", "ring"): (3.0, 0), ("interleaved", "hierarchical"): (1.0, 0)}
    assert "| 4 | 2 | 64K | interleaved | hierarchical |" in capsys.readouterr().out


def uneven_world(rank, n, local):
    torch.set_num_threads(1)
    os.environ["LOCAL_WORLD_SIZE"] = str(local)       # hosts of local ranks, the last one short
    check_all_reduce(rank, n, "hierarchical")
    hosts = [g // local for g in range(n)]
    check_all_reduce(rank, n, "hierarchical", hosts=hosts)
    # the stated cost, exactly, for this layout
    out = across(rank, lambda g: g // local,
                 lambda: collectives.all_reduce(torch.ones(LARGE // 16), algorithm="hierarchical"))
    return out


@pytest.mark.parametrize("n,local", [(4, 3), (5, 2), (3, 2)])
def test_hierarchical_on_uneven_hosts(n, local):
    per_rank = run_world(uneven_world, n, local, env={"COLLECTIVES_TIMEOUT": "20"})
    rows = [r[1] for r in per_rank]
    want = hier.cost(n, LARGE // 16 * ELEM, ELEM, hosts=[g // local for g in range(n)])
    assert busiest(rows) == {k: getattr(want, k) for k in busiest(rows)}
