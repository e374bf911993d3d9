"""Where the page draws each rank, switch and link of a topology, and what it calls each link.

The simulator numbers a topology's links (``collectives.sim.topology.Fabric.route``); this
module turns a link id into the two places it joins and a reader's name, for every kind of
topology the simulator has:

* ``flat``: one switch, each rank's port out and in (and the host's memory, when all messages
  share it);
* ``nodes`` and ``fat_tree``: a switch per node (or leaf) with its ranks around it, NICs (or
  uplinks) to a spine above;
* ``torus``: the ranks on a grid, one link per neighbour and direction; a wrap-around link is
  drawn as two stubs leaving the grid's edges, not a line across it;
* ``dragonfly``: groups on a circle, each group's routers on a small circle with their ranks
  around them, local links inside a group, one global link per ordered pair of groups between
  the routers that hold it;
* ``rail``: nodes side by side, each rank linked to its node's switch (NVLink) below and to the
  rail switch of its local rank above (its NIC), rail switches to the spine at the top.

Coordinates are the page's canvas pixels (:data:`WIDTH` x :data:`HEIGHT`).
"""
import math

WIDTH, HEIGHT = 500, 300


def _groups(n, per, y=150.0):
    """flat/nodes/fat_tree: a switch per group of ``per`` ranks in a row, the ranks on an arc
    around it (below for even groups, above for odd), the spine at the top."""
    groups = max(1, math.ceil(n / per))
    places = {("switch", g): (WIDTH * (g + 0.5) / groups, y, "switch", f"switch {g}") for g in range(groups)}
    rad = min(110.0, WIDTH / groups / 2 - 8)
    for r in range(n):
        g, k = r // per, r % per
        m = min(per, n - g * per)
        a = math.pi * (0.15 + 0.7 * (k / (m - 1) if m > 1 else 0.5))
        sx, sy = places[("switch", g)][:2]
        places[("rank", r)] = (sx - rad * math.cos(a), sy + (-1 if g % 2 else 1) * rad * math.sin(a) * 1.1, "rank", r)
    places[("spine",)] = (WIDTH / 2, 20.0, "switch", "spine")
    places[("host",)] = (WIDTH / 2, 20.0, "switch", "host memory")
    return places


def _torus_coords(dims, v):
    out = []
    for size in dims:
        out.append(v % size)
        v //= size
    return out


def _torus(dims, n):
    """The ranks on a grid: dimension 0 across, 1 down, 2 (if any) as planes side by side."""
    x, y = dims[0], dims[1] if len(dims) > 1 else 1
    planes = dims[2] if len(dims) > 2 else 1
    cw = (WIDTH - 20) / (x * planes + (planes - 1))
    ch = (HEIGHT - 40) / y
    places = {}
    for v in range(n):
        c = _torus_coords(dims, v) + [0, 0]
        places[("rank", v)] = (10 + cw * (c[2] * (x + 1) + c[0] + 0.5), 10 + ch * (c[1] + 0.5), "rank", v)
    return places


def _dragonfly(s, n):
    g, a, p = s["groups"], s["routers_per_group"], s["ranks_per_router"]
    used = min(g, max(1, math.ceil(n / (a * p))))      # the groups this world's ranks fill
    places = {}
    for gi in range(g):
        ang = 2 * math.pi * gi / used - math.pi / 2
        if used == 1 or gi >= used:
            gx, gy, rad = WIDTH / 2, HEIGHT / 2 - 10, 90
        else:
            gx, gy, rad = WIDTH / 2 + 150 * math.cos(ang), HEIGHT / 2 - 10 + 95 * math.sin(ang), 34
        for k in range(a):
            b = 2 * math.pi * k / a
            rx, ry = gx + rad * math.cos(b), gy + rad * math.sin(b)
            places[("router", gi * a + k)] = (rx, ry, "switch", f"router {gi * a + k}")
            for j in range(p):
                r = (gi * a + k) * p + j
                if r < n:
                    c = b + (j - (p - 1) / 2) * 0.35
                    places[("rank", r)] = (rx + 14 * math.cos(c), ry + 14 * math.sin(c), "rank", r)
    return places


def _rail(s, n):
    per, rails = s["ranks_per_node"], s["nodes_per_rail"]
    nodes = max(1, math.ceil(n / per))
    units = max(1, math.ceil(nodes / rails))
    places = {("spine",): (WIDTH / 2, 15.0, "switch", "spine")}
    for a in range(units):
        for i in range(per):
            x = 10 + (WIDTH - 20) * (a * per + i + 0.5) / (units * per)
            places[("rail", a, i)] = (x, 70.0, "switch", f"rail switch {i} of unit {a}")
    for k in range(nodes):
        x = 10 + (WIDTH - 20) * (k + 0.5) / nodes
        # beside its ranks' column, so that each rank's NVLink is its own line
        places[("nvswitch", k)] = (x - min(40.0, (WIDTH - 20) / nodes / 3), 195.0, "switch", f"node {k}'s switch")
        for j in range(per):
            r = k * per + j
            if r < n:
                places[("rank", r)] = (x, 130 + 130 * (j + 0.5) / per, "rank", r)
    return places


