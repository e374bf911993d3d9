"""The wires: messages as fluid flows over directed links, shared max-min fairly.

A message, once its two ends have met (``world``) and its latency L (``alpha``) has
passed, becomes a *flow* of ``nbytes`` over the links of its route (each link one
direction of a cable or a NIC: full duplex means two independent links). The flows on
the links share them *max-min fairly*, as SimGrid's CM02 model does (without its
cross-traffic), by progressive filling:

1. every flow not yet fixed grows at the same pace;
2. the link whose capacity left, divided by its flows not yet fixed, is smallest is the
   bottleneck: its flows are fixed at that share, and their rate is taken off every other
   link they cross;
3. repeat until every flow is fixed.

So two flows on one link get half of it each, and a flow held back elsewhere (a slow link,
a crowded NIC) leaves what it cannot use to the others on its links. The rates are
recomputed when flows start or end (once for all that do at one instant), for the flows that
share a link with them, with the flows that share a link with those, and so on (the
*component*): a flow's rate can change through a chain of links it does not cross. A flow alone on its links (a ring on a switch:
one flow per link) is the common case and costs no sharing at all.

Each flow's finish time is recomputed whenever its rate changes; older finish events in the
queue carry a stale version number and are ignored.

Worked case (``tests/test_sim_model.py``): flows a and b share link X (capacity 2); b also
crosses link Y (capacity 0.5), which it shares with c. Y's share is 0.25 (two flows), X's
1: Y is the bottleneck, so b and c get 0.25; a gets X's 2 - 0.25 = 1.75. Sharing each link
equally among its flows (b: min(2/2, 0.5/2) = 0.25, a: 2/2 = 1) would leave 0.75 of X idle.
"""
import heapq
import math


class Flow:
    __slots__ = ("links", "remaining", "rate", "last", "version", "done")

    def __init__(self, links, nbytes, done, now):
        self.links, self.remaining, self.done = links, float(nbytes), done
        self.rate, self.last, self.version = 0.0, now, 0


class Network:
    """Flows over links of capacity ``capacity[l]`` bytes/s, on ``world``'s clock."""

    def __init__(self, world, capacity):
        self.world = world
        self.capacity = capacity
        # link -> the flows on it, in the order they started: a dict, not a set, so that flows
        # are rescheduled in the same order in every run (a set's order follows memory
        # addresses, and equal finish times then break ties differently from run to run)
        self.active = {}
        # links whose flows changed since the last sharing: flows that start or end at one
        # instant (a linear root's N-1 messages) are shared once, not once each
        self.dirty = {}

    def start(self, links, nbytes, rate, done, *args):
        """Begin moving ``nbytes`` over ``links`` now; call ``done(*args)`` when the last byte
        lands. ``rate``: the smallest capacity of ``links``, the flow's rate if it is alone on them."""
        now = self.world.now
        flow = Flow(links, nbytes, (done, args), now)
        active = self.active
        for link in links:
            if link in active:
                break
        else:
            # the common case (a ring on a switch): alone on every link, nobody else to slow down
            for link in links:
                active[link] = {flow: None}
            flow.rate = rate
            flow.version = 1
            self.world.at(now + nbytes / rate, self._finish, flow, 1)
            return
        for link in links:
            active.setdefault(link, {})[flow] = None
        self._mark(links)

    def _mark(self, links):
        """Share ``links`` again once every event of this instant has run."""
        if not self.dirty:
            self.world.at(self.world.now, self._reshare)
        for link in links:
            self.dirty[link] = None

    def _reshare(self):
        links = [link for link in self.dirty if link in self.active]
        self.dirty = {}
        if links:
            self._share(links, self.world.now)

    def _component(self, links):
        """The flows whose rates depend on ``links``' flows, and the links they cross."""
        active = self.active
        flows, seen, todo = {}, set(links), list(links)
        while todo:
            for f in active.get(todo.pop(), ()):
                if f not in flows:
                    flows[f] = None
                    for link in f.links:
                        if link not in seen:
                            seen.add(link)
                            todo.append(link)
        return flows, seen

    def _share(self, links, now):
        """Settle the component of ``links`` at its old rates, share its links max-min (the
        progressive filling above), and move the finish of every flow whose rate changed."""
        active, cap = self.active, self.capacity
        flows, seen = self._component(links)
        for f in flows:
            f.remaining -= f.rate * (now - f.last)
            f.last = now
        left, count, share, heap = {}, {}, {}, []
        for link in seen:
            on = active.get(link)
            if on:
                left[link], count[link] = cap[link], len(on)
                share[link] = cap[link] / len(on)
                heap.append((share[link], link))
        heapq.heapify(heap)
        rates = {}
        while heap:
            s, link = heapq.heappop(heap)
            if not count[link] or s != share[link]:
                continue                  # fixed already, or a later entry holds its share
            for f in active[link]:
                if f in rates:
                    continue
                rates[f] = s
                for other in f.links:
                    count[other] -= 1
                    left[other] -= s
                    if other != link and count[other]:
                        # never below s, as in exact arithmetic (a share only grows as flows
                        # are fixed): rounding must not leave a flow a rate of 0
                        share[other] = max(left[other] / count[other], s)
                        heapq.heappush(heap, (share[other], other))
            count[link] = 0
        at = self.world.at
        for f in flows:
            rate = rates[f]
            if rate == f.rate and f.version:
                continue                  # its finish event still stands
            f.rate = rate
            f.version += 1
            left_bytes = f.remaining if f.remaining > 0 else 0.0
            at(now + (left_bytes / rate if rate < math.inf else 0.0), self._finish, f, f.version)

    def _finish(self, flow, version):
        if version != flow.version:
            return                       # its rate changed since: a later event stands
        flow.remaining = 0.0
        active, shared = self.active, None
        for link in flow.links:
            on = active[link]
            del on[flow]
            if on:
                shared = [link] if shared is None else shared + [link]
            else:
                del active[link]
        flow.version += 1
        if shared:
            self._mark(shared)
        done, args = flow.done
        done(*args)
