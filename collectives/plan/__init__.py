"""The planner: every way to split one transformer over N ranks, its memory, its traffic, its time.

``python -m collectives.plan --model PARAMS,LAYERS,HIDDEN,SEQ,BATCH --ranks N --topology PRESET``

Semantics. A configuration is DP x TP x PP x CP = N (data, tensor, pipeline, context
parallel degrees), a ZeRO stage (0-3) and recomputation (on or off). For each one the
planner computes, per rank, from the formulas of chapters 10 and 16-21:

* **memory** by kind, mixed precision with Adam (ZeRO's accounting: 2 bytes of
  parameter, 2 of gradient, 12 of optimizer state (fp32 master, two moments) per
  parameter): parameters ``2P/(t p)`` (/d with ZeRO-3), gradients ``2P/(t p)`` (/d
  with ZeRO-2 and 3), optimizer ``12P/(t p)`` (/d with ZeRO-1 and up), and
  activations: :func:`collectives.parallel.recompute.block_activation_elements` x 2
  bytes for each of the stage's L/p layers, for the micro-batches 1F1B's first stage
  holds at once (min(p, m)), sequence parallelism on whenever t > 1, the sequence
  S/c per rank;
* **communication** per step by kind, bytes one rank sends with the ring algorithms:
  DP ``2(d-1)/d`` x its gradient bytes (ZeRO-3: ``3(d-1)/d`` x its parameter bytes);
  TP ``8(t-1)/t`` x A per layer and micro-batch (4 all-gathers and 4 reduce-scatters
  of A = S/c x b x H x 2 bytes; 12 with recomputation, the forward's again); PP 2A per
  micro-batch (an activation forward, a gradient back); CP the ring attention's
  ``(c-1) 6k + 2k`` per layer and micro-batch (k = one K chunk, A/t bytes);
* **step time**: compute ``6 P T / (N F)`` (T tokens per step, F the device's
  FLOP/s; ``8 P T`` with recomputation: one more forward) stretched by the pipeline's
  bubble ``1 / (1 - (p-1)/(m+p-1))``, plus every collective's time *as the simulator
  gives it* (:func:`collectives.sim.simulate`) on the topology, each group placed
  where Megatron's order puts it (TP innermost, then CP, DP, PP outermost: a group
  of stride k has ``ranks_per_node // k`` of its ranks on one node; a group of more than
  256 ranks is simulated at 256 and scaled by the ring's alpha-beta model). No overlap of
  communication with compute is assumed: the time is an upper bound for a
  well-overlapped implementation, and a fair one for this library's.

A configuration is feasible when its memory fits ``--memory`` bytes per rank; the
feasible ones are printed fastest first.

What it cannot know: the kernels' real speed (F is one number for every matrix size),
stragglers and noisy neighbours, the overlap a real framework achieves, load imbalance
between pipeline stages (embedding, loss), memory fragmentation and the framework's own
buffers. Chapter 23 walks through these.

Bad input raises before anything is simulated: a configuration whose product is not
N, layers not divisible by the pipeline stages, heads or hidden not divisible by TP,
a sequence not divisible by 2 x CP (zig-zag).
"""
import math
from dataclasses import dataclass

from ..parallel.recompute import block_activation_elements

BYTES = 2                                   # bf16 activations, parameters, gradients
OPTIMIZER_BYTES = 12                        # fp32 master weights and Adam's two moments
KINDS = ("dp", "tp", "pp", "cp")


