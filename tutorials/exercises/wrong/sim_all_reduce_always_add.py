"""Wrong: a ring that adds (add_) instead of folding with op.combine: right for SUM only, wrong for MAX."""


def sim_all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    chunks = tensor.tensor_split(n)
    inbox = tensor.new_empty(chunks[0].numel())
    for s in range(n - 1):                        # reduce-scatter: partial sums travel right
        send_i, recv_i = (r - s - 1) % n, (r - s - 2) % n
        got = inbox[:chunks[recv_i].numel()]
        comm.sendrecv(chunks[send_i], right, got, left, s)
        chunks[recv_i].add_(got)                  # the mistake: always a sum, whatever op asks
    for s in range(n - 1):                        # all-gather: finished chunks travel right
        send_i, recv_i = (r - s) % n, (r - s - 1) % n
        comm.sendrecv(chunks[send_i], right, chunks[recv_i], left, n - 1 + s)
