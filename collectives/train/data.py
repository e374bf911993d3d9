"""MNIST for data-parallel training: finding it, and splitting it across ranks.

Where the data comes from: ``--data-dir``, else the environment variable
``COLLECTIVES_DATA``, else ``./data``. The directory holds torchvision's layout,
``MNIST/raw/`` with the four original ``.gz`` files (unpacked copies beside
them once torchvision has read them). If the directory is read-only and holds
only the ``.gz`` files, they are copied to a writable cache
(``COLLECTIVES_CACHE``, else ``~/.cache/collectives``) and unpacked there; the
original is never written to. If nothing is there, rank 0 downloads with
torchvision while the other ranks wait at a barrier.

How it is split, two ways:

* :class:`DataPartitioner`, the PyTorch tutorial's way: shuffle the indices
  once with a fixed seed and give rank r the r-th slice, for good. Every epoch
  sees the same order.
* ``torch.utils.data.DistributedSampler``: every epoch a new permutation, the
  same on every rank, drawn from ``seed + epoch``; rank r takes every N-th
  index. ``sampler.set_epoch(epoch)`` must be called each epoch, or the
  "new" permutation is the same one every time (``tests/test_train.py`` shows it).

In both cases each rank runs ``global_batch_size // world_size`` examples per
step, so one step of N ranks consumes one global batch.
"""
import hashlib
import math
import os
import random
import shutil
import stat
import tempfile

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .. import settings

MEAN, STD = 0.1307, 0.3081
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def data_dir(path=None):
    """The MNIST root: ``path`` if given, else ``$COLLECTIVES_DATA``, else ``./data``."""
    return settings.data_dir(path)


def cache_dir():
    """Writable place for an unpacked copy of a read-only data directory (``COLLECTIVES_CACHE``)."""
    return settings.data_cache_dir()


def _raw(root):
    return os.path.join(root, "MNIST", "raw")


def _unpacked(root):
    return all(os.path.isfile(os.path.join(_raw(root), f)) for f in FILES)


def _packed(root):
    return all(os.path.isfile(os.path.join(_raw(root), f + ".gz")) for f in FILES)


def _writable(path):
    """Whether we may write under ``path``: permission bits say so, not just access().

    ``os.access`` is True for root even on a ``r-x`` directory; a directory
    whose owner made it read-only is treated as read-only by everyone.
    """
    while not os.path.exists(path):
        path = os.path.dirname(path)
    mode = os.stat(path).st_mode
    return os.access(path, os.W_OK) and bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _missing_message(root, reason):
    return (f"MNIST is not in {root} and could not be downloaded ({reason}).\n"
            f"Put the four original files ({', '.join(f + '.gz' for f in FILES)}) in\n"
            f"    {_raw(root)}/\n"
            f"or point --data-dir or the environment variable COLLECTIVES_DATA at a directory "
            f"whose MNIST/raw/ holds them.")


class DamagedFile(ValueError):
    """An MNIST file is there but is not the original (truncated, corrupted)."""


def check_archives(raw):
    """Raise :class:`DamagedFile` naming the first ``.gz`` in ``raw`` that is not the original
    MNIST file (its MD5 differs from the one torchvision knows): torchvision would otherwise try
    to download it again and, offline, report it missing."""
    from torchvision.datasets import MNIST
    for name, md5 in MNIST.resources:
        path = os.path.join(raw, name)
        if not os.path.isfile(path):
            continue
        digest = hashlib.md5()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != md5:
            raise DamagedFile(f"{path} is damaged: it is not the original MNIST file ({os.path.getsize(path)} "
                              f"bytes, MD5 {digest.hexdigest()}, expected {md5}; a truncated or corrupted "
                              f"download?). Delete it to download it again, or copy a good one there.")


def check_unpacked(raw):
    """Raise :class:`DamagedFile` naming the first unpacked MNIST file in ``raw`` whose length is not
    what its IDX header promises (a truncated copy ended in a rank's raw traceback, ``shape '[60000,
    28, 28]' is invalid for input of size ...``, naming no file)."""
    for name in FILES:
        path = os.path.join(raw, name)
        with open(path, "rb") as f:
            head = f.read(4)
            ndims = head[3] if len(head) == 4 and head[:3] == b"\0\0\x08" else None
            dims = f.read(4 * ndims) if ndims else b""
        size = os.path.getsize(path)
        if ndims is None or len(dims) < 4 * ndims:
            why = f"it has {size:,} bytes and no IDX header (an MNIST file starts 00 00 08 0N)"
        else:
            expected = 4 + 4 * ndims + math.prod(int.from_bytes(dims[4 * i:4 * i + 4], "big")
                                                 for i in range(ndims))
            if size == expected:
                continue
            why = (f"it has {size:,} bytes, its header promises {expected:,} "
                   f"({'truncated' if size < expected else 'bytes after the end'})")
        again = ("unpack it again from the .gz beside it" if os.path.isfile(path + ".gz")
                 else "download it again")
        raise DamagedFile(f"{path} is damaged: {why}; delete it to {again} (or re-download MNIST/raw).")


