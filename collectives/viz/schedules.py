"""The parallelisms' communication, recorded on the simulator like any collective.

* FSDP (chapter 18): per layer, the all_gather of its shards before its forward and again
  before its backward, and the reduce_scatter of its gradient, in the order
  ``collectives.parallel.fsdp`` makes them (``api.all_gather`` and ``api.reduce_scatter``
  with the module's algorithm), each rank's piece of a layer one cell;
* MoE (chapter 19): the uneven all_to_all of tokens to experts, the counts from a seeded
  router (``collectives.parallel.moe.route``), through the algorithm ``moe.ALL_TO_ALL``;
* ring attention (chapter 20): the rotation of key/value blocks, N-1 ``post``\\ s each
  sending the held block right and receiving the left neighbour's, as ``ring_attention._ring``
  posts them (that function runs inside a process group, so its loop is restated here on the
  simulator's door);
* pipeline (chapter 16): GPipe and 1F1B, the order of work from
  ``collectives.parallel.pipeline.SCHEDULES`` (the functions the stages run), one slot per
  forward or backward, an activation sent down and a gradient up after each; the bubble is
  counted from the slots, beside ``bubble_fraction``'s (p-1)/(m+p-1).
"""
import torch

from ..parallel import fsdp as _fsdp, moe as _moe, pipeline as _pipeline
from . import model, record
from .questions import _q


def _val(r, mode, e):
    return torch.full((e,), record.contribution(r, mode), dtype=torch.int64)


FSDP_MESSAGES = 12000    # about the most messages an FSDP page draws (its 2 MB bound at 64 ranks)


