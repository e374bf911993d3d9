"""A rank that never calls, exits mid-collective or fails validation leaves no one hanging.

Every surviving rank must either finish (it never needed the missing rank) or
raise within ``COLLECTIVES_TIMEOUT`` plus a few seconds: a
:class:`CollectiveTimeout` naming the collective, algorithm, step and peer, or,
when the peer's connection closes (it exited, or timed out first and gave up on
the group), a :class:`CollectiveError` naming the same.

Each case runs in a fresh 3-rank group: a group that timed out is closed for
good (gloo closes its connections), and nothing of an abandoned call can reach
a later one. Cases run side by side in disjoint triples of one world, because
each waits a whole timeout; the world's processes are forked from a server that
has imported torch once, so a process costs little.
"""
import os
import re
import time
import traceback

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import observers, p2p_communications, settings
from tests.worlds import DEATH_EXIT_CODE, run_world

TIMEOUT = 1.0     # COLLECTIVES_TIMEOUT in these worlds
SLACK = 5.0       # "within the timeout plus a few seconds", on a loaded 2-core machine
CASES = [(c, a) for c, algos in collectives.ALGORITHMS.items() for a in algos]
ERROR_TEXT = re.compile(r"collectives\.(\w+)\(algorithm='(\w+)'\) on rank (\d+), step (\d+): "
                        r"(timed out after [\d.]+ s waiting|failed) to (send|receive) \d+ bytes "
                        r"(to|from) rank (\d+)")


def call(collective, algorithm, group, ranks, root=None, async_op=False, numel=24):
    """Call ``collective`` on this rank with valid arguments for ``group`` (global ``ranks``)."""
    me, n = dist.get_rank(), len(ranks)
    root = ranks[0] if root is None else root
    t = torch.full((numel,), float(me + 1))
    kw = dict(group=group, async_op=async_op, algorithm=algorithm)
    if collective == "broadcast":
        return collectives.broadcast(t, src=root, **kw)
    if collective == "reduce":
        return collectives.reduce(t, dst=root, **kw)
    if collective == "all_reduce":
        return collectives.all_reduce(t, **kw)
    if collective == "scatter":
        pieces = [torch.full((numel,), float(i)) for i in range(n)] if me == root else None
        return collectives.scatter(t, pieces, src=root, **kw)
    if collective == "gather":
        out = [torch.empty(numel) for _ in range(n)] if me == root else None
        return collectives.gather(t, out, dst=root, **kw)
    if collective == "all_gather":
        return collectives.all_gather([torch.empty(numel) for _ in range(n)], t, **kw)
    if collective == "reduce_scatter":
        return collectives.reduce_scatter(t, [t.clone() for _ in range(n)], **kw)
    if collective == "all_to_all":
        return collectives.all_to_all([torch.empty(numel) for _ in range(n)],
                                      [t.clone() for _ in range(n)], **kw)
    return collectives.barrier(**kw)


def outcome(collective, algorithm, fn):
    """Run ``fn``; return (collective, algorithm, kind, seconds, message)."""
    start = time.monotonic()
    try:
        fn()
        kind, text = "ok", ""
    except collectives.CollectiveError as exc:
        kind, text = type(exc).__name__, str(exc)
    except Exception:  # reported, and the test fails on it
        kind, text = "unexpected error", traceback.format_exc()
    return collective, algorithm, kind, time.monotonic() - start, text


def check_case(case, per_rank, members, missing, noticed=True):
    """``per_rank``: {survivor: outcome}. Each finished or failed in time, naming the call and a
    peer of the group; if ``noticed``, someone failed."""
    collective, algorithm = case
    for rank, (_, _, kind, seconds, text) in per_rank.items():
        where = f"{collective}/{algorithm} on rank {rank}"
        assert seconds < TIMEOUT + SLACK, f"{where} took {seconds:.1f} s: {kind} {text}"
        assert kind in ("ok", "CollectiveTimeout", "CollectiveError"), f"{where}: {kind}: {text}"
        if kind == "ok":
            continue
        m = ERROR_TEXT.search(text)
        assert m, f"{where}: the message does not name the call, step and peer: {text}"
        assert m.group(1, 2, 3) == (collective, algorithm, str(rank)), f"{where}: {text}"
        assert int(m.group(8)) in set(members) - {rank}, f"{where}: names a rank outside: {text}"
        if kind == "CollectiveTimeout":
            assert f"timed out after {TIMEOUT:g} s" in text and "COLLECTIVES_TIMEOUT" in text, text
        else:
            assert "closed" in text, f"{where}: a CollectiveError should say why: {text}"
        if "never answered" in text:  # the store-side explanation names who fell silent
            assert re.search(rf"\branks? [\d, ]*\b{missing}\b[\d, ]* of the group", text), f"{where}: names the wrong rank: {text}"
    # Who names ``missing`` is a race: a survivor waiting on another survivor that
    # waits on ``missing`` may time out first, and the other then sees it close.
    if noticed:
        # noticed=False is for what no survivor waits for (see ``waits_for_missing``): the
        # call may then return everywhere, and that too within the bound above
        assert any(kind != "ok" for _, _, kind, _, _ in per_rank.values()), (
            f"{case}: every survivor returned though rank {missing} never took part")


