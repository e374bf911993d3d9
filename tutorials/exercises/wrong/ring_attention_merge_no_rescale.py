"""Wrong, step 2 of ring_attention: the new maximum is taken, but the old sum and output are not
rescaled to it. Right for one block, and while no block raises a row's maximum; wrong as soon
as one does (what was summed under the old maximum is then too large by exp(m_new - m))."""
import torch


def ring_attention_merge(o, m, l, s, v):
    m_new = torch.maximum(m, s.amax(-1))
    p = torch.exp(s - m_new.unsqueeze(-1))
    return o + p @ v, m_new, l + p.sum(-1)
