"""Point-to-point only: while a collective runs, nothing but its own messages may be touched.

An independent conformance run switches off every torch.distributed built-in, the c10d Store
included, while a collective runs (issue 38). Here the same: after ``init_process_group`` (and
the groups' creation, which is collective and may use the rendezvous store), every Store
method and every torch.distributed collective raise. Then every collective runs, with
``algorithm=None`` (the group's first call agrees on the tuning tables over our own messages)
and with every algorithm by name, through the public API, the tensor API, point-to-point and
the torch backend. The answers have closed forms of the rank.
"""
import contextlib

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import p2p_api
from collectives.algorithms import ALGORITHMS

from .worlds import run_world

STORE_METHODS = ("add", "append", "barrier", "check", "compare_set", "delete_key", "get", "list_keys",
                 "multi_get", "multi_set", "num_keys", "queue_len", "queue_pop", "queue_push", "set",
                 "set_timeout", "wait")
BUILT_INS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
             "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
             "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object",
             "scatter_object_list", "send", "recv", "isend", "irecv", "batch_isend_irecv")


class Touched(RuntimeError):
    pass


@contextlib.contextmanager
def only_messages(builtins=True):
    """Every Store method raises (and, with ``builtins``, every torch.distributed collective)."""
    saved = []

    def refuse(name):
        def touched(*args, **kwargs):
            raise Touched(f"{name} was called while a collective ran")
        return touched
    for cls in (dist.Store, dist.TCPStore, dist.PrefixStore, dist.FileStore, dist.HashStore):
        for name in STORE_METHODS:
            if name in vars(cls):
                saved.append((cls, name, vars(cls)[name]))
                setattr(cls, name, refuse(f"{cls.__name__}.{name}"))
    if builtins:
        for name in BUILT_INS:
            if hasattr(dist, name):
                saved.append((dist, name, getattr(dist, name)))
                setattr(dist, name, refuse(f"torch.distributed.{name}"))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _every_call(rank, n, group, algorithm, collective):
    """Run ``collective`` once with ``algorithm``; return what rank 0 and the answer say."""
    C = collectives
    r = float(rank + 1)
    total = n * (n + 1) / 2
    if collective == "all_reduce":
        t = torch.full((5,), r)
        C.all_reduce(t, group=group, algorithm=algorithm)
        return t.tolist() == [total] * 5
    if collective == "broadcast":
        t = torch.full((5,), r)
        C.broadcast(t, src=n - 1, group=group, algorithm=algorithm)
        return t.tolist() == [float(n)] * 5
    if collective == "reduce":
        t = torch.full((5,), r)
        C.reduce(t, dst=0, group=group, algorithm=algorithm)
        return rank != 0 or t.tolist() == [total] * 5
    if collective == "all_gather":
        out = [torch.zeros(3) for _ in range(n)]
        C.all_gather(out, torch.full((3,), r), group=group, algorithm=algorithm)
        return [o[0].item() for o in out] == [float(i + 1) for i in range(n)]
    if collective == "gather":
        out = [torch.zeros(3) for _ in range(n)] if rank == 0 else None
        C.gather(torch.full((3,), r), out, dst=0, group=group, algorithm=algorithm)
        return rank != 0 or [o[0].item() for o in out] == [float(i + 1) for i in range(n)]
    if collective == "scatter":
        ins = [torch.full((3,), 10.0 + i) for i in range(n)] if rank == 0 else None
        t = torch.zeros(3)
        C.scatter(t, ins, src=0, group=group, algorithm=algorithm)
        return t.tolist() == [10.0 + rank] * 3
    if collective == "reduce_scatter":
        out = torch.zeros(2)
        C.reduce_scatter(out, [torch.full((2,), r * (i + 1)) for i in range(n)], group=group,
                         algorithm=algorithm)
        return out.tolist() == [total * (rank + 1)] * 2
    if collective == "all_to_all":
        outs = [torch.zeros(2) for _ in range(n)]
        C.all_to_all(outs, [torch.full((2,), 10.0 * rank + j) for j in range(n)], group=group,
                     algorithm=algorithm)
        return [o[0].item() for o in outs] == [10.0 * i + rank for i in range(n)]
    if collective == "barrier":
        C.barrier(group=group, algorithm=algorithm)
        return True
    raise AssertionError(collective)


