"""COLLECTIVES_DEBUG=1: ranks that disagree on a call all raise DesyncError naming each call.

One 3-rank world runs every case on the default group: a mismatch is found
before any data moves, so the group stays usable for the next case, which the
test relies on (and checks with a correct call after the first mismatch).
"""
import os

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import desync as desync_detection
from tests.worlds import run_world


def attempt(fn):
    """('ok', value) or (error class name, message)."""
    try:
        return "ok", fn()
    except collectives.CollectiveError as exc:
        return type(exc).__name__, str(exc)


def _desync_world(rank, world_size):
    os.environ["COLLECTIVES_DEBUG"] = "1"
    C = collectives
    out = {}

    def per_rank(**calls):
        """Run calls[f"r{rank}"] if given, else calls["others"]."""
        return attempt(calls[f"r{rank}"] if f"r{rank}" in calls else calls["others"])

    out["collective"] = per_rank(
        r2=lambda: C.broadcast(torch.zeros(4), src=0, algorithm="binomial_tree"),
        others=lambda: C.all_reduce(torch.ones(4, 4), algorithm="ring"))
    t = torch.full((3,), float(rank + 1))
    out["usable_after"] = attempt(lambda: (C.all_reduce(t), t.tolist())[1])
    out["shape"] = per_rank(r1=lambda: C.all_reduce(torch.ones(5)),
                            others=lambda: C.all_reduce(torch.ones(4)))
    out["dtype"] = per_rank(r0=lambda: C.all_gather([torch.zeros(2) for _ in range(3)],
                                                    torch.zeros(2)),
                            others=lambda: C.all_gather([torch.zeros(2, dtype=torch.int64)] * 3,
                                                        torch.zeros(2, dtype=torch.int64)))
    out["op"] = per_rank(r2=lambda: C.all_reduce(torch.ones(2), op=C.ReduceOp.MAX),
                         others=lambda: C.all_reduce(torch.ones(2), op=C.ReduceOp.SUM))
    out["root"] = per_rank(r1=lambda: C.broadcast(torch.ones(2), src=1),
                           others=lambda: C.broadcast(torch.ones(2), src=0))
    out["algorithm"] = per_rank(r0=lambda: C.reduce(torch.ones(2), dst=0, algorithm="linear"),
                                others=lambda: C.reduce(torch.ones(2), dst=0,
                                                        algorithm="binomial_tree"))
    out["async"] = per_rank(r2=lambda: C.barrier(async_op=True).wait(),
                            others=lambda: C.all_reduce(torch.ones(1), async_op=True).wait())

    # all_to_all may send different sizes to different ranks: rank i sends i+j+1
    # elements to rank j. Only a crosswise mismatch is a desync.
    ins = [torch.full((rank + j + 1,), float(10 * rank + j)) for j in range(3)]
    outs = [torch.zeros(i + rank + 1) for i in range(3)]
    out["uneven_all_to_all"] = attempt(lambda: (C.all_to_all(outs, ins),
                                                [o.tolist() for o in outs])[1])
    if rank == 1:
        outs[0] = torch.zeros(4)     # rank 0 sends rank 1 two elements
    out["all_to_all_sizes"] = attempt(lambda: C.all_to_all(outs, ins))

    pair = dist.new_group([1, 2])
    out["subgroup"] = per_rank(r0=lambda: None,
                               r1=lambda: C.all_reduce(torch.ones(2), group=pair),
                               r2=lambda: C.all_gather([torch.ones(2)] * 2, torch.ones(2),
                                                       group=pair))

    with collectives.count_traffic() as on:
        C.all_reduce(torch.ones(8), algorithm="ring")
    os.environ["COLLECTIVES_DEBUG"] = "0"
    with collectives.count_traffic() as off:
        C.all_reduce(torch.ones(8), algorithm="ring")
    out["traffic"] = [(t.sent_messages, t.sent_bytes) for t in (on, off)]

    os.environ["COLLECTIVES_DEBUG"] = "1"
    os.environ["COLLECTIVES_TIMEOUT"] = "1"
    lonely = dist.new_group([0, 1, 2])
    out["absent"] = attempt(lambda: C.all_reduce(torch.ones(2), group=lonely)) if rank else None
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def desync():
    out = run_world(_desync_world, 3, timeout=120, env={"COLLECTIVES_TIMEOUT": "30"})
    return [out[r] for r in range(3)]


def _same_on_every_rank(results, case, kind="DesyncError"):
    outcomes = [r[case] for r in results]
    assert all(o[0] == kind for o in outcomes), f"{case}: {outcomes}"
    assert len({o[1] for o in outcomes}) == 1, f"{case}: ranks report differently: {outcomes}"
    return outcomes[0][1]


