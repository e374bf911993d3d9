"""Each algorithm moves exactly the traffic its docstring card claims.

The door (``collectives.p2p_communications``) counts, per rank, messages and
bytes sent and received and the steps they happened in. A world runs every
algorithm once under ``count_traffic()`` and returns those counts; the checks
below restate each card's cost formula. ``rounds`` is the number of distinct
steps used by the whole group.
"""
import math

import pytest
import torch

import collectives
from collectives import ALGORITHMS

from .worlds import run_world

NUMEL = 840          # divisible by 1..8, so chunked algorithms split evenly
ELEM = 4             # float32
S = NUMEL * ELEM


def measure_world(rank, n):
    stats = {}

    def measure(key, fn):
        with collectives.count_traffic() as t:
            fn()
        stats[key] = (t.sent_messages, t.sent_bytes, t.recv_messages, t.recv_bytes,
                      sorted(step for _, step in t.steps))

    x = lambda: torch.ones(NUMEL)  # noqa: E731
    piece = NUMEL // n
    for a in ALGORITHMS["all_reduce"]:
        measure(("all_reduce", a), lambda: collectives.all_reduce(x(), algorithm=a))
    for a in ALGORITHMS["broadcast"]:
        measure(("broadcast", a), lambda: collectives.broadcast(x(), src=0, algorithm=a))
    for a in ALGORITHMS["reduce"]:
        measure(("reduce", a), lambda: collectives.reduce(x(), dst=0, algorithm=a))
    for a in ALGORITHMS["scatter"]:
        measure(("scatter", a), lambda: collectives.scatter(
            torch.empty(NUMEL), [x() for _ in range(n)] if rank == 0 else None, src=0, algorithm=a))
    for a in ALGORITHMS["gather"]:
        measure(("gather", a), lambda: collectives.gather(
            x(), [torch.empty(NUMEL) for _ in range(n)] if rank == 0 else None, dst=0, algorithm=a))
    for a in ALGORITHMS["all_gather"]:
        measure(("all_gather", a), lambda: collectives.all_gather(
            [torch.empty(NUMEL) for _ in range(n)], x(), algorithm=a))
    for a in ALGORITHMS["reduce_scatter"]:
        measure(("reduce_scatter", a), lambda: collectives.reduce_scatter(
            torch.empty(piece), [torch.ones(piece) for _ in range(n)], algorithm=a))
    for a in ALGORITHMS["all_to_all"]:
        measure(("all_to_all", a), lambda: collectives.all_to_all(
            [torch.empty(piece) for _ in range(n)], [torch.ones(piece) for _ in range(n)], algorithm=a))
    for a in ALGORITHMS["barrier"]:
        measure(("barrier", a), lambda: collectives.barrier(algorithm=a))
    return stats


@pytest.fixture(scope="module", params=[3, 4, 6, 8])
def world(request):
    n = request.param
    per_rank = run_world(measure_world, n)

    def get(collective, algorithm):
        rows = [r[(collective, algorithm)] for r in per_rank]
        sent_msgs = [r[0] for r in rows]
        sent_bytes = [r[1] for r in rows]
        recv_bytes = [r[3] for r in rows]
        rounds = len(set().union(*[set(r[4]) for r in rows]))
        assert sum(sent_bytes) == sum(recv_bytes), "every byte sent is received"
        assert sum(sent_msgs) == sum(r[2] for r in rows), "every message sent is received"
        return sent_msgs, sent_bytes, recv_bytes, rounds
    return n, get


def log2(n):
    return int(math.log2(n))


def fold_power(n):
    return 1 << (n.bit_length() - 1)


