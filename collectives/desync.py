"""Desync detection: always on through the tags, eager with ``COLLECTIVES_DEBUG=1``.

The most common distributed hang: ranks call different collectives, or the
same one with different shapes, roots or ops, and wait for each other forever
(or, worse, pair up and return garbage). Two mechanisms catch it:

**Always on.** Every message's tag carries a hash of its call (the door,
``p2p_communications.Comm.tag``), so messages of different calls never pair:
the ranks wait instead. When a wait times out, :func:`explain_timeout` asks
every member of the group, through the rendezvous store, which call it is
stuck in. A member stuck in another call makes every rank raise
:class:`DesyncError` naming both calls; a member that does not answer at all
(stopped, dead, busy on another group) is named in the timeout error, instead
of the neighbour that merely forwarded its silence. This costs nothing until a
wait times out (``benchmarks/desync_cost.py`` measures the hash).

**Eager, with the variable set.** Each collective first exchanges a fingerprint of the
call (sequence number on this group, collective, algorithm, op, dtype, shape,
root; for ``all_to_all`` the element counts sent to and expected from each
rank) with every other rank of the group, over point-to-point messages, before
any data moves. If any two disagree, every rank of the group raises the same
:class:`DesyncError`, naming each rank's call::

    DesyncError: collectives: ranks disagree on call #3 on the group of ranks [0, 1, 2]: rank 2
    called broadcast(src=0, shape=[4], dtype=float32, algorithm=binomial_tree) while rank 0
    called all_reduce(op=SUM, shape=[4, 4], dtype=float32, algorithm=ring)
      ranks 0, 1: all_reduce(op=SUM, shape=[4, 4], dtype=float32, algorithm=ring)
      rank 2: broadcast(src=0, shape=[4], dtype=float32, algorithm=binomial_tree)

Nothing has moved when it raises, so the group stays usable (a timeout, by
contrast, leaves gloo's connections closed: create a new group after one). A rank that
never arrives (dead, or in a collective on another group) makes the others
raise ``CollectiveTimeout`` from the check itself ("desync check" in the
algorithm's place).

Cost: off (the default) it is one environment lookup per call. On, each call
adds one round in which every rank sends a 1 KiB (plus 16 bytes per rank)
message to every other rank: N(N-1) small messages, a latency the benchmark
(``python -m benchmarks.desync_cost --debug``) measures.
"""
import hashlib
import json
import threading
import time

import torch

from . import settings
from .errors import CollectiveError, CollectiveTimeout, DesyncError
from .p2p_communications import MAX_STEP

HEADER_BYTES = 1024
_CHECK_STEP = MAX_STEP     # a step no algorithm reaches
_MAX_SHOWN = 700           # characters of a call's description that travel; a digest covers all


def enabled():
    """Whether ``COLLECTIVES_DEBUG`` asks for the eager check."""
    return settings.desync_check()


# Fields that are compared crosswise (what i sends j expects), not shown in the description.
_COUNTS = ("sends", "recvs")


def _show(key, value):
    if key == "dtype":
        return str(value).replace("torch.", "")
    return value


def describe(collective, algorithm, fields):
    """The call's fingerprint as text, which every rank of a correct program agrees on:
    ``all_reduce(op=SUM, shape=[4], dtype=float32, algorithm=ring)``. It goes into every
    message's tag and into every desync report."""
    args = [f"{k}={_show(k, v)}" for k, v in fields.items() if k not in _COUNTS]
    if algorithm is not None:   # None: the call as the program wrote it, whatever algorithm runs it
        args.append(f"algorithm={algorithm}")
    return f"{collective}({', '.join(args)})"


