"""The shared-memory transport (``collectives/shm.py``) on its own, in real process worlds.

Messages carry values that encode sender, receiver and index, so every received byte has a
closed form; mailboxes are made small so that messages stream through them in pieces. The
faults: a peer SIGKILLed mid-transfer is named quickly, no file of the job is left in
/dev/shm once a group is set up, a killed job's leftovers are removed by the next start,
and a /dev/shm that cannot hold the inboxes gives every rank the same answer before any
message (an error with ``required``, else gloo and one warning line).
"""
import datetime
import errno
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from collectives import shm
from collectives.tuning import agreed
from tests.worlds import free_port, run_world


def allgather(data):
    """The setup's all-gather, here torch's own (the door uses its gloo messages)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, data)
    return out


def local_pids():
    """Per rank, its pid where it shares this rank's host, else None: what the door reads
    from the group's agreement (``collectives.tuning.agreed``), here gathered by torch."""
    me = (agreed.host_identity(), os.getpid())
    return [pid if host == me[0] else None for host, pid in allgather(me)]


def payload(src, dst, i, numel, dtype=torch.float32):
    return (torch.arange(numel, dtype=torch.float64) + 1000 * src + 100 * dst + 10 * i).to(dtype)


def exchange_all(rank, n, capacity, sizes, direct_min=None):
    """Every rank sends every size to every other rank, all posted at once, tags out of order."""
    t, local = shm.connect(rank, local_pids(), allgather, required=True, capacity=capacity,
                           direct_min=direct_min)
    assert sorted(local) == [r for r in range(n) if r != rank]
    if n == 1:
        return t is None
    assert t.direct_min == direct_min      # this kernel lets the ranks read each other
    works, received = [], []
    for peer in local:
        # receives posted in reverse tag order: a receive takes the message with its tag
        for i, numel in reversed(list(enumerate(sizes))):
            buf = torch.full((numel,), -1.0)
            received.append((peer, i, numel, buf))
            works.append(t.recv([buf], peer, tag=i))
    for peer in local:
        for i, numel in enumerate(sizes):
            works.append(t.send([payload(rank, peer, i, numel)], peer, tag=i))
    for w in works:
        w.wait(timeout=30)
    return all(torch.equal(buf, payload(peer, rank, i, numel)) for peer, i, numel, buf in received)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_byte_arrives_streamed_through_small_mailboxes(n):
    # 4 KiB mailboxes: 100,000 floats (400 kB) pass in ~100 pieces; 0 and 1 element too
    sizes = [0, 1, 3, 1000, 100_000]
    assert run_world(exchange_all, n, 4096, sizes, timeout=120) == [True] * n


@pytest.mark.parametrize("n", [2, 3])
def test_every_byte_arrives_read_straight_from_the_sender(n):
    # from 4000 bytes on a message is one copy out of the sender's tensor (process_vm_readv);
    # smaller ones still pass through the 4 KiB mailboxes, in the same streams, tags out of order
    sizes = [0, 1, 999, 1000, 100_000, 1 << 20]
    assert run_world(exchange_all, n, 4096, sizes, 4000, timeout=120) == [True] * n


def exchange_pipelined(rank, n, capacity, piece, sizes):
    """:func:`exchange_all` with each rank on a core of its own as far as the transport knows
    (``pipelined``): a sender publishes every ``piece`` bytes and the receiver copies them out
    meanwhile, wrapping around a mailbox several pieces long."""
    shm.PIECE = piece
    real = shm.ShmTransport.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.pipelined = True
    shm.ShmTransport.__init__ = init
    return exchange_all(rank, n, capacity, sizes)


@pytest.mark.parametrize("n", [2, 3])
def test_every_byte_arrives_in_pieces_published_while_the_sender_copies(n):
    # 8 KiB mailboxes of 1 KiB pieces: 400 kB messages wrap around them ~50 times
    sizes = [0, 1, 3, 255, 256, 257, 1000, 100_000]
    assert run_world(exchange_pipelined, n, 8192, 1024, sizes, timeout=120) == [True] * n


