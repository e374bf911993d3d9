"""Wrong: calls the library's finished zig-zag ring attention (collectives.parallel), switched off while grading."""
from collectives.parallel.ring_attention_zigzag import zigzag_ring_attention


def ring_attention_zigzag(q, k, v, group=None):
    return zigzag_ring_attention(q[None, None], k[None, None], v[None, None], group=group)[0, 0]