@dataclass(frozen=True)
class Model:
    """A GPT-like transformer: ``params`` parameters in ``layers`` blocks of width ``hidden``,
    ``heads`` heads (default hidden / 128, at least 1), MLP width 4 x hidden; a step trains on
    ``batch`` sequences of ``seq`` tokens."""
    params: float
    layers: int
    hidden: int
    seq: int
    batch: int
    heads: int = 0

    @property
    def a(self):
        return self.heads or max(1, self.hidden // 128)


@dataclass(frozen=True)
class Config:
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int = 0
    recompute: bool = False
    micro_batch: int = 1

    def __str__(self):
        return (f"DP{self.dp} TP{self.tp} PP{self.pp} CP{self.cp} ZeRO-{self.zero}"
                f"{' recompute' if self.recompute else ''}")


def parse_model(text):
    """``"PARAMS,LAYERS,HIDDEN,SEQ,BATCH"`` (PARAMS may be 1.3e9) into a :class:`Model`."""
    parts = text.split(",")
    if len(parts) not in (5, 6):
        raise ValueError(f"--model wants PARAMS,LAYERS,HIDDEN,SEQ,BATCH[,HEADS], got {text!r}")
    try:
        params = float(parts[0])
        rest = [int(x) for x in parts[1:]]
    except ValueError:
        raise ValueError(f"--model wants numbers PARAMS,LAYERS,HIDDEN,SEQ,BATCH[,HEADS], got {text!r}") from None
    if params <= 0 or any(x < 1 for x in rest):
        raise ValueError(f"--model: every figure must be positive, got {text!r}")
    return Model(params, *rest)


def check(model, config, ranks):
    """Raise ValueError naming what is wrong with ``config`` for ``model`` on ``ranks`` ranks."""
    c = config
    if c.dp * c.tp * c.pp * c.cp != ranks:
        raise ValueError(f"plan: DP x TP x PP x CP = {c.dp} x {c.tp} x {c.pp} x {c.cp} = "
                         f"{c.dp * c.tp * c.pp * c.cp}, not the {ranks} ranks")
    if model.layers % c.pp:
        raise ValueError(f"plan: {model.layers} layers are not divisible by {c.pp} pipeline stages")
    if model.a % c.tp or model.hidden % c.tp:
        raise ValueError(f"plan: {model.a} heads and hidden {model.hidden} must be divisible by TP={c.tp}")
    if model.seq % (2 * c.cp) and c.cp > 1:
        raise ValueError(f"plan: the sequence {model.seq} is not divisible by 2 x CP = {2 * c.cp} (zig-zag)")
    if (model.seq // c.cp) % c.tp and c.tp > 1:
        raise ValueError(f"plan: the sequence per CP rank {model.seq // c.cp} is not divisible by TP={c.tp} "
                         f"(sequence parallelism)")
    if model.batch % (c.dp * c.micro_batch):
        raise ValueError(f"plan: the batch of {model.batch} sequences is not divisible by DP={c.dp} "
                         f"x micro-batch {c.micro_batch}")
    if c.zero not in (0, 1, 2, 3):
        raise ValueError(f"plan: the ZeRO stage must be 0-3, got {c.zero}")


def micro_batches(model, config):
    return model.batch // (config.dp * config.micro_batch)


def memory(model, config):
    """Bytes per rank by kind: parameters, gradients, optimizer, activations."""
    c = config
    local = model.params / (c.tp * c.pp)
    params = BYTES * local / (c.dp if c.zero >= 3 else 1)
    grads = BYTES * local / (c.dp if c.zero >= 2 else 1)
    optimizer = OPTIMIZER_BYTES * local / (c.dp if c.zero >= 1 else 1)
    per_layer = block_activation_elements(model.seq // c.cp, c.micro_batch, model.hidden, model.a,
                                          4 * model.hidden, c.tp, sequence_parallel=c.tp > 1,
                                          recompute=c.recompute)
    held = min(c.pp, micro_batches(model, c))
    activations = BYTES * per_layer * (model.layers // c.pp) * held
    return dict(parameters=params, gradients=grads, optimizer=optimizer, activations=activations)


def activation_bytes(model, config):
    """A: one micro-batch's activation on one rank, S/c x b x H x 2 bytes."""
    return model.seq // config.cp * config.micro_batch * model.hidden * BYTES


def calls(model, config):
    """The collectives one rank runs in a step, by kind: [(collective, group size, bytes per call, count)]."""
    c, m = config, micro_batches(model, config)
    a = activation_bytes(model, c)
    layers = model.layers // c.pp
    out = {kind: [] for kind in KINDS}
    grad_bytes = BYTES * model.params / (c.tp * c.pp)
    if c.dp > 1:
        if c.zero >= 3:
            out["dp"] = [("all_gather", c.dp, grad_bytes, 2), ("reduce_scatter", c.dp, grad_bytes, 1)]
        elif c.zero == 2:
            out["dp"] = [("reduce_scatter", c.dp, grad_bytes, 1), ("all_gather", c.dp, grad_bytes, 1)]
        else:
            out["dp"] = [("all_reduce", c.dp, grad_bytes, 1)]
    if c.tp > 1:
        per = (6 if c.recompute else 4) * layers * m
        out["tp"] = [("all_gather", c.tp, a, per), ("reduce_scatter", c.tp, a, per)]
    if c.pp > 1:
        out["pp"] = [("send", 2, a, 2 * m)]
    if c.cp > 1:
        k = a // c.tp
        out["cp"] = [("ring", c.cp, 2 * k, (c.cp - 1) * (3 if c.recompute else 2) * layers * m),
                     ("ring", c.cp, 4 * k, (c.cp - 1) * layers * m)]
    return out


def _sent(collective, n, nbytes):
    """Bytes one rank sends in one call of the ring algorithm (``nbytes`` as nccl-tests counts it)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n * nbytes
    return nbytes                    # a point-to-point message, or one ring step


def communication(model, config):
    """Bytes one rank sends per step, by kind."""
    return {kind: sum(_sent(coll, n, b) * count for coll, n, b, count in items)
            for kind, items in calls(model, config).items()}


def stride(config, kind):
    """Distance between consecutive ranks of a ``kind`` group (TP innermost, then CP, DP, PP)."""
    c = config
    return {"tp": 1, "cp": c.tp, "dp": c.tp * c.cp, "pp": c.tp * c.cp * c.dp}[kind]


def group_topology(spec, k):
    """The topology a group of stride ``k`` sees: the same links, ``per node // k`` of its ranks per node."""
    spec = dict(spec)
    for key in ("ranks_per_node", "ranks_per_leaf"):
        if key in spec:
            spec[key] = max(1, spec[key] // k)
    return spec


def step_time(model, config, topology, flops, simulate=None, cache=None):
    """(seconds, {kind: seconds}): compute stretched by the bubble, plus every collective's simulated time."""
    from .. import sim
    simulate = simulate or sim.simulate
    cache = {} if cache is None else cache
    spec = sim.load_topology(topology)
    c, m = config, micro_batches(model, config)
    tokens = model.batch * model.seq
    work = (8 if c.recompute else 6) * model.params * tokens / (c.dp * c.tp * c.pp * c.cp)
    bubble = (c.pp - 1) / (m + c.pp - 1)
    times = {"compute": work / flops / (1 - bubble)}
    for kind, items in calls(model, config).items():
        total = 0.0
        topo = group_topology(spec, stride(c, kind))
        for coll, n, nbytes, count in items:
            # a point-to-point message and a ring step are one message: a broadcast on 2 ranks
            collective, size = ("broadcast", 2) if coll in ("send", "ring") else (coll, n)
            key = (collective, size, int(nbytes), tuple(sorted(topo.items())))
            if key not in cache:
                cache[key] = _simulated(simulate, collective, size, int(nbytes), topo)
            total += cache[key] * count
        times[kind] = total
    return sum(times.values()), times


SIM_RANKS = 256      # larger groups: simulated at this size and scaled (a 1,024-rank ring takes minutes)


def _ring_model(collective, n, nbytes, alpha, bandwidth):
    steps = 2 * (n - 1) if collective == "all_reduce" else n - 1
    return steps * alpha + _sent(collective, n, nbytes) / bandwidth


def _simulated(simulate, collective, n, nbytes, topo):
    """One call's simulated seconds; above SIM_RANKS, the simulation at SIM_RANKS scaled by the
    ring's alpha-beta model, n against SIM_RANKS, on the slowest link."""
    algorithm = "linear" if collective == "broadcast" else "ring"
    if n <= SIM_RANKS:
        return simulate(collective, algorithm, n, nbytes, topology=topo).time
    small = simulate(collective, algorithm, SIM_RANKS, nbytes, topology=topo).time
    alpha, bandwidth = topo["alpha"], topo["bandwidth"]
    return small * _ring_model(collective, n, nbytes, alpha, bandwidth) / \
        _ring_model(collective, SIM_RANKS, nbytes, alpha, bandwidth)


def divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


def configurations(model, ranks, zero_stages=(0, 1, 2, 3), recompute=(False, True)):
    """Every valid DP x TP x PP x CP = ranks, with each ZeRO stage and recomputation setting."""
    out = []
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            for cp in divisors(ranks // (tp * pp)):
                dp = ranks // (tp * pp * cp)
                for zero in zero_stages if dp > 1 else (0,):
                    for r in recompute:
                        config = Config(dp, tp, pp, cp, zero, r)
                        try:
                            check(model, config, ranks)
                        except ValueError:
                            continue
                        out.append(config)
    return out


def plan(model, ranks, topology, flops, memory_limit, simulate=None, configs=None):
    """Every configuration (or ``configs``) with its memory, traffic and step time; feasible ones
    first, fastest first."""
    cache, rows = {}, []
    for config in configurations(model, ranks) if configs is None else configs:
        check(model, config, ranks)
        mem = memory(model, config)
        total, times = step_time(model, config, topology, flops, simulate, cache)
        rows.append(dict(config=config, memory=mem, bytes=communication(model, config), time=total,
                         times=times, fits=sum(mem.values()) <= memory_limit))
    rows.sort(key=lambda r: (not r["fits"], r["time"]))
    return rows
