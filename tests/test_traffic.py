"""Each algorithm moves exactly the traffic its ``cost`` states (``collectives/algorithms``).

The door (``collectives.p2p_communications``) counts, per rank, messages and
bytes sent and received, and traces each message with its step. A world runs
every registered algorithm under ``count_traffic()`` and ``trace()`` at several
sizes (empty, fewer elements than ranks, uneven pieces, and for all_reduce and
broadcast large enough that pipelines cut segments and Rabenseifner sends
block by block); the busiest rank's figures must equal the algorithm's
``cost(N, S, 4)``, for N = 1, 3, 4 and 6. A new algorithm is checked here as
soon as it is registered. (``reduced_bytes`` is not counted at the door;
``extra_memory`` is checked by tests/test_memory.py.)
"""
import pytest
import torch

import collectives
from collectives import ALGORITHMS
from collectives.algorithms import cost

from .worlds import run_world

ELEM = 4                                   # float32
SMALL = (0, 1, 7, 1000)                    # elements of the tensor (or of one rank's piece)
LARGE = (1 << 18, 1_300_001)               # 1 MiB (chapter 5's table), ~5 MiB: segments, pieces
BIG = ("all_reduce", "broadcast")


def call(collective, algorithm, n, rank, e):
    """Run one call with ``e`` elements; return S as nccl-tests (and ``cost``) count it."""
    ones = lambda k: torch.ones(k)  # noqa: E731
    if collective == "all_reduce":
        collectives.all_reduce(ones(e), algorithm=algorithm)
    elif collective == "broadcast":
        collectives.broadcast(ones(e), src=0, algorithm=algorithm)
    elif collective == "reduce":
        collectives.reduce(ones(e), dst=0, algorithm=algorithm)
    elif collective == "scatter":
        collectives.scatter(torch.empty(e), [ones(e) for _ in range(n)] if rank == 0 else None,
                            src=0, algorithm=algorithm)
    elif collective == "gather":
        collectives.gather(ones(e), [torch.empty(e) for _ in range(n)] if rank == 0 else None,
                           dst=0, algorithm=algorithm)
    elif collective == "all_gather":
        collectives.all_gather([torch.empty(e) for _ in range(n)], ones(e), algorithm=algorithm)
    elif collective == "reduce_scatter":
        collectives.reduce_scatter(torch.empty(e), [ones(e) for _ in range(n)], algorithm=algorithm)
    elif collective == "all_to_all":
        collectives.all_to_all([torch.empty(e) for _ in range(n)], [ones(e) for _ in range(n)],
                               algorithm=algorithm)
    else:
        collectives.barrier(algorithm=algorithm)
        return 0
    return e * ELEM * (1 if collective in ("all_reduce", "broadcast", "reduce") else n)


def measure_world(rank, n):
    out = {}
    for collective, names in ALGORITHMS.items():
        for algorithm in names:
            for e in SMALL + (LARGE if collective in BIG else ()):
                with collectives.count_traffic() as t, collectives.trace() as messages:
                    s = call(collective, algorithm, n, rank, e)
                sends = [(m.step, m.nbytes) for m in messages.messages if m.kind == "send"]
                out[collective, algorithm, s] = (t.sent_messages, t.recv_messages, t.sent_bytes,
                                                 t.recv_bytes, sends)
    return out


@pytest.fixture(scope="module", params=[1, 3, 4, 6])
def world(request):
    return request.param, run_world(measure_world, request.param)


def busiest(per_rank):
    """The figures ``cost`` states, from every rank's counts."""
    largest = {}
    for *_, sends in per_rank:
        for step, nbytes in sends:
            largest[step] = max(largest.get(step, 0), nbytes)
    return dict(steps=len(largest),
                messages=max(max(r[0], r[1]) for r in per_rank),
                sent_bytes=max(r[2] for r in per_rank),
                recv_bytes=max(r[3] for r in per_rank),
                critical_bytes=sum(largest.values()))


