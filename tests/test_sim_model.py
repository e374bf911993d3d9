"""The simulator's network model against its formulas (``collectives/sim/topology.py``,
``collectives/sim/network.py``): LogGP's L, o, g, G for one message and a train of
messages, alpha-beta as its special case (g = o = 0), and max-min fair sharing of links.

Each schedule here is a handful of point-to-point messages whose times have a closed form
under the model's definition; nothing is fitted or recorded from a run.
"""
import pytest
import torch

from collectives.sim import simulate
from collectives.sim.topology import PRESETS, build, validate

K = 1000                       # bytes of one message of a train
B = 1e9                        # bytes/s of every link of the flat switch (G = 1 ns/B)


def flat(**figures):
    return dict({"kind": "flat", "alpha": 0.0, "bandwidth": B, "gamma": 0.0, "name": "flat"}, **figures)


def train(m):
    """Rank 0 posts m messages of tensor's m pieces to rank 1 at once; rank 1 posts their m
    receives at once."""
    def fn(comm, tensor, op):
        pieces = tensor.chunk(m)
        if comm.rank == 0:
            comm.post(0, sends=[(p, 1) for p in pieces]).wait()
        elif comm.rank == 1:
            comm.post(0, recvs=[(torch.empty_like(p), 0) for p in pieces]).wait()
    return fn


def loggp_train(m, k, L, o, g, G):
    """LogGP's time for m messages of k bytes posted at once, as the simulator defines it:
    message i is posted at (i + 1) o and starts no sooner than g after message i - 1, then
    flows after L; one link carries them, so the last byte lands when the link has carried
    every byte that started before it (fluid bytes: k G, not LogGP's (k - 1) G)."""
    h = max(o, g)
    return o + L + max(m * k * G, (m - 1) * h + k * G)


@pytest.mark.parametrize("L, o, g, k", [
    (5e-6, 1e-6, 3e-6, K),          # the gap sets the pace: (m-1) g + k G
    (5e-6, 1e-6, 3e-6, 10 * K),     # the bytes set it: m k G
    (5e-6, 4e-6, 1e-6, K),          # the overhead sets it: (m-1) o + k G
    (2e-6, 0.0, 0.0, K),            # alpha-beta: every message's alpha overlaps the others'
])
@pytest.mark.parametrize("m", [1, 4])
def test_a_message_and_a_train_cost_what_loggp_says(m, L, o, g, k):
    spec = flat(alpha=L, overhead=o, gap=g)
    t = simulate("all_reduce", train(m), 2, m * k, spec, check=False).time
    assert t == pytest.approx(loggp_train(m, k, L, o, g, 1 / B), rel=1e-12)


def test_without_a_gap_the_gap_is_alpha_as_before():
    """No ``gap``: a rank starts one message per alpha, the simulator's model before LogGP."""
    t = simulate("all_reduce", train(4), 2, 4 * K, flat(alpha=5e-6), check=False).time
    assert t == pytest.approx(loggp_train(4, K, 5e-6, 0.0, 5e-6, 1 / B), rel=1e-12)


def test_alpha_beta_model_drops_gap_and_overhead():
    spec = flat(alpha=5e-6, overhead=2e-6, gap=7e-6, model="alpha-beta")
    t = simulate("all_reduce", train(4), 2, 4 * K, spec, check=False).time
    assert t == pytest.approx(loggp_train(4, K, 5e-6, 0.0, 0.0, 1 / B), rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 64])
def test_linear_broadcast_in_alpha_beta_is_one_alpha_and_the_roots_bytes(n):
    """The issue's case: with o = g = 0 the root's N-1 messages overlap their latencies, and its
    uplink carries (N-1) S, as SimGrid's alpha-beta model times it. With g = alpha (the default)
    the root starts one message per alpha."""
    S, alpha = 4096, 10e-6
    ab = simulate("broadcast", "linear", n, S, flat(alpha=alpha, bandwidth=12.5e9, model="alpha-beta")).time
    assert ab == pytest.approx(alpha + (n - 1) * S / 12.5e9, rel=1e-12)
    serial = simulate("broadcast", "linear", n, S, flat(alpha=alpha, bandwidth=12.5e9)).time
    assert serial >= (n - 1) * alpha


def test_intra_gap_applies_inside_a_node_only():
    spec = {"kind": "nodes", "ranks_per_node": 2, "nic": "rank", "intra_alpha": 1e-6, "intra_bandwidth": B,
            "alpha": 4e-6, "bandwidth": B, "gamma": 0.0, "gap": 9e-6, "intra_gap": 0.5e-6}
    fabric = build(validate(spec), 4)
    assert fabric.gap_of(0, 1, 1e-6) == 0.5e-6 and fabric.gap_of(0, 2, 4e-6) == 9e-6
    inside = simulate("all_reduce", train(4), 2, 4 * K, spec, check=False).time
    assert inside == pytest.approx(loggp_train(4, K, 1e-6, 0.0, 0.5e-6, 1 / B), rel=1e-12)


