"""The planner (collectives/plan): its arithmetic against the chapters' formulas, its checks, its CLI.

* memory by kind: ZeRO's 2 + 2 + 12 bytes per parameter, divided as each stage says;
  activations as ``block_activation_elements`` per layer for the micro-batches 1F1B holds;
* communication by kind: the ring's 2(d-1)/d for DP, 10(t-1)/t A per layer and micro-batch
  for TP (14 with recomputation; counted from a real block in tests/test_plan_check.py), 2A
  per micro-batch for PP;
* every enumerated configuration multiplies to N; bad input fails before any simulation;
* the CLI prints one configuration with the simulator's step time.
"""
import pytest

from collectives.parallel.recompute import block_activation_elements
from collectives.plan import Config, Model, check, communication, configurations, memory, parse_model, plan
from collectives.plan.__main__ import main

MODEL = Model(params=1.2e9, layers=24, hidden=2048, seq=2048, batch=64)     # 16 heads


def test_memory_by_kind():
    p = MODEL.params
    for zero in range(4):
        m = memory(MODEL, Config(dp=4, tp=2, pp=1, cp=1, zero=zero))
        local = p / 2
        assert m["parameters"] == 2 * local / (4 if zero >= 3 else 1)
        assert m["gradients"] == 2 * local * [1, 1 + 1 / 4, 1 / 4, 1 / 4][zero]
        assert m["optimizer"] == 12 * local / (4 if zero >= 1 else 1)
    c = Config(dp=2, tp=2, pp=2, cp=2)
    m = memory(MODEL, c)            # 16 micro-batches per replica, stage 0 holds p = 2 of them
    assert m["activations"] == 2 * block_activation_elements(1024, 1, 2048, 16, 8192, 2, True) * 12 * 2
    # recomputation: each layer's input for the micro-batches held, plus the layer being recomputed
    assert memory(MODEL, Config(2, 2, 2, 2, recompute=True))["activations"] == \
        2 * (1024 * 2048 // 2) * (12 * 2 - 1) + 2 * block_activation_elements(1024, 1, 2048, 16, 8192, 2, True)


def test_communication_by_kind():
    a = 2048 * 2048 * 2
    assert communication(MODEL, Config(8, 1, 1, 1))["dp"] == 2 * 7 / 8 * 2 * MODEL.params
    assert communication(MODEL, Config(8, 1, 1, 1, zero=3))["dp"] == 3 * 7 / 8 * 2 * MODEL.params
    tp = Config(4, 2, 1, 1)
    line = 256      # each block forward's shape check: one all_gather of a 256-byte line per rank
    assert communication(MODEL, tp)["tp"] == 10 * (1 / 2) * a * 24 * 16 + line * 24 * 16
    assert communication(MODEL, Config(4, 2, 1, 1, recompute=True))["tp"] == 14 * (1 / 2) * a * 24 * 16 + 2 * line * 24 * 16
    assert communication(MODEL, Config(4, 1, 2, 1))["pp"] == 2 * a * 16


def test_every_configuration_multiplies_to_n_and_bad_input_is_named():
    for n in (1, 6, 8):
        configs = configurations(MODEL, n)
        assert configs and all(c.dp * c.tp * c.pp * c.cp == n for c in configs)
    with pytest.raises(ValueError, match="not the 8 ranks"):
        check(MODEL, Config(2, 2, 1, 1), 8)
    with pytest.raises(ValueError, match="24 layers are not divisible by 5 pipeline stages"):
        check(MODEL, Config(1, 1, 5, 1), 5)
    with pytest.raises(ValueError, match="not divisible by 2 x CP = 6"):
        check(Model(1e9, 24, 2048, 2050, 64), Config(1, 1, 1, 3), 3)
    with pytest.raises(ValueError, match="PARAMS,LAYERS"):
        parse_model("1e9,24")


def test_ranking_puts_what_fits_first_fastest_first():
    calls = []

    def fake(collective, algorithm, n, nbytes, topology):      # 1 ns per byte: enough to rank
        calls.append(collective)
        return type("R", (), {"time": nbytes * 1e-9})()
    rows = plan(MODEL, 8, "h100-cluster", 400e12, 8e9, simulate=fake)
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True) and any(fits) and not all(fits)
    times = [r["time"] for r in rows if r["fits"]]
    assert times == sorted(times)
    assert calls


