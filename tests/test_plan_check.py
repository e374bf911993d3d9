"""The planner's memory against a real run (benchmarks/plan_check.py's worker, on 2 ranks).

Four configurations of a 2-block transformer in float32 with Adam, each trained for real:
ZeRO-2 data parallel, tensor parallel with sequence parallelism and recomputation, a
2-stage 1F1B pipeline, and context parallelism (zig-zag ring attention). Parameters,
gradients and optimizer state held after the step agree
with :func:`collectives.plan.memory` within 2% (the LayerNorms and two biases a tensor-parallel
rank holds whole, Adam's step counters); the peak of activation bytes autograd holds is the
planner's plus, where the loss is computed while the peak is held, the loss's saved input and
target (this rank's part of one sequence each), which the planner leaves out. No timing is asserted.

The steps' gradients (TP2, PP2, CP2, recomputed or not) are one process's on the whole
batch, and the bytes a zig-zag ring attention block sends are the planner's CP bytes.
"""
from benchmarks.plan_check import KINDS, PeakSaved, model_of, worker
from collectives.plan import Config, communication, memory
from tests.worlds import run_world

DIMS = (2, 32, 4, 8, 4)        # layers, hidden, heads, sequence, batch
CONFIGS = [Config(2, 1, 1, 1, zero=2), Config(1, 2, 1, 1, recompute=True), Config(1, 1, 2, 1), Config(1, 1, 1, 2),
           Config(1, 2, 1, 1)]


def test_memory_by_kind_matches_a_real_run():
    per_rank = run_world(worker, 2, DIMS, 1, CONFIGS, timeout=240)
    model = model_of(*DIMS)
    layers, hidden, heads, seq, batch = DIMS
    for i, config in enumerate(CONFIGS):
        planned = memory(model, config)
        for kind in KINDS[:3]:
            measured = max(rows[i][kind] for _, rows in per_rank)
            assert abs(measured / planned[kind] - 1) <= 0.02, (
                f"{config}: {kind} measured {measured} B, planned {planned[kind]:.0f} B")
        # mse_loss keeps its input and target, this rank's part of a sequence each; the peak is
        # stage 0's under the pipeline, and recomputation's is a layer's recomputation, after the loss
        loss = 0 if config.pp > 1 or config.recompute else 2 * seq // (config.cp * config.tp) * hidden * 4
        measured = max(rows[i]["activations"] for _, rows in per_rank)
        assert measured == planned["activations"] + loss, (str(config), measured, planned["activations"], loss)


def test_peak_counts_a_storage_once_and_lets_it_go():
    import torch
    peak = PeakSaved(set)
    x = torch.randn(100, requires_grad=True)
    with peak.hooks():
        y = (x * x).sum()          # x saved twice, one storage: 400 bytes
        z = (x.exp()).sum()        # exp saves its output: 400 more
    assert peak.peak == 800 and peak.now == 800
    y.backward()
    assert peak.now == 400          # mul's saved x let go; exp's output still held
    z.backward()
    assert peak.now == 0 and peak.peak == 800


def recompute_peaks(rank, world_size):
    import torch
    import torch.distributed as dist

    from benchmarks.plan_check import Checkpointed
    from collectives.parallel.tensor_parallel import Block, ParallelBlock
    group = dist.new_group([0])
    peaks = []
    for layers in (1, 2, 3):
        torch.manual_seed(0)
        module = Checkpointed([ParallelBlock(Block(64, 4, 256), group) for _ in range(layers)])
        params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        x = torch.randn(16, 1, 64, requires_grad=True)
        peak = PeakSaved(lambda: params)
        with peak.hooks():
            module(x).sum().backward()       # sum saves nothing: the blocks' bytes alone
        peaks.append(peak.peak)
    return peaks


def test_recomputation_peak_is_the_inputs_plus_one_layer():
    peaks = run_world(recompute_peaks, 1, timeout=120)[0]
    for layers, peak in zip((1, 2, 3), peaks):
        model = model_of(layers, 64, 4, 16, 1)
        assert peak == memory(model, Config(1, 1, 1, 1, recompute=True))["activations"], (layers, peak)


def tensor_parallel_traffic(rank, world_size):
    import torch

    import collectives
    from benchmarks.plan_check import Checkpointed
    from collectives.parallel.tensor_parallel import Block, ParallelBlock
    sent = []
    for recompute in (False, True):
        torch.manual_seed(0)
        block = ParallelBlock(Block(16, 2, 64), None, "regather")
        module = Checkpointed([block]) if recompute else block
        x = torch.randn(8, 1, 16)[rank * 4:(rank + 1) * 4].clone().requires_grad_()
        with collectives.count_traffic() as traffic:
            module(x).sum().backward()
        sent.append(traffic.sent_bytes)
    return sent