def places_of(fabric):
    """Every place the page may draw: ``{key: (x, y, kind, label)}``, kind ``rank`` or ``switch``."""
    s, n = fabric.spec, fabric.n
    kind = s["kind"]
    if kind == "torus":
        return _torus(s["dims"], n)
    if kind == "dragonfly":
        return _dragonfly(s, n)
    if kind == "rail":
        return _rail(s, n)
    per = n if kind == "flat" else s["ranks_per_node"] if kind == "nodes" else s["ranks_per_leaf"]
    return _groups(n, per)


def link(fabric, link_id):
    """(name, place it leaves, place it reaches, wraps) of one of ``fabric.route``'s link ids."""
    s, n = fabric.spec, fabric.n
    kind = s["kind"]
    if kind == "torus":
        dims = s["dims"]
        k = len(dims)
        v, d, back = link_id // 2 // k, link_id // 2 % k, link_id % 2
        c = _torus_coords(dims, v)
        step = -1 if back else 1
        to = (c[d] + step) % dims[d]
        stride = math.prod(dims[:d])
        u = v + (to - c[d]) * stride
        axis = "xyz"[d] if k <= 3 else f"d{d}"
        return (f"rank {v} -> rank {u} ({axis}{'-' if back else '+'})", ("rank", v), ("rank", u),
                to != c[d] + step)
    if link_id < 2 * n:      # every other kind: each rank's own port, out (even) and in (odd)
        r, into = link_id // 2, link_id % 2
        hub = {"flat": ("switch", 0), "nodes": ("switch", r // s.get("ranks_per_node", 1)),
               "fat_tree": ("switch", r // s.get("ranks_per_leaf", 1)),
               "dragonfly": ("router", r // s.get("ranks_per_router", 1)),
               "rail": ("nvswitch", r // s.get("ranks_per_node", 1))}[kind]
        ends = (hub, ("rank", r)) if into else (("rank", r), hub)
        return f"rank {r} {'in' if into else 'out'}", ends[0], ends[1], False
    if kind == "flat":
        return "host memory", ("switch", 0), ("host",), False
    x, into = (link_id - 2 * n) // 2, (link_id - 2 * n) % 2
    if kind == "nodes":
        node = x // s["ranks_per_node"] if s["nic"] == "rank" else x
        who = f"rank {x}" if s["nic"] == "rank" else f"node {x}"
        ends = (("spine",), ("switch", node)) if into else (("switch", node), ("spine",))
        return f"NIC of {who} {'in' if into else 'out'}", ends[0], ends[1], False
    if kind == "fat_tree":
        ends = (("spine",), ("switch", x)) if into else (("switch", x), ("spine",))
        return f"leaf {x} {'down' if into else 'up'}", ends[0], ends[1], False
    if kind == "dragonfly":
        g, a = s["groups"], s["routers_per_group"]
        i = link_id - 2 * n
        if i < g * a * a:
            r1 = i // a
            r2 = r1 // a * a + i % a
            return f"router {r1} -> router {r2} (group {r1 // a}, local)", ("router", r1), ("router", r2), False
        from ..sim.topology import gateway
        i -= g * a * a
        gs, gd = i // g, i % g
        return (f"group {gs} -> group {gd} (global)", ("router", gs * a + gateway(gs, gd, g, a)),
                ("router", gd * a + gateway(gd, gs, g, a)), False)
    per, unit = s["ranks_per_node"], s["ranks_per_node"] * s["nodes_per_rail"]
    if link_id < 4 * n:       # rail: a rank's NIC, to the rail switch of its local rank
        rail = ("rail", x // unit, x % per)
        ends = (rail, ("rank", x)) if into else (("rank", x), rail)
        return f"NIC of rank {x} {'in' if into else 'out'}", ends[0], ends[1], False
    y, into = (link_id - 4 * n) // 2, (link_id - 4 * n) % 2
    rail = ("rail", y // per, y % per)
    ends = (("spine",), rail) if into else (rail, ("spine",))
    return f"rail switch {y % per} of unit {y // per} {'down' if into else 'up'}", ends[0], ends[1], False


def draw(fabric, link_ids):
    """The page's topology: ``(places, links)``: places ``[x, y, kind, label]`` (every rank, and
    each switch some link touches), links ``[name, from, to, wraps]`` with indices into places,
    one per id of ``link_ids`` in that order."""
    everywhere = places_of(fabric)
    keep = [("rank", r) for r in range(fabric.n)]
    links = [link(fabric, x) for x in link_ids]
    for _, a, b, _ in links:
        for key in (a, b):
            if key not in keep:
                keep.append(key)
    index = {key: i for i, key in enumerate(keep)}
    places = [[round(everywhere[k][0], 1), round(everywhere[k][1], 1), everywhere[k][2], everywhere[k][3]] for k in keep]
    return places, [[name, index[a], index[b], wraps] for name, a, b, wraps in links]
