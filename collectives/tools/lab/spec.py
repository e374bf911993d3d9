"""What ``--lab hosts=K[,ranks-per-host=L][,rate=1gbit][,placement=by-host]`` asks for, checked.

Parsing needs no privilege and touches no network: a launcher reads the flag and
refuses nonsense before anything is built.
"""
import re
from dataclasses import dataclass

PLACEMENTS = ("by-host", "interleaved")
MAX_HOSTS = 64            # a /24 has 253 host addresses; beyond 64 the lab is no longer a toy
_UNITS = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12}
FLAG_HELP = ("run every rank inside a lab of hosts (network namespaces joined by rate-limited "
             "links; needs root): hosts=K[,ranks-per-host=L][,rate=1gbit][,placement=by-host|interleaved]")


def parse_rate(text):
    """Bits per second from tc's notation: '1gbit' -> 10**9, '200mbit', '5e8', '100000kbit'.

    Only bit units: tc's 'bps' means *bytes* per second, an old trap, so it is refused.

    Example::

        >>> parse_rate("1gbit"), parse_rate("250mbit"), parse_rate("1e9")
        (1000000000, 250000000, 1000000000)
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    unit = m.group(2) if m else None
    if not m or (unit and unit not in _UNITS):
        raise ValueError(f"--lab rate={text!r} is not a rate: write a number of bits per second "
                         f"with one of {', '.join(_UNITS)} (tc's units), e.g. rate=1gbit")
    bps = int(float(m.group(1)) * _UNITS[unit or "bit"])
    if not 8_000 <= bps <= 100 * 10 ** 9:
        raise ValueError(f"--lab rate={text!r} is outside 8kbit..100gbit, the range tbf shapes well")
    return bps


def human_rate(bps):
    """'1gbit', '250mbit', '1500kbit' or the bits."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bps % _UNITS[unit] == 0:
            return f"{bps // _UNITS[unit]}{unit}"
    return f"{bps}bit"


@dataclass(frozen=True)
class LabSpec:
    """A lab of ``hosts`` hosts, each linked to one switch at ``rate`` bits/s in each direction.

    ``ranks_per_host`` None: the world size decides (spread as evenly as it goes).
    ``placement``: "by-host" puts ranks 0..L-1 on host 0 (as torchrun does), "interleaved"
    puts rank r on host r mod K (every ring step then crosses a link).
    """
    hosts: int
    ranks_per_host: int | None = None
    rate: int = 10 ** 9
    placement: str = "by-host"

    def __str__(self):
        rph = f",ranks-per-host={self.ranks_per_host}" if self.ranks_per_host else ""
        pl = "" if self.placement == "by-host" else f",placement={self.placement}"
        return f"hosts={self.hosts}{rph},rate={human_rate(self.rate)}{pl}"

    def layout(self, world_size):
        """Host of each rank: a list of ``world_size`` host indices.

        Raises ValueError when the world does not fit the lab (an empty host, or
        ``ranks-per-host`` times ``hosts`` not the world size).

        Example::

            >>> LabSpec(2).layout(4), LabSpec(2, placement="interleaved").layout(4)
            ([0, 0, 1, 1], [0, 1, 0, 1])
            >>> LabSpec(2).layout(5)     # uneven hosts: 3 ranks on host 0, 2 on host 1
            [0, 0, 0, 1, 1]
        """
        k = self.hosts
        if self.ranks_per_host is not None and self.ranks_per_host * k != world_size:
            raise ValueError(f"--lab {self}: {k} hosts x {self.ranks_per_host} ranks per host is "
                             f"{k * self.ranks_per_host} ranks, but the world has {world_size}; "
                             f"make them agree, or leave ranks-per-host out")
        if world_size < k:
            raise ValueError(f"--lab {self}: a world of {world_size} rank(s) leaves hosts empty; "
                             f"use at most {world_size} host(s) or more ranks")
        if self.placement == "interleaved":
            return [r % k for r in range(world_size)]
        # Blocks as even as they go: the first (world mod k) hosts get one rank more.
        return [h for h in range(k) for _ in range(world_size // k + (h < world_size % k))]


def parse_lab(text):
    """``"hosts=4,ranks-per-host=2,rate=1gbit"`` -> :class:`LabSpec`; ValueError saying what is wrong.

    Example::

        >>> parse_lab("hosts=2,rate=500mbit")
        LabSpec(hosts=2, ranks_per_host=None, rate=500000000, placement='by-host')
    """
    fields = {}
    for entry in str(text).split(","):
        entry = entry.strip()
        if not entry:
            continue
        key, sep, value = (s.strip() for s in entry.partition("="))
        key = key.replace("_", "-")
        if not sep or not value:
            raise ValueError(f"--lab: {entry!r} must read key=value, e.g. hosts=4")
        if key not in ("hosts", "ranks-per-host", "rate", "placement"):
            raise ValueError(f"--lab: unknown key {key!r}; valid: hosts, ranks-per-host, rate, placement")
        if key in fields:
            raise ValueError(f"--lab: {key} is given twice")
        fields[key] = value
    if "hosts" not in fields:
        raise ValueError(f"--lab {text!r}: hosts=K is required, e.g. --lab hosts=4,rate=1gbit")
    ints = {}
    for key in ("hosts", "ranks-per-host"):
        if key in fields:
            try:
                ints[key] = int(fields[key])
            except ValueError:
                ints[key] = 0
            if not 1 <= ints[key] <= MAX_HOSTS:
                raise ValueError(f"--lab: {key}={fields[key]} must be a whole number in 1..{MAX_HOSTS}")
    placement = fields.get("placement", "by-host")
    if placement not in PLACEMENTS:
        raise ValueError(f"--lab: placement={placement} is not one of {', '.join(PLACEMENTS)}")
    return LabSpec(hosts=ints["hosts"], ranks_per_host=ints.get("ranks-per-host"),
                   rate=parse_rate(fields.get("rate", "1gbit")), placement=placement)


def lab_argument(text):
    """argparse ``type=`` for ``--lab``: :func:`parse_lab` with argparse's error type."""
    import argparse
    try:
        return parse_lab(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
