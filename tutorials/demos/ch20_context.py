"""Chapter 20: context parallelism, ring attention over the ranks.

    python -m tutorials.demos.ch20_context

1. Attention over a sequence split in 4 chunks, one per rank, keys and values passed on the
   ring: the output and the gradients of q, k, v equal one process's on the whole sequence.
2. The bytes each rank sends for one forward and backward pass, counted, against the formula.
3. Rank 0's messages, traced: each ring pass is one call through the library's door.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

import collectives
from collectives.parallel.ring_attention import ring_attention
from tutorials.demos.common import run

WORLD_SIZE = 4
B, HEADS, S, D = 2, 4, 64, 16                 # batch, heads, sequence, head_dim
E = 8                                         # float64


def whole_sequence(seed):
    g = torch.Generator().manual_seed(seed)   # the same on every rank: each cuts its chunk
    return [torch.randn(B, HEADS, S, D, generator=g, dtype=torch.float64) for _ in range(4)]   # q, k, v, dout


def demo(rank, world_size):
    n = world_size
    if rank == 0:
        print(f"1. attention, B={B}, {HEADS} heads, S={S} in {n} chunks of {S // n}, head_dim={D}, float64")
    for causal in (True, False):
        q, k, v, dout = whole_sequence(int(causal))
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        F.scaled_dot_product_attention(*whole, is_causal=causal).backward(dout)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal).chunk(n, dim=2)[rank]
        mine = [t.chunk(n, dim=2)[rank].clone().requires_grad_() for t in (q, k, v)]
        with collectives.count_traffic() as traffic, collectives.trace() as trace:
            out = ring_attention(*mine, causal=causal)
            out.backward(dout.chunk(n, dim=2)[rank])
        diff = max([(out - expected).abs().max().item()] +
                   [(m.grad - w.grad.chunk(n, dim=2)[rank]).abs().max().item() for m, w in zip(mine, whole)])
        rows = [None] * n
        dist.all_gather_object(rows, (diff < 1e-12, traffic.sent_bytes, traffic.sent_messages))
        if rank == 0:
            print(f"   causal={causal}: output and dq, dk, dv equal one process's (within 1e-12) on "
                  f"ranks 0-{n - 1}: {[ok for ok, _, _ in rows]}")
    c = B * HEADS * (S // n) * D * E
    if rank == 0:
        print(f"2. bytes each rank sends, one forward and backward, c = one K chunk = {c} bytes")
        print(f"   counted: {[b for _, b, _ in rows]} in {rows[0][2]} messages")
        print(f"   forward (N-1) x 2c + backward (N-1) x 4c + 2c = {(n - 1) * 2 * c + (n - 1) * 4 * c + 2 * c} "
              f"in (N-1) + N = {2 * n - 1} messages,")
        print(f"   + the shape check, (N-1) x 256 = {(n - 1) * 256} in N-1 = {n - 1} messages (an all_gather)")
        print("3. rank 0's sends, from collectives.trace(): call, step, to rank, bytes")
        for m in trace.messages:
            if m.kind == "send":
                print(f"   {m.collective:24s} step {m.step}  -> {m.dst}  {m.nbytes:6d}")
        print(f"   scores held at once: {S // n} x {S // n} per head, where one process holds {S} x {S}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
