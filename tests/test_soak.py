"""Soak: a few hundred random collectives on 4 ranks, each checked against torch.

Every rank draws the same program from one seed: collective, algorithm (or the
default), dtype, op, shape, root, group (the world or a subgroup; ranks outside
it call too and must get None), blocking or ``async_op=True`` (handles waited
in shuffled order), and, now and then, ``COLLECTIVES_DEBUG=1``. Inputs encode
the rank, so every rank computes each expected result itself with torch's own
reductions (tests/expected.py). A failure prints the seed; replay with::

    COLLECTIVES_SOAK_SEED=<seed> python -m pytest tests/test_soak.py
"""
import os
import random
import time

import torch
import torch.distributed as dist

import collectives as C
from tests.expected import ALL_DTYPES, OP_NAMES, OPS_FOR, assert_same, kind, payload, \
    reduce_expected, reduce_input
from tests.worlds import run_world

WORLD = 4
SEED = int(os.environ.get("COLLECTIVES_SOAK_SEED", 20261122))
STEPS = int(os.environ.get("COLLECTIVES_SOAK_STEPS", 300))
GROUPS = ([0, 1, 2, 3], [0, 2, 3], [1, 3], [2])
SHAPES = ((0,), (1,), (3,), (7,), (2, 5), (1001,))
REDUCING = ("reduce", "all_reduce", "reduce_scatter")


def draw(rng, step):
    """One random call, the same on every rank."""
    collective = rng.choice(list(C.ALGORITHMS))
    members = rng.choice(GROUPS)
    dtype = rng.choice(ALL_DTYPES)
    return dict(
        step=step, collective=collective, members=members, dtype=dtype,
        algorithm=rng.choice((None,) + C.ALGORITHMS[collective]),
        op=rng.choice(OPS_FOR[kind(dtype)]) if collective in REDUCING else None,
        shape=rng.choice(SHAPES), root=rng.choice(members),
        async_op=rng.random() < 0.3, debug=rng.random() < 0.15, wait_now=rng.random() < 0.5,
    )


def describe(c):
    op = f", op={OP_NAMES[c['op']]}" if c["op"] is not None else ""
    return (f"#{c['step']} {c['collective']}(algorithm={c['algorithm']}, dtype={c['dtype']}, "
            f"shape={list(c['shape'])}{op}, root={c['root']}, group={c['members']}, "
            f"async_op={c['async_op']}, debug={c['debug']})")


def issue(c, group, rank):
    """Make this rank's inputs, call the collective; return (handle, check) where check()
    asserts the results once the call is done."""
    name, members, shape, dtype, op = (c[k] for k in ("collective", "members", "shape",
                                                      "dtype", "op"))
    n, me = len(members), rank
    g = members.index(me) if me in members else 0
    seed = 100 * c["step"]

    def data(owner, k=0):
        return payload(seed + 10 * owner + k, shape, dtype)

    kw = dict(group=group, async_op=c["async_op"], algorithm=c["algorithm"])
    if name in REDUCING:
        inputs = [reduce_input(m, shape, dtype, op) for m in members]
    if name == "broadcast":
        t = data(me) if me == c["root"] else torch.zeros(shape, dtype=dtype)
        handle = C.broadcast(t, src=c["root"], **kw)
        return handle, lambda: assert_same(t, data(c["root"]), "broadcast")
    if name == "reduce":
        t = reduce_input(me, shape, dtype, op)
        before = t.clone()
        handle = C.reduce(t, dst=c["root"], op=op, **kw)
        want = reduce_expected(inputs, op) if me == c["root"] else before
        return handle, lambda: assert_same(t, want, "reduce")
    if name == "all_reduce":
        t = reduce_input(me, shape, dtype, op)
        handle = C.all_reduce(t, op=op, **kw)
        return handle, lambda: assert_same(t, reduce_expected(inputs, op), "all_reduce")
    if name == "scatter":
        t = torch.zeros(shape, dtype=dtype)
        pieces = [data(me, k) for k in range(n)] if me == c["root"] else None
        handle = C.scatter(t, pieces, src=c["root"], **kw)
        return handle, lambda: assert_same(t, data(c["root"], g), "scatter")
    if name == "gather":
        out = [torch.zeros(shape, dtype=dtype) for _ in range(n)] if me == c["root"] else None
        handle = C.gather(data(me), out, dst=c["root"], **kw)

        def check():
            for k, m in enumerate(members if out else ()):
                assert_same(out[k], data(m), f"gather entry {k}")
        return handle, check
    if name == "all_gather":
        out = [torch.zeros(shape, dtype=dtype) for _ in range(n)]
        handle = C.all_gather(out, data(me), **kw)

        def check():
            for k, m in enumerate(members):
                assert_same(out[k], data(m), f"all_gather entry {k}")
        return handle, check
    if name == "reduce_scatter":
        out = torch.zeros(shape, dtype=dtype)
        handle = C.reduce_scatter(out, [reduce_input(me + k, shape, dtype, op) for k in range(n)],
                                  op=op, **kw)
        want = reduce_expected([reduce_input(m + g, shape, dtype, op) for m in members], op)
        return handle, lambda: assert_same(out, want, "reduce_scatter")
    if name == "all_to_all":
        numel = int(torch.Size(shape).numel())

        def piece(src, dst):   # uneven: what members[src] sends to members[dst]
            return payload(seed + 10 * src + dst, ((numel + src + 2 * dst) % 11,), dtype)
        outs = [torch.zeros((numel + k + 2 * g) % 11, dtype=dtype) for k in range(n)]
        handle = C.all_to_all(outs, [piece(g, k) for k in range(n)], **kw)

        def check():
            for k in range(n):
                assert_same(outs[k], piece(k, g), f"all_to_all entry {k}")
        return handle, check
    return C.barrier(**kw), lambda: None


