"""Exercise: all_to_all as a pairwise exchange.

Build ``all_to_all(output_tensor_list, input_tensor_list)``: rank r's
``input_tensor_list[j]`` goes to rank j, where it lands in
``output_tensor_list[r]``, as ``dist.all_to_all`` does (a transpose of the
ranks' lists).

Read: chapter 3 (tutorials/03_collectives.md) for what all_to_all does, chapter 5
(tutorials/05_algorithms.md) for the algorithms.

Hint: your own piece is a local copy (``output_tensor_list[rank]`` gets
``input_tensor_list[rank]``). Then N-1 steps: at step s = 1 .. N-1, send
``input_tensor_list[(rank + s) % N]`` to rank (rank + s) % N and receive
``output_tensor_list[(rank - s) % N]`` from rank (rank - s) % N, posted together.
Every rank talks to one partner per step in each direction, so no link is
shared.

Traffic to reach: N-1 messages per rank, (N-1) x S bytes, S the size of one piece.

Grade it:  python -m tutorials.exercises.grade all_to_all
"""
import torch
import torch.distributed as dist


def all_to_all(output_tensor_list, input_tensor_list, group=None):
    """Send ``input_tensor_list[j]`` to rank j; receive rank j's piece for us into ``output_tensor_list[j]``."""
    raise NotImplementedError("write the pairwise all_to_all here")
