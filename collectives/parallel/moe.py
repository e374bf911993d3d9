"""Expert parallelism: a mixture-of-experts layer with one expert per rank, on our all_to_all.

What it teaches. A mixture-of-experts (MoE) layer replaces one MLP with E of
them, the *experts*, and a small *router* that sends each token to its k best
experts (top-1: Switch Transformer; top-2: GShard, Mixtral). Each token pays for
k MLPs while the layer holds E of them. Expert parallelism puts expert r on
rank r; the tokens, which start on the rank that holds their sequence, must
travel to their experts and back:

1. **route**: ``probs = softmax(router(x))``, ``gate, expert = topk(probs, k)``
   (top-2 gates renormalised to sum to 1); sort the token copies by expert, stably;
2. **count**: ``send[j]`` copies go to rank j; an ``all_to_all_single`` of the N
   counts tells every rank how many rows each other rank will send it (``recv``);
3. **dispatch**: ``all_to_all_single`` with ``input_split_sizes=send`` and
   ``output_split_sizes=recv``, uneven: whatever the router decided;
4. **expert**: rank r runs expert r on every token it received, in one batch;
5. **combine**: the reverse ``all_to_all_single`` (the splits swapped) brings
   each result home; unsort, weigh by the gate, add up the k copies.

Backward is the same two all_to_alls run the other way (an all_to_all's
gradient is the all_to_all with the splits swapped; the dispatch's only when the
tokens need a gradient, as they do inside a network). The router is replicated,
like a data-parallel parameter: its gradient is summed over the group
(:func:`reduce_router_grads`). There is no capacity limit here (no token is
dropped), so the load is as uneven as the router makes it: the busiest rank
sets the step time, which is what load-balancing losses and capacity factors,
not built here, fight.

Bytes rank r sends per step (forward and backward), H hidden values of e bytes:
``8(N-1)`` for the counts, ``2 H e (sum_{j!=r} send[j] + sum_{j!=r} recv[j])``
for the tokens (the dispatch sends the rows out forward and the rows in
backward, the combine the reverse; when the tokens need no gradient the
dispatch's backward does not run, leaving ``H e (2 sum send + sum recv)``, not
half), and the router's all_reduce. Chapter 19 derives it; the test counts it.

Reference: W. Fedus, B. Zoph, N. Shazeer, "Switch Transformers", 2021;
D. Lepikhin et al., "GShard", 2020.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import api, tensor_api

ALL_TO_ALL = "pairwise"   # one message to each other rank with rows for it: the chapter's count


def expert_mlp(hidden, ffn, dtype=None):
    return nn.Sequential(nn.Linear(hidden, ffn, dtype=dtype), nn.GELU(), nn.Linear(ffn, hidden, dtype=dtype))


def route(router, x, top_k):
    """(gates, experts), each (T, k): the k largest router probabilities of each token and their experts."""
    probs = F.softmax(router(x), dim=-1)
    gates, experts = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates, experts


class _AllToAll(torch.autograd.Function):
    """Rows to other ranks by ``send`` counts, rows back by ``recv``; backward swaps them."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        tensor_api.all_to_all_single(out, x.contiguous(), recv, send, group=group, algorithm=ALL_TO_ALL)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def exchange_counts(send, group=None):
    """How many rows each rank will send this one: an all_to_all of the N counts (8 bytes each)."""
    recv = torch.empty_like(send)
    tensor_api.all_to_all_single(recv, send, group=group, algorithm=ALL_TO_ALL)
    return recv


class MoE(nn.Module):
    """Top-k mixture of experts, expert r on rank r of ``group``; tokens stay where they started.

    Args:
        hidden, ffn (int): Each expert is ``Linear(hidden, ffn), GELU, Linear(ffn, hidden)``.
        top_k (int): 1 or 2 experts per token.
        group (ProcessGroup, optional): The expert-parallel group: N ranks, N experts.

    ``forward(x)`` takes this rank's tokens ``(T, hidden)`` (T may differ between ranks,
    and be 0) and returns their outputs; ``last_counts`` is then ``(send, recv)``, the rows
    this rank sent to and received from each rank.

    Example::

        >>> moe = MoE.from_experts(router, experts, top_k=2, group=ep)  # router: Linear(H, N)
        >>> y = moe(x)                      # x: this rank's tokens
        >>> loss(y).backward(); reduce_router_grads(moe, ep); opt.step()
    """

    def __init__(self, hidden, ffn, top_k=1, group=None, dtype=None):
        super().__init__()
        if top_k not in (1, 2):
            raise ValueError(f"MoE: top_k must be 1 or 2, got {top_k}")
        n = dist.get_world_size(group)
        if top_k > n:
            raise ValueError(f"MoE: top_k={top_k} needs at least {top_k} experts (ranks), the group has {n}")
        self.group, self.top_k, self.size = group, top_k, n
        self.router = nn.Linear(hidden, n, bias=False, dtype=dtype)
        self.expert = expert_mlp(hidden, ffn, dtype)
        self.last_counts = None

    @classmethod
    def from_experts(cls, router, experts, top_k=1, group=None):
        """This rank's part of a whole layer: the router (copied) and ``experts[rank]``."""
        n, r = dist.get_world_size(group), dist.get_rank(group)
        if len(experts) != n or router.out_features != n:
            raise ValueError(f"MoE: {len(experts)} experts and a router to {router.out_features} for a "
                             f"group of {n} ranks: one expert per rank")
        first = experts[r][0]
        self = cls(first.in_features, first.out_features, top_k, group, first.weight.dtype)
        self.router.load_state_dict(router.state_dict())
        self.expert.load_state_dict(experts[r].state_dict())
        return self

    def forward(self, x):
        if x.dim() != 2:
            raise ValueError(f"MoE: x must be this rank's tokens, (T, hidden), got shape {list(x.shape)}")
        gates, experts = route(self.router, x, self.top_k)
        flat = experts.flatten()                              # T*k token copies, token-major
        order = flat.argsort(stable=True)                     # grouped by expert, in token order
        send = torch.bincount(flat, minlength=self.size)
        recv = exchange_counts(send, self.group)
        send, recv = send.tolist(), recv.tolist()
        self.last_counts = (send, recv)
        arrived = _AllToAll.apply(x[order // self.top_k], send, recv, self.group)    # dispatch
        done = _AllToAll.apply(self.expert(arrived), recv, send, self.group)         # combine
        copies = done[order.argsort()].view(x.shape[0], self.top_k, x.shape[1])     # back in token order
        return (copies * gates.unsqueeze(-1)).sum(1)


def reduce_router_grads(moe, group=None):
    """Sum the replicated router's gradient over the group (every rank routed its own tokens)."""
    grad = moe.router.weight.grad
    api.all_reduce(grad, group=group, algorithm="ring")


def dense_moe(x, router, experts, top_k=1):
    """The same layer in one process, every expert here: the reference the tests compare with."""
    gates, chosen = route(router, x, top_k)
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        if len(token):
            y = y.index_add(0, token, expert(x[token]) * gates[token, slot].unsqueeze(-1))
    return y
