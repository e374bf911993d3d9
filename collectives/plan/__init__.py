"""The planner: every way to split one transformer over N ranks, its memory, its traffic, its time.

``python -m collectives.plan --model PARAMS,LAYERS,HIDDEN,SEQ,BATCH --ranks N --topology PRESET``

Semantics. A configuration is DP x TP x PP x CP = N (data, tensor, pipeline, context
parallel degrees), a ZeRO stage (0-3), recomputation (on or off) and, for a mixture of
experts, an expert-parallel degree EP dividing DP (the experts spread over data-parallel
ranks, as Megatron places them). For each one the planner computes, per rank, from the
formulas of chapters 10 and 16-21:

* **memory** by kind, mixed precision with Adam by default (ZeRO's accounting: e = 2 bytes
  of parameter, 2 of gradient, 12 of optimizer state (fp32 master, two moments) per
  parameter; ``Model.value_bytes`` and ``optimizer_bytes`` change them): parameters
  ``eP/(t p)`` (/d with ZeRO-3), gradients ``eP/(t p)`` (x (1 + 1/d) with ZeRO-1: the
  reduced shard the optimizer steps on as well; /d with ZeRO-2 and 3), optimizer
  ``12P/(t p)`` (/d with ZeRO-1 and up), where d counts DP x CP ranks: context-parallel
  ranks hold their replica's parameters and see other tokens, so the gradients are reduced
  and ZeRO shards over the data-parallel group with CP folded in, as Megatron does; and
  activations, the peak autograd holds:
  :func:`collectives.parallel.recompute.block_activation_elements` x e for each of the
  stage's L/p layers, for the micro-batches 1F1B's first stage holds at once (min(p, m)),
  sequence parallelism on whenever t > 1, the sequence S/c per rank; with recomputation
  each layer's input, plus the rest of the one layer backward is recomputing. A model that
  is not a transformer (the MNIST job's CNN) gives its activations per sample and per call
  instead, counted on one sample and on two (:func:`counted_activations`), and is planned
  data parallel only, a micro-batch the samples one rank runs at once;
* **experts**: with E experts per layer (``params`` counting one, so that P stays the
  dense model's size) a rank holds E/EP experts per layer of its stage; their copies are
  shared by DP x CP/EP ranks, so ZeRO shards them and their gradients are reduced over
  those ranks, the dense rest over DP x CP;
* **communication** per step by kind, bytes one rank sends with the ring algorithms:
  DP ``2(d-1)/d`` x its gradient bytes (d = DP x CP) (ZeRO-1 and 2 as a reduce-scatter and an
  all-gather, the same bytes; ZeRO-3: ``3(d-1)/d`` x its parameter bytes, layer by layer:
  each layer gathered before its forward and its backward, its gradient reduce-scattered,
  3 calls per layer); TP
  ``10(t-1)/t`` x A per layer and micro-batch (sequence parallelism as
  ``ParallelBlock(sequence_parallel="regather")`` runs it: 6 all-gathers, the backward's 2
  gathering the inputs again, and 4 reduce-scatters of A = S/c x b x H x e bytes; 14 with
  recomputation, the forward's 2 + 2 again); PP 2A per
  micro-batch (an activation forward, a gradient back); CP the zig-zag ring attention's
  ``(c-1) 6k + 2k`` per layer and micro-batch (k = one K chunk, A/t bytes: (K, V) c-1 times
  forward, (K, V, dK, dV) c-1 times backward and (dK, dV) once more; with recomputation
  ``(c-1) 2k`` more) and each forward's shape check, as the TP blocks'; EP four
  all_to_alls of the k copies of each token per layer and micro-batch (dispatch and
  combine, forward and backward; six with recomputation), ``(EP-1)/EP x k A`` each when
  the router spreads tokens evenly, plus the 8-byte counts of each forward
  (:mod:`collectives.parallel.moe`'s bytes);
* **step time**: compute ``6 P T / (N F)`` (T tokens per step, F the device's
  FLOP/s; ``8 P T`` with recomputation: one more forward; each token's k-1 further experts
  added) stretched by the pipeline's
  bubble ``1 / (1 - (p-1)/(m+p-1))``, plus every collective's time *as the simulator
  gives it* (:func:`collectives.sim.simulate`) on the topology, each group placed
  where Megatron's order puts it (TP innermost, then CP, EP within DP, PP outermost: a
  group of stride k has ``ranks_per_node // k`` of its ranks on one node; a group of more
  than 256 ranks is simulated at 256 and scaled by the ring's alpha-beta model). No overlap of
  communication with compute is assumed: the time is an upper bound for a
  well-overlapped implementation, and a fair one for this library's.

Checked against runs by ``python -m benchmarks.plan_check`` (16 configurations trained
on 4 gloo ranks, context parallelism among them; 21 on 8 ranks; the MNIST job's CNN,
data parallel: memory by kind measured/planned, the ranking of step times; figures in
docs/benchmarks.md) and ``tests/test_plan_check.py`` (the CP bytes counted from a real
zig-zag ring block); the expert figures against
:class:`collectives.parallel.moe.MoE`'s counted bytes in ``tests/test_plan.py``.

A configuration is feasible when its memory fits ``--memory`` bytes per rank; the
feasible ones are printed fastest first.

What it cannot know: the kernels' real speed (F is one number for every matrix size),
stragglers and noisy neighbours, the overlap a real framework achieves, load imbalance
between pipeline stages (embedding, loss) and between experts (the router's choices),
the activations of routing (the dispatched copies), memory fragmentation and the
framework's own buffers. Chapter 23 walks through these.

Bad input raises before anything is simulated: a configuration whose product is not
N, layers not divisible by the pipeline stages, heads or hidden not divisible by TP,
a sequence not divisible by 2 x CP (zig-zag), EP not dividing DP or the experts.

Worked example, 4 ranks: a 4-layer model of hidden 128 (P = 793,088, float32, Adam:
value_bytes 4, optimizer_bytes 8), 8 sequences of 32 tokens, as DP2 x TP2: parameters
4 P/2 = 1,586,176 bytes, gradients the same, optimizer 8 P/2 = 3,172,352; activations 4
layers x one micro-batch x (8x32x128 + 2x32x512 + 32x4 + 4x32)/2 x 4 bytes = 4 x 32,896 x 4
= 526,336 bytes; the data-parallel all-reduce sends 2 (2-1)/2 x 1,586,176 bytes per step.

Reference: V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2023 (activations); S. Rajbhandari et al., "ZeRO", SC 2020 (memory); D. Narayanan
et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC 2021 (the layout and its costs); the Ultra-Scale Playbook (Hugging Face, 2025).
"""
import json
from dataclasses import dataclass

