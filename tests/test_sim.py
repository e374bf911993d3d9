"""The simulator (``collectives.sim``): the proof at every N, deadlocks found, the one cost model.

Every registered algorithm runs, unchanged, on N = 1..33, 64 and 128 virtual ranks (every
root of the rooted collectives), on real tensors, under rendezvous semantics (a send
completes only when its receive is posted, as in NCCL). Each case must

* finish: the schedule cannot deadlock for that N, root and size;
* give every rank the closed-form result;
* move exactly the traffic its ``cost()`` states (messages, bytes sent and received,
  steps, bytes on the critical path, bytes reduced), counted from the messages the
  simulator hands to ``collectives.trace()``, as tests/test_traffic.py counts the
  real door's at N <= 6.

Sizes (elements per tensor, or per rank's piece) cycle through 0, 1, 7 and 1000: empty,
fewer elements than ranks, uneven pieces (all_to_all at 128 ranks: not 1000, see
``sizes_at``). Large sizes (segments, Rabenseifner's blocks)
run on ``meta`` tensors, where only the traffic is checked.
"""
import json
import random

import pytest
import torch

from collectives import observers
from collectives.algorithms import ALGORITHMS, cost
from collectives.sim import Deadlock, SimulationError, simulate
from collectives.sim.collective import PIECES, ROOTED
from collectives.tools import perfetto
from collectives.tuning import cost_model

ELEM = 4
SIZES = (0, 1, 7, 1000)
WORLDS = list(range(1, 34)) + [64, 128]
LARGE = (1 << 18, 1_300_001)
CASES = [(c, a) for c, names in ALGORITHMS.items() for a in names]


def nbytes(collective, n, e):
    if collective == "barrier":
        return 0
    return e * ELEM * (n if collective in PIECES else 1)


def busiest(messages, n):
    """The figures ``cost`` states, from every rank's traced messages."""
    sent, recv, sent_b, recv_b = [0] * n, [0] * n, [0] * n, [0] * n
    largest = {}
    for m in messages:
        if m.kind == "send":
            sent[m.src] += 1
            sent_b[m.src] += m.nbytes
            largest[m.step] = max(largest.get(m.step, 0), m.nbytes)
        else:
            recv[m.dst] += 1
            recv_b[m.dst] += m.nbytes
    return dict(steps=len(largest), messages=max(max(a, b) for a, b in zip(sent, recv)),
                sent_bytes=max(sent_b), recv_bytes=max(recv_b), critical_bytes=sum(largest.values()))


def check_case(collective, algorithm, n, e, root=0, device="cpu"):
    with observers.trace() as records:
        r = simulate(collective, algorithm, n, nbytes(collective, n, e), root=root, device=device,
                     topology="ethernet-100g")
    where = f"{collective}/{algorithm} N={n} root={root} elements={e}"
    assert r.wrong is None, f"{where}: rank, output, element, got, want = {r.wrong}"
    want = cost(collective, algorithm, n, r.bytes, ELEM)
    got = busiest(records.messages, n)
    got["reduced_bytes"] = max(x["reduced_bytes"] for x in r.ranks)
    assert got == {k: getattr(want, k) for k in got}, where
    assert len(records.calls) == n


@pytest.mark.slow
@pytest.mark.parametrize("collective,algorithm", CASES)
def test_every_n_every_root_finishes_exactly_with_the_stated_traffic(collective, algorithm):
    torch.manual_seed(0)
    for n in WORLDS:
        if collective in ROOTED:
            for i, root in enumerate(range(n)):
                check_case(collective, algorithm, n, SIZES[(n + i) % len(SIZES)], root)
        else:
            for e in sizes_at(collective, n):
                check_case(collective, algorithm, n, e)


def sizes_at(collective, n):
    """Every size, but for all_to_all at 128 ranks not the 1,000-element pieces: there the
    N(N-1) messages overlap on the wires and are shared max-min at every event, minutes of
    CPU (4,000-byte pieces; 1 and 7 elements finish before the next is posted, seconds), and
    the uneven pieces run the same schedule through the same code."""
    return SIZES[:3] if collective == "all_to_all" and n >= 128 else SIZES


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast"])
def test_large_sizes_on_meta_tensors_move_the_stated_traffic(collective):
    for algorithm in ALGORITHMS[collective]:
        for n in (2, 3, 6, 33):
            for e in LARGE:
                check_case(collective, algorithm, n, e, root=n - 1, device="meta")


