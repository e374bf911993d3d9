"""all_to_all, pairwise exchange: N-1 steps, one send and one receive each.

Semantics: ``output_tensor_list[j]`` on rank i ends equal to
``input_tensor_list[i]`` on rank j.

Communication steps: N-1
Messages each rank sends: N-1, one per step
Bytes each rank sends: (N-1)/N * S (S = the sum of its N input pieces, equal pieces)

Steps:
  1. Copy the own piece: output[r] = input[r].
  2. For s = 1..N-1: send input[(r+s) mod N] to rank r+s and receive
     output[(r-s) mod N] from rank r-s. Each step every rank has exactly one
     message in flight each way, which keeps memory and contention bounded.

Worked example, N=4 (rank r sends to / receives from):

  step | rank 0   | rank 1   | rank 2   | rank 3
  -----+----------+----------+----------+---------
    1  | ->1 <-3  | ->2 <-0  | ->3 <-1  | ->0 <-2
    2  | ->2 <-2  | ->3 <-3  | ->0 <-0  | ->1 <-1
    3  | ->3 <-1  | ->0 <-2  | ->1 <-3  | ->2 <-0

Extra memory: none.

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005 (MPICH long-message alltoall).
"""
from ._cost import NOTHING, Cost, pieces


def cost(n, s, item=1):
    """S = one rank's whole input (N pieces of S/N)."""
    m = pieces(s, n, item)[0]
    if n == 1 or m == 0:
        return NOTHING
    # every rank sends one piece at each of the N-1 steps: N(N-1) messages in all
    return Cost(steps=n - 1, messages=n - 1, total_messages=n * (n - 1),
                sent_bytes=(n - 1) * m, recv_bytes=(n - 1) * m,
                critical_bytes=(n - 1) * m)


def all_to_all(comm, output_tensor_list, input_tensor_list):
    n, r = comm.size, comm.rank
    output_tensor_list[r].copy_(input_tensor_list[r])
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        comm.sendrecv(input_tensor_list[dst], dst, output_tensor_list[src], src, s - 1)
