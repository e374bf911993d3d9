"""Soak: a seeded random program of collectives on 4 ranks, each result checked twice.

Every rank draws the same program from one seed: which collective and which
algorithm (every pair, and the default, in a seeded order that visits them all
every round), the group (the world, or ranks {1, 2, 3}: rank 0 skips those
calls), dtype (float32, bfloat16, int64), op, shape (0 to 4099 elements), root,
blocking or ``async_op=True`` (handles waited in shuffled order, now and then
or at the end, so calls on both groups are in flight together), aliased
buffers (the output inside the input list, as a user may write), and now and
then ``COLLECTIVES_DEBUG=1``.

Each call's inputs are first given to torch's built-in (``torch.distributed``,
blocking, on copies, unaliased), and ours must give exactly its result; the
inputs encode the rank so that every result also has a closed form, which is
checked too (tests/expected.py) and is the only reference where this torch's
gloo lacks the call (all_to_all with pieces of different sizes, say). A
failure names the seed, the call and the rank; replay with::

    COLLECTIVES_SOAK_SEED=<seed> python -m pytest tests/test_soak.py

``COLLECTIVES_SOAK_OPS`` sets the number of calls (default 300; the issue's
full run is ``COLLECTIVES_SOAK_OPS=1000``).
"""
import os
import random
import re
import time

import torch
import torch.distributed as dist

import collectives as C
from tests.expected import OP_NAMES, OPS_FOR, assert_same, kind, payload, reduce_expected, \
    reduce_input
from tests.worlds import run_world

WORLD = 4
SEED = int(os.environ.get("COLLECTIVES_SOAK_SEED", 20261123))
OPS = int(os.environ.get("COLLECTIVES_SOAK_OPS", 300))
GROUPS = ((0, 1, 2, 3), (1, 2, 3))   # overlapping: ranks 1-3 are in both
DTYPES = (torch.float32, torch.bfloat16, torch.int64)
SHAPES = ((0,), (1,), (3,), (2, 5), (64,), (257,), (1000,), (4099,))
REDUCING = ("reduce", "all_reduce", "reduce_scatter")
ALIASABLE = ("scatter", "gather", "all_gather", "reduce_scatter", "all_to_all")
PAIRS = [(c, a) for c, algos in C.ALGORITHMS.items() for a in (None,) + tuple(algos)]


def program(seed, ops):
    """The calls, the same on every rank: a list of dicts."""
    rng = random.Random(seed)
    calls, order = [], []
    for i in range(ops):
        if not order:   # every (collective, algorithm) once per round, in a seeded order
            order = rng.sample(PAIRS, len(PAIRS))
        collective, algorithm = order.pop()
        members = rng.choice(GROUPS)
        dtype = rng.choice(DTYPES)
        calls.append(dict(
            i=i, collective=collective, algorithm=algorithm, members=members, dtype=dtype,
            op=rng.choice(OPS_FOR[kind(dtype)]) if collective in REDUCING else None,
            shape=rng.choice(SHAPES), root=rng.choice(members),
            async_op=rng.random() < 0.4, wait_now=rng.random() < 0.3,
            alias=collective in ALIASABLE and rng.random() < 0.35, debug=rng.random() < 0.1,
            uneven=rng.random() < 0.5))
        # (Bruck's all_to_all refuses uneven pieces: tests/test_collectives.py checks that)
        calls[-1]["uneven"] &= collective == "all_to_all" and not calls[-1]["alias"] and algorithm != "bruck"
    return calls


def describe(c):
    op = f", op={OP_NAMES[c['op']]}" if c["op"] is not None else ""
    return (f"#{c['i']} {c['collective']}(algorithm={c['algorithm']}, dtype={c['dtype']}, "
            f"shape={list(c['shape'])}{op}, root={c['root']}, group={list(c['members'])}, "
            f"async_op={c['async_op']}, alias={c['alias']}, debug={c['debug']})")


def _roll(t, k):
    return t.flatten().roll(k).reshape(t.shape) if t.numel() else t