def test_count_traffic_per_virtual_rank():
    n = 5
    counters = [observers.count_traffic(rank=r) for r in range(n)]
    opened = [c.__enter__() for c in counters]
    try:
        r = simulate("all_reduce", "ring", n, 4 * 1000, device="cpu")
    finally:
        for c in counters:
            c.__exit__(None, None, None)
    for rank, t in enumerate(opened):
        mine = r.ranks[rank]
        assert (t.sent_messages, t.sent_bytes, t.recv_messages, t.recv_bytes) == \
               (mine["sent_messages"], mine["sent_bytes"], mine["recv_messages"], mine["recv_bytes"])
        assert t.sent_messages == 2 * (n - 1) and t.rounds == 2 * (n - 1)


def test_trace_exports_to_perfetto_with_simulated_time(tmp_path):
    with observers.trace() as records:
        r = simulate("all_reduce", "tree", 6, 4096, topology="h100-cluster")
    path = tmp_path / "sim.json"
    perfetto.export_chrome_trace(records, str(path))
    obj = json.loads(path.read_text())
    perfetto.check_trace(obj)
    assert max(m.end for m in records.messages) == pytest.approx(r.time)
    assert {e["pid"] for e in obj["traceEvents"] if e.get("ph") == "X"} == set(range(6))


# ---------------------------------------------------------------- deadlocks

def blocking_pairs(seed):
    """A schedule that deadlocks: random pairs in which both partners send before receiving."""
    def all_reduce(comm, tensor, op):
        order = list(range(comm.size))
        random.Random(seed).shuffle(order)
        me = order.index(comm.rank)
        partner = order[me ^ 1] if (me ^ 1) < comm.size else None
        if partner is None:
            return
        inbox = torch.empty_like(tensor)
        comm.send(tensor, partner, 0)
        comm.recv(inbox, partner, 0)
        op.combine(tensor, inbox)
    return all_reduce


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_seeded_deadlock_is_reported_as_a_send_send_cycle(seed):
    with pytest.raises(Deadlock) as info:
        simulate("all_reduce", blocking_pairs(seed), 8, 64, device="cpu")
    d = info.value
    assert d.kind == "send-send"
    ranks = [r for r, _ in d.cycle]
    order = list(range(8))
    random.Random(seed).shuffle(order)
    me = order.index(ranks[0])
    assert sorted(ranks) == sorted([order[me], order[me ^ 1]])
    assert all(end.kind == "send" and end.step == 0 and end.nbytes == 64 for _, end in d.cycle)
    assert "send-send cycle" in str(d) and f"rank {ranks[0]}: all_reduce/all_reduce step 0 waits to send 64 B" in str(d)


def test_recv_recv_and_mixed_cycles():
    def ring_recv_first(comm, tensor, op):
        inbox = torch.empty_like(tensor)
        comm.recv(inbox, (comm.rank - 1) % comm.size, 3)
        comm.send(tensor, (comm.rank + 1) % comm.size, 3)
    with pytest.raises(Deadlock) as info:
        simulate("all_reduce", ring_recv_first, 5, 40, device="cpu")
    assert info.value.kind == "recv-recv" and len(info.value.cycle) == 5

    def mixed(comm, tensor, op):
        r, inbox = comm.rank, torch.empty_like(tensor)
        if r == 0:
            comm.send(tensor, 1, 0)
            comm.recv(inbox, 2, 0)
        elif r == 1:
            comm.recv(inbox, 2, 0)
            comm.recv(inbox, 0, 0)
        else:
            comm.send(tensor, 0, 0)
            comm.send(tensor, 1, 0)
    with pytest.raises(Deadlock) as info:
        simulate("all_reduce", mixed, 3, 8, device="cpu")
    assert info.value.kind == "mixed"
    assert [r for r, _ in info.value.cycle] == [0, 1, 2]


def test_a_size_mismatch_is_named():
    def wrong_size(comm, tensor, op):
        if comm.rank == 0:
            comm.send(tensor[:1], 1, 0)
        else:
            comm.recv(torch.empty_like(tensor), 0, 0)
    with pytest.raises(Deadlock) as info:
        simulate("all_reduce", wrong_size, 2, 16, device="cpu")
    text = str(info.value)
    assert "rank 0 posted the send with step 0 and 4 B" in text or "rank 1 posted the recv" in text


