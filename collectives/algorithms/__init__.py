"""Every algorithm, one module each, registered by collective and name.

Each module's docstring is its card: semantics, cost (steps and bytes as a
formula of N ranks and S bytes), numbered steps, a worked 4-rank example and a
reference. Beside the card, ``cost(n, s, item)`` states the same cost as code
(``_cost.Cost``: steps, messages (the busiest rank's, and the whole call's),
bytes sent, received and reduced, extra memory), which the cost model, the
automatic choice, the tests and chapter 5 read. The functions here work on
flat, contiguous tensors and a :class:`~collectives.p2p_communications.Comm`;
``collectives.api`` does the validation, reshaping, staging and dispatch around
them.

Adding an algorithm: its module (the function named after the collective, and
``cost``), one line in ``MODULES``, its test.
"""
from . import (all_gather_bine, all_gather_bruck, all_gather_pat, all_gather_recursive_doubling, all_gather_ring,
               all_reduce_bine, all_reduce_double_binary_tree, all_reduce_hierarchical, all_reduce_naive_ring,
               all_reduce_rabenseifner, all_reduce_recursive_doubling, all_reduce_ring,
               all_reduce_ring_pipelined, all_reduce_swing,
               all_reduce_tree, all_to_all_bruck, all_to_all_linear, all_to_all_pairwise,
               barrier_dissemination,
               broadcast_bine, broadcast_binomial_tree, broadcast_linear, broadcast_pipeline,
               broadcast_scatter_allgather, gather_bine, gather_binomial_tree, gather_linear,
               reduce_bine, reduce_binomial_tree, reduce_linear, reduce_scatter_bine, reduce_scatter_pat,
               reduce_scatter_recursive_halving, reduce_scatter_ring, scatter_bine, scatter_binomial_tree,
               scatter_linear)
from ._cost import Cost  # noqa: F401  (re-exported: what cost() returns)

MODULES = {
    "broadcast": {
        "linear": broadcast_linear,
        "binomial_tree": broadcast_binomial_tree,
        "pipeline": broadcast_pipeline,
        "scatter_allgather": broadcast_scatter_allgather,
        "bine": broadcast_bine,
    },
    "reduce": {
        "linear": reduce_linear,
        "binomial_tree": reduce_binomial_tree,
        "bine": reduce_bine,
    },
    "all_reduce": {
        "naive_ring": all_reduce_naive_ring,
        "ring": all_reduce_ring,
        "ring_pipelined": all_reduce_ring_pipelined,
        "recursive_doubling": all_reduce_recursive_doubling,
        "rabenseifner": all_reduce_rabenseifner,
        "tree": all_reduce_tree,
        "double_binary_tree": all_reduce_double_binary_tree,
        "hierarchical": all_reduce_hierarchical,
        "swing": all_reduce_swing,
        "bine": all_reduce_bine,
    },
    "scatter": {
        "linear": scatter_linear,
        "binomial_tree": scatter_binomial_tree,
        "bine": scatter_bine,
    },
    "gather": {
        "linear": gather_linear,
        "binomial_tree": gather_binomial_tree,
        "bine": gather_bine,
    },
    "all_gather": {
        "ring": all_gather_ring,
        "recursive_doubling": all_gather_recursive_doubling,
        "bruck": all_gather_bruck,
        "pat": all_gather_pat,
        "bine": all_gather_bine,
    },
    "reduce_scatter": {
        "ring": reduce_scatter_ring,
        "recursive_halving": reduce_scatter_recursive_halving,
        "pat": reduce_scatter_pat,
        "bine": reduce_scatter_bine,
    },
    "all_to_all": {
        "linear": all_to_all_linear,
        "pairwise": all_to_all_pairwise,
        "bruck": all_to_all_bruck,
    },
    "barrier": {
        "dissemination": barrier_dissemination,
    },
}

# Each module's function is named after its collective.
REGISTRY = {collective: {name: getattr(module, collective) for name, module in by_name.items()}
            for collective, by_name in MODULES.items()}

ALGORITHMS = {collective: tuple(names) for collective, names in MODULES.items()}


def cost(collective, algorithm, n, s, item=1):
    """The :class:`Cost` of one call of ``algorithm`` on ``n`` ranks and ``s`` bytes.

    Raises ValueError for an unknown name, or for a registered algorithm whose
    module states no cost.
    """
    module = MODULES.get(collective, {}).get(algorithm)
    if module is None:
        known = ", ".join(f"{c}/{a}" for c in MODULES for a in MODULES[c])
        raise ValueError(f"no algorithm {algorithm!r} for {collective!r}; known: {known}")
    if not callable(getattr(module, "cost", None)):
        raise ValueError(f"{module.__name__} states no cost(n, s, item): every algorithm "
                         f"module must (see collectives/algorithms/_cost.py)")
    return module.cost(n, s, item)
