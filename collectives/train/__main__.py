"""``python -m collectives.train``."""
from .cli import main

main()
