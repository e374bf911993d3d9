"""Small helpers shared by several algorithms.

Power-of-two algorithms (recursive doubling, recursive halving, Rabenseifner)
run on a group of any size N through the standard *fold* (Thakur, Rabenseifner
and Gropp, 2005): let P be the largest power of two <= N and E = N - P. Among
ranks 0..2E-1 the even rank of each pair (2i, 2i+1) hands its data to the odd
one and sits the power-of-two phase out; the other P ranks take virtual ranks
0..P-1; at the end each odd rank hands the result back to its even partner.
"""


def inbox(comm, like, numel):
    """A receive buffer of ``numel`` elements of ``like``'s dtype and device, for one call.

    The real door keeps one per group (``Comm.scratch``): a fresh tensor of megabytes is
    new memory, whose every 4 KiB page the kernel faults in and zeroes on first touch, and
    on the machines we measured that cost more than the messages (a 32 MiB inbox: 8,192
    faults, 30-40 ms, every call). A door without ``scratch`` (the simulator's) gets a new one.
    """
    scratch = getattr(comm, "scratch", None)
    return scratch(like, numel) if scratch is not None else like.new_empty(numel)


def fold(n):
    """Return (P, E): the power of two the fold leaves, and how many ranks sit out."""
    p = 1 << (n.bit_length() - 1)
    return p, n - p


def virtual_rank(rank, extra):
    """Virtual rank of ``rank`` after the fold, or None if it sits out."""
    if rank < 2 * extra:
        return rank // 2 if rank % 2 else None
    return rank - extra


def real_rank(vrank, extra):
    """Inverse of :func:`virtual_rank`."""
    return 2 * vrank + 1 if vrank < extra else vrank + extra


def first_real_rank(vrank, extra):
    """Lowest real rank whose data virtual rank ``vrank`` stands for."""
    return 2 * vrank if vrank < extra else vrank + extra


def split_bounds(numel, parts):
    """Offsets of ``tensor_split(parts)``: part i is [bounds[i], bounds[i+1])."""
    base, rem = divmod(numel, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < rem else 0))
    return bounds


def fold_in(comm, extra, step, send, recv):
    """The fold's first step: in each pair (2i, 2i+1) with 2i+1 < 2E the even rank
    sends ``send`` to the odd one, which receives into ``recv``. True on a receiver."""
    r = comm.rank
    if r >= 2 * extra:
        return False
    if r % 2 == 0:
        comm.send(send, r + 1, step)
        return False
    comm.recv(recv, r - 1, step)
    return True


def fold_out(comm, extra, step, send, recv):
    """The fold's last step: the odd rank of each pair sends ``send`` back to the even
    one, which receives into ``recv``."""
    r = comm.rank
    if r >= 2 * extra:
        return
    if r % 2:
        comm.send(send, r - 1, step)
    else:
        comm.recv(recv, r + 1, step)


def ceil_log2(n):
    return (n - 1).bit_length()


def tally_fold_in(tally, extra, step, nbytes, reduced=False):
    """Count :func:`fold_in`: in each folded pair the even rank sends ``nbytes`` to the odd one
    (which, where ``reduced``, folds them into its own)."""
    for i in range(extra):
        tally.message(step, 2 * i, 2 * i + 1, nbytes)
        if reduced:
            tally.reduce(2 * i + 1, nbytes)


def tally_fold_out(tally, extra, step, nbytes):
    """Count :func:`fold_out`: the odd rank of each pair sends ``nbytes`` back."""
    for i in range(extra):
        tally.message(step, 2 * i + 1, 2 * i, nbytes)