def test_different_collectives_name_each_ranks_call(desync):
    text = _same_on_every_rank(desync, "collective")
    assert ("rank 2 called broadcast(src=0, shape=[4], dtype=float32, algorithm=binomial_tree) "
            "while rank 0 called all_reduce(op=SUM, shape=[4, 4], dtype=float32, algorithm=ring)"
            in text), text
    assert "ranks 0, 1: all_reduce(" in text and "rank 2: broadcast(" in text, text
    assert "call #0 on the group of ranks [0, 1, 2]" in text, text


def test_group_is_usable_after_a_desync(desync):
    assert [r["usable_after"] for r in desync] == [("ok", [6.0, 6.0, 6.0])] * 3


@pytest.mark.parametrize("case, odd, words", [
    ("shape", 1, ("shape=[5]", "shape=[4]")),
    ("dtype", 0, ("dtype=float32", "dtype=int64")),
    ("op", 2, ("op=MAX", "op=SUM")),
    ("root", 1, ("src=1", "src=0")),
    ("algorithm", 0, ("algorithm=linear", "algorithm=binomial_tree")),
    ("async", 2, ("barrier(algorithm=dissemination)", "all_reduce(")),
])
def test_each_field_of_the_fingerprint_is_checked(desync, case, odd, words):
    text = _same_on_every_rank(desync, case)
    usual = 0 if odd else 1
    assert f"rank {odd} called " in text and f"while rank {usual} called " in text, text
    odd_call, usual_call = text.split("\n")[0].split(" while ")
    assert words[0] in odd_call and words[1] in usual_call, text


def test_uneven_all_to_all_is_not_a_desync(desync):
    for rank, r in enumerate(desync):
        kind, got = r["uneven_all_to_all"]
        assert kind == "ok", got
        assert got == [[float(10 * i + rank)] * (i + rank + 1) for i in range(3)]


def test_all_to_all_sizes_are_checked_crosswise(desync):
    text = _same_on_every_rank(desync, "all_to_all_sizes")
    assert "rank 0 sends 2 elements to rank 1, which expects 4 from it" in text, text
    assert text.count(" sends ") == 1, text


def test_subgroup_desync_names_global_ranks(desync):
    assert desync[0]["subgroup"] == ("ok", None)
    outcomes = [desync[r]["subgroup"] for r in (1, 2)]
    assert {o[0] for o in outcomes} == {"DesyncError"} and outcomes[0] == outcomes[1], outcomes
    text = outcomes[0][1]
    assert "the group of ranks [1, 2]" in text and "rank 2 called all_gather(" in text, text
    assert "while rank 1 called all_reduce(" in text, text


def test_cost_when_off_and_on(desync):
    """Off: the algorithm's messages only. On: one fingerprint to each other rank."""
    for r in desync:
        (on_msgs, on_bytes), (off_msgs, off_bytes) = r["traffic"]
        assert off_msgs == 2 * (3 - 1)   # ring all_reduce
        assert on_msgs == off_msgs + 2
        assert on_bytes == off_bytes + 2 * (desync_detection.HEADER_BYTES + 16 * 3)


def test_absent_rank_times_out_in_the_check(desync):
    assert desync[0]["absent"] is None
    for r in desync[1:]:
        kind, text = r["absent"]
        assert kind in ("CollectiveTimeout", "CollectiveError"), text
        # the check, or before it the wait for the group's tuning tables (rank 0 publishes them)
        assert ("desync check" in text or "rank 0 of the group" in text) and "all_reduce" in text, text


def test_desync_error_is_a_collective_error():
    assert issubclass(collectives.DesyncError, collectives.CollectiveError)


def test_off_by_default_and_on_with_1(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_DEBUG", raising=False)
    assert not desync_detection.enabled()
    for value, on in (("0", False), ("", False), ("1", True)):
        monkeypatch.setenv("COLLECTIVES_DEBUG", value)
        assert desync_detection.enabled() == on


def _always_on_world(rank, world_size):
    """COLLECTIVES_DEBUG unset: on the group [1, 2] of a world of 3 (rank 0, which hosts the
    store, is not in it), rank 1 calls all_reduce and rank 2 all_gather of the same bytes."""
    os.environ.pop("COLLECTIVES_DEBUG", None)
    os.environ["COLLECTIVES_TIMEOUT"] = "3"
    pair = dist.new_group([1, 2])
    out = None
    if rank == 1:
        out = attempt(lambda: collectives.all_reduce(torch.ones(4), group=pair))
    elif rank == 2:
        out = attempt(lambda: collectives.all_gather([torch.zeros(2), torch.zeros(2)], torch.ones(2),
                                                     group=pair))
    dist.barrier()   # rank 0 holds the store until both have raised
    return out


def test_always_on_desync_on_a_subgroup_names_global_ranks():
    out = run_world(_always_on_world, 3, timeout=90)
    assert out[0] is None
    for rank in (1, 2):
        kind, text = out[rank]
        assert kind == "DesyncError", f"rank {rank}: {kind}: {text}"
        assert "[1, 2]" in text and "all_reduce" in text and "all_gather" in text, text
        assert "rank 1" in text and "rank 2" in text, text
