"""Gated Linear Attention (Yang et al. 2023): the reference loop, three Triton forms and one in TileLang.

    naive_recurrent_gla   PyTorch loop over time (the reference); torch_gla_step, one step in PyTorch
    fused_recurrent_gla   one Triton kernel, state in registers; T = 1 is the decode step
    sequential_chunk_gla  the source article's chunk kernel: one launch per chunk, tokens in sequence
    chunk_gla             chunk-parallel prefill on tensor cores (the algorithm fla uses)
    chunk_gla_tilelang    the same chunked forward in TileLang (needs TileLang, imported lazily)
"""
from .interface import chunk_gla, chunk_gla_tilelang, fused_recurrent_gla, sequential_chunk_gla
from .reference import naive_recurrent_gla, torch_gla_step

__all__ = ["naive_recurrent_gla", "fused_recurrent_gla", "sequential_chunk_gla", "chunk_gla", "chunk_gla_tilelang",
           "torch_gla_step"]
