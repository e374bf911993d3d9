"""Topologies: which links a message crosses, how fast they are, what a message and a reduced
byte cost.

A topology is a small dict of figures (a preset below, or a JSON file of the same shape)
that :func:`build` turns into a :class:`Fabric` for N ranks: a list of link capacities and,
for each pair of ranks, the route (link ids) and the per-message latency alpha. Three kinds:

* ``flat``: every rank has one full-duplex cable to one switch: route
  ``[rank src's uplink, rank dst's downlink]``;
* ``nodes``: ``ranks_per_node`` ranks per node, consecutive. Inside a node a fast fabric
  (``intra_alpha``, ``intra_bandwidth`` per rank per direction: NVLink through NVSwitch);
  between nodes the network (``alpha``, ``bandwidth``), through one NIC per node
  (``"nic": "node"``: a node's ranks share it) or one per rank (``"nic": "rank"``: rails);
* ``fat_tree``: ``ranks_per_leaf`` ranks per leaf switch, leaves joined by spines; each
  leaf's uplink carries ``ranks_per_leaf * bandwidth / oversubscription`` per direction
  (1 = full bisection, 4 = four ranks' worth of traffic per uplink's worth);
* ``torus``: one rank per node of a ``dims`` torus (``[8, 8]``, ``[4, 4, 4]``; their product
  must be N), each node joined to its two neighbours in every dimension by full-duplex links
  (wrap-around at the edges) of ``bandwidth`` each way. Routes are dimension-ordered: first
  along dimension 0 the shorter way round (ties go the + way), then dimension 1, ... A message
  pays ``alpha`` plus ``hop`` for every link it crosses. ``torus-AxB`` and ``torus-AxBxC`` name
  such a torus with the preset's figures;
* ``dragonfly``: ``groups`` groups of ``routers_per_group`` routers, ``ranks_per_router``
  ranks on each (consecutive ranks fill a router, then a group; at most their product).
  Each rank has a terminal link to its router (``bandwidth``); the routers of a group are
  all joined to each other (``local_bandwidth``); every pair of groups is joined by one
  global link each way (``global_bandwidth``), attached in group i to router
  ``(j - i - 1) mod groups mod routers_per_group`` for group j. Minimal routes: terminal,
  local hop to the router that holds the global link, the global link, local hop, terminal;
* ``rail``: a rail-optimised cluster: ``ranks_per_node`` ranks per node joined inside by
  ``intra_alpha``/``intra_bandwidth`` (NVLink), and one NIC per rank (``bandwidth``); the NICs
  of local rank i of every node plug into rail switch i, so ranks of equal local rank talk
  through one switch; between rails, the rail switches' uplinks to a spine (each carries
  ``nodes * bandwidth / spine_oversubscription`` each way).

Every link belongs to a *class* (:func:`link_classes`): ``switch`` (flat), ``intra_node`` and
``inter_node`` (nodes), ``access`` and ``uplink`` (fat tree), ``torus``, ``terminal``,
``local`` and ``global`` (dragonfly), ``intra_node``, ``rail`` and ``spine`` (rail), ``host``.
A simulation counts the bytes each class carried (a message's bytes once per link of that
class it crosses: through a switch that is two, up and down), in ``Result.link_bytes`` and
``count_traffic().link_bytes``.

Every kind also has ``gamma`` (seconds per reduced byte). Optional figures describe the
machine the ranks run on; all are 0 (or absent) by default, and the network presets leave
them out but for ``overhead``, LogGP's o below (their ranks are GPUs, or CPUs whose only
time counted is their messages'):

* ``cores`` (how many cores the ranks share: None, a core each), ``wake`` (seconds of CPU
  a rank needs to wake up after waiting) and ``switch`` (seconds more when a core turns
  from one rank to another: a context switch and a cold cache), for machines with more
  ranks than cores, as ``local`` is;
* ``call`` (seconds of CPU each rank spends on a collective call before its first message:
  the API's checks and set-up) and ``overhead`` (seconds of CPU a rank spends posting each
  message, LogP's *o*: the door's checks and the transport's set-up; it delays the rank,
  not the wire);
* ``copy`` (seconds per byte a rank's own torch operations write: copies, concatenations,
  fills) and ``alloc`` (seconds more per byte of new memory they touch first); ``by_size``
  may give ``gamma``, ``copy`` and ``alloc`` per size instead, as [[bytes, seconds per
  byte], ...] (memory work slows once it no longer fits in a cache);
* ``python`` (simulated seconds of CPU per second of host time a rank's own code takes in
  the simulator between its messages: the simulator runs the algorithm's code, so on the
  machine it models, ``local``, 1 charges each rank what its Python costs; it makes times
  vary a little from run to run, as host time does).

A ``flat`` topology may also have ``host_bandwidth``: ranks on one machine talking over
its loopback, as ``local`` does, move every byte with that machine's CPUs and memory, so
all messages in flight share that capacity (bytes/s, one direction) besides their own
ends' bandwidth. Every message then crosses one more link, the host.

The network model is LogGP (Alexandrov et al., 'LogGP: Incorporating Long Messages into the
LogP Model', SPAA'95), with its four figures named as follows:

* L, the latency, is ``alpha`` (``intra_alpha`` inside a node; on a torus plus ``hop`` per
  link): the time from a message's start to its first byte's arrival. Messages in flight
  overlap their latencies;
* o, the overhead, is ``overhead`` (``intra_overhead`` inside a node, where given): CPU a
  rank spends on each message it posts (send or receive), one after another: the i-th message of a post starts no earlier than i x o after
  the post (the rank itself is busy until all are posted);
* g, the gap, is ``gap`` (``intra_gap`` inside a node): the least time between the starts of
  two messages out of one rank, or into one rank (its NIC sets one up at a time). Absent, it
  is L: a rank starts one message per alpha, as this simulator always did;
* G, the time per byte, is 1 / ``bandwidth`` (of each link of the route, shared max-min among
  the flows on it: :mod:`.network`).

A message of k bytes on an idle route takes o + L + k G; a train of m such messages from one
rank to another, posted at once, takes o + L + max(m k G, (m - 1) max(o, g) + k G).
``"model": "alpha-beta"`` (``--model alpha-beta``) sets g = o = 0: every message alpha +
k / bandwidth, however many a rank has in flight (Hockney's model, and SimGrid's).

Figures are per direction, in bytes/s and seconds. ``source`` says where they come from.
Every preset of ``PRESETS`` states all four of LogGP's figures (``alpha``, ``overhead``,
``gap`` and ``bandwidth``; ``intra_alpha``, ``intra_overhead``, ``intra_gap`` and
``intra_bandwidth`` inside a node too) and names each in its ``source``: a citation that a reader can check, or, where we found
no published figure, our reasoned one, labelled as ours. ``local`` is calibrated on this
machine instead (``python -m benchmarks.sim_calibrate``).
"""
import bisect
import re
import json
import math
import os
from dataclasses import dataclass

