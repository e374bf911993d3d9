"""Tensor and sequence parallelism (collectives/parallel/tensor_parallel.py): the parameters of
single-process training, and the bytes chapter 17 derives.

One world of 4 ranks runs every case on groups of 1, 2, 3 and 4 of them. The block is float64:
the tensor-parallel sums add the same products in another order (partial sums per rank, then the
all_reduce), so the parameters agree to rounding (about 1e-15 relative per operation), not
bitwise; 1e-10 after three steps leaves a wide margin and still catches any missing or doubled
term, which moves a parameter by about lr x gradient ~ 1e-3.
"""
import torch
import torch.distributed as dist

import collectives
from collectives.parallel.recompute import saved_activation_bytes
from collectives.parallel.tensor_parallel import (Block, ColumnParallelLinear, ParallelBlock, RowParallelLinear,
                                                  exposed_waits, reduce_replicated_grads)
from tests.worlds import assert_refused_alike, attempt, run_world

S, B, H, HEADS, FFN = 12, 2, 24, 12, 48     # S, H, HEADS, FFN divisible by 1, 2, 3, 4
STEPS, LR = 3, 0.1
E = 8                                        # float64


def reference_block():
    torch.manual_seed(0)
    return Block(H, HEADS, FFN, dtype=torch.float64)


def data(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(S, B, H, generator=g, dtype=torch.float64),
            torch.randn(S, B, H, generator=g, dtype=torch.float64))


def loss_of(y, target):
    return ((y - target) ** 2).sum() / (S * B * H)   # the mean over the whole sequence, shard by shard


