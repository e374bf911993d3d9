"""What a rank started in a lab is told about its place: torchrun's variables and the lab's.

Besides ``RANK`` and ``WORLD_SIZE`` (set by the launcher), each rank gets:

* ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``: its place on its host, the number of
  ranks on that host, and the host's index, as torchrun defines them per node;
* ``COLLECTIVES_LAB_LAYOUT``: the host of every rank, comma-separated in rank order
  ("0,0,1,1": ranks 0 and 1 share host 0), read by ``collectives.settings.lab_layout()``;
  ranks sharing a host talk over its loopback, the others over the shaped links;
* ``COLLECTIVES_LAB_RATE``: each link's rate in bits per second, one way
  (``collectives.settings.lab_rate()``);
* ``GLOO_SOCKET_IFNAME``/``TP_SOCKET_IFNAME``: the host's link, so gloo binds its address
  (every namespace shares the machine's hostname, which would resolve to the machine's own).
"""


def lab_environment(lab, layout, host):
    """The variables every process on ``host`` gets (also torchrun agents: they pass them on)."""
    return {**lab.host_environment(host), "COLLECTIVES_LAB_LAYOUT": ",".join(map(str, layout)),
            "COLLECTIVES_LAB_RATE": str(lab.spec.rate)}


def rank_environment(lab, layout, rank):
    """Rank ``rank``'s variables: :func:`lab_environment` plus its place on its host."""
    host = layout[rank]
    return {**lab_environment(lab, layout, host), "LOCAL_RANK": str(layout[:rank].count(host)),
            "LOCAL_WORLD_SIZE": str(layout.count(host)), "GROUP_RANK": str(host)}