def waits_for_missing(collective, algorithm, root, missing, transport):
    """Whether a survivor of a 3-rank group waits for ``missing`` in one call of ``algorithm``,
    read from the algorithm's own messages (the simulator runs the same code): it does if it
    receives from it, and on gloo also if it sends to it (gloo's send waits for the receive).
    On shared memory a small send is done once it is in the mailbox (MPI's eager protocol,
    ``collectives/shm.py``), so a root that only sends to the missing rank (a linear
    broadcast or scatter) may return, and the missing rank meets the message, or the
    desync, at its next call."""
    from collectives.sim.collective import simulate
    posts = simulate(collective, algorithm, 3, 3 * 96, topology="local", root=root, schedule=True).schedule
    return any(kind == "recv" or transport == "gloo"
               for rank in range(3) if rank != missing
               for what, ends in posts[rank] if what == "post"
               for kind, peer, _, _ in ends if peer == missing)


ABSENT_TRIPLES = 6
ABSENT_CASES = ([(c, a, "skip") for c, a in CASES]
                + [("all_reduce", "ring", "async"), ("broadcast", "binomial_tree", "root_absent"),
                   ("scatter", "linear", "root_absent"), ("reduce", "binomial_tree", "invalid"),
                   ("all_to_all", "pairwise", "invalid")])


def _absent_world(rank, world_size, cases):
    """Triple j = ranks 3j, 3j+1, 3j+2 runs cases j, j+T, ...; its last rank skips them."""
    triples = world_size // 3
    groups = [dist.new_group(list(range(3 * (i % triples), 3 * (i % triples) + 3)))
              for i in range(len(cases))]
    for i, group in enumerate(groups):   # each group's agreement, with every member present
        if rank in range(3 * (i % triples), 3 * (i % triples) + 3):
            collectives.barrier(group=group)
    results = []
    for i, (collective, algorithm, variant) in enumerate(cases):
        members = list(range(3 * (i % triples), 3 * (i % triples) + 3))
        if rank not in members:
            continue
        if rank == members[2]:
            if variant == "invalid":   # fails validation, before any message
                with pytest.raises(ValueError, match="unknown algorithm"):
                    call(collective, "no_such_algorithm", groups[i], members)
            continue
        if variant == "async":
            def fn():
                call(collective, algorithm, groups[i], members, async_op=True).wait()
        else:
            def fn():
                call(collective, algorithm, groups[i], members,
                     root=members[2] if variant == "root_absent" else None)
        results.append(outcome(collective, algorithm, fn) + (i,))
    after = _work_after_timeout(rank)
    dist.barrier()   # the absent ranks stay alive (sockets open) until the survivors are done
    return results, after


def _work_after_timeout(rank):
    """Ranks 0, 1 (2 absent): async work queued behind a timed-out call still runs, and the
    timed-out group fails fast when used again."""
    bad = dist.new_group([0, 1, 2])
    good = dist.new_group([0, 1])
    t = torch.full((4,), float(rank + 1))
    if rank in (0, 1):
        first = collectives.all_reduce(torch.ones(4), group=bad, async_op=True)
        second = collectives.all_reduce(t, group=good, async_op=True)
        with pytest.raises(collectives.CollectiveError, match="all_reduce"):
            first.wait()
        second.wait()
        start = time.monotonic()
        with pytest.raises(collectives.CollectiveError, match="barrier"):
            collectives.barrier(group=bad)
        assert time.monotonic() - start < TIMEOUT + SLACK
    return t.tolist()