def prepare_mnist(path=None, download=True):
    """Make MNIST readable by torchvision and return the root to read it from.

    Args:
        path (str, optional): Data directory; see :func:`data_dir`.
        download (bool): Whether this process may download (rank 0 only).

    Returns:
        str: a root under which ``MNIST/raw/`` holds the unpacked files; ``path``
        itself, or a cache directory when ``path`` is read-only.

    Raises:
        FileNotFoundError: MNIST is absent and cannot be fetched; the message
        says where to put the files.
        DamagedFile: a ``.gz`` there is not the original file; the message names it.
    """
    from torchvision.datasets import MNIST

    root = data_dir(path)
    if _unpacked(root):
        check_unpacked(_raw(root))
        return root
    check_archives(_raw(root))
    if _packed(root) and not _writable(_raw(root)):
        cached = os.path.join(cache_dir(), "mnist")
        if _unpacked(cached):
            check_unpacked(_raw(cached))
        else:
            if not download:
                raise FileNotFoundError(f"{cached} has no unpacked MNIST; rank 0 unpacks it first")
            os.makedirs(cache_dir(), exist_ok=True)
            # Unpack into a private directory, then rename: a reader never sees half a copy.
            tmp = tempfile.mkdtemp(prefix="mnist-", dir=cache_dir())
            os.makedirs(_raw(tmp))
            for f in FILES:
                shutil.copyfile(os.path.join(_raw(root), f + ".gz"), os.path.join(_raw(tmp), f + ".gz"))
            MNIST(tmp, train=True, download=True)
            MNIST(tmp, train=False, download=True)
            shutil.rmtree(cached, ignore_errors=True)
            os.replace(tmp, cached)
        return cached
    if not download:
        raise FileNotFoundError(_missing_message(root, "only rank 0 downloads, and it has not"))
    if not _writable(root):
        raise FileNotFoundError(_missing_message(root, "the directory is not writable"))
    try:
        MNIST(root, train=True, download=True)
        MNIST(root, train=False, download=True)
    except Exception as exc:  # torchvision raises RuntimeError or URLError when offline
        raise FileNotFoundError(_missing_message(root, f"{type(exc).__name__}: {exc}".strip())) from exc
    return root


def load_mnist(root, train=True, subset=None):
    """MNIST as a ``TensorDataset`` of normalised (1, 28, 28) images and labels.

    Read once through ``torchvision.datasets.MNIST`` and converted in one go:
    much faster per epoch than converting every image on every access.

    Args:
        root (str): What :func:`prepare_mnist` returned.
        train (bool): The 60,000 training images, or the 10,000 test images.
        subset (int, optional): Keep only the first ``subset`` examples.
    """
    from torchvision.datasets import MNIST

    ds = MNIST(root, train=train, download=False)
    x, y = ds.data, ds.targets
    if subset:
        x, y = x[:subset], y[:subset]
    x = x.float().div_(255).sub_(MEAN).div_(STD).unsqueeze(1)
    return TensorDataset(x, y)


class Partition(torch.utils.data.Dataset):
    """The examples of ``data`` at positions ``index``."""

    def __init__(self, data, index):
        self.data, self.index = data, index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        return self.data[self.index[i]]


class DataPartitioner:
    """The PyTorch tutorial's split: shuffle once, cut into fractions ``sizes``.

    Every rank builds the same partitioner (same seed) and keeps its own piece,
    so the pieces are disjoint and cover the data; no messages are needed.

    Example::

        >>> parts = DataPartitioner(dataset, [0.5, 0.5], seed=1234)
        >>> mine = parts.use(rank)     # Rank 0: one half, Rank 1: the other
    """

    def __init__(self, data, sizes, seed=1234):
        self.data = data
        indexes = list(range(len(data)))
        random.Random(seed).shuffle(indexes)
        self.partitions = []
        start = 0
        for frac in sizes:
            n = int(frac * len(data))
            self.partitions.append(indexes[start:start + n])
            start += n

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def per_rank_batch(global_batch_size, world_size):
    """Each rank's share of the global batch; refuses a batch that does not split evenly."""
    if global_batch_size % world_size:
        raise ValueError(f"--batch-size {global_batch_size} (global) does not split evenly across "
                         f"{world_size} ranks; use a multiple of {world_size}")
    return global_batch_size // world_size


def train_loader(dataset, global_batch_size, rank, world_size, seed=0, how="sampler"):
    """This rank's loader of the training set.

    Args:
        how (str): ``"sampler"`` (DistributedSampler: reshuffled every epoch
            once ``loader.sampler.set_epoch(epoch)`` is called) or
            ``"partition"`` (the tutorial's DataPartitioner: one fixed shuffle).
    """
    batch = per_rank_batch(global_batch_size, world_size)
    if how == "partition":
        part = DataPartitioner(dataset, [1.0 / world_size] * world_size, seed).use(rank)
        return DataLoader(part, batch_size=batch, shuffle=False)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch, sampler=sampler)