def make(c, me, api, alias, **kw):
    """Build this rank's buffers, call ``api``'s collective; return (handle, outputs, closed form).

    ``outputs`` are the tensors the call writes on this rank; ``closed`` their expected values.
    """
    name, members, shape, dtype, op, root = (c[k] for k in ("collective", "members", "shape",
                                                             "dtype", "op", "root"))
    n, g = len(members), members.index(me)
    base = 1000 * c["i"]

    def data(owner, k=0):   # what rank ``owner`` holds, entry k: a movement collective's input
        return payload(base + 10 * owner + k, shape, dtype)

    def zeros():
        return torch.zeros(shape, dtype=dtype)
    group = c["group"]
    if name == "broadcast":
        t = data(me) if me == root else zeros()
        return api.broadcast(t, src=root, group=group, **kw), [t], [data(root)]
    if name == "reduce":
        t = reduce_input(g, shape, dtype, op)
        want = reduce_expected([reduce_input(j, shape, dtype, op) for j in range(n)], op)
        handle = api.reduce(t, dst=root, op=op, group=group, **kw)
        return (handle, [t], [want]) if me == root else (handle, [], [])
    if name == "all_reduce":
        t = reduce_input(g, shape, dtype, op)
        want = reduce_expected([reduce_input(j, shape, dtype, op) for j in range(n)], op)
        return api.all_reduce(t, op=op, group=group, **kw), [t], [want]
    if name == "scatter":
        t, pieces = zeros(), None
        if me == root:
            pieces = [data(me, k) for k in range(n)]
            if alias:
                t = pieces[g]
        return api.scatter(t, pieces, src=root, group=group, **kw), [t], [data(root, g)]
    if name == "gather":
        t, out = data(me), None
        if me == root:
            out = [zeros() for _ in range(n)]
            if alias:
                out[g] = t
        handle = api.gather(t, out, dst=root, group=group, **kw)
        return (handle, out, [data(m) for m in members]) if me == root else (handle, [], [])
    if name == "all_gather":
        out = [zeros() for _ in range(n)]
        t = data(me)
        if alias:
            out[g] = t
        return api.all_gather(out, t, group=group, **kw), out, [data(m) for m in members]
    if name == "reduce_scatter":
        def entry(j, k):   # member j's input_list[k]: rolled by k so that entries differ
            return _roll(reduce_input((j + k) % n, shape, dtype, op), k)
        ins = [entry(g, k) for k in range(n)]
        out = ins[g] if alias else zeros()
        want = reduce_expected([entry(j, g) for j in range(n)], op)
        return api.reduce_scatter(out, ins, op=op, group=group, **kw), [out], [want]
    if name == "all_to_all":
        numel = int(torch.Size(shape).numel())

        def piece(src, dst):   # what group rank src sends to dst; uneven unless aliased
            size = (numel + src + 2 * dst) % 11 if c["uneven"] else numel
            return payload(base + 10 * src + dst, (size,), dtype)
        ins = [piece(g, k) for k in range(n)]
        outs = ins if alias else [torch.zeros(piece(k, g).shape, dtype=dtype) for k in range(n)]
        return api.all_to_all(outs, ins, group=group, **kw), outs, [piece(k, g) for k in range(n)]
    return api.barrier(group=group, **kw), [], []


def _builtin(c, me):
    """The built-in's outputs for this call (blocking, unaliased), or None where it lacks it."""
    if c["uneven"]:
        return None   # gloo's alltoall wants equal pieces ("invalid tensor size")
    try:
        _, outputs, _ = make(c, me, dist, alias=False)
        return outputs
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        text = str(exc).lower()
        if any(s in text for s in ("not supported", "unsupported", "cannot use", "not implemented",
                                   "does not support")):
            return None
        raise


def _soak_world(rank, world_size, seed, ops, report_dir):
    """Run the program; on a failure, leave its text in ``report_dir`` before raising: the
    other ranks then fail too (their peer is gone), and the test reports the first call."""
    try:
        return _run_program(rank, seed, ops)
    except BaseException as exc:
        with open(os.path.join(report_dir, f"rank{rank}.txt"), "w") as f:
            f.write(str(exc))
        raise