def train(model, group, sequence_parallel, steps):
    n, r = (dist.get_world_size(group), dist.get_rank(group)) if group is not None else (1, 0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, target = data(step)
        if sequence_parallel:   # each rank its own S/N positions
            x, target = x.chunk(n)[r], target.chunk(n)[r]
        opt.zero_grad()
        loss_of(model(x), target).backward()
        if sequence_parallel:
            reduce_replicated_grads(model, group)
        opt.step()


def same_as_one_process(rank, world_size):
    results = {}
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    reference = reference_block()
    train(reference, None, False, STEPS)
    for n, group in groups.items():
        if rank >= n:
            continue
        for sp in (False, True, "regather"):
            model = ParallelBlock(reference_block(), group, sp)
            train(model, group, sp, STEPS)
            expected = ParallelBlock(reference, group, sp).state_dict()   # the trained reference, cut the same way
            start = ParallelBlock(reference_block(), group, sp).state_dict()
            got = model.state_dict()
            diff = max((got[k] - expected[k]).abs().max().item() for k in got)
            moved = min((got[k] - start[k]).abs().max().item() for k in got)
            with collectives.count_traffic() as t:
                train(model, group, sp, 1)
            results[(n, sp)] = (diff, moved, t.sent_bytes, t.sent_messages, t.recv_bytes, saved_bytes(model, n, sp))
    return results


def saved_bytes(model, n, sequence_parallel):
    """Bytes of the activations autograd keeps for backward in one forward pass: each storage
    once, the parameters left out, the input shard in its own storage (as a layer's output is)."""
    x = data(0)[0]
    x = (x.chunk(n)[dist.get_rank()] if sequence_parallel else x).clone()
    return saved_activation_bytes(model, x, exclude=model.parameters())[1]


def expected_traffic(n, sequence_parallel):
    """Chapter 17: four collectives of the activation A = S x B x H x e per block and step, each
    sending 2(N-1)/N x A per rank (all_reduce, ring) or (N-1)/N x A (all_gather, reduce_scatter:
    eight of them, ten when the column-parallel inputs are gathered again in backward); sequence
    parallel adds one all_reduce of the LayerNorm and bias gradients; both first check that every
    rank holds an input of one shape (N-1 messages of 256 bytes)."""
    if n == 1:
        return 0, 0
    a = S * B * H * E
    collectives_of_a = 10 if sequence_parallel == "regather" else 8    # regather: 2 all_gathers more
    sent, messages = collectives_of_a * (n - 1) * a // n, collectives_of_a * (n - 1)
    if sequence_parallel:
        replicated = (2 * H + 2 * H + 2 * H) * E    # ln1, ln2 (weight, bias), attn.out.bias, mlp.fc2.bias
        sent += 2 * (n - 1) * replicated // n
        messages += 2 * (n - 1)
    # and first, every rank's input compared: one ring all_gather of 256-byte lines per block forward
    sent += (n - 1) * 256
    messages += n - 1
    return sent, messages


def test_tensor_and_sequence_parallel_train_like_one_process():
    per_rank = run_world(same_as_one_process, 4)
    for rank, results in enumerate(per_rank):
        assert len(results) == 3 * (4 - rank)
        for (n, sp), (diff, moved, sent, messages, received, kept) in results.items():
            what = f"rank {rank}, group of {n}, sequence_parallel={sp}"
            assert moved > 1e-6, f"{what}: a parameter did not move"
            assert diff < 1e-10, f"{what}: differs from one process by {diff}"
            assert (sent, messages) == expected_traffic(n, sp), f"{what}: sent {sent} B in {messages} messages"
            assert received == sent, what
        one = per_rank[0][(1, False)][5]      # one process: the group of rank 0 alone
        for n in range(max(2, rank + 1), 5):         # the groups this rank is in
            kept = {sp: results[(n, sp)][5] for sp in (False, True, "regather")}
            # chapter 17: regathered, every activation is cut N ways (S divides by N here);
            # tensor parallel keeps whole the LayerNorms' inputs and outputs
            assert kept["regather"] * n == one, (rank, n, kept, one)
            assert kept["regather"] < kept[True] < kept[False], (rank, n, kept)


def check_errors(rank, world_size):
    errors = []
    only_rank_0 = dist.new_group([0])
    for make in (lambda: ColumnParallelLinear(4, 3), lambda: ParallelBlock(Block(6, 3, 8)),
                 lambda: ColumnParallelLinear(4, 4, group=only_rank_0)):
        try:
            make()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_sizes_that_do_not_split_are_refused_before_any_message():
    per_rank = run_world(check_errors, 2)
    for errors in per_rank:
        assert "out_features=3 is not divisible by the group size 2" in errors[0]
        assert "heads=3 must be divisible by the group size 2" in errors[1]
    assert "rank 1 is not a member of the group" in per_rank[1][2]


def chunks_for(n):
    """A chunk count that divides this group's shard of S positions (S/N = 12, 6, 4, 3)."""
    return 3 if (S // n) % 3 == 0 else 2


def overlapped_like_plain(rank, world_size):
    results = {}
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    for n, group in groups.items():
        if rank >= n:
            continue
        plain = ParallelBlock(reference_block(), group, True)
        overlapped = ParallelBlock(reference_block(), group, True, overlap=chunks_for(n))
        waits = exposed_waits(overlapped)
        with collectives.count_traffic() as t_plain:
            train(plain, group, True, STEPS)
        with collectives.count_traffic() as t_over:
            train(overlapped, group, True, STEPS)
        got, expected = overlapped.state_dict(), plain.state_dict()
        diff = max((got[k] - expected[k]).abs().max().item() for k in got)
        bitwise = all(torch.equal(got[k], expected[k]) for k in got)
        results[n] = (diff, bitwise, t_plain.sent_bytes, t_over.sent_bytes, len(waits))
    return results


def test_overlapped_chunks_train_like_the_plain_sequence_parallel_block():
    per_rank = run_world(overlapped_like_plain, 4)
    for rank, results in enumerate(per_rank):
        assert sorted(results) == list(range(rank + 1, 5))
        for n, (diff, bitwise, plain_bytes, over_bytes, waits) in results.items():
            what = f"rank {rank}, group of {n}, overlap={chunks_for(n)}"
            assert diff < 1e-10, f"{what}: differs from the plain block by {diff}"
            assert over_bytes == plain_bytes, f"{what}: chunks moved {over_bytes} B, not {plain_bytes}"
            # 4 sequence-parallel linears, each waiting on every chunk forward and backward
            assert waits == STEPS * 4 * 2 * chunks_for(n), what


def check_overlap_errors(rank, world_size):
    errors = []
    tp = dist.new_group([0, 1])
    for make in (lambda: ColumnParallelLinear(4, 4, group=tp, overlap=2),
                 lambda: ColumnParallelLinear(4, 4, group=tp, sequence_parallel="regather", overlap=2),
                 lambda: ColumnParallelLinear(4, 4, group=tp, sequence_parallel=True, overlap=-1),
                 lambda: ColumnParallelLinear(4, 4, group=tp, sequence_parallel=True, overlap=2)(
                     torch.zeros(3, 1, 4))):
        try:
            make()
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_overlap_arguments_are_refused_before_any_message():
    for errors in run_world(check_overlap_errors, 2):
        assert "overlap=2 needs sequence_parallel=True" in errors[0]
        assert "not 'regather'" in errors[1]
        assert "overlap=-1 must be a chunk count" in errors[2]
        assert "3 positions per rank is not divisible by overlap=2" in errors[3]


def different_shards(rank, world_size):
    """Each case: rank 1's sequence-parallel input differs from the others' (or is wrong on its
    own); every rank catches what it gets. Then a good step on the same layers."""
    shard = torch.zeros(S // 3, B, H, dtype=torch.float64)
    block = ParallelBlock(reference_block(), None, True)
    column = ColumnParallelLinear(H, FFN, True, None, True, torch.float64)
    overlapped = ColumnParallelLinear(H, FFN, True, None, True, torch.float64, overlap=2)
    row = RowParallelLinear(FFN, H, True, None, True, torch.float64)
    cases = {"block": (block, shard, torch.zeros(S // 3 + 1, B, H, dtype=torch.float64)),
             "batch": (column, shard, torch.zeros(S // 3, B + 1, H, dtype=torch.float64)),
             "overlap": (overlapped, shard, torch.zeros(S // 3 + 2, B, H, dtype=torch.float64)),
             "row": (row, torch.zeros(S, B, FFN // 3, dtype=torch.float64),
                     torch.zeros(S + 3, B, FFN // 3, dtype=torch.float64)),
             "row own": (row, torch.zeros(S, B, FFN // 3, dtype=torch.float64),
                         torch.zeros(S - 2, B, FFN // 3, dtype=torch.float64))}
    out = {}
    for case, (layer, good, bad) in cases.items():
        out[case] = attempt(layer, bad if rank == 1 else good)
    out["after"] = tuple(block(shard).shape)        # the group is still usable
    return out


def test_sequence_parallel_shards_that_differ_are_refused_on_every_rank_at_once():
    """A longer shard, another batch, an overlapped layer's shard, a row-parallel input of another
    length on one rank of 3, or a length not divisible by N on one rank: every rank raises the same
    ValueError naming the ranks and shapes within seconds, not after COLLECTIVES_TIMEOUT (60 s)."""
    results = run_world(different_shards, 3, env={"COLLECTIVES_TIMEOUT": "60"})
    words = {"block": "ColumnParallelLinear: ranks hold different inputs: ranks 0, 2: x [4, 2, 24] float64; "
                      "rank 1: x [5, 2, 24] float64",
             "batch": "ranks 0, 2: x [4, 2, 24] float64; rank 1: x [4, 3, 24] float64",
             "overlap": "ranks 0, 2: x [4, 2, 24] float64; rank 1: x [6, 2, 24] float64",
             "row": "RowParallelLinear: ranks hold different inputs: ranks 0, 2: x [12, 2, 16] float64; "
                    "rank 1: x [15, 2, 16] float64",
             "row own": "RowParallelLinear: rank 1: the sequence length 10 is not divisible by the group size 3"}
    assert_refused_alike(results, words)
    assert all(r["after"] == (S // 3, B, H) for r in results)


def different_inputs(rank, world_size):
    """Plain tensor parallelism: rank 1's input differs (a longer sequence, another batch, another
    dtype, a row-parallel slice of another width); every rank catches what it gets."""
    x = torch.zeros(S, B, H, dtype=torch.float64)
    block = ParallelBlock(reference_block(), None)
    column = ColumnParallelLinear(H, FFN, True, None, False, torch.float64)
    row = RowParallelLinear(FFN, H, True, None, False, torch.float64)
    cases = {"block": (block, x, torch.zeros(S + 1, B, H, dtype=torch.float64)),
             "batch": (column, x, torch.zeros(S, B + 1, H, dtype=torch.float64)),
             "dtype": (column, x, torch.zeros(S, B, H, dtype=torch.float32)),
             "row": (row, torch.zeros(S, B, FFN // 3, dtype=torch.float64),
                     torch.zeros(S, B, FFN // 3 + 1, dtype=torch.float64))}
    out = {case: attempt(layer, bad if rank == 1 else good) for case, (layer, good, bad) in cases.items()}
    out["after"] = tuple(block(x).shape)        # the group is still usable
    return out


def test_tensor_parallel_inputs_that_differ_are_refused_on_every_rank_at_once():
    """Without sequence parallelism the first collective is the row-parallel all_reduce; one rank's
    input of another shape made the ranks' all_reduces of two sizes wait for COLLECTIVES_TIMEOUT
    (then a DesyncError). Now every rank raises the same ValueError within seconds."""
    results = run_world(different_inputs, 3, env={"COLLECTIVES_TIMEOUT": "60"})
    words = {"block": "ColumnParallelLinear: ranks hold different inputs: ranks 0, 2: x [12, 2, 24] float64; "
                      "rank 1: x [13, 2, 24] float64; every rank must hold the same input (S, B, hidden)",
             "batch": "ranks 0, 2: x [12, 2, 24] float64; rank 1: x [12, 3, 24] float64",
             "dtype": "ranks 0, 2: x [12, 2, 24] float64; rank 1: x [12, 2, 24] float32",
             "row": "RowParallelLinear: ranks hold different inputs: ranks 0, 2: x [12, 2, 16] float64; "
                    "rank 1: x [12, 2, 17] float64; every rank must hold its slice of the features"}
    assert_refused_alike(results, words)
    assert all(r["after"] == (S, B, H) for r in results)