def test_tensor_parallel_bytes_match_a_real_block():
    """One block with sequence parallelism ("regather") on 2 ranks, forward and backward, with and
    without recomputation: the bytes a rank sends are the planner's TP bytes for one layer."""
    per_rank = run_world(tensor_parallel_traffic, 2, timeout=120)
    model = model_of(1, 16, 2, 8, 1)
    for recompute, *sent in zip((False, True), *per_rank):
        planned = communication(model, Config(1, 2, 1, 1, recompute=recompute))["tp"]
        assert set(sent) == {planned}, f"recompute={recompute}: sent {sent} B, planned {planned} B"


NAMES = {"attn.qkv.weight": "attn.in_proj_weight", "attn.qkv.bias": "attn.in_proj_bias",
         "attn.out.weight": "attn.out_proj.weight", "attn.out.bias": "attn.out_proj.bias",
         "mlp.fc1.weight": "mlp.0.weight", "mlp.fc1.bias": "mlp.0.bias",
         "mlp.fc2.weight": "mlp.2.weight", "mlp.fc2.bias": "mlp.2.bias"}
ONE_PROCESS = [Config(1, 2, 1, 1), Config(1, 2, 1, 1, recompute=True), Config(1, 1, 2, 1),
               Config(1, 1, 1, 2), Config(1, 1, 1, 2, recompute=True)]


def cut(name, grad, n, r):
    """A whole :class:`Block` parameter's gradient as :class:`ParallelBlock` cuts it for TP rank r of n."""
    import torch
    if name in ("attn.in_proj_weight", "attn.in_proj_bias"):        # [Q; K; V], this rank's heads of each
        return torch.cat([part.chunk(n, 0)[r] for part in grad.chunk(3, 0)])
    if name in ("mlp.0.weight", "mlp.0.bias"):                        # column-parallel
        return grad.chunk(n, 0)[r]
    if name in ("attn.out_proj.weight", "mlp.2.weight"):              # row-parallel
        return grad.chunk(n, 1)[r]
    return grad


def one_process_gradients(rank, world_size, dims):
    """plan_check's step in each of :data:`ONE_PROCESS`, stopped before the optimizer, against one
    process training the whole sequences: per configuration (largest difference, largest gradient)."""
    import torch
    import torch.nn as nn

    from benchmarks.plan_check import build, coordinates
    from collectives.parallel.tensor_parallel import Block
    layers, hidden, heads, seq, batch = dims
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(hidden, heads, 4 * hidden) for _ in range(layers)])
    gen = torch.Generator().manual_seed(1)          # replica 0's data, as build draws it
    xs = [torch.randn(seq, 1, hidden, generator=gen).requires_grad_() for _ in range(batch)]
    ys = [torch.randn(seq, 1, hidden, generator=gen) for _ in range(batch)]
    for x, y in zip(xs, ys):
        (nn.functional.mse_loss(model(x), y) / batch).backward()
    reference = dict(model.named_parameters())
    out = []
    for config in ONE_PROCESS:
        step, _, skip = build(config, dims, rank, world_size)
        step(PeakSaved(skip), update=False)
        p, _, _, t = coordinates(config, rank)
        diff = 0.0
        for name, q in zip(step.names, step.params):
            # "0.attn.qkv.weight" (or Checkpointed's "blocks.0.attn.qkv.weight"): "0.attn.in_proj_weight"
            layer, rest = name.removeprefix("blocks.").split(".", 1)
            layer = int(layer) + p * layers // config.pp            # the stage's first layer is p L / pp
            whole = NAMES.get(rest, rest)
            expected = cut(whole, reference[f"{layer}.{whole}"].grad, config.tp, t)
            diff = max(diff, (q.grad - expected).abs().max().item())
        out.append((diff, max(q.grad.abs().max().item() for q in reference.values())))
    return out


def test_steps_give_one_process_gradients():
    """On 2 ranks, TP2 (sequence parallel), PP2 (1F1B) and CP2 (each rank its zig-zag half of every
    sequence), TP2 and CP2 also recomputed: after the step's reductions every rank's gradients are
    one process's on the whole batch, cut as the rank holds the parameters."""
    per_rank = run_world(one_process_gradients, 2, (2, 32, 4, 8, 2), timeout=120)
    for i, config in enumerate(ONE_PROCESS):
        for rows in per_rank:
            diff, scale = rows[i]
            assert diff <= 1e-5 * scale, (str(config), diff, scale)


