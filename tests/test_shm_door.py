"""The shared-memory transport under the door: every collective on it, set up once per group.

``COLLECTIVES_TRANSPORT=shm`` (setup failing is an error, not a fallback), results compared
with torch's built-in on the same ranks, sizes 0, fewer elements than ranks and larger than a
mailbox; a rank SIGKILLed after setup is named by the door within the timeout; the torch
backend's groups use it too; a lab host (another network namespace) is another host.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import p2p_api, settings, shm
from collectives.tuning import agreed
from tests.test_shm import survivor_of_sigkill
from tests.worlds import run_world

SHM = {"COLLECTIVES_TRANSPORT": "shm"}


def count_setups():
    """Count inbox files made in this process (one per group set up)."""
    real = os.posix_fallocate
    made = []

    def counting(fd, offset, length):
        made.append(length)
        return real(fd, offset, length)
    os.posix_fallocate = counting
    return made


def every_collective(rank, n):
    made = count_setups()
    wrong = []
    big = shm.DEFAULT_CAPACITY // 4 + 1000         # floats: more bytes than one mailbox
    for numel in (0, max(n - 1, 1), 1000, big):
        for algo in (None, "ring", "recursive_doubling", "tree"):
            x = torch.arange(numel, dtype=torch.float64) * (rank + 1)
            want = x.clone()
            dist.all_reduce(want)
            collectives.all_reduce(x, algorithm=algo)
            if not torch.equal(x, want):
                wrong.append(("all_reduce", algo, numel))
        x = torch.arange(numel, dtype=torch.float32) + rank
        want = x.clone()
        dist.broadcast(want, src=n - 1)
        collectives.broadcast(x, src=n - 1)
        if not torch.equal(x, want):
            wrong.append(("broadcast", numel))
        mine = torch.full((numel,), float(rank))
        got = [torch.empty(numel) for _ in range(n)]
        collectives.all_gather(got, mine)
        if not all(torch.equal(g, torch.full((numel,), float(r))) for r, g in enumerate(got)):
            wrong.append(("all_gather", numel))
        ins = [torch.full((numel,), float(100 * rank + r)) for r in range(n)]
        outs = [torch.empty(numel) for _ in range(n)]
        collectives.all_to_all(outs, ins)
        if not all(torch.equal(o, torch.full((numel,), float(100 * r + rank))) for r, o in enumerate(outs)):
            wrong.append(("all_to_all", numel))
    collectives.barrier()
    return wrong, len(made)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_collective_on_shared_memory_matches_torch_and_sets_up_once(n):
    for wrong, setups in run_world(every_collective, n, env=SHM, timeout=200):
        assert wrong == []
        assert setups == 1     # the world group: one inbox, made at its first call


def one_world_of_one(rank, n):
    x = torch.ones(3)
    collectives.all_reduce(x)
    return x.tolist()


def test_a_world_of_one_sends_nothing():
    assert run_world(one_world_of_one, 1, env=SHM) == [[1.0, 1.0, 1.0]]


def killed_after_setup(rank, n):
    x = torch.ones(1 << 16)
    collectives.all_reduce(x, algorithm="ring")       # the group's shared memory is set up
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        collectives.all_reduce(x, algorithm="ring")
        text = "returned"
    except collectives.CollectiveError as exc:
        text = str(exc)
    return time.monotonic() - start, text


@pytest.mark.parametrize("direct_min", ["off", "64K"])
def test_a_rank_killed_is_named_by_the_door_well_within_the_timeout(direct_min):
    # 64K: the ring's messages (85 kB at N=3) are read from the sender's memory
    os.environ["COLLECTIVES_TRANSPORT"] = "shm"       # the spawned ranks inherit it
    os.environ["COLLECTIVES_SHM_DIRECT_MIN"] = direct_min
    try:
        elapsed, text = survivor_of_sigkill(killed_after_setup, 3)
    finally:
        del os.environ["COLLECTIVES_TRANSPORT"]
        del os.environ["COLLECTIVES_SHM_DIRECT_MIN"]
    assert elapsed < 10, (elapsed, text)      # COLLECTIVES_TIMEOUT is 300 (the default) here
    # rank 0 waits on rank 2, which lost rank 1: the door names rank 1 either way
    assert "rank 1 of the group [0, 1, 2] died" in text and "all_reduce" in text, text


def backend_world(rank, n):
    from collectives import p2p_communications
    made = count_setups()
    x = torch.full((5,), float(rank))
    dist.all_reduce(x)          # on backend "collectives": our algorithms, our door
    dist.all_reduce(x)
    # the group agreed (hosts, pids) when it was created, over gloo; its first collective set
    # the mailboxes up, from that agreement, and the second found them made
    found = list(p2p_communications._shm_of.values()) + [v for _, v in p2p_communications._shm_of_ids.values()]
    return x.tolist(), len(made), sum(shm is not None and len(peers) == n - 1 for shm, peers in found)


def test_the_torch_backend_uses_shared_memory():
    out = run_world(backend_world, 3, env=SHM, backend="collectives")
    for values, setups, groups_on_shm in out:
        assert values == [9.0] * 5
        assert setups == 1 and groups_on_shm >= 1


def direct_reads(rank, n):
    from collectives.p2p_communications import Comm, shm_transport
    x = torch.arange(300_000, dtype=torch.float32) + rank       # 1.2 MB, 600 kB per ring message
    collectives.all_reduce(x, algorithm="ring")
    want = sum(torch.arange(300_000, dtype=torch.float32) + r for r in range(n))
    transport, _ = shm_transport(Comm(None, "all_reduce", "probe"))     # the group's, set up by the call
    return transport.direct_min, torch.equal(x, want)


# unset or auto: one copy only where the host's ranks outnumber its cores (elsewhere a
# mailbox's two copies run side by side on two cores, and beat one read)
CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("value,n,direct_min", [
    (None, 2, None if CORES >= 2 else 4 << 20), ("auto", 3, None if CORES >= 3 else 4 << 20),
    ("off", 2, None), ("64K", 2, 65536), ("64K", 3, 65536)])
def test_the_direct_read_setting(value, n, direct_min):
    env = dict(SHM, **({"COLLECTIVES_SHM_DIRECT_MIN": value} if value else {}))
    assert run_world(direct_reads, n, env=env) == [(direct_min, True)] * n


def test_the_direct_read_setting_refuses_nonsense():
    for bad in ("-1", "0", "lots", "1.5M"):
        os.environ["COLLECTIVES_SHM_DIRECT_MIN"] = bad
        try:
            with pytest.raises(ValueError, match="COLLECTIVES_SHM_DIRECT_MIN=.*positive size in bytes"):
                settings.shm_direct_min()
        finally:
            del os.environ["COLLECTIVES_SHM_DIRECT_MIN"]
    assert settings.shm_direct_min() == "auto"


def test_the_setting():
    os.environ["COLLECTIVES_TRANSPORT"] = "carrier-pigeon"
    try:
        with pytest.raises(ValueError, match="COLLECTIVES_TRANSPORT='carrier-pigeon'.*gloo, shm, auto"):
            settings.transport()
    finally:
        del os.environ["COLLECTIVES_TRANSPORT"]
    saved = os.environ.pop("COLLECTIVES_TRANSPORT", None)
    try:
        assert settings.transport() == "auto"     # shared memory where it can be set up
    finally:
        if saved is not None:
            os.environ["COLLECTIVES_TRANSPORT"] = saved


def test_another_network_namespace_is_another_host():
    # a lab host is a network namespace: unshare(1) makes one, as the lab does
    code = "from collectives.tuning import agreed; print(agreed.host_identity())"
    try:
        inside = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True,
                                text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    except (FileNotFoundError, subprocess.TimeoutExpired):
        pytest.skip("no unshare here")
    if inside.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {inside.stderr.strip()[-200:]}")
    assert inside.stdout.strip() != agreed.host_identity()
    assert inside.stdout.split("/")[0] == agreed.host_identity().split("/")[0]   # same machine


def two_hosts(rank, split):
    """Ranks below ``split`` on one pretend host, the rest on another (before the first call):
    pairs on one host take shared memory, pairs across the two take gloo, as in a lab."""
    agreed.host_identity = lambda: "host-a" if rank < split else "host-b"


def gloo_wait_with_shm_in_flight(rank, n):
    # ranks 0, 1 share a host; 2 is another. Rank 0 posts a shared-memory send larger than a
    # mailbox, then blocks on a gloo receive from rank 2, which comes only after rank 1 has the
    # whole message. On gloo alone (its sends move on their own) this completes; the send's
    # later pieces must move while rank 0 waits on the other transport.
    from collectives.p2p_communications import Comm
    two_hosts(rank, 2)
    collectives.barrier()                                   # agreement and mailboxes, once
    comm = Comm(None, "all_reduce", "mixed", seq=1)
    big = torch.arange(3 * shm.DEFAULT_CAPACITY // 4, dtype=torch.float32)   # 3 mailboxes' worth
    token = torch.zeros(1)
    if rank == 0:
        sending = comm.post(1, sends=[(big, 1)])
        comm.exchange(2, recvs=[(token, 2)])
        sending.wait()
        return token.item()
    if rank == 1:
        got = torch.empty_like(big)
        comm.exchange(1, recvs=[(got, 0)])
        comm.exchange(3, sends=[(torch.tensor([float(torch.equal(got, big))]), 2)])
        return float(comm.shm is not None and 0 in comm.shm_peers)
    comm.exchange(3, recvs=[(token, 1)])
    comm.exchange(2, sends=[(token, 0)])
    return float(comm.shm is None or 0 not in comm.shm_peers)


def test_a_rank_waiting_on_gloo_keeps_its_shared_memory_messages_moving():
    # the lab's chapter-15 demo hung this way in CI (hierarchical all_reduce, 2 hosts x 2 ranks)
    assert run_world(gloo_wait_with_shm_in_flight, 3, env={**SHM, "COLLECTIVES_TIMEOUT": "20"},
                     timeout=120) == [1.0, 1.0, 1.0]


def hierarchical_on_two_hosts(rank, n, numel):
    two_hosts(rank, n // 2)
    x = (torch.arange(numel) % 1000).float() * (rank + 1)       # sums exact in float32
    want = (torch.arange(numel) % 1000).float() * (n * (n + 1) // 2)
    wrong = []
    for algorithm in ("hierarchical", "ring", "ring_pipelined", "rabenseifner"):
        for _ in range(3):
            y = x.clone()
            collectives.all_reduce(y, algorithm=algorithm)
            if not torch.equal(y, want):
                wrong.append(algorithm)
    return wrong


@pytest.mark.parametrize("n", [4])
def test_algorithms_that_post_ahead_complete_across_two_transports(n):
    numel = 4 * shm.DEFAULT_CAPACITY // 4 * n          # several mailboxes' worth per rank
    env = {**SHM, "COLLECTIVES_TIMEOUT": "30", "LOCAL_WORLD_SIZE": str(n // 2)}
    assert run_world(hierarchical_on_two_hosts, n, numel, env=env, timeout=200) == [[]] * n


def count_shm_sends():
    """Count the messages this process sends through shared memory (their sizes, in order)."""
    real = shm.ShmTransport.send
    sent = []

    def counting(self, tensors, peer, tag):
        sent.append(tensors[0].nbytes)
        return real(self, tensors, peer, tag)
    shm.ShmTransport.send = counting
    return sent


def point_to_point_on_shared_memory(rank, n):
    sent_here = count_shm_sends()
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    wrong = []

    def ring(tag):
        # 0 elements (no message), 1, 1,000, more than one mailbox holds (streams in pieces)
        for numel in (0, 1, 1000, shm.DEFAULT_CAPACITY // 4 + 1000):
            out = torch.arange(numel, dtype=torch.float32) + 1000 * rank
            got = torch.empty(numel)
            for work in [p2p_api.isend(out, nxt, tag=tag), p2p_api.irecv(got, prv, tag=tag)]:
                work.wait()
            if not torch.equal(got, torch.arange(numel, dtype=torch.float32) + 1000 * prv):
                wrong.append((tag, numel))

    ring(tag=1)             # no collective yet, so no mailboxes: every message over gloo
    before = len(sent_here)
    early = torch.empty(3)
    if rank == 1:           # posted before the group's mailboxes exist, its sender sends after: gloo
        waiting = p2p_api.irecv(early, 0, tag=3)
    collectives.all_reduce(torch.ones(1))       # the group's agreement and mailboxes
    setup = len(sent_here)
    if rank == 0:
        p2p_api.send(torch.tensor([7.0, 8.0, 9.0]), 1, tag=3)
    if rank == 1:
        waiting.wait()
        if early.tolist() != [7.0, 8.0, 9.0]:
            wrong.append(("early", early.tolist()))
    ring(tag=2)             # a new lane: its two ends compare at its first message with bytes
    new_lane = len(sent_here) - setup
    ring(tag=1)             # the first lane's 5th-8th messages
    old_lane = len(sent_here) - setup - new_lane
    os.environ["COLLECTIVES_TRANSPORT"] = "gloo"     # read at every message, as by a collective
    mark = len(sent_here)
    ring(tag=2)
    told_gloo = len(sent_here) - mark
    os.environ["COLLECTIVES_TRANSPORT"] = "shm"
    with collectives.count_traffic() as counted:
        ring(tag=4)
    sizes = 4 * (1 + 1000 + shm.DEFAULT_CAPACITY // 4 + 1000)
    return wrong, before, new_lane, old_lane, told_gloo, counted.sent_bytes, sizes


def test_point_to_point_messages_take_shared_memory_once_the_group_has_it():
    # Both ends of a direction must pick the same transport for each message, though one end
    # may set the group's mailboxes up before the other looks: they compare (one byte each way
    # over gloo) at the first message with bytes of a lane and, while not both ready, again at
    # its 2nd, 4th, 8th, ... message, and move to shared memory together.
    for wrong, before, new_lane, old_lane, told_gloo, sent, sizes in run_world(
            point_to_point_on_shared_memory, 3, env={**SHM, "COLLECTIVES_TIMEOUT": "60"}, timeout=200):
        assert wrong == []
        assert before == 0            # no mailboxes before the group's first collective
        assert new_lane == 3          # the three messages with bytes, all through shared memory
        # tag 1 compared at its 2nd and 4th messages (1st empty), before the collective, and
        # at its 8th, after it: from there on shared memory
        assert old_lane == 1
        assert told_gloo == 0         # COLLECTIVES_TRANSPORT=gloo: a lane on shared memory leaves it
        assert sent == sizes          # the comparisons are not the program's traffic


def pipeline_on_shared_memory(rank, n):
    import torch.nn as nn
    from collectives.parallel.pipeline import PipelineStage
    through_shm = count_shm_sends()
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(16, 16), recv_shape=(4, 16))     # its barrier sets the mailboxes up
    m = 4
    x, t = [torch.randn(4, 16) for _ in range(m)], [torch.randn(4, 16) for _ in range(m)]
    counts = []
    for _ in range(2):
        before = len(through_shm)
        with collectives.count_traffic() as counted:
            stage.step(m, x if stage.first else None, t if stage.last else None, nn.functional.mse_loss)
        counts.append((len(through_shm) - before, counted.sent_messages))
    return counts


def test_a_pipelines_activations_and_gradients_take_shared_memory():
    # every message a stage sends in a step (activations, gradients, the step's check headers)
    # goes through the group's mailboxes: its lanes compare at their first message and find
    # them, made by the barrier of the stages' construction
    for counts in run_world(pipeline_on_shared_memory, 3, env=SHM, timeout=200):
        assert all(on_shm == sent and sent > 0 for on_shm, sent in counts)


def killed_mid_point_to_point(rank, n):
    collectives.all_reduce(torch.ones(4))                 # the group's mailboxes
    p2p_api.send(torch.ones(4), 0, tag=9) if rank == 1 else p2p_api.recv(torch.empty(4), 1, tag=9)
    # a mailbox and a half (below the direct reads' 4 MiB): it streams through the mailbox
    big = torch.ones(3 * shm.DEFAULT_CAPACITY // 2 // 4)
    if rank == 1:                                         # the lane is on shared memory now
        p2p_api.isend(big, 0, tag=9)
        time.sleep(0.3)                                   # a mailbox full, the rest waits for room
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.6)                                       # rank 1 is gone by the time we read
    start = time.monotonic()
    try:
        p2p_api.recv(torch.empty_like(big), 1, tag=9)
        text = "returned"
    except collectives.CollectiveError as exc:
        text = str(exc)
    return time.monotonic() - start, text


def test_a_rank_killed_mid_point_to_point_is_named_well_within_the_timeout():
    os.environ["COLLECTIVES_TRANSPORT"] = "shm"           # the spawned ranks inherit it
    try:
        elapsed, text = survivor_of_sigkill(killed_mid_point_to_point, 2)
    finally:
        del os.environ["COLLECTIVES_TRANSPORT"]
    assert elapsed < 10, (elapsed, text)                  # COLLECTIVES_TIMEOUT is 300 here
    assert "rank 1 of the group [0, 1] died" in text and "send_recv" in text, text


def absent_at_setup(rank, n):
    # the backend agreed when the group was made; its first collective sets the mailboxes up,
    # and rank 2 never comes to it
    if rank == 2:
        time.sleep(10)
        return []
    try:
        dist.all_reduce(torch.ones(4))
    except Exception:
        pass
    return [f for f in os.listdir("/dev/shm") if f"-{os.getpid()}-" in f]


def test_a_setup_that_times_out_leaves_no_file_behind():
    left = run_world(absent_at_setup, 3, env={**SHM, "COLLECTIVES_TIMEOUT": "3"}, backend="collectives",
                     timeout=120)
    assert left == [[], [], []]
