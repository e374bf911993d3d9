"""The simulator: the unchanged algorithms on N virtual ranks in one process, on a modelled network.

A second implementation of the door (:class:`collectives.door.Door`): every registered
algorithm, or a learner's function with the same signature, runs as it is, each virtual
rank a coroutine (greenlet) of one process, on real tensors (exact results) or on
``device="meta"`` tensors (sizes only, for a thousand ranks and a gigabyte).

* :mod:`.world`: the clock, the event queue, the ranks and the door; messages meet by
  rendezvous (a send completes only once its receive is posted), so a simulation that
  finishes proves the schedule cannot deadlock for that N, root and size;
* :mod:`.deadlock`: when it cannot finish, the cycle of ranks waiting for each other;
* :mod:`.network`: messages as flows sharing the bandwidth of the links they cross;
* :mod:`.topology`: flat switch, nodes x ranks, fat tree; presets and JSON files;
* :mod:`.collective`: one call: inputs, the call as ``collectives.api`` makes it, the
  closed-form check, the figures (time, algbw, busbw, messages, bytes);
* :mod:`.cli`: ``python -m collectives.sim``, with nccl-tests' flags.

Simulated messages go to :func:`collectives.observers.report_message`, so
``count_traffic(rank=r)`` and ``trace()`` see them as they see real ones.

Example::

    >>> from collectives import sim
    >>> r = sim.simulate("all_reduce", "ring", 1024, 1 << 30, topology="h100-cluster")
    >>> r.time, r.busbw / 1e9          # seconds, GB/s
"""
from .collective import Result, simulate
from .deadlock import Deadlock
from .topology import PRESETS, load as load_topology
from .world import SimDoor, SimulationError

__all__ = ["Deadlock", "PRESETS", "Result", "SimDoor", "SimulationError", "load_topology", "simulate"]
