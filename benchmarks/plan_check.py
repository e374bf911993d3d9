"""The planner against real runs: memory per rank by kind, and the ranking of step times.

Usage::

    python -m benchmarks.plan_check                  # 4 gloo ranks, 16 configurations, 5 timed steps each
    python -m benchmarks.plan_check --world-size 8   # 8 gloo ranks, 21 configurations of a smaller model
    python -m benchmarks.plan_check --world-size 8 --model mnist     # the MNIST job's CNN, DP8 with ZeRO 0-3
    python -m benchmarks.plan_check --steps 9 --hidden 256

A small transformer (``--layers`` pre-LayerNorm blocks of width ``--hidden``, ``--heads``
heads, MLP 4 x hidden; ``--batch`` sequences of ``--seq`` tokens per step, float32, Adam;
on 4 ranks 4 blocks of 128, 4 heads, 32 x 8 tokens; on 8 ranks 2 blocks of 64, 4 heads,
16 x 8 tokens, the 2 x 2 x 2 mesh of chapter 21 among its configurations)
is trained for real on N ranks in each configuration the parallel modules build:
data parallel (one flat all_reduce of the gradients, or ZeRO-1/2
``collectives.parallel.zero``, or ZeRO-3 ``collectives.parallel.fsdp``), tensor parallel
with sequence parallelism (``ParallelBlock(sequence_parallel="regather")``), pipeline
(``PipelineStage``, 1F1B, micro-batches of one sequence), context parallel (each block's
attention the zig-zag ring ``collectives.parallel.ring_attention_zigzag`` over the CP
group, causal, every rank its zig-zag part of each sequence, the parameters replicated
over the CP group: :class:`RingAttention`), their products, and recomputation
(``collectives.parallel.recompute.checkpoint`` around every block). Ranks are laid out
as Megatron lays them out, TP innermost, then CP, DP, PP; the gradients are averaged,
and ZeRO shards, over the DP x CP ranks that hold the same parameters (:func:`groups_of`).
On 4 ranks the configurations are :data:`CONFIGS`; on 8, every DP x TP x PP x CP = 8 the
model allows and the ZeRO and recomputation variants of :func:`configs_for`. Expert
parallelism is not in the step here.

``--model mnist``: the main job's MNIST CNN (:class:`collectives.train.models.Net`),
data parallel over every rank with ZeRO 0-3 (FSDP over its four layers), 256 random
images per step. The planner knows it by its parameter count (a one-token "sequence" per
image, F measured as 6 P per image on this net) and by the bytes autograd keeps per image,
counted in this process on one image and on two before any rank starts
(:func:`collectives.plan.counted_activations`: its formula is a transformer block's);
every kind of memory and the step time are checked. Recomputation is not planned for it.

For each configuration it prints, per rank the largest of the N ranks:

* memory by kind, measured / planned: parameters and gradients (the tensors this rank
  holds after the step: ZeRO-2's gradient shard, FSDP's pieces), optimizer state (the
  tensors in Adam's state), and the peak of activation bytes autograd holds during the
  step (every tensor packed for backward, by its storage, counted from packing until
  autograd lets it go; parameters and FSDP's gathered layers left out). The planner is
  :func:`collectives.plan.memory` with ``value_bytes=4, optimizer_bytes=8``;
* the step time, measured (median of ``--steps`` rounds, each a step of every configuration
  in turn so that the machine's changing load falls on all alike; the slowest rank) and the planner's
  :func:`collectives.plan.step_time` on this machine's network as measured in the same
  run (``--topology measured``: :func:`calibrate`, ``benchmarks.sim_calibrate``'s
  measurements and fit after the training, so the per-message and per-call costs are those
  of the load the steps ran under; a stored ``local`` can miss that by 10x on a shared
  machine) with the FLOP/s each rank sustains measured in the same run (every rank
  training the whole model alone at once, as the ranks share the cores in the runs);

then the ratio of every memory figure to the plan, and the share of configuration pairs
that the planner and the measurement rank in the same order. Every figure comes from
this run; none is stored in the code.
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.fsdp import FullyShardedDataParallel
from collectives.parallel.pipeline import PipelineStage
from collectives.parallel.recompute import checkpoint
from collectives.parallel.ring_attention_zigzag import zigzag_ring_attention, zigzag_split
from collectives.parallel.tensor_parallel import Block, ParallelAttention, ParallelBlock, reduce_replicated_grads
from collectives.parallel.zero import ZeroOptimizer, optimizer_state_bytes
from collectives.plan import Config, Model, check, fits, memory, step_time

KINDS = ("parameters", "gradients", "optimizer", "activations")
CONFIGS = [Config(4, 1, 1, 1), Config(4, 1, 1, 1, zero=1), Config(4, 1, 1, 1, zero=2),
           Config(4, 1, 1, 1, zero=3), Config(4, 1, 1, 1, recompute=True), Config(1, 4, 1, 1),
           Config(1, 4, 1, 1, recompute=True), Config(2, 2, 1, 1), Config(1, 1, 4, 1),
           Config(2, 1, 2, 1), Config(1, 2, 2, 1), Config(1, 1, 1, 4), Config(1, 1, 1, 4, recompute=True),
           Config(2, 1, 1, 2), Config(1, 2, 1, 2), Config(1, 1, 2, 2)]
DIMS = {4: (4, 128, 4, 32, 8), 8: (2, 64, 4, 16, 8)}     # layers, hidden, heads, tokens, sequences per step


def configs_for(world, dims):
    """The configurations checked on ``world`` ranks: on 4, :data:`CONFIGS`; on 8, every
    DP x TP x PP x CP = 8 the model allows (:func:`collectives.plan.configurations`), plus
    DP8 with ZeRO-1, 2 and 3 and with recomputation, and CP8 and DP2 x TP2 x PP2 with
    recomputation, where the model allows them."""
    if world == 4:
        return CONFIGS
    if world != 8:
        raise ValueError(f"plan_check: configurations are listed for 4 and 8 ranks, not {world}")
    from collectives.plan import configurations
    model = model_of(*dims)
    extra = [Config(8, 1, 1, 1, zero=z) for z in (1, 2, 3)] + [Config(8, 1, 1, 1, recompute=True),
                                                                Config(1, 1, 1, 8, recompute=True),
                                                                Config(2, 2, 2, 1, recompute=True)]
    return configurations(model, world, zero_stages=(0,), recompute=(False,)) + [c for c in extra if fits(model, c, world)]


def block_params(h):
    """A :class:`Block`'s parameters: two LayerNorms (4H), QKV and output projections
    (4H^2 + 4H), the MLP (8H^2 + 5H)."""
    return 12 * h * h + 13 * h


def model_of(layers, hidden, heads, seq, batch):
    return Model(params=layers * block_params(hidden), layers=layers, hidden=hidden, seq=seq, batch=batch,
                 heads=heads, value_bytes=4, optimizer_bytes=8)


class PeakSaved:
    """The most bytes autograd holds for backward at once: a storage counts from the first
    tensor packed on it until the last of them is let go (by :class:`_Held` dying)."""

    def __init__(self, skip):
        self.skip, self.count, self.size, self.now, self.peak = skip, {}, {}, 0, 0

    def pack(self, t):
        storage = t.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if not nbytes or ptr in self.skip():
            return t
        if not self.count.get(ptr):
            self.count[ptr], self.size[ptr] = 0, nbytes
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        self.count[ptr] += 1
        return _Held(self, ptr, t)

    def release(self, ptr):
        self.count[ptr] -= 1
        if not self.count[ptr]:
            self.now -= self.size.pop(ptr)
            del self.count[ptr]

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda h: h.t if isinstance(h, _Held) else h)


class _Held:
    __slots__ = ("owner", "ptr", "t")

    def __init__(self, owner, ptr, t):
        self.owner, self.ptr, self.t = owner, ptr, t

    def __del__(self):
        self.owner.release(self.ptr)


class Checkpointed(nn.Module):
    """The blocks in order, each run through :func:`checkpoint` (its input kept, its forward again in backward)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x)
        return x


