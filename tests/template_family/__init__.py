"""A template family: plain linear attention (no decay), the smallest family
the book's layout allows.

    linear_attention_ref     PyTorch loop over time (the reference)
    fused_recurrent_linear   one Triton kernel, state in registers; T = 1 is
                             the decode step

Copy this folder to attention_kernels/<family>/, rename, and replace the
recurrence with your family's (book/adding_a_family.md lists everything else
a family touches).
"""
from .interface import fused_recurrent_linear
from .reference import linear_attention_ref

__all__ = ["linear_attention_ref", "fused_recurrent_linear"]
