"""Wrong for N not a power of two: Rabenseifner's all-reduce without the fold.

Recursive halving, then recursive doubling. In each halving step a rank swaps half of the chunk
range it is still responsible for with rank ^ mask and adds the half it keeps; after log2 N steps
it owns one fully reduced chunk, and the doubling steps swap owned ranges back until every rank
holds every chunk. With N a power of two every rank has a partner in every step. With N = 3,
rank 2's partner would be rank 3, which does not exist: rank 2 skips the exchange, keeps its
own tensor and never hears of the others. Chapter 5 folds the extra ranks in first (the ranks
beyond the largest power of two hand their tensor to a partner, sit the exchanges out, and get
the result at the end).
"""
import torch
import torch.distributed as dist


def _exchange(send, recv, partner):
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, partner),
                                           dist.P2POp(dist.irecv, recv, partner)]):
        request.wait()


def all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.detach().flatten().clone()
    bounds = [c.numel() for c in torch.tensor_split(flat, n)]
    start = [sum(bounds[:i]) for i in range(n + 1)]     # chunk i is flat[start[i]:start[i + 1]]
    lo, hi, mask, steps = 0, n, n // 2, []
    while mask >= 1:                                    # recursive halving: reduce-scatter
        partner = rank ^ mask
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & mask == 0 else ((mid, hi), (lo, mid))
        if partner < n:                                 # no partner: skip the step (wrong)
            got = torch.empty_like(flat[start[keep[0]]:start[keep[1]]])
            _exchange(flat[start[give[0]]:start[give[1]]].clone(), got, partner)
            mine = flat[start[keep[0]]:start[keep[1]]]
            mine.copy_(mine + got if rank < partner else got + mine)
            steps.append((partner, keep, give))
            lo, hi = keep
        mask //= 2
    for partner, keep, give in reversed(steps):         # recursive doubling: all-gather
        got = torch.empty_like(flat[start[give[0]]:start[give[1]]])
        _exchange(flat[start[keep[0]]:start[keep[1]]].clone(), got, partner)
        flat[start[give[0]]:start[give[1]]] = got
    tensor.copy_(flat.view_as(tensor))
