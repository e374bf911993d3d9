"""Checkpoints written atomically, and the resume policy (what a resumed run must share)."""
import contextlib
import errno
import os
import random
import re

import torch

from ..tools.launch import SetupError


TMP = re.compile(r"\..+\.tmp\.\d+")   # what save_atomic writes before the rename


def cannot_write(path, exc):
    """A :class:`SetupError` saying why ``path`` cannot be written (``exc``: the OSError)."""
    why = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
           errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
           errno.EPERM: "permission denied"}.get(exc.errno, exc.strerror or str(exc))
    return SetupError(f"cannot write {path}: {why} ({exc.strerror or exc}). Free space or give "
                      f"another --out.")


def _nearly_full(folder):
    """True when the file system of ``folder`` has less than 1 MiB left to this process."""
    try:
        st = os.statvfs(folder or ".")
    except OSError:
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail     # root may use the reserved blocks
    return free * st.f_frsize < 2 ** 20


def save_atomic(write, path):
    """Write ``path`` through ``write(tmp_path)`` then rename: readers see the old file or the new one.

    A process killed mid-write leaves its hidden ``.NAME.tmp.PID`` behind;
    :func:`remove_partial_writes` clears those at the next start. A write that fails (a full
    disk, a read-only folder) removes its temporary file and raises :class:`SetupError` saying why.
    """
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.tmp.{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise cannot_write(path, exc) from None
    except RuntimeError as exc:
        # torch.save's own writer reports a full disk as a RuntimeError: "file write failed",
        # "basic_ios::clear: iostream error" or "[enforce fail at inline_container.cc] unexpected
        # pos N vs M". Whether the disk is full is read before the partial file is removed.
        full = _nearly_full(folder)
        with contextlib.suppress(OSError):
            os.remove(tmp)
        text = str(exc)
        if not any(mark in text.lower() for mark in ("write", "inline_container", "iostream")):
            raise
        if full:
            raise cannot_write(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from None
        raise cannot_write(path, OSError(errno.EIO, f"the write failed, most likely a full disk: "
                                                    f"{text.splitlines()[0]}")) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


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


# What every checkpoint the trainer writes holds (see loop.train's checkpoint()).
KEYS = ("model", "optimizer", "epoch", "step", "global_step", "rng", "python_rng", "history",
        "world_size", "args")


def readable_checkpoint(path):
    """The checkpoint at ``path``, or a :class:`SetupError` saying in one line what is wrong with it.

    A damaged file (random bytes, a truncated copy) made torch's reader raise its own
    traceback (``UnpicklingError``, a zip reader's message); a file that loads but is not
    the trainer's (an empty dict) was taken for a checkpoint of a run with other arguments.
    """
    fix = "delete it to start afresh, or give another --out"
    try:
        ckpt = load_checkpoint(path)
    except Exception as exc:       # whatever the unpickler or the zip reader meets in a damaged file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SetupError(f"--resume: {path} cannot be read as a checkpoint (damaged or truncated: "
                         f"{type(exc).__name__}: {first}); {fix}.") from None
    if not isinstance(ckpt, dict):
        raise SetupError(f"--resume: {path} is not a checkpoint of collectives.train: it holds a "
                         f"{type(ckpt).__name__}, not the trainer's dict; {fix}.")
    missing = [k for k in KEYS if k not in ckpt]
    if missing:
        raise SetupError(f"--resume: {path} is not a checkpoint of collectives.train: it has no "
                         f"{', '.join(missing)}; {fix}.")
    return ckpt


# --- resuming ---------------------------------------------------------------------------------

# What a resumed run must share with the checkpoint's: everything that changes the numbers.
# Where and how it runs (world size, backend, device, paths, threads, progress bar) may change,
# and --epochs / --max-steps may be raised to train further.
MUST_MATCH = ("batch_size", "lr", "momentum", "weight_decay", "algorithm", "sync", "bucket_cap_mb",
              "split", "seed", "subset", "compression")
MAY_RAISE = ("epochs", "max_steps")


def resume_differences(saved, args):
    """The arguments in which ``args`` differs from the checkpoint's ``saved`` ones, as lines."""
    now = vars(args)
    lines = [f"--{k.replace('_', '-')}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now"
             for k in MUST_MATCH if saved.get(k) != now[k]]
    if now.get("compression") == "powersgd":     # PowerSGD's Qs have r columns
        old = saved.get("powersgd_rank", 4)          # 4: the default before the flag was saved
        if old != now["powersgd_rank"]:
            lines.append(f"--powersgd-rank: {old!r} in the checkpoint, {now['powersgd_rank']!r} now")
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
        SetupError: the checkpoint was made with different arguments; the message names each.
    """
    path = os.path.join(args.out, "checkpoint.pt")
    if not (args.resume and os.path.exists(path)):
        return None
    ckpt = readable_checkpoint(path)
    saved = ckpt.get("args") or {}
    diffs = resume_differences(saved, args)
    if diffs:
        raise SetupError(
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
