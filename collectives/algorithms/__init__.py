"""Every algorithm, one module each, registered by collective and name.

Each module's docstring is its card: semantics, cost (steps and bytes as a
formula of N ranks and S bytes), numbered steps, a worked 4-rank example and a
reference. The functions here work on flat, contiguous tensors and a
:class:`~collectives.p2p_communications.Comm`; ``collectives.api`` does the
validation, reshaping, staging and dispatch around them.
"""
from . import (all_gather_recursive_doubling, all_gather_ring, all_reduce_naive_ring,
               all_reduce_rabenseifner, all_reduce_recursive_doubling, all_reduce_ring,
               all_reduce_ring_pipelined,
               all_reduce_tree, all_to_all_linear, all_to_all_pairwise, barrier_dissemination,
               broadcast_binomial_tree, broadcast_linear, broadcast_pipeline,
               broadcast_scatter_allgather, gather_binomial_tree, gather_linear,
               reduce_binomial_tree, reduce_linear, reduce_scatter_recursive_halving,
               reduce_scatter_ring, scatter_binomial_tree, scatter_linear)

REGISTRY = {
    "broadcast": {
        "linear": broadcast_linear.broadcast,
        "binomial_tree": broadcast_binomial_tree.broadcast,
        "pipeline": broadcast_pipeline.broadcast,
        "scatter_allgather": broadcast_scatter_allgather.broadcast,
    },
    "reduce": {
        "linear": reduce_linear.reduce,
        "binomial_tree": reduce_binomial_tree.reduce,
    },
    "all_reduce": {
        "naive_ring": all_reduce_naive_ring.all_reduce,
        "ring": all_reduce_ring.all_reduce,
        "ring_pipelined": all_reduce_ring_pipelined.all_reduce,
        "recursive_doubling": all_reduce_recursive_doubling.all_reduce,
        "rabenseifner": all_reduce_rabenseifner.all_reduce,
        "tree": all_reduce_tree.all_reduce,
    },
    "scatter": {
        "linear": scatter_linear.scatter,
        "binomial_tree": scatter_binomial_tree.scatter,
    },
    "gather": {
        "linear": gather_linear.gather,
        "binomial_tree": gather_binomial_tree.gather,
    },
    "all_gather": {
        "ring": all_gather_ring.all_gather,
        "recursive_doubling": all_gather_recursive_doubling.all_gather,
    },
    "reduce_scatter": {
        "ring": reduce_scatter_ring.reduce_scatter,
        "recursive_halving": reduce_scatter_recursive_halving.reduce_scatter,
    },
    "all_to_all": {
        "linear": all_to_all_linear.all_to_all,
        "pairwise": all_to_all_pairwise.all_to_all,
    },
    "barrier": {
        "dissemination": barrier_dissemination.barrier,
    },
}

ALGORITHMS = {collective: tuple(names) for collective, names in REGISTRY.items()}
