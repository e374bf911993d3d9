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
  (1 = full bisection, 4 = four ranks' worth of traffic per uplink's worth).

Every kind also has ``gamma`` (seconds per reduced byte). Optional figures describe the
machine the ranks run on; all are 0 (or absent) by default, and the network presets leave
them out (their ranks are GPUs, whose time goes to the network):

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

Figures are per direction, in bytes/s and seconds. ``source`` says where they come from.
"""
import bisect
import json
import math
import os
from dataclasses import dataclass

from ..tuning import tables

GB = 1e9

PRESETS = {
    "ethernet-100g": {
        "kind": "flat",
        "alpha": 10e-6, "bandwidth": 12.5 * GB, "gamma": 0.9e-12,
        "source": "100 Gb/s Ethernet line rate = 12.5 GB/s per direction; alpha 10 us: NCCL's "
                  "modelled network latency for its Simple protocol (hwLat NET, Ring/Simple, "
                  "9.6 us, NVIDIA/nccl src/graph/tuning.cc), rounded; gamma: an H100's reduction "
                  "at HBM3 speed (3.35 TB/s, 3 bytes of memory traffic per reduced byte).",
    },
    "h100-cluster": {
        "kind": "nodes", "ranks_per_node": 8, "nic": "rank",
        "intra_alpha": 1.9e-6, "intra_bandwidth": 450 * GB,
        "alpha": 4.0e-6, "bandwidth": 50 * GB, "gamma": 0.9e-12,
        "source": "NVIDIA DGX H100: 8 H100 SXM per node, NVLink 4 at 900 GB/s per GPU both "
                  "directions together (450 GB/s each way) through NVSwitch; one ConnectX-7 "
                  "400 Gb/s NIC per GPU (50 GB/s each way). Latencies: NCCL's hwLat for Ring/LL128 "
                  "(NVLink 1.9 us, network 4.0 us; NVIDIA/nccl src/graph/tuning.cc). gamma: HBM3 "
                  "3.35 TB/s, 3 bytes of memory traffic per reduced byte.",
    },
    "fat-tree": {
        "kind": "fat_tree", "ranks_per_leaf": 32, "oversubscription": 4,
        "alpha": 10e-6, "bandwidth": 12.5 * GB, "gamma": 0.9e-12,
        "source": "ethernet-100g's figures on a two-level fat tree: 32 ranks per leaf switch, "
                  "uplinks oversubscribed 4:1 (a common cost-saving design).",
    },
}

KINDS = ("flat", "nodes", "fat_tree")
FIELDS = {
    "flat": ("alpha", "bandwidth", "gamma"),
    "nodes": ("alpha", "bandwidth", "gamma", "ranks_per_node", "intra_alpha", "intra_bandwidth", "nic"),
    "fat_tree": ("alpha", "bandwidth", "gamma", "ranks_per_leaf", "oversubscription"),
}
CPU = ("wake", "switch", "call", "python", "overhead")      # a rank's CPU time (Fabric's fields)
MACHINE = CPU + ("copy", "alloc", "host_bandwidth")
OPTIONAL = ("cores", "by_size", "source", "name", "calibrated") + MACHINE


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
    return sorted(PRESETS) + ["local"]


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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{where}: {field} must be a non-negative number, got {value!r}")
        if field in ("bandwidth", "intra_bandwidth", "oversubscription") and value <= 0:
            raise ValueError(f"{where}: {field} must be above 0")
        if field in ("ranks_per_node", "ranks_per_leaf") and (int(value) != value or value < 1):
            raise ValueError(f"{where}: {field} must be a whole number >= 1")
    for field in MACHINE:
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
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
        per = s["ranks_per_leaf"]
        a, b = src // per, dst // per
        if a == b:
            return (2 * src, 2 * dst + 1), s["alpha"]
        return (2 * src, 2 * n + 2 * a, 2 * n + 2 * b + 1, 2 * dst + 1), s["alpha"]

    def describe(self):
        return describe(self.spec)


def build(spec, n):
    """Lay ``spec`` (validated) out for ``n`` ranks."""
    kind = spec["kind"]
    bw = float(spec["bandwidth"])
    if kind == "flat":
        capacity = [bw] * (2 * n) + ([float(spec["host_bandwidth"])] if spec.get("host_bandwidth") else [])
    elif kind == "nodes":
        per = spec["ranks_per_node"]
        nics = n if spec["nic"] == "rank" else -(-n // per)
        capacity = [float(spec["intra_bandwidth"])] * (2 * n) + [bw] * (2 * nics)
    else:
        per = spec["ranks_per_leaf"]
        leaves = -(-n // per)
        uplink = per * bw / spec["oversubscription"]
        capacity = [bw] * (2 * n) + [uplink] * (2 * leaves)
    cpu = {field: float(spec.get(field) or 0.0) for field in CPU}
    tables = spec.get("by_size") or {}
    rates = {f"{field}_at": rate_at(tables.get(field), float(spec.get(field) or 0.0)) for field in BY_SIZE}
    return Fabric(spec, n, capacity, spec.get("cores"), **cpu, **rates)


def describe(spec):
    """One line: the topology's figures."""
    kind = spec["kind"]
    net = f"alpha {spec['alpha'] * 1e6:.3g} us, {spec['bandwidth'] / GB:.3g} GB/s"
    if kind == "nodes":
        text = (f"{spec['ranks_per_node']} ranks per node (alpha {spec['intra_alpha'] * 1e6:.3g} us, "
                f"{spec['intra_bandwidth'] / GB:.3g} GB/s inside), NIC per {spec['nic']}: {net}")
    elif kind == "fat_tree":
        text = f"fat tree, {spec['ranks_per_leaf']} ranks per leaf, {spec['oversubscription']}:1 uplinks: {net}"
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
    if spec.get("overhead"):
        text += f", {spec['overhead'] * 1e6:.3g} us of CPU per message"
    if spec.get("call"):
        text += f", {spec['call'] * 1e6:.3g} us of CPU per call"
    if spec.get("copy") or spec.get("alloc"):
        text += (f", local writes {1e-9 / spec['copy'] if spec.get('copy') else float('inf'):.3g} GB/s "
                 f"(+{(spec.get('alloc') or 0) * 1e12:.3g} ps/B for new memory)")
    return f"{spec.get('name', kind)}: {text}"
