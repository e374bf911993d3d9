"""Pipeline parallelism (collectives/parallel/pipeline.py) and the point-to-point API under it.

* the point-to-point API: messages arrive, in order, numbered per direction (ranks that
  did not take part in a message still agree with the others on the next collective);
  bad arguments raise before anything is sent;
* GPipe and 1F1B on 1-4 stages, m below and above p: the parameters after three SGD
  steps are bitwise those of one process running the same micro-batches in turn
  (each stage's backwards run in micro-batch order, so every gradient sums in the same
  order);
* traffic: one step sends m activations forward and m gradients back, A bytes each, per
  boundary (the formula of chapter 16), and one 16-byte check header each way, counted by
  ``count_traffic``;
* a bad step (unequal micro-batches, too few targets, stages disagreeing on m) is refused
  on every stage with one ValueError within seconds, whichever stage saw it;
* 1F1B holds at most p - s micro-batches' activations on stage s; GPipe holds m.
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives import p2p_api
from collectives.parallel.pipeline import PipelineStage, cost, gpipe, one_f_one_b, split_sizes
from collectives.parallel.pipeline_interleaved import InterleavedStage
from collectives.parallel.pipeline_zero_bubble import ZeroBubbleStage
from tests.worlds import assert_refused_alike, attempt, run_world

WIDTH, BATCH, BLOCKS, STEPS, LR = 6, 8, 5, 3, 0.1


def blocks():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()).double() for _ in range(BLOCKS)]


def batch(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64),
            torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64))


def loss_fn(y, t):
    return (y - t).pow(2).mean()


def reference(m):
    """One process: the micro-batches in turn, gradients accumulated, one SGD step per batch."""
    model = nn.Sequential(*blocks())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        x, t = batch(step)
        for xi, ti in zip(x.chunk(m), t.chunk(m)):
            (loss_fn(model(xi), ti) / m).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _pipeline(rank, p, m, schedule, group):
    sizes = split_sizes(BLOCKS, p)
    first = sum(sizes[:rank])
    module = nn.Sequential(*blocks()[first:first + sizes[rank]])
    stage = PipelineStage(module, recv_shape=(BATCH // m, WIDTH), group=group, dtype=torch.float64)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    traffic = None
    for step in range(STEPS):
        opt.zero_grad()
        x, t = batch(step)
        with collectives.count_traffic() as counted:
            stage.step(m, list(x.chunk(m)) if stage.first else None, list(t.chunk(m)) if stage.last else None,
                       loss_fn, schedule)
        traffic = traffic or counted
        opt.step()
    ref = reference(m)
    mine = [q.detach() for q in module.parameters()]
    start = 2 * first            # weight and bias per block
    return dict(equal=all(torch.equal(a, b) for a, b in zip(mine, ref[start:start + len(mine)])),
                traffic=(traffic.sent_bytes, traffic.sent_messages, traffic.recv_bytes, traffic.recv_messages),
                held=stage.peak_held)


def _pipelines(rank, world_size):
    out = {}
    for p in (1, 2, 3, 4):
        group = dist.new_group(list(range(p)))
        for m in (1, 2, 4):
            for schedule in ("gpipe", "1f1b"):
                if rank < p:
                    out[p, m, schedule] = _pipeline(rank, p, m, schedule, group)
        collectives.barrier()
    return out


def test_pipeline_equals_one_process_and_moves_what_the_formula_says():
    results = run_world(_pipelines, 4)
    checked = 0
    for rank, out in enumerate(results):
        for (p, m, schedule), r in out.items():
            where = f"rank {rank}, p={p}, m={m}, {schedule}"
            assert r["equal"], f"{where}: parameters differ from one process"
            a = (BATCH // m) * WIDTH * 8                       # one micro-batch's activation, float64
            neighbours = (rank < p - 1) + (rank > 0)
            sends = m * neighbours                             # activations forward, gradients back
            # and the step's check: one 16-byte header to each neighbouring stage, one from each
            moved = (sends * a + 16 * neighbours, sends + neighbours)
            assert r["traffic"] == moved + moved, where
            assert cost(p, m, rank, a) == dict(messages=moved[1], bytes=moved[0]), where
            assert r["held"] == (m if schedule == "gpipe" else min(p - rank, m)), where
            checked += 1
    assert checked == 4 * 6 + 3 * 6 + 2 * 6 + 6


def test_schedules_run_every_micro_batch_once():
    for p in (1, 2, 3, 5):
        for m in (1, 2, 3, 8):
            for s in range(p):
                for schedule in (gpipe, one_f_one_b):
                    ops = schedule(p, m, s)
                    assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
                    assert [i for k, i in ops if k == "B"] == list(range(m))   # backwards in order
                    assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
    assert one_f_one_b(4, 6, 0) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1),
                                    ("F", 5), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert one_f_one_b(4, 6, 3) == [x for i in range(6) for x in (("F", i), ("B", i))]


def _p2p(rank, world_size):
    out = {}
    # 0 -> 1 three times, 1 -> 0 once (async, posted before the receives); rank 2 does none of it
    if rank == 0:
        works = [p2p_api.isend(torch.full((3,), float(k)), 1) for k in range(3)]
        back = torch.zeros(2)
        p2p_api.recv(back, 1)
        for w in works:
            w.wait()
        out["back"] = back.tolist()
    elif rank == 1:
        got = [torch.zeros(3) for _ in range(3)]
        ops = [p2p_api.P2POp(p2p_api.irecv, g, 0) for g in got] + \
              [p2p_api.P2POp(p2p_api.isend, torch.tensor([5.0, 6.0]), 0)]
        with collectives.count_traffic() as counted:
            for w in p2p_api.batch_isend_irecv(ops):
                w.wait()
        out["got"] = [g.tolist() for g in got]
        out["traffic"] = (counted.sent_bytes, counted.sent_messages, counted.recv_bytes, counted.recv_messages)
    if rank in (0, 1):      # empty and non-contiguous tensors
        if rank == 0:
            p2p_api.send(torch.zeros(0), 1)
            p2p_api.send(torch.arange(6.0).view(2, 3).t(), 1, tag=7)
        else:
            p2p_api.recv(torch.zeros(0), 0)
            t = torch.zeros(2, 3).t()
            p2p_api.recv(t, 0, tag=7)
            out["strided"] = t.tolist()
    # the next collective still pairs on every rank: point-to-point took no call number
    t = torch.tensor([float(rank)])
    collectives.all_reduce(t)
    out["sum"] = t.item()
    errors = []
    for bad in (lambda: p2p_api.send(torch.zeros(1), rank), lambda: p2p_api.send(torch.zeros(1), world_size),
                lambda: p2p_api.send(torch.zeros(1), (rank + 1) % world_size, tag=-1),
                lambda: p2p_api.send([1.0], (rank + 1) % world_size),
                lambda: p2p_api.batch_isend_irecv([p2p_api.P2POp(dist.isend, torch.zeros(1), 0)])):
        try:
            bad()
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    out["errors"] = errors
    return out


def test_point_to_point_api():
    r = run_world(_p2p, 3)
    assert r[0]["back"] == [5.0, 6.0]
    assert r[1]["got"] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]
    assert r[1]["traffic"] == (8, 1, 36, 3)
    assert r[1]["strided"] == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert all(x["sum"] == 3.0 for x in r)
    for x in r:
        assert len(x["errors"]) == 5, x["errors"]
        assert "cannot message itself" in x["errors"][0]
        assert "out of range" in x["errors"][1]
        assert "tag" in x["errors"][2]


def _wrong_size(rank, world_size):
    try:
        if rank == 0:
            p2p_api.send(torch.zeros(4), 1)
        else:
            # the receiver waits longer, so that the sender's timeout comes first: gloo in torch 2.11
            # can close a pair when a wait on it times out, and a rank whose own timer had not yet
            # fired would then see a closed connection instead of its own timeout
            os.environ["COLLECTIVES_TIMEOUT"] = "4"
            p2p_api.recv(torch.zeros(8), 0)
    except collectives.CollectiveError as exc:
        # stay until the other rank has its own error too: leaving would close the connection under
        # its wait (a fixed sleep here left that to the clock)
        store = dist.distributed_c10d._get_default_store()
        store.set(f"wrong_size_failed_{rank}", "1")
        store.wait([f"wrong_size_failed_{1 - rank}"], timedelta(seconds=30))
        return str(exc)
    return "no error"


def test_a_receive_of_the_wrong_size_waits_and_is_explained():
    """The size is in the tag: 16 bytes never fill a 32-byte receive; both sides time out, named."""
    r = run_world(_wrong_size, 2, env={"COLLECTIVES_TIMEOUT": "2"})
    assert "timed out after 2 s waiting to send 16 bytes to rank 1" in r[0], r
    # the receiver times out too, unless the sender's timeout closed the connection first (gloo in
    # torch 2.11): either way it names the 32 bytes it waited for and the rank, and never returns
    # half-filled data
    assert "32 bytes from rank 0" in r[1], r[1]
    assert "timed out after 4 s" in r[1] or "closed the connection" in r[1], r[1]


STAGES = {"1f1b": PipelineStage, "zb-h1": ZeroBubbleStage,
          "interleaved": lambda module, **kw: InterleavedStage([module], **kw)}


def _refused(rank, world_size):
    """Each kind of stage, three bad steps, each caught; then a good step on the same stages."""
    out = {}
    for kind, make in STAGES.items():
        stage = make(nn.Linear(WIDTH, WIDTH).double(), recv_shape=(3, WIDTH), dtype=torch.float64)
        first, last = rank == 0, rank == world_size - 1
        ten, twelve = torch.zeros(10, WIDTH, dtype=torch.float64), torch.zeros(12, WIDTH, dtype=torch.float64)
        bad = {
            # a batch of 10 in 4 chunks: 3, 3, 3, 1 (the first stage holds them)
            "unequal": (4, list(ten.chunk(4)) if first else None, list(twelve.chunk(4)) if last else None),
            # the last stage was given 3 targets for 4 micro-batches
            "targets": (4, list(twelve.chunk(4)) if first else None, list(twelve.chunk(4))[:3] if last else None),
            # stage 1 thinks there are 2 micro-batches
            "m": (2 if rank == 1 else 4, list(twelve.chunk(4)) if first else None,
                  list(twelve.chunk(4)) if last else None),
        }
        for case, (m, xs, ts) in bad.items():
            out[case, kind] = attempt(stage.step, m, xs, ts, loss_fn)
        # the group is still usable: nothing was sent but the small check headers
        x = torch.arange(12 * WIDTH, dtype=torch.float64).view(12, WIDTH)
        loss = stage.step(4, list(x.chunk(4)) if first else None, list(x.chunk(4)) if last else None, loss_fn)
        out["after", kind] = loss if last else None
    return out


def test_bad_steps_are_refused_on_every_stage_with_one_error_at_once():
    """A batch of 10 in 4 micro-batches, 3 targets for 4, stages disagreeing on m: the stage
    that sees it refuses, the check header carries its words down the pipeline and back, and
    every stage raises the same ValueError within seconds, not after COLLECTIVES_TIMEOUT (60 s
    here). The first stage catches its error and lives, as a caller would; the next step works."""
    results = run_world(_refused, 3, env={"COLLECTIVES_TIMEOUT": "60"})
    words = {"unequal": "stage 0 (rank 0): micro-batches of unequal size [(3, 6), (3, 6), (3, 6), (1, 6)]",
             "targets": "stage 2 (rank 2): the last stage needs m=4 targets and a loss_fn, got 3 targets",
             "m": "stage 1 (rank 1) was given m=2 micro-batches where stage 0 was given m=4"}
    for kind in STAGES:
        assert_refused_alike(results, {(case, kind): said for case, said in words.items()})
        assert results[2]["after", kind] is not None, kind