from ..tuning import tables

GB = 1e9

PRESETS = {
    "ethernet-100g": {
        "kind": "flat",
        "alpha": 10e-6, "overhead": 3e-6, "gap": 6.7e-9, "bandwidth": 12.5 * GB, "gamma": 0.9e-12,
        "source": "100 Gb/s Ethernet line rate = 12.5 GB/s per direction (G = 0.08 ns/B); alpha (L) "
                  "10 us: NCCL's modelled network latency for its Simple protocol (hwLat NET, "
                  "Ring/Simple, 9.6 us, NVIDIA/nccl src/graph/tuning.cc), rounded; overhead (o) 3 us: "
                  "NCCL's modelled network post overhead, the CPU proxy thread's time to post one "
                  "network operation (getNetOverhead, same file, since NCCL 2.18.1: 1 us on an Intel "
                  "or unknown x86 host, 2 us on AMD x86), times 3 for the Simple protocol as NCCL "
                  "charges it; NCCL overlaps it with the step's latency (max), LogGP adds it at both "
                  "ends; gap (g) 6.7 ns: the most messages 100 Gb/s Ethernet can carry, one "
                  "minimum-size frame each (64 B frame + 8 B preamble + 12 B inter-frame gap = 672 "
                  "bits: 148.8 M frames/s, IEEE 802.3), a bound the NIC itself may not reach (o is "
                  "the larger limit here); gamma: an H100's reduction at HBM3 speed (3.35 TB/s, 3 "
                  "bytes of memory traffic per reduced byte).",
    },
    "h100-cluster": {
        "kind": "nodes", "ranks_per_node": 8, "nic": "rank",
        "intra_alpha": 1.9e-6, "intra_bandwidth": 450 * GB,
        "alpha": 4.0e-6, "bandwidth": 50 * GB, "gamma": 0.9e-12,
        "overhead": 1e-6, "gap": 3e-9, "intra_gap": 0.0, "intra_overhead": 0.0,
        "source": "NVIDIA DGX H100: 8 H100 SXM per node, NVLink 4 at 900 GB/s per GPU both "
                  "directions together (450 GB/s each way) through NVSwitch; one ConnectX-7 "
                  "400 Gb/s NIC per GPU (50 GB/s each way); two Intel Xeon Platinum 8480C (DGX H100 "
                  "datasheet). Latencies (L): NCCL's hwLat for Ring/LL128 (intra_alpha: NVLink 1.9 us, "
                  "alpha: network 4.0 us; NVIDIA/nccl src/graph/tuning.cc). overhead (o) 1 us: a GPU rank's "
                  "messages are posted by NCCL's CPU proxy thread, and o is its time per network "
                  "operation, NCCL's modelled network post overhead (getNetOverhead, same file, since "
                  "NCCL 2.18.1: 1 us on an Intel x86 host, LL128); NCCL overlaps it with the step's "
                  "latency (max), LogGP adds it at both ends; intra_overhead 0: NVLink messages "
                  "are moved by NCCL's P2P transport from the GPU kernel, with no proxy to post them "
                  "(NCCL's getNetOverhead applies to network steps only). gap (g) 3 ns: ConnectX-7's RDMA message rate, 330-370 million messages/s "
                  "(NVIDIA ConnectX-7 NDR 400G InfiniBand adapter datasheet), the lower end; intra_gap "
                  "0: no published figure; ours: over NVLink NCCL's kernels store into the peer's "
                  "buffer, one channel per peer, with no per-message set-up to wait for. gamma: "
                  "HBM3 3.35 TB/s, 3 bytes of memory traffic per reduced byte.",
    },
    "fat-tree": {
        "kind": "fat_tree", "ranks_per_leaf": 32, "oversubscription": 4,
        "alpha": 10e-6, "overhead": 3e-6, "gap": 6.7e-9, "bandwidth": 12.5 * GB, "gamma": 0.9e-12,
        "source": "ethernet-100g's figures (alpha, overhead, gap, bandwidth and gamma, with their "
                  "sources) on a two-level fat tree: 32 ranks per leaf switch, uplinks "
                  "oversubscribed 4:1 (a common cost-saving design).",
    },
    "torus": {
        "kind": "torus", "dims": [8, 8],
        "alpha": 1.0e-6, "hop": 0.1e-6, "bandwidth": 6.8 * GB, "gamma": 0.9e-12,
        "overhead": 0.25e-6, "gap": 0.25e-6,
        "source": "Fugaku's Tofu interconnect D (Ajima et al., 'The Tofu Interconnect D', IEEE "
                  "Cluster 2018): 6.8 GB/s per link per direction; alpha (L) 1 us and 0.1 us per hop "
                  "are our round figures for an MPI message over it (the paper's one-way put "
                  "latency is about 0.5 us), not measured. overhead (o) 0.25 us and gap (g) 0.25 us: "
                  "we found no published per-message CPU overhead or message rate for MPI on Tofu D; "
                  "ours: o is half of what our 1 us leaves beyond the put's 0.5 us (the software at "
                  "each end of a message), and g = o, taking the TNIs (six per node) to start "
                  "messages at least as fast as one core posts them. gamma as ethernet-100g. dims "
                  "as given (torus-8x8, torus-4x4x4, ...), 8x8 by default.",
    },
    "dragonfly": {
        "kind": "dragonfly", "groups": 4, "routers_per_group": 8, "ranks_per_router": 4,
        "alpha": 2.0e-6, "bandwidth": 25 * GB, "local_bandwidth": 25 * GB, "global_bandwidth": 25 * GB,
        "gamma": 0.9e-12, "overhead": 0.25e-6, "gap": 0.25e-6,
        "source": "HPE Slingshot (LUMI's network, on which the Bine paper measured): 200 Gb/s "
                  "per port = 25 GB/s per direction for terminal, local and global links "
                  "(De Sensi et al., 'An In-Depth Analysis of the Slingshot Interconnect', SC'20). "
                  "4 groups of 8 routers of 4 ranks (128 ranks at most) and one global link per "
                  "pair of groups are a small instance, not LUMI's size; alpha (L) 2 us is our round "
                  "figure, not measured. overhead (o) 0.25 us and gap (g) 0.25 us: we found no "
                  "published per-message CPU overhead or message rate for Slingshot's Cassini NIC; "
                  "ours, as for torus: o the software at one end of an MPI message (Cassini matches "
                  "MPI tags in the NIC, so posting is a command to it), g = o, the NIC taken to start "
                  "messages at least as fast as one core posts them. gamma as ethernet-100g.",
    },
    "h100-rail": {
        "kind": "rail", "ranks_per_node": 8, "nodes_per_rail": 32, "spine_oversubscription": 1,
        "intra_alpha": 1.9e-6, "intra_bandwidth": 450 * GB,
        "alpha": 4.0e-6, "bandwidth": 50 * GB, "gamma": 0.9e-12,
        "overhead": 1e-6, "gap": 3e-9, "intra_gap": 0.0, "intra_overhead": 0.0,
        "source": "h100-cluster's figures (DGX H100; NCCL's latencies alpha and intra_alpha and its "
                  "network post overhead, intra_overhead 0 (no proxy over NVLink), ConnectX-7's message rate as gap, intra_gap 0, with their "
                  "sources) wired as NVIDIA's DGX SuperPOD reference architecture: each of a node's 8 "
                  "ConnectX-7 NICs (400 Gb/s, 50 GB/s each way) on its own rail switch, 32 nodes per "
                  "rail switch, rails joined by a non-blocking spine.",
    },
}

