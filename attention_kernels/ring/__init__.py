"""Ring (context-parallel) attention: one sequence split across GPUs, K/V passed around the ring.

    >>> from attention_kernels.ring import ring_flash_attn_func, zigzag_split
    >>> q, k, v = (zigzag_split(t, rank, world) for t in (Q, K, V))     # this rank's slice of [B, T, H, D]
    >>> o = ring_flash_attn_func(q, k, v, causal=True)                   # every rank of the group calls it
"""
from .interface import ring_flash_attn_func
from .linear import gla_context_parallel
from .reference import merge_partials, ring_attention_simulated
from .zigzag import (contiguous_split, contiguous_unsplit, gather_sequence, ring_plan, zigzag_split,
                     zigzag_unsplit)

__all__ = ["ring_flash_attn_func", "zigzag_split", "zigzag_unsplit", "contiguous_split", "contiguous_unsplit",
           "gather_sequence", "ring_plan", "merge_partials", "ring_attention_simulated", "gla_context_parallel"]
