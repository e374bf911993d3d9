"""``python -m collectives.tools.lab``: check that a lab can start, clean stale labs, run torchrun in one.

Examples::

    python -m collectives.tools.lab check
    python -m collectives.tools.lab clean
    python -m collectives.tools.lab torchrun --lab hosts=2,ranks-per-host=2 -- -m collectives.train --epochs 1
"""
import argparse
import sys

from . import clean_stale, lab_argument, torchrun, unavailable_reason
from .netns import LabUnavailable


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m collectives.tools.lab", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="say whether a lab can be built here, and if not, why")
    sub.add_parser("clean", help="remove labs whose launcher is gone")
    t = sub.add_parser("torchrun", help="run torchrun with one agent per lab host")
    t.add_argument("--lab", type=lab_argument, required=True, help="hosts=K[,ranks-per-host=L][,rate=1gbit]")
    t.add_argument("--timeout", type=float, default=None, help="seconds before everything is killed")
    t.add_argument("rest", nargs=argparse.REMAINDER, help="-- then what torchrun runs: -m module args...")
    args = p.parse_args(argv)
    if args.command == "check":
        reason = unavailable_reason()
        print(f"lab: {reason}" if reason else "lab: a lab can be built here")
        return 1 if reason else 0
    if args.command == "clean":
        gone = clean_stale()
        print(f"lab: removed {len(gone)} stale lab(s){': ' + ', '.join(gone) if gone else ''}")
        return 0
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if not rest:
        p.error("torchrun: say what to run after --, e.g. -- -m collectives.train")
    try:
        return torchrun(args.lab, rest, timeout=args.timeout)
    except LabUnavailable as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
