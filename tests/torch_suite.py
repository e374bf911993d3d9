"""PyTorch's own ``distributed_test.py`` driven on a backend (``python -m tests.torch_suite``).

torch ships its distributed test suite in the wheel
(``torch/testing/_internal/distributed/distributed_test.py``) and drives it the way this module
does: environment ``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR`` read at import, a test class made of
``TestDistBackend`` (a ``MultiProcessTestCase``) and ``DistributedTest._DistTestBase``, one
fresh world of ``WORLD_SIZE`` processes per test case. torch's harness spawns them; here they
are forked from a parent that imported torch once and started nothing, which saves the
re-import of torch per process (seconds per case on a small machine) and changes nothing else.

Usage::

    BACKEND=collectives WORLD_SIZE=2 python -m tests.torch_suite [-k NAME] [test_x ...]

With no names it runs every case of the suite (used to measure what gloo passes);
``tests/test_torch_suite.py`` runs the documented selection (docs/torch_suite.md).
"""
import json
import os
import sys
import tempfile
import unittest

import torch

os.environ.setdefault("BACKEND", "collectives")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="torch_suite_")

import collectives  # noqa: E402,F401  (registers backend "collectives")

# TORCH_SUITE_DECORATE_AS=gloo: the suite's skip decorators (evaluated at import, by backend
# name) see "gloo", the worlds run on BACKEND: gloo's cases that torch gates by name alone.
_BACKEND = os.environ["BACKEND"]
if os.environ.get("TORCH_SUITE_DECORATE_AS"):
    os.environ["BACKEND"] = os.environ["TORCH_SUITE_DECORATE_AS"]
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)

distributed_test.BACKEND = os.environ["BACKEND"] = _BACKEND


class TestTorchSuite(TestDistBackend, DistributedTest._DistTestBase):
    """torch's ``TestDistBackendWithSpawn`` with forked processes."""

    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


class _Result(unittest.TextTestResult):
    """Also remembers which cases passed (``outcomes``: name -> passed/failed/error/skipped)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[test._testMethodName] = "passed"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test._testMethodName] = "error"

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test._testMethodName] = "failed"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[test._testMethodName] = "skipped: " + reason


def main(argv):
    """Run the cases named in ``argv`` (all when none); ``--json FILE`` writes each one's outcome."""
    out = argv[argv.index("--json") + 1] if "--json" in argv else None
    names = [a for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] != "--json")]
    # a case this torch version's suite does not have is reported, not run
    absent = {n: "absent" for n in names if not hasattr(TestTorchSuite, n)}
    if names:
        suite = unittest.TestSuite(TestTorchSuite(n) for n in names if n not in absent)
    else:
        suite = unittest.TestLoader().loadTestsFromTestCase(TestTorchSuite)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout, resultclass=_Result).run(suite)
    if out:
        with open(out, "w") as f:
            json.dump({"torch": torch.__version__, "backend": os.environ["BACKEND"],
                       "outcomes": {**absent, **result.outcomes}}, f, indent=1, sort_keys=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
