"""collectives: every torch.distributed collective, built from point-to-point messages.

Same names and signatures as ``torch.distributed``, so any call can be swapped
for the built-in and back::

    import collectives as dist_ours
    dist_ours.all_reduce(t)                 # ours, default algorithm
    dist_ours.all_reduce(t, algorithm="ring")
    torch.distributed.all_reduce(t)         # the built-in

``ALGORITHMS`` lists every name ``algorithm=`` accepts, per collective.
"""
from torch.distributed import ReduceOp

from .algorithms import ALGORITHMS
from . import backend as _backend
from .api import (all_gather, all_reduce, all_to_all, barrier, broadcast, gather, reduce,
                  reduce_scatter, scatter)
from .data_parallel import DataParallel
from .data_parallel_naive import NaiveDataParallel, average_gradients
from .ddp_hook import ddp_comm_hook
from .debug import DesyncError
from .engine import Work
from .tensor_api import all_gather_into_tensor, all_to_all_single, reduce_scatter_tensor
from .p2p_communications import CollectiveError, CollectiveTimeout, count_traffic, trace

_backend.register()  # dist.init_process_group("collectives") runs torch programs on our algorithms

__all__ = [
    "ALGORITHMS", "ReduceOp", "Work", "CollectiveError", "CollectiveTimeout", "DesyncError",
    "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather", "reduce",
    "reduce_scatter", "scatter", "count_traffic", "trace",
    "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
    "average_gradients", "NaiveDataParallel", "DataParallel", "ddp_comm_hook",
]
