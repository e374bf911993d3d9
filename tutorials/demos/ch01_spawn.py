"""Chapter 1: one process per rank, started by ``torch.multiprocessing.spawn``.

One machine (a "node") with two processes::

    python -m tutorials.demos.ch01_spawn

Two nodes with two processes each; here both "nodes" are this machine, so run
the two commands in two terminals (on real nodes, point --master-addr at node 0)::

    python -m tutorials.demos.ch01_spawn --nnodes 2 --node-rank 0 --master-port 29400
    python -m tutorials.demos.ch01_spawn --nnodes 2 --node-rank 1 --master-port 29400
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(local_rank, args):
    # mp.spawn passes the process index first: that is the rank *on this node*.
    torch.set_num_threads(1)
    rank = args.node_rank * args.nproc_per_node + local_rank
    world_size = args.nnodes * args.nproc_per_node
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.master_port)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)

    # One GPU per process, chosen by the local rank (chapter 9); the CPU here.
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")

    me = {"rank": rank, "local_rank": local_rank, "node_rank": args.node_rank}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, me)
    total = torch.tensor([rank], device=device)
    dist.all_reduce(total)
    if rank == 0:
        print(f"world_size={world_size} = nnodes {args.nnodes} x nproc_per_node {args.nproc_per_node}")
        for p in everyone:
            print(f"rank {p['rank']}: node_rank {p['node_rank']}, local_rank {p['local_rank']}")
        print(f"all_reduce of the ranks: {total.item()} (= 0 + 1 + ... + {world_size - 1})")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=None,
                        help="port of rank 0's rendezvous; required with --nnodes > 1")
    args = parser.parse_args()
    if args.master_port is None:
        if args.nnodes > 1:
            parser.error("--master-port is required with --nnodes > 1 (every node must agree on it)")
        args.master_port = free_port()
    mp.spawn(worker, args=(args,), nprocs=args.nproc_per_node)


if __name__ == "__main__":
    main()
