"""README quickstart: our all_reduce and torch's, side by side, on 4 processes.

    python -m tutorials.demos.quickstart
"""
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import collectives


def worker(rank, world_size, port):
    torch.set_num_threads(1)  # one intra-op thread per process: N processes share the cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size)
    ours = torch.arange(4.0) + rank           # rank r holds [r, r+1, r+2, r+3]
    theirs = ours.clone()
    collectives.all_reduce(ours, algorithm="ring")   # built from send/recv
    dist.all_reduce(theirs)                          # the built-in
    if rank == 0:
        print(f"collectives.all_reduce: {ours.tolist()}")
        print(f"dist.all_reduce:        {theirs.tolist()}")
        print(f"equal on rank 0: {torch.equal(ours, theirs)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:  # a free port, never a hard-coded 29500
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(4, port), nprocs=4)
