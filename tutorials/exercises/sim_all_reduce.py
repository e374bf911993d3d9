"""Exercise: an all_reduce that holds up on 1,024 simulated ranks.

Build ``sim_all_reduce(comm, tensor, op)`` with the signature of the course's own
algorithm modules (``collectives/algorithms/``): ``comm`` is a door (``comm.rank``,
``comm.size``, ``comm.sendrecv(send_tensor, dst, recv_tensor, src, step)``,
``comm.send``, ``comm.recv``, ``comm.exchange``), ``tensor`` a flat tensor, ``op`` the
reduction (``op.combine(acc, x)`` folds ``x`` into ``acc`` in place). Afterwards every
rank's tensor holds the reduction over all ranks, in place.

The grader runs it in the simulator (``collectives.sim``), where a send completes only
when its receive is posted, as in NCCL: on real tensors on 1 to 33 ranks (exact
results), then on 1,024 ranks with 64 MiB each on a flat 100 GbE switch.

Read: chapter 14, tutorials/14_a_thousand_ranks.md (and chapter 4 for the ring).

Hint: chapter 4's ring works here almost as it is: cut the tensor with
``tensor.tensor_split(comm.size)``, then N-1 reduce-scatter steps and N-1 all-gather
steps, each one ``comm.sendrecv`` to the right and from the left, with a distinct
``step`` number per step (both sides of a message must agree on it). A blocking
``comm.send`` on every rank before any ``comm.recv`` deadlocks, and the grader will say
which ranks wait for which.

Traffic to reach: about 2(N-1)/N x S bytes sent per rank; the simulated busbw must be
at least 90% of the ring's (``collectives.algorithms.all_reduce_ring``) at 1,024 ranks.

Grade it:  python -m tutorials.exercises.grade sim_all_reduce
"""
import torch  # noqa: F401  (imports your solution may need)


def sim_all_reduce(comm, tensor, op):
    """Reduce ``tensor`` over all ranks with ``op``, in place, through the door ``comm``."""
    raise NotImplementedError("write your all_reduce against the door here")
