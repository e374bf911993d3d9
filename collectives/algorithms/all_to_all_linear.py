"""all_to_all, linear: every rank posts all its sends and receives at once.

Semantics: ``output_tensor_list[j]`` on rank i ends equal to
``input_tensor_list[i]`` on rank j (a transpose of who-holds-what).

Communication steps: 1
Messages each rank sends: N-1, one per peer
Bytes each rank sends: (N-1)/N * S (S = the sum of its N input pieces, equal pieces)

Steps:
  1. Copy the own piece: output[r] = input[r].
  2. Post a receive from every peer j into output[j] and a send of input[j] to
     every peer j, all at once, and wait for all. The transport orders them.

Worked example, N=4, rank r holds input pieces [x_r0, x_r1, x_r2, x_r3]:

  step | each rank r
  -----+-------------------------------------------------
    0  | sends x_rj to rank j, receives x_jr from rank j, for all j != r
  rank 0 ends with [x00, x10, x20, x30], rank 1 with [x01, x11, x21, x31], ...

Posting everything at once lets the transport overlap all transfers but puts
N-1 messages in flight per rank; ``all_to_all_pairwise`` bounds that to one.

Extra memory: none.
"""
from ._cost import NOTHING, Cost, pieces


def cost(n, s, item=1):
    """S = one rank's whole input (N pieces of S/N)."""
    m = pieces(s, n, item)[0]
    if n == 1 or m == 0:
        return NOTHING
    # every rank sends one piece to each of the N-1 others: N(N-1) messages in all
    return Cost(steps=1, messages=n - 1, total_messages=n * (n - 1),
                sent_bytes=(n - 1) * m, recv_bytes=(n - 1) * m, critical_bytes=m)


def all_to_all(comm, output_tensor_list, input_tensor_list):
    r = comm.rank
    output_tensor_list[r].copy_(input_tensor_list[r])
    peers = [p for p in range(comm.size) if p != r]
    comm.exchange(0, sends=[(input_tensor_list[p], p) for p in peers],
                  recvs=[(output_tensor_list[p], p) for p in peers])