KINDS = ("flat", "nodes", "fat_tree", "torus", "dragonfly", "rail")
FIELDS = {
    "flat": ("alpha", "bandwidth", "gamma"),
    "nodes": ("alpha", "bandwidth", "gamma", "ranks_per_node", "intra_alpha", "intra_bandwidth", "nic"),
    "fat_tree": ("alpha", "bandwidth", "gamma", "ranks_per_leaf", "oversubscription"),
    "torus": ("alpha", "bandwidth", "gamma", "dims", "hop"),
    "dragonfly": ("alpha", "bandwidth", "gamma", "groups", "routers_per_group", "ranks_per_router",
                  "local_bandwidth", "global_bandwidth"),
    "rail": ("alpha", "bandwidth", "gamma", "ranks_per_node", "nodes_per_rail", "spine_oversubscription",
             "intra_alpha", "intra_bandwidth"),
}
WHOLE = ("ranks_per_node", "ranks_per_leaf", "groups", "routers_per_group", "ranks_per_router", "nodes_per_rail")
POSITIVE = ("bandwidth", "intra_bandwidth", "oversubscription", "local_bandwidth", "global_bandwidth",
            "spine_oversubscription")
CPU = ("wake", "switch", "call", "python", "overhead")      # a rank's CPU time (Fabric's fields)
MACHINE = CPU + ("copy", "alloc", "host_bandwidth")
GAPS = ("gap", "intra_gap")                                  # LogGP's g (absent: alpha)
INTRA_OVERHEAD = "intra_overhead"                             # LogGP's o inside a node (absent: overhead)
MODELS = ("loggp", "alpha-beta")
OPTIONAL = ("cores", "by_size", "source", "name", "calibrated", "model") + MACHINE + GAPS + (INTRA_OVERHEAD,)


