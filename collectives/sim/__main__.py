"""``python -m collectives.sim``: see :mod:`collectives.sim.cli`."""
import sys

from .cli import main

sys.exit(main())