def test_all_reduce_costs(world):
    n, get = world
    L, p, pow2 = math.ceil(math.log2(n)), fold_power(n), n & (n - 1) == 0

    msgs, sent, _, rounds = get("all_reduce", "ring")
    assert msgs == [2 * (n - 1)] * n and rounds == 2 * (n - 1)
    assert sent == [2 * (n - 1) * S // n] * n          # 2(N-1)/N * S, exact for NUMEL=840

    msgs, sent, _, rounds = get("all_reduce", "ring_pipelined")
    k = msgs[0] // (2 * (n - 1))                        # segments per chunk
    assert k >= 1 and msgs == [2 * (n - 1) * k] * n and sent == [2 * (n - 1) * S // n] * n

    msgs, sent, _, rounds = get("all_reduce", "naive_ring")
    assert msgs == [n - 1] * n and sent == [(n - 1) * S] * n and rounds == n - 1

    msgs, sent, _, rounds = get("all_reduce", "recursive_doubling")
    if pow2:
        assert msgs == [log2(n)] * n and sent == [log2(n) * S] * n and rounds == log2(n)
    else:
        assert rounds == log2(p) + 2 and max(msgs) == log2(p) + 1 and min(msgs) == 1

    msgs, sent, _, rounds = get("all_reduce", "rabenseifner")
    if pow2:
        assert msgs == [2 * log2(n)] * n and sent == [2 * (n - 1) * S // n] * n
        assert rounds == 2 * log2(n)
    else:
        assert rounds == 2 * log2(p) + 2

    msgs, sent, _, rounds = get("all_reduce", "tree")
    assert rounds == 2 * L and sum(msgs) == 2 * (n - 1) and sum(sent) == 2 * (n - 1) * S


def test_broadcast_costs(world):
    n, get = world
    L = math.ceil(math.log2(n))

    msgs, sent, recv, rounds = get("broadcast", "linear")
    assert msgs == [n - 1] + [0] * (n - 1) and sent[0] == (n - 1) * S and rounds == 1
    assert recv == [0] + [S] * (n - 1)

    msgs, sent, recv, rounds = get("broadcast", "binomial_tree")
    assert rounds == L and msgs[0] == L and sum(msgs) == n - 1 and recv == [0] + [S] * (n - 1)

    msgs, sent, recv, rounds = get("broadcast", "pipeline")
    k = msgs[0]  # segments
    assert msgs == [k] * (n - 1) + [0] and sent == [S] * (n - 1) + [0] and rounds == n - 2 + k

    msgs, sent, recv, rounds = get("broadcast", "scatter_allgather")
    assert rounds == L + n - 1
    assert max(sent) == sent[0] == 2 * (n - 1) * S // n  # the root: (N-1)/N S twice
    # the ring hands the root back pieces it already had; everyone else gets at least S
    assert recv[0] == (n - 1) * S // n and all(r >= S for r in recv[1:])


def test_reduce_costs(world):
    n, get = world
    for algorithm, want_rounds in (("linear", 1), ("binomial_tree", math.ceil(math.log2(n)))):
        msgs, sent, recv, rounds = get("reduce", algorithm)
        assert msgs == [0] + [1] * (n - 1) and sent == [0] + [S] * (n - 1)
        assert rounds == want_rounds
    assert get("reduce", "linear")[2][0] == (n - 1) * S


def test_scatter_gather_costs(world):
    n, get = world
    L = math.ceil(math.log2(n))
    msgs, sent, recv, rounds = get("scatter", "linear")
    assert msgs == [n - 1] + [0] * (n - 1) and sent[0] == (n - 1) * S and rounds == 1
    msgs, sent, recv, rounds = get("scatter", "binomial_tree")
    assert rounds == L and msgs[0] == L and sent[0] == (n - 1) * S and sum(msgs) == n - 1
    msgs, sent, recv, rounds = get("gather", "linear")
    assert msgs == [0] + [1] * (n - 1) and recv[0] == (n - 1) * S and rounds == 1
    msgs, sent, recv, rounds = get("gather", "binomial_tree")
    assert rounds == L and msgs[0] == 0 and recv[0] == (n - 1) * S and sum(msgs) == n - 1


def test_all_gather_reduce_scatter_costs(world):
    n, get = world
    p, pow2 = fold_power(n), n & (n - 1) == 0
    msgs, sent, _, rounds = get("all_gather", "ring")
    assert msgs == [n - 1] * n and sent == [(n - 1) * S] * n and rounds == n - 1
    msgs, sent, _, rounds = get("all_gather", "recursive_doubling")
    if pow2:
        assert msgs == [log2(n)] * n and sent == [(n - 1) * S] * n and rounds == log2(n)
    else:
        assert rounds == log2(p) + 2

    total = (NUMEL // n) * n * ELEM  # reduce_scatter: S is the whole input list
    msgs, sent, _, rounds = get("reduce_scatter", "ring")
    assert msgs == [n - 1] * n and sent == [(n - 1) * total // n] * n and rounds == n - 1
    msgs, sent, _, rounds = get("reduce_scatter", "recursive_halving")
    if pow2:
        assert msgs == [log2(n)] * n and sent == [(n - 1) * total // n] * n and rounds == log2(n)
    else:
        assert rounds == log2(p) + 2


def test_all_to_all_and_barrier_costs(world):
    n, get = world
    total = (NUMEL // n) * n * ELEM
    msgs, sent, _, rounds = get("all_to_all", "linear")
    assert msgs == [n - 1] * n and sent == [(n - 1) * total // n] * n and rounds == 1
    msgs, sent, _, rounds = get("all_to_all", "pairwise")
    assert msgs == [n - 1] * n and sent == [(n - 1) * total // n] * n and rounds == n - 1
    L = math.ceil(math.log2(n))
    msgs, sent, _, rounds = get("barrier", "dissemination")
    assert msgs == [L] * n and sent == [L] * n and rounds == L


def test_every_algorithm_has_a_cost_check():
    # a new algorithm must get a cost check above: this list is the inventory
    checked = {"all_reduce": 6, "broadcast": 4, "reduce": 2, "scatter": 2, "gather": 2,
               "all_gather": 2, "reduce_scatter": 2, "all_to_all": 2, "barrier": 1}
    assert {c: len(a) for c, a in ALGORITHMS.items()} == checked


def verbose_world(rank, n):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
        collectives.all_reduce(torch.ones(NUMEL), algorithm="ring")
    return out.getvalue()


@pytest.mark.parametrize("flag", ["1", "0"])
def test_verbose_prints_every_message(flag):
    # COLLECTIVES_VERBOSE=1: one line per message this rank sent or received, as it completes
    printed = run_world(verbose_world, 3, env={"COLLECTIVES_VERBOSE": flag})
    for rank, text in enumerate(printed):
        lines = text.splitlines()
        if flag == "0":
            assert lines == []
            continue
        assert len(lines) == 2 * 2 * (3 - 1), text                 # 2(N-1) steps, a send and a receive each
        assert all(line.startswith(f"[rank {rank}] all_reduce/ring step ") for line in lines), text
        assert sum(f"send {S // 3} B -> {(rank + 1) % 3}" in line for line in lines) == 4, text
        assert sum(f"recv {S // 3} B <- {(rank - 1) % 3}" in line for line in lines) == 4, text


def test_only_the_door_sends():
    """No module but the door posts point-to-point messages, so the counts above see every byte.

    ``bench_call`` is the one exception: it times bare torch calls against the door.
    """
    import pathlib
    import re
    package = pathlib.Path(collectives.__file__).parent
    p2p = re.compile(r"\bdist\.(i?send|i?recv|batch_isend_irecv|P2POp)\b|\.(send|recv)\(\[")
    offenders = [f"{path.relative_to(package)}:{n}"
                 for path in sorted(package.rglob("*.py"))
                 if path.name not in ("p2p_communications.py", "bench_call.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if p2p.search(line)]
    assert offenders == []