def coordinates(config, rank):
    """(pp, dp, cp, tp): this rank's place, TP innermost, then CP, DP, PP outermost."""
    c = config
    return rank // (c.tp * c.cp * c.dp), rank // (c.tp * c.cp) % c.dp, rank // c.tp % c.cp, rank % c.tp


def groups_of(config, rank, world):
    """This rank's (coordinates, groups): TP innermost, then CP, DP, PP outermost (Megatron's order).
    The groups: ``tp``, ``cp`` (the ranks sharing one sequence), ``pp``, and ``dp``, the ranks
    that hold the same parameters: data-parallel replicas and their context-parallel ranks
    together (Megatron's data-parallel group with CP folded in), over which the gradients are
    reduced and ZeRO shards. Every rank creates every group, in the same order (torch's rule
    for new_group)."""
    coords = lambda r: coordinates(config, r)                                       # noqa: E731
    mine = {}
    for kind, key in (("tp", lambda r: coords(r)[:3]), ("cp", lambda r: (*coords(r)[:2], coords(r)[3])),
                      ("dp", lambda r: (coords(r)[0], coords(r)[3])), ("pp", lambda r: coords(r)[1:])):
        members = {}
        for r in range(world):
            members.setdefault(key(r), []).append(r)
        for ranks in members.values():
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = group
    return coords(rank), mine


