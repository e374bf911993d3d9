"""Chapter 23: one model planned on 8, 64 and 1,024 simulated H100s.

    python -m tutorials.demos.ch23_plan

The model: 1.3e9 parameters in 24 layers of hidden 2,048 (16 heads), sequences of 2,048
tokens, 512 sequences (1M tokens) per step; bf16 with Adam (16 bytes per parameter), 80 GB
and 400e12 FLOP/s per rank, on the ``h100-cluster`` topology (8 per node on NVLink, a
400 Gb/s NIC each). For 8 and 64 ranks every configuration is planned; for 1,024 five
chosen ones (the whole enumeration simulates groups of up to 256 ranks: minutes, run
``python -m collectives.plan --ranks 1024`` for it). Then the same model as a mixture of
8 experts, top-2, on 64 ranks: what expert parallelism does to memory and traffic.
"""
import dataclasses

from collectives.plan import Config, Model, configurations, plan

MODEL = Model(params=1.3e9, layers=24, hidden=2048, seq=2048, batch=512)
TOPOLOGY, FLOPS, MEMORY = "h100-cluster", 400e12, 80e9
GB = 1e9


def show(rows, top):
    print(f"   {'configuration':<36}{'memory GB: params grads optim activ':>38}  {'step s':>6}  "
          f"{'compute':>7} {'dp':>5} {'tp':>5} {'pp':>5} {'ep':>5}")
    for r in rows[:top]:
        m, t = r["memory"], r["times"]
        print(f"   {str(r['config']):<36}{m['parameters'] / GB:>10.2f}{m['gradients'] / GB:>6.2f}"
              f"{m['optimizer'] / GB:>7.2f}{m['activations'] / GB:>7.2f}{'' if r['fits'] else ' (no fit)':>8}"
              f"  {r['time']:6.3f}  {t['compute']:7.3f} {t['dp']:5.3f} {t['tp']:5.3f} {t['pp']:5.3f} {t['ep']:5.3f}")


def main():
    print(f"{MODEL.params:.2g} parameters, {MODEL.layers} layers, hidden {MODEL.hidden}, {MODEL.a} heads, "
          f"{MODEL.batch} x {MODEL.seq} tokens per step; {TOPOLOGY}, {FLOPS:.0e} FLOP/s, {MEMORY / GB:.0f} GB")
    for n in (8, 64):
        rows = plan(MODEL, n, TOPOLOGY, FLOPS, MEMORY)
        fits = sum(r["fits"] for r in rows)
        print(f"\n{n} ranks: {len(rows)} configurations, {fits} fit in {MEMORY / GB:.0f} GB; the fastest 4, "
              f"and the slowest that fits")
        show(rows[:4] + [r for r in rows if r["fits"]][-1:], 5)
    # data-parallel groups of at most 128 ranks: the simulator plays them in seconds
    chosen = [Config(128, 8, 1, 1, zero=1), Config(64, 8, 2, 1, zero=1), Config(32, 8, 4, 1, zero=1),
              Config(128, 1, 8, 1, zero=1), Config(32, 4, 8, 1, zero=1)]
    rows = plan(MODEL, 1024, TOPOLOGY, FLOPS, MEMORY, configs=chosen)
    print(f"\n1024 ranks ({MODEL.batch} sequences: at most 2 per data-parallel replica), {len(rows)} chosen "
          f"configurations, {len(configurations(MODEL, 1024))} in all")
    show(rows, len(rows))
    moe = dataclasses.replace(MODEL, experts=8, top_k=2)
    configs = [Config(64, 1, 1, 1, zero=1, ep=ep) for ep in (1, 2, 4, 8)] + \
              [Config(8, 8, 1, 1, zero=1, ep=ep) for ep in (1, 8)]
    rows = plan(moe, 64, TOPOLOGY, FLOPS, MEMORY, configs=configs)
    print(f"\nthe same model with 8 experts per layer, top-2 ({moe.params + moe.layers * 7 * moe.expert_params:.3g} "
          f"parameters), on 64 ranks; GB sent per step by kind: dp, ep")
    show(rows, len(rows))
    for r in rows:
        print(f"   {str(r['config']):<36} dp {r['bytes']['dp'] / GB:6.2f} GB, ep {r['bytes']['ep'] / GB:6.2f} GB")


if __name__ == "__main__":
    main()