def calibration_path():
    """Where ``python -m benchmarks.sim_calibrate`` stores this machine's figures (per user,
    beside the tuning tables)."""
    return os.path.join(tables.cache_dir(), f"sim-local-{tables.machine_key()}.json")


def local():
    """This machine as calibrated: the per-user calibration if there is one, else the model
    fitted on this project's 2-core machine that ships with the tuning table."""
    path = calibration_path()
    if os.path.exists(path):
        with open(path) as f:
            spec = json.load(f)
        spec.setdefault("source", f"calibrated on this machine ({path})")
        return spec
    model = tables.shipped().get("model") or {}
    if not model:
        raise ValueError("--topology local: no calibration; run python -m benchmarks.sim_calibrate")
    return {"kind": "flat", "alpha": model["alpha"], "bandwidth": 1 / model["beta"],
            "gamma": model["gamma"], "cores": 2, "wake": 0.0,
            "source": "no calibration on this machine (python -m benchmarks.sim_calibrate makes one): "
                      "the model shipped in collectives/tuning/tuning_table.json, fitted on this "
                      "project's 2-core machine"}


def names():
    return sorted(PRESETS) + ["local", "torus-AxB[xC]"]


def torus(dims, **figures):
    """A torus spec of ``dims`` (e.g. ``[8, 8]``: N = 64) with the ``torus`` preset's figures,
    any of them replaced by ``figures``. ``simulate(..., topology=torus([8, 8]))``."""
    spec = dict(PRESETS["torus"], dims=list(dims), name="torus-" + "x".join(str(d) for d in dims))
    spec.update(figures)
    return spec


def dragonfly(groups=4, routers_per_group=8, ranks_per_router=4, **figures):
    """A dragonfly spec with the ``dragonfly`` preset's figures: ``groups`` groups of
    ``routers_per_group`` routers of ``ranks_per_router`` ranks (N at most their product)."""
    spec = dict(PRESETS["dragonfly"], groups=groups, routers_per_group=routers_per_group,
                ranks_per_router=ranks_per_router, name=f"dragonfly-{groups}")
    spec.update(figures)
    return spec


