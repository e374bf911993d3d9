"""collectives: every torch.distributed collective, built from point-to-point messages.

Same names and signatures as ``torch.distributed``, so any call can be swapped
for the built-in and back::

    import collectives as dist_ours
    dist_ours.all_reduce(t)                 # ours, default algorithm
    dist_ours.all_reduce(t, algorithm="ring")
    torch.distributed.all_reduce(t)         # the built-in

``ALGORITHMS`` lists every name ``algorithm=`` accepts, per collective.

The package in layers, from the ground up (``tests/test_layers.py`` holds it to this):

* ``algorithms/``: one module per algorithm, each a function of a door and flat tensors;
* ``errors``, ``reduce_ops``, ``settings`` (every ``COLLECTIVES_*`` variable);
* ``door`` (the interface algorithms use), ``observers`` (traffic counters, traces), ``group``;
* ``p2p_communications``: the real door, the only caller of send/recv;
* ``desync``, ``engine`` (one lane per group), ``tuning/`` (what ``algorithm=None`` runs);
* ``call`` (validation, staging, dispatch: one path for every call), ``api``, ``tensor_api``;
* built on them: ``backend/`` (the torch.distributed backend), ``parallel/`` (data parallel,
  ZeRO, SyncBatchNorm, the DDP hook, ...), ``tools/`` (launcher, Perfetto, pictures),
  ``sim`` (the door again, simulated);
* ``train/``: the MNIST trainer, ``python -m collectives.train``.
"""
from torch.distributed import ReduceOp

from . import backend as _backend
from .algorithms import ALGORITHMS
from .api import (all_gather, all_reduce, all_to_all, barrier, broadcast, gather, reduce,
                  reduce_scatter, scatter)
from .engine import Work
from .errors import CollectiveError, CollectiveTimeout, DesyncError
from .observers import count_traffic, trace
from .parallel.data_parallel import DataParallel
from .parallel.data_parallel_naive import NaiveDataParallel, average_gradients
from .parallel.ddp_hook import ddp_comm_hook
from .tensor_api import all_gather_into_tensor, all_to_all_single, reduce_scatter_tensor

_backend.register()  # dist.init_process_group("collectives") runs torch programs on our algorithms

__all__ = [
    "ALGORITHMS", "ReduceOp", "Work", "CollectiveError", "CollectiveTimeout", "DesyncError",
    "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather", "reduce",
    "reduce_scatter", "scatter", "count_traffic", "trace",
    "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
    "average_gradients", "NaiveDataParallel", "DataParallel", "ddp_comm_hook",
]