def _encode(seq, call, counts, size):
    """Header (JSON: sequence, description, digest) then 2N int64 counts (-1: not sent)."""
    digest = hashlib.sha1(call.encode()).hexdigest()[:16]
    shown = call if len(call) <= _MAX_SHOWN else call[:_MAX_SHOWN] + "..."
    raw = json.dumps({"seq": seq, "call": shown, "digest": digest}).encode()
    buf = torch.zeros(HEADER_BYTES + 16 * size, dtype=torch.uint8, device="cpu")
    buf[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    buf[HEADER_BYTES:].view(torch.int64).copy_(torch.tensor(counts, dtype=torch.int64, device="cpu"))
    return buf


def _decode(buf, size):
    buf = buf.cpu()
    header = json.loads(bytes(buf[:HEADER_BYTES].tolist()).rstrip(b"\0").decode())
    counts = buf[HEADER_BYTES:].view(torch.int64).tolist()
    return header, counts[:size], counts[size:]


def _ranks_text(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def check_agreement(comm, fingerprint):
    """Exchange this call's fingerprint with the group; raise :class:`DesyncError` on a mismatch.

    ``fingerprint`` holds the fields every rank must agree on (``src``, ``op``,
    ``shape``, ``dtype``...), plus, for ``all_to_all``, ``sends`` and ``recvs``:
    element counts per group rank, which must match crosswise (what rank i
    sends to j is what j expects from i).
    """
    n = comm.size
    sends, recvs = fingerprint.get("sends"), fingerprint.get("recvs")
    counts = list(sends or [-1] * n) + list(recvs or [-1] * n)
    seq = comm.seq  # the engine's number for this call on this group: tells "skipped" from "other"

    buf = _encode(seq, describe(comm.collective, comm.algorithm, fingerprint), counts, n)
    if comm.nccl:
        buf = buf.cuda()
    boxes = {p: torch.empty_like(buf) for p in range(n) if p != comm.rank}
    real_algorithm = comm.algorithm
    comm.algorithm = f"{real_algorithm}, desync check"
    try:
        # tagged by step only: these must pair even when the calls differ
        comm.post(_CHECK_STEP, sends=[(buf, p) for p in boxes],
                  recvs=[(b, p) for p, b in boxes.items()], tagged=False).wait()
    finally:
        comm.algorithm = real_algorithm
    calls = {comm.rank: _decode(buf, n)}
    calls.update({p: _decode(b, n) for p, b in boxes.items()})
    problem = _disagreement(calls, comm.ranks)
    if problem:
        raise DesyncError(f"collectives: ranks disagree on call #{seq} on the group of ranks "
                          f"{list(comm.ranks)}: {problem}")


def _disagreement(calls, ranks):
    """A description of how the ranks' calls disagree, or None if they agree."""
    kinds = {}
    for p in sorted(calls):
        header = calls[p][0]
        kinds.setdefault((header["seq"], header["digest"]), []).append(p)
    if len(kinds) > 1:
        groups = sorted(kinds.values(), key=lambda g: (-len(g), g))
        seqs = {header["seq"] for header, _, _ in calls.values()}

        def text(p):
            header = calls[p][0]
            extra = f" as its call #{header['seq']} on this group" if len(seqs) > 1 else ""
            return f"{header['call']}{extra}"
        odd, usual = groups[-1][0], groups[0][0]
        lines = [f"{_ranks_text([ranks[p] for p in g])}: {text(g[0])}"
                 for g in sorted(groups, key=lambda g: g[0])]
        hint = (" (a rank skipped or added a collective on this group)" if len(seqs) > 1 else "")
        return (f"rank {ranks[odd]} called {text(odd)} while rank {ranks[usual]} called "
                f"{text(usual)}{hint}\n  " + "\n  ".join(lines))
    mismatched = []
    for i in sorted(calls):
        for j in sorted(calls):
            sent, expected = calls[i][1][j], calls[j][2][i]
            if i != j and sent >= 0 and sent != expected:
                mismatched.append(f"rank {ranks[i]} sends {sent} elements to rank {ranks[j]}, "
                                  f"which expects {expected} from it")
    if mismatched:
        return "the call agrees but the sizes do not:\n  " + "\n  ".join(mismatched)
    return None


def _grace(timeout):
    """How long a timed-out rank waits for the others to say where they are stuck.

    They started waiting at about the same moment (a mismatch stalls every rank
    of the call at once), so they time out within a step of each other.
    """
    return min(10.0, max(2.0, 0.2 * timeout))


ALIVE_WAIT = 2.0   # seconds a rank whose connection closed is given to show it is alive


def _lost(info, comm, peer, me):
    """The rank this group lost, if ``peer``'s closed connection means a death; None if not.

    A peer that timed out closes its connections too (gloo does), and then says where it is
    stuck in the store (:func:`explain_timeout`) within moments: given ``ALIVE_WAIT`` seconds
    to do so, it is alive, and the usual explanation follows. A peer that says nothing is
    gone: the first rank to find that writes a notice naming it (first writer wins), and every
    rank that loses a connection afterwards (to the dead rank, or to a survivor that ended
    after it) reads the same name. None as well if the store does not answer (its host,
    usually rank 0, is most likely the dead one: the usual explanation says so)."""
    store = info.store
    notice = f"collectives/lost/{info.key}"
    alive = f"collectives/stuck/{comm.lane}/{peer}"
    mine = json.dumps({"rank": peer, "seen_by": me, "seq": comm.seq})
    found = []

    def ask():
        try:
            deadline = time.monotonic() + ALIVE_WAIT
            while True:
                if store.check([notice]):
                    found.append(json.loads(store.get(notice))["rank"])
                    return
                if store.check([alive]):
                    return
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            found.append(json.loads(store.compare_set(notice, "", mine))["rank"])
        except Exception:
            pass
    helper = threading.Thread(target=ask, daemon=True, name="collectives-lost")
    helper.start()
    helper.join(ALIVE_WAIT + 2.0)
    return found[0] if found else None


def explain_timeout(comm, exc):
    """Turn a timeout inside a call (or a peer that hung up after its own timeout)
    into the error that says what really happened.

    Every timed-out member writes ``{seq, call, waiting_on}`` to the store under
    the group's key, then reads the others' for a short grace period. Returns a
    :class:`DesyncError` if some member is stuck in a different call (or another
    call number), a :class:`CollectiveTimeout` naming the members that never
    answered, or ``exc`` itself when every member is stuck in this same call.
    """
    info = comm.info
    if info.store is None or comm.seq is None:
        return exc
    me = comm.ranks[comm.rank]
    if "closed the connection" in str(exc) and exc.peer is not None:
        # A connection closed: a rank died, or a survivor that lost one ended. Its notice
        # names the dead rank at once, with no grace spent waiting for a rank that is gone.
        lost = _lost(info, comm, exc.peer, me)
        if lost is not None:
            via = (f" This rank lost rank {exc.peer}, which had lost rank {lost} and ended."
                   if lost != exc.peer else "")
            error = CollectiveError(
                f"collectives: rank {lost} of the group {list(info.ranks)} died during call #{comm.seq} "
                f"{comm.description}: its connections closed (the process exited, crashed or was "
                f"killed).{via} ({exc})", lost, comm)
            error.culprit = lost     # the launcher's headline names it (tools.launch)
            return error
    grace = _grace(comm.timeout)
    mine = {"seq": comm.seq, "call": comm.description, "waiting_on": exc.peer}
    prefix = f"collectives/stuck/{comm.lane}/"
    answers, failure = {}, []

    def ask():
        # The store is a server on one rank (usually 0): if that rank is the one
        # that stopped, these calls block, so they run on a thread with a bound.
        try:
            store = info.store
            store.set(prefix + str(me), json.dumps(mine))
            keys = {r: prefix + str(r) for r in (info.ranks[p] for p in comm.involved) if r != me}
            deadline = time.monotonic() + grace
            while keys and time.monotonic() < deadline:
                for r, key in list(keys.items()):
                    if store.check([key]):
                        answers[r] = json.loads(store.get(key))
                        del keys[r]
                if keys:
                    time.sleep(0.05)
            # Say "read", and wait for the others' "read": the rank that hosts the
            # store must not raise and exit before its peers have read its answer.
            store.set(prefix + str(me) + "/read", "1")
            reads = [prefix + str(r) + "/read" for r in answers]
            while reads and time.monotonic() < deadline + 2.0 and not store.check(reads):
                time.sleep(0.05)
        except Exception as store_exc:  # the store is gone too: say so below
            failure.append(store_exc)
    helper = threading.Thread(target=ask, daemon=True, name="collectives-explain")
    helper.start()
    helper.join(grace + 4.0)
    if not answers and (helper.is_alive() or failure):
        return type(exc)(
            f"{exc} The rendezvous store did not answer either, so its host (usually rank 0, the "
            f"rank at MASTER_ADDR) is most likely the rank that stopped or died.", exc.peer, comm)
    others = {r: a for r, a in answers.items() if (a["seq"], a["call"]) != (comm.seq, comm.description)}
    if others:
        lines = [f"rank {me}: call #{comm.seq} {comm.description}"]
        lines += [f"rank {r}: call #{a['seq']} {a['call']}" for r, a in sorted(others.items())]
        r, a = min(others.items())
        skipped = " (a rank skipped or added a collective on this group)" if a["seq"] != comm.seq else ""
        return DesyncError(
            f"collectives: ranks disagree on the group of ranks {list(info.ranks)}: rank {r} is in "
            f"call #{a['seq']} {a['call']} while rank {me} is in call #{comm.seq} {comm.description}{skipped}. "
            f"Messages of different calls never pair, so both waited {comm.timeout:g} s "
            f"(COLLECTIVES_TIMEOUT).\n  " + "\n  ".join(lines))
    silent = [r for r in (info.ranks[p] for p in comm.involved) if r != me and r not in answers]
    if silent:
        who = ", ".join(map(str, silent))
        via = (f" This rank was waiting on rank {exc.peer}, which is itself stuck waiting: it only "
               f"passed the silence on." if exc.peer not in silent and exc.peer is not None else "")
        kind = CollectiveTimeout if isinstance(exc, CollectiveTimeout) else CollectiveError
        return _blaming(silent[0], kind(
            f"collectives: rank{'s' if len(silent) > 1 else ''} {who} of the group {list(info.ranks)} "
            f"never answered in call #{comm.seq} {comm.description}: stopped (SIGSTOP, a debugger), dead, "
            f"or busy elsewhere (computing, or blocked in a call on another group).{via} ({exc})", silent[0], comm))
    return exc


def _blaming(rank, error):
    """``error``, marked as blaming global ``rank`` (the launcher's headline names it)."""
    error.culprit = rank
    return error
