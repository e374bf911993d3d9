"""Sizes in nccl-tests' notation ('4K', '64M', '1G'), and the sizes a sweep visits.

Shared by every command that takes nccl-tests' flags ``-b -e -f -i``: the benchmarks beside
the package and ``python -m collectives.sim`` inside it.
"""
import argparse
import math


def parse_size(text):
    """Bytes from nccl-tests' notation: '4K' -> 4096, '64M' -> 67108864, '1G', '512'.

    Example::

        >>> parse_size("64M"), parse_size("4KB"), parse_size(100)
        (67108864, 4096, 100)
    """
    text = str(text).strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        value = float(text[:-1] if scale > 1 else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K, M or G)") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a size must be a finite number of bytes, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value * scale)


def human(nbytes):
    """'4K', '16M', '1G' where exact, else the bytes."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"


def sizes(minbytes, maxbytes, stepfactor=1, stepbytes=1 << 20):
    """The sizes nccl-tests visits: from ``minbytes`` to ``maxbytes``, times ``stepfactor``
    when it is above 1, else plus ``stepbytes``.

    Example::

        >>> sizes(4096, 65536, 4)
        [4096, 16384, 65536]
        >>> sizes(1 << 20, 3 << 20, 1, 1 << 20)
        [1048576, 2097152, 3145728]
    """
    if maxbytes < minbytes:
        raise ValueError(f"-e {maxbytes} is below -b {minbytes}")
    if stepfactor <= 1 and stepbytes <= 0 and maxbytes > minbytes:
        raise ValueError("-f 1 with -i 0 never reaches -e: give -f above 1 or -i above 0")
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        if stepfactor > 1:
            s = s * stepfactor if s else 1
        elif stepbytes > 0:
            s += stepbytes
        else:
            break
    return out