def test_absent_rank_times_out_every_collective_and_algorithm():
    """One rank of the group never calls (or fails validation): the others raise in time.

    Every (collective, algorithm) pair, plus async, an absent root and a peer
    that fails validation; then work after a timeout.
    """
    world = 3 * ABSENT_TRIPLES
    transport = "gloo" if settings.transport() == "gloo" else "shm"   # one host: auto is shm
    out = run_world(_absent_world, world, ABSENT_CASES, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)},
                    timeout=90 + len(ABSENT_CASES) * (TIMEOUT + SLACK) / ABSENT_TRIPLES)
    seen = {}
    for rank, (results, _) in enumerate(out):
        for *result, i in results:
            seen.setdefault(i, {})[rank] = tuple(result)
    assert sorted(seen) == list(range(len(ABSENT_CASES)))
    for i, (collective, algorithm, variant) in enumerate(ABSENT_CASES):
        members = list(range(3 * (i % ABSENT_TRIPLES), 3 * (i % ABSENT_TRIPLES) + 3))
        assert sorted(seen[i]) == members[:2]
        root = 2 if variant == "root_absent" else 0
        noticed = waits_for_missing(collective, algorithm, root, 2, transport)
        check_case((collective, algorithm), seen[i], members, missing=members[2], noticed=noticed)
    assert out[0][1] == out[1][1] == [3.0] * 4, "a collective queued behind a timeout went wrong"


@pytest.mark.parametrize("value", ["soon", "abc", "-1", "0", "inf", "-inf", "nan", "1e9"])
def test_timeout_variable_is_validated(value):
    os.environ["COLLECTIVES_TIMEOUT"] = value
    try:
        with pytest.raises(ValueError, match=r"COLLECTIVES_TIMEOUT=.* is not valid: it must be a finite "
                                             r"number of seconds with 0 < seconds <= 604800"):
            settings.timeout_seconds()
        os.environ["COLLECTIVES_TIMEOUT"] = "2.5"
        assert settings.timeout_seconds() == 2.5
    finally:
        del os.environ["COLLECTIVES_TIMEOUT"]
    assert settings.timeout_seconds() == settings.DEFAULT_TIMEOUT


def _die_after_first_message():
    original = p2p_communications.Pending.wait

    def wait(self):
        original(self)
        if self.comm.algorithm != observers.AGREEMENT:   # the group's agreement is not the collective
            os._exit(DEATH_EXIT_CODE)
    p2p_communications.Pending.wait = wait


def _death_world(rank, world_size, cases):
    """Case i runs on group [0, 1, 2+i]; rank 2+i joins it at once, waits there (long
    timeout) until ranks 0 and 1 arrive, and exits right after its first message."""
    groups = [dist.new_group([0, 1, 2 + i]) for i in range(len(cases))]
    survivors = dist.new_group([0, 1])
    if rank >= 2:
        i = rank - 2
        os.environ["COLLECTIVES_TIMEOUT"] = "600"
        _die_after_first_message()
        try:
            call(*cases[i], groups[i], [0, 1, rank])
        finally:   # it had nothing to wait for (or a survivor gave up first): exit anyway
            os._exit(DEATH_EXIT_CODE)
    results = []
    for i, case in enumerate(cases):
        dist.barrier(group=survivors)   # so neither times out waiting for the other to arrive
        results.append(outcome(*case, lambda: call(*case, groups[i], [0, 1, 2 + i])))
    return results


def test_rank_exiting_mid_collective_every_collective_and_algorithm():
    """One rank of the group exits after its first message: the others raise (or finish) in time.

    Some ranks never needed the one that died (a broadcast leaf, say), so they
    may finish; none may hang. COLLECTIVES_TEST_DEATHS=collective[,...] narrows the cases.
    """
    only = os.environ.get("COLLECTIVES_TEST_DEATHS")
    cases = [(c, a) for c, a in CASES if not only or c in only.split(",")]
    world = 2 + len(cases)
    out = run_world(_death_world, world, cases, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)},
                    timeout=90 + len(cases) * (TIMEOUT + SLACK))
    for i, case in enumerate(cases):
        check_case(case, {r: out[r][i] for r in (0, 1)}, [0, 1, 2 + i], missing=2 + i,
                   noticed=False)
