"""The flags' argument types every benchmark shares (argparse ``type`` functions), in a module
that imports no torch: a program that measures the operating system (``benchmarks.doorbell``)
uses them without paying torch's import."""
import argparse
import math


def whole(low, what="a whole number"):
    """An argparse ``type``: an int of at least ``low`` (e.g. ``--threads 0`` is refused by name)."""
    def parse(text):
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} of {low} or more expected, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{what} of {low} or more expected, got {text!r}")
        return value
    parse.__name__ = f"whole number >= {low}"
    return parse


def positive(what="a number", most=None):
    """An argparse ``type``: a finite float above 0 (and at most ``most``): ``--timeout -1``,
    ``--budget inf`` are refused by name."""
    def parse(text):
        try:
            value = float(str(text).strip())
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value > 0 and (most is None or value <= most)):
            bound = f" and at most {most:g}" if most is not None else ""
            raise argparse.ArgumentTypeError(f"{what} above 0{bound} expected, got {text!r}")
        return value
    parse.__name__ = "positive number"
    return parse


def whole_list(low, what="whole numbers"):
    """An argparse ``type``: comma-separated ints, each at least ``low`` (``--batch 1,32``)."""
    one = whole(low, "each a whole number")

    def parse(text):
        values = [one(x) for x in str(text).split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"{what} of {low} or more expected, e.g. 1,32; got {text!r}")
        return values
    return parse
