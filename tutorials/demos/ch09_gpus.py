"""Chapter 9: the same collectives on GPUs, with NCCL.

    python -m tutorials.demos.ch09_gpus

Every rank runs an all_reduce with gloo on CPU tensors. Where each rank has a
GPU of its own, it also builds an NCCL group and runs the same all_reduce on
CUDA tensors, ours and the built-in, and takes one DDP step with
``device_ids=[local_rank]``; without GPUs that part says so and skips.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import collectives
from tutorials.demos.common import print_ranks, run

WORLD_SIZE = 2


def compare(tensor, group, algorithm):
    """all_reduce with ours and with torch's on copies of ``tensor``; both results."""
    ours, theirs = tensor.clone(), tensor.clone()
    collectives.all_reduce(ours, group=group, algorithm=algorithm)
    dist.all_reduce(theirs, group=group)
    return ours, theirs


def demo(rank, world_size):
    # mp.spawn, torchrun and our launcher all run one node here: local rank == rank.
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    x = torch.arange(4, dtype=torch.float32) + 10 * rank

    ours, theirs = compare(x, None, "ring")
    if rank == 0:
        print(f"gloo, CPU tensors: ours {ours.tolist()}, torch {theirs.tolist()}, "
              f"equal: {torch.equal(ours, theirs)}")
        print(f"mpi backend in this torch build: {dist.is_mpi_available()}")

    # Every rank must take part in new_group, so all ranks decide the same way.
    have_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
    if not have_gpus:
        if rank == 0:
            print(f"nccl: skipped, this machine has {torch.cuda.device_count()} CUDA device(s) "
                  f"for {world_size} ranks")
        return
    # One GPU per process, picked by the local rank; set it before any NCCL call.
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    nccl = dist.new_group(backend="nccl")
    ours, theirs = compare(x.to(device), nccl, "ring")
    print_ranks(f"nccl on {ours.device}: ours {ours.tolist()}, torch {theirs.tolist()}, "
                f"equal: {torch.equal(ours, theirs)}")
    # DDP on GPUs: the model on this process's GPU, device_ids naming that one GPU.
    model = DistributedDataParallel(torch.nn.Linear(4, 2).to(device), device_ids=[local_rank],
                                    output_device=local_rank, process_group=nccl)
    model(torch.randn(8, 4, device=device)).sum().backward()
    print_ranks(f"DDP step on {next(model.parameters()).device}, gradient on "
                f"{model.module.weight.grad.device}")
    dist.destroy_process_group(nccl)


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