def test_intra_overhead_applies_inside_a_node_only():
    """NCCL posts a network message from its CPU proxy (o) and an NVLink one from the GPU kernel:
    ``intra_overhead`` is o for a message inside a node, ``overhead`` stays o between nodes."""
    spec = {"kind": "nodes", "ranks_per_node": 2, "nic": "rank", "intra_alpha": 1e-6, "intra_bandwidth": B,
            "alpha": 4e-6, "bandwidth": B, "gamma": 0.0, "gap": 9e-6, "intra_gap": 0.5e-6,
            "overhead": 3e-6, "intra_overhead": 0.0}
    fabric = build(validate(spec), 4)
    assert fabric.overhead_of(0, 1) == 0.0 and fabric.overhead_of(0, 2) == 3e-6
    inside = simulate("all_reduce", train(4), 2, 4 * K, spec, check=False).time
    assert inside == pytest.approx(loggp_train(4, K, 1e-6, 0.0, 0.5e-6, 1 / B), rel=1e-12)
    without = dict(spec)
    del without["intra_overhead"]
    assert simulate("all_reduce", train(4), 2, 4 * K, without, check=False).time > inside
    ab = simulate("all_reduce", train(4), 2, 4 * K, dict(spec, model="alpha-beta"), check=False).time
    assert build(validate(dict(spec, model="alpha-beta")), 4).intra_overhead is None and ab <= inside


@pytest.mark.parametrize("change, message", [
    ({"gap": -1e-6}, "gap must be a non-negative number"),
    ({"intra_overhead": 1e-6}, "intra_overhead is for a topology with nodes"),
    ({"gap": "x"}, "gap must be"),
    ({"intra_gap": 1e-6}, "intra_gap is for a topology with nodes"),
    ({"model": "logp"}, "model must be one of loggp, alpha-beta"),
])
def test_bad_model_figures_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        validate(flat(**change))


# ------------------------------------------------------------- max-min fair sharing

def flows(pairs, sizes=None):
    """Every rank posts its sends and receives of ``pairs`` [(src, dst), ...] at once; message i
    carries ``sizes[i]`` elements of the tensor (all of it by default)."""
    def fn(comm, tensor, op):
        sends, recvs = [], []
        for i, (src, dst) in enumerate(pairs):
            piece = tensor[:sizes[i]] if sizes else tensor
            if comm.rank == src:
                sends.append((piece, dst))
            if comm.rank == dst:
                recvs.append((torch.empty_like(piece), src))
        comm.post(0, sends=sends, recvs=recvs).wait()
    return fn


def ends(spec, n, pairs, nbytes, sizes=None):
    r = simulate("all_reduce", flows(pairs, sizes), n, nbytes, spec, check=False)
    return [x["time"] for x in r.ranks]


def test_two_flows_on_one_link_get_half_each():
    S = 1 << 20
    t = ends(flat(), 3, [(0, 1), (2, 1)], S)                  # both into rank 1's downlink
    assert t[1] == pytest.approx(2 * S / B, rel=1e-12)


