"""Train the MNIST net data-parallel, every gradient averaged by our collectives.

Examples::

    # 4 processes on this machine (gloo, CPU), MNIST from a read-only copy
    COLLECTIVES_DATA=../shared/data python -m collectives.train --world-size 4

    # the same under torchrun, on one node or on each of two
    torchrun --nproc_per_node 4 -m collectives.train
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 2 --master_addr HOST --master_port 29400 \
        -m collectives.train

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
import contextlib
import csv
import itertools
import json
import math
import os
import random
import re
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import api, launch
from .algorithms import ALGORITHMS
from .data import load_mnist, per_rank_batch, prepare_mnist, train_loader
from .data_parallel import DataParallel
from .data_parallel_naive import NaiveDataParallel
from .models import Net


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
    return p.parse_args(argv)


def learning_rate(args, step, total_steps):
    """Linear warmup over the first 3% of steps, then cosine decay to zero: a pure function of step."""
    warmup = max(1, int(0.03 * total_steps))
    if step < warmup:
        return args.lr * (step + 1) / warmup
    return args.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))


TMP = re.compile(r"\..+\.tmp\.\d+")   # what save_atomic writes before the rename


def save_atomic(write, path):
    """Write ``path`` through ``write(tmp_path)`` then rename: readers see the old file or the new one.

    A process killed mid-write leaves its hidden ``.NAME.tmp.PID`` behind;
    :func:`remove_partial_writes` clears those at the next start.
    """
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.tmp.{os.getpid()}")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_partial_writes(out):
    """Delete what writers killed mid-write left in ``out`` (call with the lock held: no writer is live)."""
    for name in os.listdir(out) if os.path.isdir(out) else []:
        if TMP.fullmatch(name):
            os.remove(os.path.join(out, name))


def save_checkpoint(state, path):
    save_atomic(lambda tmp: torch.save(state, tmp), path)


def load_checkpoint(path):
    """The checkpoint, on the CPU: RNG states must be CPU ByteTensors, and the model and
    optimizer copy their tensors to their own device when they load them."""
    return torch.load(path, map_location="cpu", weights_only=False)


# --- resuming ---------------------------------------------------------------------------------

# What a resumed run must share with the checkpoint's: everything that changes the numbers.
# Where and how it runs (world size, backend, device, paths, threads, progress bar) may change,
# and --epochs / --max-steps may be raised to train further.
MUST_MATCH = ("batch_size", "lr", "momentum", "weight_decay", "algorithm", "sync", "bucket_cap_mb",
              "split", "seed", "subset")
MAY_RAISE = ("epochs", "max_steps")


def resume_differences(saved, args):
    """The arguments in which ``args`` differs from the checkpoint's ``saved`` ones, as lines."""
    now = vars(args)
    lines = [f"--{k.replace('_', '-')}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now"
             for k in MUST_MATCH if saved.get(k) != now[k]]
    for k in MAY_RAISE:
        old, new = saved.get(k), now[k]
        lowered = new is not None and (old is None or new < old)
        if lowered:
            lines.append(f"--{k.replace('_', '-')}: {old!r} in the checkpoint, {new!r} now "
                         f"(it may be raised, not lowered)")
    return lines


def check_resume(args):
    """Before any rank starts: refuse a resume with other arguments; None, or the reason to stop.

    Returns:
        str or None: a message when the run already finished (nothing to do).

    Raises:
        launch.SetupError: the checkpoint was made with different arguments; the message names each.
    """
    path = os.path.join(args.out, "checkpoint.pt")
    if not (args.resume and os.path.exists(path)):
        return None
    ckpt = load_checkpoint(path)
    saved = ckpt.get("args") or {}
    diffs = resume_differences(saved, args)
    if diffs:
        raise launch.SetupError(
            f"--resume refused: {path} was written by a run with other arguments:\n  "
            + "\n  ".join(diffs) + "\nResume with the checkpoint's arguments, or give a new --out.")
    steps = ckpt.get("global_step", 0)
    if ckpt["epoch"] >= args.epochs or (args.max_steps and steps >= args.max_steps):
        last = ckpt["history"][-1] if ckpt["history"] else {}
        acc = f", test accuracy {100 * last['test_accuracy']:.2f}%" if last else ""
        return (f"the run in {args.out} already finished ({ckpt['epoch']} of {args.epochs} epochs, "
                f"{steps} steps{acc}); nothing to do. Raise --epochs to train further, "
                f"or give a new --out.")
    return None


def resume(args, rank, world, device):
    """Load ``OUT/checkpoint.pt`` for this rank and restore its RNG states; None when starting fresh.

    ``device`` is where the rank trains; the checkpoint is read onto the CPU
    whatever it is, because ``torch.set_rng_state`` takes only a CPU
    ByteTensor (mapping the checkpoint onto a GPU failed with "RNG state must
    be a torch.ByteTensor"). The model and optimizer copy their tensors to
    ``device`` when they load them.
    """
    path = os.path.join(args.out, "checkpoint.pt")
    if not (args.resume and os.path.exists(path)):
        return None
    ckpt = load_checkpoint(path)
    if len(ckpt["rng"]) == world:
        torch.set_rng_state(ckpt["rng"][rank].cpu())
    random.setstate(ckpt["python_rng"])
    return ckpt


