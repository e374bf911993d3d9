"""A cluster on one machine: hosts as network namespaces, links shaped to a real rate.

On one machine's loopback the CPU is the bottleneck; in a lab the links are. The lab
(``--lab hosts=K[,ranks-per-host=L][,rate=1gbit][,placement=by-host|interleaved]`` on every
launcher: ``python -m collectives.train``, ``benchmarks``, the demos) gives:

* K hosts, each a network namespace with one link (``eth0``, 169.254.77.<k+1>/24) to a switch
  namespace (a bridge); each link shaped by ``tc tbf`` to ``rate`` in both directions.
* L ranks per host (two levels): ranks on one host talk over its loopback, fast; hosts talk
  over the shaped links. Each rank runs inside its host and is told its place
  (:mod:`.world`: ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``COLLECTIVES_LAB_LAYOUT``, ...).
* A multi-node torchrun (:func:`torchrun`): one agent per host, c10d rendezvous at host 0.
* Teardown that leaves nothing behind, and a stale lab (its launcher killed) removed at the
  next start (:mod:`.netns`).

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and tbf in the kernel; without them
:class:`LabUnavailable` says which is missing (:func:`unavailable_reason` for tests).
``python -m collectives.tools.lab check|clean|torchrun`` is the command-line form.

Example::

    with Lab(parse_lab("hosts=2,rate=1gbit")) as lab:
        print(lab.netns, lab.addresses)     # ['collab<pid>-0-h0', ...], ['169.254.77.1', ...]
"""
from .multinode import torchrun
from .netns import (Lab, LabError, LabUnavailable, check_available, clean_stale, enter, inside,
                    leftovers, unavailable_reason)
from .spec import FLAG_HELP, LabSpec, human_rate, lab_argument, parse_lab, parse_rate
from .world import lab_environment, rank_environment

__all__ = ["FLAG_HELP", "Lab", "LabError", "LabSpec", "LabUnavailable", "check_available",
           "clean_stale", "enter", "human_rate", "inside", "lab_argument", "lab_environment",
           "leftovers", "parse_lab", "parse_rate", "rank_environment", "torchrun",
           "unavailable_reason"]
