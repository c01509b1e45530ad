"""Gated Linear Attention (Yang et al. 2023): the reference loop and three Triton forms.

    naive_recurrent_gla   PyTorch loop over time, fp32 (the reference)
    fused_recurrent_gla   one Triton kernel, state in registers; T = 1 is the decode step
    sequential_chunk_gla  the source article's chunk kernel: one launch per chunk, tokens in sequence
    chunk_gla             chunk-parallel prefill on tensor cores (the algorithm fla uses)
"""
from .chunk import chunk_gla
from .fused_recurrent import fused_recurrent_gla
from .naive import naive_recurrent_gla, torch_gla_step
from .sequential_chunk import sequential_chunk_gla

__all__ = ["naive_recurrent_gla", "fused_recurrent_gla", "sequential_chunk_gla", "chunk_gla", "torch_gla_step"]
