"""Point-to-point messages for programs: ``send``, ``recv``, ``isend``, ``irecv``,
``batch_isend_irecv``, with torch.distributed's names, through the one door.

The collectives move data with the door (:class:`~collectives.p2p_communications.Comm`)
inside one call that every rank of the group makes. A pipeline moves data between
*two* ranks of a group, which the others never see. So a point-to-point message
cannot take the group's call number (the others would fall one call behind, and
their next collective's tags would never match): each *direction* between two
ranks is numbered on its own. Rank 3's fifth message to rank 4 on a group carries
the number 4 in its tag on both sides, whatever else either rank did meanwhile,
and messages between the same two ranks in the same direction arrive in the
order they were sent, as torch's do.

Each direction is a lane of the engine (keyed by the group and the two ranks),
so ``isend`` returns at once and a later ``irecv`` from the other direction runs
beside it: posting a send and a receive with the same peer never deadlocks.
Everything the door gives a collective comes with it: the call's hash and the
size in the tag (a receive of the wrong size waits and is explained instead of
being half-filled), bounded waits, :func:`~collectives.count_traffic` counters and
:func:`~collectives.trace` records (messages of collective ``"send_recv"``, algorithm
``"p2p"``; a call record ``"send"`` or ``"recv"`` around each). A message is a call like any
other: it goes through :func:`collectives.call.run`, with the two ranks it involves and its
direction's lane, so it gets the profiler range, the group's timeout and an explained
timeout (which asks only its peer) as a collective does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from .call import CallState, nbytes, run
from .engine import Work
from .p2p_communications import MAX_STEP


def send(tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it has left.

    Args:
        tensor (Tensor): What to send (unchanged).
        dst (int): Global rank of the receiver, a member of ``group``.
        group (ProcessGroup, optional): None for the whole world.
        tag (int, optional): Matches the receive's ``tag``; messages of one tag in one
            direction arrive in order.

    Example::

        >>> from collectives import p2p_api
        >>> if rank == 0:
        ...     p2p_api.send(torch.tensor([7.0]), dst=1)
        >>> if rank == 1:
        ...     t = torch.zeros(1); p2p_api.recv(t, src=0); t
        tensor([7.])
    """
    _post("send", tensor, dst, group, tag, async_op=False)


def recv(tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> int:
    """Receive into ``tensor`` from global rank ``src`` (sizes must match); returns ``src``.

    Unlike torch, ``src`` is required: a message is matched by its sender's count of
    messages to this rank, which only a named sender has.
    """
    _post("recv", tensor, src, group, tag, async_op=False)
    return src


def isend(tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> Work:
    """:func:`send` without waiting: returns a handle with ``wait()``; leave ``tensor`` alone until then."""
    return _post("send", tensor, dst, group, tag, async_op=True)


def irecv(tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> Work:
    """:func:`recv` without waiting: returns a handle with ``wait()``; read ``tensor`` after it."""
    return _post("recv", tensor, src, group, tag, async_op=True)


@dataclass
class P2POp:
    """One entry of :func:`batch_isend_irecv`: ``op`` is :func:`isend` or :func:`irecv`, as torch's."""
    op: object
    tensor: torch.Tensor
    peer: int
    group: object = None
    tag: int = 0


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Post every send and receive of the list, then return their handles (wait on each).

    Everything is validated before the first is posted, so a bad entry raises with
    nothing half-sent.
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("collectives.batch_isend_irecv: expects a list of collectives.p2p_api.P2POp")
    kinds = {isend: "send", irecv: "recv"}
    for p in p2p_op_list:
        if p.op not in kinds:
            raise ValueError("collectives.batch_isend_irecv: each P2POp's op must be "
                             "collectives.p2p_api.isend or collectives.p2p_api.irecv")
        _check(kinds[p.op], p.tensor, p.peer, p.group, p.tag)
    return [_post(kinds[p.op], p.tensor, p.peer, p.group, p.tag, async_op=True) for p in p2p_op_list]


def _check(kind, tensor, peer, group, tag):
    call = CallState(kind, group, None)
    call.check_tensor("tensor", tensor)
    if not call.member:
        raise ValueError(f"{call.where}: this rank ({call.me}) is not a member of the group")
    name = "dst" if kind == "send" else "src"
    peer_rank = call.check_root(name, peer)
    if peer_rank == call.info.rank:
        raise ValueError(f"{call.where}: {name}={peer} is this rank; a rank cannot message itself")
    if isinstance(tag, bool) or not isinstance(tag, int) or tag < 0:
        raise ValueError(f"{call.where}: tag must be a non-negative int, got {tag!r}")
    return call, peer_rank


def _post(kind, tensor, peer, group, tag, async_op):
    call, peer_rank = _check(kind, tensor, peer, group, tag)
    info = call.info
    me = info.rank
    src, dst = (me, peer_rank) if kind == "send" else (peer_rank, me)
    step = tag & MAX_STEP        # the tag, as traces show it (the whole tag is in the fingerprint)

    def body(comm):
        buf = call.stage(tensor, copy_in=(kind == "send"))
        call.ready()
        if kind == "send":
            comm.send(buf.flat, peer_rank, step)
        else:
            comm.recv(buf.flat, peer_rank, step)
            buf.done()
        return [tensor]
    # One lane per direction, numbered alike on both ends in send order; both ends describe
    # the message alike (door_name, fields), so both compute the same tag.
    lane = f"{info.key}|p2p {src}->{dst} tag {tag}"
    return run(call, "p2p", body, async_op, nbytes(tensor), local=None, lane=lane, peers=(src, dst),
               door_name="send_recv", src=info.ranks[src], dst=info.ranks[dst], tag=tag)
