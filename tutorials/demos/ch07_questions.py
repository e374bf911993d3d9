"""Chapter 7: what DDP users ask: unused parameters, and mixed precision.

    python -m tutorials.demos.ch07_questions

1. A model with a branch forward does not use: torch's DDP raises at the next
   step unless ``find_unused_parameters=True``; ``collectives.DataParallel``
   sends zeros for the missing gradients.
2. Mixed precision: forward under ``torch.autocast`` in bfloat16 (runs on CPU),
   and float16 with a ``GradScaler``; the parameters, their gradients and the
   all_reduce stay float32, and the replicas stay identical.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import collectives

WORLD_SIZE = 2


class TwoHeads(nn.Module):
    """Two heads; forward uses only the first (as a model with an optional branch might)."""

    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def two_steps(model, rank):
    """Two forward/backward passes; what happened, as text."""
    for step in range(2):
        try:
            model(torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))).sum().backward()
        except RuntimeError as error:
            return f"step {step}: RuntimeError: {error}"
    return "two steps, no error"


def identical_on_all_ranks(model):
    """Whether every rank holds the same parameters (bitwise)."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], other) for other in everyone)


def train_mixed(wrapper, dtype, rank, steps=3):
    """``steps`` SGD steps with forward under autocast(dtype); a GradScaler for float16."""
    torch.manual_seed(0)
    model = wrapper(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # float16 has a narrow range: small gradients underflow to 0 unless the loss is scaled
    # up first. bfloat16 has float32's range and needs no scaler. On GPU: GradScaler("cuda").
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):          # device_type "cuda" on GPUs
            logits = model(x)                              # matmuls in dtype
            loss = nn.functional.cross_entropy(logits, y)  # autocast runs it in float32
        scaler.scale(loss).backward()                      # gradients: float32, like the parameters
        scaler.step(optimizer)                             # unscales; skips the step on inf/nan
        scaler.update()
    grads = {p.grad.dtype for p in model.parameters()}
    return logits.dtype, loss.dtype, grads, identical_on_all_ranks(model)


def demo(rank, world_size):
    torch.manual_seed(0)
    without = two_steps(DistributedDataParallel(TwoHeads()), rank)
    torch.manual_seed(0)
    found = two_steps(DistributedDataParallel(TwoHeads(), find_unused_parameters=True), rank)
    torch.manual_seed(0)
    ours = collectives.DataParallel(TwoHeads())
    result = two_steps(ours, rank)
    if rank == 0:
        print("1. DistributedDataParallel, a head forward does not use:")
        first, indices = without.split(". ")[0], without.split("\n")[-2]
        print(f"   {first}.")
        print(f"   ...{indices}")
        print(f"   with find_unused_parameters=True: {found}")
        print(f"   collectives.DataParallel: {result}; the unused head's .grad: "
              f"{ours.module.unused.weight.grad}")

    for dtype in (torch.bfloat16, torch.float16):
        for name, wrapper in (("DistributedDataParallel", DistributedDataParallel),
                              ("collectives.DataParallel", collectives.DataParallel)):
            logits, loss, grads, same = train_mixed(wrapper, dtype, rank)
            if rank == 0:
                scaler = " + GradScaler" if dtype == torch.float16 else ""
                print(f"2. autocast({str(dtype)[6:]}){scaler}, {name}: logits {str(logits)[6:]}, "
                      f"loss {str(loss)[6:]}, gradients {', '.join(str(d)[6:] for d in grads)}; "
                      f"replicas identical after 3 steps: {same}")


if __name__ == "__main__":
    from tutorials.demos.common import run
    run(demo, WORLD_SIZE)
