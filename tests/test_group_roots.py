"""``group_src`` / ``group_dst``: roots given as ranks of the group, as torch takes them.

On the subgroup of global ranks [1, 2, 3] of a 4-rank world, group rank 1 is
global rank 2. Each rooted collective is called with the root given both ways;
the results are the closed forms (rank r's input encodes r), the same as torch's
own call with ``group_src``/``group_dst``.
"""
import inspect

import pytest
import torch
import torch.distributed as dist

import collectives
from tests.worlds import attempt, run_world

RANKS = [1, 2, 3]
GROUP_ROOT, GLOBAL_ROOT = 1, 2


def _world(rank, n):
    group = dist.new_group(RANKS)
    out = {}
    if rank not in RANKS:
        # outside the group every call returns at once, whatever the root
        out["outside"] = collectives.broadcast(torch.zeros(2), group=group, group_src=GROUP_ROOT)
        return out
    for way, kw in (("group", {"group_src": GROUP_ROOT}), ("global", {"src": GLOBAL_ROOT})):
        t = torch.full((3,), float(rank))
        collectives.broadcast(t, group=group, **kw)
        out[f"broadcast/{way}"] = t.tolist()
        pieces = [torch.full((2,), 10.0 * i) for i in range(3)] if rank == GLOBAL_ROOT else None
        t = torch.zeros(2)
        collectives.scatter(t, pieces, group=group, **kw)
        out[f"scatter/{way}"] = t.tolist()
    for way, kw in (("group", {"group_dst": GROUP_ROOT}), ("global", {"dst": GLOBAL_ROOT})):
        t = torch.full((2,), float(rank))
        collectives.reduce(t, group=group, **kw)
        out[f"reduce/{way}"] = t.tolist()
        gathered = [torch.zeros(1) for _ in range(3)] if rank == GLOBAL_ROOT else None
        collectives.gather(torch.tensor([float(rank)]), gathered, group=group, **kw)
        out[f"gather/{way}"] = [g.item() for g in gathered] if gathered else None
    if "group_src" in inspect.signature(dist.broadcast).parameters:  # torch >= 2.6
        t = torch.full((3,), float(rank))
        dist.broadcast(t, group=group, group_src=GROUP_ROOT)
        out["broadcast/torch"] = t.tolist()
    for bad, exc, text in (({"src": 2, "group_src": 1}, ValueError, "not both"),
                           ({"group_src": 3}, ValueError, "group_src=3 is out of range for a group of 3"),
                           ({}, ValueError, "src (a global rank) or group_src")):
        with pytest.raises(exc, match=text.replace("(", r"\(").replace(")", r"\)")):
            collectives.broadcast(torch.zeros(1), group=group, **bad)
    out["errors"] = "raised"
    return out


def test_roots_as_group_ranks_match_roots_as_global_ranks():
    results = run_world(_world, 4)
    assert results[0] == {"outside": None}
    for rank in RANKS:
        got = results[rank]
        for way in ("group", "global"):
            assert got[f"broadcast/{way}"] == [float(GLOBAL_ROOT)] * 3
            assert got[f"scatter/{way}"] == [10.0 * RANKS.index(rank)] * 2
            assert got[f"reduce/{way}"] == ([float(sum(RANKS))] * 2 if rank == GLOBAL_ROOT else [float(rank)] * 2)
            assert got[f"gather/{way}"] == ([float(r) for r in RANKS] if rank == GLOBAL_ROOT else None)
        assert got["broadcast/torch"] == got["broadcast/group"]
        assert got["errors"] == "raised"


def _destroyed_group_world(rank, n):
    g = dist.new_group([0, 1])
    x = torch.ones(4)
    collectives.all_reduce(x, group=g)       # the group's record is worked out and kept
    dist.destroy_process_group(g)
    return {"api": attempt(lambda: collectives.all_reduce(x, group=g))[:2]}


def test_a_call_on_a_destroyed_group_is_a_clear_error_on_every_rank():
    # the group's record is kept once worked out: a destroyed group must not be served from it
    # (torch's own all_reduce still runs on it, by accident: its C++ group outlives the Python
    # tables it was removed from; ours raised a raw KeyError before the record was kept)
    for out in run_world(_destroyed_group_world, 2):
        kind, text = out["api"]
        assert kind == "ValueError" and "destroyed" in text and "collectives.all_reduce" in text, out
