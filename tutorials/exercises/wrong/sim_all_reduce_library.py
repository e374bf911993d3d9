"""Wrong: hands the work to the course's own ring (collectives.algorithms), which the grader switches off."""
from collectives.algorithms import all_reduce_ring


def sim_all_reduce(comm, tensor, op):
    return all_reduce_ring.all_reduce(comm, tensor, op)