def load(name_or_path):
    """The topology named (a preset, ``local``) or stored in a JSON file, validated.

    Raises ValueError with what is wrong before anything runs.
    """
    if isinstance(name_or_path, dict):
        spec = dict(name_or_path)
    elif name_or_path == "local":
        spec = dict(local(), name="local")
    elif name_or_path in PRESETS:
        spec = dict(PRESETS[name_or_path], name=name_or_path)
    elif isinstance(name_or_path, str) and re.fullmatch(r"torus-\d+(x\d+){0,2}", name_or_path):
        spec = torus([int(d) for d in name_or_path[len("torus-"):].split("x")])
    elif str(name_or_path).endswith(".json") or os.path.exists(str(name_or_path)):
        try:
            with open(name_or_path) as f:
                spec = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"topology file {name_or_path}: {exc}") from None
        if not isinstance(spec, dict):
            raise ValueError(f"topology file {name_or_path}: expected a JSON object")
        spec.setdefault("name", os.path.basename(str(name_or_path)))
    else:
        raise ValueError(f"unknown topology {name_or_path!r}: give one of {', '.join(names())} "
                         f"or a JSON file")
    return validate(spec)


def validate(spec):
    where = f"topology {spec.get('name', '')!r}"
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    unknown = set(spec) - set(FIELDS[kind]) - set(OPTIONAL) - {"kind"}
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}; a {kind} topology takes "
                         f"{', '.join(FIELDS[kind] + OPTIONAL)}")
    for field in FIELDS[kind]:
        if field not in spec:
            raise ValueError(f"{where}: a {kind} topology needs {field!r}")
        if field == "nic":
            if spec[field] not in ("node", "rank"):
                raise ValueError(f"{where}: nic must be 'node' or 'rank', got {spec[field]!r}")
            continue
        value = spec[field]
        if field == "dims":
            if (not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 3
                    or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in value)):
                raise ValueError(f"{where}: dims must be 1 to 3 whole numbers >= 1 (e.g. [8, 8]), got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == math.inf:
            raise ValueError(f"{where}: {field} must be a non-negative number, got {value!r}")
        if field in POSITIVE and value <= 0:
            raise ValueError(f"{where}: {field} must be above 0")
        if field in WHOLE and (int(value) != value or value < 1):
            raise ValueError(f"{where}: {field} must be a whole number >= 1")
    for field in MACHINE:
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
                                  or (field == "host_bandwidth" and value <= 0)):
            raise ValueError(f"{where}: {field} must be a {'positive' if field == 'host_bandwidth' else 'non-negative'} "
                             f"number or null, got {value!r}")
    tables = spec.get("by_size") or {}
    if not isinstance(tables, dict) or set(tables) - set(BY_SIZE):
        raise ValueError(f"{where}: by_size must map some of {', '.join(BY_SIZE)} to tables, got {tables!r}")
    for field, table in tables.items():
        ok = isinstance(table, list) and table and all(
            isinstance(row, (list, tuple)) and len(row) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)
            and row[0] > 0 and row[1] >= 0 for row in table)
        if not ok or [row[0] for row in table] != sorted({row[0] for row in table}):
            raise ValueError(f"{where}: by_size[{field!r}] must be [[bytes, seconds per byte], ...] with "
                             f"bytes > 0 rising and seconds >= 0, got {table!r}")
    for field in GAPS + (INTRA_OVERHEAD,):
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
                                  or value == math.inf):
            raise ValueError(f"{where}: {field} must be a non-negative number or null, got {value!r}")
    for field in ("intra_gap", INTRA_OVERHEAD):     # a node's own figures: only where there are nodes
        if spec.get(field) is not None and kind not in ("nodes", "rail"):
            raise ValueError(f"{where}: {field} is for a topology with nodes (nodes, rail); "
                             f"give {field[len('intra_'):]}")
    if spec.get("model", "loggp") not in MODELS:
        raise ValueError(f"{where}: model must be one of {', '.join(MODELS)}, got {spec.get('model')!r}")
    if spec.get("host_bandwidth") is not None and kind != "flat":
        raise ValueError(f"{where}: host_bandwidth is for a flat topology (ranks on one machine)")
    cores = spec.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ValueError(f"{where}: cores must be a whole number >= 1 or null")
    return spec


BY_SIZE = ("gamma", "copy", "alloc")


def rate_at(table, scalar):
    """seconds per byte for an operation of ``nbytes``: from ``table`` ([[bytes, s/B], ...],
    interpolated in log bytes, flat beyond its ends) where there is one, else ``scalar``.
    Memory work costs more per byte once it no longer fits in a cache, so one figure for every
    size is optimistic for large tensors or pessimistic for small ones."""
    if not table:
        return lambda nbytes: scalar
    xs = [math.log(b) for b, _ in table]
    ys = [r for _, r in table]

    def rate(nbytes):
        if nbytes <= table[0][0]:
            return ys[0]
        if nbytes >= table[-1][0]:
            return ys[-1]
        x = math.log(nbytes)
        i = bisect.bisect_right(xs, x) - 1
        return ys[i] + (x - xs[i]) / (xs[i + 1] - xs[i]) * (ys[i + 1] - ys[i])
    return rate