def _soak_world(rank, world_size, seed, steps):
    groups = {tuple(m): dist.new_group(m) for m in GROUPS}
    rng = random.Random(seed)
    pending, done = [], 0
    start = time.monotonic()
    for step in range(steps):
        c = draw(rng, step)
        os.environ["COLLECTIVES_DEBUG"] = "1" if c["debug"] else "0"
        try:
            handle, check = issue(c, groups[tuple(c["members"])], rank)
        except Exception as exc:
            raise AssertionError(f"soak seed={seed}, call {describe(c)} on rank {rank}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        if rank not in c["members"]:
            assert handle is None, f"seed={seed} {describe(c)}: a non-member got {handle!r}"
            continue
        assert isinstance(handle, C.Work) == c["async_op"], f"seed={seed} {describe(c)}: {handle!r}"
        pending.append((c, handle if c["async_op"] else None, check))
        if not c["async_op"] or c["wait_now"]:
            done += _finish(pending, random.Random(seed + step), seed, rank)
            pending = []
    done += _finish(pending, random.Random(seed), seed, rank)
    return done, time.monotonic() - start


def _finish(pending, rng, seed, rank):
    """Wait for the outstanding calls in a shuffled order, then check every result."""
    for c, handle, _ in rng.sample(pending, len(pending)):
        try:
            if handle is not None:
                handle.wait()
        except Exception as exc:
            raise AssertionError(f"soak seed={seed}, call {describe(c)} on rank {rank}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    for c, _, check in pending:
        try:
            check()
        except AssertionError as exc:
            raise AssertionError(f"soak seed={seed}, call {describe(c)} on rank {rank}: "
                                 f"wrong result: {exc}") from exc
    return len(pending)


def test_soak_random_collectives():
    print(f"soak seed={SEED} steps={STEPS} (replay: COLLECTIVES_SOAK_SEED={SEED})")
    try:
        out = run_world(_soak_world, WORLD, SEED, STEPS, timeout=240,
                        env={"COLLECTIVES_TIMEOUT": "20"})
    except AssertionError as exc:
        raise AssertionError(f"soak failed with seed {SEED}; replay with "
                             f"COLLECTIVES_SOAK_SEED={SEED} python -m pytest tests/test_soak.py\n"
                             f"{exc}") from None
    rng, calls = random.Random(SEED), [0] * WORLD
    for step in range(STEPS):
        for r in draw(rng, step)["members"]:
            calls[r] += 1
    assert [out[r][0] for r in range(WORLD)] == calls
    print("seconds per rank:", [round(out[r][1], 1) for r in range(WORLD)])
