"""The simulator's networks made for the newer algorithms (issue 34 item 4): 2-D and 3-D tori,
a dragonfly, a rail-optimised cluster; their routes, and the bytes each link class carries.

Every route is checked against the topology's own geometry (a torus route's length is the
wrap-around Manhattan distance, and its links chain from source to destination; a dragonfly
message between groups crosses exactly one global link), and the per-class byte counts
against a closed form (a linear broadcast puts S on one global link per rank outside the
root's group) and against the messages themselves (bytes x links of the class, summed).
"""
import itertools
import json
import math

import pytest

from collectives import count_traffic, observers
from collectives.sim import simulate
from collectives.sim import topology as topologies

S = 1 << 16


def torus_distance(dims, a, b):
    total, stride = 0, 1
    for size in dims:
        x, y = a // stride % size, b // stride % size
        total += min((y - x) % size, (x - y) % size)
        stride *= size
    return total


def link_end(dims, link):
    """(node, node after the link) for a torus link id."""
    k = len(dims)
    direction, rest = link % 2, link // 2
    node, d = rest // k, rest % k
    stride = math.prod(dims[:d])
    x = node // stride % dims[d]
    y = (x + (1 if direction == 0 else -1)) % dims[d]
    return node, node + (y - x) * stride


@pytest.mark.parametrize("dims", [[4, 4], [3, 5], [2, 3, 4], [5], [1, 6]])
def test_torus_routes_are_shortest_and_chain(dims):
    n = math.prod(dims)
    fabric = topologies.build(topologies.torus(dims), n)
    spec = fabric.spec
    for a, b in itertools.permutations(range(n), 2):
        links, alpha = fabric.route(a, b)
        assert len(links) == torus_distance(dims, a, b), (a, b, links)
        hops = [link_end(dims, link) for link in links]
        assert [h[0] for h in hops] == [a] + [h[1] for h in hops[:-1]], (a, b, hops)
        assert hops[-1][1] == b
        assert all(0 <= link < len(fabric.capacity) for link in links)
        assert alpha == pytest.approx(spec["alpha"] + spec["hop"] * len(links))


def test_torus_of_another_size_is_refused():
    with pytest.raises(ValueError, match=r"a 8x8 torus has 64 nodes, one rank each, not world_size=60"):
        simulate("all_reduce", "ring", 60, 1024, topology="torus-8x8")
    with pytest.raises(ValueError, match="dims must be 1 to 3 whole numbers"):
        simulate("all_reduce", "ring", 4, 1024, topology=topologies.torus([2, 0, 2]))


def test_torus_neighbour_ring_uses_one_link_per_message():
    # the ring's neighbours on a 1-D torus are one hop apart: bytes on the torus = bytes sent
    r = simulate("all_reduce", "ring", 8, 8 * S, topology="torus-8")
    assert r.link_bytes == {"torus": 8 * 2 * 7 * S}


def test_dragonfly_routes():
    spec = topologies.dragonfly(groups=4, routers_per_group=3, ranks_per_router=2)
    n = 24
    fabric = topologies.build(topologies.load(spec), n)
    for a, b in itertools.permutations(range(n), 2):
        links, _ = fabric.route(a, b)
        kinds = [fabric.classes[link] for link in links]
        assert kinds[0] == kinds[-1] == "terminal" and links[0] == 2 * a and links[-1] == 2 * b + 1
        same_group = a // 6 == b // 6
        assert kinds.count("global") == (0 if same_group else 1)
        assert kinds.count("local") <= (1 if same_group else 2)
        if a // 2 == b // 2:
            assert kinds == ["terminal", "terminal"]
    with pytest.raises(ValueError, match=r"hold 24 ranks, not world_size=25"):
        simulate("broadcast", "linear", 25, 1024, topology=spec)


def test_dragonfly_global_bytes_closed_form():
    # a linear broadcast from rank 0 sends S to each rank; those outside group 0 cross one
    # global link each: global bytes = S x ranks outside the root's group
    for groups, per_group, n in ((4, 32, 128), (4, 32, 70), (3, 8, 24)):
        spec = topologies.dragonfly(groups=groups, routers_per_group=per_group // 4, ranks_per_router=4)
        r = simulate("broadcast", "linear", n, S, topology=spec)
        assert r.link_bytes["global"] == S * max(0, n - per_group)
        assert r.link_bytes["terminal"] == 2 * S * (n - 1)


def test_rail_routes():
    fabric = topologies.build(topologies.load("h100-rail"), 8 * 64)
    classes = lambda a, b: [fabric.classes[link] for link in fabric.route(a, b)[0]]  # noqa: E731
    assert classes(0, 7) == ["intra_node", "intra_node"]
    assert classes(3, 8 + 3) == ["rail", "rail"]                    # the same rail, one switch
    assert classes(3, 8 + 4) == ["rail", "spine", "spine", "rail"]  # another rail: through the spine
    assert classes(3, 8 * 40 + 3) == ["rail", "spine", "spine", "rail"]   # another set of rail switches
    assert fabric.route(0, 7)[1] == 1.9e-6 and fabric.route(3, 11)[1] == 4.0e-6


@pytest.mark.parametrize("topology,n", [("dragonfly", 37), ("torus-4x3", 12), ("h100-rail", 19),
                                        ("h100-cluster", 11), ("fat-tree", 40), ("ethernet-100g", 5)])
@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "ring"), ("broadcast", "binomial_tree"),
                                                  ("all_to_all", "pairwise")])
def test_link_bytes_are_the_messages_bytes_times_their_links(topology, n, collective, algorithm):
    fabric = topologies.build(topologies.load(topology), n)
    with observers.trace() as records, count_traffic(rank=1) as one:
        r = simulate(collective, algorithm, n, 3 * S, topology=topology)
    want, mine = {}, {}
    for m in records.messages:
        if m.kind != "send":
            continue
        for link in fabric.route(m.src, m.dst)[0]:
            cls = fabric.classes[link]
            want[cls] = want.get(cls, 0) + m.nbytes
            if m.src == 1:
                mine[cls] = mine.get(cls, 0) + m.nbytes
    assert {k: v for k, v in r.link_bytes.items() if v} == want
    assert one.link_bytes == mine
    assert r.row()["link_bytes"] == r.link_bytes


def test_presets_as_json_files(tmp_path):
    for name in ("torus", "dragonfly", "h100-rail"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(topologies.PRESETS[name]))
        n = 64
        a = simulate("all_reduce", "ring", n, S, topology=str(path))
        b = simulate("all_reduce", "ring", n, S, topology=name)
        assert (a.time, a.link_bytes) == (b.time, b.link_bytes)
        assert topologies.PRESETS[name]["source"]


@pytest.mark.parametrize("change,message", [
    ({"kind": "hypercube"}, "kind must be one of"),
    ({"global_bandwidth": -1.0}, "global_bandwidth must be a non-negative number"),
    ({"local_bandwidth": 0}, "local_bandwidth must be above 0"),
    ({"alpha": float("nan")}, "alpha must be a non-negative number"),
    ({"groups": 2.5}, "groups must be a whole number"),
    ({"wake": -1e-6}, "wake must be a non-negative number"),
])
def test_bad_topologies_are_refused_before_anything_runs(change, message):
    spec = dict(topologies.PRESETS["dragonfly"], **change)
    with pytest.raises(ValueError, match=message):
        simulate("all_reduce", "ring", 8, 1024, topology=spec)