@dataclass
class Fabric:
    """One topology laid out for ``n`` ranks."""
    spec: dict
    n: int
    capacity: list
    cores: object
    wake: float = 0.0             # the CPU figures (``CPU``): seconds; python, per host second
    switch: float = 0.0
    call: float = 0.0
    python: float = 0.0
    overhead: float = 0.0
    gamma_at: object = None       # nbytes -> seconds per byte (``rate_at``), one per ``BY_SIZE``
    copy_at: object = None
    alloc_at: object = None

    @property
    def memory(self):
        """Whether a rank's own memory work is charged (``copy``, ``alloc`` or their tables)."""
        tables = self.spec.get("by_size") or {}
        return any(self.spec.get(field) or tables.get(field) for field in ("copy", "alloc"))

    classes: list = None          # per link id: the name of its class (``link_classes``)
    gap: float = None             # LogGP's g between nodes (None: a message's alpha)
    intra_gap: float = None       # and inside a node
    intra_overhead: float = None  # LogGP's o for a message inside a node (None: ``overhead``)

    def overhead_of(self, src, dst):
        """o of a message between ``src`` and ``dst``: ``intra_overhead`` inside a node where
        given (NCCL moves NVLink messages from the GPU kernel, with no proxy to post them),
        else ``overhead``."""
        if self.intra_overhead is not None and self.same_node(src, dst):
            return self.intra_overhead
        return self.overhead

    def gap_of(self, src, dst, alpha):
        """g of a message from ``src`` to ``dst`` whose latency is ``alpha``: the least time
        from its start to the next message's start out of ``src`` or into ``dst``."""
        g = self.gap
        if (self.intra_gap is not None or g is not None) and self.same_node(src, dst):
            g = self.intra_gap
        return alpha if g is None else g

    def same_node(self, src, dst):
        """Whether ``src`` and ``dst`` share a node (a topology with nodes: nodes, rail)."""
        node = self.node_of(src)
        return node is not None and node == self.node_of(dst)

    def node_of(self, rank):
        """``rank``'s node (a topology with nodes: nodes, rail), else None."""
        s = self.spec
        return rank // s["ranks_per_node"] if s["kind"] in ("nodes", "rail") else None

    def least_alpha(self):
        """A latency no route's is below (:meth:`route`: ``alpha``, inside a node
        ``intra_alpha``, on a torus ``alpha`` plus hops)."""
        s = self.spec
        return float(min(s["alpha"], s.get("intra_alpha", s["alpha"])))

    def route(self, src, dst):
        """(link ids, alpha) of a message from ``src`` to ``dst``."""
        s = self.spec
        kind, n = s["kind"], self.n
        if kind == "flat":
            if s.get("host_bandwidth"):
                return (2 * src, 2 * dst + 1, 2 * n), s["alpha"]
            return (2 * src, 2 * dst + 1), s["alpha"]
        if kind == "nodes":
            per = s["ranks_per_node"]
            if src // per == dst // per:
                return (2 * src, 2 * dst + 1), s["intra_alpha"]
            if s["nic"] == "rank":
                return (2 * n + 2 * src, 2 * n + 2 * dst + 1), s["alpha"]
            return (2 * n + 2 * (src // per), 2 * n + 2 * (dst // per) + 1), s["alpha"]
        if kind == "fat_tree":
            per = s["ranks_per_leaf"]
            a, b = src // per, dst // per
            if a == b:
                return (2 * src, 2 * dst + 1), s["alpha"]
            return (2 * src, 2 * n + 2 * a, 2 * n + 2 * b + 1, 2 * dst + 1), s["alpha"]
        if kind == "torus":
            links = torus_route(s["dims"], src, dst)
            return links, s["alpha"] + s["hop"] * len(links)
        if kind == "dragonfly":
            return dragonfly_route(s, n, src, dst), s["alpha"]
        per = s["ranks_per_node"]
        if src // per == dst // per:
            return (2 * src, 2 * dst + 1), s["intra_alpha"]
        i, j = src % per, dst % per
        unit = per * s["nodes_per_rail"]          # ranks under one set of rail switches
        a, b = src // unit, dst // unit
        if i == j and a == b:
            return (2 * n + 2 * src, 2 * n + 2 * dst + 1), s["alpha"]
        return (2 * n + 2 * src, 4 * n + 2 * (a * per + i), 4 * n + 2 * (b * per + j) + 1,
                2 * n + 2 * dst + 1), s["alpha"]

    def describe(self):
        return describe(self.spec)


def torus_route(dims, src, dst):
    """Link ids from ``src`` to ``dst`` on a ``dims`` torus, dimension by dimension, each the
    shorter way round (a tie goes +). Node v's link in dimension d, direction + (0) or - (1),
    is ``(v * len(dims) + d) * 2 + direction``."""
    links = []
    at, stride = src, 1
    k = len(dims)
    for d, size in enumerate(dims):
        a, b = (at // stride) % size, (dst // stride) % size
        forward = (b - a) % size
        if forward:
            plus = forward <= size - forward
            hops, step = (forward, 1) if plus else (size - forward, -1)
            for _ in range(hops):
                links.append((at * k + d) * 2 + (0 if plus else 1))
                nxt = (at // stride % size + step) % size
                at += (nxt - at // stride % size) * stride
        stride *= size
    return tuple(links)


def dragonfly_route(s, n, src, dst):
    """Minimal route on the dragonfly ``s`` (see the module's description). Links: ranks'
    terminal links ``2 r`` (up) and ``2 r + 1`` (down); then each group's local links, one per
    ordered pair of its routers; then the global links, one per ordered pair of groups."""
    g, a, p = s["groups"], s["routers_per_group"], s["ranks_per_router"]
    rs, rd = src // p, dst // p                   # routers, numbered across groups
    gs, gd = rs // a, rd // a
    local = lambda r1, r2: 2 * n + (r1 // a * a + r1 % a) * a + r2 % a  # noqa: E731
    links = [2 * src]
    if gs == gd:
        if rs != rd:
            links.append(local(rs, rd))
    else:
        out = gs * a + gateway(gs, gd, g, a)      # holds the global link gs -> gd
        into = gd * a + gateway(gd, gs, g, a)     # its other end
        if rs != out:
            links.append(local(rs, out))
        links.append(2 * n + g * a * a + gs * g + gd)
        if into != rd:
            links.append(local(into, rd))
    links.append(2 * dst + 1)
    return tuple(links)


def gateway(i, j, groups, routers):
    """The router of group i (0..routers-1) that holds group i's global link to group j."""
    return (j - i - 1) % groups % routers


def link_classes(spec):
    """The names of ``spec``'s link classes."""
    return {"flat": ("switch", "host"), "nodes": ("intra_node", "inter_node"), "fat_tree": ("access", "uplink"),
            "torus": ("torus",), "dragonfly": ("terminal", "local", "global"),
            "rail": ("intra_node", "rail", "spine")}[spec["kind"]]


def size_of(spec):
    """How many ranks ``spec`` holds (None: any number)."""
    kind = spec["kind"]
    if kind == "torus":
        return math.prod(spec["dims"])
    if kind == "dragonfly":
        return spec["groups"] * spec["routers_per_group"] * spec["ranks_per_router"]
    return None


def build(spec, n):
    """Lay ``spec`` (validated) out for ``n`` ranks.

    Raises ValueError where the topology cannot hold ``n`` ranks (a torus of another size, a
    dragonfly too small)."""
    kind = spec["kind"]
    bw = float(spec["bandwidth"])
    where = f"topology {spec.get('name', kind)!r}"
    holds = size_of(spec)
    if kind == "torus" and holds != n:
        raise ValueError(f"{where}: a {'x'.join(map(str, spec['dims']))} torus has {holds} nodes, one rank "
                         f"each, not world_size={n}; give dims whose product is {n} (e.g. torus-{n}x1)")
    if kind == "dragonfly" and n > holds:
        raise ValueError(f"{where}: {spec['groups']} groups x {spec['routers_per_group']} routers x "
                         f"{spec['ranks_per_router']} ranks hold {holds} ranks, not world_size={n}")
    if kind == "flat":
        host = [float(spec["host_bandwidth"])] if spec.get("host_bandwidth") else []
        capacity = [bw] * (2 * n) + host
        classes = ["switch"] * (2 * n) + ["host"] * len(host)
    elif kind == "nodes":
        per = spec["ranks_per_node"]
        nics = n if spec["nic"] == "rank" else -(-n // per)
        capacity = [float(spec["intra_bandwidth"])] * (2 * n) + [bw] * (2 * nics)
        classes = ["intra_node"] * (2 * n) + ["inter_node"] * (2 * nics)
    elif kind == "fat_tree":
        per = spec["ranks_per_leaf"]
        leaves = -(-n // per)
        uplink = per * bw / spec["oversubscription"]
        capacity = [bw] * (2 * n) + [uplink] * (2 * leaves)
        classes = ["access"] * (2 * n) + ["uplink"] * (2 * leaves)
    elif kind == "torus":
        capacity = [bw] * (2 * n * len(spec["dims"]))
        classes = ["torus"] * len(capacity)
    elif kind == "dragonfly":
        g, a = spec["groups"], spec["routers_per_group"]
        capacity = ([bw] * (2 * n) + [float(spec["local_bandwidth"])] * (g * a * a)
                    + [float(spec["global_bandwidth"])] * (g * g))
        classes = ["terminal"] * (2 * n) + ["local"] * (g * a * a) + ["global"] * (g * g)
    else:
        per = spec["ranks_per_node"]
        units = -(-n // (per * spec["nodes_per_rail"]))
        spine = spec["nodes_per_rail"] * bw / spec["spine_oversubscription"]
        capacity = [float(spec["intra_bandwidth"])] * (2 * n) + [bw] * (2 * n) + [spine] * (2 * per * units)
        classes = ["intra_node"] * (2 * n) + ["rail"] * (2 * n) + ["spine"] * (2 * per * units)
    cpu = {field: float(spec.get(field) or 0.0) for field in CPU}
    gaps = {field: (None if spec.get(field) is None else float(spec[field])) for field in GAPS}
    intra_overhead = None if spec.get(INTRA_OVERHEAD) is None else float(spec[INTRA_OVERHEAD])
    if spec.get("model") == "alpha-beta":
        cpu["overhead"], gaps, intra_overhead = 0.0, dict.fromkeys(GAPS, 0.0), None
    tables = spec.get("by_size") or {}
    rates = {f"{field}_at": rate_at(tables.get(field), float(spec.get(field) or 0.0)) for field in BY_SIZE}
    return Fabric(spec, n, capacity, spec.get("cores"), **cpu, **rates, classes=classes, **gaps,
                  intra_overhead=intra_overhead)


def describe(spec):
    """One line: the topology's figures."""
    kind = spec["kind"]
    net = f"alpha {spec['alpha'] * 1e6:.3g} us, {spec['bandwidth'] / GB:.3g} GB/s"
    if kind == "nodes":
        text = (f"{spec['ranks_per_node']} ranks per node (alpha {spec['intra_alpha'] * 1e6:.3g} us, "
                f"{spec['intra_bandwidth'] / GB:.3g} GB/s inside), NIC per {spec['nic']}: {net}")
    elif kind == "fat_tree":
        text = f"fat tree, {spec['ranks_per_leaf']} ranks per leaf, {spec['oversubscription']}:1 uplinks: {net}"
    elif kind == "torus":
        text = (f"{'x'.join(map(str, spec['dims']))} torus, dimension-ordered routes, "
                f"+{spec['hop'] * 1e6:.3g} us per hop: {net} per link")
    elif kind == "dragonfly":
        text = (f"dragonfly, {spec['groups']} groups x {spec['routers_per_group']} routers x "
                f"{spec['ranks_per_router']} ranks, local links {spec['local_bandwidth'] / GB:.3g} GB/s, "
                f"global {spec['global_bandwidth'] / GB:.3g} GB/s per pair of groups: {net} per rank")
    elif kind == "rail":
        text = (f"rail-optimised, {spec['ranks_per_node']} ranks per node (alpha {spec['intra_alpha'] * 1e6:.3g} us, "
                f"{spec['intra_bandwidth'] / GB:.3g} GB/s inside), a NIC per rank on rail switch (local rank), "
                f"{spec['nodes_per_rail']} nodes per rail switch, spine {spec['spine_oversubscription']}:1: {net}")
    else:
        text = f"flat switch: {net}"
    if spec.get("host_bandwidth"):
        text += f" (all messages share the host's {spec['host_bandwidth'] / GB:.3g} GB/s)"
    text += f", gamma {spec['gamma'] * 1e12:.3g} ps/B"
    if spec.get("cores"):
        text += (f", ranks share {spec['cores']} cores (wake-up {spec.get('wake', 0) * 1e6:.3g} us, "
                 f"switch {(spec.get('switch') or 0) * 1e6:.3g} us)")
    if spec.get("python"):
        text += f", the algorithms' own code at {spec['python']:g}x its host time"
    if spec.get("model") == "alpha-beta":
        text += ", alpha-beta (no gap, no overhead: concurrent messages overlap their alphas)"
    else:
        for field in GAPS:
            if spec.get(field) is not None:
                text += f", {field} {spec[field] * 1e6:.3g} us"
    if spec.get("overhead") and spec.get("model") != "alpha-beta":
        text += f", {spec['overhead'] * 1e6:.3g} us of CPU per message"
        if spec.get(INTRA_OVERHEAD) is not None:
            text += f" ({spec[INTRA_OVERHEAD] * 1e6:.3g} us inside a node)"
    if spec.get("call"):
        text += f", {spec['call'] * 1e6:.3g} us of CPU per call"
    if spec.get("copy") or spec.get("alloc"):
        text += (f", local writes {1e-9 / spec['copy'] if spec.get('copy') else float('inf'):.3g} GB/s "
                 f"(+{(spec.get('alloc') or 0) * 1e12:.3g} ps/B for new memory)")
    return f"{spec.get('name', kind)}: {text}"