def published_while_copying(rank, n, pipelined):
    """Rank 0 sends 600 kB through a 2 MiB mailbox; at every copy into it, where the copy
    starts and how far its head word (the receiver's view) already reached."""
    t, local = shm.connect(rank, local_pids(), allgather, required=True, direct_min=None)
    t.pipelined = pipelined
    numel = 150_000
    if rank == 1:
        y = torch.zeros(numel)
        t.recv([y], 0, tag=0).wait(timeout=30)
        return torch.equal(y, payload(0, 1, 0, numel))
    seen, real = [], shm._advance

    def advance(box, pos, work, room, into):
        published = box.words[0]
        moved = real(box, pos, work, room, into)
        if into and moved:
            seen.append((pos, published))
        return moved
    shm._advance = advance
    rings, write = [], os.write

    def ring(fd, data):
        rings.append(fd)
        return write(fd, data)
    shm.os.write = ring
    try:
        t.send([payload(0, 1, 0, numel)], 1, tag=0).wait(timeout=30)
    finally:
        shm.os.write = write
    return seen, rings.count(t.bells[1])


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_sender_publishes_each_piece_only_where_the_receiver_has_a_core(pipelined):
    (seen, rings), received = run_world(published_while_copying, 2, pipelined)
    assert received is True
    # the doorbell writes the card counts: the early one and the last, or the last alone
    assert rings == shm.cost(600_000, direct_min=None, pipelined=pipelined)["syscalls"] == 1 + pipelined
    if pipelined:
        # 5 pieces of 128 KiB; from the second on, a copy starts where the receiver already sees
        assert seen == [(shm.RECORD + i * shm.PIECE, 0 if i == 0 else shm.RECORD + i * shm.PIECE)
                        for i in range(5)]
    else:
        # one copy of the whole message, published once it is done
        assert seen == [(shm.RECORD, 0)]


def dtypes_and_order(rank, n):
    t, local = shm.connect(rank, local_pids(), allgather, required=True, capacity=1024)
    peer = 1 - rank
    ok = True
    for step, dtype in enumerate([torch.float64, torch.int8, torch.bool, torch.complex64, torch.bfloat16]):
        x = (torch.arange(777) % 2 if dtype is torch.bool else torch.arange(777) + rank).to(dtype)
        y = torch.zeros(777, dtype=dtype)
        r = t.recv([y], peer, tag=step)
        s = t.send([x], peer, tag=step)
        s.wait(timeout=30)
        r.wait(timeout=30)
        want = (torch.arange(777) % 2 if dtype is torch.bool else torch.arange(777) + peer).to(dtype)
        ok &= torch.equal(y, want)
    return ok


def test_dtypes_and_messages_in_send_order():
    assert run_world(dtypes_and_order, 2) == [True, True]


def eager_below_the_mailbox(rank, n):
    """Rank 1 posts its receives only 2 s after a barrier. Rank 0's send that fits the mailbox
    is done at once (MPI's eager protocol); one larger than the mailbox waits for room, and one
    read straight from its tensor waits for the reader: both only after rank 1 has begun."""
    t, local = shm.connect(rank, local_pids(), allgather, required=True, capacity=4096, direct_min=8192)
    sizes = {"fits": 100, "streams": 1500, "direct": 4096}     # float32: 400 B, 6000 B, 16 KiB
    dist.barrier()      # both clocks start together, to within the barrier's skew
    if rank == 0:
        start = time.monotonic()
        done = {}
        for tag, (name, numel) in enumerate(sizes.items()):
            w = t.send([payload(0, 1, tag, numel)], 1, tag=tag)
            if name == "fits":
                done["fits_at_post"] = w.is_completed()
            w.wait(timeout=30)
            done[name] = time.monotonic() - start
        return done
    time.sleep(2.0)
    bufs = {name: torch.zeros(numel) for name, numel in sizes.items()}
    for tag, (name, buf) in enumerate(bufs.items()):
        t.recv([buf], 0, tag=tag).wait(timeout=30)
    return all(torch.equal(buf, payload(0, 1, tag, buf.numel())) for tag, buf in enumerate(bufs.values()))


def test_a_send_that_fits_the_mailbox_is_done_before_its_receive_is_posted():
    sent, received = run_world(eager_below_the_mailbox, 2)
    assert received is True
    assert sent["fits_at_post"] is True and sent["fits"] < 1.0, sent
    assert sent["streams"] >= 1.5 and sent["direct"] >= 1.5, sent