class RingAttention(ParallelAttention):
    """:class:`ParallelAttention` (this rank's heads) whose attention runs over the sequence of
    its context-parallel group ``cp``: zig-zag ring attention, causal, as the planner assumes
    (:mod:`collectives.parallel.ring_attention_zigzag`; the input is this rank's zig-zag part
    of the sequence). Set ``cp`` after :meth:`from_attention`."""
    cp = None

    def forward(self, x):
        qkv = self.qkv(x)                                   # (S/c, B, 3 * local heads * head_dim)
        s, b = qkv.shape[:2]
        q, k, v = qkv.view(s, b, 3, self.local_heads, self.head_dim).permute(2, 1, 3, 0, 4)
        y = zigzag_ring_attention(q, k, v, self.cp, causal=True)
        return self.out(y.permute(2, 0, 1, 3).reshape(s, b, -1))


def parallel_block(block, tp, cp, sequence_parallel):
    """:class:`ParallelBlock` over ``tp``; with a context-parallel group ``cp``, its attention
    a :class:`RingAttention` over it (the parameters replicated over ``cp``)."""
    out = ParallelBlock(block, tp, sequence_parallel)
    if cp is not None:
        out.attn = RingAttention.from_attention(block.attn, tp, sequence_parallel)
        out.attn.cp = cp
    return out


def average_grads(params, group, ranks):
    """Sum the gradients over ``group`` in one flat bucket (a ring all_reduce) and divide by ``ranks``."""
    grads = torch.cat([q.grad.flatten() for q in params])
    collectives.all_reduce(grads, group=group, algorithm="ring")
    grads /= ranks
    offset = 0
    for q in params:
        q.grad.copy_(grads[offset:offset + q.numel()].view_as(q))
        offset += q.numel()


def state_held(params, zero, opt):
    """Bytes of parameters, gradients and optimizer state this rank holds after a step."""
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts if t is not None)   # noqa: E731
    grads = zero.grad_bytes() if zero else size(q.grad for q in params)
    state = zero.state_bytes() if zero else optimizer_state_bytes(opt)
    return dict(parameters=size(params), gradients=grads, optimizer=state)


