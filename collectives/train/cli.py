"""Train the MNIST net data-parallel, every gradient averaged by our collectives.

Examples::

    # 4 processes on this machine (gloo, CPU), MNIST from a read-only copy
    COLLECTIVES_DATA=../shared/data python -m collectives.train --world-size 4

    # the same under torchrun, on one node or on each of two
    torchrun --nproc_per_node 4 -m collectives.train
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 2 --master_addr HOST --master_port 29400 \
        -m collectives.train

    # 4 ranks on 4 lab hosts joined by 1 Gbit/s links (root; see collectives/tools/lab)
    python -m collectives.train --world-size 4 --lab hosts=4,rate=1gbit

    # continue after a crash, from the last checkpoint in --out
    python -m collectives.train --world-size 4 --resume

Rank 0 prints a progress bar and one line per epoch, and writes to ``--out``:
``metrics.json`` and ``metrics.csv`` (per epoch), ``curves.png`` (loss and
accuracy) and ``checkpoint.pt`` (model, optimizer, position, RNG states, the
run's arguments), each replaced atomically so a crash never leaves a torn file.
``train.lock`` holds ``--out`` for one training at a time. ``--resume``
refuses a checkpoint made with other arguments (``--epochs`` may be raised).
"""
import argparse
import math
import os
import socket
import sys

from .. import settings
from ..algorithms import ALGORITHMS
from ..tools import launch
from ..tools.lab import FLAG_HELP, lab_argument, parse_lab, unavailable_reason
from .checkpoint import check_resume
from .data import per_rank_batch
from .lock import acquire_lock, release_lock
from .loop import data_root, worker


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m collectives.train", description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4, help="processes to spawn (ignored under torchrun)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when every rank can have its own GPU, else gloo")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda if a GPU is visible, else cpu")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128, help="global batch, split across ranks")
    p.add_argument("--lr", type=float, default=0.1, help="peak learning rate (warmup, then cosine decay)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--algorithm", choices=ALGORITHMS["all_reduce"], default=None,
                   help="all_reduce algorithm for the gradients (default: chosen by size)")
    p.add_argument("--sync", choices=["naive", "bucketed"], default="bucketed",
                   help="naive: one all_reduce per parameter after backward; bucketed: DDP-style")
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--compression", choices=["fp16", "bf16", "powersgd"], default=None,
                   help="send the gradients compressed (bucketed sync only): fp16/bf16 halve the bytes, "
                        "powersgd sends rank-r factors with error feedback (default: full precision)")
    p.add_argument("--powersgd-rank", type=int, default=4, help="r of --compression powersgd")
    p.add_argument("--split", choices=["sampler", "partition"], default="sampler",
                   help="DistributedSampler (reshuffled per epoch) or the tutorial's DataPartitioner")
    p.add_argument("--data-dir", default=None, help="MNIST root (default: $COLLECTIVES_DATA or ./data)")
    p.add_argument("--out", default="runs/mnist", help="metrics, plot and checkpoint go here")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt if it exists")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also checkpoint every STEPS steps inside an epoch (0: at epoch ends only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--subset", type=int, default=None, help="use only the first N train and test examples")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in total")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads per rank (default: cores // ranks on this node, at least 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--transport", choices=["auto", "gloo", "shm"], default=None,
                   help="how ranks on one host exchange messages (sets COLLECTIVES_TRANSPORT; "
                        "default: its value, else auto: shared memory)")
    # Kept as its canonical text: the run's arguments go into checkpoints, readable without us.
    p.add_argument("--lab", type=lambda text: str(lab_argument(text)), default=None,
                   metavar="hosts=K,...", help=FLAG_HELP)
    return p.parse_args(argv)


def check_args(args):
    """Refuse, with one line naming it, an argument no run could use (before any rank starts:
    inside the ranks a batch of 0 or a bucket of 0 MB ended in tracebacks, ``--lr nan``
    trained to 7% and exited 0, and ``--subset 0`` trained on all 60,000 images).

    Raises:
        SetupError: the first such argument, its value, and what it must be.
    """
    def flag(name):
        return "--" + name.replace("_", "-")

    for name, least in [("batch_size", 1), ("epochs", 1), ("subset", 1), ("max_steps", 1),
                        ("checkpoint_every", 0), ("threads", 1)]:
        value = getattr(args, name)
        if value is not None and value < least:
            raise launch.SetupError(f"{flag(name)} must be at least {least}, got {value}")
    for name in ("lr", "momentum", "weight_decay"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            raise launch.SetupError(f"{flag(name)} must be a finite number >= 0, got {value}")
    if not (math.isfinite(args.bucket_cap_mb) and args.bucket_cap_mb > 0):
        raise launch.SetupError(f"--bucket-cap-mb must be a positive number, got {args.bucket_cap_mb}")


def main(argv=None):
    """``collectives-train`` / ``python -m collectives.train``: check, then start the ranks.

    Mistakes in the setup (arguments, port, GPUs, data, a second training on
    the same --out) stop here with one message before any rank starts. An error
    inside a rank is not caught: its traceback reaches stderr, and the exit
    code is non-zero, under torchrun too.
    """
    args = parse_args(argv)
    if args.transport is not None:
        # the ranks inherit this process's environment; the bits do not depend on it
        settings.set_transport(args.transport)
    try:
        check_args(args)
        if args.compression and args.sync != "bucketed":
            raise launch.SetupError(f"--compression {args.compression} needs --sync bucketed "
                                    f"(it compresses DataParallel's buckets)")
        if args.powersgd_rank < 1:
            raise launch.SetupError(f"--powersgd-rank must be at least 1, got {args.powersgd_rank}")
        finished = check_resume(args)
        if finished:
            if not launch.under_torchrun() or launch.place()[0] == 0:
                print(f"collectives.train: {finished}", flush=True)
            return
        if launch.under_torchrun():
            launch.run_job(worker, None, (args, True), lab=args.lab)
            return
        if args.world_size < 1:
            raise launch.SetupError(f"--world-size must be at least 1, got {args.world_size}")
        if os.environ.get("MASTER_PORT"):
            launch.check_port(os.environ.get("MASTER_ADDR") or "127.0.0.1",
                              launch.master_port(os.environ["MASTER_PORT"]))
        if args.lab is not None:
            try:
                parse_lab(args.lab).layout(args.world_size)
            except ValueError as exc:
                raise launch.SetupError(str(exc)) from None
            if unavailable_reason():
                raise launch.SetupError(f"--lab: {unavailable_reason()}")
        here = [{"host": socket.gethostname(), "gpus": launch.visible_gpus()}] * args.world_size
        launch.choose_backend(args.backend, args.device, here)
        try:
            per_rank_batch(args.batch_size, args.world_size)
        except ValueError as exc:
            raise launch.SetupError(str(exc)) from None
        lock = acquire_lock(args.out)
        try:
            data_root(args.data_dir, download=True)   # once, before the ranks start
            code = launch.run_job(worker, args.world_size, (args,), lab=args.lab)
        finally:
            release_lock(lock)
    except launch.SetupError as exc:
        sys.exit(f"collectives.train: {exc}")
    sys.exit(code)
