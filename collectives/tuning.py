"""What ``algorithm=None`` picks, from the message size and the group size.

A first cut from the alpha-beta cost model's shape: latency-bound (small)
messages want few steps (trees, recursive doubling); bandwidth-bound (large)
messages want few bytes per rank (rings, pipelines). ``python -m
collectives.bench`` measures where the crossovers lie on a machine.
"""

SMALL_BYTES = 64 * 1024


def choose(collective, nbytes, group_size):
    """Name of the default algorithm for ``collective`` with ``nbytes`` per rank."""
    small = nbytes <= SMALL_BYTES
    if collective == "all_reduce":
        return "recursive_doubling" if small or group_size <= 2 else "ring"
    if collective == "broadcast":
        if small or group_size <= 2:
            return "binomial_tree"
        return "pipeline"
    if collective in ("reduce", "scatter", "gather"):
        return "binomial_tree"
    if collective == "all_gather":
        return "recursive_doubling" if small else "ring"
    if collective == "reduce_scatter":
        return "recursive_halving" if small else "ring"
    if collective == "all_to_all":
        return "linear"
    return "dissemination"
