"""The errors a collective raises, in one place (``docs/errors.md`` explains each).

Argument errors are plain ``ValueError``/``TypeError``, raised on the calling rank
before any message moves. The classes below are for what goes wrong once
messages move, or for what the torch backend cannot carry.
"""


class CollectiveError(RuntimeError):
    """A point-to-point message inside a collective failed (peer gone, transport error).

    ``peer`` is the global rank of the other side, ``comm`` the door of the call it
    was in (None where no message was involved).
    """

    def __init__(self, text, peer=None, comm=None):
        super().__init__(text)
        self.peer, self.comm = peer, comm


class CollectiveTimeout(CollectiveError):
    """A rank waited longer than its timeout (``COLLECTIVES_TIMEOUT``) for a peer."""


class DesyncError(CollectiveError):
    """Ranks of a group called different collectives (or the same one differently)."""


class UnsupportedOperation(RuntimeError):
    """An operation or tensor the ``collectives`` backend cannot carry (never a silent fallback)."""