def _tensor_and_p2p(rank, n, group):
    C = collectives
    out = torch.zeros(2 * n)
    C.all_gather_into_tensor(out, torch.full((2,), rank + 1.0), group=group)
    ok = out.tolist() == [float(i // 2 + 1) for i in range(2 * n)]
    rs = torch.zeros(1)
    C.reduce_scatter_tensor(rs, torch.arange(float(n)) + rank, group=group)
    ok &= rs.item() == n * rank + n * (n - 1) / 2
    single = torch.zeros(n)
    C.all_to_all_single(single, torch.full((n,), float(rank)), group=group)
    ok &= single.tolist() == [float(i) for i in range(n)]
    if n == 1:
        return bool(ok)   # a rank cannot message itself (nor can torch's)
    # a ring of point-to-point messages, posted together
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.zeros(1)
    works = p2p_api.batch_isend_irecv([p2p_api.P2POp(p2p_api.isend, torch.tensor([float(rank)]), right),
                                       p2p_api.P2POp(p2p_api.irecv, got, left)])
    for w in works:
        w.wait()
    ok &= got.item() == float(left)
    return bool(ok)


def _api_world(rank, n):
    torch.set_num_threads(1)
    results = {}
    # a fresh group per pass: its first call is where it agrees (algorithm=None: the tables)
    groups = [dist.new_group(list(range(n))) for _ in range(2)]
    with only_messages():
        for collective in ALGORITHMS:
            results[(collective, None)] = _every_call(rank, n, groups[0], None, collective)
        for collective, names in ALGORITHMS.items():
            for name in names:
                results[(collective, name)] = _every_call(rank, n, groups[1], name, collective)
        results["tensor_and_p2p"] = _tensor_and_p2p(rank, n, groups[0])
    return results


@pytest.mark.parametrize("n", [1, 3, 4])
def test_every_collective_uses_only_its_own_messages(n):
    for rank, results in enumerate(run_world(_api_world, n, timeout=300)):
        wrong = [k for k, ok in results.items() if not ok]
        assert not wrong, f"rank {rank}: wrong answers for {wrong}"


def _backend_world(rank, n):
    torch.set_num_threads(1)
    group = dist.new_group(list(range(n)), backend="collectives")   # creating a group may use the store
    with only_messages(builtins=False):   # the program's dist.* calls are the way in here
        t = torch.full((4,), rank + 1.0)
        dist.all_reduce(t, group=group)
        out = [torch.zeros(2) for _ in range(n)]
        dist.all_gather(out, torch.full((2,), float(rank)), group=group)
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=0, group=group)
        dist.barrier(group=group)
        # collectives.* on the backend's group runs on the same agreed group
        c = torch.ones(2)
        collectives.all_reduce(c, group=group)
    return (t.tolist() == [n * (n + 1) / 2] * 4 and [o[0].item() for o in out] == list(map(float, range(n)))
            and b.tolist() == [0.0] * 3 and c.tolist() == [float(n)] * 2)


def test_the_backend_uses_only_its_own_messages():
    assert all(run_world(_backend_world, 3, timeout=240))


def _store_refused_world(rank, n):
    """Without the patch lifted, the check itself works: a Store call raises Touched."""
    with only_messages():
        try:
            dist.distributed_c10d._get_default_store().get("anything")
        except Touched:
            return True
    return False


def test_the_check_catches_a_store_call():
    assert all(run_world(_store_refused_world, 2, timeout=120))


def _default_device_world(rank, n):
    """A program that set torch's default device elsewhere (a GPU, in tests/test_gpu.py; here
    'meta', which no transport sends) still agrees: the agreement's buffers name their device."""
    from collectives.group import group_info
    from collectives.p2p_communications import Comm
    from collectives.tuning import agreed
    info = group_info(dist.new_group(list(range(n))), "test")
    torch.set_default_device("meta")
    try:
        found = agreed.of(info, lambda: Comm(info, "agree", "agreement", 0, "agree(test)"))
    finally:
        torch.set_default_device(None)
    return found.hosts, found.local_pids[rank] == __import__("os").getpid()


def test_the_agreement_ignores_the_default_device():
    for hosts, mine in run_world(_default_device_world, 3, timeout=120):
        assert hosts == (0, 0, 0) and mine