def test_a_rank_that_raises_is_named():
    def boom(comm, tensor, op):
        if comm.rank == 2:
            raise KeyError("no such thing")
        comm.sendrecv(tensor, comm.rank ^ 1, torch.empty_like(tensor), comm.rank ^ 1, 0)
    with pytest.raises(SimulationError, match="rank 2 of 4 raised KeyError"):
        simulate("all_reduce", boom, 4, 16, device="cpu")


def test_a_wrong_result_is_found():
    def off_by_one(comm, tensor, op):
        if comm.rank == 3:
            tensor[5] += 1
    r = simulate("all_reduce", off_by_one, 4, 4 * 10, device="cpu")
    assert r.wrong[:3] == (0, 0, 0)     # rank 0 never got the others' data at all


# ---------------------------------------------------------------- one model of cost

# Where a rank's messages go one after another, step by step, the simulator on an uncontended
# flat switch and the alpha-beta-gamma model (``collectives.tuning.cost_model``) are the same
# formula. They part where the model is a bound: linear roots (the simulator overlaps one
# message's latency with another's bytes), all_to_all linear (set-ups queue at both ends), and
# the pipelines (the pipelined ring and broadcast, NCCL's double binary tree and the
# hierarchical all_reduce, whose modules state their own overlapped time()), whose overlap
# the simulator plays out instead of assuming.
PIPELINED = ("ring_pipelined", "pipeline", "double_binary_tree", "hierarchical")
AGREE = [(c, a) for c, a in CASES if a not in ("linear",) + PIPELINED and c != "barrier"]


@pytest.mark.parametrize("collective,algorithm", AGREE)
def test_the_simulator_and_the_cost_model_agree(collective, algorithm):
    spec = {"kind": "flat", "alpha": 5e-6, "bandwidth": 10e9, "gamma": 2e-10, "name": "flat"}
    params = {"alpha": 5e-6, "beta": 1e-10, "gamma": 2e-10}
    for n, e in ((8, 4096), (6, 6 * 4096), (5, 5 * 64), (2, 2), (3, 3 << 18)):
        r = simulate(collective, algorithm, n, nbytes(collective, n, e), topology=spec)
        # the model counts bytes (item 1): sizes that split into whole elements alike
        want = cost_model.predict(collective, algorithm, n, r.bytes, params)
        assert r.time == pytest.approx(want, rel=1e-12, abs=0), f"N={n}, {e} elements"


def test_contention_shares_a_link():
    """Two ranks of one node sending off-node at once through one NIC take twice as long as one."""
    spec = {"kind": "nodes", "ranks_per_node": 2, "nic": "node", "intra_alpha": 0.0,
            "intra_bandwidth": 1e12, "alpha": 0.0, "bandwidth": 1e9, "gamma": 0.0}

    def pairs(comm, tensor, op):   # 0 -> 2 and 1 -> 3 cross between the two nodes at once
        if comm.rank < 2:
            comm.send(tensor, comm.rank + 2, 0)
        else:
            comm.recv(torch.empty_like(tensor), comm.rank - 2, 0)

    both = simulate("all_reduce", pairs, 4, 1 << 20, topology=spec, check=False)
    rail = simulate("all_reduce", pairs, 4, 1 << 20, topology=dict(spec, nic="rank"), check=False)
    assert both.time == pytest.approx(2 * (1 << 20) / 1e9)
    assert rail.time == pytest.approx((1 << 20) / 1e9)


# ---------------------------------------------------------------- the command

def run_cli(capsys, *argv):
    from collectives.sim.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_rows_json_and_trace(tmp_path, capsys):
    rows, trace = tmp_path / "rows.json", tmp_path / "trace.json"
    code, out, err = run_cli(capsys, "--collective", "all_reduce", "--algorithm", "ring,tree",
                             "--world-size", "4,33", "-b", "4K", "-e", "64K", "-f", "16",
                             "--topology", "h100-cluster", "--json", str(rows), "--trace", str(trace))
    assert code == 0, err
    got = json.loads(rows.read_text())
    assert len(got) == 2 * 2 * 2 and "fastest: " in out
    fields = {"collective", "algorithm", "world_size", "bytes", "time_us", "algbw", "busbw",
              "max_messages_sent", "max_bytes_sent"}
    assert all(fields <= set(r) for r in got)
    ring33 = [r for r in got if r["algorithm"] == "ring" and r["world_size"] == 33 and r["bytes"] == 4096][0]
    want = cost("all_reduce", "ring", 33, 4096, ELEM)
    assert (ring33["max_messages_sent"], ring33["max_bytes_sent"]) == (2 * 32, want.sent_bytes)
    assert ring33["busbw"] == pytest.approx(ring33["algbw"] * 2 * 32 / 33)
    perfetto.check_trace(str(trace))