from ..parallel.recompute import block_activation_elements
from ..parallel.shapes import LINE_BYTES

BYTES = 2                                   # bf16 activations, parameters, gradients
OPTIMIZER_BYTES = 12                        # fp32 master weights and Adam's two moments
KINDS = ("dp", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Model:
    """A GPT-like transformer: ``params`` parameters in ``layers`` blocks of width ``hidden``,
    ``heads`` heads (default hidden / 128, at least 1), MLP width 4 x hidden; a step trains on
    ``batch`` sequences of ``seq`` tokens.

    ``experts`` > 0 makes every block's MLP a mixture of that many experts, each token sent to
    ``top_k`` of them (``params`` then counts one expert per layer: the dense model's size).
    ``value_bytes`` (parameters, gradients, activations) and ``optimizer_bytes`` (state per
    parameter) default to mixed precision with Adam, 2 and 12; a float32 run with plain Adam
    is 4 and 8.

    A model that is not a transformer (the MNIST job's CNN) states its activations itself:
    ``activations_per_sample`` bytes autograd keeps per sample of a micro-batch, plus
    ``activations_per_call`` whatever its size (:func:`counted_activations` counts both by
    running the model on one sample and on two, in one process). It is planned data parallel
    only (with any ZeRO stage), a micro-batch being the samples one rank runs at once."""
    params: float
    layers: int
    hidden: int
    seq: int
    batch: int
    heads: int = 0
    experts: int = 0
    top_k: int = 1
    value_bytes: int = BYTES
    optimizer_bytes: int = OPTIMIZER_BYTES
    activations_per_sample: float = 0.0
    activations_per_call: float = 0.0

    @property
    def a(self):
        return self.heads or max(1, self.hidden // 128)

    @property
    def ffn(self):
        return 4 * self.hidden

    @property
    def expert_params(self):
        """One expert (one MLP): Linear(H, F) and Linear(F, H) with their biases."""
        return 2 * self.hidden * self.ffn + self.ffn + self.hidden


@dataclass(frozen=True)
class Config:
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int = 0
    recompute: bool = False
    micro_batch: int = 1
    ep: int = 1

    def __str__(self):
        return (f"DP{self.dp} TP{self.tp} PP{self.pp} CP{self.cp}{f' EP{self.ep}' if self.ep > 1 else ''} "
                f"ZeRO-{self.zero}{' recompute' if self.recompute else ''}")


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
    if c.ep > 1 and not model.experts:
        raise ValueError(f"plan: EP={c.ep} needs a mixture-of-experts model (--experts)")
    if c.ep < 1 or c.dp % c.ep:
        raise ValueError(f"plan: EP={c.ep} must divide DP={c.dp} (the experts are spread over data-parallel ranks)")
    if model.experts % c.ep:
        raise ValueError(f"plan: {model.experts} experts are not divisible by EP={c.ep}")
    if model.activations_per_sample and (c.tp, c.pp, c.cp, c.recompute) != (1, 1, 1, False):
        raise ValueError(f"plan: a model described by its activations per sample (not a transformer) is "
                         f"planned data parallel only (TP = PP = CP = 1, no recomputation), got {c}")
    if model.experts and not 1 <= model.top_k <= model.experts:
        raise ValueError(f"plan: top_k={model.top_k} must be between 1 and the {model.experts} experts")


def fits(model, config, ranks):
    """Whether ``config`` is a valid split of ``model`` over ``ranks`` (:func:`check` raises nothing)."""
    try:
        check(model, config, ranks)
    except ValueError:
        return False
    return True


def micro_batches(model, config):
    return model.batch // (config.dp * config.micro_batch)


def local_params(model, config):
    """(dense, expert): the parameters one rank holds before ZeRO, and how many ranks share each
    part's copies (the ZeRO and data-parallel group of each): (values, sharers) twice."""
    c = config
    # context-parallel ranks hold the same parameters as their replica's other ranks and see
    # other tokens: their gradients are reduced, and ZeRO shards, over DP x CP ranks (Megatron's
    # data-parallel group with CP folded in)
    if not model.experts:
        return (model.params / (c.tp * c.pp), c.dp * c.cp), (0.0, 1)
    expert = model.layers * model.expert_params         # one expert per layer is in ``params``
    dense = (model.params - expert) / (c.tp * c.pp)
    mine = expert * (model.experts // c.ep) / (c.tp * c.pp)
    return (dense, c.dp * c.cp), (mine, c.dp * c.cp // c.ep)


def memory(model, config):
    """Bytes per rank by kind: parameters, gradients, optimizer, activations.

    Parameters, gradients and optimizer state are what a rank keeps between steps (ZeRO-3's
    gathered layer and ZeRO-2's whole gradient during backward are transient); activations
    are the peak of what autograd keeps during the step: with recomputation each layer's input
    plus the one layer being recomputed."""
    c, e = config, model.value_bytes
    params = grads = optimizer = 0.0
    for values, sharers in local_params(model, c):
        params += e * values / (sharers if c.zero >= 3 else 1)
        # ZeRO-1 keeps the whole gradient and, for the optimizer, its reduced 1/d shard of it
        grads += e * values * ({0: 1, 1: 1 + 1 / sharers}.get(c.zero) or 1 / sharers)
        optimizer += model.optimizer_bytes * values / (sharers if c.zero >= 1 else 1)
    if model.activations_per_sample:     # a model that is not a transformer, data parallel only
        activations = model.activations_per_call + model.activations_per_sample * c.micro_batch
        return dict(parameters=params, gradients=grads, optimizer=optimizer, activations=activations)
    args = (model.seq // c.cp, c.micro_batch, model.hidden, model.a, model.ffn, c.tp, c.tp > 1)
    per_layer = block_activation_elements(*args, recompute=c.recompute)
    held = min(c.pp, micro_batches(model, c))
    activations = e * per_layer * (model.layers // c.pp) * held
    if c.recompute:     # backward runs one layer's forward again, keeping all of that layer (its input is kept already)
        activations += e * (block_activation_elements(*args) - per_layer)
    return dict(parameters=params, gradients=grads, optimizer=optimizer, activations=activations)


def counted_activations(forward, sample, parameters=()):
    """(per sample, per call): the bytes autograd keeps for backward when ``forward`` (a model and
    its loss, taking a batch) runs on one sample and on two (``sample(k)`` makes a batch of k),
    each storage once, ``parameters`` left out
    (:func:`collectives.parallel.recompute.saved_activation_bytes`). For a model that is not a
    transformer block, whose activations :func:`memory`'s formula does not describe: a
    convolution keeps its input, a ReLU its output, max pooling its indices (int64), each in
    proportion to the samples; what is kept whatever the batch is the rest.

    Example::

        >>> net = Net()     # collectives.train.models
        >>> counted_activations(lambda x: net(x).sum(), lambda k: torch.zeros(k, 1, 28, 28), net.parameters())
    """
    from ..parallel.recompute import saved_activation_bytes
    parameters = list(parameters)
    one, two = (saved_activation_bytes(forward, sample(k), exclude=parameters)[1] for k in (1, 2))
    return float(two - one), float(2 * one - two)


def activation_bytes(model, config):
    """A: one micro-batch's activation on one rank, S/c x b x H x e bytes."""
    return model.seq // config.cp * config.micro_batch * model.hidden * model.value_bytes


def calls(model, config):
    """The collectives one rank runs in a step, by kind: [(collective, group size, bytes per call, count)]."""
    c, m = config, micro_batches(model, config)
    a = activation_bytes(model, c)
    layers = model.layers // c.pp
    out = {kind: [] for kind in KINDS}
    for values, sharers in local_params(model, c):
        grad_bytes = model.value_bytes * values
        if sharers < 2 or not values:
            continue
        if c.zero >= 3:
            # layer by layer, as FSDP wrapped per block runs it: each layer's parameters gathered
            # before its forward and again before its backward, its gradient reduce-scattered
            unit = grad_bytes / layers
            out["dp"] += [("all_gather", sharers, unit, 2 * layers), ("reduce_scatter", sharers, unit, layers)]
        elif c.zero >= 1:
            out["dp"] += [("reduce_scatter", sharers, grad_bytes, 1), ("all_gather", sharers, grad_bytes, 1)]
        else:
            out["dp"] += [("all_reduce", sharers, grad_bytes, 1)]
    if c.tp > 1:
        # per layer: forward gathers before the two column-parallel linears and scatters after the
        # two row-parallel ones; backward gathers again (the inputs are not kept), and each
        # collective's gradient is the other: 6 all-gathers, 4 reduce-scatters; recomputation
        # runs the forward's 2 + 2 once more
        per = layers * m
        # and every block's forward first compares the ranks' shapes: one all_gather of a
        # LINE_BYTES line per rank (collectives.parallel.shapes)
        out["tp"] = [("all_gather", c.tp, a, (8 if c.recompute else 6) * per),
                     ("reduce_scatter", c.tp, a, (6 if c.recompute else 4) * per),
                     ("all_gather", c.tp, c.tp * LINE_BYTES, (2 if c.recompute else 1) * per)]
    if c.pp > 1:
        out["pp"] = [("send", 2, a, 2 * m)]
    if c.cp > 1:
        # per layer and micro-batch, the zig-zag ring (collectives.parallel.ring_attention_zigzag):
        # each forward (twice with recomputation) passes (K, V) c-1 times; the backward passes
        # (K, V, dK, dV) c-1 times and (dK, dV) once more, home; every forward first compares
        # the ranks' chunks (one all_gather of a LINE_BYTES line per rank)
        k = a // c.tp
        forwards = (2 if c.recompute else 1) * layers * m
        out["cp"] = [("ring", c.cp, 2 * k, (c.cp - 1) * forwards + layers * m),
                     ("ring", c.cp, 4 * k, (c.cp - 1) * layers * m),
                     ("all_gather", c.cp, c.cp * LINE_BYTES, forwards)]
    if c.ep > 1:
        # per MoE layer and micro-batch: dispatch and combine forward, both again backward (and
        # forward once more with recomputation); the k copies of each token, routed evenly; the
        # N counts (8 bytes each) exchanged by every forward
        forwards = (2 if c.recompute else 1) * layers * m
        out["ep"] = [("all_to_all", c.ep, model.top_k * a, 2 * forwards + 2 * layers * m),
                     ("all_to_all", c.ep, 8 * c.ep, forwards)]
    return out


def _sent(collective, n, nbytes):
    """Bytes one rank sends in one call of the ring algorithm (``nbytes`` as nccl-tests counts it)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes
    return nbytes                    # a point-to-point message, or one ring step


def communication(model, config):
    """Bytes one rank sends per step, by kind."""
    return {kind: sum(_sent(coll, n, b) * count for coll, n, b, count in items)
            for kind, items in calls(model, config).items()}


def stride(config, kind):
    """Distance between consecutive ranks of a ``kind`` group (TP innermost, then CP, DP, PP; the
    ``dp`` kind is the DP x CP group the gradients are reduced over)."""
    c = config
    # the gradients' group is DP x CP: stride TP (with CP = 1, DP's own stride)
    return {"tp": 1, "cp": c.tp, "dp": c.tp, "ep": c.tp * c.cp, "pp": c.tp * c.cp * c.dp}[kind]


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
    if model.experts:        # each token runs k experts' MLPs, not one
        work += (8 if c.recompute else 6) * (model.top_k - 1) * model.layers * model.expert_params \
            * tokens / (c.dp * c.tp * c.pp * c.cp)
    times = {"compute": work / flops / (1 - bubble)}
    for kind, items in calls(model, config).items():
        total = 0.0
        topo = group_topology(spec, stride(c, kind))
        for coll, n, nbytes, count in items:
            # a point-to-point message and a ring step are one message: a broadcast on 2 ranks
            collective, size = ("broadcast", 2) if coll in ("send", "ring") else (coll, n)
            key = (collective, size, int(nbytes), json.dumps(topo, sort_keys=True))
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
    algorithm = {"broadcast": "linear", "all_to_all": "pairwise"}.get(collective, "ring")
    if n <= SIM_RANKS:
        return simulate(collective, algorithm, n, nbytes, topology=topo).time
    small = simulate(collective, algorithm, SIM_RANKS, nbytes, topology=topo).time
    alpha, bandwidth = topo["alpha"], topo["bandwidth"]
    return small * _ring_model(collective, n, nbytes, alpha, bandwidth) / \
        _ring_model(collective, SIM_RANKS, nbytes, alpha, bandwidth)


def divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


def configurations(model, ranks, zero_stages=(0, 1, 2, 3), recompute=(False, True)):
    """Every valid DP x TP x PP x CP = ranks (and EP dividing DP for a mixture of experts), with
    each ZeRO stage (where DP x CP > 1: ZeRO shards over those ranks) and recomputation setting."""
    out = []
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            for cp in divisors(ranks // (tp * pp)):
                dp = ranks // (tp * pp * cp)
                for ep in divisors(dp) if model.experts else (1,):
                    for zero in zero_stages if dp * cp > 1 else (0,):     # ZeRO shards over DP x CP
                        for r in recompute:
                            config = Config(dp, tp, pp, cp, zero, r, ep=ep)
                            if fits(model, config, ranks):
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