def overtaken(rank, n, capacity, direct_min=None):
    """Rank 0 sends tags 0 then 1; rank 1 waits for tag 1 first, then receives tag 0: the
    message at the head of its mailbox must not block the one behind it (gloo matches by tag)."""
    t, local = shm.connect(rank, local_pids(), allgather, required=True, capacity=capacity,
                           direct_min=direct_min)
    numel = capacity // 2          # 2 x capacity bytes each: both stream through in pieces
    if rank == 0:
        works = [t.send([payload(0, 1, i, numel)], 1, tag=i) for i in (0, 1)]
        for w in works:
            w.wait(timeout=30)
        return True
    second, first = torch.zeros(numel), torch.zeros(numel)
    t.recv([second], 0, tag=1).wait(timeout=30)
    t.recv([first], 0, tag=0).wait(timeout=30)
    return torch.equal(first, payload(0, 1, 0, numel)) and torch.equal(second, payload(0, 1, 1, numel))


@pytest.mark.parametrize("capacity,direct_min", [(1024, None), (1 << 20, None), (1024, 1)])
def test_a_receive_is_not_blocked_by_an_earlier_message_with_another_tag(capacity, direct_min):
    # read directly, the message overtaken is read aside at once (its sender may reuse nothing
    # before its send completes, and it completes only once read)
    assert run_world(overtaken, 2, capacity, direct_min, timeout=120) == [True, True]


def killed_mid_transfer(rank, n):
    t, local = shm.connect(rank, local_pids(), allgather, required=True, capacity=4096, direct_min=None)
    if rank == 1:
        first = torch.zeros(10)
        t.recv([first], 0, tag=0).wait(timeout=30)
        os.kill(os.getpid(), signal.SIGKILL)    # mid-transfer: rank 0's big message is streaming
    big = torch.ones(1 << 20)                   # 4 MiB through a 4 KiB mailbox
    t.send([torch.ones(10)], 1, tag=0).wait(timeout=30)
    start = time.monotonic()
    work = t.send([big], 1, tag=1)
    try:
        work.wait(timeout=60)
    except shm.PeerDied as exc:
        return time.monotonic() - start, str(exc)
    return None


def _killable(rank, n, port, fn, queue):
    """A rank outside the test launcher (which stops a world once a rank dies): rank 0's
    result goes to ``queue``, whatever happens to the others."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    try:
        result = fn(rank, n)
    except Exception as exc:
        result = ("raised", f"{type(exc).__name__}: {exc}")
    if rank == 0:
        queue.put(result)
        queue.close()
        queue.join_thread()     # the feeder thread must write it before _exit
    os._exit(0)     # no teardown: the peer is dead and gloo's would wait for it


def survivor_of_sigkill(fn, n):
    """Run ``fn(rank, n)`` on ``n`` processes in which some rank SIGKILLs itself; rank 0's result."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_killable, args=(r, n, port, fn, queue)) for r in range(n)]
    for p in procs:
        p.start()
    try:
        return queue.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def test_a_peer_killed_mid_transfer_is_named_at_once():
    elapsed, text = survivor_of_sigkill(killed_mid_transfer, 2)
    assert elapsed < 10, elapsed      # the pidfd wakes it: not the 60 s it was allowed
    assert "group rank 1" in text and "exited" in text, text