def context_parallel_traffic(rank, world_size):
    import torch
    import torch.distributed as dist

    import collectives
    from benchmarks.plan_check import Checkpointed, parallel_block
    from collectives.parallel.ring_attention_zigzag import zigzag_split
    from collectives.parallel.tensor_parallel import Block
    alone = [dist.new_group([r]) for r in range(world_size)][rank]     # no tensor parallelism
    sent = []
    for recompute in (False, True):
        torch.manual_seed(0)
        block = parallel_block(Block(16, 2, 64), alone, dist.group.WORLD, False)
        module = Checkpointed([block]) if recompute else block
        x = zigzag_split(torch.randn(16, 1, 16), world_size, rank, dim=0).clone().requires_grad_()
        with collectives.count_traffic() as traffic:
            module(x).sum().backward()
        sent.append(traffic.sent_bytes)
    return sent


def test_context_parallel_bytes_match_a_real_block():
    """One block whose attention is the zig-zag ring over 4 ranks (CP4: c = 4 tells apart a model
    that charges the backward's last move c-1 times), forward and backward, with and without
    recomputation: the bytes a rank sends are the planner's CP bytes for one layer."""
    per_rank = run_world(context_parallel_traffic, 4, timeout=120)
    model = model_of(1, 16, 2, 16, 1)
    for recompute, *sent in zip((False, True), *per_rank):
        planned = communication(model, Config(1, 1, 1, 4, recompute=recompute))["cp"]
        assert set(sent) == {planned}, f"recompute={recompute}: sent {sent} B, planned {planned} B"


def test_eight_ranks_list_every_product_the_model_allows():
    """``--world-size 8``: every DP x TP x PP x CP = 8 of the 8-rank model (chapter 21's 2 x 2 x 2
    among them), DP8 with each ZeRO stage, and the recomputed variants; other sizes refused."""
    import pytest

    from benchmarks.plan_check import DIMS as RUN_DIMS
    from benchmarks.plan_check import configs_for, main
    from collectives.plan import configurations
    configs = configs_for(8, RUN_DIMS[8])
    plain = {(c.dp, c.tp, c.pp, c.cp) for c in configurations(model_of(*RUN_DIMS[8]), 8)}
    assert {(c.dp, c.tp, c.pp, c.cp) for c in configs} == plain and len(plain) == 15
    assert Config(2, 2, 2, 1) in configs and Config(1, 1, 1, 8) in configs
    assert {c.zero for c in configs if c.dp == 8} == {0, 1, 2, 3} and len(set(configs)) == len(configs)
    with pytest.raises(SystemExit):
        main(["--world-size", "6"])


def test_mnist_net_memory_matches_the_planner():
    """The main job's MNIST CNN, data parallel on 2 ranks with ZeRO-0, 1 and 3 (FSDP over its four
    layers): parameters, gradients and Adam's state held after a step are the planner's for a
    model of its parameter count (FSDP's padding to 2 pieces per layer, Adam's step counters),
    and the activation peak of 8 images per rank is the planner's from the bytes counted on one
    image and on two in this process (the convolutions' inputs, the ReLUs' outputs, the poolings'
    int64 indices, the loss's)."""
    from benchmarks.plan_check import mnist_configs, mnist_model, mnist_worker
    configs = [c for c in mnist_configs(2, 16) if c.zero != 2]
    assert {c.micro_batch for c in configs} == {8}
    per_rank = run_world(mnist_worker, 2, 16, 1, configs, timeout=120)
    model = mnist_model(16)
    assert model.activations_per_sample == 82288    # 3,136 + 36,864 + 18,432 + 9,216 + 8,192 + 4,096 + 2,048 + 256 + 40 + 8
    for i, config in enumerate(configs):
        planned = memory(model, config)
        for kind in KINDS:
            measured = max(rows[i][kind] for _, rows in per_rank)
            assert abs(measured / planned[kind] - 1) <= 0.01, (str(config), kind, measured, planned[kind])


def test_a_model_described_by_its_activations_is_planned_data_parallel_only():
    import pytest
    from collectives.plan import check, configurations
    from benchmarks.plan_check import mnist_model
    model = mnist_model(16)
    with pytest.raises(ValueError, match="data parallel only"):
        check(model, Config(1, 1, 2, 1), 2)
    assert {(c.dp, c.tp, c.pp, c.cp, c.recompute) for c in configurations(model, 4)} == {(4, 1, 1, 1, False)}
