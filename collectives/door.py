"""The door's interface: everything an algorithm may use to move data.

An algorithm (``collectives/algorithms/``) is a plain function that takes a door
and flat tensors. It may read ``rank`` and ``size`` (ranks of its group,
0..size-1) and call the methods below, nothing else: no ``torch.distributed``,
no sockets, no clock. That is what lets the same unchanged code run on two
implementations of this interface:

* :class:`collectives.p2p_communications.Comm`, the real one: messages over
  gloo or NCCL between processes, with tags, timeouts, counters and traces;
* the simulator's door (``collectives.sim``): virtual ranks in one process, on
  a modelled network, with rendezvous semantics.

``step`` is a small non-negative int (below 2**14) that both sides of a message
agree on; empty tensors are not sent (both sides know the sizes, so both skip).
Tensors are contiguous.

A door may also say where its ranks sit: ``hosts``, a tuple giving each group
rank's host number, or None where it does not know. It is optional (read it
with ``getattr(comm, "hosts", None)``); the real door derives it from
``LOCAL_WORLD_SIZE``, and only topology-aware algorithms
(``all_reduce_hierarchical``) read it.
"""
from typing import Protocol, Sequence, Tuple, runtime_checkable

import torch

Pairs = Sequence[Tuple[torch.Tensor, int]]   # [(tensor, peer group rank), ...]


@runtime_checkable
class Pending(Protocol):
    """Messages posted together and not yet waited for."""

    def wait(self) -> None:
        """Block until every posted message has completed (or raise)."""


@runtime_checkable
class Door(Protocol):
    """Point-to-point messaging for one collective call, as algorithms see it."""

    rank: int   # this rank in the group, 0..size-1
    size: int   # ranks in the group

    def post(self, step: int, sends: Pairs = (), recvs: Pairs = ()) -> Pending:
        """Post every receive and send at once; wait later with ``.wait()``."""

    def exchange(self, step: int, sends: Pairs = (), recvs: Pairs = ()) -> None:
        """``post(...)`` then ``wait()``: the sends and receives of one step, together."""

    def send(self, tensor: torch.Tensor, peer: int, step: int) -> None:
        """Send ``tensor`` to ``peer`` and wait until it is delivered."""

    def recv(self, tensor: torch.Tensor, peer: int, step: int) -> None:
        """Receive into ``tensor`` from ``peer`` (the sizes must match exactly)."""

    def sendrecv(self, send_tensor: torch.Tensor, dst: int, recv_tensor: torch.Tensor, src: int,
                 step: int) -> None:
        """Send to ``dst`` and receive from ``src`` in one step, posted together."""

    # Optional: ``scratch(like, numel)``, a receive buffer for one call that the door may
    # keep between calls (the real door does, per group: ``Comm.scratch``); algorithms ask
    # through ``algorithms._util.inbox``, which makes a new tensor where a door has none.


def each_message(collective, algorithm, step, sends, recvs):
    """The messages one ``post`` moves, receives first, a list of ``(kind, tensor, peer, nbytes)``.

    What every door checks the same way: empty tensors are skipped (both sides know the
    sizes, so both skip them) and a non-contiguous tensor is refused before anything moves.
    """
    messages = []
    for kind, pairs in (("recv", recvs), ("send", sends)):
        for tensor, peer in pairs:
            nbytes = tensor.nbytes
            if nbytes == 0:
                continue
            if not tensor.is_contiguous():
                raise ValueError(f"collectives.{collective}: a message must be a contiguous tensor "
                                 f"(algorithm {algorithm!r}, step {step})")
            messages.append((kind, tensor, peer, nbytes))
    return messages
