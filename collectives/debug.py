"""Desync detection (``COLLECTIVES_DEBUG=1``).

The most common distributed hang: ranks call different collectives, or the
same one with different shapes, roots or ops, and wait for each other forever.
With the variable set, each collective first exchanges a fingerprint of the
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

Nothing has moved when it raises, so the group stays usable. A rank that
never arrives (dead, or in a collective on another group) makes the others
raise ``CollectiveTimeout`` from the check itself ("desync check" in the
algorithm's place).

Cost: off (the default) it is one environment lookup per call. On, each call
adds one round in which every rank sends a 1 KiB (plus 16 bytes per rank)
message to every other rank: N(N-1) small messages, a latency the benchmark
(``python -m collectives.bench --debug``) measures.
"""
import hashlib
import json
import os

import torch

from .p2p_communications import CollectiveError

HEADER_BYTES = 1024
_CHECK_STEP = 0x7FFF0000   # a tag no algorithm step reaches
_MAX_SHOWN = 700           # characters of a call's description that travel; a digest covers all

# Calls checked so far per group (by the group's name, unique in the process):
# the sequence number that tells "rank 2 skipped a call" from "rank 2 called
# something else".
_sequence = {}


class DesyncError(CollectiveError):
    """Ranks of a group called different collectives (or the same one differently)."""


def enabled():
    """Whether ``COLLECTIVES_DEBUG`` asks for the check."""
    return os.environ.get("COLLECTIVES_DEBUG", "0") not in ("", "0")


def describe(collective, algorithm, fields):
    """``all_reduce(op=SUM, shape=[4], dtype=float32, algorithm=ring)``."""
    args = [f"{k}={v}" for k, v in fields.items()] + [f"algorithm={algorithm}"]
    return f"{collective}({', '.join(args)})"


def _show(key, value):
    if key == "dtype":
        return str(value).replace("torch.", "")
    return value


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
    fields = {k: _show(k, v) for k, v in fingerprint.items() if k not in ("sends", "recvs")}
    n = comm.size
    sends, recvs = fingerprint.get("sends"), fingerprint.get("recvs")
    counts = list(sends or [-1] * n) + list(recvs or [-1] * n)
    key = getattr(comm.group, "group_name", None) or tuple(comm.ranks)
    seq = _sequence.get(key, 0)
    _sequence[key] = seq + 1

    buf = _encode(seq, describe(comm.collective, comm.algorithm, fields), counts, n)
    if comm.nccl:
        buf = buf.cuda()
    boxes = {p: torch.empty_like(buf) for p in range(n) if p != comm.rank}
    real_algorithm = comm.algorithm
    comm.algorithm = f"{real_algorithm}, desync check"
    try:
        comm.exchange(_CHECK_STEP, sends=[(buf, p) for p in boxes],
                      recvs=[(b, p) for p, b in boxes.items()])
    finally:
        comm.algorithm = real_algorithm
    calls = {comm.rank: _decode(buf, n)}
    calls.update({p: _decode(b, n) for p, b in boxes.items()})
    problem = _disagreement(calls, comm.ranks)
    if problem:
        raise DesyncError(f"collectives: ranks disagree on call #{seq} on the group of ranks "
                          f"{comm.ranks}: {problem}")


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
