"""The planner's memory against a real run (benchmarks/plan_check.py's worker, on 2 ranks).

Three configurations of a 2-block transformer in float32 with Adam, each trained for real:
ZeRO-2 data parallel, tensor parallel with sequence parallelism and recomputation, and a
2-stage 1F1B pipeline. Parameters, gradients and optimizer state held after the step agree
with :func:`collectives.plan.memory` within 2% (the LayerNorms and two biases a tensor-parallel
rank holds whole, Adam's step counters); the peak of activation bytes autograd holds within
10% (the loss's saved tensors, which the planner leaves out). No timing is asserted.
"""
from benchmarks.plan_check import KINDS, PeakSaved, model_of, worker
from collectives.plan import Config, communication, memory
from tests.worlds import run_world

DIMS = (2, 32, 4, 8, 4)        # layers, hidden, heads, sequence, batch
CONFIGS = [Config(2, 1, 1, 1, zero=2), Config(1, 2, 1, 1, recompute=True), Config(1, 1, 2, 1)]


def test_memory_by_kind_matches_a_real_run():
    per_rank = run_world(worker, 2, DIMS, 1, CONFIGS, timeout=240)
    model = model_of(*DIMS)
    for i, config in enumerate(CONFIGS):
        planned = memory(model, config)
        for kind in KINDS:
            measured = max(rows[i][kind] for _, rows in per_rank)
            tolerance = 0.10 if kind == "activations" else 0.02
            assert abs(measured / planned[kind] - 1) <= tolerance, (
                f"{config}: {kind} measured {measured} B, planned {planned[kind]:.0f} B")


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
