"""The wires: messages as fluid flows over directed links that share their bandwidth.

A message, once its two ends have met (``world``) and its latency alpha has
passed, becomes a *flow* of ``nbytes`` over the links of its route (each link
one direction of a cable or a NIC: full duplex means two independent links).
A flow moves at the rate its most crowded link allows::

    rate(flow) = min over its links l of  capacity(l) / flows on l

so two messages leaving one NIC at once each get half of it, and a message
through an oversubscribed uplink gets its share of the uplink. (That is the
"bottleneck fair share" approximation of max-min fairness: a flow held back
elsewhere leaves its share unused. It needs, when a flow starts or ends, to
revisit only the flows that share a link with it, which keeps a 1,024-rank
ring at one flow per link cheap.)

Each flow's finish time is recomputed whenever its rate changes; older
finish events in the queue carry a stale version number and are ignored.
"""
import math


class Flow:
    __slots__ = ("links", "remaining", "rate", "last", "version", "done")

    def __init__(self, links, nbytes, done):
        self.links, self.remaining, self.done = links, float(nbytes), done
        self.rate, self.last, self.version = 0.0, 0.0, 0


class Network:
    """Flows over links of capacity ``capacity[l]`` bytes/s, on ``world``'s clock."""

    def __init__(self, world, capacity):
        self.world = world
        self.capacity = capacity
        # link -> the flows on it, in the order they started: a dict, not a set, so that flows
        # are rescheduled in the same order in every run (a set's order follows memory
        # addresses, and equal finish times then break ties differently from run to run)
        self.active = {}

    def start(self, links, nbytes, done, *args):
        """Begin moving ``nbytes`` over ``links`` now; call ``done(*args)`` when the last byte lands."""
        now = self.world.now
        flow = Flow(links, nbytes, (done, args))
        flow.last = now
        active = self.active
        for link in links:
            if link in active:
                break
        else:
            # the common case (a ring on a switch): alone on every link, nobody else to slow down
            rate = None
            for link in links:
                active[link] = {flow: None}
                cap = self.capacity[link]
                if rate is None or cap < rate:
                    rate = cap
            flow.rate = rate
            flow.version = 1
            self.world.at(now + nbytes / rate, self._finish, flow, 1)
            return
        touched = self._settle(links, now)
        for link in links:
            active.setdefault(link, {})[flow] = None
        touched[flow] = None
        self._reschedule(touched, now)

    def _settle(self, links, now):
        """Bring the flows on ``links`` up to ``now`` at their old rates."""
        touched = {}
        for link in links:
            for f in self.active.get(link, ()):
                if f not in touched:
                    f.remaining -= f.rate * (now - f.last)
                    f.last = now
                    touched[f] = None
        return touched

    def _reschedule(self, flows, now):
        cap, active = self.capacity, self.active
        for f in flows:
            f.rate = min(cap[link] / len(active[link]) for link in f.links)
            f.version += 1
            left = f.remaining if f.remaining > 0 else 0.0
            finish = now + (left / f.rate if f.rate < math.inf else 0.0)
            self.world.at(finish, self._finish, f, f.version)

    def _finish(self, flow, version):
        if version != flow.version:
            return                       # its rate changed since: a later event stands
        now = self.world.now
        flow.remaining = 0.0
        links = flow.links
        for link in links:
            on = self.active[link]
            del on[flow]
            if not on:
                del self.active[link]
        flow.version += 1
        shared = [link for link in links if link in self.active]
        if shared:
            self._reschedule(self._settle(shared, now), now)
        done, args = flow.done
        done(*args)