def sender_killed_before_the_read(rank, n):
    """Rank 1 posts a direct send and dies before rank 0 posts the receive: the record is in
    rank 0's mailbox, the bytes it points at went with the process."""
    t, local = shm.connect(rank, local_pids(), allgather, required=True, direct_min=1)
    if rank == 1:
        t.send([torch.ones(1 << 18)], 0, tag=5)
        os.kill(os.getpid(), signal.SIGKILL)
    # wait until rank 1 is gone: its pidfd is readable then
    deadline = time.monotonic() + 30
    while shm.alive(t.pids[1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    try:
        t.recv([torch.empty(1 << 18)], 1, tag=5).wait(timeout=60)
    except shm.PeerDied as exc:
        return time.monotonic() - start, str(exc)
    return None


def test_a_sender_gone_before_its_direct_message_is_read_is_named():
    elapsed, text = survivor_of_sigkill(sender_killed_before_the_read, 2)
    assert elapsed < 10, elapsed
    assert "group rank 1" in text and "exited" in text, text


def no_reading_allowed(rank, n):
    if rank == 1:
        shm._probe = lambda pid, addr: False       # this rank's kernel refuses process_vm_readv
    t, local = shm.connect(rank, local_pids(), allgather, required=True, direct_min=1)
    # every rank falls back to the mailboxes alike: a sender cannot know what its receiver may do
    x = torch.arange(300_000, dtype=torch.float32) + rank
    y = torch.empty_like(x)
    r, s = t.recv([y], 1 - rank, tag=0), t.send([x], 1 - rank, tag=0)
    s.wait(timeout=30)
    r.wait(timeout=30)
    return t.direct_min, torch.equal(y, torch.arange(300_000, dtype=torch.float32) + 1 - rank)


def test_a_rank_that_cannot_read_its_peers_turns_direct_reads_off_on_the_host():
    assert run_world(no_reading_allowed, 2) == [(None, True), (None, True)]


def files_of(pids):
    return sorted(name for name in os.listdir(shm.DIRECTORY)
                  if name.startswith(shm.PREFIX) and any(f"-{pid}-" in name for pid in pids))


def nothing_left_after_setup(rank, n):
    t, local = shm.connect(rank, local_pids(), allgather, required=True)
    pids = allgather(os.getpid())
    dist.barrier()
    return files_of(pids)


def test_no_file_outlives_setup():
    # the names go as soon as every peer has mapped them: nothing to leak after that,
    # whether the job then exits, raises, is interrupted or killed
    assert run_world(nothing_left_after_setup, 3) == [[], [], []]


def stale_is_cleaned(rank, n, stale):
    shm.connect(rank, local_pids(), allgather, required=True)
    return os.path.exists(stale)


def test_the_next_start_removes_what_a_killed_job_left():
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)      # a pid that no longer runs
    stale = os.path.join(shm.DIRECTORY, f"{shm.PREFIX}{shm._host_token()}-{dead}-deadbeef")
    open(stale, "wb").close()
    open(stale + ".bell", "wb").close()
    try:
        assert run_world(stale_is_cleaned, 2, stale) == [False, False]
        assert not os.path.exists(stale + ".bell")
    finally:
        for p in (stale, stale + ".bell"):
            if os.path.exists(p):
                os.unlink(p)


def full_shm(rank, n, required):
    if rank == 1:
        def no_space(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate = no_space     # this rank's /dev/shm is full
    lines = []
    try:
        t, local = shm.connect(rank, local_pids(), allgather, required=required, warn=lines.append)
    except shm.SetupFailed as exc:
        return "error", str(exc)
    return (t is None, local, lines, files_of(allgather(os.getpid())))


def test_a_full_dev_shm_falls_back_to_gloo_with_one_warning():
    results = run_world(full_shm, 3, False)
    for gloo, local, lines, left in results:
        assert gloo and local == () and left == []
        assert len(lines) == 1 and "group rank 1" in lines[0] and "No space left" in lines[0], lines


def test_a_full_dev_shm_is_a_clear_error_on_every_rank_when_shm_is_required():
    results = run_world(full_shm, 3, True)
    for kind, text in results:
        assert kind == "error"
        assert "group rank 1" in text and "No space left" in text and "COLLECTIVES_TRANSPORT" in text


def test_cost_counts_pieces():
    assert shm.cost(0)["pieces"] == 1
    assert shm.cost(16 << 20, capacity=2 << 20, direct_min=None) == {
        "copies": 2, "bytes_copied": 32 << 20, "pieces": 9, "syscalls": 17}
    assert shm.cost(16 << 20, direct_min=1 << 20) == {"copies": 1, "bytes_copied": 16 << 20,
                                                      "pieces": 1, "syscalls": 3}
    # pipelined (a core per rank): one more ring per pass through the ring longer than a piece
    assert shm.cost(16 << 20, direct_min=None, pipelined=True)["syscalls"] == 17 + 8
    assert shm.cost(shm.PIECE, direct_min=None, pipelined=True)["syscalls"] == 1
    assert shm.cost(shm.PIECE + 1, direct_min=None, pipelined=True)["syscalls"] == 2
