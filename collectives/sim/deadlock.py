"""When a simulation cannot finish: who waits for whom, and the cycle that makes it a deadlock.

The event queue ran dry while ranks still wait. Under rendezvous semantics every
message a blocked rank waits for is unmatched (a matched one would still have an
event coming), so each blocked rank waits for one peer: the rank that has not yet
posted the other end of its first unfinished message. That is a graph with one edge
out of each blocked rank; following the edges either comes back to a rank already
seen (a *cycle*: those ranks wait for each other forever) or ends at a rank that has
finished (it will never post the message: a *missing message*).

The cycle's kind names the classic mistakes: ``send-send`` (every rank sends first and
receives after, as blocking sends in a ring do), ``recv-recv`` (every rank receives
first), ``mixed``.
"""


class Deadlock(RuntimeError):
    """The simulation cannot finish. ``kind``: 'send-send', 'recv-recv', 'mixed' (a cycle),
    'missing' (a rank waits for one that finished) or 'unmatched' (everyone finished, but
    messages were posted that nobody matched). ``cycle``: [(rank, end)] in order, where an
    end has ``kind``, ``peer``, ``step``, ``nbytes``, ``collective``, ``algorithm``."""

    def __init__(self, world, stuck):
        self.world = world
        self.kind, self.cycle, self.report = analyse(world, stuck)
        super().__init__(self.report)


def _first_unfinished(rank):
    for end in rank.waiting or ():
        if not end.done:
            return end
    return None


def _describe(world, rank, end):
    verb = "send" if end.kind == "send" else "receive"
    to = "to" if end.kind == "send" else "from"
    text = (f"rank {rank}: {end.collective}/{end.algorithm} step {end.step} waits to {verb} "
            f"{end.nbytes} B {to} rank {end.peer}")
    src, dst = (rank, end.peer) if end.kind == "send" else (end.peer, rank)
    near = [e for key, ends in world.unmatched.items() if key[0] == src and key[1] == dst
            for e in ends if e is not end and e.kind != end.kind]
    if near:
        e = near[0]
        text += (f" (rank {e.rank} posted the {e.kind} with step {e.step} and {e.nbytes} B: "
                 f"step and size must both agree)")
    elif world.ranks[end.peer].finished:
        text += f" (rank {end.peer} has finished without posting the other end)"
    return text


def analyse(world, stuck):
    if not stuck:
        leftover = [e for ends in world.unmatched.values() for e in ends]
        lines = [f"every rank finished, but {len(leftover)} posted message(s) never matched "
                 f"(posted and not waited for):"]
        lines += ["  " + _describe(world, e.rank, e) for e in leftover[:8]]
        return "unmatched", [(e.rank, e) for e in leftover], "\n".join(lines)
    edge = {}
    for r in stuck:
        end = _first_unfinished(r)
        if end is not None:
            edge[r.id] = end
    seen = set()
    for start in sorted(edge):
        if start in seen:
            continue
        path, where = [], start
        while where in edge and where not in seen:
            seen.add(where)
            path.append(where)
            where = edge[where].peer
        if where in path:             # back to a rank of this walk: a cycle
            cycle = path[path.index(where):]
            kinds = {edge[r].kind for r in cycle}
            kind = "send-send" if kinds == {"send"} else "recv-recv" if kinds == {"recv"} else "mixed"
            ring = " -> ".join(str(r) for r in cycle + [cycle[0]])
            lines = [f"deadlock: {len(cycle)} rank(s) wait for each other in a {kind} cycle: {ring}"]
            lines += ["  " + _describe(world, r, edge[r]) for r in cycle[:16]]
            if len(cycle) > 16:
                lines.append(f"  ... and {len(cycle) - 16} more on the cycle")
            others = len(stuck) - len(cycle)
            if others:
                lines.append(f"  ({others} other rank(s) wait too, behind the cycle or on another one)")
            lines.append("  Under rendezvous semantics (NCCL's) a send completes only when its receive "
                         "is posted: post both ends of a step together (comm.sendrecv, comm.exchange).")
            return kind, [(r, edge[r]) for r in cycle], "\n".join(lines)
    # no cycle: the walks end at ranks that finished
    waiting = sorted(edge)
    lines = [f"deadlock: {len(stuck)} rank(s) wait for messages that ranks which already finished "
             f"never sent or received:"]
    lines += ["  " + _describe(world, r, edge[r]) for r in waiting[:16]]
    return "missing", [(r, edge[r]) for r in waiting], "\n".join(lines)