def test_a_flow_that_ends_gives_its_share_back():
    S = 1 << 20                                                # 0 -> 1: S; 2 -> 1: 3 S
    t = ends(flat(), 3, [(0, 1), (2, 1)], 3 * S, sizes=[S // 4, 3 * S // 4])
    assert t[0] == pytest.approx(2 * S / B, rel=1e-12)        # half the link until its S is in
    assert t[2] == pytest.approx(4 * S / B, rel=1e-12)        # then the whole link: 4 S in all


def test_a_flow_held_back_elsewhere_leaves_its_share_to_the_others():
    """Three flows over two links where the two differ: a (0 -> 1) and b (0 -> 3) share rank 0's
    access link X (capacity B); b and c (2 -> 4) share leaf 0's uplink Y (3 B / 6 = B / 2). Y is
    the bottleneck: b and c get B / 4 each, and a gets what b leaves of X, 3 B / 4 (the share of
    each link by its flow count would give a only B / 2 and leave B / 4 of X idle)."""
    spec = {"kind": "fat_tree", "ranks_per_leaf": 3, "oversubscription": 6, "alpha": 0.0, "bandwidth": B,
            "gamma": 0.0, "name": "tree"}
    S = 1 << 20
    t = ends(spec, 6, [(0, 1), (0, 3), (2, 4)], S)
    assert t[1] == pytest.approx(S / (0.75 * B), rel=1e-12)   # a
    assert t[3] == pytest.approx(S / (0.25 * B), rel=1e-12)   # b: still B / 4 once a is done
    assert t[4] == pytest.approx(S / (0.25 * B), rel=1e-12)   # c


def test_a_chain_of_links_passes_a_change_on():
    """b (2 -> 1) shares rank 1's downlink X with a (0 -> 1) and a' (3 -> 1), and rank 2's uplink
    Y with c (2 -> 4). X holds b to B/3, so c gets the rest of Y, 2 B/3. When a and a' end, b
    rises to B/2 on Y, so c must fall to B/2, though c shares no link with a or a'."""
    S = 1 << 20
    q = S // 4                                    # elements: S bytes
    t = ends(flat(), 5, [(0, 1), (3, 1), (2, 1), (2, 4)], S, sizes=[q // 4, q // 4, q, q])
    # a, a' (S/4 each) end at 3S/(4B); by then c has S/2 in, and the rest at B/2 takes S/B
    assert t[0] == pytest.approx(3 * S / (4 * B), rel=1e-12)
    assert t[4] == pytest.approx(7 * S / (4 * B), rel=1e-12)
    assert t[2] == pytest.approx(2 * S / B, rel=1e-12)        # Y busy at B throughout: 2 S


# ------------------------------------------------------------- the command

def test_cli_model_and_gap(capsys):
    """--model alpha-beta times the linear broadcast as alpha + (N-1) S/B; --gap sets g."""
    from collectives.sim.cli import main
    argv = ["--collective", "broadcast", "--algorithm", "linear", "--world-size", "8", "-b", "4K", "-e", "4K"]

    def time_of(*extra):
        assert main(argv + list(extra)) == 0
        out = capsys.readouterr().out
        return out, float(next(line for line in out.splitlines() if " linear " in line).split()[4])

    out, ab = time_of("--model", "alpha-beta")
    assert "alpha-beta" in out.splitlines()[0]
    assert ab == pytest.approx((10e-6 + 7 * 4096 / 12.5e9) * 1e6, abs=0.005)   # printed to 0.01 us
    _, gap = time_of("--gap", "5e-6")
    # the root posts its 7 sends at once, the first out after o (the preset's overhead, 3 us);
    # then it starts a message each 5 us (g, more than o): the last starts at o + 6 * 5 us; the
    # links are never the limit (4096 B take 0.33 us, less than g), so it lands alpha + S/B later
    o = PRESETS["ethernet-100g"]["overhead"]
    assert o < 5e-6
    assert gap == pytest.approx((o + 6 * 5e-6 + 10e-6 + 4096 / 12.5e9) * 1e6, abs=0.005)


@pytest.mark.parametrize("argv, words", [(["--gap", "-1"], "gap must be a non-negative number"),
                                         (["--topology", "h100-cluster", "--gap", "nan"], "gap must be")])
def test_cli_bad_gap_is_refused_before_anything_runs(capsys, argv, words):
    from collectives.sim.cli import main
    assert main(["--world-size", "4", "-b", "4K", "-e", "4K"] + argv) == 2
    out, err = capsys.readouterr()
    assert words in err and out == ""


def test_cli_unknown_model_is_refused(capsys):
    from collectives.sim.cli import main
    with pytest.raises(SystemExit) as info:
        main(["--model", "logp"])
    assert info.value.code == 2


# ------------------------------------------------------------- the presets

@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_states_loggp_figures_with_their_source(name):
    """Issue 34, item 1: every preset (``local`` is calibrated, not a preset) states all four
    LogGP figures, L (alpha; intra_alpha inside a node), o (overhead), g (gap; intra_gap
    inside a node) and G (1 / bandwidth), and its ``source`` text names each."""
    spec = validate(dict(PRESETS[name], name=name))
    fields = ["alpha", "overhead", "gap", "bandwidth"]
    if "intra_alpha" in spec:
        fields += ["intra_alpha", "intra_gap", "intra_bandwidth"]
    for field in fields:
        value = spec.get(field)
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, (name, field)
    text = spec["source"]
    for word in ("alpha", "overhead", "gap") + (("intra_gap",) if "intra_alpha" in spec else ()) \
            + (("intra_overhead",) if "intra_overhead" in spec else ()):
        assert word in text, (name, word)
    fabric = build(spec, 16 if spec["kind"] != "torus" else 64)
    assert fabric.overhead == spec["overhead"] and fabric.gap == spec["gap"]
