"""The cases each exercise is graded on, the answers it must give, and the traffic it may use.

Every rank can build every other rank's input (the values depend only on the
rank and the case), so each rank computes the answer the built-in collective
gives, locally, with plain torch (as ``tests/expected.py`` does): the
built-ins themselves are switched off while a solution is graded. Inputs are
small integers, so every sum is exact in every dtype used, bfloat16 included,
whatever order a solution adds in; the one exception is the cancellation case
of the reductions (:func:`cancel_input`), where the order matters and the
answer is checked against the bound on rounding error instead.

A check has:

* ``cases(world_size, quick)``: the list of cases (the same on every rank);
* ``run(fn, case, rank, world_size)``: builds this rank's inputs, calls the
  learner's ``fn``, compares, returns ``{"ok", "lines"}`` (what to show for
  this rank if the case is wrong); optional keys: ``"changed"`` (lines: inputs
  the solution was only to read but changed, see :func:`untouched`),
  ``"bits"`` (a digest of the result and its first values: the parent demands
  the same digest on every rank, see :func:`bits`);
* ``need(case, world_size)``: what the algorithm sends per rank (None for
  cases too small to judge), used by the parent on the counted traffic;
* ``label(case)``: the case in words.

This module is the registry: it imports one module per family of exercises and nothing imports
it back but the worker and the grader. The helpers every check shares are in ``_common``.
"""
from tutorials.exercises import (_checks_basic, _checks_ladder, _checks_parallel, _checks_parallel_b,
                                 _checks_zigzag, _sim)

CHECKS = {
    **_checks_basic.CHECKS,                        # chapters 2-12
    "sim_all_reduce": _sim.SimAllReduce(),         # graded in the simulator, chapter 14
    **_checks_parallel_b.PARALLEL_B_CHECKS,        # chapters 17, 19, 20
    **_checks_parallel.CHECKS,                     # chapters 16 and 18
    **_checks_zigzag.CHECKS,                       # chapter 20's zig-zag
    **_checks_ladder.CHECKS,                       # the steps that climb to a long exercise
}