def fsdp(world_size, layers=None, algorithm="ring", topology="ethernet-100g"):
    """FSDP's collectives for ``layers`` layers (each rank holds one element of each).

    ``layers``: None draws 3 where the page stays small, fewer in large worlds (each layer
    is three calls of N(N-1) ring messages: 3 layers at 64 ranks would be 36,288 messages and
    3.2 MB of page), at least 1: ``min(3, FSDP_MESSAGES // (3 N (N-1)))``."""
    n = world_size
    if layers is None:
        layers = max(1, min(3, FSDP_MESSAGES // max(1, 3 * n * (n - 1))))
    every = set(range(n))

    def calls(r, mode):
        plan = []
        for i in range(layers):      # forward: gather each layer whole
            outs = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
            plan.append(("all_gather", algorithm, [outs, _val(r, mode, 1)], outs, [{q} for q in range(n)]))
        for i in reversed(range(layers)):   # backward: gather again, then reduce-scatter the gradient
            outs = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
            plan.append(("all_gather", algorithm, [outs, _val(r, mode, 1)], outs, [{q} for q in range(n)]))
            out = torch.zeros(1, dtype=torch.int64)
            plan.append(("reduce_scatter", algorithm, [out, [_val(r, mode, 1) for _ in range(n)]], [out], [every]))
        return plan
    names = [f"forward all_gather layer {i}" for i in range(layers)]
    for i in reversed(range(layers)):
        names += [f"backward all_gather layer {i}", f"reduce_scatter grad layer {i}"]
    rec = record.record_program("fsdp", n, calls, topology, names)
    d = model.build(rec)
    d["title"] = (f"FSDP on {n} ranks: {layers} layer{'s' if layers > 1 else ''}, {algorithm} all_gather and "
                  f"reduce_scatter (chapter 18)")
    per = sum(m[3] for m in d["msgs"] if m[0] == 0 and d["labels"][m[2]].startswith("forward all_gather layer 0"))
    d["questions"] = d["questions"] + [_q("How many bytes does rank 0 send to gather layer 0 for the forward?", per,
                                          "its messages of that all_gather", unit="B")]
    return d


def moe_counts(n, tokens=8, seed=0):
    """counts[r][j]: how many of rank r's tokens the seeded router sends to expert j."""
    g = torch.Generator().manual_seed(seed)
    router = torch.nn.Linear(4, n)
    with torch.no_grad():
        router.weight.copy_(torch.randn(n, 4, generator=g))
        router.bias.zero_()
    counts = []
    for r in range(n):
        x = torch.randn(tokens, 4, generator=g)
        with torch.no_grad():
            _, experts = _moe.route(router, x, 1)
        counts.append([int((experts[:, 0] == j).sum()) for j in range(n)])
    return counts


def moe(world_size, tokens=8, topology="ethernet-100g"):
    """MoE's uneven all_to_all of tokens to their experts (one expert per rank)."""
    n = world_size
    counts = moe_counts(n, tokens)

    def calls(r, mode):
        ins = [_val(r, mode, counts[r][j]) for j in range(n)]
        outs = [torch.zeros(counts[q][r], dtype=torch.int64) for q in range(n)]
        want = [{q} for q in range(n) for _ in range(counts[q][r])]
        return [("all_to_all", _moe.ALL_TO_ALL, [outs, ins], outs, want)]
    rec = record.record_program("moe", n, calls, topology, [f"all_to_all ({_moe.ALL_TO_ALL})"])
    d = model.build(rec)
    d["title"] = f"MoE on {n} ranks: {tokens} tokens each, routed to their experts by an uneven all_to_all (chapter 19)"
    got = [sum(counts[q][r] for q in range(n)) for r in range(n)]
    busiest = max(range(n), key=got.__getitem__)
    d["questions"] = d["questions"] + [
        _q("Which rank's expert receives the most tokens (the lowest rank if tied)?", busiest,
           f"tokens per expert: {got}"),
        _q(f"How many tokens does rank {busiest}'s expert receive?", got[busiest], "the column sum of the router's counts")]
    return d


def _rotate(comm, block, out):
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    cur, nxt = block.clone(), torch.empty_like(block)
    for step in range(n - 1):
        out[(r - step) % n].copy_(cur)            # the visit: this block's keys meet our queries
        comm.post(step, sends=[(cur, right)], recvs=[(nxt, left)]).wait()
        cur, nxt = nxt, cur
    out[(r - (n - 1)) % n].copy_(cur)


def ring_attention(world_size, topology="ethernet-100g"):
    """Ring attention's rotating key/value blocks: cell j of rank r lights when block j has visited."""
    n = world_size

    def calls(r, mode):
        outs = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
        fn = lambda comm, block, out: _rotate(comm, block, out)  # noqa: E731
        fn.__name__ = "ring_rotation"
        return [("all_gather", fn, [_val(r, mode, 1), outs], outs, [{q} for q in range(n)])]
    rec = record.record_program("ring_attention", n, calls, topology, ["rotation"])
    d = model.build(rec)
    d["title"] = f"Ring attention on {n} ranks: key/value blocks rotate, one neighbour per step (chapter 20)"
    k = min(2, max(0, n - 2))
    d["questions"] = d["questions"] + [
        _q(f"At step {k}, whose key/value block does rank 0 send on?", (0 - k) % n,
           "it passes on the block it received at the step before: rank (r - k) mod N's")]
    return d


def pipeline(p, m, schedule="1f1b", activation_bytes=4096):
    """A pipeline of ``p`` stages and ``m`` micro-batches, as :mod:`collectives.parallel.pipeline`
    orders each stage's work (``schedule``: ``gpipe`` or ``1f1b``)."""
    if schedule not in _pipeline.SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(_pipeline.SCHEDULES)}")
    if not (isinstance(p, int) and isinstance(m, int) and p >= 1 and m >= 1):
        raise ValueError(f"stages and micro-batches must be whole numbers >= 1, got {p!r}, {m!r}")
    if p > record.DETAIL_RANKS or p * m > 4096:
        raise record.TooLarge(f"{p} stages x {m} micro-batches: too many slots to draw")
    orders = [_pipeline.SCHEDULES[schedule](p, m, s) for s in range(p)]
    done, work, pos, t = {}, [], [0] * p, 0
    while any(pos[s] < len(orders[s]) for s in range(p)):      # each slot: every stage whose next op is ready runs it
        ran = []
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            need = [("F", i, s - 1)] if kind == "F" and s > 0 else \
                [("B", i, s + 1)] if kind == "B" and s < p - 1 else []
            if kind == "B":
                need.append(("F", i, s))
            if all(done.get(x, t) < t for x in need):
                ran.append((s, kind, i))
        if not ran:
            raise RuntimeError(f"{schedule}: no stage can run at slot {t}")
        for s, kind, i in ran:
            done[(kind, i, s)] = t
            work.append((s, t, kind, i))
            pos[s] += 1
        t += 1
    makespan, slots = t, p * t
    busy = len(work)
    peak = [0] * p
    for s in range(p):
        live = 0
        for tt in range(makespan):
            for (ss, t2, kind, i) in work:
                if ss == s and t2 == tt:
                    live += 1 if kind == "F" else -1
            peak[s] = max(peak[s], live)
    slot = 1e-3
    msgs = []
    for s, tt, kind, i in work:
        if kind == "F" and s < p - 1:
            msgs.append([s, s + 1, tt, activation_bytes, tt * slot, (tt + 1) * slot, -1, -1, -1, 1, []])
        if kind == "B" and s > 0:
            msgs.append([s, s - 1, tt, activation_bytes, tt * slot, (tt + 1) * slot, -1, -1, -1, 1, []])
    links = sorted({(a, b) for a, b, *_ in msgs})
    for x in msgs:
        x[10] = [links.index((x[0], x[1]))]
    # the cells: stage s's micro-batch i: 1 forward done (activation held), 2 backward done
    provs = ["0", "1", "2"]
    state = [[0] * m for _ in range(p)]
    init = [row[:] for row in state]
    changes = []
    for tt in range(makespan):
        ch = []
        for s, t2, kind, i in work:
            if t2 == tt:
                ch += [s, i, 1 if kind == "F" else 2]
        changes.append(ch)
    # frame f shows slot f's work starting; its changes land at frame f+1
    frac = 1 - busy / slots
    d = dict(kind="pipeline", title=f"Pipeline {schedule.upper()} on {p} stages, {m} micro-batches (chapter 16): "
                                    f"bubble {busy and frac:.3f} of the slots", labels=[f"slot {x}" for x in range(makespan)],
             steps=list(range(makespan)), n=p, root=0, mode="pipeline", provs=provs, init=init, changes=changes,
             msgs=msgs, links=[dict(name=f"stage {a} -> stage {b}", flows=1) for a, b in links], time=makespan * slot,
             topology=dict(kind="flat", text=f"one slot (1 ms drawn) per forward or backward; an activation or gradient "
                                              f"of {activation_bytes} B after each; bubble counted {frac:.4f}, "
                                              f"(p-1)/(m+p-1) = {_pipeline.bubble_fraction(p, m):.4f}", per=p),
             failure=None, wrong=None, summary=False, work=[list(w) for w in work],
             p=p, m=m, bubble=frac, idle=slots - busy, slots=slots, makespan=makespan, peak=peak)
    from .questions import pipeline_questions
    d["questions"] = pipeline_questions(d)
    return d


PARALLELISMS = {"fsdp": fsdp, "moe": moe, "ring_attention": ring_attention}
_ = _fsdp   # the module whose calls fsdp() records, imported so the name above is checked