# --- one training per --out -------------------------------------------------------------------

def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(out):
    """Make this process the only training writing to ``out``; return the lock's path.

    The lock file holds the owner's pid and host. A lock whose owner is dead
    (same host, no such pid) is stale and taken over.

    Raises:
        launch.SetupError: another live training holds ``out``; the message names it.
    """
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "train.lock")
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = json.load(f)
            except (OSError, ValueError):
                owner = {}
            if owner.get("host") != mine["host"] or _alive(owner.get("pid", -1)):
                raise launch.SetupError(
                    f"{out} is in use by another training (pid {owner.get('pid')} on "
                    f"{owner.get('host')}: {owner.get('command', '?')}). Give another --out, or wait "
                    f"for it; if no such training runs, delete {path}.") from None
            print(f"collectives.train: taking over a stale lock in {out} (pid {owner.get('pid')} "
                  f"is no longer running)", flush=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
        remove_partial_writes(out)
        return path
    raise launch.SetupError(f"could not take the lock {path}; is another training starting?")


def release_lock(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _gather_rng(rank, world, device):
    """Every rank's torch RNG state, collected on rank 0 (None elsewhere)."""
    mine = torch.get_rng_state().to(device)
    states = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
    api.gather(mine, states, dst=0)
    return [s.cpu() for s in states] if rank == 0 else None


@torch.no_grad()
def evaluate(model, test_set, rank, world, device, batch=1000):
    """Loss and accuracy on the whole test set; each rank scores every world-th example."""
    model.eval()
    x, y = test_set.tensors[0][rank::world], test_set.tensors[1][rank::world]
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for i in range(0, len(y), batch):
        xb, yb = x[i:i + batch].to(device), y[i:i + batch].to(device)
        out = model.module(xb)
        sums[0] += F.cross_entropy(out, yb, reduction="sum").double()
        sums[1] += (out.argmax(1) == yb).sum().double()
        sums[2] += len(yb)
    api.all_reduce(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def write_outputs(out, history):
    """metrics.json, metrics.csv and curves.png from the per-epoch records."""
    save_atomic(lambda tmp: json.dump(history, open(tmp, "w"), indent=1), os.path.join(out, "metrics.json"))

    def write_csv(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(history[0]))
            w.writeheader()
            w.writerows(history)
    save_atomic(write_csv, os.path.join(out, "metrics.csv"))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    a.plot(epochs, [h["test_loss"] for h in history], "o-", label="test")
    a.set_xlabel("epoch"), a.set_ylabel("cross-entropy loss"), a.legend()
    b.plot(epochs, [100 * h["test_accuracy"] for h in history], "o-")
    b.set_xlabel("epoch"), b.set_ylabel("test accuracy (%)")
    fig.suptitle(f"MNIST, {history[-1]['world_size']} ranks")
    fig.tight_layout()
    save_atomic(lambda tmp: fig.savefig(tmp, format="png", dpi=100), os.path.join(out, "curves.png"))
    plt.close(fig)


def worker(args, lock_out=False):
    """One rank of the job. Its place in the job comes from the environment (see launch.py).

    ``lock_out``: take ``--out``'s lock on rank 0 (under torchrun; otherwise main() holds it).
    """
    rank, _, world, local_world = launch.place()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_world))
    torch.use_deterministic_algorithms(True, warn_only=True)
    lock = acquire_lock(args.out) if lock_out and rank == 0 else None
    try:
        backend, device, why = launch.init_process_group(args.backend, args.device)
        if rank == 0 and args.backend == "auto":
            print(f"collectives.train: {why}", flush=True)
        try:
            train(args, rank, world, device, backend)
        finally:
            dist.destroy_process_group()
    finally:
        if lock:
            release_lock(lock)


def train(args, rank, world, device, backend):
    started = time.perf_counter()
    # Only rank 0 may download or unpack (without torchrun, main() did it before starting the
    # ranks); the others read once it is done.
    root = data_root(args.data_dir, download=True) if rank == 0 else None
    api.barrier()
    if rank != 0:
        root = data_root(args.data_dir, download=False)
    train_set = load_mnist(root, train=True, subset=args.subset)
    test_set = load_mnist(root, train=False, subset=args.subset)
    loader = train_loader(train_set, args.batch_size, rank, world, seed=args.seed, how=args.split)
    steps_per_epoch = len(loader)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    model = Net().to(device)
    ckpt_path = os.path.join(args.out, "checkpoint.pt")
    ckpt = resume(args, rank, world, device)
    if ckpt:
        model.load_state_dict(ckpt["model"])
    if args.sync == "naive":
        model = NaiveDataParallel(model, algorithm=args.algorithm)
    else:
        model = DataParallel(model, bucket_cap_mb=args.bucket_cap_mb, algorithm=args.algorithm)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    epoch, start, history = 0, 0, []
    if ckpt:
        opt.load_state_dict(ckpt["optimizer"])
        epoch, start, history = ckpt["epoch"], ckpt["step"], ckpt["history"]
        if ckpt["world_size"] != world and start:
            # Another world size splits the epoch differently: redo this epoch from its start.
            if rank == 0:
                print(f"checkpoint from {ckpt['world_size']} ranks, now {world}: "
                      f"restarting epoch {epoch + 1}", flush=True)
            start = 0
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        where = f"resuming at epoch {epoch + 1}, step {start}" if ckpt else "starting"
        print(f"collectives.train: {where}; {world} ranks, backend {backend}, device {device.type}, "
              f"{args.sync} sync, global batch {args.batch_size} "
              f"({per_rank_batch(args.batch_size, world)} per rank), {steps_per_epoch} steps per epoch",
              flush=True)

    def checkpoint(epoch, step, global_step):
        rng = _gather_rng(rank, world, device)
        if rank == 0:
            save_checkpoint({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                             "epoch": epoch, "step": step, "global_step": global_step, "rng": rng,
                             "python_rng": random.getstate(), "history": history, "world_size": world,
                             "args": vars(args)}, ckpt_path)

    step = epoch * steps_per_epoch + start
    while epoch < args.epochs and step < total_steps:
        t0 = time.perf_counter()
        if args.split == "sampler":
            loader.sampler.set_epoch(epoch)
        n_run = min(steps_per_epoch, total_steps - epoch * steps_per_epoch) - start
        batches = itertools.islice(loader, start, start + n_run)
        if rank == 0 and not args.no_progress:
            from tqdm import tqdm
            batches = tqdm(batches, total=n_run, desc=f"epoch {epoch + 1}/{args.epochs}",
                           leave=False, file=sys.stdout, dynamic_ncols=True)
        sums = torch.zeros(2, dtype=torch.float64, device=device)
        for x, y in batches:
            for group in opt.param_groups:
                group["lr"] = learning_rate(args, step, total_steps)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sums[0] += loss.detach().double() * len(y)
            sums[1] += len(y)
            step += 1
            start += 1
            if args.checkpoint_every and step % args.checkpoint_every == 0 and start < steps_per_epoch:
                checkpoint(epoch, start, step)
        api.all_reduce(sums)
        test_loss, test_acc = evaluate(model, test_set, rank, world, device)
        finished = start >= steps_per_epoch
        record = {"epoch": epoch + 1, "steps": step, "train_loss": (sums[0] / sums[1]).item(),
                  "test_loss": test_loss, "test_accuracy": test_acc,
                  "epoch_seconds": round(time.perf_counter() - t0, 2), "world_size": world}
        history.append(record)
        if finished:
            epoch, start = epoch + 1, 0
        checkpoint(epoch, start, step)
        if rank == 0:
            write_outputs(args.out, history)
            print(f"epoch {record['epoch']}/{args.epochs}: train loss {record['train_loss']:.4f}, "
                  f"test loss {test_loss:.4f}, test accuracy {100 * test_acc:.2f}% "
                  f"({record['epoch_seconds']:.1f} s)", flush=True)
    if rank == 0 and history:
        print(f"done: test accuracy {100 * history[-1]['test_accuracy']:.2f}% after {step} steps, "
              f"{time.perf_counter() - started:.0f} s; outputs in {args.out}", flush=True)


def data_root(data_dir, download):
    """prepare_mnist, its failure said in a few lines (SetupError) rather than a traceback."""
    try:
        return prepare_mnist(data_dir, download=download)
    except FileNotFoundError as exc:
        raise launch.SetupError(str(exc)) from None


def main(argv=None):
    """``collectives-train`` / ``python -m collectives.train``: check, then start the ranks.

    Mistakes in the setup (arguments, port, GPUs, data, a second training on
    the same --out) stop here with one message before any rank starts. An error
    inside a rank is not caught: its traceback reaches stderr, and the exit
    code is non-zero, under torchrun too.
    """
    args = parse_args(argv)
    try:
        finished = check_resume(args)
        if finished:
            if not launch.under_torchrun() or launch.place()[0] == 0:
                print(f"collectives.train: {finished}", flush=True)
            return
        if launch.under_torchrun():
            launch.launch(worker, None, (args, True))
            return
        if args.world_size < 1:
            raise launch.SetupError(f"--world-size must be at least 1, got {args.world_size}")
        if os.environ.get("MASTER_PORT"):
            launch.check_port(os.environ.get("MASTER_ADDR") or "127.0.0.1",
                              launch.master_port(os.environ["MASTER_PORT"]))
        here = [{"host": socket.gethostname(), "gpus": launch.visible_gpus()}] * args.world_size
        launch.choose_backend(args.backend, args.device, here)
        try:
            per_rank_batch(args.batch_size, args.world_size)
        except ValueError as exc:
            raise launch.SetupError(str(exc)) from None
        lock = acquire_lock(args.out)
        try:
            data_root(args.data_dir, download=True)   # once, before the ranks start
            code = launch.launch(worker, args.world_size, (args,))
        finally:
            release_lock(lock)
    except launch.SetupError as exc:
        sys.exit(f"collectives.train: {exc}")
    sys.exit(code)


if __name__ == "__main__":
    main()
