"""Desync detection (``COLLECTIVES_DEBUG=1``).

The most common distributed hang: ranks call different collectives, or the
same one with different shapes, roots or ops, and wait for each other forever.
With the variable set, each collective first exchanges a fingerprint of the
call (sequence number on this group, collective, algorithm, op, dtype, shape,
root) with every other rank of the group, over point-to-point messages, and
every rank raises the same error if any two disagree. Off (the default) it
costs one environment lookup per call.
"""
import json

import torch

FINGERPRINT_BYTES = 1024
_CHECK_STEP = 0x7FFF0000  # a tag no algorithm step reaches
_sequence = {}


class DesyncError(RuntimeError):
    """Ranks of a group called different collectives (or the same one differently)."""


def describe(collective, algorithm, fingerprint):
    args = ", ".join(f"{k}={v}" for k, v in fingerprint.items())
    return f"{collective}({args}{', ' if args else ''}algorithm={algorithm})"


def check_agreement(comm, fingerprint):
    key = tuple(comm.ranks)
    seq = _sequence.get(key, 0)
    _sequence[key] = seq + 1
    fields = {k: (str(v).replace("torch.", "") if k == "dtype" else v) for k, v in fingerprint.items()}
    mine = {"seq": seq, "call": describe(comm.collective, comm.algorithm, fields)}
    raw = json.dumps(mine).encode()[:FINGERPRINT_BYTES]
    buf = torch.zeros(FINGERPRINT_BYTES, dtype=torch.uint8)
    buf[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if comm.nccl:
        buf = buf.cuda()
    boxes = {p: torch.empty_like(buf) for p in range(comm.size) if p != comm.rank}
    real_algorithm = comm.algorithm
    comm.algorithm = f"{real_algorithm}, desync check"
    try:
        comm.exchange(_CHECK_STEP, sends=[(buf, p) for p in boxes],
                      recvs=[(b, p) for p, b in boxes.items()])
    finally:
        comm.algorithm = real_algorithm
    calls = {comm.rank: mine}
    for p, b in boxes.items():
        data = bytes(b.cpu().tolist()).rstrip(b"\0")
        calls[p] = json.loads(data.decode())
    if len({(c["seq"], c["call"]) for c in calls.values()}) > 1:
        lines = [f"rank {comm.ranks[p]} called {c['call']} as call #{c['seq']} on this group"
                 for p, c in sorted(calls.items())]
        raise DesyncError("collectives: ranks disagree on the collective they are in:\n  "
                          + "\n  ".join(lines))