def test_cli_shows_one_configuration_and_refuses_a_wrong_product(capsys):
    assert main(["--model", "1.2e9,24,2048,2048,64", "--ranks", "8", "--config", "4,2,1,1", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "DP4 TP2 PP1 CP1 ZeRO-1" in out and "1 configurations, 1 fit" in out
    with pytest.raises(SystemExit):
        main(["--model", "1.2e9,24,2048,2048,64", "--ranks", "8", "--config", "2,2,1,1"])
    assert "not the 8 ranks" in capsys.readouterr().err


# -- expert parallelism: the planner's figures against collectives/parallel/moe.py's own ------

EP_H, EP_TOKENS = 8, 8          # hidden, tokens per rank


def moe_step(rank, world_size, top_k):
    """One MoE layer (4 experts, one per rank) whose router sends token i to experts i and i + 1
    (mod 4): even routing, the planner's assumption. Returns (parameter values, bytes sent in
    forward and backward, the split sizes)."""
    import torch
    import torch.nn as nn

    import collectives
    from collectives.parallel.moe import MoE, expert_mlp
    torch.manual_seed(0)
    router = nn.Linear(EP_H, world_size, bias=False, dtype=torch.float64)
    with torch.no_grad():
        router.weight.zero_()
        router.weight[:, :world_size] = torch.eye(world_size)
    experts = [expert_mlp(EP_H, 4 * EP_H, torch.float64) for _ in range(world_size)]
    moe = MoE.from_experts(router, experts, top_k=top_k)
    x = torch.zeros(EP_TOKENS, EP_H, dtype=torch.float64)
    for i in range(EP_TOKENS):
        x[i, i % world_size], x[i, (i + 1) % world_size] = 10.0, 5.0
    x.requires_grad_()              # inside a network: the tokens' gradient travels back too
    with collectives.count_traffic() as traffic:
        moe(x).pow(2).sum().backward()
    return sum(p.numel() for p in moe.parameters()), traffic.sent_bytes, moe.last_counts


def test_expert_parallelism_matches_the_moe_layer():
    from tests.worlds import run_world

    for top_k in (1, 2):
        results = run_world(moe_step, 4, top_k)
        values = results[0][0]
        # params: the router (H x 4) and one expert; the planner's dense model has one expert per layer
        model = Model(params=values, layers=1, hidden=EP_H, seq=EP_TOKENS, batch=4, heads=1,
                      experts=4, top_k=top_k, value_bytes=8)
        config = Config(4, 1, 1, 1, ep=4)
        check(model, config, 4)
        assert memory(model, config)["parameters"] == 8 * values       # E/EP = 1 expert here, all of the router
        planned = communication(model, config)["ep"]
        for rank, (_, sent, (send, recv)) in enumerate(results):
            assert send == [EP_TOKENS * top_k // 4] * 4, f"rank {rank}: routing not even, {send}"
            assert sent == planned, f"top-{top_k}, rank {rank}: sent {sent} B, planned {planned} B"


def test_expert_memory_and_gradient_groups():
    moe = Model(params=1.2e9, layers=24, hidden=2048, seq=2048, batch=64, experts=8, top_k=2)
    expert = 2 * 2048 * 8192 + 8192 + 2048
    assert moe.expert_params == expert
    dense = moe.params - 24 * expert
    for ep in (1, 2, 4, 8):
        m = memory(moe, Config(8, 1, 1, 1, ep=ep, zero=1))
        assert m["parameters"] == 2 * (dense + 24 * expert * 8 // ep)
        # ZeRO-1 shards the dense part's state over 8 ranks, the experts' over the 8 / ep holding each
        assert m["optimizer"] == 12 * (dense / 8 + 24 * expert * (8 // ep) / (8 // ep))
    with pytest.raises(ValueError, match="EP=3 must divide DP=4"):
        check(moe, Config(4, 2, 1, 1, ep=3), 8)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        check(MODEL, Config(8, 1, 1, 1, ep=2), 8)
    configs = configurations(moe, 8)
    assert {c.ep for c in configs} == {1, 2, 4, 8}
    assert all(c.dp % c.ep == 0 for c in configs)


def test_cli_plans_experts_and_refuses_ep_on_a_dense_model(capsys):
    assert main(["--model", "1.2e9,24,2048,2048,64", "--experts", "8", "--top-k", "2", "--ranks", "8",
                 "--config", "8,1,1,1,4", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "8 experts top-2" in out and "DP8 TP1 PP1 CP1 EP4 ZeRO-1" in out and "ep GB" in out
    with pytest.raises(SystemExit):
        main(["--model", "1.2e9,24,2048,2048,64", "--ranks", "8", "--config", "8,1,1,1,4"])
    assert "needs a mixture-of-experts model" in capsys.readouterr().err


def test_a_calibrated_topology_given_as_a_dict_plans_as_its_file_does(tmp_path):
    """``benchmarks.plan_check`` hands the planner the network it measured in the same run, a
    dict whose ``by_size`` tables and ``calibrated`` record are themselves containers."""
    import json

    from collectives.plan import step_time
    spec = {"kind": "flat", "alpha": 40e-6, "bandwidth": 2e9, "gamma": 1e-10, "cores": 2, "wake": 3e-5,
            "call": 1e-5, "overhead": 9e-5, "by_size": {"copy": [[4096, 1e-10], [1 << 20, 2e-10]]},
            "calibrated": {"fits": {"2": {"alpha": 4e-5}}}}
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(spec))
    config = Config(2, 2, 1, 1)
    model = Model(params=793_088, layers=4, hidden=128, seq=32, batch=8, heads=4, value_bytes=4,
                  optimizer_bytes=8)
    from_dict = step_time(model, config, spec, 1e9)
    assert from_dict == step_time(model, config, str(path), 1e9)
    assert from_dict[1]["tp"] > 0


def test_zero3_gathers_and_scatters_layer_by_layer():
    """ZeRO-3 (FSDP) gathers each layer's parameters before its forward and again before its
    backward, and reduce-scatters each layer's gradient: 3 calls per layer of the stage, each of
    one layer's bytes, as ``collectives.parallel.fsdp`` and torch's FSDP wrapped per block run
    it (the whole model in 3 calls would charge 3 calls' fixed cost, not 3 L). Bytes unchanged."""
    from collectives.plan import calls
    for pp in (1, 2):
        c = Config(8 // pp, 1, pp, 1, zero=3)
        layers = MODEL.layers // pp
        per_layer = 2 * MODEL.params / pp / layers
        got = {(coll, n, count): nbytes for coll, n, nbytes, count in calls(MODEL, c)["dp"]}
        assert set(got) == {("all_gather", 8 // pp, 2 * layers), ("reduce_scatter", 8 // pp, layers)}
        assert all(abs(b - per_layer) < 1e-6 * per_layer for b in got.values())
    assert communication(MODEL, Config(8, 1, 1, 1, zero=3))["dp"] == pytest.approx(3 * 7 / 8 * 2 * MODEL.params)


def test_context_parallel_ranks_reduce_the_gradients_and_share_zero():
    """CP ranks hold their replica's parameters and see other tokens: the gradients are reduced,
    and ZeRO shards, over DP x CP ranks (Megatron's data-parallel group with CP folded in); the
    zig-zag ring sends (K, V) c-1 times forward, (K, V, dK, dV) c-1 times and (dK, dV) once
    backward, plus each forward's shape check (counted from a real block on 4 ranks in
    tests/test_plan_check.py)."""
    p = MODEL.params
    assert communication(MODEL, Config(2, 1, 1, 4))["dp"] == 2 * 7 / 8 * 2 * p
    assert communication(MODEL, Config(1, 1, 1, 8))["dp"] == 2 * 7 / 8 * 2 * p
    assert memory(MODEL, Config(2, 1, 1, 4, zero=1))["optimizer"] == 12 * p / 8
    assert memory(MODEL, Config(2, 1, 1, 4, zero=3))["parameters"] == 2 * p / 8
    k = 2048 // 8 * 2048 * 2                    # one K chunk: S/c x b x H x e, TP1
    per = 24 * 64                               # layers x micro-batches
    assert communication(MODEL, Config(1, 1, 1, 8))["cp"] == per * (7 * 6 * k + 2 * k + 7 * 256)
    assert communication(MODEL, Config(1, 1, 1, 8, recompute=True))["cp"] == \
        per * (7 * 8 * k + 2 * k + 2 * 7 * 256)
    # ZeRO is enumerated wherever DP x CP > 1, CP alone included
    assert {c.zero for c in configurations(MODEL, 8) if (c.dp, c.cp) == (1, 8)} == {0, 1, 2, 3}
    assert {c.zero for c in configurations(MODEL, 8) if (c.dp, c.cp) == (1, 1)} == {0}