def _run_program(rank, seed, ops):
    groups = {m: dist.new_group(list(m)) for m in GROUPS}
    calls = program(seed, ops)
    pending, stats = [], dict(done=0, builtin=0, closed_only=0, lacking=set())
    start = time.monotonic()
    for c in calls:
        if rank not in c["members"]:
            continue
        c["group"] = groups[c["members"]]
        try:
            reference = _builtin(c, rank)
            os.environ["COLLECTIVES_DEBUG"] = "1" if c["debug"] else "0"
            handle, outputs, closed = make(c, rank, C, alias=c["alias"], algorithm=c["algorithm"],
                                           async_op=c["async_op"])
        except Exception as exc:
            raise AssertionError(f"soak seed={seed}, call {describe(c)} on rank {rank}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        assert isinstance(handle, C.Work) == c["async_op"], f"seed={seed} {describe(c)}: {handle!r}"
        pending.append((c, handle, outputs, closed, reference))
        if not c["async_op"] or c["wait_now"]:
            _finish(pending, random.Random(seed + c["i"]), seed, rank, stats)
            pending = []
    _finish(pending, random.Random(seed), seed, rank, stats)
    stats["seconds"] = time.monotonic() - start
    stats["lacking"] = sorted(stats["lacking"])
    return stats


def _finish(pending, rng, seed, rank, stats):
    """Wait for the outstanding calls in a shuffled order, then check every result."""
    for c, handle, *_ in rng.sample(pending, len(pending)):
        try:
            if handle is not None:
                handle.wait()
        except Exception as exc:
            raise AssertionError(f"soak seed={seed}, call {describe(c)} on rank {rank}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    for c, _, outputs, closed, reference in pending:
        where = f"soak seed={seed}, call {describe(c)} on rank {rank}"
        for k, (got, want) in enumerate(zip(outputs, closed, strict=True)):
            try:
                assert_same(got, want, f"output {k} against the closed form")
            except AssertionError as exc:
                raise AssertionError(f"{where}: wrong result: {exc}") from exc
            if reference is not None and not torch.equal(got, reference[k]):
                raise AssertionError(f"{where}: output {k} differs from the built-in's: "
                                     f"{got.flatten()[:8].tolist()} vs "
                                     f"{reference[k].flatten()[:8].tolist()}")
        stats["done"] += 1
        if reference is None:
            stats["closed_only"] += 1
            stats["lacking"].add("uneven all_to_all" if c["uneven"] else
                                 f"{c['collective']}/{c['dtype']}/{OP_NAMES.get(c['op'], '-')}")
        else:
            stats["builtin"] += 1


def test_program_covers_the_space():
    """The drawn program has what the soak claims: every pair, both groups, every dtype, async,
    aliasing, sizes 0 to thousands (checked without a world: cheap)."""
    calls = program(SEED, max(OPS, len(PAIRS)))
    def seen(key):
        return {c[key] for c in calls}
    assert {(c["collective"], c["algorithm"]) for c in calls} == set(PAIRS)
    assert seen("members") == set(GROUPS) and seen("dtype") == set(DTYPES)
    assert seen("async_op") == {True, False} and True in seen("alias")
    assert {(0,), (4099,)} <= seen("shape")


def test_soak_random_collectives(tmp_path):
    print(f"soak seed={SEED} ops={OPS} (replay: COLLECTIVES_SOAK_SEED={SEED})")
    start = time.monotonic()
    try:
        out = run_world(_soak_world, WORLD, SEED, OPS, str(tmp_path), timeout=240 + OPS * 0.5,
                        env={"COLLECTIVES_TIMEOUT": "30"})
    except (AssertionError, TimeoutError, RuntimeError) as exc:
        reports = [p.read_text() for p in sorted(tmp_path.glob("rank*.txt"))]
        first = min(reports, key=lambda t: int(m.group(1)) if (m := re.search(r"call #(\d+)", t))
                    else 1 << 30, default=str(exc))
        raise AssertionError(f"soak failed with seed {SEED}; replay with "
                             f"COLLECTIVES_SOAK_SEED={SEED} python -m pytest tests/test_soak.py\n"
                             f"first failing call: {first}\n\nas the world reported it:\n"
                             f"{exc}") from None
    calls = program(SEED, OPS)
    for r in range(WORLD):
        assert out[r]["done"] == sum(r in c["members"] for c in calls), out[r]
    print(f"wall {time.monotonic() - start:.1f} s; per rank: "
          + "; ".join(f"rank {r}: {s['done']} calls ({s['builtin']} against the built-in, "
                      f"{s['closed_only']} closed form only) in {s['seconds']:.1f} s"
                      for r, s in enumerate(out)))
    print("closed form only (the built-in lacks them):", ", ".join(out[1]["lacking"]))
