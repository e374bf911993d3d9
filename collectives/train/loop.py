"""One rank of the MNIST job: data, model, data-parallel wrapper, the training loop, evaluation."""
import itertools
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import api, settings
from ..parallel.compression import PowerSGD, make as make_compression
from ..parallel.data_parallel import DataParallel
from ..parallel.data_parallel_naive import NaiveDataParallel
from ..tools import launch
from ..tools.launch import SetupError
from .checkpoint import resume, save_checkpoint
from .curves import write_outputs
from .data import DamagedFile, load_mnist, per_rank_batch, prepare_mnist, train_loader
from .lock import acquire_lock, release_lock
from .models import Net
from .schedule import learning_rate


def _gather_rng(rank, world, device):
    """Every rank's torch RNG state, collected on rank 0 (None elsewhere)."""
    mine = torch.get_rng_state().to(device)
    states = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
    api.gather(mine, states, dst=0)
    return [s.cpu() for s in states] if rank == 0 else None


def _gather_powersgd(compression, module, rank, world, device):
    """PowerSGD's state for the checkpoint, on rank 0 (None elsewhere): every rank's own
    error feedback (they differ) and the Qs (the same on every rank: rank 0's)."""
    names = {id(p): name for name, p in module.named_parameters()}
    state = compression.state_dict(names)
    order = sorted(state["errors"])      # the same names and shapes on every rank: same model, same steps
    mine = torch.cat([state["errors"][n].reshape(-1) for n in order]) if order else torch.zeros(0)
    mine = mine.to(device)
    every = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
    api.gather(mine, every, dst=0)
    if rank != 0:
        return None
    errors = []
    for flat in every:
        pieces = flat.cpu().split([state["errors"][n].numel() for n in order])
        errors.append({n: piece.view_as(state["errors"][n]) for n, piece in zip(order, pieces)})
    return {"errors": errors, "qs": {n: q.cpu() for n, q in state["qs"].items()}}


def _restore_powersgd(compression, saved, module, rank, world, device):
    """Load a checkpoint's PowerSGD state; another world size keeps the Qs, not the errors
    (each rank's error belongs to its own share of the batch)."""
    keys = {name: id(p) for name, p in module.named_parameters()}
    errors = saved["errors"][rank] if len(saved["errors"]) == world else {}
    compression.load_state_dict({"errors": {n: v.to(device) for n, v in errors.items()},
                                 "qs": {n: v.to(device) for n, v in saved["qs"].items()}}, keys)


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


def worker(args, lock_out=False):
    """One rank of the job. Its place in the job comes from the environment (see launch.py).

    ``lock_out``: take ``--out``'s lock on rank 0 (under torchrun; otherwise main() holds it).
    """
    rank, _, world, local_world = launch.place()
    if settings.lab_layout():   # lab hosts are namespaces of this one machine: they share its cores
        local_world = world
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
        compression = make_compression(args.compression, getattr(args, "powersgd_rank", 4))
        model = DataParallel(model, bucket_cap_mb=args.bucket_cap_mb, algorithm=args.algorithm,
                             compression=None if args.compression is None else compression)
        if ckpt and ckpt.get("powersgd") is not None and isinstance(compression, PowerSGD):
            _restore_powersgd(compression, ckpt["powersgd"], model.module, rank, world, device)
    powersgd = getattr(model, "compression", None)
    powersgd = powersgd if isinstance(powersgd, PowerSGD) else None
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
              f"{args.sync} sync{', ' + args.compression + ' gradients' if getattr(args, 'compression', None) else ''}, "
              f"global batch {args.batch_size} "
              f"({per_rank_batch(args.batch_size, world)} per rank), {steps_per_epoch} steps per epoch",
              flush=True)

    def checkpoint(epoch, step, global_step):
        rng = _gather_rng(rank, world, device)
        compressor = _gather_powersgd(powersgd, model.module, rank, world, device) if powersgd else None
        if rank == 0:
            save_checkpoint({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                             "epoch": epoch, "step": step, "global_step": global_step, "rng": rng,
                             "python_rng": random.getstate(), "history": history, "world_size": world,
                             "args": vars(args), "powersgd": compressor}, ckpt_path)

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
    except (FileNotFoundError, DamagedFile) as exc:
        raise SetupError(str(exc)) from None
