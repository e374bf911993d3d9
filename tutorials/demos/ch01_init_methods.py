"""Chapter 1: the three ways processes find each other (init methods).

    python -m tutorials.demos.ch01_init_methods

The same two processes join a process group three times in a row, once per
init method, and check with an all_reduce that they are really connected.
"""
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world_size, ports, shared_file):
    torch.set_num_threads(1)
    methods = [
        # env://: rank 0's address and port come from the environment (what torchrun sets).
        ("env://", dict(init_method="env://")),
        # tcp://: the same rendezvous, the address written into the URL.
        ("tcp://127.0.0.1:<port>", dict(init_method=f"tcp://127.0.0.1:{ports[1]}")),
        # file://: a file every process can see (a shared filesystem); no port at all.
        ("file://<shared file>", dict(init_method=f"file://{shared_file}")),
    ]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(ports[0])
    for name, kwargs in methods:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, **kwargs)
        t = torch.tensor([rank + 1])
        dist.all_reduce(t)
        if rank == 0:
            print(f"{name:22s} rank {dist.get_rank()} of {dist.get_world_size()}, "
                  f"all_reduce(rank + 1) = {t.item()}")
        dist.destroy_process_group()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        # file:// needs a path that does not exist yet and is not reused afterwards.
        shared_file = os.path.join(tmp, "rendezvous")
        mp.spawn(worker, args=(WORLD_SIZE, [free_port(), free_port()], shared_file), nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