@pytest.mark.parametrize("argv,words", [
    (["--topology", "nowhere"], "unknown topology 'nowhere'"),
    (["--algorithm", "ring,bogus"], "unknown algorithm 'bogus'"),
    (["--collective", "all_reduce_ish"], "unknown collective"),
    (["-b", "64K", "-e", "4K"], "is below -b"),
    (["--function", "missing.py:all_reduce"], "no file"),
    (["--collective", "broadcast", "--root", "9", "--world-size", "4"], "--root 9 is out of range"),
])
def test_cli_bad_input_is_refused_before_anything_runs(capsys, argv, words):
    code, out, err = run_cli(capsys, "--world-size", "4", "-b", "4K", "-e", "4K", *argv)
    assert code == 2 and words in err and out == ""


@pytest.mark.parametrize("argv", [["--world-size", "0"], ["-b", "4Q"]])
def test_cli_bad_numbers_are_refused(capsys, argv):
    with pytest.raises(SystemExit) as info:
        run_cli(capsys, *argv)
    assert info.value.code == 2


def test_cli_function_file(tmp_path, capsys):
    good = tmp_path / "mine.py"
    good.write_text("import torch\n"
                    "def all_reduce(comm, tensor, op):\n"
                    "    n, r = comm.size, comm.rank\n"
                    "    acc = tensor.clone()\n"
                    "    inbox = torch.empty_like(tensor)\n"
                    "    for k in range(1, n):\n"
                    "        comm.sendrecv(tensor, (r + k) % n, inbox, (r - k) % n, k)\n"
                    "        op.combine(acc, inbox)\n"
                    "    tensor.copy_(acc)\n"
                    "def wrong(comm, tensor, op):\n"
                    "    tensor.add_(1)\n"
                    "def blocking(comm, tensor, op):\n"
                    "    comm.send(tensor, (comm.rank + 1) % comm.size, 0)\n"
                    "    comm.recv(tensor, (comm.rank - 1) % comm.size, 0)\n"
                    "def two(comm, tensor):\n"
                    "    pass\n")
    code, out, err = run_cli(capsys, "--function", f"{good}:all_reduce", "--check", "--world-size", "1,5,12",
                             "-b", "64", "-e", "4K", "-f", "8")
    assert code == 0, err
    assert "every rank's result equals the closed form" in out
    code, out, err = run_cli(capsys, "--function", f"{good}:wrong", "-c", "1", "--world-size", "3",
                             "-b", "64", "-e", "64")
    assert code == 1 and "rank 0, output 0: element 0 is 2.0, expected 6.0" in err
    code, out, err = run_cli(capsys, "--function", f"{good}:blocking", "--world-size", "6", "-b", "64", "-e", "64")
    assert code == 3 and "send-send cycle: 0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 0" in err
    code, out, err = run_cli(capsys, "--function", f"{good}:two", "--world-size", "6", "-b", "64", "-e", "64")
    assert code == 2 and "does not take the arguments of the all_reduce algorithms" in err
    broken = tmp_path / "broken.py"
    broken.write_text("def all_reduce(comm, tensor, op):\n    return (\n")
    code, out, err = run_cli(capsys, "--function", str(broken), "--world-size", "2", "-b", "64", "-e", "64")
    assert code == 2 and "does not import: SyntaxError" in err


def test_topology_file(tmp_path):
    path = tmp_path / "two_level.json"
    path.write_text(json.dumps({"kind": "fat_tree", "ranks_per_leaf": 4, "oversubscription": 2,
                                "alpha": 1e-6, "bandwidth": 1e9, "gamma": 0}))
    r = simulate("all_to_all", "pairwise", 16, 16 * 1024, topology=str(path))
    assert r.time > 0
    path.write_text(json.dumps({"kind": "fat_tree", "alpha": 1e-6}))
    with pytest.raises(ValueError, match="needs 'bandwidth'"):
        simulate("all_reduce", "ring", 4, 64, topology=str(path))
