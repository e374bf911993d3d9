"""Exercises graded in the simulator (chapter 14) instead of in worlds of processes.

``sim_all_reduce``: the learner's all_reduce, with the signature of the algorithm
modules (a door, a flat tensor, a reduction), runs in ``collectives.sim``:

1. **Results** on real tensors: worlds of 1, 2, 3, 4, 5, 8, 13 and 33 ranks (quick: 1, 2,
   3, 5), tensors of 0, 1, 7 and 1000 float32 elements, reduced with SUM and with MAX (so a
   hard-coded ``add_`` fails); every rank must hold the exact reduction.
2. **Deadlock**: under rendezvous semantics a schedule that cannot finish is reported
   with its wait-for cycle (at any of those sizes, and at scale).
3. **Speed at scale**: 64 MiB on 1,024 ranks (quick: 64) of ``ethernet-100g``; the
   simulated busbw must reach 90% of the ring's. The ring's time there is the
   alpha-beta-gamma formula, which the test suite holds equal to the simulator on a
   flat switch (tests/test_sim.py), so only the learner's schedule is simulated.
"""
import traceback

import torch
from torch.distributed import ReduceOp

from tutorials.exercises import _common, _routes

FULL_WORLDS = (1, 2, 3, 4, 5, 8, 13, 33)
QUICK_WORLDS = (1, 2, 3, 5)
ELEMENTS = (0, 1, 7, 1000)
SCALE, QUICK_SCALE = 1024, 64
SCALE_BYTES = 64 << 20
TOPOLOGY = "ethernet-100g"
FRACTION = 0.9
# SUM alone cannot tell op.combine from a hard-coded add_: MAX can
OPS = {ReduceOp.SUM: "the sum", ReduceOp.MAX: "the maximum"}


def _first_off_max(outputs, n, e):
    """(rank, 0, element, got, want) of the first element off the MAX over ranks, or None. The
    simulator's inputs encode the rank (value(r) = r + 1 + ...), so the maximum is rank n-1's input."""
    from collectives.sim.collective import value

    want = value(n - 1, 0, e, torch.float32, "cpu")
    for rank in range(n):
        got = outputs[rank][0]
        if got.shape != want.shape:
            return rank, 0, None, list(got.shape), list(want.shape)
        if not torch.equal(got, want):
            j = int((got != want).nonzero()[0, 0])
            return rank, 0, j, got[j].item(), want[j].item()
    return None


class SimAllReduce:
    simulated = True
    chapter = "chapter 14 (tutorials/14_a_thousand_ranks.md)"

    def grade(self, name, source, shown, quick=False, world_sizes=None):
        """(passed, reason, text)."""
        # the library's own algorithms are a free route to the right schedule
        return _common.graded_here(
            name, source, shown, lambda fn: self._grade(name, fn, shown, quick, world_sizes),
            "The library's own algorithms are switched off while grading: build the schedule from "
            "comm.sendrecv, comm.send and comm.recv.", self.chapter)

    def _grade(self, name, fn, shown, quick, world_sizes):
        from collectives import sim
        from collectives.sim.collective import busbw_factor
        from collectives.tuning import cost_model

        worlds = world_sizes or (QUICK_WORLDS if quick else FULL_WORLDS)
        cases = 0
        for n, e, op in [(n, e, op) for n in worlds for e in ELEMENTS for op in OPS]:
            where = f"{n} rank(s), tensor float32[{e}], op {op.name}"
            try:
                r = sim.simulate("all_reduce", fn, n, 4 * e, topology=TOPOLOGY, device="cpu", op=op,
                                 check=op == ReduceOp.SUM)   # the simulator's closed form is the sum
            except sim.Deadlock as exc:
                return False, "deadlock", f"FAIL {name}: deadlock with {where}.\n{exc}\nSee {self.chapter}."
            except sim.SimulationError as exc:
                cause = exc.__cause__
                if isinstance(cause, _routes.BuiltinUsed):
                    raise cause
                if isinstance(cause, NotImplementedError):
                    return False, "not_written", (f"NOT WRITTEN {name}: {shown} still raises "
                                                  f"NotImplementedError. Write its body (the docstring "
                                                  f"says what to build), then grade it again.")
                text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__, limit=-3))
                return False, "crash", f"FAIL {name}: {exc} with {where}:\n{text}"
            wrong = r.wrong if op == ReduceOp.SUM else _first_off_max(r.outputs, n, e)
            if wrong is not None:
                rank, _, j, got, want = wrong
                return False, "wrong", (f"FAIL {name}: wrong result with {where}: rank {rank}, element {j} "
                                        f"is {got}, expected {want} ({OPS[op]} over ranks). Fold each piece in "
                                        f"with op.combine(acc, x), which is what op asks for.")
            cases += 1
        n = QUICK_SCALE if quick else SCALE
        try:
            mine = sim.simulate("all_reduce", fn, n, SCALE_BYTES, topology=TOPOLOGY, device="meta")
        except sim.Deadlock as exc:
            return False, "deadlock", f"FAIL {name}: deadlock at {n} ranks, 64 MiB.\n{exc}\nSee {self.chapter}."
        except sim.SimulationError as exc:
            if isinstance(exc.__cause__, _routes.BuiltinUsed):
                raise exc.__cause__
            return False, "crash", f"FAIL {name}: {exc} at {n} ranks, 64 MiB (meta tensors: sizes only)."
        spec = sim.load_topology(TOPOLOGY)
        ring = cost_model.predict("all_reduce", "ring", n, SCALE_BYTES,
                                  {"alpha": spec["alpha"], "beta": 1 / spec["bandwidth"], "gamma": spec["gamma"]})
        ring_busbw = SCALE_BYTES / ring * busbw_factor("all_reduce", n)
        ratio = mine.busbw / ring_busbw
        figures = (f"busbw {mine.busbw / 1e9:.2f} GB/s at {n} ranks, 64 MiB on {TOPOLOGY}: {ratio:.0%} of the "
                   f"ring's {ring_busbw / 1e9:.2f} GB/s; {mine.max_bytes_sent} bytes sent by the busiest rank")
        if ratio < FRACTION:
            return False, "slow", (f"FAIL {name}: correct in all {cases} cases, but too slow at scale: {figures}. "
                                   f"Send pieces of S/N, not the whole tensor: see chapter 4.")
        return True, "pass", (f"PASS {name}: correct in all {cases} cases on worlds of "
                              f"{', '.join(map(str, worlds))} ranks, no deadlock; {figures}.")
