"""``python -m collectives.viz``: a self-contained HTML lab drawn from recorded runs.

The algorithms run unchanged on the simulator's door (:mod:`collectives.sim`); what the page
shows (chunks coloured by whose contributions they hold, every message moving along its link,
bytes per rank and per link, the simulated time axis, the topology, the wait-for cycle of a
deadlock, the first chunk of a wrong result, predict-then-reveal questions) is computed from
that run, never drawn by hand. One file, no network: open it from disk.

:func:`record_real` (``python -m collectives.viz ... --real``) runs the same algorithm, or the
learner's own function, in real processes instead (gloo, one host): the same messages, their
times measured, the same page; a hang at the door is drawn as the simulator draws a deadlock.

* :mod:`.record`: the run, with provenance encoded in the values themselves;
* :mod:`.model`: frames, counters, links, the first wrong chunk;
* :mod:`.schedules`: the parallelisms' schedules (pipeline GPipe and 1F1B, FSDP, ring
  attention, MoE's uneven all_to_all);
* :mod:`.questions`: the questions and their answers;
* :mod:`.render`: the HTML file; :mod:`.cli`: the command line.

Example::

    >>> from collectives import viz
    >>> viz.page("all_reduce", "ring", 8, path="ring8.html")      # open it in a browser
    >>> viz.show("all_reduce", "ring", 4)                          # inline, in a notebook
    >>> viz.show("all_reduce", "ring", 4, real=True)               # from 4 real processes
"""
from . import model, record as _record, render
from .record import MAX_MESSAGES, MAX_RANKS, TooLarge, record_real  # noqa: F401 (record_real: a real run)


def data(collective, algorithm, world_size, topology="ethernet-100g", root=0, real=False):
    """The page's data for one call (see :func:`page`)."""
    if real:
        return model.build(record_real(collective, algorithm, world_size, root))
    return model.build(_record.record(collective, algorithm, world_size, topology, root))


def page(collective, algorithm, world_size, path=None, topology="ethernet-100g", root=0, real=False):
    """Record ``algorithm`` of ``collective`` on ``world_size`` simulated ranks and draw it.

    Args:
        collective: ``"all_reduce"``, ``"broadcast"``, ... (``collectives.ALGORITHMS``' keys).
        algorithm: a registered name, or a function with the algorithm modules' signature
            (``fn(comm, *args)``: the learner's own code).
        world_size: 1 to ``MAX_RANKS`` (above 64 the page is a summary without chunks).
        path: where to write the HTML file; None returns the HTML as text.
        topology: a ``collectives.sim`` preset (``ethernet-100g``, ``h100-cluster``,
            ``fat-tree``), a JSON file or a dict.
        root: the root of broadcast, reduce, scatter and gather.
        real: run it in ``world_size`` real processes on this machine instead (:func:`record_real`:
            gloo, one host, at most 15 ranks; the time axis measured, ``topology`` unused).

    Returns:
        The path written, or the HTML text when ``path`` is None.

    Example::

        >>> viz.page("all_reduce", "ring", 8, path="ring8.html")
    """
    d = data(collective, algorithm, world_size, topology, root, real)
    return render.write(d, path) if path is not None else render.html(d)


def show(collective, algorithm, world_size, height=720, **kwargs):
    """The page inline in a notebook (an ``IPython.display.HTML`` holding an iframe)."""
    import html as _html

    from IPython.display import HTML
    text = page(collective, algorithm, world_size, **kwargs)
    # in a <div>: IPython warns about HTML that starts with an iframe (it suggests IFrame, which
    # needs a URL; the page is inline, with no server)
    return HTML(f'<div><iframe srcdoc="{_html.escape(text, quote=True)}" style="width:100%;height:{height}px;'
                f'border:1px solid #ccc"></iframe></div>')


__all__ = ["MAX_MESSAGES", "MAX_RANKS", "TooLarge", "data", "page", "show", "side_by_side"]


def side_by_side(collective, solution, world_size, path, reference=None, topology="ethernet-100g", root=0,
                 real=False, hang=_record.REAL_HANG, calls="door"):
    """The learner's run next to the reference's, in one self-contained file (what the grader's
    ``--html FILE`` writes): ``solution`` is the learner's function (the algorithm modules'
    signature), ``reference`` a registered name or a function (default: the collective's
    first registered algorithm).

    ``real=True`` runs both in real processes (:func:`record_real`: gloo, one host, the
    function loaded from its file) instead of the simulator; a rank that waits ``hang``
    seconds for a message makes the learner's page a deadlock page. A world that fails
    otherwise raises (the launcher's verdict) and nothing is written.

    ``calls="torch"``: both functions are written against torch's API (the course's
    process-world exercises, e.g. ``all_reduce(tensor, group=None)`` with torch's ``isend``);
    their point-to-point calls go through our door in real processes, so ``real`` is implied
    and ``reference`` must be a function (the exercise's reference solution).

    Returns:
        (path, learner's page data): the data's ``failure`` (a deadlock's cycle) and ``wrong``
        (the first chunk whose provenance went wrong) say what the page shows.
    """
    import html as _html
    from pathlib import Path

    from ..algorithms import REGISTRY
    if calls == "torch" and not callable(reference):
        raise ValueError("calls='torch': give the reference as a function written against torch's API too")
    reference = reference or next(iter(REGISTRY[collective]))
    if real or calls == "torch":
        mine = model.build(record_real(collective, solution, world_size, root, hang=hang, calls=calls))
        ref = model.build(record_real(collective, reference, world_size, root, hang=hang, calls=calls))
    else:
        mine = data(collective, solution, world_size, topology, root)
        ref = data(collective, reference, world_size, topology, root)
    frames = "".join(
        f'<div style="flex:1;min-width:600px"><h2>{_html.escape(label)}</h2><iframe srcdoc="'
        f'{_html.escape(render.html(d), quote=True)}" style="width:100%;height:1400px;border:1px solid #ccc">'
        f'</iframe></div>' for label, d in (("yours: " + mine["title"], mine), ("reference: " + ref["title"], ref)))
    Path(path).write_text(f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_html.escape(mine["title"])}'
                          f'</title></head><body style="font:14px system-ui;margin:8px"><div style="display:flex;gap:8px;'
                          f'flex-wrap:wrap">{frames}</div></body></html>', encoding="utf-8")
    return Path(path), mine