@pytest.mark.parametrize("collective", list(ALGORITHMS))
def test_traffic_equals_cost(world, collective):
    n, per_rank = world
    checked = 0
    for (c, algorithm, s) in per_rank[0]:
        if c != collective:
            continue
        rows = [r[c, algorithm, s] for r in per_rank]
        assert sum(r[2] for r in rows) == sum(r[3] for r in rows), "every byte sent is received"
        assert sum(r[0] for r in rows) == sum(r[1] for r in rows), "every message sent is received"
        want = cost(c, algorithm, n, s, ELEM)
        got = busiest(rows)
        assert got == {k: getattr(want, k) for k in got}, f"{c}/{algorithm}, N={n}, S={s}"
        checked += 1
    assert checked >= len(ALGORITHMS[collective])


def test_card_figures(world):
    """The cards' headline formulas, for sizes that divide evenly (N a power of two here)."""
    n, _ = world
    if n != 4:
        pytest.skip("N=4 only")
    s = 4 * 1024
    ring = cost("all_reduce", "ring", n, s, ELEM)
    assert (ring.steps, ring.messages, ring.sent_bytes) == (2 * (n - 1), 2 * (n - 1), 2 * (n - 1) * s // n)
    assert ring.extra_memory == s // n
    rd = cost("all_reduce", "recursive_doubling", n, s, ELEM)
    assert (rd.steps, rd.sent_bytes, rd.extra_memory) == (2, 2 * s, s)
    rab = cost("all_reduce", "rabenseifner", n, s, ELEM)
    assert (rab.steps, rab.sent_bytes) == (4, 2 * (n - 1) * s // n)
    tree = cost("all_reduce", "tree", n, s, ELEM)
    assert (tree.steps, tree.sent_bytes, tree.critical_bytes) == (4, 2 * s, 4 * s)
    assert cost("all_reduce", "naive_ring", n, s, ELEM).extra_memory == n * s


def verbose_world(rank, n):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
        collectives.all_reduce(torch.ones(840), algorithm="ring")
    return out.getvalue()


@pytest.mark.parametrize("flag", ["1", "0"])
def test_verbose_prints_every_message(flag):
    # COLLECTIVES_VERBOSE=1: one line per message this rank sent or received, as it completes
    printed = run_world(verbose_world, 3, env={"COLLECTIVES_VERBOSE": flag})
    s = 840 * ELEM
    for rank, text in enumerate(printed):
        lines = text.splitlines()
        if flag == "0":
            assert lines == []
            continue
        # the world's first call: its agreement (tables, settings, hosts) comes first, named so
        setup = [line for line in lines if "/agreement step " in line]
        assert setup and lines[:len(setup)] == setup, text
        lines = lines[len(setup):]
        assert len(lines) == 2 * 2 * (3 - 1), text                 # 2(N-1) steps, a send and a receive each
        assert all(line.startswith(f"[rank {rank}] all_reduce/ring step ") for line in lines), text
        assert sum(f"send {s // 3} B -> {(rank + 1) % 3}" in line for line in lines) == 4, text
        assert sum(f"recv {s // 3} B <- {(rank - 1) % 3}" in line for line in lines) == 4, text


def test_only_the_door_sends():
    """No module of the package but the door posts point-to-point messages, so the counts
    above see every byte of every collective. (``benchmarks/call_overhead.py``, outside the
    package, times bare torch calls against the door on purpose.)"""
    import pathlib
    import re
    package = pathlib.Path(collectives.__file__).parent
    p2p = re.compile(r"\bdist\.(i?send|i?recv|batch_isend_irecv|P2POp)\b|\.(send|recv)\(\[")
    offenders = [f"{path.relative_to(package)}:{n}"
                 for path in sorted(package.rglob("*.py"))
                 if path.name != "p2p_communications.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if p2p.search(line)]
    assert offenders == []
