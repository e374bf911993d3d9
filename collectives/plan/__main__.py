"""``python -m collectives.plan``: the configurations of one model on N ranks, ranked (see the package's card).

Examples::

    python -m collectives.plan --model 1.3e9,24,2048,2048,512 --ranks 64 --topology h100-cluster
    python -m collectives.plan --model 7e9,32,4096,4096,1024 --ranks 8 --config 1,8,1,1 --zero 1
    python -m collectives.plan --model 1.3e9,24,2048,2048,512 --experts 8 --top-k 2 --ranks 64
"""
import argparse
import dataclasses
import sys

from . import KINDS, Config, check, parse_model, plan
from .. import sim

GB = 1e9


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m collectives.plan", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="PARAMS,LAYERS,HIDDEN,SEQ,BATCH[,HEADS] (BATCH in sequences)")
    parser.add_argument("--ranks", type=int, required=True, help="N, the ranks (GPUs)")
    parser.add_argument("--topology", default="h100-cluster", help=f"a preset ({', '.join(sim.PRESETS)}) or a JSON file")
    parser.add_argument("--flops", type=float, default=400e12,
                        help="FLOP/s one rank sustains on the model's matrix products (default 400e12: "
                             "an H100's bf16 dense peak of 989e12 at 40%% utilisation)")
    parser.add_argument("--memory", type=float, default=80e9, help="bytes per rank (default 80e9, an H100)")
    parser.add_argument("--experts", type=int, default=0, help="experts per MoE layer (default 0: a dense MLP)")
    parser.add_argument("--top-k", type=int, default=1, help="experts each token visits (default 1)")
    parser.add_argument("--config", help="DP,TP,PP,CP[,EP]: check and show one configuration only")
    parser.add_argument("--zero", type=int, default=0, help="with --config: the ZeRO stage")
    parser.add_argument("--recompute", action="store_true", help="with --config: recomputation on")
    parser.add_argument("--top", type=int, default=15, help="rows to print (default 15)")
    args = parser.parse_args(argv)
    try:
        model = parse_model(args.model)
        if args.experts < 0:
            raise ValueError(f"--experts must be >= 0, got {args.experts}")
        model = dataclasses.replace(model, experts=args.experts, top_k=args.top_k)
        if args.ranks < 1:
            raise ValueError(f"--ranks must be >= 1, got {args.ranks}")
        sim.load_topology(args.topology)
        only = None
        if args.config:
            parts = [int(x) for x in args.config.split(",")]
            if len(parts) not in (4, 5):
                raise ValueError(f"--config wants DP,TP,PP,CP[,EP], got {args.config!r}")
            only = Config(*parts[:4], zero=args.zero, recompute=args.recompute, ep=parts[4] if len(parts) == 5 else 1)
            check(model, only, args.ranks)
    except ValueError as exc:
        parser.error(str(exc))
    rows = plan(model, args.ranks, args.topology, args.flops, args.memory, configs=None if only is None else [only])
    moe = f", {model.experts} experts top-{model.top_k}" if model.experts else ""
    print(f"# {model.params:.3g} parameters{moe}, {model.layers} layers, hidden {model.hidden}, {model.a} heads, "
          f"sequence {model.seq}, batch {model.batch} sequences; {args.ranks} ranks on {args.topology}, "
          f"{args.flops:.3g} FLOP/s and {args.memory / GB:g} GB each")
    print(f"# memory GB per rank: params grads optim activ = total; GB sent per step by kind; "
          f"step seconds (compute + {' + '.join(KINDS)}, simulated)")
    fits = sum(r["fits"] for r in rows)
    print(f"# {len(rows)} configurations, {fits} fit; fastest first")
    print(f"{'#':>3} {'configuration':<34} {'params':>7} {'grads':>6} {'optim':>6} {'activ':>7} {'total':>7} "
          + " ".join(f"{k + ' GB':>8}" for k in KINDS) + f" {'step s':>8} " + " ".join(f"{k:>7}" for k in ("compute",) + KINDS))
    for i, r in enumerate(rows[:args.top]):
        mem = r["memory"]
        mark = "" if r["fits"] else "  (does not fit)"
        print(f"{i + 1:3d} {str(r['config']):<34} {mem['parameters'] / GB:7.2f} {mem['gradients'] / GB:6.2f} "
              f"{mem['optimizer'] / GB:6.2f} {mem['activations'] / GB:7.2f} {sum(mem.values()) / GB:7.2f} "
              + " ".join(f"{r['bytes'][k] / GB:8.2f}" for k in KINDS)
              + f" {r['time']:8.3f} " + " ".join(f"{r['times'][k]:7.3f}" for k in ("compute",) + KINDS) + mark)
    if not fits:
        print("# nothing fits: more ranks, ZeRO, recomputation, or a smaller batch per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
