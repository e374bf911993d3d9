"""Chapter 4: ring all-reduce by hand, twice, then counted.

    python -m tutorials.demos.ch04_ring

1. The textbook whole-tensor ring (the PyTorch tutorial's ``allreduce``).
2. The chunked ring: reduce-scatter, then all-gather, over N chunks.
3. The library's two rings with traffic counters: bytes each rank sends.
"""
import torch
import torch.distributed as dist

import collectives
from tutorials.demos.common import print_ranks, run

WORLD_SIZE = 4


def exchange(send, right, recv, left):
    """Post the send and its matching receive together, then wait for both (chapter 2)."""
    requests = [dist.isend(send, right), dist.irecv(recv, left)]
    for r in requests:
        r.wait()


def whole_tensor_ring(tensor):
    """Pass whole tensors around the ring N-1 times, adding each one as it arrives."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    outgoing, incoming = tensor.clone(), torch.empty_like(tensor)
    total = tensor.clone()
    for _ in range(n - 1):
        exchange(outgoing, right, incoming, left)
        total += incoming
        outgoing, incoming = incoming, outgoing   # forward what just arrived
    tensor.copy_(total)


def chunked_ring(tensor, log=None):
    """Reduce-scatter then all-gather, one chunk per rank, each chunk moving one hop per step."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    # tensor_split, not chunk: torch.chunk(torch.arange(6), 4) gives only 3 chunks.
    chunks = tensor.tensor_split(n)                # views: writing them writes tensor
    inbox = torch.empty_like(chunks[0])
    for step in range(n - 1):                      # reduce-scatter
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        got = inbox[:chunks[recv_i].numel()]
        exchange(chunks[send_i], right, got, left)
        chunks[recv_i].add_(got)
        if log is not None:
            log.append(send_i)
    # chunks[rank] is now the sum over all ranks; pass finished chunks around.
    for step in range(n - 1):                      # all-gather
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        exchange(chunks[send_i], right, chunks[recv_i], left)
        if log is not None:
            log.append(send_i)


def demo(rank, world_size):
    n = world_size
    # The exact sum is 2, but in float32 1e8 + 1 == 1e8: the order of the additions decides.
    values = [1e8, 1.0, -1e8, 1.0]
    x = torch.tensor([values[rank % 4]])

    if rank == 0:
        print("1. whole-tensor ring: each rank adds the others' tensors in its own order")
    t = x.clone()
    whole_tensor_ring(t)
    print_ranks(f"x = {x.item():g}, sum = {t.item():g}")

    if rank == 0:
        print("2. chunked ring on [x, x, x, x]: chunk (a-d) each rank sends per step, "
              "reduce-scatter | all-gather")
    t = x.repeat(n)
    log = []
    chunked_ring(t, log)
    names = ["abcd"[i] for i in log]
    print_ranks(f"{' '.join(names[:n - 1])} | {' '.join(names[n - 1:])}, result {t.tolist()}")
    reference = x.repeat(n)
    dist.all_reduce(reference)
    results = [None] * n
    dist.all_gather_object(results, (t, reference))
    if rank == 0:
        ours_agree = all(torch.equal(t, r[0]) for r in results)
        torch_agree = all(torch.equal(reference, r[1]) for r in results)
        print(f"   every rank holds the same bits: {ours_agree} "
              f"(torch.distributed: {reference.tolist()}, same on every rank: {torch_agree})")

    if rank == 0:
        print("3. bytes each rank sends for a tensor of S = 4096 float32 = 16384 bytes")
    size = 4096 * 4
    for algorithm, formula, expected in [("naive_ring", "(N-1) * S", (n - 1) * size),
                                         ("ring", "2(N-1)/N * S", 2 * (n - 1) * size // n)]:
        data = torch.full((4096,), float(rank))
        with collectives.count_traffic() as traffic:
            collectives.all_reduce(data, algorithm=algorithm)
        sent = [None] * n
        dist.all_gather_object(sent, (traffic.sent_bytes, traffic.sent_messages, traffic.rounds))
        if rank == 0:
            print(f"   {algorithm:10s}: sent bytes per rank {[s[0] for s in sent]}, "
                  f"messages {sent[0][1]}, steps {sent[0][2]}; {formula} = {expected}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
