"""Play a schedule exported by ``collectives.sim`` (``simulate(..., schedule=True)``) in SimGrid.

Run by ``benchmarks.sim_vs_simgrid`` under the SYSTEM python (``/usr/bin/python3``, where
Debian's ``python3-simgrid`` installs SimGrid's module): it imports neither torch nor
``collectives``. Reads a JSON job on stdin, writes {"ranks": [end time per rank]} on stdout.

The job: ``links`` (capacity of each directed link, bytes/s), ``routes`` ([src, dst, latency,
[link ids]] for every pair that talks), ``schedule`` (per rank: ["post", [[kind, peer, tag,
nbytes], ...]], ["wait", [indices of the rank's posted ends]], ["busy", seconds]).

The platform is SimGrid's own model of the same network: one SimGrid link per directed link
of ours (SHARED: max-min among the flows on it), and per route one more link that only
carries its latency (FATPIPE, bandwidth far above any other: no sharing, no limit), so a
route's latency is ours whatever the number of links it crosses. The network model is CM02
(max-min, latency then bandwidth, no factors), cross-traffic off (ours has no reverse-traffic
term), TCP window bound off. Messages meet as ours do: a send and a receive of the same
(src, dst, tag, nbytes) match, oldest first (one mailbox each), and start only when both
are posted (SimGrid's rendezvous).
"""
import json
import sys

from simgrid import Actor, Comm, Engine, Link, LinkInRoute, Mailbox, NetZone, this_actor

FAST = 1e14       # bytes/s of a latency-only link: 200x NVLink 4's, so never a limit


def main():
    job = json.load(sys.stdin)
    # the factors are CM02's defaults already (1, 1, 0); stated so that no default can move them.
    # surf/precision is SimGrid's tolerance on times, 1e-9 s by default: tightened so that its
    # rounding stays far below a 4 KiB message's 0.3 us. (maxmin/precision stays at its default:
    # 1e-12 made SimGrid abort, 1e-9 segfault, on a 64-rank torus)
    engine = Engine(["simgrid_player", "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                     "--cfg=network/TCP-gamma:0", "--cfg=network/latency-factor:1",
                     "--cfg=network/bandwidth-factor:1", "--cfg=network/weight-S:0",
                     "--cfg=surf/precision:1e-13",
                     "--cfg=contexts/factory:thread", "--log=root.thres:critical"])
    zone = NetZone.create_full_zone("net")
    n = len(job["schedule"])
    hosts = [zone.create_host(f"rank{r}", 1e9).seal() for r in range(n)]
    links = []
    for i, capacity in enumerate(job["links"]):
        link = zone.create_link(f"l{i}", float(capacity))
        link.set_latency(0.0)
        links.append(link.seal())
    for k, (src, dst, latency, route) in enumerate(job["routes"]):
        wire = zone.create_link(f"lat{k}", FAST)
        wire.set_latency(float(latency))
        wire.set_sharing_policy(Link.SharingPolicy.FATPIPE, None)
        wire.seal()
        path = [LinkInRoute(wire)] + [LinkInRoute(links[i]) for i in route]
        zone.add_route(hosts[src].netpoint, hosts[dst].netpoint, None, None, path, False)
    zone.seal()
    ends = [0.0] * n

    def rank(r, ops):
        posted = []            # (comm, what keeps a receive's buffer alive)
        for op in ops:
            if op[0] == "post":
                for kind, peer, tag, nbytes in op[1]:
                    if kind == "send":
                        posted.append((Mailbox.by_name(f"{r}>{peer}:{tag}:{nbytes}").put_async(r, nbytes), None))
                    else:
                        got = Mailbox.by_name(f"{peer}>{r}:{tag}:{nbytes}").get_async()
                        posted.append((got[0], got))
            elif op[0] == "wait":
                Comm.wait_all([posted[i][0] for i in op[1]])
            else:
                this_actor.sleep_for(op[1])
        ends[r] = Engine.clock

    for r in range(n):
        Actor.create(f"rank{r}", hosts[r], rank, r, job["schedule"][r])
    engine.run()
    json.dump({"ranks": ends, "simgrid": Engine.clock}, sys.stdout)


if __name__ == "__main__":
    main()