def build(config, dims, rank, world):
    """This rank's part of the model, its optimizer, and one training step as a function."""
    layers, hidden, heads, seq, batch = dims
    c = config
    (p, d, cr, t), g = groups_of(c, rank, world)
    torch.manual_seed(0)
    whole = [Block(hidden, heads, 4 * hidden) for _ in range(layers)]
    mine = whole[p * layers // c.pp:(p + 1) * layers // c.pp]
    sp = "regather" if c.tp > 1 else False
    blocks = [parallel_block(b, g["tp"], g["cp"] if c.cp > 1 else None, sp) for b in mine]
    fsdp = zero = None
    if c.zero == 3:
        module = fsdp = FullyShardedDataParallel(blocks, group=g["dp"])
        opt = torch.optim.Adam(fsdp.parameters(), lr=1e-4)
    else:
        module = Checkpointed(blocks) if c.recompute else nn.Sequential(*blocks)
        if c.zero:
            opt = zero = ZeroOptimizer(module.parameters(), torch.optim.Adam, group=g["dp"], stage=c.zero, lr=1e-4)
        else:
            opt = torch.optim.Adam(module.parameters(), lr=1e-4)
    m = batch // c.dp          # micro-batches of one sequence
    shard = seq // c.cp // c.tp

    def part(whole):
        """This rank's positions of a whole sequence: its zig-zag part of the CP group's, then its TP shard."""
        mine = zigzag_split(whole, c.cp, cr, dim=0) if c.cp > 1 else whole
        return mine[t * shard:(t + 1) * shard]

    params = list(module.parameters())
    gen = torch.Generator().manual_seed(1 + d)
    # the input needs a gradient, as a block's input inside a network does (a checkpointed block
    # whose input needs none would give its parameters none either: they are not its arguments)
    xs = [part(torch.randn(seq, 1, hidden, generator=gen)).clone().requires_grad_() for _ in range(m)]
    # a copy of this rank's part, as a rank would hold it: a view of the whole sequence would keep
    # the whole sequence's storage, which the loss saves for backward and PeakSaved counts whole
    ys = [part(torch.randn(seq, 1, hidden, generator=gen)).clone() for _ in range(m)]
    pipe = PipelineStage(module, recv_shape=(shard, 1, hidden), group=g["pp"]) if c.pp > 1 else None
    param_ptrs = {q.untyped_storage().data_ptr() for q in params}
    gathered = (lambda: {f.untyped_storage().data_ptr() for f in fsdp.full if f is not None}) if fsdp else set

    def loss(out, y):
        """This TP rank's share of the mean over the sequence (its shard's mean / t): the gradients
        summed over the TP group are then the whole sequence's, as one process's are."""
        return nn.functional.mse_loss(out, y) / c.tp

    def step(peak, update=True):
        """One training step; ``update=False`` stops before the optimizer (and so, under ZeRO,
        before the gradients are reduced), leaving the gradients in ``step.params``."""
        opt.zero_grad()
        with peak.hooks():
            if pipe:
                pipe.step(m, xs if p == 0 else None, ys if p == c.pp - 1 else None, loss)
            else:
                for x, y in zip(xs, ys):
                    (loss(module(x), y) / m).backward()
        if c.tp > 1:
            for b in blocks:
                reduce_replicated_grads(b, g["tp"])
        if c.dp * c.cp > 1 and not c.zero:
            average_grads(params, g["dp"], c.dp * c.cp)
        if update:
            opt.step()

    def held():
        return state_held(params, zero, opt)

    step.params = params
    step.names = [n for n, _ in module.named_parameters()]
    return step, held, lambda: param_ptrs | gathered()


def flops_alone(dims, repeats):
    """FLOP/s of this rank training the whole model alone (6 P T per step), the others doing the same."""
    layers, hidden, heads, seq, batch = dims
    alone = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    torch.manual_seed(0)
    model = nn.Sequential(*[ParallelBlock(Block(hidden, heads, 4 * hidden), alone) for _ in range(layers)])
    x = torch.randn(seq, batch, hidden)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        model(x).pow(2).mean().backward()
        times.append(time.perf_counter() - start)
    return 6 * layers * block_params(hidden) * seq * batch / statistics.median(times[1:])


def rounds(built, steps):
    """Time the built steps round-robin: a step of every configuration per round, so that a change
    in the machine's load (other programs) falls on all of them alike; the first round warms up.
    Per configuration: what this rank holds after its step, its activation peak, its median time."""
    times, peaks = [[] for _ in built], [0] * len(built)
    for _ in range(steps + 1):
        for i, (step, _, skip) in enumerate(built):
            peak = PeakSaved(skip)
            dist.barrier()
            start = time.perf_counter()
            step(peak)
            times[i].append(time.perf_counter() - start)
            peaks[i] = peak.peak
    return [dict(held(), activations=peaks[i], time=statistics.median(times[i][1:]))
            for i, (_, held, _) in enumerate(built)]


def worker(rank, world, dims, steps, configs):
    torch.set_num_threads(1)
    # every rank creates every group of every configuration, in order
    flops = flops_alone(dims, steps)
    built = [build(config, dims, rank, world) for config in configs]
    return flops, rounds(built, steps)


MNIST_IMAGES = 256          # images per step, all ranks together (the job's default global batch is 128)


def mnist_layers():
    """The main job's MNIST model (:class:`collectives.train.models.Net`, seeded) as its four
    layers in order: FSDP's units, and the whole net in sequence."""
    from collectives.train.models import Net
    torch.manual_seed(0)
    net = Net()
    return [nn.Sequential(net.conv1, nn.ReLU(), nn.MaxPool2d(2)),
            nn.Sequential(net.conv2, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()),
            nn.Sequential(net.fc1, nn.ReLU()), net.fc2]


def mnist_params():
    return sum(q.numel() for layer in mnist_layers() for q in layer.parameters())


def mnist_model(images):
    """What the planner can say of the CNN: its parameters (memory, DP traffic, 6 P per image with
    F measured on this net), in 4 layers (FSDP's units); a sequence of one token per image; its
    activations per image and per call, counted on one image and on two in this process (the
    planner's formula is a transformer block's)."""
    from collectives.plan import counted_activations
    net = nn.Sequential(*mnist_layers())
    per_image, per_call = counted_activations(
        lambda xy: nn.functional.cross_entropy(net(xy[0]), xy[1]),
        lambda k: (torch.zeros(k, 1, 28, 28), torch.zeros(k, dtype=torch.long)), net.parameters())
    return Model(params=mnist_params(), layers=4, hidden=1, seq=1, batch=images, heads=1,
                 value_bytes=4, optimizer_bytes=8, activations_per_sample=per_image,
                 activations_per_call=per_call)


def mnist_configs(world, images):
    """DP over every rank with ZeRO 0-3, each rank's images one micro-batch."""
    return [Config(world, 1, 1, 1, zero=z, micro_batch=images // world) for z in range(4)]


def build_mnist(config, images, rank, world):
    """DP over the world: a flat all_reduce (ZeRO-0), ZeRO-1/2, or FSDP over the four layers."""
    layers = mnist_layers()
    fsdp = zero = None
    if config.zero == 3:
        module = fsdp = FullyShardedDataParallel(layers, group=None)
        opt = torch.optim.Adam(fsdp.parameters(), lr=1e-4)
    else:
        module = nn.Sequential(*layers)
        if config.zero:
            opt = zero = ZeroOptimizer(module.parameters(), torch.optim.Adam, group=None, stage=config.zero, lr=1e-4)
        else:
            opt = torch.optim.Adam(module.parameters(), lr=1e-4)
    params = list(module.parameters())
    gen = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(images // world, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (images // world,), generator=gen)

    def step(peak):
        opt.zero_grad()
        with peak.hooks():
            nn.functional.cross_entropy(module(x), y).backward()
        if not config.zero:
            average_grads(params, None, world)
        opt.step()

    def held():
        return state_held(params, zero, opt)

    param_ptrs = {q.untyped_storage().data_ptr() for q in params}
    gathered = (lambda: {f.untyped_storage().data_ptr() for f in fsdp.full if f is not None}) if fsdp else set
    return step, held, lambda: param_ptrs | gathered()


def mnist_worker(rank, world, images, steps, configs):
    """The MNIST net on ``world`` ranks, each configuration's step timed round-robin; F: 6 P per
    image over the time of this rank training the whole net alone on its images, the others
    doing the same."""
    torch.set_num_threads(1)
    net = nn.Sequential(*mnist_layers())
    x, y = torch.randn(images // world, 1, 28, 28), torch.randint(0, 10, (images // world,))
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        nn.functional.cross_entropy(net(x), y).backward()
        times.append(time.perf_counter() - start)
    flops = 6 * mnist_params() * (images // world) / statistics.median(times[1:])
    return flops, rounds([build_mnist(c, images, rank, world) for c in configs], steps)


def pairs_agreeing(planned, measured, tie=0.01):
    """(agreeing, pairs): of the pairs (i, j) whose planned times differ by more than ``tie``
    (relative; the planner gives ZeRO-0, 1 and 2 the same time: it has no order for them),
    how many the measurement puts the same way round."""
    n, same, total = len(planned), 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            if abs(planned[i] - planned[j]) <= tie * max(planned[i], planned[j]):
                continue
            total += 1
            same += (planned[i] - planned[j]) * (measured[i] - measured[j]) > 0
    return same, total


def measure(world, dims, steps=3, configs=CONFIGS, timeout=600, mnist=False):
    """Run every configuration on ``world`` gloo ranks; (flops, [{kind: max over ranks, time}]).
    ``mnist``: the MNIST net instead, ``dims`` the images per step."""
    from collectives.tools.launch import run_in_group
    model = mnist_model(dims) if mnist else model_of(*dims)
    for config in configs:
        check(model, config, world)
    per_rank = run_in_group(mnist_worker if mnist else worker, world, dims, steps, configs,
                            env={"COLLECTIVES_TIMEOUT": "60"}, timeout=timeout)
    flops = statistics.median(f for f, _ in per_rank)
    rows = [{k: max(rows[i][k] for _, rows in per_rank) for k in (*KINDS, "time")} for i in range(len(configs))]
    return flops, rows


CALIBRATION_SIZES = (4, 64, 1024, 16 << 10, 256 << 10, 1 << 20)


def calibrate(world, iters=10, timeout=600):
    """This machine's ``local`` topology measured now, as ``python -m benchmarks.sim_calibrate``
    measures it (ping-pong, ring exchange, reductions, 4-byte all_reduce calls through the API,
    in worlds of 2 and ``world`` gloo ranks), so that the planner's per-message and per-call
    costs are those of the load the configurations ran under, not a stored day's."""
    from benchmarks import pingpong, sim_calibrate
    from collectives.tools.launch import run_in_group
    rows = []
    for n in sorted({2, world}):
        per_rank = run_in_group(pingpong.measure, n, torch.device("cpu"), CALIBRATION_SIZES, iters, 2,
                                env={"COLLECTIVES_TIMEOUT": "60"}, timeout=timeout)
        rows += per_rank[0]
    return dict(sim_calibrate.spec_from_p2p(rows), name="measured")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.plan_check", description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4, choices=sorted(DIMS))
    p.add_argument("--model", choices=("transformer", "mnist"), default="transformer",
                   help="mnist: the main job's CNN (collectives.train.models.Net), data parallel with ZeRO 0-3")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int, help=f"sequences per step (mnist: images per step, {MNIST_IMAGES})")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--topology", default="measured",
                   help="the planner's network: 'measured' (calibrated in this run, after the "
                        "training: worlds of 2 and --world-size ranks), or any of python -m collectives.sim's")
    p.add_argument("--save-topology", metavar="PATH",
                   help="with --topology measured: write the calibrated network as JSON, for another "
                        "run's --topology PATH (the calibration takes minutes on a busy machine)")
    args = p.parse_args(argv)
    world, mnist = args.world_size, args.model == "mnist"
    if mnist:
        dims = args.batch or MNIST_IMAGES
        model = mnist_model(dims)
        configs = mnist_configs(world, dims)
        what = (f"the MNIST net (collectives.train.models.Net, {model.params:.0f} parameters), {dims} images "
                f"per step, float32, Adam")
    else:
        given = (args.layers, args.hidden, args.heads, args.seq, args.batch)
        dims = tuple(d if g is None else g for d, g in zip(DIMS[world], given))
        model = model_of(*dims)
        what = (f"{dims[0]} blocks, hidden {dims[1]}, {dims[2]} heads, {dims[3]} tokens x {dims[4]} sequences "
                f"per step, float32, Adam")
        try:
            configs = configs_for(world, dims)
        except ValueError as exc:
            p.error(str(exc))
    try:
        for config in configs:
            check(model, config, world)
    except ValueError as exc:
        p.error(str(exc))
    flops, rows = measure(world, dims, args.steps, configs, mnist=mnist)
    topology = args.topology
    if topology == "measured":
        topology = calibrate(world)
        if args.save_topology:
            import json
            with open(args.save_topology, "w") as f:
                json.dump(topology, f, indent=1)
    if not isinstance(topology, str) or topology.endswith(".json"):
        from collectives.sim import load_topology
        from collectives.sim import topology as topologies
        print("# " + topologies.describe(load_topology(topology)))
    print(f"# {what}; {world} gloo ranks; measured {flops / 1e9:.2f} GFLOP/s per rank; planner on "
          f"--topology {args.topology}")
    print("# memory KB per rank (largest rank): measured/planned; step ms: measured, planned")
    print(f"{'configuration':<30} " + " ".join(f"{k:>17}" for k in KINDS) + f" {'measured':>9} {'planned':>8}")
    planned_t, measured_t, ratios = [], [], {k: [] for k in KINDS}
    for config, row in zip(configs, rows):
        plan_mem = memory(model, config)
        planned = step_time(model, config, topology, flops)[0]
        planned_t.append(planned)
        measured_t.append(row["time"])
        for k in KINDS:
            ratios[k].append(row[k] / plan_mem[k])
        print(f"{str(config):<30} " + " ".join(f"{row[k] / 1e3:8.1f}/{plan_mem[k] / 1e3:8.1f}" for k in KINDS)
              + f" {row['time'] * 1e3:9.1f} {planned * 1e3:8.1f}")
    for k in KINDS:
        print(f"# {k}: measured/planned {min(ratios[k]):.3f} to {max(ratios[k]):.3f}")
    total = [sum(r[k] for k in KINDS) / sum(memory(model, c).values()) for c, r in zip(configs, rows)]
    print(f"# total memory: measured/planned {min(total):.3f} to {max(total):.3f}")
    same, pairs = pairs_agreeing(planned_t, measured_t)
    print(f"# step-time ranking: {same} of the {pairs} pairs the planner orders (of "
          f"{len(configs) * (len(configs) - 1) // 2}; the others it ties within 1%) in the same order: "
          f"{same / pairs:.0%} (goal: >= 80%)" if pairs else "# step-time ranking: the planner ties every pair")
    print(f"# measured/planned step time: {min(m / p for m, p in zip(measured_t, planned_t)):.2f} to "
          f"{max(m / p for m, p in zip(measured_t, planned_t)):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
