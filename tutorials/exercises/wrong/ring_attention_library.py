"""Wrong: calls the library's finished ring attention (collectives.parallel), switched off while grading."""
from collectives.parallel import ring_attention as library


def ring_attention(q, k, v, group=None):
    return library.ring_attention(q, k, v, group=group, causal=False)
